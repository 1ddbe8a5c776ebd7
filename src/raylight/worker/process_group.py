"""Which external launcher started this process, and how its ranks meet.

``torchrun``, the ``deepspeed`` launcher, ``horovodrun`` and ``mpirun`` start one process
per rank and tell each its place through environment variables, each launcher its own.
``detect`` reads them into one ``LaunchEnv``; ``init_process_group`` forms the
``torch.distributed`` group those processes make, whatever started them:

- ``env``: ``MASTER_ADDR``/``MASTER_PORT`` are set (torchrun, deepspeed, ``raylight run``,
  or an ``mpirun -x MASTER_ADDR=... -x MASTER_PORT=...``): torch's ``env://``.
- ``horovod``: horovodrun's Gloo controller gives no master address but runs an HTTP
  key-value server (``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``); rank 0 opens a store and
  publishes its address there, the others read it.
- ``file``: mpirun on one node with no master address: a file store in the temp directory
  named after the MPI job, which only that job's processes know.

Pure apart from ``init_process_group`` (torch, sockets, HTTP) and
``destroy_process_group``, which import torch when called; the second is how every
raylight process ends a group (the launcher's, the Ray workers', raylight.horovod's).
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from raylight.base.exceptions import ConfigError

LAUNCHERS = ("torchrun", "deepspeed", "horovodrun", "mpirun", "env")
# The process group of ranks on GPUs: NCCL for CUDA tensors and gloo beside it for CPU ones
# (torch's own default when CUDA is there). With "nccl" alone every collective on a CPU
# tensor fails ("No backend type associated with device type cpu"): raylight's own
# (ctx.accumulator()'s sums, a resize's checkpoint broadcast, the adaptive engine's and the
# declarative evaluation's bookkeeping) and a loop's ``dist.all_reduce`` of a CPU tensor alike.
GPU_BACKEND = "cpu:gloo,cuda:nccl"
RENDEZVOUS_TIMEOUT_ENV = "RAYLIGHT_RENDEZVOUS_TIMEOUT_S"  # how long ranks wait for each other
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in a group an external launcher started.

    ``cross_rank``/``cross_size``: this process's node and the number of nodes (Horovod's
    names). ``rendezvous``: ``env``, ``horovod`` or ``file`` (see the module docstring);
    ``rendezvous_id`` names the Horovod scope or the file.
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    cross_rank: int
    cross_size: int
    rendezvous: str
    master_addr: str | None = None
    master_port: int | None = None
    rendezvous_id: str = ""

    def describe(self) -> str:
        return f"{self.launcher} rank {self.rank} of {self.world_size} (local {self.local_rank} of {self.local_world_size})"


class LaunchEnvError(ConfigError):
    """The launcher's environment variables are incomplete or inconsistent."""


