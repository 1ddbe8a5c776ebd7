"""Helpers shared by tests and the driver scripts they run."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any


def use_venv_torch_extensions() -> str:
    """Point torch's C++ extension cache at this venv (unless set) and return it.

    DeepSpeed's CPU Adam (ZeRO-Offload) is compiled by torch on first use, about a minute
    of both cores. torch rebuilds it whenever the build flags change, and they hold the
    venv's paths: with one cache for every venv, each checkout's run rebuilt what another's
    had replaced. One cache per venv keeps each build."""
    return os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


def one_torch_thread() -> None:
    """One intra-op thread for torch in this process and in the processes it starts.

    The suite runs two pytest processes and their Ray workers on 2 cores. A process that
    trains with torch's default of one OpenMP thread per core then waits at every parallel
    region for a thread the kernel has given to another process, and GNU OpenMP's waiting
    thread spins: measured here with one busy process beside it, 20 epochs of
    ``test_each_encoder_learns_word_order...[cnnrnn]`` took 84.7 CPU-s and 84.9 s with two
    threads, 3.9 and 3.9 with one. raylight's workers set their own threads (ScalingConfig);
    this covers what trains in the pytest process and the CLIs and scripts tests start."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


# The test running now (conftest.py sets it), for require_distributed_mark.
_RUNNING: list[Any] = [None]


def set_running_test(item: Any) -> None:
    _RUNNING[0] = item


def require_distributed_mark(what: str) -> None:
    """A test outside the Ray tier that starts real torch.distributed processes without
    Ray (gloo ranks, torchrun's, mpirun's) is the distributed tier and carries its marker
    (its module's ``pytestmark`` or ``@pytest.mark.distributed``); unmarked, it fails here,
    saying so. Outside a test run (bench/) nothing is checked."""
    item = _RUNNING[0]
    if item is None or item.get_closest_marker("ray") is not None:
        return
    if item.get_closest_marker("distributed") is None:
        raise AssertionError(
            f"{item.nodeid} starts {what} without Ray, the distributed tier: mark it, "
            "pytestmark = [pytest.mark.distributed, ...] in its module or @pytest.mark.distributed on the test"
        )


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(program: str | None = None) -> list[str]:
    """torchrun with 2 processes on this node, meeting on a free loopback port, up to what it
    runs: ``program`` (the ``torchrun`` console script) or ``python -m torch.distributed.run``.
    Run it with ``own_temp_dir``."""
    require_distributed_mark("torchrun's processes")
    front = [program] if program else [sys.executable, "-m", "torch.distributed.run"]
    return [*front, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_loopback_port())]


