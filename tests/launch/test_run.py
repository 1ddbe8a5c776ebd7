"""`raylight run` on real Ray and real torch.distributed: a torchrun-style DDP script gives
torchrun's parameters, output comes back rank-prefixed, exit codes and restarts behave as
under torchrun, raylight.run_context() reports and checkpoints, bad input is refused, and
no process of a script outlives its run (checked with ps after each test).

Most cases call ``launch`` in this process on the session's Ray; the CLI's own cases
(usage errors, Ctrl-C) run the command in a subprocess.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

from raylight.launch.driver import InitTimeoutError, launch
from tests.conftest import REPO
from tests.helpers import (
    assert_no_strays,
    ctrl_c_reaches_child,
    own_temp_dir,
    read_until,
    torchrun_command,
)
from tests.support import loops

pytestmark = pytest.mark.ray

EXAMPLE = os.path.join(REPO, "examples", "launch", "ddp_torchrun.py")
TIMEOUT = 300


def _cli(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "src"), **(env or {})}
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "-m", "raylight.cli", "run", *args], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO,
        preexec_fn=ctrl_c_reaches_child, **kwargs,
    )


@pytest.fixture(scope="module")
def torchrun_params(tmp_path_factory):
    """The example's parameters after 12 steps under real torchrun, 2 processes."""
    out = tmp_path_factory.mktemp("torchrun") / "params.pt"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    command = [*torchrun_command(torchrun), EXAMPLE, "--steps", "12", "--out", str(out)]
    with own_temp_dir(dict(os.environ)) as env:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, err
    return torch.load(out, weights_only=True)


def _assert_same(params, expected):
    assert params.keys() == expected.keys()
    for key in expected:
        assert torch.equal(params[key], expected[key]), key


def test_ddp_script_matches_torchrun_with_rank_prefixed_output(ray_cluster, tmp_path, capsys, torchrun_params):
    out = tmp_path / "params.pt"
    assert launch(EXAMPLE, ["--steps", "12", "--out", str(out)], num_workers=2, storage_path=str(tmp_path / "runs")) == 0
    _assert_same(torch.load(out, weights_only=True), torchrun_params)
    printed = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        assert [line.split(" loss ")[0] for line in printed if line.startswith(f"[rank {rank}] step")] == [
            f"[rank {rank}] step {s}" for s in (0, 5, 10)
        ]
    assert_no_strays(str(tmp_path))


def test_a_failed_rank_restarts_the_group_and_the_script_resumes_itself(ray_cluster, tmp_path, capsys, torchrun_params):
    out, ckpt = tmp_path / "params.pt", tmp_path / "own.pt"
    args = ["--steps", "12", "--out", str(out), "--checkpoint", str(ckpt), "--fail-once-at", "4"]
    assert launch(EXAMPLE, args, num_workers=2, max_failures=1, storage_path=str(tmp_path / "runs")) == 0
    _assert_same(torch.load(out, weights_only=True), torchrun_params)  # as if it had never failed
    captured = capsys.readouterr()
    assert "[rank 1] failing at step 4" in captured.err
    assert "[rank 0] resumed at step 4" in captured.out
    assert_no_strays(str(tmp_path))


def test_a_rank_exit_code_is_the_runs(ray_cluster, tmp_path, capsys):
    code = launch(EXAMPLE, ["--exit-code", "3", "--out", str(tmp_path / "x")], num_workers=2, storage_path=str(tmp_path))
    assert code == 3
    err = capsys.readouterr().err
    assert "[rank 1] rank 1 exiting with 3" in err
    assert "raylight run: rank 1: the script exited with code 3" in err
    assert_no_strays(str(tmp_path))


