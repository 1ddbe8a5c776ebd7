"""DDP's gradient all-reduce through shared memory, for CPU workers on one machine.

gloo's all-reduce over loopback TCP has a high fixed cost: on this project's 2-core
machine 0.4-1.8 ms for 1-280 KB (ranks in a training loop: 1.8 ms of a 2.8 ms step for a
16 KB gradient; ``bench/allreduce.py``), where the same exchange through shared memory
takes tens of microseconds. A small model trained on a few CPU workers spends most of
each step there, so DDP on CPU was slower than one process.

``SharedMemoryAllReduce.create`` sets it up for a gloo group whose ranks all run on this
machine (same kernel boot, PID namespace, and a ``/dev/shm`` they can all open), on Linux
x86-64 (its stores are seen in order by other cores, which the protocol below relies on;
elsewhere gloo does it all). ``DDPStrategy`` registers ``comm_hook`` on DDP: a bucket of
at most ``CAPACITY_BYTES`` is averaged here, a larger one by gloo as before.

Protocol: a file in ``/dev/shm`` (mode 0600, unlinked once every rank mapped it) holds two
buffers, used in alternate rounds; each holds one slot per rank: a header (the round
counter the rank last wrote, whether it left) and the rank's data. In round ``k`` a rank
copies its (pre-divided) bucket into its slot of buffer ``k % 2``, then stores ``k`` in
its counter, waits until every rank's counter there reads ``k``, and sums the slots in
rank order into its bucket: every rank adds the same numbers in the same order, so all
hold bitwise the same average (with two ranks, the same bits gloo gives). A rank writes
buffer ``k % 2`` again only in round ``k + 2``, after it saw every rank's round ``k + 1``,
which each rank starts only after it read round ``k``: one wait per round.

Waiting spins briefly, then yields the core, then sleeps in short steps (a stalled peer
costs little CPU). A peer that exited, or left (its worker's loop ended: strategy
``close``), fails the wait with ``DistBackendError`` within ``CHECK_EVERY_S``, as a closed
gloo connection does; a peer that stays silent fails it after the group's timeout
(raylight: ``FailureConfig(collective_timeout_s=...)``)."""

# No `from __future__ import annotations`: DDP checks comm_hook's annotations as objects.
import hashlib
import os
import platform
import secrets
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

