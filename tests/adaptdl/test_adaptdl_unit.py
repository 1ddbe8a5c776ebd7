"""raylight.adaptdl without Ray: adaptdl.env's mapping of raylight run's variables, the
import hook serving `import adaptdl` and stepping aside for a real AdaptDL, the bootstrap
installing it, a one-process tutorial resuming from ADAPTDL_CHECKPOINT_PATH, and the
refusals (the scaler itself: tests/adaptdl/test_adaptdl_scaler_gloo.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raylight.adaptdl import env
from raylight.launch import agent
from raylight.worker.adl import compat
from tests.adaptdl.tutorial import TUTORIAL
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def test_env_reads_adaptdl_variables_first_then_raylight_runs(monkeypatch):
    for name in [k for k in os.environ if k.startswith("ADAPTDL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "myrun")
    assert (env.replica_rank(), env.num_replicas(), env.num_nodes(), env.num_restarts(), env.job_id()) == (1, 4, 2, 3, "myrun")
    assert env.checkpoint_path() is None and env.share_path() is None
    monkeypatch.setenv("ADAPTDL_REPLICA_RANK", "2")
    monkeypatch.setenv("ADAPTDL_NUM_NODES", "1")
    assert (env.replica_rank(), env.num_nodes()) == (2, 1)
    monkeypatch.setenv("ADAPTDL_NUM_REPLICAS", "x")
    with pytest.raises(ValueError, match="ADAPTDL_NUM_REPLICAS='x': expected an integer"):
        env.num_replicas()
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "5"}
    compat.export_adaptdl_env(environ)
    assert environ["ADAPTDL_REPLICA_RANK"] == "1" and environ["ADAPTDL_NUM_REPLICAS"] == "2" and environ["ADAPTDL_MASTER_PORT"] == "5"


def _fake_real_adaptdl(root):
    (root / "adaptdl" / "torch").mkdir(parents=True)
    (root / "adaptdl" / "__init__.py").write_text("REAL = True\n")
    (root / "adaptdl" / "torch" / "__init__.py").write_text("REAL = True\n")


def test_the_hook_serves_adaptdl_and_steps_aside_for_a_real_one(tmp_path, monkeypatch):
    try:
        assert compat.install_import_hook()
        import adaptdl.torch as adl

        assert adl.__name__ == "raylight.adaptdl.torch" and callable(adl.AdaptiveDataLoader)
    finally:
        compat.uninstall_import_hook()
    assert "adaptdl" not in sys.modules
    _fake_real_adaptdl(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="AdaptDL is installed.*RAYLIGHT_ADAPTDL=1"):
        assert not compat.install_import_hook()
    assert not compat.install_from_env({})  # unset: real AdaptDL wins, quietly
    assert not compat.install_from_env({"RAYLIGHT_ADAPTDL": "0"})
    with pytest.raises(ValueError, match="RAYLIGHT_ADAPTDL='yes'"):
        compat.install_from_env({"RAYLIGHT_ADAPTDL": "yes"})
    try:
        assert compat.install_from_env({"RAYLIGHT_ADAPTDL": "1"})
        import adaptdl

        assert adaptdl.__name__ == "raylight.adaptdl"
    finally:
        compat.uninstall_import_hook()


def _bootstrap(script, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_", "RANK", "WORLD_SIZE", "MASTER_", "ADAPTDL_"))}
    env["PYTHONPATH"] = os.pathsep.join([*extra.pop("path", []), os.path.join(REPO, "src")])
    return subprocess.run([sys.executable, agent.BOOTSTRAP, str(script), *extra.pop("args", [])], capture_output=True,
                          text=True, timeout=200, env={**env, **extra}, cwd=tmp_path)


def test_raylight_runs_bootstrap_serves_import_adaptdl(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import adaptdl.torch as adl\nprint(adl.__name__, getattr(adl, 'REAL', False))\n")
    assert _bootstrap(script, tmp_path).stdout.strip() == "raylight.adaptdl.torch False"
    done = _bootstrap(script, tmp_path, RAYLIGHT_ADAPTDL="0")
    assert done.returncode != 0 and "No module named 'adaptdl'" in done.stderr
    real = tmp_path / "site"
    _fake_real_adaptdl(real)
    assert _bootstrap(script, tmp_path, path=[str(real)]).stdout.strip() == "adaptdl.torch True"
    assert _bootstrap(script, tmp_path, path=[str(real)], RAYLIGHT_ADAPTDL="1").stdout.strip() == "raylight.adaptdl.torch False"


def test_one_process_resumes_from_adaptdl_checkpoint_path(tmp_path):
    """Two epochs, then the same script asked for three: it starts at epoch 2 from the
    checkpoint files, and a per-epoch Accumulator restored is that epoch's, not another's."""
    script = tmp_path / "mnist.py"
    script.write_text(TUTORIAL)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    first = _bootstrap(script, tmp_path, args=["--epochs", "2"], ADAPTDL_CHECKPOINT_PATH=str(ckpt))
    assert first.returncode == 0, first.stderr
    assert "starts at epoch 0" in first.stdout
    assert sorted(os.listdir(ckpt)) == ["checkpoint-0"]
    saved = sorted(os.listdir(ckpt / "checkpoint-0"))
    assert "adaptdl-accumulator-epoch0-0" in saved and "adaptdl-accumulator-epoch1-0" in saved
    second = _bootstrap(script, tmp_path, args=["--epochs", "3"], ADAPTDL_CHECKPOINT_PATH=str(ckpt))
    assert second.returncode == 0, second.stderr
    assert "starts at epoch 2" in second.stdout and "epoch 1 accuracy" not in second.stdout
    accuracy = float(second.stdout.split("epoch 2 accuracy ")[1].split()[0])
    assert 0.0 < accuracy <= 1.0  # the fresh epoch-2 accumulator, not epoch 1's sums added to it


def test_mp_scaler_must_be_a_grad_scaler(tmp_path):
    script = tmp_path / "amp.py"
    script.write_text(
        "import torch, adaptdl.torch as adl\nadl.init_process_group('gloo')\nm = torch.nn.Linear(2, 1)\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "adl.AdaptiveDataParallel(m, o, mp_scaler=object())\n"
    )
    done = _bootstrap(script, tmp_path)
    assert done.returncode != 0 and "TypeError" in done.stderr and "expected a torch.amp.GradScaler" in done.stderr


def test_a_buffer_viewed_with_odd_strides_is_copied_to_plain_ones():
    """The transformer example's positional encoding (a transposed view, a size-1 dimension
    with a large stride), which DDP's buffer broadcast refuses: the same values, plain strides."""
    import torch

    from raylight.adaptdl.torch.parallel import _contiguous_buffers

    m = torch.nn.Module()
    m.register_buffer("pe", torch.arange(6.0).view(3, 2).unsqueeze(0).transpose(0, 1))
    m.register_buffer("plain", torch.ones(2, 2))
    before, plain = m.pe.clone(), m.plain
    assert m.pe.stride() == (2, 6, 1)
    _contiguous_buffers(m)
    assert m.pe.stride() == (2, 2, 1) and torch.equal(m.pe, before)
    assert m.plain is plain  # a plain buffer is left as it is
