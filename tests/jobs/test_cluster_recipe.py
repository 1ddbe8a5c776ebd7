"""docs/cluster.md's "Try it on one machine" recipe, run as written (issue 55).

The bash block after the ``recipe: loopback-cluster`` comment is read from the page and
run with the differences the page lists: free ports in place of 6390 and 8265 (and for
the client and agent ports a head takes by default), the head's own ``--temp-dir`` and
``HOME`` (its token is its own, not the machine's ~/.ray/auth_token), its ``ray start``
run with ``--block`` in the background, so that this test holds the head's processes, and
``ray stop`` (which stops every Ray of the machine) replaced by ending those processes by
PID. Everything else, the token step, `raylight submit`, `raylight jobs`, runs as a user
pastes it, with `set -e`: the steps before `ray start` in the head's shell (it execs the
head), the steps after it in a second shell that first repeats the earlier `export` lines.
Slow: 6.3 min here at a load average of 25 on 2 cores (2026-12-02).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest

from tests.conftest import REPO
from tests.helpers import wait_until
from tests.jobs.test_jobs_on_ray import _answers, _free_port, stop_head

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

PAGE = os.path.join(REPO, "docs", "cluster.md")
VENV_BIN = os.path.dirname(sys.executable)


def recipe_commands() -> list[str]:
    """The recipe block's commands, continuation lines joined, comments dropped."""
    text = pathlib.Path(PAGE).read_text()
    found = re.search(r"recipe: loopback-cluster.*?-->\n```bash\n(.*?)```", text, re.S)
    assert found, f"{PAGE} has no ```bash block after its 'recipe: loopback-cluster' comment"
    joined = found.group(1).replace("\\\n", " ")
    return [" ".join(line.split()) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_recipe_block_is_what_this_test_expects():
    commands = recipe_commands()
    starts = [c for c in commands if c.startswith("ray start")]
    assert len(starts) == 1 and starts[0].startswith("ray start --head --node-ip-address 127.0.0.1 --port 6390 ")
    assert "--dashboard-host 127.0.0.1 --dashboard-port 8265" in starts[0]
    assert commands[-1] == "ray stop" and commands.count("ray stop") == 1
    assert "export RAY_AUTH_MODE=token" in commands[:commands.index(starts[0])]


def _split(commands: list[str]) -> tuple[list[str], str, list[str]]:
    """(the steps before ``ray start``, ``ray start``, the steps after it but ``ray stop``)."""
    i = next(i for i, c in enumerate(commands) if c.startswith("ray start"))
    return commands[:i], commands[i], commands[i + 1:-1]


class RecipeHead:
    """The recipe's steps up to its ``ray start`` (run as ``--block``) in one shell, on
    free ports and this head's own temp dir; stopped by the PIDs of its processes."""

    def __init__(self, before: list[str], start: str, env: dict[str, str], log_path: pathlib.Path) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="rlr-", dir="/tmp")  # short: Ray's socket paths
        self.dash = _free_port()
        start = start.replace("--port 6390", f"--port {_free_port()}").replace("--dashboard-port 8265", f"--dashboard-port {self.dash}")
        start += (
            f" --block --temp-dir {self.temp_dir} --ray-client-server-port {_free_port()} --dashboard-agent-listen-port "
            f"{_free_port()} --dashboard-agent-grpc-port {_free_port()} --disable-usage-stats"
        )
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - open while the head runs
        script = "set -ex\n" + "\n".join([*before, f"exec {start}"])
        self.proc = subprocess.Popen(["bash", "-c", script], env={**env, "TMPDIR": self.temp_dir, "PYTHONUNBUFFERED": "1"}, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=REPO)

    def started(self) -> bool:
        """Whether `ray start` said its node is up (False: it exited first)."""
        wait_until(lambda: self.proc.poll() is not None or "Ray runtime started" in self.log_path.read_text(),
                   180, "the recipe's ray start")
        return self.proc.poll() is None

    def stop(self) -> None:
        stop_head(self.proc, self.temp_dir)
        self.log.close()


def test_the_loopback_recipe_runs_as_written(tmp_path):
    before, start, rest = _split(recipe_commands())
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE")}
    env.update(HOME=str(home), PATH=f"{VENV_BIN}:{env.get('PATH', '')}", PYTHONPATH=f"{REPO}/src:{REPO}")
    # `ray start` gives its raylet 30 s to register (ray/_private/node.py), which a loaded
    # machine can miss (seen here at load 26 on 2 cores); such a head exits, and is started
    # once more on new ports, its log in the error if that one exits too
    head = RecipeHead(before, start, env, tmp_path / "head1.log")
    if not head.started():
        head.stop()
        head = RecipeHead(before, start, env, tmp_path / "head2.log")
        if not head.started():
            head.stop()
            raise AssertionError(f"the recipe's head did not start:\n{head.log_path.read_text()[-3000:]}")
    try:
        dash = head.dash
        wait_until(lambda: _answers(f"http://127.0.0.1:{dash}/api/version"), 120, "the recipe's Jobs API", proc=head.proc)
        assert (home / ".ray" / "auth_token").exists()  # where the recipe says the token is
        with pytest.raises(urllib.error.HTTPError) as refused:  # no token, no jobs: authentication is on
            urllib.request.urlopen(f"http://127.0.0.1:{dash}/api/jobs/", timeout=10).close()
        assert refused.value.code in (401, 403)
        exports = [c for c in before if c.startswith("export ")]
        script = "set -ex\n" + "\n".join(c.replace("127.0.0.1:8265", f"127.0.0.1:{dash}") for c in [*exports, *rest])
        res = subprocess.run(["bash", "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=420)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out + head.log_path.read_text()[-3000:]
        assert "[rank 0] step 0 loss" in out and "[rank 1] step 0 loss" in out  # the job's output, streamed
        assert "status: SUCCEEDED" in out and "try1" in out
        assert oct((home / ".ray" / "auth_token").stat().st_mode & 0o777) == "0o600"
    finally:
        head.stop()
