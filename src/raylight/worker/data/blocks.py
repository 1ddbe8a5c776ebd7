"""A dataset held as blocks (Ray object references or in-memory arrays), read block by block.

Larger-than-memory training data stays in Ray's object store (spilled to disk when it
does not fit); a worker holds only the blocks it is reading, at most ``cache_blocks`` of
them, fetched zero-copy on its node. Each block is a dict of equally long arrays.

With ``shuffle`` an epoch's order permutes the blocks, then the rows within each block,
seeded with ``seed + epoch`` and the same on every rank. The loader hands out contiguous
slices of that order, so a rank reads at most two blocks per micro-batch and never the
whole dataset; position, restart and resize semantics are the loader's (no sample of an
epoch repeated or skipped). The shuffle is therefore block-local: rows from different
blocks never meet in one batch unless the blocks are adjacent in the epoch's order.
Ray Data's preprocessing shuffles all rows once before splitting, which mixes blocks.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset


def _ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref)


class BlockDataset(Dataset):
    """Rows of a sequence of blocks, as dicts of tensors, fetched a block at a time."""

    def __init__(
        self,
        blocks: Sequence[Any],
        lengths: Sequence[int],
        *,
        cache_blocks: int = 2,
        fetch: Callable[[Any], dict[str, np.ndarray]] | None = None,
    ) -> None:
        if len(blocks) != len(lengths):
            raise ValueError(f"{len(blocks)} blocks but {len(lengths)} lengths")
        if cache_blocks < 1:
            raise ValueError(f"cache_blocks must be at least 1, got {cache_blocks}")
        keep = [i for i, n in enumerate(lengths) if n > 0]
        self.blocks = [blocks[i] for i in keep]
        self.lengths = [int(lengths[i]) for i in keep]
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64).tolist()
        self.cache_blocks = cache_blocks
        self._fetch = fetch
        self._cache: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self.fetches = 0  # blocks fetched so far (a block evicted and read again counts twice)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": OrderedDict(), "fetches": 0}

    def __len__(self) -> int:
        return self.offsets[-1]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def epoch_order(self, *, shuffle: bool, seed: int, epoch: int) -> torch.Tensor:
        """Sample indices of one epoch: blocks permuted, then rows within each block."""
        if not shuffle:
            return torch.arange(len(self))
        gen = torch.Generator().manual_seed(seed + epoch)
        parts = [
            self.offsets[b] + torch.randperm(self.lengths[b], generator=gen)
            for b in torch.randperm(self.num_blocks, generator=gen).tolist()
        ]
        return torch.cat(parts) if parts else torch.arange(0)

    def block(self, b: int) -> dict[str, np.ndarray]:
        if b in self._cache:
            self._cache.move_to_end(b)
            return self._cache[b]
        arrays = (self._fetch or _ray_get)(self.blocks[b])
        self.fetches += 1
        self._cache[b] = arrays
        while len(self._cache) > self.cache_blocks:
            self._cache.popitem(last=False)
        return arrays

    @property
    def cached(self) -> list[int]:
        return list(self._cache)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} rows")
        b = bisect.bisect_right(self.offsets, i) - 1
        j = i - self.offsets[b]
        # A copy: blocks from the object store are read-only, which torch warns about.
        return {k: torch.from_numpy(np.array(v[j])) for k, v in self.block(b).items()}

    def get_batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Rows ``indices`` as one dict of stacked tensors, in that order: what
        ``default_collate`` makes of ``[self[i] for i in indices]``, read a block at a time."""
        if not indices:
            raise IndexError("get_batch needs at least one index")
        idx = np.asarray(indices, dtype=np.int64)
        if idx.min() < 0 or idx.max() >= len(self):
            bad = idx[(idx < 0) | (idx >= len(self))][0]
            raise IndexError(f"index {bad} out of range for {len(self)} rows")
        which = np.searchsorted(self.offsets, idx, side="right") - 1
        cuts = np.flatnonzero(np.diff(which)) + 1
        parts: dict[str, list[np.ndarray]] = {}
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(idx)], strict=True):
            b = int(which[lo])
            for k, v in self.block(b).items():
                parts.setdefault(k, []).append(v[idx[lo:hi] - self.offsets[b]])
        # np.concatenate copies: blocks from the object store are read-only.
        return {k: torch.from_numpy(np.concatenate(v)) for k, v in parts.items()}

    def iter_blocks(self) -> Any:
        """Every block in order, one at a time (for streaming evaluation)."""
        for b in range(self.num_blocks):
            yield self.block(b)
