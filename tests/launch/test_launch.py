"""`raylight run`'s pure parts and its child-side channel, without Ray: the size
parser, the init watch, the driver's printing, the child's environment and command, the
bootstrap running a script as __main__, and run_context() against a real agent channel."""

import io
import os
import subprocess
import sys
import threading

import pytest
import torch

from raylight.base.exceptions import ConfigError
from raylight.launch import agent
from raylight.launch.agent import LaunchSpec, ScriptExitError, _Channel, child_command, child_env
from raylight.launch.driver import (
    InitTimeoutError,
    InitWatch,
    RankOutput,
    _check_target,
    launch,
    parse_size,
)
from raylight.worker import run_channel as client
from raylight.worker.adaptive.sync import ResizeInterrupt
from raylight.worker.protocol import GroupPoll, WorkerFailure, WorkerPoll
from raylight.worker.run_wire import ChannelRefused
from tests.helpers import wait_until

SPEC = LaunchSpec(target="/x/train.py", args=("--lr", "0.1"), module=False, cwd="/x", run_name="r", max_restarts=2)


def test_parse_size():
    assert parse_size("2") == 2
    assert parse_size("1:4") == (1, 4)
    for bad in ("0", "-1", "3:2", "a", "1:2:3", "", "0:2"):
        with pytest.raises(ConfigError, match="-n/--nproc"):
            parse_size(bad)


def test_bad_targets_name_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.py' does not exist"):
        _check_target(str(tmp_path / "nope.py"), module=False)
    with pytest.raises(ConfigError, match=r"-m no_such_pkg\.mod: no module 'no_such_pkg'"):
        _check_target("no_such_pkg.mod", module=True)
    with pytest.raises(ConfigError, match="--init-timeout"):
        launch(__file__, init_timeout_s=0)
    with pytest.raises(ConfigError, match="--cpus"):
        launch(__file__, cpus=0)
    with pytest.raises(ConfigError, match="--resize-interval must be > 0 seconds, got 0"):
        launch(__file__, num_workers=(1, 2), resize_interval_s=0)
    with pytest.raises(ConfigError, match="--resize-interval is for an elastic run: give -n MIN:MAX"):
        launch(__file__, num_workers=2, resize_interval_s=1)


def test_init_watch_names_the_missing_ranks():
    watch = InitWatch(10.0)
    assert watch.missing(100.0, 3) == []  # nobody called init: a single-process script
    watch.event(0, "init_entered", 1.0)
    watch.event(2, "init_entered", 5.0)
    watch.event(0, "init_done", 6.0)
    assert watch.missing(10.9, 3) == []
    assert watch.missing(11.0, 3) == [1]
    watch.reset()
    assert watch.missing(100.0, 3) == []


def _poll(outputs, failures=()):
    polls = [WorkerPoll(rank=r, state="running", output=list(o)) for r, o in enumerate(outputs)]
    return GroupPoll(polls=polls, failures=list(failures))


def test_rank_output_prints_by_stream_counts_restarts_and_times_out_init():
    out, err, now = io.StringIO(), io.StringIO(), [0.0]
    restarts = [0]
    printer = RankOutput(InitWatch(5.0), restarts, out=out, err=err, clock=lambda: now[0])
    printer(_poll([[("stdout", "hello"), ("event", "init_entered"), ("stderr", "warn")], [("stdout", "hi")]]))
    assert out.getvalue() == "[rank 0] hello\n[rank 1] hi\n"
    assert err.getvalue() == "[rank 0] warn\n"
    now[0] = 6.0
    with pytest.raises(InitTimeoutError, match=r"rank\(s\) 1 did not call torch.distributed.init_process_group within --init-timeout=5s"):
        printer(_poll([[], []]))
    printer(_poll([[], []], failures=[WorkerFailure(1, "error", "boom")]))  # a restart: the watch starts again
    assert restarts == [1]
    printer(_poll([[], []]))
    printer(_poll([[]]))  # an elastic run's group came back smaller
    assert err.getvalue().splitlines()[-1] == "raylight run: the scripts restarted with WORLD_SIZE=1 (was 2)"
    assert restarts == [1]