CAPACITY_BYTES = 1 << 20  # per rank per buffer; DDP's first bucket is 1 MiB, its others 25
SHM_DIR = "/dev/shm"
_HEADER = 64  # bytes per slot for its counters: a cache line of its own
_LEFT = 1  # int64 words of a slot's header: 0 the round it last wrote, 1 whether it left
SPIN_S = 50e-6  # busy-wait this long (a peer a few microseconds behind costs no switch)
YIELD_S = 2e-3  # then give the core away this long (os.sched_yield)
SLEEP_S = 2e-4  # then sleep this long per check (a stalled peer costs little CPU)
CHECK_EVERY_S = 0.02  # is every peer still there?
TIMEOUT_SETTING = "the process group's timeout (raylight: FailureConfig(collective_timeout_s=...))"
_SUPPORTED = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _machine_id() -> int:
    """The same number on two processes exactly when they share a kernel boot and a PID
    namespace (the PIDs they exchange then name the same processes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pid_namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return 0
    parts = [platform.node(), boot, pid_namespace]
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:7], "little")


def _eligible_here() -> bool:
    return (
        platform.system() == "Linux"
        and platform.machine() in ("x86_64", "AMD64")
        and os.path.isdir(SHM_DIR)
        and os.access(SHM_DIR, os.W_OK)
    )


def _group_timeout(group: Any) -> float:
    """The gloo group's timeout, seconds (torch keeps it on the backend's options)."""
    try:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        timeout = pg._get_backend(torch.device("cpu")).options._timeout
        if isinstance(timeout, timedelta):
            return timeout.total_seconds()
    except Exception:  # torch moved it: its documented default
        pass
    return dist.default_pg_timeout.total_seconds()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the PID: ours is gone
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except (OSError, IndexError):
        return True


class SharedMemoryAllReduce:
    """The shared-memory all-reduce of one process group (module docstring)."""

    def __init__(self, mem: torch.Tensor, *, rank: int, world_size: int, pids: list[int], capacity: int, timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.pids = pids
        self.capacity = capacity
        self.timeout_s = timeout_s
        self._mem = mem  # uint8, MAP_SHARED; the file behind it is already unlinked
        self._slot = _HEADER + capacity
        words = mem.view(torch.int64).numpy()
        stride = self._slot // 8
        # rounds[b][r]: the round rank r last wrote into buffer b
        self._rounds = [words[b * world_size * stride : (b + 1) * world_size * stride : stride] for b in range(2)]
        # 0 while a rank takes part; once it left, 1 + the last round it completed
        self._lefts = words[_LEFT : world_size * stride : stride]
        self._round = 0
        self._done = 0  # the last round this rank completed
        self.closed = False

    # -- setting up ------------------------------------------------------------------
    @classmethod
    def create(cls, group: Any = None, *, capacity: int | None = None) -> "SharedMemoryAllReduce | None":
        """Collective: every rank of ``group`` (a gloo group; None: the default one) calls
        it. Returns the shared-memory all-reduce where every rank can use it, else None on
        every rank (gloo then reduces everything, as without it). ``capacity``: bytes per
        rank, default ``CAPACITY_BYTES`` (read at the call)."""
        capacity = CAPACITY_BYTES if capacity is None else capacity
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if world < 2:
            return None
        here = _eligible_here()
        ident = torch.tensor([_machine_id() if here else 0, os.getpid()], dtype=torch.int64)
        gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(gathered, ident, group=group)
        ids = {int(t[0]) for t in gathered}
        if len(ids) != 1 or 0 in ids:
            return None  # another machine, PID namespace, or system: gloo only
        size = 2 * world * (_HEADER + capacity)
        name = torch.zeros(32, dtype=torch.uint8)  # rank 0's file's name, "" where it made none
        if rank == 0:
            made = cls._make_file(size).encode()
            name[: len(made)] = torch.tensor(list(made), dtype=torch.uint8)
        dist.broadcast(name, 0, group=group)
        shared = bytes(name.tolist()).rstrip(b"\0").decode()
        path = os.path.join(SHM_DIR, shared)
        mem = None
        if shared:
            try:
                mem = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            except (RuntimeError, OSError):
                mem = None
        ok = torch.tensor([1 if mem is not None else 0], dtype=torch.int64)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)  # also: every rank has mapped it
        if rank == 0 and shared:
            try:
                os.unlink(path)
            except OSError:
                pass
        if mem is None or int(ok) == 0:
            return None
        pids = [int(t[1]) for t in gathered]
        return cls(mem, rank=rank, world_size=world, pids=pids, capacity=capacity, timeout_s=_group_timeout(group))

    @staticmethod
    def _make_file(size: int) -> str:
        """A new file of ``size`` bytes in /dev/shm, readable by this user only, its space
        reserved (so a full /dev/shm fails here, not with SIGBUS at a later write); its
        name, or "" where that failed."""
        name = f"raylight-ddp-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return ""
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:
            os.close(fd)
            os.unlink(path)
            return ""
        os.close(fd)
        return name

    # -- the all-reduce ----------------------------------------------------------------
    def fits(self, tensor: torch.Tensor) -> bool:
        return (
            not self.closed
            and tensor.device.type == "cpu"
            and tensor.dtype in _SUPPORTED
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() <= self.capacity
        )

    def _data(self, buf: int, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        start = (buf * self.world_size + rank) * self._slot + _HEADER
        nbytes = tensor.numel() * tensor.element_size()
        return self._mem[start : start + nbytes].view(tensor.dtype).view(tensor.shape)

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group in place (``fits(tensor)`` must hold); every rank
        ends with the same bits."""
        self._round += 1
        k, buf = self._round, self._round % 2
        self._data(buf, self.rank, tensor).copy_(tensor)
        self._rounds[buf][self.rank] = k  # after the data: x86 keeps store order
        self._wait(buf, k)
        if self._lefts.any():
            self._check_left(k)
        self._done = k
        torch.add(self._data(buf, 0, tensor), self._data(buf, 1, tensor), out=tensor)
        for r in range(2, self.world_size):
            tensor.add_(self._data(buf, r, tensor))
        return tensor

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """``dist.all_reduce(tensor)`` (a sum, in place): here where it fits, else by the
        backend. Every rank must call it with a tensor of the same size and type."""
        if self.fits(tensor):
            return self.sum_(tensor)
        dist.all_reduce(tensor)
        return tensor

    def _wait(self, buf: int, k: int) -> None:
        rounds = self._rounds[buf]
        start = time.monotonic()
        checked = start
        while rounds.min() < k:
            now = time.monotonic()
            waited = now - start
            if waited < SPIN_S:
                continue
            if waited < YIELD_S:
                os.sched_yield()
                continue
            time.sleep(SLEEP_S)
            if now - checked >= CHECK_EVERY_S:
                checked = now
                self._check_peers(buf, k, waited)

    def _check_left(self, k: int) -> None:
        """A rank that left before it completed round ``k`` (it gave up on it, or its loop
        ended early) fails the round for all, as gloo's closed connection does."""
        for r, left in enumerate(self._lefts):
            if left and left - 1 < k:
                self._fail(f"rank {r} left the group (its training loop ended, or it gave up) during the all-reduce")

    def _check_peers(self, buf: int, k: int, waited: float) -> None:
        self._check_left(k)
        behind = [r for r in range(self.world_size) if self._rounds[buf][r] < k]
        for r in behind:
            if not _alive(self.pids[r]):
                self._fail(f"rank {r}'s process (pid {self.pids[r]}) exited during the all-reduce")
        if waited > self.timeout_s:
            self._fail(
                f"ranks {behind} did not reach the all-reduce within {self.timeout_s:g} s; raise "
                f"{TIMEOUT_SETTING} if they are slow, not stuck"
            )

    def _fail(self, why: str) -> None:
        self.close()
        raise dist.DistBackendError(f"raylight's shared-memory all-reduce: {why}")

    def close(self) -> None:
        """This rank leaves: a peer waiting on it fails at once instead of at the timeout."""
        if not self.closed:
            self.closed = True
            self._lefts[self.rank] = self._done + 1


def comm_hook(state: SharedMemoryAllReduce, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's average over the group, through shared memory
    where it fits, else gloo's all-reduce (as DDP's default hook)."""
    tensor = bucket.buffer()
    tensor.div_(state.world_size)
    if state.fits(tensor):
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(state.sum_(tensor))
        return fut
    work = dist.all_reduce(tensor, async_op=True)
    assert work is not None
    return work.get_future().then(lambda f: f.value()[0])