def _int(environ: Mapping[str, str], name: str, default: int | None = None, *, launcher: str) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise LaunchEnvError(f"{_label(launcher)}: {name} is not set; it must hold this process's place (an integer)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchEnvError(f"{_label(launcher)}: {name}={raw!r} is not an integer") from None


def _label(launcher: str) -> str:
    return "the launcher's environment" if launcher == "env" else f"{launcher}'s environment"


def _first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        if environ.get(name, "").strip():
            return name
    return None


def detect(environ: Mapping[str, str] | None = None) -> LaunchEnv | None:
    """The launcher that started this process, or None when none did.

    Order: Horovod's variables (``HOROVOD_RANK``), MPI's (``OMPI_COMM_WORLD_RANK``, or
    ``PMI_RANK`` for MPICH and Intel MPI), unless torchrun's are set too (``raylight run``
    with ``raylight.horovod`` sets both), then torch's (``RANK`` and ``WORLD_SIZE``:
    torchrun when ``TORCHELASTIC_RUN_ID`` is set, the deepspeed launcher when
    ``CROSS_RANK`` is, any other launcher that sets them otherwise).
    """
    env = os.environ if environ is None else environ
    # Under torchrun's variables, Horovod's and MPI's are raylight.horovod's copies
    # (worker/hvd/compat.py: set_rank_variables), for scripts to read: torchrun started it.
    torchrun = bool(_first(env, "TORCHELASTIC_RUN_ID") and _first(env, "RANK"))
    if _first(env, "HOROVOD_RANK") and not torchrun:
        return _horovod(env)
    if _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK") and not torchrun:
        return _mpi(env)
    if _first(env, "RANK") and _first(env, "WORLD_SIZE"):
        return _torch(env)
    return None


def _master(env: Mapping[str, str], launcher: str) -> tuple[str, int] | None:
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if not addr and not port:
        return None
    if not addr or not port:
        missing = "MASTER_ADDR" if not addr else "MASTER_PORT"
        raise LaunchEnvError(f"{_label(launcher)}: {missing} is not set but its partner is; set both or neither")
    return addr, _int(env, "MASTER_PORT", launcher=launcher)


def _checked(launch: LaunchEnv) -> LaunchEnv:
    where = _label(launch.launcher)
    if launch.world_size < 1:
        raise LaunchEnvError(f"{where}: the world size is {launch.world_size}; it must be at least 1")
    if not 0 <= launch.rank < launch.world_size:
        raise LaunchEnvError(f"{where}: rank {launch.rank} is outside 0..{launch.world_size - 1} (world size {launch.world_size})")
    if not 0 <= launch.local_rank < max(launch.local_world_size, 1):
        raise LaunchEnvError(
            f"{where}: local rank {launch.local_rank} is outside 0..{launch.local_world_size - 1} "
            f"(local world size {launch.local_world_size})"
        )
    return launch


def _horovod(env: Mapping[str, str]) -> LaunchEnv:
    name = "horovodrun"
    size = _int(env, "HOROVOD_SIZE", launcher=name)
    local_size = _int(env, "HOROVOD_LOCAL_SIZE", size, launcher=name)
    common = LaunchEnv(
        launcher=name,
        rank=_int(env, "HOROVOD_RANK", launcher=name),
        world_size=size,
        local_rank=_int(env, "HOROVOD_LOCAL_RANK", 0, launcher=name),
        local_world_size=local_size,
        cross_rank=_int(env, "HOROVOD_CROSS_RANK", 0, launcher=name),
        cross_size=_int(env, "HOROVOD_CROSS_SIZE", max(size // max(local_size, 1), 1), launcher=name),
        rendezvous="env",
    )
    master = _master(env, name)
    if master is not None:
        return _checked(replace(common, rendezvous="env", master_addr=master[0], master_port=master[1]))
    addr = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").strip()
    if not addr:
        raise LaunchEnvError(
            "horovodrun's environment: neither HOROVOD_GLOO_RENDEZVOUS_ADDR (horovodrun's Gloo controller, "
            "`horovodrun --gloo`) nor MASTER_ADDR/MASTER_PORT is set; run with --gloo or export "
            "MASTER_ADDR and MASTER_PORT to every rank"
        )
    port = _int(env, "HOROVOD_GLOO_RENDEZVOUS_PORT", launcher=name)
    return _checked(replace(common, rendezvous="horovod", master_addr=addr, master_port=port, rendezvous_id="raylight"))


def _mpi(env: Mapping[str, str]) -> LaunchEnv:
    name = "mpirun"
    if _first(env, "OMPI_COMM_WORLD_RANK"):
        rank = _int(env, "OMPI_COMM_WORLD_RANK", launcher=name)
        size = _int(env, "OMPI_COMM_WORLD_SIZE", launcher=name)
        local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, launcher=name)
        local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", size, launcher=name)
        job = env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_ess_jobid") or env.get("PMIX_NAMESPACE") or ""
    else:  # MPICH, Intel MPI (Hydra's PMI)
        rank = _int(env, "PMI_RANK", launcher=name)
        size = _int(env, "PMI_SIZE", launcher=name)
        local_rank = _int(env, "MPI_LOCALRANKID", 0, launcher=name)
        local_size = _int(env, "MPI_LOCALNRANKS", size, launcher=name)
        job = env.get("PMI_KVSNAME") or env.get("PMIX_NAMESPACE") or ""
    # The node's index as Horovod's cross rank counts it (the rank among the processes with
    # this local rank), under MPI's default by-slot mapping. Not OMPI_COMM_WORLD_NODE_RANK:
    # that is this process's rank among its node's processes (1 for rank 1 of a one-node
    # `mpirun -np 2`), not the node's.
    node = rank // max(local_size, 1)
    common = LaunchEnv(
        launcher=name, rank=rank, world_size=size, local_rank=local_rank, local_world_size=local_size,
        cross_rank=node, cross_size=max(-(-size // max(local_size, 1)), 1), rendezvous="env",
    )
    master = _master(env, name)
    if master is not None:
        return _checked(replace(common, rendezvous="env", master_addr=master[0], master_port=master[1]))
    if local_size != size:
        raise LaunchEnvError(
            f"mpirun across nodes ({size} ranks, {local_size} on this node): export the rendezvous address "
            "to every rank, e.g. `mpirun -x MASTER_ADDR=<first host> -x MASTER_PORT=29500 ...`"
        )
    if not job:
        raise LaunchEnvError(
            "mpirun's environment: no MPI job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE or PMI_KVSNAME) names "
            "this job's rendezvous; export MASTER_ADDR=127.0.0.1 and MASTER_PORT=<a free port> to every rank"
        )
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)
    return _checked(replace(common, rendezvous="file", rendezvous_id=f"raylight-mpi-{safe}"))


def _torch(env: Mapping[str, str]) -> LaunchEnv:
    if _first(env, "TORCHELASTIC_RUN_ID"):
        name = "torchrun"
    elif _first(env, "CROSS_RANK", "LOCAL_SIZE"):
        name = "deepspeed"
    else:
        name = "env"
    master = _master(env, name)
    if master is None:
        raise LaunchEnvError(
            f"{_label(name)}: RANK and WORLD_SIZE are set but MASTER_ADDR and MASTER_PORT are not; "
            "the launcher must set both (torchrun and deepspeed do), or export them to every rank"
        )
    size = _int(env, "WORLD_SIZE", launcher=name)
    local_var = _first(env, "LOCAL_WORLD_SIZE", "LOCAL_SIZE")
    local_size = _int(env, local_var, size, launcher=name) if local_var else size
    node_var = _first(env, "GROUP_RANK", "CROSS_RANK", "NODE_RANK")
    cross_var = _first(env, "CROSS_SIZE")
    rank = _int(env, "RANK", launcher=name)
    common = LaunchEnv(
        launcher=name,
        rank=rank,
        world_size=size,
        local_rank=_int(env, "LOCAL_RANK", 0 if size == 1 else None, launcher=name),
        local_world_size=local_size,
        cross_rank=_int(env, node_var, launcher=name) if node_var else rank // max(local_size, 1),
        cross_size=_int(env, cross_var, launcher=name) if cross_var else max(-(-size // max(local_size, 1)), 1),
        rendezvous="env",
    )
    return _checked(replace(common, rendezvous="env", master_addr=master[0], master_port=master[1]))


def rendezvous_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """How long the ranks wait for each other (``RAYLIGHT_RENDEZVOUS_TIMEOUT_S``, default 300)."""
    raw = (os.environ if environ is None else environ).get(RENDEZVOUS_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_RENDEZVOUS_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise LaunchEnvError(f"{RENDEZVOUS_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


def collect_at_exit() -> None:
    """Collect garbage at exit, before the interpreter's teardown (idempotent).

    A gloo group's worker thread drops the last reference to a finished collective's work
    object, which needs the GIL; when the main thread goes straight from the script's last
    collective into interpreter teardown, that thread is ended mid-destructor and the
    process aborts with "terminate called without an active exception" (exit code 134)
    after the script succeeded: 5 runs in 50 of a 2-rank DDP script under plain torchrun
    on torch 2.13. Collecting first frees what DDP left in reference cycles and lets that
    thread finish while the interpreter is whole: 0 in 40. `raylight run`'s bootstrap does
    the same for every script.
    """
    atexit.unregister(gc.collect)
    atexit.register(gc.collect)


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()``, once the garbage that still holds the
    group is freed. A DDP model sits in a reference cycle, and its C++ reducer holds the
    group: freed by the garbage collector after the group's Python handle is gone, it drops
    the last reference with the GIL held, and gloo's destructor then waits for its worker
    threads, one of which may be waiting for the GIL to free the tensors of the last
    collective (a hung rank, seen in the gloo tests under load; an abort where it happens
    at the interpreter's exit). Freed first, the last reference is the Python handle's,
    whose destructor releases the GIL."""
    import torch.distributed as dist

    gc.collect()
    dist.destroy_process_group()


def formed() -> tuple[int, int] | None:
    """(rank, world size) of the process group this process already formed, or None."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else None


def backend_config() -> str:
    """The formed group's backends by device (``"cpu:gloo,cuda:nccl"``); raylight's
    bookkeeping needs one for CPU tensors (it reduces metric sums and data positions)."""
    import torch.distributed as dist

    return str(dist.get_backend_config())


def from_rank_zero(value: Any) -> Any:
    """Rank 0's ``value``, on every rank of the formed group."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def init_process_group(launch: LaunchEnv, backend: str, *, timeout_s: float | None = None,
                       prefix: str | None = None) -> None:
    """Form the launcher's ``torch.distributed`` default group (see the module docstring).
    A rank that does not meet the others within ``timeout_s`` (default
    ``RAYLIGHT_RENDEZVOUS_TIMEOUT_S``) raises, naming the setting. ``prefix``: the env://
    store's keys for this group go under it (a group formed again in the same store, whose
    last group's keys would mislead the new one's rendezvous)."""
    import torch.distributed as dist

    collect_at_exit()  # the launcher's process ends in the user's script, not in raylight

    timeout = rendezvous_timeout_s() if timeout_s is None else timeout_s
    delta = timedelta(seconds=timeout)
    common: dict[str, Any] = dict(rank=launch.rank, world_size=launch.world_size, timeout=delta)
    try:
        if launch.rendezvous == "env":
            os.environ.setdefault("MASTER_ADDR", str(launch.master_addr))
            os.environ.setdefault("MASTER_PORT", str(launch.master_port))
            if prefix is None:
                dist.init_process_group(backend, init_method="env://", **common)
            else:
                store, _, _ = next(dist.rendezvous("env://", rank=launch.rank, world_size=launch.world_size,
                                                   timeout=delta))
                dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), **common)
        elif launch.rendezvous == "file":
            path = os.path.join(tempfile.gettempdir(), launch.rendezvous_id)
            dist.init_process_group(backend, init_method=f"file://{path}", **common)
        elif launch.rendezvous == "horovod":
            dist.init_process_group(backend, store=_horovod_store(launch, timeout), **common)
        else:
            raise ValueError(f"unknown rendezvous {launch.rendezvous!r}")
    except (RuntimeError, TimeoutError) as exc:
        if "timeout" in str(exc).lower() or "timed out" in str(exc).lower() or isinstance(exc, TimeoutError):
            raise TimeoutError(
                f"{launch.describe()}: the other ranks did not join within {timeout:g} s "
                f"({RENDEZVOUS_TIMEOUT_ENV}): {exc}"
            ) from exc
        raise


def route_address(peer: str) -> str:
    """This host's address toward ``peer`` (loopback for a loopback peer): where rank 0's
    store listens, so it is reachable from the peer's network and nowhere else."""
    try:
        infos = socket.getaddrinfo(peer, None, socket.AF_INET)
        ip = str(infos[0][4][0])
    except OSError:
        return "127.0.0.1"
    if ip.startswith("127."):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((ip, 9))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])


def _horovod_store(launch: LaunchEnv, timeout: float) -> Any:
    """Rank 0 opens the store and publishes ``host:port`` in horovodrun's key-value server;
    the other ranks read it (polling until ``timeout``) and connect."""
    import torch.distributed as dist

    from raylight.base.net import listen_socket

    url = f"http://{launch.master_addr}:{launch.master_port}/{launch.rendezvous_id}/master"
    delta = timedelta(seconds=timeout)
    if launch.rank == 0:
        host = route_address(str(launch.master_addr))
        sock = listen_socket(host)
        port = sock.getsockname()[1]
        try:
            store = dist.TCPStore(host, port, launch.world_size, True, delta, wait_for_workers=False, master_listen_fd=sock.fileno())
        except BaseException:
            sock.close()
            raise
        sock.detach()
        request = urllib.request.Request(url, data=f"{host}:{port}".encode(), method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        return store
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                host, _, port_text = response.read().decode().rpartition(":")
            return dist.TCPStore(host, int(port_text), launch.world_size, False, delta)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{launch.describe()}: rank 0 did not publish its address at {url} within {timeout:g} s "
                f"({RENDEZVOUS_TIMEOUT_ENV})"
            )
        time.sleep(0.1)  # polling horovodrun's server: it has no way to wait for a key
