"""AdaptDL's MNIST tutorial (tests/adaptdl/tutorial.py), unchanged, under `raylight run -n 2`:
`import adaptdl.torch as adl` is served by raylight.adaptdl, the batch adapts, a worker
killed mid-epoch restarts the group, which resumes from its State checkpoint, and the run
ends near the accuracy of one plain process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.adaptdl.tutorial import TUTORIAL
from tests.conftest import REPO
from tests.helpers import assert_no_strays

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


def _one_process(script, out):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.path.join(REPO, "src")
    code = "import sys; from raylight.worker.adl.compat import install_import_hook; install_import_hook(force=True); " \
           f"sys.argv = [{str(script)!r}, '--out', {str(out)!r}]; import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_the_tutorial_adapts_survives_a_killed_worker_and_reaches_one_process_accuracy(tmp_path):
    # The CLI in its own process, with its own embedded Ray: the environment it is given
    # reaches the scripts. RAYLIGHT_ADAPTDL=1 asks for raylight's layer even where real
    # AdaptDL is installed (the dev extra installs it for tests/adaptive/test_adaptdl_goodput.py).
    script = tmp_path / "mnist_step5.py"
    script.write_text(TUTORIAL)
    out = tmp_path / "two.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(RAYLIGHT_ADAPTDL="1", PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]))
    done = subprocess.run(
        [sys.executable, "-m", "raylight.cli", "run", "-n", "2", "--max-failures", "1", "--name", "adl",
         "--storage-path", str(tmp_path / "runs"), str(script), "--kill-in-epoch", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=360, env=env, cwd=tmp_path,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert "[rank 0] replica 0 of 2 restart 0 starts at epoch 0" in printed
    assert "[rank 0] replica 0 of 2 restart 1 starts at epoch 2" in printed  # the epochs before the kill are kept
    assert "SIGKILL" in printed
    two = json.loads(out.read_text())
    assert max(two["sizes"]) > 32 and two["gain"] > 1.0  # the engine grew the batch; AdaScale's gain followed
    one = _one_process(script, tmp_path / "one.json")
    assert one["sizes"] == [32] * 8  # one replica keeps its batch (AdaptDL's rule: no noise measured)
    assert two["accuracy"] >= one["accuracy"] - 0.05, (two, one)
    assert_no_strays(str(tmp_path))
