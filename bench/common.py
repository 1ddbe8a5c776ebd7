"""Helpers shared by the benchmarks: a child process per run (launch, time, clean up),
the local Ray a child starts, and the machine a run measured on. Measurement itself (what
a job times and how a bench summarises it) stays with each bench.

Every benchmark run is a cold child process in a run directory of its own under /tmp:

    run = ChildRun(base_job, prefix="rlb-")   # the directory, and the job's paths in it
    run.launch(command(run.job), timeout_s)   # its own session; killed at the timeout
    record["leftover_pids"] = run.reap()      # whatever it left running, killed by PID
    ... the bench reads run.job["result_path"] into its record ...
    return run.finish(record)                 # ok, or the error with stderr's tail

``run_once`` is that sequence for the children whose rank 0 writes a step-clock summary
(bench/overhead.py's StepClock: bench/overhead.py and bench/lightning.py).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent  # the repository: where a bench's children run

# -- a child's own local Ray ----------------------------------------------------------


def init_local_ray(num_cpus: int, temp_dir: str) -> Any:
    """Start a local Ray for one child run, bound to 127.0.0.1, with its own temp dir."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind Ray to 127.0.0.1
    import ray

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        _temp_dir=temp_dir,
    )
    return ray


def run_ray_train(
    loop: Callable[[dict[str, Any]], None], job: dict[str, Any], num_workers: int
) -> None:
    """One child run of Ray Train: ``loop(job)`` on ``num_workers`` workers of 1 CPU
    under ``TorchTrainer``, on a local Ray of its own that is shut down afterwards."""
    ray = init_local_ray(num_workers, job["ray_temp_dir"])
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    try:
        TorchTrainer(
            loop,
            train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=num_workers, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=job["storage_path"], name="bench"),
        ).fit()
    finally:
        ray.shutdown()


# -- child processes: launch, time, clean up ------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(nproc: int, run_dir: str) -> list[str]:
    """``torchrun`` on one node with ``nproc`` local processes and a free loopback port, up
    to the script to run. Its logs go under ``run_dir`` (``--log-dir``): without it, torchrun
    makes a ``torchelastic_*`` directory in /tmp on every run and never removes it."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--log-dir", os.path.join(run_dir, "torchrun"),
    ]


def script_command(script: str | Path, child: str, job: dict[str, Any]) -> list[str]:
    """A bench script run as one of its own children: ``script --child NAME --job JSON``."""
    return [sys.executable, str(script), "--child", child, "--job", json.dumps(job)]


def child_env() -> dict[str, str]:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", RAY_USAGE_STATS_ENABLED="0")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def leftover_processes(session: int, marker: str) -> list[int]:
    """Live PIDs in the child's session, or with its run dir on their command line."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True)
    pids = []
    for line in out.stdout.splitlines():
        fields = line.split(maxsplit=3)
        pid, sid, state = int(fields[0]), int(fields[1]), fields[2]
        args = fields[3] if len(fields) > 3 else ""
        if (sid == session or marker in args) and pid != os.getpid() and state[0] != "Z":
            pids.append(pid)
    return pids


