"""`raylight submit` and `raylight jobs` against a real private Ray head (Ray Jobs).

The head is this module's own `ray start --head --block` on 127.0.0.1 with token
authentication on (Ray's default), its own temp dir and ports; it is stopped by SIGTERM
to that process, then SIGKILL of what is left of its processes, by PID. The CLI runs
as a subprocess with RAY_AUTH_MODE=token, reading the token Ray wrote as Ray does.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest

from tests.helpers import ctrl_c_reaches_child, listening_sockets, process_tree, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_CODE = os.path.join(REPO, "tests", "support", "job_code")
VENV_BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    while True:  # outside 10002-19999, where Ray's workers take their ports
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not 10002 <= port <= 19999:
            return port


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
    env.update(PATH=f"{VENV_BIN}:{env.get('PATH', '')}", PYTHONPATH=f"{REPO}/src:{REPO}", **extra)
    return env


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True  # 401 without a token: the Jobs API is up
    except OSError:
        return False
    return True


def _temp_dir_processes(temp_dir: str) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=10).stdout
    return [int(line.split(None, 1)[0]) for line in out.splitlines() if temp_dir in line]


def stop_head(proc: subprocess.Popen, temp_dir: str) -> None:
    """End a `ray start --head --block` this test started, by PID only (never `ray stop`):
    SIGTERM (it stops what it started), then SIGKILL whatever of its tree and its temp dir's
    processes is left; the temp dir removed."""
    pids = set(process_tree(proc.pid)) | set(_temp_dir_processes(temp_dir))
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for pid in pids | set(_temp_dir_processes(temp_dir)):
        for p in process_tree(pid):
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait(timeout=10)
    shutil.rmtree(temp_dir, ignore_errors=True)


class Head:
    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="rlj-", dir="/tmp")
        self.gcs_port, self.dash_port, self.client_port = _free_port(), _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.dash_port}"
        args = [
            os.path.join(VENV_BIN, "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(self.gcs_port), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dash_port),
            "--ray-client-server-port", str(self.client_port), "--dashboard-agent-listen-port", str(_free_port()),
            "--dashboard-agent-grpc-port", str(_free_port()), "--temp-dir", self.temp_dir, "--num-cpus", "2",
            "--disable-usage-stats", "--include-dashboard", "true",
        ]
        self.log = open(os.path.join(self.temp_dir, "head.log"), "w")  # noqa: SIM115 - open while the head runs
        # TMPDIR: the head's processes make their temporary files in its temp dir, removed at
        # stop(); Ray's dashboard, killed there, left a /tmp/pymp-* dir behind otherwise.
        self.env = _env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", TMPDIR=self.temp_dir, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        stop_head(self.proc, self.temp_dir)
        self.log.close()


def _started_head() -> Head:
    """A private head whose Jobs API answers. Its ports are free when chosen but may be
    taken before the head binds them (the suite's other Ray processes take ports all the
    time): a head that exits before answering is started once more on new ports, and its
    log is in the error if that one exits too. So is one whose raylet missed the 30 s `ray
    start` gives it to register (ray/_private/node.py; seen at a load of 20-26 on 2 cores):
    its dashboard answers, then the head exits, so the wait is for `ray start`'s own "Ray
    runtime started" too."""
    for attempt in (1, 2):
        h = Head()
        log = pathlib.Path(h.temp_dir, "head.log")
        try:
            wait_until(lambda log=log: "Ray runtime started" in log.read_text(), 180, "the private head's ray start", proc=h.proc)
            wait_until(lambda url=f"{h.url}/api/version": _answers(url), 60, "the private head's Jobs API", proc=h.proc)
            return h
        except AssertionError:
            with open(os.path.join(h.temp_dir, "head.log")) as f:
                log = f.read()[-3000:]
            exited = h.proc.poll() is not None
            h.stop()
            if attempt == 2 or not exited:
                raise AssertionError(f"the private head did not start; its log:\n{log}") from None
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def head():
    h = _started_head()
    try:
        yield h
    finally:
        h.stop()


