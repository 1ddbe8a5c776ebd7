"""The one state of ``raylight.horovod``: ``init``, ``shutdown`` and who this process is.

Horovod's API is process-global (``hvd.init()`` then ``hvd.rank()`` anywhere), so this
module holds one ``_State`` (None before ``init`` and after ``shutdown``): the process's
place, whether the ``torch.distributed`` group is ours to destroy, and the pending async
handles. ``init`` adopts a group that already exists (inside ``raylight.fit``, a raylight
Lightning strategy or ``raylight run``) or forms one from the launcher's environment
(``raylight.worker.process_group``: torchrun, horovodrun, mpirun, ...) or, with no launcher, a
group of one, as Horovod runs without ``horovodrun``.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from raylight.worker.process_group import (
    GPU_BACKEND,
    LaunchEnvError,
    destroy_process_group,
    detect,
    init_process_group,
)

# Horovod's reduction ops (the values of horovod.common.basics' ReduceOp).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


class HorovodInternalError(RuntimeError):
    """A collective failed (a peer died or the group broke); ``hvd.elastic.run`` restores
    the last commit and retries. Horovod's exception of the same name."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; ``hvd.elastic.run`` resets and continues without
    restoring (``skip_sync``: the state need not be broadcast again)."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the hosts of this job changed")
        self.skip_sync = skip_sync


@dataclass
class _State:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    owns_group: bool  # formed by init (shutdown destroys it) or adopted (left alone)
    group: Any  # the default process group init saw; a new one means init must run again
    handles: dict[int, Any] = field(default_factory=dict)
    next_handle: int = 0
    process_sets: dict[int, Any] = field(default_factory=dict)  # id -> ProcessSet, added ones
    next_set: int = 0


_state: _State | None = None
_formed = 0  # groups this process formed: a re-formed group meets under a new name


def _backend() -> str:
    return GPU_BACKEND if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join (or form) the job's process group. Safe to call again: a no-op while the
    group it saw is current, a fresh adoption when the run re-formed it."""
    global _state, _formed
    if comm is not None:
        raise ValueError(
            "hvd.init(comm=...): raylight.horovod has no MPI communicators; the group comes from the "
            "launcher's environment (see docs/horovod.md). Call hvd.init() without comm"
        )
    if is_initialized():
        return
    _state = None
    if dist.is_initialized():  # adopt: the environment only says where this process sits
        try:
            launch = detect()
        except LaunchEnvError:
            launch = None
        rank, size = dist.get_rank(), dist.get_world_size()
        owns = False
    else:
        launch = detect()
        if launch is None:  # no launcher: one process, as Horovod runs without horovodrun
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        else:
            if _formed and launch.rendezvous in ("file", "horovod"):
                # A file store or a key-value scope keeps the last group's keys: every rank
                # re-forms together (hvd.elastic's reset), so the count names the new one.
                launch = replace(launch, rendezvous_id=f"{launch.rendezvous_id}-{_formed}")
            # env://'s store (the launcher's, e.g. raylight run's agent store) keeps the last
            # group's keys too: a re-formed group's keys go under a prefix of their own
            init_process_group(launch, _backend(), prefix=f"raylight-hvd-{_formed}" if _formed else None)
            _formed += 1
        rank, size = dist.get_rank(), dist.get_world_size()
        owns = True
    if launch is not None and (launch.rank, launch.world_size) == (rank, size):
        where = (launch.local_rank, launch.local_world_size, launch.cross_rank, launch.cross_size)
    else:  # an adopted group the environment does not describe: one node
        where = (rank, size, 0, 1)
    _state = _State(rank, size, *where, owns_group=owns, group=dist.group.WORLD)
    for ps in () if process_sets == "dynamic" else process_sets or ():  # "dynamic": added later
        add_process_set(ps)


def shutdown() -> None:
    """Forget the group; destroy it when ``init`` formed it (an adopted one belongs to
    raylight's worker and stays)."""
    global _state
    state, _state = _state, None
    if state is not None and state.owns_group and dist.is_initialized() and dist.group.WORLD is state.group:
        # Collectives' work objects caught in reference cycles (an optimizer's gradient
        # hooks) must go while their group exists: freed after it, they abort the process.
        destroy_process_group()


# Horovod scripts may end without hvd.shutdown(); a gloo group left to the interpreter's
# teardown can abort the process ("terminate called without an active exception") after
# the script succeeded. A no-op when no group was formed here.
atexit.register(shutdown)


def is_initialized() -> bool:
    return _state is not None and dist.is_initialized() and dist.group.WORLD is _state.group


def state() -> _State:
    """The state, or Horovod's ValueError before ``init``."""
    if _state is None:
        raise ValueError(NOT_INITIALIZED)
    if not is_initialized():
        raise ValueError(
            f"{NOT_INITIALIZED} (the process group hvd.init() joined is gone: it was destroyed or "
            "re-formed; call hvd.init() again)"
        )
    return _state


def size() -> int:
    return state().size


def rank() -> int:
    return state().rank


def local_size() -> int:
    return state().local_size


def local_rank() -> int:
    return state().local_rank


def cross_size() -> int:
    return state().cross_size


def cross_rank() -> int:
    return state().cross_rank


def is_homogeneous() -> bool:
    s = state()
    return s.local_size * s.cross_size == s.size


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    state()
    return False


def gloo_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return True


def nccl_built() -> bool:
    return torch.cuda.is_available() and dist.is_nccl_available()


def cuda_built() -> bool:
    return torch.cuda.is_available()


def rocm_built() -> bool:
    return torch.version.hip is not None


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


class ProcessSet:
    """A subset of the ranks (Horovod's process set) on its own ``torch.distributed``
    group. ``ProcessSet(ranks)`` names the ranks; ``hvd.add_process_set`` (or
    ``hvd.init(process_sets=[...])``), called on every rank in the same order, forms its
    group (``torch.distributed.new_group``). ``global_process_set`` is every rank."""

    def __init__(self, ranks: Any = None) -> None:
        self.ranks: list[int] | None = None if ranks is None else sorted(int(r) for r in ranks)
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"hvd.ProcessSet({ranks!r}): a rank is listed twice")
        self.group: Any = None  # the torch group, once added
        self.process_set_id: int | None = 0 if ranks is None else None

    def _members(self) -> list[int]:
        return list(range(size())) if self.ranks is None else self.ranks

    def size(self) -> int:
        return len(self._members())

    def rank(self) -> int:
        me = rank()
        return self._members().index(me) if me in self._members() else -1

    def included(self) -> bool:
        state()
        return rank() in self._members()

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet(ranks={self.ranks})"