def test_module_with_run_context_reports_checkpoints_and_resumes(ray_cluster, tmp_path, capsys):
    code = launch(
        "tests.support.run_scripts", ["context", str(tmp_path)], module=True, num_workers=2, max_failures=1,
        storage_path=str(tmp_path), name="ctx",
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "[rank 0] attempt 0 starts at step 0 of 2" in out
    resumed = [line for line in out.splitlines() if line.startswith("[rank 0] attempt 1 starts at step")]
    assert resumed in (["[rank 0] attempt 1 starts at step 3 of 2"], ["[rank 0] attempt 1 starts at step 4 of 2"])
    rows = [json.loads(line) for line in (tmp_path / "ctx" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))  # a restart repeats no row
    assert rows[-1]["weight_sum"] == 12.0
    assert list((tmp_path / "ctx" / "checkpoints").iterdir())
    assert_no_strays(str(tmp_path))


def test_raylight_run_resume_continues_the_named_run(ray_cluster, tmp_path, capsys):
    """A run of 3 steps; the same name again is refused (ConfigError, exit 2 in the CLI)
    unless --resume, which continues at step 3 from its last checkpoint: 6 rows, none twice."""
    from raylight.base.exceptions import ConfigError

    common = {"module": True, "num_workers": 1, "storage_path": str(tmp_path), "name": "counted"}
    assert launch("tests.support.run_scripts", ["steps", "3"], **common) == 0
    with pytest.raises(ConfigError, match="pass --resume to continue it"):
        launch("tests.support.run_scripts", ["steps", "6"], **common)
    assert launch("tests.support.run_scripts", ["steps", "6"], resume=True, **common) == 0
    out = capsys.readouterr().out
    assert "[rank 0] world 1 restart 0 starts at step 0" in out and "[rank 0] world 1 restart 0 starts at step 3" in out
    rows = [json.loads(line) for line in (tmp_path / "counted" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6)) and rows[-1]["weight_sum"] == 12.0
    assert_no_strays(str(tmp_path))


def test_raylight_fit_in_a_script_joins_the_runs_group(ray_cluster, tmp_path, capsys):
    """A script that calls raylight.fit(num_workers=2) under `raylight run -n 2` trains once,
    in the run's two ranks (the launcher is the run's: no Ray workers of its own), both ranks
    get the same result and rank 0 alone writes the fit's run directory."""
    fits = tmp_path / "fits"
    fits.mkdir()
    code = launch("tests.support.run_scripts", ["fit", str(fits)], module=True, num_workers=2, storage_path=str(tmp_path / "runs"))
    assert code == 0
    results = sorted(line for line in capsys.readouterr().out.splitlines() if " result " in line)
    assert [line.split("]")[0] for line in results] == ["[rank 0", "[rank 1"]
    seen = [json.loads(line.split(" result ", 1)[1]) for line in results]
    assert seen[0] == seen[1] and seen[0]["history"] == [{"world_size": 2}]
    rows = [json.loads(line) for line in (fits / "fit" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["_workers"], r["world_size"]) for r in rows] == [(2, 2)], "one run of two workers, not two of two"
    assert set(json.loads((fits / "fit" / "cost.json").read_text())["node_seconds"]) == {"torchrun"}
    assert sorted(os.listdir(fits)) == ["fit", "model.pt"], "rank 0 alone writes"
    ref, got = loops.reference_sgd({"lr": 0.05, "batch_size": 32, "epochs": 3}), torch.load(fits / "model.pt", weights_only=True)
    for key in ref:
        assert torch.allclose(got[key], ref[key], atol=1e-5, rtol=0), key
    assert_no_strays(str(tmp_path))


def test_a_rank_that_never_initialises_is_named(ray_cluster, tmp_path, capsys):
    with pytest.raises(InitTimeoutError, match=r"rank\(s\) 1 did not call torch.distributed.init_process_group within --init-timeout=3s"):
        launch("tests.support.run_scripts", ["noinit", str(tmp_path)], module=True, num_workers=2, init_timeout_s=3,
               storage_path=str(tmp_path))
    assert "[rank 1] rank 1 does not init" in capsys.readouterr().out
    assert_no_strays(str(tmp_path))


def test_cli_usage_errors_exit_2(tmp_path):
    """Each exits 2 naming the fix, before starting the embedded Ray (whether the
    workers fit it is known from this machine's CPUs): no Ray to wait for, none left."""
    ray_tmp = tempfile.mkdtemp(prefix="rl-usage-", dir="/tmp")  # where a Ray started here would live
    cases = [
        (["-n", "0", EXAMPLE], "-n/--nproc must be a number of workers >= 1"),
        (["-n", "2", str(tmp_path / "missing.py")], "missing.py' does not exist"),
        (["-n", "3", EXAMPLE], "CPU"),  # 3 one-CPU workers on the embedded 2-CPU Ray
        (["-n", "3:4", EXAMPLE], "3 workers x {CPU: 1} need {CPU: 3}"),  # an elastic run's MIN does not fit
        (["-n", "2:2", "--cpus", "2", EXAMPLE], "2 workers x {CPU: 2} need {CPU: 4}"),
        (["--bogus", EXAMPLE], "no such option '--bogus'"),
    ]
    procs = [_cli(*args, env={"RAY_TMPDIR": ray_tmp}) for args, _ in cases]
    for proc, (args, expected) in zip(procs, cases, strict=True):
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 2, (args, err)
        assert expected in " ".join(err.split()), (args, err)
    started = os.listdir(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not started, f"a usage error started Ray: {started}"


def test_cli_on_a_cluster_address_ctrl_c_stops_every_worker(ray_cluster, tmp_path):
    """The command joins a running cluster (the session's) by --address; Ctrl-C ends it."""
    address = ray_cluster.get_runtime_context().gcs_address
    with open(tmp_path / "stderr", "w+") as stderr:  # a file: a full stderr pipe nobody reads would block the command
        proc = _cli(
            "-n", "2", "--address", address, "--storage-path", str(tmp_path), "-m", "tests.support.run_scripts", "sleep",
            str(tmp_path), stderr=stderr,
        )

        def both_ready(lines: list[str]) -> bool:
            return len({line.split("]")[0] for line in lines if line.strip().endswith("ready")}) == 2

        try:
            read_until(proc, both_ready, TIMEOUT, "both ranks to say ready")
        except AssertionError as exc:
            stderr.seek(0)
            raise AssertionError(f"{exc}\nstderr:\n{stderr.read()[-3000:]}") from None
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=TIMEOUT)
        stderr.seek(0)
        err = stderr.read()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert_no_strays(str(tmp_path))


def test_an_elastic_run_starts_with_as_many_workers_as_fit(ray_cluster, tmp_path, capsys):
    """-n 1:4 on the session's 2 CPUs: two one-CPU workers."""
    assert launch("tests.support.run_scripts", ["world"], module=True, num_workers=(1, 4), storage_path=str(tmp_path)) == 0
    printed = sorted(line for line in capsys.readouterr().out.splitlines() if "world size" in line)
    assert printed == [f"[rank {r}] world size 2 (WORLD_SIZE=2)" for r in (0, 1)]
    assert_no_strays(str(tmp_path))


def test_an_elastic_run_shrinks_when_a_worker_is_lost_and_grows_back(ray_cluster, tmp_path, capsys):
    """-n 1:2: rank 1's worker process is killed; the scripts restart at one worker from the
    last checkpoint (a loss, not a failure: --max-failures is 0), and, the CPU being free
    again, at two."""
    code = launch(
        "tests.support.run_scripts", ["elastic", str(tmp_path)], module=True, num_workers=(1, 2),
        storage_path=str(tmp_path), name="el",
    )
    assert code == 0
    captured = capsys.readouterr()
    starts = [line for line in captured.out.splitlines() if line.startswith("[rank 0] world ")]
    assert [line for line in captured.err.splitlines() if "restarted with" in line] == [
        "raylight run: the scripts restarted with WORLD_SIZE=1 (was 2)",
        "raylight run: the scripts restarted with WORLD_SIZE=2 (was 1)",
    ]
    assert starts[0] == "[rank 0] world 2 restart 0 starts at step 0"
    # rank 0 may have committed step 3 before its peer's loss reached it
    assert starts[1] in ("[rank 0] world 1 restart 1 starts at step 3", "[rank 0] world 1 restart 1 starts at step 4")
    resumed = int(starts[1].rsplit(" ", 1)[1])
    assert starts[2:] == [f"[rank 0] world 2 restart 1 starts at step {resumed + 1}"]  # a grow is no failure restart
    rows = [json.loads(line) for line in (tmp_path / "el" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))  # a restart repeats no row
    assert [r["world"] for r in rows] == [2] * resumed + [1] + [2] * (5 - resumed)
    assert rows[-1]["weight_sum"] == 12.0
    assert_no_strays(str(tmp_path))


@pytest.mark.slow
def test_an_elastic_run_follows_nodes_that_join_and_go(tmp_path):
    """-n 1:2 on a fake cluster (its own Ray, in a child driver): one worker on the 1-CPU
    head; a node joins and the scripts restart at two; the node is lost and they restart
    at one from the last checkpoint; another joins and they restart at two and finish."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.run_cluster_driver", str(tmp_path)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert data["code"] == 0, data
    assert data["worlds"] == ["1", "2", "1", "2"], data["starts"]
    rows = [json.loads(line) for line in (tmp_path / "nodes" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))  # each restart resumed from the last checkpoint
    assert [r["world"] for r in rows] == [1, 2, 1, 2, 2, 2]
    assert rows[-1]["weight_sum"] == 12.0
    assert_no_strays(str(tmp_path))


@pytest.mark.slow
def test_a_drain_notice_turns_into_the_script_s_checkpoint_before_the_node_goes(tmp_path):
    """-n 2 on a fake cluster (its own Ray, in a child driver): one worker's node is drained
    with an 8 s deadline and taken away at it. The scripts hear the notice through
    run_context().should_stop(), stop at the same step and report a checkpoint there; it is
    committed after the drain and before the node goes, the group starts again on the
    nodes that stay from that checkpoint, and no step is trained twice (before: the run
    trained on until the node went, then restarted from step 0's checkpoint)."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.run_drain_driver", str(tmp_path), "8", "100"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert data["code"] == 0, data["output"]
    drained, removed = data["drained_at"], data["removed_at"]
    snapshots = [c for c in data["checkpoints"] if drained < c["committed"]]
    assert snapshots, f"no checkpoint committed after the drain: {data['checkpoints']}"
    snapshot = snapshots[0]
    assert snapshot["committed"] < removed, "the notice's checkpoint is committed before the node goes"
    first = [s for s, _, start, _ in data["steps"] if start == 0]
    assert first[-1] == snapshot["step"], "the checkpoint holds the step the scripts stopped at"
    assert max(t for _, _, start, t in data["steps"] if start == 0) < removed, "training stopped before the node went"
    steps = [s for s, _, _, _ in data["steps"]]
    assert steps == list(range(100)), "no step trained twice, none skipped"
    again = [(s, w) for s, w, start, _ in data["steps"] if start == 1]
    assert again[0] == (snapshot["step"] + 1, 2), "started again at 2 from the checkpoint"
    assert {start for _, _, start, _ in data["steps"]} == {0, 1}, "one restart"
    rows = [json.loads(line) for line in (tmp_path / "drain" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(100)), "the snapshot adds no row"
    assert rows[-1]["weight_sum"] == 200.0
    assert_no_strays(str(tmp_path))