def cli(head: Head, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`raylight submit ...` or `raylight jobs CMD ...` against ``head``."""
    n = 2 if args[0] == "jobs" else 1
    return subprocess.run(
        [sys.executable, "-m", "raylight.cli", *args[:n], "--address", head.url, *args[n:]],
        env=_env(RAY_AUTH_MODE="token"), capture_output=True, text=True, timeout=timeout,
    )


def test_submit_waits_streams_logs_and_runs_on_the_submitted_cluster(head, tmp_path):
    out = cli(
        head, "submit", "--working-dir", JOB_CODE, "--env", f"STORE={tmp_path}", "--name", "fit1", "--max-workers", "2",
        "--", "python", "train_job.py", "2",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FITTED" in out.stdout and "epochs [0, 1]" in out.stdout  # the logs, streamed
    # The driver used the submitted cluster (RAY_ADDRESS from Ray Jobs), not an embedded one.
    assert "EMBEDDED False" in out.stdout and f"CLUSTER 127.0.0.1:{head.gcs_port}" in out.stdout
    assert "HELPER uploaded-with-the-working-dir" in out.stdout  # --working-dir reached the job
    config = json.loads((tmp_path / "fit1" / "config.json").read_text())  # --env STORE and --name did too
    assert config["run"]["name"] == "fit1"
    assert "submitted fit1" in out.stderr and "SUCCEEDED" in out.stderr


def test_the_private_head_listens_on_loopback_only(head):
    sockets = listening_sockets(process_tree(head.proc.pid))
    assert sockets and all(addr in ("127.0.0.1", "::1") for _, addr, _ in sockets), sockets


def test_without_a_token_the_cluster_refuses_and_says_what_to_set(head):
    env = _env()
    env.pop("RAY_AUTH_MODE", None)
    out = subprocess.run(
        [sys.executable, "-m", "raylight.cli", "jobs", "list", "--address", head.url],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "RAY_AUTH_MODE=token" in " ".join(out.stderr.split())


def test_a_failing_command_exits_with_its_code_and_is_not_retried(head):
    out = cli(head, "submit", "--name", "fail1", "--retries", "2", "--", "python -c 'print(\"FAILING\"); raise SystemExit(3)'")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "FAILING" in out.stdout and "retry" not in out.stderr
    status = cli(head, "jobs", "status", "fail1")
    assert "attempts: fail1 (FAILED)\n" in status.stdout and "exit code: 3" in status.stdout


def test_no_wait_then_status_logs_list_and_stop(head):
    command = "python -c 'import time; print(\"STARTED\", flush=True); time.sleep(120)'"
    out = cli(head, "submit", "--no-wait", "--name", "bg1", "--", command)
    assert out.returncode == 0 and "raylight jobs logs bg1 --follow" in out.stderr, out.stderr
    wait_until(lambda: "STARTED" in cli(head, "jobs", "logs", "bg1").stdout, 60, "the job's output")
    assert "status: RUNNING" in cli(head, "jobs", "status", "bg1").stdout
    listed = cli(head, "jobs", "list").stdout
    assert any(line.split()[:4] == ["bg1", "bg1", "0", "RUNNING"] for line in listed.splitlines()), listed
    stopped = cli(head, "jobs", "stop", "bg1")
    assert stopped.returncode == 0 and "stopping bg1" in stopped.stderr
    wait_until(lambda: "status: STOPPED" in cli(head, "jobs", "status", "bg1").stdout, 60, "the job to stop")


def test_a_preempted_job_is_resubmitted_and_resumes_its_run(head, tmp_path):
    out = cli(
        head, "submit", "--working-dir", JOB_CODE, "--env", f"STORE={tmp_path}", "--env", "PREEMPT_AT=2", "--name", "pre1",
        "--retries", "1", "--", "python", "train_job.py", "4",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PREEMPTED" in out.stdout and "the run was preempted (exit code 75)" in out.stderr
    assert "submitted pre1-retry1" in out.stderr
    # The second attempt started from the first one's last checkpoint (epoch 1), and the
    # run's history continues where it stopped.
    assert "LOOP starts at epoch 0" in out.stdout and "LOOP starts at epoch 2" in out.stdout
    assert "epochs [0, 1, 2, 3]" in out.stdout
    status = cli(head, "jobs", "status", "pre1").stdout
    assert "job: pre1-retry1\nstatus: SUCCEEDED" in status
    assert "attempts: pre1 (FAILED), pre1-retry1 (SUCCEEDED)" in status


def test_ctrl_c_stops_waiting_and_leaves_the_job_running(head, tmp_path):
    command = "python -c 'import time; print(\"WAITING\", flush=True); time.sleep(120)'"
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raylight.cli", "submit", "--address", head.url, "--name", "int1", "--", command],
            env=_env(RAY_AUTH_MODE="token"), stdout=out, stderr=subprocess.STDOUT, text=True,
            preexec_fn=ctrl_c_reaches_child,
        )
        try:
            wait_until(lambda: "WAITING" in log.read_text(), 60, "the job's streamed output", proc=proc)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    text = " ".join(log.read_text().split())
    assert "the job keeps running" in text and f"raylight jobs stop int1 --address {head.url}" in text
    assert "status: RUNNING" in cli(head, "jobs", "status", "int1").stdout
    assert "stopping int1" in cli(head, "jobs", "stop", "int1").stderr


@pytest.mark.timeout(480)  # the module's head starts first (65 s, and the job 184 s, at a load of 20-40 on 2 cores)
def test_an_adaptdl_script_submitted_with_f_runs_on_two_replicas_and_adapts_its_batch(head, tmp_path):
    """`submit -f FILE -n 2` runs FILE as `raylight run -n 2` does: AdaptDL's MNIST tutorial
    (tests/adaptdl/tutorial.py), unchanged, gets `import adaptdl` from raylight's layer
    (RAYLIGHT_ADAPTDL=1: the dev extra installs real AdaptDL) on two replicas and grows its
    batch. (A replica killed mid-epoch under `raylight run`: tests/adaptdl/test_adaptdl_run.py;
    `--max-failures` reaching `raylight run`: tests/jobs/test_jobs.py.)"""
    from tests.adaptdl.tutorial import TUTORIAL

    code, out = tmp_path / "code", tmp_path / "two.json"
    code.mkdir()
    (code / "mnist_step5.py").write_text(TUTORIAL)
    name = f"adlf-{os.getpid()}"
    try:
        done = cli(
            head, "submit", "-f", str(code / "mnist_step5.py"), "-n", "2", "--name", name,
            "--env", "RAYLIGHT_ADAPTDL=1", "--env", "OMP_NUM_THREADS=1", "--", "--epochs", "2", "--out", str(out), timeout=330,
        )
    finally:  # raylight run's default storage path, ~/raylight_results: this run's directory only
        shutil.rmtree(os.path.join(os.path.expanduser("~"), "raylight_results", name), ignore_errors=True)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    assert "[rank 0] replica 0 of 2 restart 0 starts at epoch 0" in done.stdout, printed[-4000:]
    assert "[rank 1] replica 1 of 2 restart 0 starts at epoch 0" in done.stdout, printed[-4000:]
    two = json.loads(out.read_text())
    assert max(two["sizes"]) > 32 and two["gain"] > 1.0, two  # the engine grew the batch; AdaScale's gain followed
    assert two["accuracy"] > 0.5, two  # it learns (chance: 0.1; 0.72 after these 2 epochs at batch 512)


def test_a_driver_ended_by_sigterm_is_resubmitted(head):
    out = cli(head, "submit", "--working-dir", JOB_CODE, "--name", "sig1", "--retries", "1", "--", "python", "sigterm_job.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TERMINATING" in out.stdout and "SECOND ATTEMPT" in out.stdout
    assert "terminated (SIGTERM;" in out.stderr and "submitted sig1-retry1" in out.stderr


def test_a_raylight_driver_sigtermed_as_a_job_exits_143_and_is_resubmitted(head, tmp_path):
    """A Ray Job's driver that trains with raylight, ended by SIGTERM mid-run (as its
    node's shutdown ends it): its driver exit code is 143, so `submit --retries` sees a
    preemption and the next attempt resumes from the last checkpoint."""
    name = "sigfit1"
    log = tmp_path / "submit.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raylight.cli", "submit", "--address", head.url, "--working-dir", JOB_CODE, "--env", f"STORE={tmp_path}",
             "--env", "BLOCK_AFTER=1", "--name", name, "--retries", "1", "--", "python", "train_job.py", "3"],
            env=_env(RAY_AUTH_MODE="token"), stdout=out, stderr=subprocess.STDOUT, text=True,
        )
        try:
            committed = tmp_path / name / "checkpoints" / "checkpoint_000001" / "meta.json"
            wait_until(lambda: committed.exists() and (tmp_path / "driver.pid").exists(), 150, "checkpoint 1", proc=proc)
            os.kill(int((tmp_path / "driver.pid").read_text()), signal.SIGTERM)
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert f"{name}: FAILED, exit code 143" in text and "terminated (SIGTERM; exit code 143)" in text, text[-4000:]
    assert f"submitted {name}-retry1" in text and "LOOP starts at epoch 2" in text and "epochs [0, 1, 2]" in text, text[-4000:]


RAY_CLIENT_DRIVER = """
import sys, torch, ray, raylight
from raylight.worker_group.placement import _draining, _request_resources, on_cluster

def loop(ctx, config):
    model = ctx.prepare_model(torch.nn.Linear(4, 1))
    acc = ctx.accumulator()
    acc["rows"] += torch.tensor(8.0)
    with acc.synchronized():
        rows = acc["rows"]
    ctx.report({"rows": rows, "world": ctx.world_size}, checkpoint={"model": model})

ray.init(sys.argv[1])
# Ray's state and autoscaler APIs need a GCS connection, which a Ray Client driver has not
print("draining", on_cluster(_draining, timeout_s=60))
on_cluster(_request_resources, [{"CPU": 1}], timeout_s=60)
on_cluster(_request_resources, [], timeout_s=60)  # withdrawn
result = raylight.fit(loop, num_workers=2, storage_path=sys.argv[2], name="client", progress=False)
print("metrics", result.metrics["rows"], result.metrics["world"], result.checkpoint is not None)
"""


def _proxier_args(head: Head) -> list[str]:
    """The arguments `ray start` gave the head's Ray client proxier (its GCS address, its
    node's runtime-env agent and node id), after ``-m ray.util.client.server``."""
    for pid in process_tree(head.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if "--mode=proxy" in argv and "ray.util.client.server" in argv:
            return argv[argv.index("ray.util.client.server") + 1 :]
    raise AssertionError("the private head runs no Ray client proxier")


@pytest.fixture
def client_port(head, tmp_path):
    """A Ray client proxier for the head on a port this test picked, starting each client's
    server on ports this test picked too, not on Ray's fixed 23000 up, where a proxier of
    another head on the machine (another test's, another checkout's suite) may start one at
    the same moment (tests/support/ray_client_proxy.py)."""
    port = _free_port()
    args = [a for a in _proxier_args(head) if not a.startswith("--port=")] + [f"--port={port}"]
    specific = ",".join(str(_free_port()) for _ in range(3))
    log = open(tmp_path / "proxier.log", "w")  # noqa: SIM115 - open while the proxier runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.ray_client_proxy", specific, *args],
        # the head's proxier's environment (as `ray start` gives it); and no gRPC fork
        # handlers: the proxier forks each client's server while its gRPC threads run, and
        # that child died at once with SIGSEGV (exit -11) in about 1 of 3 runs here
        env={**head.env, "RAY_AUTH_MODE": "token", "GRPC_ENABLE_FORK_SUPPORT": "false"},
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: any(p == port for _, _, p in listening_sockets(process_tree(proc.pid))), 60,
                   "the test's Ray client proxier", proc=proc)
        yield port
    finally:
        pids = process_tree(proc.pid)  # with the client servers it started
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(timeout=10)
        log.close()


def _client_server_logs(head: Head) -> str:
    """The tails of the Ray client servers' logs in the head's session (the proxier's and
    each client's server's), for a failure's message."""
    parts = []
    for path in sorted(pathlib.Path(head.temp_dir).glob("session_*/logs/ray_client_server*")):
        parts.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-1500:]}")
    return "\n".join(parts)