global_process_set = ProcessSet()


def _form(ps: ProcessSet) -> ProcessSet:
    s = state()
    members = ps._members()
    if any(not 0 <= r < s.size for r in members) or not members:
        raise ValueError(f"hvd.add_process_set({members}): the ranks must be a non-empty subset of 0..{s.size - 1}")
    if ps.group is not None:
        raise ValueError(f"hvd.add_process_set: {ps!r} was already added")
    ps.group = dist.new_group(members)  # every rank calls it, members or not (as Horovod's)
    s.next_set += 1
    ps.process_set_id = s.next_set
    s.process_sets[ps.process_set_id] = ps
    return ps


def add_process_set(process_set: Any) -> ProcessSet:
    """Form a process set's group; every rank must call it, in the same order."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.ranks is None:
        raise ValueError("hvd.add_process_set: give the ranks (hvd.global_process_set always exists)")
    return _form(ps)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Release a process set's group (on every rank, as ``add_process_set``); False
    when it was not added."""
    s = state()
    if process_set is global_process_set or process_set.process_set_id not in s.process_sets:
        return False
    del s.process_sets[process_set.process_set_id]
    group, process_set.group, process_set.process_set_id = process_set.group, None, None
    if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(group)
    return True


def group_of(process_set: Any, where: str) -> tuple[Any, int, int]:
    """``(torch group or None for the world, its size, this rank's place in it)``;
    raises unless ``process_set`` was added and holds this rank."""
    s = state()
    if process_set is None or process_set is global_process_set:
        return None, s.size, s.rank
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{where}: process_set={process_set!r} is not an hvd.ProcessSet")
    if process_set.process_set_id not in s.process_sets:
        raise ValueError(f"{where}: {process_set!r} was not added; call hvd.add_process_set on every rank first")
    if not process_set.included():
        raise ValueError(f"{where}: this rank ({s.rank}) is not in {process_set!r}")
    return process_set.group, process_set.size(), process_set.rank()


def check_process_set(process_set: Any) -> None:
    group_of(process_set, "process_set=")
