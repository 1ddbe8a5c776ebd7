"""raylight.horovod beside real Horovod (skipped where Horovod is not installed; see
docs/horovod.md for the build): the import hook steps aside, and under real `horovodrun
--gloo -np 2` the MNIST example gives the same parameters on raylight.horovod (its ranks
meeting through horovodrun's key-value server) as on real Horovod."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from raylight.worker.hvd import compat

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not compat.horovod_installed() or importlib.util.find_spec("horovod.runner") is None,
        reason="real Horovod is not installed (docs/horovod.md: building Horovod 0.28.1)",
    ),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MNIST = os.path.join(REPO, "examples", "horovod", "pytorch_mnist.py")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "src"), REPO, env.get("PYTHONPATH", "")])
    return env


def test_the_import_hook_steps_aside_for_real_horovod(tmp_path):
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from raylight.horovod import compat\n"
        "try:\n    compat.install_import_hook()\nexcept UserWarning as w:\n    print('warned:', w)\n"
        "import horovod.torch as hvd; print('module:', hvd.__name__, hasattr(hvd, 'mpi_lib_v2'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "warned:" in run.stdout and "Horovod is installed" in run.stdout
    assert "module: horovod.torch" in run.stdout  # real Horovod's, not raylight.horovod
    script = tmp_path / "which.py"
    script.write_text("import horovod.torch as hvd\nprint('module:', hvd.__name__)\n")
    run = subprocess.run([sys.executable, "-m", "raylight.horovod", str(script)], env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert (run.returncode, run.stdout.strip()) == (0, "module: raylight.horovod"), run.stderr  # asked for by name


def _horovodrun(tmp_path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", "localhost:2", *command],
        env=_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=240,
    )


def test_horovodrun_gives_the_same_parameters_on_raylight_horovod(tmp_path):
    real, ours = tmp_path / "real.pt", tmp_path / "ours.pt"
    run = _horovodrun(tmp_path, sys.executable, MNIST, "--epochs", "1", "--save", str(real))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run = _horovodrun(
        tmp_path, sys.executable, "-m", "raylight.horovod", MNIST, "--epochs", "1",
        "--save", str(ours),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    a, b = torch.load(real, weights_only=True), torch.load(ours, weights_only=True)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-5), (key, (a[key] - b[key]).abs().max())


def test_real_horovod_under_raylight_run_fails_its_init_instead_of_training_alone(tmp_path):
    """A rank of `raylight run -n 2` (its bootstrap, WORLD_SIZE=2) whose script gets real
    Horovod: hvd.init() forms a group of one, and says so, naming the fix."""
    from raylight.launch import agent

    script = tmp_path / "h.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\nprint('trained', hvd.size())\n")
    env = {k: v for k, v in _env().items() if not k.startswith(("RAYLIGHT_", "RANK", "MASTER_"))}
    run = subprocess.run([sys.executable, agent.BOOTSTRAP, str(script)], env={**env, "WORLD_SIZE": "2"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "trained" not in run.stdout, run.stdout
    assert "formed a group of 1 under `raylight run`" in run.stderr and "-m raylight.horovod" in run.stderr, run.stderr
