"""Real Horovod (``horovod.torch``) inside a group raylight already formed.

Horovod's own launcher (``horovodrun --gloo``) starts a rendezvous server, computes a host
allocation plan and starts every process with ``HOROVOD_*`` variables. raylight's workers
are already started and already share a ``torch.distributed`` group, so ``init_horovod``
does that launcher's part from inside them: every rank tells the others which node it is
on (``all_gather_object``), every rank derives the same plan (Horovod's ``SlotInfo``:
rank, local and cross ranks and sizes per host), rank 0 starts Horovod's
``RendezvousHTTPServer`` with it and broadcasts its address, and every rank sets the
variables Horovod's gloo controller reads and calls ``hvd.init()``. ``RealHorovod.shutdown``
undoes it: ``hvd.shutdown()``, rank 0 stops the server, the variables are put back.

The server carries no authentication, so it listens on one address, never every interface:
loopback when the whole group is on one node (``MASTER_ADDR`` is a loopback address, as
raylight's worker group sets it then), else rank 0's cluster address.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from raylight.base.exceptions import ConfigError
from raylight.base.net import interface_for, is_loopback, loopback_interface
from raylight.worker.process_group import route_address

INSTALL_HINT = (
    "real Horovod is not installed in the workers' Python; build Horovod 0.28.1 as "
    "docs/horovod.md ('Real Horovod') shows, or use implementation='raylight' (raylight.horovod, "
    "no install needed)"
)


@dataclass(frozen=True)
class Slot:
    """One rank's place in Horovod's host allocation plan (the fields of Horovod's
    ``SlotInfo``)."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int


def host_plan(hosts: list[str]) -> list[Slot]:
    """The plan for ranks ``0..len(hosts)-1``, rank ``i`` on host ``hosts[i]``: local ranks
    number a host's ranks in rank order; the cross rank of local rank ``l`` numbers, in
    order of first appearance, the hosts that have a local rank ``l`` (as Horovod's
    ``get_host_assignments``)."""
    order = list(dict.fromkeys(hosts))
    local_sizes = {h: hosts.count(h) for h in order}
    seen: dict[str, int] = {}
    slots = []
    for rank, host in enumerate(hosts):
        local = seen.get(host, 0)
        seen[host] = local + 1
        with_local = [h for h in order if local_sizes[h] > local]
        slots.append(Slot(host, rank, local, with_local.index(host), len(hosts), local_sizes[host], len(with_local)))
    return slots


def _horovod_plan(slots: list[Slot]) -> list[Any]:
    from horovod.runner.common.util.hosts import SlotInfo

    return [
        SlotInfo(hostname=s.hostname, rank=s.rank, local_rank=s.local_rank, cross_rank=s.cross_rank,
                 size=s.size, local_size=s.local_size, cross_size=s.cross_size)
        for s in slots
    ]


class _Rendezvous:
    """Horovod's rendezvous HTTP server on ``host`` alone (Horovod's ``RendezvousServer``
    binds every interface), serving in a daemon thread."""

    def __init__(self, host: str, slots: list[Slot]) -> None:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self.httpd = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
        self.httpd.init(_horovod_plan(slots))
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="raylight-horovod-rendezvous", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def _host_key() -> str:
    """This rank's host in the plan: raylight's node index when the worker group set one
    (fake nodes on one machine stay apart), else the hostname."""
    node = os.environ.get("NODE_RANK")
    return f"node{node}" if node else socket.gethostname()


def _interface(loopback: bool, addr: str) -> str:
    if loopback:
        return loopback_interface()
    given = os.environ.get("GLOO_SOCKET_IFNAME")  # raylight's workers set it to the cluster's interface
    if given:
        return given.split(",")[0]
    # rank 0's address is on rank 0's machine: here, the interface this host reaches it by
    here = route_address(addr)
    name = interface_for(here)
    if name is None:
        raise ConfigError(
            f"no network interface of this node holds {here}, its address toward rank 0 at {addr}; set "
            "GLOO_SOCKET_IFNAME in the workers' environment to the interface Horovod's gloo should use"
        )
    return name


@dataclass
class RealHorovod:
    """Real Horovod, initialised in this process by ``init_horovod``; ``shutdown`` once."""

    hvd: Any  # the horovod.torch module
    server: _Rendezvous | None  # rank 0's
    saved_env: dict[str, str | None]

    def shutdown(self) -> None:
        """``hvd.shutdown()`` on every rank, then rank 0 stops its server once every rank
        is done with it (a barrier of the ``torch.distributed`` group, when one is formed)."""
        try:
            self.hvd.shutdown()
            if dist.is_available() and dist.is_initialized():
                dist.barrier()  # rank 0's server outlives every rank's Horovod
        finally:
            self.release()

    def release(self) -> None:
        """Stop rank 0's server and put the environment back (Horovod left alone)."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.saved_env = {}


def init_horovod(*, timeout_s: float, setting: str) -> RealHorovod:
    """Initialise real ``horovod.torch`` on every rank of the current ``torch.distributed``
    group (a group of one when none is formed). Every rank calls it. ``timeout_s`` bounds
    Horovod's gloo rendezvous; ``setting`` names where the caller's user sets it, for the
    error when it runs out."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise ConfigError(INSTALL_HINT) from exc
    grouped = dist.is_available() and dist.is_initialized()
    rank, size = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    hosts: list[Any] = [None] * size
    if grouped:
        dist.all_gather_object(hosts, _host_key())
    else:
        hosts = [_host_key()]
    slots = host_plan(hosts)
    master = os.environ.get("MASTER_ADDR", "127.0.0.1") if grouped else "127.0.0.1"
    loopback = len(set(hosts)) == 1 or is_loopback(master)
    bind = "127.0.0.1" if loopback else master
    server = None
    where: list[Any] = [None]
    saved: dict[str, str | None] = {}
    try:
        if rank == 0:
            server = _Rendezvous(bind, slots)
            where = [(bind, server.port)]
        if grouped:
            dist.broadcast_object_list(where, src=0)
        addr, port = where[0]
        mine = slots[rank]
        env = {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": _interface(loopback, addr),
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(max(1, int(timeout_s))),
            "HOROVOD_HOSTNAME": mine.hostname,
            "HOROVOD_RANK": str(mine.rank),
            "HOROVOD_SIZE": str(mine.size),
            "HOROVOD_LOCAL_RANK": str(mine.local_rank),
            "HOROVOD_LOCAL_SIZE": str(mine.local_size),
            "HOROVOD_CROSS_RANK": str(mine.cross_rank),
            "HOROVOD_CROSS_SIZE": str(mine.cross_size),
        }
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            hvd.init()
        except Exception as exc:
            raise RuntimeError(
                f"real Horovod did not initialise on rank {rank} of {size} (rendezvous {addr}:{port}, "
                f"gloo on {env['HOROVOD_GLOO_IFACE']}) within {timeout_s:g} s; raise {setting} if the "
                f"workers are slow to start: {exc}"
            ) from exc
    except BaseException:
        RealHorovod(hvd, server, saved).release()
        raise
    return RealHorovod(hvd, server, saved)