def test_child_env_is_torchruns():
    env = child_env(
        {"PATH": "/bin", "MASTER_PORT": "1"}, SPEC, rank=3, local_rank=1, world_size=4, local_world_size=2,
        node_rank=1, nodes=2, master_addr="10.0.0.1", master_port=29555, restarts=1,
    )
    assert {k: env[k] for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    )} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29555",
        "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "2", "TORCHELASTIC_RUN_ID": "r",
    }
    assert env["PATH"] == "/bin"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the scripts' store is the agent's
    assert child_command(SPEC)[2:] == ["/x/train.py", "--lr", "0.1"]
    assert child_command(LaunchSpec("pkg.mod", ("-x",), True, "/x", "r", 0))[2:] == ["-m", "pkg.mod", "-x"]


def test_a_rank_on_a_node_without_the_driver_s_cwd_runs_elsewhere_and_says_so(tmp_path):
    lines: list[tuple[str, str]] = []
    ctx = type("Ctx", (), {"_output": lambda self, stream, text: lines.append((stream, text))})()
    assert agent.working_directory(LaunchSpec("/x/t.py", (), False, str(tmp_path), "r", 0), ctx) == str(tmp_path)
    assert lines == []
    missing = str(tmp_path / "only-on-the-driver")
    assert agent.working_directory(LaunchSpec("/x/t.py", (), False, missing, "r", 0), ctx) is None
    [(stream, text)] = lines
    assert stream == "stderr" and f"the driver's working directory {missing} is not on this node" in text
    assert f"this rank runs in {os.getcwd()}" in text and "raylight submit --working-dir" in text


def test_script_exit_error_pickles_and_names_signals():
    import pickle

    err = pickle.loads(pickle.dumps(ScriptExitError(1, 3)))
    assert (err.rank, err.code, str(err)) == (1, 3, "rank 1: the script exited with code 3")
    assert "killed by SIGKILL" in str(ScriptExitError(0, 137))


def test_bootstrap_runs_a_script_as_main(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import sys, os\n"
        "print(__name__, sys.argv, sys.path[0] == os.path.dirname(os.path.abspath(__file__)))\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLIGHT_RUN")}
    done = subprocess.run(
        [sys.executable, agent.BOOTSTRAP, str(script), "--code", "7"], capture_output=True, text=True, env=env,
        timeout=60,
    )
    assert done.returncode == 7
    assert done.stdout.strip() == f"__main__ ['{script}', '--code', '7'] True"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("import sys\nif __name__ == '__main__':\n    print('module', sys.argv[1:])\n")
    done = subprocess.run(
        [sys.executable, agent.BOOTSTRAP, "-m", "pkg.mod", "-v"], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "module ['-v']")


def test_bootstrap_tells_the_agent_over_the_core_s_wire_and_imports_nothing_of_raylight(tmp_path):
    """The child's first code loads the channel's wire (``raylight.worker.run_wire``) by its
    file path: the events of ``init_process_group`` reach the agent, and the script finds
    nothing of raylight imported."""
    script = tmp_path / "s.py"
    script.write_text(
        "import sys\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo', init_method='file://' + sys.argv[1], rank=0, world_size=1)\n"
        "dist.destroy_process_group()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'raylight'))\n"
    )
    ctx = _FakeContext()
    with _Channel(ctx) as channel:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLIGHT_RUN")}
        env.update({client.CHANNEL_ENV: channel.address, client.KEY_ENV: channel.key.hex()})
        done = subprocess.run(
            [sys.executable, agent.BOOTSTRAP, str(script), str(tmp_path / "group")], capture_output=True, text=True,
            env=env, timeout=120,
        )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    assert [text for stream, text in ctx.lines if stream == agent.EVENT] == ["init_entered", "init_done"]
    assert ctx.starts == 1


