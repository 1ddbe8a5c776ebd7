"""AdaptDL's CIFAR example (tests/adaptdl/cifar.py: its calls, mixed precision with torch's
GradScaler included) and its transformer example (tests/adaptdl/transformer.py) under
`raylight run -n 2`: the batch adapts, a worker killed mid-epoch restarts the group, which
resumes from the State checkpoint, and the run ends near one plain process's accuracy."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.adaptdl.cifar import CIFAR
from tests.adaptdl.transformer import TRANSFORMER
from tests.conftest import REPO
from tests.helpers import assert_no_strays

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(420)]


def _env(tmp_path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(RAYLIGHT_ADAPTDL="1", PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]),
               ADAPTDL_TENSORBOARD_LOGDIR=str(tmp_path / "tb"), OMP_NUM_THREADS="1", **extra)
    return env


def _one_process(tmp_path, script, args: list[str]) -> dict:
    out = tmp_path / "one.json"
    code = "import sys; from raylight.worker.adl.compat import install_import_hook; install_import_hook(force=True); " \
           f"sys.argv = {[str(script), *args, '--out', str(out)]!r}; import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_env(tmp_path, ADAPTDL_JOB_ID="one"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _two_replicas_killed_once(tmp_path, script, args: list[str]) -> tuple[dict, str]:
    out = tmp_path / "two.json"
    done = subprocess.run(
        [sys.executable, "-m", "raylight.cli", "run", "-n", "2", "--max-failures", "1", "--name", "adl",
         "--storage-path", str(tmp_path / "runs"), str(script), *args, "--kill-in-epoch", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=360, env=_env(tmp_path), cwd=tmp_path,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    tail = printed[-4000:]
    assert "[rank 0] replica 0 of 2 restart 0 starts at epoch 0" in printed, tail
    assert "[rank 0] replica 0 of 2 restart 1 starts at epoch 2" in printed, tail  # the epochs before the kill are kept
    assert "SIGKILL" in printed, tail
    return json.loads(out.read_text()), printed


def test_the_cifar_example_with_grad_scaler_adapts_survives_a_killed_worker_and_reaches_one_process_accuracy(tmp_path):
    script = tmp_path / "cifar.py"
    script.write_text(CIFAR)
    args = ["--epochs", "6", "--lr", "0.02", "--autoscale-bsz", "--mixed-precision"]
    two, _ = _two_replicas_killed_once(tmp_path, script, args)
    assert max(two["sizes"]) > 32 and two["gain"] > 1.0  # the engine grew the batch; AdaScale's gain followed
    assert 1.0 <= two["scale"] <= 65536.0  # the loss scale, finite (checkpointed across the restart)
    one = _one_process(tmp_path, script, args)
    assert one["sizes"] == [32] * 6  # one replica keeps its batch (AdaptDL's rule: no noise measured)
    assert one["accuracy"] > 0.8, one  # the example learns: the comparison means something
    assert two["accuracy"] >= one["accuracy"] - 0.05, (two, one)
    assert_no_strays(str(tmp_path))


def test_the_transformer_example_adapts_survives_a_killed_worker_and_reaches_one_process_accuracy(tmp_path):
    script = tmp_path / "transformer.py"
    script.write_text(TRANSFORMER)
    args = ["--epochs", "4", "--autoscale-bsz"]
    two, _ = _two_replicas_killed_once(tmp_path, script, args)
    assert max(two["sizes"]) > 16 and two["gain"] > 1.0  # above --bs (the sizes of the epochs after the restart)
    one = _one_process(tmp_path, script, args)
    assert one["sizes"] == [16] * 4
    assert one["accuracy"] > 0.5 and math.isfinite(one["val_loss"]), one
    assert two["accuracy"] >= one["accuracy"] - 0.05, (two, one)
    assert_no_strays(str(tmp_path))