def test_a_ray_client_driver_trains_sees_drain_notices_and_asks_the_autoscaler(head, client_port, tmp_path):
    """Through ray:// (no GCS connection in the driver): a fit on the cluster, and the drain
    check and autoscaler request, which Ray's APIs refuse there, run in a task on it."""
    out = subprocess.run(
        [sys.executable, "-c", RAY_CLIENT_DRIVER, f"ray://127.0.0.1:{client_port}", str(tmp_path)],
        env=_env(RAY_AUTH_MODE="token"), capture_output=True, text=True, timeout=240,
    )
    assert out.returncode == 0, (
        out.stdout[-2000:] + out.stderr[-3000:] + (tmp_path / "proxier.log").read_text()[-2000:] + _client_server_logs(head)
    )
    lines = out.stdout.splitlines()
    assert "draining {}" in lines and "metrics 16.0 2 True" in lines, out.stdout


def test_a_job_names_its_drivers_runs_not_its_actors(ray_cluster):
    """driver/job_env._in_ray_actor: False in a driver, True in a Ray actor (where a Tune
    trial's run keeps the name raylight gives it)."""
    from raylight.driver import job_env

    @ray_cluster.remote(num_cpus=0)
    class Probe:
        def in_actor(self) -> bool:
            from raylight.driver import job_env

            return job_env._in_ray_actor()

    probe = Probe.remote()
    try:
        assert ray_cluster.get(probe.in_actor.remote(), timeout=60)
    finally:
        ray_cluster.kill(probe)
    assert not job_env._in_ray_actor()