def test_bootstrap_runs_where_raylight_cannot_be_imported(tmp_path):
    """The bootstrap and its wire, copied as raylight lays them out, start a script in an
    interpreter with no site-packages (no raylight, no torch) and no PYTHONPATH."""
    import shutil

    from raylight.worker import run_wire

    (tmp_path / "pkg" / "launch").mkdir(parents=True)
    (tmp_path / "pkg" / "worker").mkdir()
    shutil.copy(agent.BOOTSTRAP, tmp_path / "pkg" / "launch" / "bootstrap.py")
    shutil.copy(run_wire.__file__, tmp_path / "pkg" / "worker" / "run_wire.py")
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('ran', [m for m in sys.modules if m.split('.')[0] in ('raylight', 'torch')])\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "PYTHON"))}
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(tmp_path / "pkg" / "launch" / "bootstrap.py"), str(script)],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ran []"), done.stderr


HELD_IN_A_CYCLE = (
    "import sys\n"
    "class Held:\n"
    "    def __del__(self):\n"
    "        print('finalizing' if sys.is_finalizing() else 'whole', flush=True)\n"
    "held = Held()\n"
    "held.me = held\n"
    "del held\n"
)


def test_cycles_are_freed_before_the_interpreters_teardown(tmp_path):
    """What a script leaves in a cycle (DDP's reducer and its collective work) is freed at
    exit while the interpreter is whole, not during its teardown: under `raylight run`'s
    bootstrap, and in a launcher's process once raylight joins it (collect_at_exit)."""
    script = tmp_path / "s.py"
    script.write_text(HELD_IN_A_CYCLE)
    joined = tmp_path / "joined.py"
    joined.write_text("from raylight.worker.process_group import collect_at_exit\ncollect_at_exit()\ncollect_at_exit()\n" + HELD_IN_A_CYCLE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLIGHT_RUN")}

    def run(*cmd: str) -> str:
        return subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env, timeout=60).stdout.strip()

    assert (run(str(script)), run(agent.BOOTSTRAP, str(script)), run(str(joined))) == ("finalizing", "whole", "whole")


class _FakeContext:
    """The agent's view of a worker's TrainContext: what the channel calls."""

    rank = 0

    def __init__(self) -> None:
        self.starts = 0
        self.lines: list[tuple[str, str]] = []
        self.reports: list[tuple[dict, dict | None]] = []
        self.snapshots: list[tuple[dict, dict]] = []
        self.lock = threading.Lock()
        self._stop_asked = threading.Event()  # TrainContext's: the driver asked the loop to stop

    def _output(self, stream, text):
        with self.lock:
            self.lines.append((stream, text))

    def report(self, metrics, *, checkpoint=None):
        self.reports.append((metrics, checkpoint))

    def _report_snapshot(self, metrics, checkpoint):
        self.snapshots.append((metrics, checkpoint))

    def load_checkpoint(self):
        return self.reports[-1][1] if self.reports else None

    def _started(self):
        self.starts += 1


def test_run_context_reports_and_loads_through_the_agent_channel(monkeypatch):
    with pytest.raises(RuntimeError, match="only in a script started by `raylight run`"):
        monkeypatch.delenv(client.CHANNEL_ENV, raising=False)
        client.run_context()
    ctx = _FakeContext()
    with _Channel(ctx) as channel:
        run = client.RunContext(channel.address, channel.key)
        assert run.load_checkpoint() is None
        run.report({"loss": torch.tensor(0.5), "step": 1}, checkpoint={"w": torch.arange(3.0), "step": 1})
        metrics, ckpt = ctx.reports[0]
        assert metrics == {"loss": 0.5, "step": 1}
        assert torch.equal(ckpt["w"], torch.arange(3.0)) and ckpt["step"] == 1
        loaded = run.load_checkpoint()
        assert torch.equal(loaded["w"], torch.arange(3.0))
        with pytest.raises(TypeError, match="metric 'bad'"):
            run.report({"bad": object()})
        with pytest.raises(ChannelRefused, match="not this run's"):
            client.RunContext(channel.address, b"wrong key" * 4)
        assert run.load_checkpoint() is not None  # the channel still serves
        assert ctx.starts == 1  # the first report told the driver the script is at work, once
        run._conn.close()


