"""Before each of ``raylight.horovod``'s collectives the ranks agree on what they run.

Horovod's coordinator matches ops across ranks by name and refuses mismatches; a
``torch.distributed`` collective just runs, and ranks that disagree (a different shape, a
dtype gloo refuses on one rank, another op) crash the process (gloo aborts) or leave the
group out of step, so that every later collective times out. So every op first
all-gathers a small descriptor (one int64 row per rank: the op, its reduction and root,
the number of tensors, the first tensor's dtype and shape, a checksum of all tensors'
dtypes and shapes, the name when given, and whether this rank refused the op). Then every
rank sees the same rows and decides the same way: all agree, the op runs; one rank refused
it (bad input), it raises its own ``ValueError`` and the others a ``RuntimeError`` naming
it; the rows differ, every rank raises the same ``RuntimeError``. No data collective was
started, so the group stays in step and the next op runs.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

_MAX_DIMS = 8
# dtype codes (the order is the wire's, not torch's)
_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.bool, torch.complex64, torch.complex128]
_KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join"]
JOIN = _KINDS.index("join")
# row: kind, op, root, count, device, refused, name, signature, dtype, ndim, dims...
_ROW = 10 + _MAX_DIMS
_NONE = -1


@dataclass(frozen=True)
class Op:
    """What this rank is about to run. ``ignore_dim0``: the first dimension may differ
    between ranks (allgather, alltoall)."""

    kind: str
    tensors: Sequence[torch.Tensor] = ()
    op: int = _NONE
    root: int = _NONE
    name: str | None = None
    ignore_dim0: bool = False


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else 100 + abs(hash(str(dtype))) % 1000


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _row(spec: Op, refused: bool) -> list[int]:
    tensors = [t for t in spec.tensors if isinstance(t, torch.Tensor)]  # a refused input may hold others
    shapes = [tuple(t.shape[1:] if spec.ignore_dim0 and t.dim() else t.shape) for t in tensors]
    signature = _crc(repr([(str(t.dtype), s) for t, s in zip(tensors, shapes, strict=True)]))
    first = tensors[0] if tensors else None
    dims = list(first.shape) if first is not None else []
    if spec.ignore_dim0 and dims:
        dims[0] = _NONE
    dims = (dims + [_NONE] * _MAX_DIMS)[:_MAX_DIMS]
    return [
        _KINDS.index(spec.kind), spec.op, spec.root, len(spec.tensors),  # the count as given
        (1 if first.is_cuda else 0) if first is not None else _NONE, int(refused),
        _crc(spec.name) if spec.name is not None else _NONE, signature,
        _dtype_code(first.dtype) if first is not None else _NONE, first.dim() if first is not None else _NONE,
        *dims,
    ]


def _describe(row: list[int]) -> str:
    kind = _KINDS[row[0]] if 0 <= row[0] < len(_KINDS) else f"op {row[0]}"
    if row[3] <= 0:
        return kind
    code = row[8]
    dtype = str(_DTYPES[code]).replace("torch.", "") if 0 <= code < len(_DTYPES) else f"dtype {code}"
    ndim = row[9]
    shape = ["*" if d == _NONE else str(d) for d in row[10 : 10 + min(ndim, _MAX_DIMS)]]
    where = "cuda" if row[4] == 1 else "cpu"
    extra = f" of {row[3]} tensors, the first" if row[3] > 1 else " of"
    return f"{kind}{extra} a {where} {dtype} tensor of shape [{', '.join(shape)}]"


def _differs(rows: list[list[int]]) -> str | None:
    first = rows[0]
    labels = {0: "the op", 1: "the reduction op", 2: "the root rank", 3: "the number of tensors", 4: "the device",
              8: "the dtype", 9: "the number of dimensions", 10: "the shape", 7: "the tensors' dtypes or shapes"}
    for i, row in enumerate(rows[1:], start=1):
        for k, label in labels.items():
            if (row[k:] != first[k:]) if k == 10 else (row[k] != first[k]):
                return f"{label} (rank 0: {_describe(first)}; rank {i}: {_describe(row)})"
        if _NONE not in (row[6], first[6]) and row[6] != first[6]:
            return f"the op's name (rank 0's and rank {i}'s differ: the ranks run their ops in different orders)"
    return None


def exchange(row: list[int], group: Any = None) -> list[list[int]]:
    """Every rank's row, in rank order (one all-gather)."""
    from raylight.worker.hvd.ops import collective

    n = dist.get_world_size(group)
    mine = torch.tensor(row, dtype=torch.int64)
    parts = [torch.empty_like(mine) for _ in range(n)]
    with collective():
        dist.all_gather(parts, mine, group=group)
    return [p.tolist() for p in parts]


def agree(spec: Op, where: str, refusal: Exception | None = None, group: Any = None) -> None:
    """All-gather ``spec``'s descriptor on ``group`` (default: the world) and raise, the
    same way on every rank, unless every rank runs the same op on matching tensors.
    ``refusal``: this rank's own objection to its input (raised here, after the others
    learned of it). Ranks inside ``hvd.join()`` take part in an allreduce of one tensor
    (with zeros); any other op raises on the ranks that have not joined."""
    if dist.get_world_size(group) == 1:
        if refusal is not None:
            raise refusal
        return
    rows = exchange(_row(spec, refusal is not None), group)
    if refusal is not None:
        raise refusal
    joined = [i for i, row in enumerate(rows) if row[0] == JOIN]
    if joined:
        if spec.kind != "allreduce" or len(spec.tensors) != 1 or group is not None:
            raise RuntimeError(
                f"{where}: rank {joined[0]} has called hvd.join(), so this {spec.kind} cannot run; while ranks "
                "have joined, only hvd.allreduce of one tensor on every rank runs (the joined ranks add zeros)"
            )
        rows = [row for row in rows if row[0] != JOIN]
    refused = [i for i, row in enumerate(rows) if row[5]]
    if refused:
        raise RuntimeError(
            f"{where}: rank {refused[0]} refused its input to this {spec.kind} (see that rank's error), so no "
            "rank ran it; every rank must pass valid, matching tensors"
        )
    diff = _differs(rows)
    if diff is not None:
        raise RuntimeError(
            f"{where}: the ranks disagree on {diff}. Every rank must run the same collectives in the same "
            "order on tensors of the same dtype and shape (docs/horovod.md); none of them ran this one"
        )


def join_row(waited: int, entered_ms: int) -> list[int]:
    """``hvd.join()``'s row: how many ops it has stood in for, and when it started."""
    return [JOIN, waited, entered_ms, 0, _NONE, 0, _NONE, 0, _NONE, _NONE, *([_NONE] * _MAX_DIMS)]


def stand_in(rows: list[list[int]]) -> tuple[torch.Tensor, int] | None:
    """For a rank inside ``hvd.join()``: the zeros and op to all-reduce with the ranks that
    have not joined, when they run an allreduce of one tensor that they agree on; None
    when they run anything else (they raise; the joined ranks wait on)."""
    active = [row for row in rows if row[0] != JOIN]
    if any(row[0] != _KINDS.index("allreduce") or row[3] != 1 or row[5] for row in active):
        return None
    if _differs(active) is not None or not 0 <= active[0][8] < len(_DTYPES):
        return None
    row = active[0]
    shape = row[10 : 10 + row[9]]
    return torch.zeros(shape, dtype=_DTYPES[row[8]]), row[1]
