"""Cache of preprocessed data, keyed by the config's data-relevant parts and the dataset's
fingerprint (file names, sizes, modification times), on any fsspec URI.

A cache entry is ``<cache_dir>/<key>/{train,validation,test}.npz`` plus ``meta.json``,
written last as the commit marker, so a crash mid-write is never read back. The Ray Data
processor's entries (``layout="blocks"``, their own key) keep its blocks: one file per
block, ``<split>/block-NNNNN.npz``, listed in ``blocks.json``; they are written and read
back a block at a time, so the driver never holds a whole split.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import fsspec
import numpy as np

from raylight.declarative.config.model import ModelConfig
from raylight.declarative.dataset import expand
from raylight.storage.run_dir import write_committed

SPLITS = ("train", "validation", "test")


def cache_key(config: ModelConfig, dataset: str, *, layout: str = "arrays") -> str:
    relevant = {
        "inputs": [f.model_dump(mode="json") for f in config.input_features],
        "outputs": [f.model_dump(mode="json") for f in config.output_features],
        "split": config.preprocessing.split.model_dump(mode="json"),
        "seed": config.trainer.seed,
        "format": 1,
        **({"sample": [config.preprocessing.sample_ratio, config.preprocessing.sample_size]} if config.preprocessing.sampling else {}),
        **(
            {"balance": [config.preprocessing.oversample_minority, config.preprocessing.undersample_majority]}
            if config.preprocessing.balancing
            else {}
        ),
        **({"layout": layout} if layout != "arrays" else {}),
    }
    files = []
    for uri in expand(dataset):
        fs, path = fsspec.core.url_to_fs(uri)
        info = fs.info(path)
        files.append([uri, info.get("size"), str(info.get("mtime", info.get("LastModified", "")))])
    blob = json.dumps({"config": relevant, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _read_npz(fs: Any, path: str) -> dict[str, np.ndarray]:
    with fs.open(path, "rb") as f:
        data = np.load(io.BytesIO(f.read()), allow_pickle=False)
        try:
            return {k: data[k] for k in data.files}
        except ValueError as exc:  # an object array: a pickle, never loaded
            from raylight.base.exceptions import ConfigError

            raise ConfigError(
                f"the preprocessing cache file {path} holds Python objects ({exc}); raylight writes "
                "only numeric and string arrays there and never unpickles them. Delete that cache "
                "entry (its directory) or give another cache directory, and preprocessing runs again."
            ) from None


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def load(cache_dir: str, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(meta, splits), or None on a miss. Block entries come back as ``BlockRefs`` (each
    block put into the object store as it is read)."""
    fs, root = fsspec.core.url_to_fs(cache_dir.rstrip("/") + "/" + key)
    if not fs.exists(f"{root}/meta.json"):
        return None
    with fs.open(f"{root}/meta.json", "r") as f:
        meta = json.load(f)
    splits: dict[str, Any] = {}
    if fs.exists(f"{root}/blocks.json"):
        import ray

        from raylight.declarative.ray_data import BlockRefs

        with fs.open(f"{root}/blocks.json", "r") as f:
            layout = json.load(f)
        for split in SPLITS:
            lengths = layout.get(split)
            splits[split] = None if not lengths else BlockRefs(
                [ray.put(_read_npz(fs, f"{root}/{split}/block-{i:05d}.npz")) for i in range(len(lengths))],
                list(lengths),
            )
        return meta, splits
    for split in SPLITS:
        path = f"{root}/{split}.npz"
        if not fs.exists(path):
            splits[split] = None
            continue
        splits[split] = _read_npz(fs, path)
    return meta, splits


def save(cache_dir: str, key: str, meta: dict[str, Any], splits: dict[str, Any]) -> None:
    """Write an entry, ``meta.json`` last (the commit marker): arrays as one file per
    split, ``BlockRefs`` one block at a time."""
    from raylight.declarative.ray_data import BlockRefs

    fs, root = fsspec.core.url_to_fs(cache_dir.rstrip("/") + "/" + key)

    def files():
        layout: dict[str, list[int]] = {}
        for split, data in splits.items():
            if data is None:
                continue
            if isinstance(data, BlockRefs):
                import ray

                for i, block in enumerate(data.blocks):
                    yield f"{split}/block-{i:05d}.npz", _npz_bytes(ray.get(block))
                layout[split] = list(data.lengths)
            else:
                yield f"{split}.npz", _npz_bytes(data)
        if layout:
            yield "blocks.json", json.dumps(layout).encode()

    write_committed(fs, root, files(), ("meta.json", json.dumps(meta).encode()))