def stop_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (the child was started in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def reap_leftovers(session: int, marker: str) -> list[int]:
    """Kill, by PID, whatever the child left running; returns their PIDs."""
    time.sleep(1.0)  # give processes that are already exiting a moment
    pids = leftover_processes(session, marker)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def run_timed(
    cmd: list[str], *, timeout: int, env: dict[str, str], marker: str, cwd: str | Path = REPO,
) -> tuple[subprocess.CompletedProcess, float, list[int]]:
    """``cmd`` in a session of its own, timed from launch to exit; whatever it left
    running (Ray processes of a cluster it started) is killed by PID afterwards."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        err += f"\n(timed out after {timeout} s)"
    wall = time.time() - start
    left = reap_leftovers(proc.pid, marker)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), wall, left


# -- Ludwig, the declarative peer (bench/declarative.py, bench/ludwig_configs.py) -----------------


def ludwig_python(given: str | None) -> str:
    return given or os.environ.get("RAYLIGHT_BENCH_LUDWIG") or "python3.12"


def ludwig_available(python: str) -> str | None:
    """None when `python` can import ludwig, else why not."""
    if not shutil.which(python) and not os.path.exists(python):
        return (
            f"no interpreter {python!r}; Ludwig 0.17 needs Python 3.12: install it in a venv "
            "(docs/benchmarks.md) and set RAYLIGHT_BENCH_LUDWIG to its python"
        )
    res = subprocess.run([python, "-c", "import ludwig; print(ludwig.__version__)"], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if "Error" in ln or "not found" in ln), lines[-1] if lines else "?")
        return f"{python} cannot import ludwig ({why}); Ludwig 0.17 needs Python 3.12 and a torch build for it"
    return None


def ludwig_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    env["RAY_ADDRESS"] = "local"  # a Ray of its own, never another session's cluster
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


def tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.strip().splitlines()[-lines:])


class ChildRun:
    """One cold child process and its run directory (``mkdtemp`` under /tmp with
    ``prefix``: short, for Ray's socket paths). ``job`` is ``base_job`` with the paths the
    child writes to: run_dir (the directory itself), result_path, ray_temp_dir, storage_path
    (and stop_file, a file the parent may create to ask the child to stop, with
    ``stop_file``)."""

    def __init__(self, base_job: dict[str, Any], *, prefix: str, stop_file: bool = False):
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        self.job = dict(
            base_job,
            run_dir=str(self.dir),
            result_path=str(self.dir / "result.json"),
            ray_temp_dir=str(self.dir / "r"),
            storage_path=str(self.dir / "storage"),
        )
        if stop_file:
            self.job["stop_file"] = str(self.dir / "stop")
        self.stderr = self.dir / "stderr.log"
        self.launched = 0.0  # time.time() just before the launch
        self.process_s = 0.0  # launch -> the child has exited (or was killed)
        self.error: str | None = None  # timed out, or a non-zero exit code
        self.pid = 0

    def launch(self, command: list[str], timeout_s: float, *, in_run_dir: bool = False) -> None:
        """Run ``command`` in a session of its own until it exits or ``timeout_s`` passes
        (then its process group is killed); with ``in_run_dir`` it runs in the run dir."""
        with (self.dir / "stdout.log").open("wb") as out, self.stderr.open("wb") as err:
            self.launched = time.time()
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=err,
                env=child_env(),
                cwd=self.dir if in_run_dir else None,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_group(proc)
                returncode = None
            self.process_s = time.time() - self.launched
        self.pid = proc.pid
        if returncode is None:
            self.error = f"timed out after {timeout_s:.0f}s"
        elif returncode != 0:
            self.error = f"exit code {returncode}"

    def reap(self) -> list[int]:
        """Kill, by PID, what the child left running (its session, or its run dir in
        their command line); returns their PIDs."""
        return reap_leftovers(self.pid, str(self.dir))

    def finish(self, record: dict[str, Any]) -> dict[str, Any]:
        """A record with an "error" keeps the run dir for a look and gets stderr's tail;
        any other is ok, and the run dir goes."""
        if "error" in record:
            record["stderr_tail"] = tail(self.stderr)
            record["run_dir"] = str(self.dir)
        else:
            record["ok"] = True
            shutil.rmtree(self.dir, ignore_errors=True)
        return record


def run_once(
    system: str,
    base_job: dict[str, Any],
    timeout_s: float,
    *,
    command: Callable[[str, dict[str, Any]], list[str]],
    in_run_dir: bool = False,
) -> dict[str, Any]:
    """Launch one cold run of ``system`` and measure it from the launch timestamp.
    ``command`` builds the child's command line; with ``in_run_dir`` the child runs in
    its own temporary directory. Rank 0 writes a step-clock summary to result_path."""
    run = ChildRun(base_job, prefix="rlb-")
    record: dict[str, Any] = {"system": system, "ok": False}
    run.launch(command(system, run.job), timeout_s, in_run_dir=in_run_dir)
    record["process_s"] = run.process_s
    record["leftover_pids"] = run.reap()
    if run.error is not None:
        record["error"] = run.error
    else:
        record.update(read_result(run.job["result_path"], run.launched))
    return run.finish(record)


def read_result(path: str, launched: float) -> dict[str, Any]:
    """Rank 0's step-clock summary (overhead.StepClock.summary), times from the launch."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"error": "rank 0 wrote no result"}
    if raw["first_step_end"] is None:
        return {"error": "no training step was taken", **raw}
    return {
        "start_to_first_step_s": raw["first_step_end"] - launched,
        "wall_s": raw["last_step_end"] - launched,
        "steady_samples_per_s": raw["steady_samples_per_s"],
        "window_change": raw.get("window_change"),
        "steps": raw["steps"],
        "torch_threads": raw["torch_threads"],
        # raylight's own figures (bench/overhead.py): its start-up phases' ends, from the launch
        **({"phases": {k: v - launched for k, v in raw["phases"].items()}} if raw.get("phases") else {}),
        **({"warm_fit_start_s": raw["warm_fit_start_s"]} if raw.get("warm_fit_start_s") is not None else {}),
        **({"sharded_fit_start_s": raw["sharded_fit_start_s"]} if raw.get("sharded_fit_start_s") else {}),
    }


# -- a bench's entry point --------------------------------------------------------------


def run_child(args: Any, children: dict[str, Callable[[dict[str, Any]], None]]) -> bool:
    """In a child process (``--child NAME --job JSON``): run that child and return True."""
    if not args.child:
        return False
    children[args.child](json.loads(args.job))
    return True


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")


# -- the machine ----------------------------------------------------------------------


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "ray": package_version("ray"),
        "raylight": package_version("raylight"),
    }


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, None where either is missing or den is 0."""
    return num / den if num is not None and den else None


def median_of(records: list[dict[str, Any]], metric: str) -> float | None:
    """The median of ``metric`` over the records that ran (``ok``) and have it."""
    values = [r[metric] for r in records if r["ok"] and r.get(metric) is not None]
    return statistics.median(values) if values else None
