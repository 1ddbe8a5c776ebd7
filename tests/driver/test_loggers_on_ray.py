"""Experiment loggers on a real run: what each wrote, read back with its own reader, is
what the run reported; a resumed run continues the same MLflow and W&B runs."""

from __future__ import annotations

import glob
import json
import os
import pathlib

import pytest

import raylight
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboardX")


def wandb_records(path: str):
    """The records of an offline W&B run file (``run-<id>.wandb``): W&B's 7-byte header,
    then LevelDB's log format (32 KiB blocks of records with 7-byte headers: CRC, length,
    type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4), each a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:8]
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def wandb_history(run_dir: str, run_id: str) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", f"run-{run_id}.wandb"))):
        for rec in wandb_records(path):
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_fit_writes_tensorboard_mlflow_and_wandb_and_a_resume_continues_them(ray_cluster, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    loggers = ["tensorboard", {"type": "mlflow", "experiment": "tests"}, {"type": "wandb", "project": "raylight-tests"}]
    first = raylight.fit(
        loops.epoch_loop, config={"epochs": 3}, num_workers=2, storage_path=str(tmp_path), name="logged",
        loggers=loggers, progress=False,
    )
    run_dir = first.path
    state = json.loads(pathlib.Path(run_dir, "loggers.json").read_text())
    resumed = raylight.fit(
        loops.epoch_loop, config={"epochs": 5}, num_workers=2, storage_path=str(tmp_path), name="logged",
        loggers=loggers, progress=False, resume=True,
    )
    history = resumed.metrics_history
    assert [row["epoch"] for row in history] == [0, 1, 2, 3, 4]
    assert json.loads(pathlib.Path(run_dir, "loggers.json").read_text()) == state  # the same runs continued
    steps, losses = list(range(len(history))), [row["loss"] for row in history]

    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    scalars = sorted((e.step, e.value) for e in events.Scalars("loss"))
    assert [s for s, _ in scalars] == steps and [v for _, v in scalars] == pytest.approx(losses, rel=1e-6)
    assert {"loss", "epoch", "start"} <= set(events.Tags()["scalars"])  # numbers only, every one

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir}/mlflow.db")
    run = client.get_run(state["mlflow"])
    assert run.info.status == "FINISHED" and run.info.run_name == "logged"
    points = sorted((m.step, m.value) for m in client.get_metric_history(state["mlflow"], "loss"))
    assert [s for s, _ in points] == steps and [v for _, v in points] == pytest.approx(losses, rel=1e-12)
    assert json.loads(run.data.params["train_loop_config.epochs"]) == 3  # the config, once
    assert len(client.search_runs([run.info.experiment_id])) == 1

    rows = wandb_history(run_dir, state["wandb"])
    assert [row["_step"] for row in rows] == steps and [row["loss"] for row in rows] == pytest.approx(losses, rel=1e-12)
