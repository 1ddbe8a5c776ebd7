"""Experiment loggers: their config (RunConfig.loggers, the declarative loggers: key), the
checks made before a run starts, and closing on failure (in-process runs, no Ray)."""

from __future__ import annotations

import json
import os

import pytest

import raylight
from raylight.base.exceptions import ConfigError
from raylight.config import MLflow, RunConfig, TensorBoard, Wandb, validate
from raylight.declarative.loading import load_config
from raylight.driver import loggers as run_loggers
from raylight.storage.run_dir import RunStorage
from tests.declarative_data import CONFIG


def test_names_mappings_and_models_are_one_list_of_models():
    cfg = validate(RunConfig, {"loggers": ["tensorboard", {"type": "mlflow", "tracking_uri": "sqlite:///x.db"}, Wandb(project="p")]})
    assert cfg.loggers == [TensorBoard(), MLflow(tracking_uri="sqlite:///x.db"), Wandb(project="p")]
    assert validate(RunConfig, {"loggers": "wandb"}).loggers == [Wandb()]  # one logger needs no list
    assert Wandb().mode == "offline"  # never the network unless asked


@pytest.mark.parametrize(
    ("loggers", "message"),
    [
        (["tensorbord"], "loggers: entry 0 is an unknown logger, 'tensorbord'; the loggers are 'tensorboard', 'mlflow', 'wandb'"),
        ([{"project": "x"}], "loggers: entry 0 has no 'type'; the loggers are 'tensorboard', 'mlflow', 'wandb'"),
        ([{"type": "wandb", "projekt": "x"}], "loggers.0.wandb.projekt: unknown key"),
        ([{"type": "wandb", "mode": "live"}], "loggers.0.wandb.mode"),
    ],
)
def test_a_bad_logger_is_one_error_naming_it(loggers, message):
    with pytest.raises(ConfigError) as err:
        validate(RunConfig, {"loggers": loggers})
    assert message in str(err.value)


def test_the_declarative_loggers_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG + "loggers: [tensorboard, {type: mlflow, experiment: adult}]\n")
    assert load_config(str(path)).loggers == [TensorBoard(), MLflow(experiment="adult")]
    path.write_text(CONFIG + "loggers: [neptune]\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert "loggers: entry 0 is an unknown logger, 'neptune'" in str(err.value)


def test_a_missing_package_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(run_loggers.PACKAGES, "wandb", "no_such_package_raylight")
    with pytest.raises(ImportError) as err:
        raylight.fit(lambda ctx: None, num_workers=0, storage_path=str(tmp_path), loggers=["wandb"])
    assert "'wandb'" in str(err.value) and "pip install 'raylight[loggers]'" in str(err.value)
    assert not os.listdir(tmp_path)  # checked before the run began


def test_a_default_directory_needs_a_local_run_directory():
    with pytest.raises(ConfigError) as err:
        run_loggers.RunLoggers([TensorBoard()], RunStorage("memory://runs/a"), name="a", resume=False)
    assert "log_dir" in str(err.value) and "memory://" in str(err.value)
    run_loggers.RunLoggers([TensorBoard(log_dir="/tmp/tb")], RunStorage("memory://runs/a"), name="a", resume=False)


def test_only_numbers_are_metrics_and_the_config_is_flattened():
    assert run_loggers.numbers_of({"loss": 0.5, "step": 3, "stop": True, "name": "x", "_report": 1}) == {"loss": 0.5, "step": 3.0}
    assert run_loggers.flatten({"run": {"name": "a", "tags": {}}, "lr": 0.1}) == {"run.name": "a", "run.tags": {}, "lr": 0.1}


def test_a_failed_run_closes_its_loggers_as_failed(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def loop(ctx):
        ctx.report({"loss": 1.0})
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        raylight.fit(loop, num_workers=0, storage_path=str(tmp_path), name="f", loggers=["mlflow"], progress=False)
    run_id = json.loads((tmp_path / "f" / "loggers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/f/mlflow.db")
    assert client.get_run(run_id).info.status == "FAILED"
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == [1.0]