@contextlib.contextmanager
def own_temp_dir(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """``env`` with TMPDIR set to a temporary directory removed afterwards, for a launcher
    that leaves files behind there: torchrun makes a ``torchelastic_*`` log directory on every
    run and never removes it."""
    with tempfile.TemporaryDirectory(prefix="rl-tmp-") as tmp:
        yield {**env, "TMPDIR": tmp}


def pid_alive(pid: int) -> bool:
    """Whether a process with this PID exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(cond: Callable[[], Any], timeout_s: float, what: str, proc: Any = None) -> None:
    """Wait for a condition a test can observe (a file, a trace row), with a deadline.
    ``proc``: a subprocess whose early exit fails the wait at once."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}:\n{output}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def ctrl_c_reaches_child() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: SIGINT back to its default, so the
    child's Python turns it into KeyboardInterrupt. A shell starts a background job
    (``make test &``) with SIGINT ignored, its children inherit that, and Python then
    leaves SIGINT ignored: the Ctrl-C would never arrive (`GNU timeout` resets it, which
    is why such a test passed under `timeout` and failed in a backgrounded run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def read_until(proc: Any, done: Callable[[list[str]], bool], timeout_s: float, what: str) -> list[str]:
    """Read ``proc``'s stdout line by line until ``done(lines so far)`` holds, within
    ``timeout_s`` (then the process is killed and the wait fails, naming ``what`` and the
    lines read). The reading stops there, so ``proc.communicate()`` can take the rest."""
    import threading

    lines: list[str] = []
    finished = threading.Event()

    def reader() -> None:
        try:
            for line in proc.stdout:
                lines.append(line)
                if done(lines):
                    return
        finally:
            finished.set()

    thread = threading.Thread(target=reader, name="read-until", daemon=True)
    thread.start()
    if not finished.wait(timeout_s):
        proc.kill()
        thread.join(10)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; output so far:\n{''.join(lines)[-3000:]}")
    thread.join()
    if not done(lines):
        raise AssertionError(f"the output ended (exit code {proc.wait(10)}) before {what}:\n{''.join(lines)[-3000:]}")
    return lines


def processes_with(marker: str) -> list[str]:
    """Live processes (``pid args`` lines) whose command line holds ``marker`` (a test's tmp
    dir): what a launched script or run left behind. Not this process, nor ``ps`` itself."""
    import subprocess

    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if marker in line and f"{os.getpid()} " not in line and "ps -eo" not in line]


def assert_no_strays(marker: str, grace_s: float = 20) -> None:
    """Every process whose command line holds ``marker`` (the test's tmp dir) is gone
    within ``grace_s``: a killed actor's child gets its SIGKILL a moment after the actor
    dies."""
    deadline = time.monotonic() + grace_s
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left running: {left}"


def read_trace(run_dir: str) -> list[dict[str, Any]]:
    """The rows of a run's adaptive.jsonl (none before it exists)."""
    path = os.path.join(run_dir, "adaptive.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def proc_listeners(net_dir: str = "/proc/net") -> dict[int, tuple[str, int]]:
    """Every listening TCP socket of a network namespace: {inode: (address, port)}, from
    ``net_dir``'s tcp and tcp6 (state 0A is LISTEN; /proc/PID/net for PID's namespace)."""
    import ipaddress
    import struct

    found: dict[int, tuple[str, int]] = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        try:
            with open(f"{net_dir}/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if parts[3] != "0A":
                continue
            hex_addr, hex_port = parts[1].split(":")
            raw = bytes.fromhex(hex_addr)
            if v6:  # four 32-bit words, each in host (little-endian) order
                raw = b"".join(struct.pack(">I", struct.unpack("<I", raw[i : i + 4])[0]) for i in range(0, 16, 4))
                v6addr = ipaddress.IPv6Address(raw)
                # An IPv4 address mapped into IPv6 (::ffff:127.0.0.1) is that address.
                address = str(v6addr.ipv4_mapped or v6addr)
            else:
                address = str(ipaddress.IPv4Address(struct.pack(">I", struct.unpack("<I", raw)[0])))
            found[int(parts[9])] = (address, int(hex_port, 16))
    return found


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket the processes ``pids`` listen on."""
    listeners = proc_listeners()
    out = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in listeners:
                    out.append((pid, *listeners[inode]))
    return sorted(set(out))


def _traced(target: Callable[..., None], after_s: float, log: str, *args: Any) -> None:
    """``target(*args)`` in a spawned rank. An exception's traceback goes to ``log``; hung
    for ``after_s``, the rank writes every thread's stack to ``log`` and exits, so the test
    fails with where it hung (``run_gloo_ranks`` puts ``log`` in its error)."""
    import faulthandler
    import traceback

    with open(log, "w") as f:
        faulthandler.dump_traceback_later(after_s, exit=True, file=f)
        try:
            target(*args)
        except BaseException:
            f.write(traceback.format_exc())
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()


def _rank_logs(logs: list[str], limit: int = 4000) -> str:
    """What each rank wrote to its log (the end of it), for a failure message."""
    parts = []
    for rank, path in enumerate(logs):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            text = ""
        if text:
            parts.append(f"--- rank {rank} ---\n{text[-limit:]}")
    return "\n".join(parts)


# What ranks import, imported once in the fork server the ranks start from. Some only on
# first use: torch._dynamo when an optimizer is built (1.6 CPU-s), torch's distributed
# checkpoint when a sharded rank saves, DeepSpeed's engine modules when it initialises
# (0.8 CPU-s). (Preloading torch's extension builder too, which DeepSpeed's CPU Adam
# loads, made the gloo tests take more CPU, not less: measured, left out.) DeepSpeed with
# its CPU accelerator, as raylight imports it on a CPU worker. Measured on the modules that
# run gloo ranks: 101 CPU-s and 71 s before, 31-36 CPU-s and 30 s with these.
_RANK_PRELOAD = [
    "torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint.state_dict",
    "torch.distributed.elastic.agent.server.local_elastic_agent", "numpy", "raylight.worker.context",
    "raylight.worker.strategies", "tests.helpers",
]
_DEEPSPEED_PRELOAD = [
    "deepspeed", "deepspeed.ops.adam", "deepspeed.runtime.zero.muon.muon_optimizer",
    "deepspeed.ops.op_builder.all_ops", "deepspeed.module_inject.auto_ep_layer",
]


def _rank_context() -> Any:
    """Where gloo ranks start: a fork server (one per test session) that imported torch,
    raylight and, where installed, DeepSpeed once, so a rank starts in a fraction of a
    second rather than importing them again (seconds a rank on this project's 2 cores). A
    forked rank is as clean as a spawned one: the server only imported (no Python threads,
    no tensors, no process group; the native pools the imports start, OpenBLAS's and
    jemalloc's, handle fork themselves), and each rank still imports its test module."""
    import importlib.util
    import multiprocessing.forkserver as forkserver

    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    if importlib.util.find_spec("deepspeed") is not None:
        preload = [*_RANK_PRELOAD, *_DEEPSPEED_PRELOAD]
    else:
        preload = _RANK_PRELOAD
    ctx.set_forkserver_preload(preload)
    # The server takes the environment it starts with: DeepSpeed's accelerator for CPU
    # ranks, set in this process only while the server starts.
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["DS_ACCELERATOR"]
        else:
            os.environ["DS_ACCELERATOR"] = saved
    return ctx


def run_gloo_ranks(target: Callable[..., None], *args: Any, world_size: int = 2, timeout_s: float = 90) -> dict[int, Any]:
    """Run ``target(rank, port, *args, queue)`` in ``world_size`` new processes (they
    form a gloo group on a loopback port) and return what each put on ``queue``, by its
    ``"rank"``. Every process is joined, or killed, before this returns; a failure names
    each rank's traceback, or its stacks where it hung."""
    import queue as queues
    import shutil
    import socket
    import tempfile

    require_distributed_mark(f"{world_size} gloo ranks")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = _rank_context()
    queue = ctx.Queue()
    logdir = tempfile.mkdtemp(prefix="gloo-ranks-")
    logs = [os.path.join(logdir, f"rank{rank}.log") for rank in range(world_size)]
    procs = [
        ctx.Process(target=_traced, args=(target, max(timeout_s - 5, 1), logs[rank], rank, port, *args, queue))
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(out) < len(procs):
            try:  # a rank that died without a result fails the call at once, by its exit code
                item = queue.get(timeout=1.0)
            except queues.Empty:
                dead = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode not in (None, 0)}
                if dead:  # the others, hung on it, dump their stacks within their timers' spread
                    settle = time.monotonic() + 10
                    for p in procs:
                        p.join(timeout=max(0.1, settle - time.monotonic()))
                    raise RuntimeError(
                        f"gloo ranks exited without a result (rank: exit code): {dead}, results from "
                        f"{sorted(out)} (port {port})\n{_rank_logs(logs)}"
                    ) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"gloo ranks gave {sorted(out)} of {len(procs)} results in {timeout_s:g}s\n{_rank_logs(logs)}"
                    ) from None
                continue
            out[item["rank"]] = item
        return out
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        shutil.rmtree(logdir, ignore_errors=True)


class Sink:
    """A worker context's report sink for tests that drive a TrainContext in-process:
    keeps the reports, ignores progress, heartbeats and commits."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def report(self, report: Any) -> None:
        self.reports.append(report)

    def progress(self, *args: Any) -> None:
        pass

    def heartbeat(self) -> None:
        pass

    def output(self, *args: Any) -> None:
        pass

    def keep_commit(self, *args: Any) -> None:
        pass


@functools.cache
def deepspeed_releases_groups() -> bool:
    """Whether the installed DeepSpeed drops its references to a destroyed process group
    (``deepspeed.utils.groups._release_process_group_references``, DeepSpeed >= 0.19.8), which a
    DeepSpeed worker needs to serve the next run (raylight.worker.strategies.deepspeed); read
    from the file, without importing DeepSpeed (which imports torch's compiler stack)."""
    import importlib.util

    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(next(iter(spec.submodule_search_locations)), "utils", "groups.py")
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as f:
        return "def _release_process_group_references" in f.read()
    return False


def openmpi_missing() -> str | None:
    """Why the tests that run real ``mpirun`` skip, or None when OpenMPI's is on PATH."""
    import shutil
    import subprocess

    path = shutil.which("mpirun")
    if path is None:
        return "real mpirun is not on PATH (OpenMPI: `apt-get install openmpi-bin`)"
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    return None if "Open MPI" in version else f"{path} is not OpenMPI's mpirun: {version.strip()[:80]!r}"


def mpirun_command(np: int) -> list[str]:
    """OpenMPI's ``mpirun -np N`` kept on this machine: loopback only, as root (containers),
    more ranks than cores, stdin not forwarded."""
    import shutil

    require_distributed_mark("mpirun's processes")

    return [
        shutil.which("mpirun") or "mpirun", "-np", str(np), "--allow-run-as-root", "--oversubscribe",
        "--stdin", "none", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
        "--mca", "oob_tcp_if_include", "lo",
    ]