class _AgentContext(_FakeContext):
    """A one-worker TrainContext as the agent loop sees it."""

    local_rank, world_size, local_world_size, node_rank = 0, 1, 1, 0

    def all_reduce(self, value, op="mean"):
        return value

    def heartbeat(self):
        pass


def test_agent_runs_the_script_in_a_child_and_forwards_its_lines(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('rank', os.environ['RANK'], 'of', dist.get_world_size(), 'restart', os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "print('oops', file=sys.stderr)\n"
        "dist.destroy_process_group()\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    spec = LaunchSpec(str(script), ("0",), False, str(tmp_path), "r", 0)
    ctx = _AgentContext()
    agent.agent_loop(ctx, {"spec": spec, "restarts": [2]})
    # stdout and stderr are read by a thread each: in order within a stream, interleaved across
    assert sorted(ctx.lines) == sorted([
        ("event", "init_entered"), ("event", "init_done"), ("stdout", "rank 0 of 1 restart 2"), ("stderr", "oops"),
    ])
    assert [line for line in ctx.lines if line[0] == "event"] == [("event", "init_entered"), ("event", "init_done")]
    assert ctx.starts == 1  # init_done told the driver the script is at work (an elastic resize settled)
    with pytest.raises(ScriptExitError, match="rank 0: the script exited with code 9"):
        agent.agent_loop(_AgentContext(), {"spec": LaunchSpec(str(script), ("9",), False, str(tmp_path), "r", 0), "restarts": [0]})
    assert len(agent._AGENT_STORES) == 2  # rank 0's agent held each attempt's store
    agent._AGENT_STORES.clear()


def _stop_when_ready(ctx: _AgentContext) -> threading.Thread:
    """Ask the agent to stop (as the actor's interrupt does) once its script says ready."""

    def stop() -> None:
        wait_until(lambda: ("stdout", "ready") in ctx.lines, 60, "the script to start")
        ctx._stop_asked.set()

    thread = threading.Thread(target=stop, daemon=True)
    thread.start()
    return thread


def test_a_stop_reaches_a_script_that_asks_and_its_checkpoint_is_the_snapshot(tmp_path, monkeypatch):
    """The driver's stop (a notice) makes the script's should_stop() True at its next
    step; the checkpoint it reports then is a snapshot, and the loop ends paused
    (ResizeInterrupt), not failed, with no SIGTERM sent."""
    script = tmp_path / "s.py"
    script.write_text(
        "import signal, sys, time\n"
        "import raylight\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "ctx = raylight.run_context()\n"
        "assert not ctx.should_stop()\n"
        "print('ready', flush=True)\n"
        "step = 0\n"
        "while not ctx.should_stop():\n"
        "    time.sleep(0.01)\n"
        "    step += 1\n"
        "ctx.report({'step': step}, checkpoint={'step': step})\n"
        "print('stopped', flush=True)\n"
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))
    ctx = _AgentContext()
    stopper = _stop_when_ready(ctx)
    with pytest.raises(ResizeInterrupt):
        agent.agent_loop(ctx, {"spec": LaunchSpec(str(script), (), False, str(tmp_path), "r", 0), "restarts": [0]})
    stopper.join(10)
    assert ("stdout", "stopped") in ctx.lines, ctx.lines
    assert len(ctx.snapshots) == 1 and not ctx.reports, "the checkpoint after the stop is the snapshot"
    metrics, checkpoint = ctx.snapshots[0]
    assert checkpoint == {"step": metrics["step"]}
    agent._AGENT_STORES.clear()


def test_a_stop_terminates_a_script_that_never_asks_and_is_no_failure(tmp_path, monkeypatch):
    """A script that never calls should_stop() gets SIGTERM (its own handler may save its
    own checkpoint, as under torchrun); the loop ends paused whatever its exit code."""
    script = tmp_path / "s.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "def on_term(*a):\n"
        "    open(os.path.join(sys.argv[1], 'own-checkpoint'), 'w').close()\n"
        "    sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    ctx = _AgentContext()
    stopper = _stop_when_ready(ctx)
    with pytest.raises(ResizeInterrupt):
        agent.agent_loop(ctx, {"spec": LaunchSpec(str(script), (str(tmp_path),), False, str(tmp_path), "r", 0), "restarts": [0]})
    stopper.join(10)
    assert (tmp_path / "own-checkpoint").exists(), "the script's SIGTERM handler ran"
    assert not ctx.snapshots
    agent._AGENT_STORES.clear()


def test_bootstrap_serves_import_horovod_when_asked(tmp_path):
    """RAYLIGHT_HOROVOD_COMPAT=1: a Horovod script's `import horovod.torch` gets raylight.horovod,
    also where real Horovod is installed (its hvd.init() could not join raylight run's group)."""
    import importlib.util

    script = tmp_path / "h.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\nprint(hvd.__name__, hvd.size(), hvd.rank())\nhvd.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_RUN", "RANK", "WORLD_SIZE", "MASTER_"))}
    done = subprocess.run(
        [sys.executable, agent.BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=60,
        env={**env, "RAYLIGHT_HOROVOD_COMPAT": "1"},
    )
    assert (done.returncode, done.stdout.strip()) == (0, "raylight.horovod 1 0"), done.stderr
    if importlib.util.find_spec("horovod") is None:  # off by default, and the error says how to turn it on
        done = subprocess.run([sys.executable, agent.BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode != 0 and "No module named 'horovod'" in done.stderr
        assert "-m raylight.horovod" in done.stderr and "horovodrun" in done.stderr, done.stderr


def test_a_real_horovod_group_smaller_than_the_run_fails_its_init(tmp_path):
    """Where Horovod is installed, a script under `raylight run` without raylight.horovod
    gets real Horovod, whose hvd.init() forms a group of 1 outside horovodrun or MPI:
    every rank would train alone. Its init fails instead, saying what to run. (A stand-in
    `horovod.torch` package with real Horovod's init/size shape; tests/worker/test_horovod_real.py
    runs real Horovod where it is built.)"""
    package = tmp_path / "site" / "horovod"
    (package / "torch").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "torch" / "__init__.py").write_text(
        "from horovod.torch.mpi_ops import init, size\n"
    )
    (package / "torch" / "mpi_ops.py").write_text("def init():\n    pass\n\ndef size():\n    return 1\n")
    script = tmp_path / "h.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\nprint('trained', hvd.size())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYLIGHT_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = str(tmp_path / "site")

    def run(world: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, agent.BOOTSTRAP, str(script)], capture_output=True, text=True, timeout=60,
            env={**env, "WORLD_SIZE": str(world)},
        )

    alone = run(2)
    assert alone.returncode != 0 and "trained" not in alone.stdout, alone.stdout
    assert "formed a group of 1 under `raylight run`, whose group has 2 ranks" in alone.stderr, alone.stderr
    assert "-m raylight.horovod" in alone.stderr
    one = run(1)  # a run of one rank: real Horovod's group of one is the run's
    assert (one.returncode, one.stdout.strip()) == (0, "trained 1"), one.stderr


@pytest.mark.parametrize("outcome, code, words", [
    (3, 3, ""),  # a rank's script exited with 3: the run's code
    (InitTimeoutError("rank(s) 1 did not call torch.distributed.init_process_group within --init-timeout=3s"), 1,
     "rank(s) 1 did not call torch.distributed.init_process_group"),
])
def test_the_command_exits_with_the_runs_code(monkeypatch, tmp_path, outcome, code, words):
    """What the command makes of launch's outcome (launch itself runs on Ray in
    tests/launch/test_run.py): a failing rank's code, 1 and the rank named for a never-init."""
    from typer.testing import CliRunner

    from raylight.cli import app
    from raylight.cli import launch as command

    def fake_launch(*args, **kwargs):
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(command, "launch", fake_launch)
    script = tmp_path / "s.py"
    script.write_text("")
    result = CliRunner().invoke(app, ["run", "-n", "2", str(script)])
    assert result.exit_code == code, result.output
    assert words in " ".join(result.output.split())


def test_resize_interval_reaches_the_run_and_is_checked_before_ray_starts(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from raylight.cli import app
    from raylight.cli import launch as command

    script = tmp_path / "s.py"
    script.write_text("")
    bad = CliRunner().invoke(app, ["run", "-n", "2", "--resize-interval", "1", str(script)])
    assert bad.exit_code == 2 and "give -n MIN:MAX" in " ".join(bad.output.split()), bad.output
    seen = {}
    monkeypatch.setattr(command, "launch", lambda *a, **kw: seen.update(kw) or 0)
    ok = CliRunner().invoke(app, ["run", "-n", "1:2", "--resize-interval", "0.5", str(script)])
    assert ok.exit_code == 0 and seen["resize_interval_s"] == 0.5, ok.output


def test_a_script_missing_on_a_worker_s_node_is_named_with_the_fix(tmp_path):
    """On a cluster of several machines the driver's script path may not exist where a
    worker runs; the agent says so instead of Python's "can't open file" (exit 2)."""
    here = tmp_path / "train.py"
    here.write_text("print('hi')\n")
    spec = agent.LaunchSpec(target=str(here), args=(), module=False, cwd=str(tmp_path), run_name="r", max_restarts=0)
    agent.check_on_this_node(spec)  # there: nothing to say
    agent.check_on_this_node(agent.LaunchSpec("pkg.train", (), True, str(tmp_path), "r", 0))  # a module: sys.path decides
    elsewhere = agent.LaunchSpec(str(tmp_path / "on-the-laptop" / "train.py"), (), False, str(tmp_path), "r", 0)
    with pytest.raises(ConfigError, match=r"script .*on-the-laptop/train.py is not on this node \(.*\).*raylight submit --working-dir DIR"):
        agent.check_on_this_node(elsewhere)


def test_a_rank_s_config_error_is_launch_s_own_not_a_training_failure(monkeypatch, tmp_path):
    """A rank whose node lacks the script fails with the agent's ConfigError: launch raises
    that error (the command exits 2 with its words), not the TrainingFailedError around it
    (exit 1, a worker traceback). Seen over hosts (tests/hosts/test_run_over_hosts.py)."""
    from raylight.base.exceptions import TrainingFailedError
    from raylight.driver import trainer

    missing = ConfigError("script /tmp/run/train.py is not on this node (c): ...")

    class Failing:
        def __init__(self, *args, **kwargs):
            pass

        def fit(self):
            raise TrainingFailedError("worker rank 0 raised ConfigError") from missing

    monkeypatch.setattr(trainer, "Trainer", Failing)
    script = tmp_path / "s.py"
    script.write_text("")
    with pytest.raises(ConfigError) as raised:
        launch(str(script), [], num_workers=2, storage_path=str(tmp_path / "runs"))
    assert raised.value is missing


def test_resume_needs_the_run_s_name_and_an_existing_run_needs_resume(monkeypatch, tmp_path):
    """``raylight run --resume`` continues run --name (RAYLIGHT_RESUME=1 still does for a
    submitted job); without --resume a run that has a checkpoint is refused, before Ray
    starts, saying how to continue it. (The resumed run itself: tests/launch/test_run.py.)"""
    from typer.testing import CliRunner

    from raylight.cli import app
    from raylight.driver.recorder import RunRecorder
    from raylight.storage.checkpoint import serialize_state
    from raylight.storage.run_dir import RunStorage
    from raylight.worker.protocol import Report

    script = tmp_path / "s.py"
    script.write_text("")
    nameless = CliRunner().invoke(app, ["run", "--resume", str(script)])
    assert nameless.exit_code == 2 and "give it with --name NAME" in " ".join(nameless.output.split()), nameless.output
    rec = RunRecorder(RunStorage(str(tmp_path / "runs" / "job")), checkpoints_to_keep=2)
    rec.open({}, resume=False)
    rec.begin()
    rec.record(Report({"step": 0}, serialize_state({"step": 0}), seq=0), num_workers=1)
    rec.lease.release()
    again = CliRunner().invoke(app, ["run", "--name", "job", "--storage-path", str(tmp_path / "runs"), str(script)])
    text = " ".join(again.output.split())
    assert again.exit_code == 2 and "run 'job' already exists" in text and "pass --resume to continue it" in text, again.output
