"""Every example config in examples/declarative trains end to end with 2 workers; the
`make run` demo runs as users run it, and adapts."""

import glob
import json
import os
import subprocess
import sys

import pytest

import raylight
from raylight.declarative import api
from raylight.declarative.loading import load_config
from tests.conftest import REPO
from tests.driver.test_output import ray_lines

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

EXAMPLES = os.path.join(REPO, "examples", "declarative")
sys.path.insert(0, EXAMPLES)
from demo import diamonds_csv  # noqa: E402
from make_datasets import write_all  # noqa: E402

CONFIGS = sorted(glob.glob(os.path.join(EXAMPLES, "*.yaml")))
DATASET = {"breast_cancer": "breast_cancer", "wine": "wine", "wine_multitask": "wine", "reviews": "reviews", "diamonds": "diamonds"}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return {**write_all(str(tmp_path_factory.mktemp("data"))), "diamonds": diamonds_csv()}


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_example_config_trains(ray_cluster, tmp_path, datasets, path):
    name = os.path.basename(path)[: -len(".yaml")]
    overrides = ["trainer.epochs=3", "backend.type=ray", "backend.trainer.num_workers=2"]
    if name == "diamonds":  # the demo's data: a sample of it is enough here
        overrides.append("preprocessing.sample_size=5000")
    out = api.train(load_config(path, overrides), datasets[DATASET[name]], output_directory=str(tmp_path / "run"), progress=False)
    assert set(out["evaluation"]["test"]) >= {"loss"}
    model = raylight.load_model(out["model_path"])
    import pandas as pd

    data = datasets[DATASET[name]]
    frame = pd.read_parquet(data) if data.endswith(".parquet") else (
        pd.read_csv(data) if data.endswith(".csv") else pd.read_json(data, lines=True)
    )
    pred = model.predict(frame.head(20))
    assert len(pred) == 20 and pred.columns[0].endswith("_predictions")


def test_make_run_demo(tmp_path):
    # This checkout's raylight, whatever the venv's editable install points at.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), REPO, os.environ.get("PYTHONPATH", "")])}
    for name in ("RAY_ADDRESS", "RAYLIGHT_VERBOSE", "RAY_DATA_LOGGING_CONFIG", "RAY_DATA_DISABLE_PROGRESS_BARS"):
        env.pop(name, None)
    res = subprocess.run(  # as `make run` runs it; the default output directory: results/demo-<date>-<time> under the cwd
        [sys.executable, os.path.join(EXAMPLES, "demo.py")],
        capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    [run] = glob.glob(str(tmp_path / "results" / "demo-*"))
    assert "accuracy" in res.stdout and os.path.exists(os.path.join(run, "evaluation.json"))
    assert f"run directory: {run} (adaptive.png, " in res.stdout, res.stdout
    # What a newcomer reads: one line per epoch, nothing of Ray's (tests/driver/test_output.py).
    assert not ray_lines(res.stdout + res.stderr), res.stdout + res.stderr
    # raylight's own warning about this machine's token file (Ray made it 0644 before raylight could) is not the demo's
    lines = [line for line in res.stderr.splitlines() if not line.startswith("Ray's token file ")]
    assert [line.split()[:2] for line in lines] == [["epoch", str(e)] for e in range(8)], res.stderr
    # It adapts: several batch decisions, the batch changing, and the epoch lines show it.
    with open(os.path.join(run, "adaptive.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    chosen = [r for r in rows if r.get("decision") == "batch"]
    assert len(chosen) >= 2, rows
    assert all(r["decided_batch"] != r["global_batch"] for r in chosen), chosen
    # an epoch's line has batch=A->B where the batch changed since the epoch before's
    shown = [line.split("batch=")[1].split()[0] for line in lines if "batch=" in line]
    assert any("->" in batch for batch in shown) and all("lr_factor=" in line for line in lines), res.stderr
    assert res.stdout.strip().splitlines()[-1].startswith("adaptive vs fixed batch, both measured in this run"), res.stdout
