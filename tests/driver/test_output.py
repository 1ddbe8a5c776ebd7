"""What a person sees: raylight's lines, not Ray's, unless they ask (raylight.base.verbosity).

The CLI runs as users run it (a subprocess, output piped, its own embedded Ray); the
``fit`` test uses the session's Ray and reads the driver's output at the file
descriptors, where Ray's forwarded worker output lands too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import raylight
from tests.conftest import REPO
from tests.declarative_data import CONFIG, write
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

RAY_CONFIG = CONFIG.replace(
    "backend: {type: local}",
    "backend: {type: ray, processor: {type: ray_data}, trainer: {num_workers: 2, resources_per_worker: {CPU: 1}}}",
).replace("epochs: 6", "epochs: 3")

# Ray's log lines ("2026-01-01 10:00:00,000\tINFO file.py:12 -- ..."), Ray Data's
# progress and tips, and worker output forwarded by Ray ("(pid=123) ...").
RAY_NOISE = re.compile(r"\bINFO\b|Running Dataset|Starting execution of Dataset|Tip: |\(pid=|\(raylet\)")


def ray_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if RAY_NOISE.search(line)]


def _cli_train(tmp_path, *extra: str, config: str = RAY_CONFIG) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir()
    cfg, data = write(tmp_path, fmt="parquet", config=config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(REPO, "src"), REPO])}
    for name in ("RAY_ADDRESS", "RAYLIGHT_VERBOSE", "RAY_DATA_LOGGING_CONFIG", "RAY_DATA_DISABLE_PROGRESS_BARS", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    out = str(tmp_path / "run")
    return subprocess.run(
        [sys.executable, "-m", "raylight.cli", "train", "--config", cfg, "--dataset", data, "--output-directory", out, *extra],
        capture_output=True, text=True, timeout=280, env=env, cwd=str(tmp_path),
    )


@pytest.mark.slow
def test_cli_shows_raylight_not_ray_and_verbose_gives_ray_back(tmp_path):
    """The quiet run also has the declarative loggers: key's three loggers, whose
    libraries stay as quiet."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    logged = RAY_CONFIG + "loggers: [tensorboard, mlflow, {type: wandb, project: cli}]\n"
    quiet = _cli_train(tmp_path / "quiet", config=logged)
    assert quiet.returncode == 0, quiet.stdout[-2000:] + quiet.stderr[-3000:]
    text = quiet.stdout + quiet.stderr
    assert not ray_lines(text), "\n".join(ray_lines(text))
    epochs = [line for line in quiet.stderr.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["0", "1", "2"], quiet.stderr  # one line each
    assert all("samples/s" in line and "workers=2" in line for line in epochs)
    assert any(line.startswith("cost: ") and "prices given" in line for line in quiet.stderr.splitlines())  # unwrapped
    run = tmp_path / "quiet" / "run"
    assert (run / "mlflow.db").exists() and list((run / "tensorboard").iterdir()) and list((run / "wandb").glob("offline-run-*"))

    verbose = _cli_train(tmp_path / "verbose", "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    text = verbose.stdout + verbose.stderr
    assert "Starting execution of Dataset" in text and "Started a local Ray instance" in text
    assert [line for line in verbose.stderr.splitlines() if line.startswith("epoch ")]


def test_fit_prints_one_line_per_epoch_and_nothing_of_ray(ray_cluster, tmp_path, capfd):
    capfd.readouterr()
    result = raylight.fit(
        loops.epoch_loop, config={"epochs": 3}, num_workers=2, storage_path=str(tmp_path), name="quiet", progress=True,
    )
    out, err = capfd.readouterr()
    assert not ray_lines(out + err), out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert [line.split()[:2] for line in lines] == [["epoch", "0"], ["epoch", "1"], ["epoch", "2"]], err
    for line, row in zip(lines, result.metrics_history, strict=True):
        assert f"loss={row['loss']:.4g}" in line and "samples/s" in line and "workers=2" in line
