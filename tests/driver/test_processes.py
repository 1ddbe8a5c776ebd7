"""Whole driver processes: killed and resumed; the examples as users run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import REPO, _ray_processes
from tests.helpers import ctrl_c_reaches_child, pid_alive, process_tree, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]
# @pytest.mark.beside: a test with no timer or deadline, run beside the rest (tests/conftest.py BESIDE)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    return env


def session_env(ray) -> dict[str, str]:
    """A child driver's environment that joins the session's cluster (token auth on)."""
    return {**_env(), "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "RAY_AUTH_MODE": "token"}


@pytest.mark.slow
def test_resume_after_the_driver_is_killed(tmp_path, ray_cluster):
    storage, log = str(tmp_path / "runs"), str(tmp_path / "starts.log")
    temp_dir = tempfile.mkdtemp(prefix="rl-drv-", dir="/tmp")
    marker = tmp_path / "runs" / "resumable" / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.support.resume_driver", storage, temp_dir]
    first = subprocess.Popen([*cmd, "0", log], cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(marker.exists, 120, "checkpoint 2", first)
        # A second driver resuming the run while the first writes it is refused, with the
        # holder named; the first is undisturbed. (The rival starts no Ray of its own: fit
        # refuses it before it would connect.)
        rival = subprocess.run([*cmd, "1", log, "rival"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
        assert rival.returncode != 0 and "RunInUseError" in rival.stderr, rival.stdout + rival.stderr
        assert f"pid {first.pid} on" in rival.stderr and first.poll() is None
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    # The embedded cluster shares the driver's fate: nothing of it stays behind.
    wait_until(lambda: not _ray_processes(temp_dir), 60, "the killed driver's Ray processes to exit")
    second = subprocess.run([*cmd, "1", log], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "EPOCHS [0, 1, 2, 3, 4]" in second.stdout
    with open(log) as f:
        assert f.read().split() == ["start", "0", "start", "3"]
    wait_until(lambda: not _ray_processes(temp_dir), 60, "the second driver's Ray processes to exit")
    shutil.rmtree(temp_dir)  # kept where the test failed, with the drivers' Ray logs


@pytest.mark.beside
@pytest.mark.parametrize("mode", ["adaptive", pytest.param("fixed", marks=pytest.mark.extended)])  # fixed: 2 min more, the adaptive run is the demo's
def test_digits_example_runs(tmp_path, ray_cluster, mode):
    """adaptive: DDP with the adaptive engine; fixed: FSDP (sharded checkpoints). The
    example's driver joins the session's cluster (RAY_ADDRESS, as a Ray Job's driver
    does), idle while it runs: the embedded start is what the other tests here check."""
    args = ["--epochs", "4", "--quiet", "--storage", str(tmp_path)]
    args += ["--fixed", "--strategy", "fsdp"] if mode == "fixed" else []
    out = subprocess.run(
        [sys.executable, "examples/digits.py", *args],
        cwd=REPO, env=session_env(ray_cluster), capture_output=True, text=True, timeout=200,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "test accuracy" in ln)
    accuracy = float(line.rsplit("test accuracy", 1)[1].strip().rstrip("%"))
    assert accuracy > 85.0, line
    if mode == "fixed":
        assert "fixed batch 32 -> 32" in line
    else:
        assert re.search(r"adaptive batch \d+ -> \d+", line), line
    run = tmp_path / "digits"
    assert (run / "metrics.jsonl").exists() and (run / "config.json").exists()
    if mode == "adaptive":
        from raylight.driver.plots import why_no_plot

        rows = [json.loads(line) for line in (run / "adaptive.jsonl").read_text().splitlines() if line.strip()]
        # a plot only from two decisions on (4 short epochs may make fewer)
        assert (run / "adaptive.png").exists() == (why_no_plot(rows) is None), rows
    else:
        assert "2 fsdp workers" in line
        metas = [json.loads(m.read_text()) for m in (run / "checkpoints").glob("*/meta.json")]
        assert metas and all(m["format"] == "sharded" for m in metas)


def test_ctrl_c_on_the_driver_leaves_no_processes(tmp_path, ray_cluster):
    temp_dir = tempfile.mkdtemp(prefix="rl-int-", dir="/tmp")
    marker = tmp_path / "runs" / "resumable" / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.support.resume_driver", str(tmp_path / "runs"), temp_dir, "0", str(tmp_path / "log")]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ctrl_c_reaches_child,
    )
    try:
        wait_until(marker.exists, 120, "checkpoint 2", proc)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in out
    wait_until(lambda: not _ray_processes(temp_dir), 60, "the interrupted driver's Ray processes to exit")
    shutil.rmtree(temp_dir)  # kept where the test failed, with the driver's Ray logs


def test_a_sigterm_stops_the_driver_in_order_and_it_exits_143(tmp_path):
    """What a node being preempted does to its driver: the run stops as Ctrl-C stops it
    (workers stopped, the committed checkpoint kept, the status written) and the driver
    exits 143, as a shell reports SIGTERM, not Ray's sys.exit(15)."""
    temp_dir = tempfile.mkdtemp(prefix="rl-term-", dir="/tmp")
    run = tmp_path / "runs" / "resumable"
    marker = run / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.support.resume_driver", str(tmp_path / "runs"), temp_dir, "0", str(tmp_path / "log")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(marker.exists, 120, "checkpoint 2", proc)
        tree = [p for p in process_tree(proc.pid) if p != proc.pid]  # embedded Ray and the workers
        assert len(tree) >= 4, tree
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 143, out[-3000:]
    assert "got SIGTERM: stopping the run" in out and "Traceback" not in out, out[-3000:]
    status = json.loads((run / "status.json").read_text())
    assert marker.exists() and status["checkpoint"] is not None, status  # the committed checkpoints are kept
    assert status["state"] == "failed" and "SIGTERM" in status["error"], status
    wait_until(lambda: not [p for p in tree if pid_alive(p)], 30, f"the driver's processes {tree} to exit")
    assert os.listdir(temp_dir) == []  # the embedded cluster's session directory went with it
    shutil.rmtree(temp_dir)  # kept where the test failed, with the driver's Ray logs


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps it here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_driver_s_embedded_cluster_dies_with_it_and_leaves_no_session_dir(tmp_path):
    """Every process of the embedded cluster, recorded by PID before the kill (GCS,
    raylet, Ray's dashboard and runtime-env agents, the workers), is gone within 15 s of
    the driver's SIGKILL (Ray's agents outlived it by 20-63 s), and so is its session
    directory."""
    temp_dir = tempfile.mkdtemp(prefix="rl-kill-", dir="/tmp")
    marker = tmp_path / "runs" / "resumable" / "checkpoints" / "checkpoint_000002" / "meta.json"
    cmd = [sys.executable, "-m", "tests.support.resume_driver", str(tmp_path / "runs"), temp_dir, "0", str(tmp_path / "log")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(marker.exists, 120, "checkpoint 2", proc)
        tree = {p: _title(p) for p in process_tree(proc.pid) if p != proc.pid}
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(tree.values()), tree
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    try:
        wait_until(lambda: not [p for p in tree if _running(p)], 15, "the killed driver's Ray processes to exit")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: left {[tree[p] for p in tree if _running(p)]}") from None
    wait_until(lambda: os.listdir(temp_dir) == [], 15, f"its session directory to go (left: {os.listdir(temp_dir)})")
    shutil.rmtree(temp_dir)  # kept where the test failed, with the driver's Ray logs


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read().split("\0")[0]
    except OSError:
        return "?"


def segments(steps):
    """Runs of consecutive steps at one world size: [(world_size, {(epoch, cursor), ...})]."""
    out: list = []
    for epoch, cursor, world in steps:
        if not out or out[-1][0] != world:
            out.append((world, set()))
        out[-1][1].add((epoch, cursor))
    return out


@pytest.mark.slow
@pytest.mark.extended  # 3.5 min; the in-place shrink and regrowth run in make test by test_elastic.py and the hosts death test
@pytest.mark.timeout(450)
def test_a_preempted_node_and_a_lost_one_shrink_in_place_and_regrowth_matches_an_uninterrupted_run(tmp_path):
    """A fake 3-node cluster in its own driver process, checkpoints at epoch ends only.
    Spot preemption the Ray way: a node is drained with a 10 s deadline mid-epoch; the run
    checkpoints where every worker stops and goes on in place on two nodes before the
    deadline, without counting a failure and without running any step twice (without the
    snapshot the epoch's steps so far would run again). Then a node is lost with no notice:
    the run shrinks again, in place, back to its last checkpoint (which the survivor holds in
    memory). Two nodes come back: it grows to 3.
    Every epoch sees every sample once, and the loss follows an uninterrupted run."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.cluster_driver", str(tmp_path)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=420,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    epochs, reference, resizes = data["epochs"], data["reference"], data["resizes"]
    assert data["num_failures"] == 0 and data["num_preemptions"] == 1, data
    [notice] = data["notice"]
    assert notice["source"] == "drain" and notice["deadline"] == pytest.approx(data["noticed_at"] + 10, abs=1.0)
    assert data["shrunk_at"] < notice["deadline"], "the shrink came before the deadline"
    moves = [(r["from"], r["to"], r["kind"]) for r in resizes]
    why = [r.get("fallback") for r in resizes]
    assert moves[:2] == [(3, 2, "in_place"), (2, 1, "in_place")] and moves[-1][1] == 3, (moves, why, out.stderr[-4000:])
    assert "preemption notice" in resizes[0]["reason"] and "lost" in resizes[1]["reason"]
    runs = segments(data["steps"])
    at_three = next(i for i, (world, _) in enumerate(runs) if world == 3)
    (_, before), (world, after) = runs[at_three], runs[at_three + 1]
    assert world == 2 and not before & after, "the snapshot at the notice: no step ran twice"
    n = 240
    for m in epochs:
        assert (m["count"], m["sum"], m["sq"]) == (n, n * (n - 1) / 2, sum(i * i for i in range(n))), m
    assert {m["workers"] for m in epochs} >= {2, 3}
    assert len(reference) == len(epochs)
    for got, want in zip(epochs, reference, strict=True):
        assert got["sse"] == pytest.approx(want["sse"], rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_drain_notice_due_before_the_next_control_step_is_checkpointed_before_the_node_goes(tmp_path):
    """Long steps (0.4 s) on a fake 3-node cluster, checkpoints at epoch ends only. Just
    after a control step a node is drained, and it is taken away 8 steps later, as a cloud
    takes a node at its deadline; the workers' next control step is 16 steps away. The
    notice still becomes a just-in-time checkpoint, committed before the node goes, at the
    step boundary after the step in flight; the run shrinks in place and no step (so no
    sample) is trained twice, and no failure is counted. (Stops agreed at control steps
    only: the node went first, and the steps since the epoch's checkpoint ran again.)"""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.deadline_driver", str(tmp_path)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=400,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    assert data["drained_after"] <= 20, "drained soon after a control step"
    steps = [tuple(s[:2]) for s in data["steps"]]
    assert len(steps) == len(set(steps)), "no step ran twice"
    [notice] = data["notice"]
    assert notice["source"] == "drain"
    assert len(data["snapshot"]) == 1, (data["snapshot"], out.stderr[-4000:])
    assert data["snapshot"][0]["time"] < data["removed_at"], "the checkpoint was committed before the node went"
    assert data["num_failures"] == 0 and data["num_preemptions"] == 1, data["resizes"]
    moves = [(r["from"], r["to"], r["kind"]) for r in data["resizes"]]
    assert moves[0] == (3, 2, "in_place"), (moves, [r.get("fallback") for r in data["resizes"]])
    n = 240
    for m in data["epochs"]:
        assert (m["count"], m["sum"], m["sq"]) == (n, n * (n - 1) / 2, sum(i * i for i in range(n))), m


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_autoscaled_run_grows_as_nodes_join_and_the_nodes_go_after_it_ends(tmp_path):
    """Ray's real autoscaler (the fake multi-node provider starts real raylets): the run
    starts on the head alone, asks for the workers its policy wants, grows as the nodes
    join, and gives the request back when it ends; the idle nodes are then removed. Same
    global batch and data order: the loss follows an uninterrupted one-process run."""
    env = {**_env(), "RAY_AUTH_MODE": "token"}
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.autoscale_driver", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=280,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    data = json.loads(line[len("RESULT "):])
    nodes = [count for _, count in data["timeline"]]
    moves = [(r["from"], r["to"], r["kind"]) for r in data["resizes"]]
    # The head has 1 CPU: one worker is the head alone (a node may join before the first
    # report lands, so the node count at that report says less).
    assert nodes[0] == 1 and moves and moves[0][0] == 1, ("the run started on the head alone", nodes, moves)
    assert max(nodes) == 3 and nodes.index(3) > 0, nodes
    assert nodes[-1] == 1 and data["released"] > data["ended"], "the autoscaler removed the nodes after the end"
    assert moves and moves[-1][1] == 3 and all(kind == "in_place" for *_, kind in moves), moves
    epochs, reference = data["epochs"], data["reference"]
    n = 2400
    for m in epochs:
        assert (m["count"], m["sum"]) == (n, n * (n - 1) / 2), m
    assert {m["workers"] for m in epochs} >= {1, 3}
    assert len(reference) == len(epochs)
    for got, want in zip(epochs, reference, strict=True):
        assert got["sse"] == pytest.approx(want["sse"], rel=1e-6)
    cost = data["cost"]
    assert set(cost["node_seconds"]) == {"head", "cpu_node"} and cost["cost_usd"] > 0, cost


