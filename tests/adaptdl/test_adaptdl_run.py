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

from raylight.launch import agent
from raylight.launch.driver import launch
from tests.adaptdl.tutorial import TUTORIAL
from tests.conftest import REPO
from tests.helpers import assert_no_strays

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


def _one_process(script, out):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.path.join(REPO, "src")
    code = "import sys; from raylight.worker.adl.compat import install_import_hook; install_import_hook(); " \
           f"sys.argv = [{str(script)!r}, '--out', {str(out)!r}]; import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def test_the_tutorial_adapts_survives_a_killed_worker_and_reaches_one_process_accuracy(ray_cluster, tmp_path, capsys, caplog):
    script = tmp_path / "mnist_step5.py"
    script.write_text(TUTORIAL)
    out = tmp_path / "two.json"
    code = launch(str(script), ["--kill-in-epoch", "2", "--out", str(out)], num_workers=2, max_failures=1,
                  storage_path=str(tmp_path / "runs"), name="adl")
    assert code == 0
    printed = capsys.readouterr()
    assert "[rank 0] replica 0 of 2 restart 0 starts at epoch 0" in printed.out
    assert "[rank 0] replica 0 of 2 restart 1 starts at epoch 2" in printed.out  # the epochs before the kill are kept
    assert "the script was killed by SIGKILL" in caplog.text
    two = json.loads(out.read_text())
    assert max(two["sizes"]) > 32 and two["gain"] > 1.0  # the engine grew the batch; AdaScale's gain followed
    one = _one_process(script, tmp_path / "one.json")
    assert one["sizes"] == [32] * 8  # one replica keeps its batch (AdaptDL's rule: no noise measured)
    assert two["accuracy"] >= one["accuracy"] - 0.05, (two, one)
    assert agent.BOOTSTRAP  # the scripts ran through raylight run's bootstrap, which served the hook
    assert_no_strays(str(tmp_path))
