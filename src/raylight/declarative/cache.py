"""Cache of preprocessed data, keyed by the config's data-relevant parts and the dataset's
fingerprint (file names, sizes, modification times), on any fsspec URI.

A cache entry is ``<cache_dir>/<key>/{train,validation,test}.npz`` plus ``meta.json``,
written last as the commit marker, so a crash mid-write is never read back.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import fsspec
import numpy as np

from raylight.config.declarative import ModelConfig
from raylight.declarative.dataset import expand

SPLITS = ("train", "validation", "test")


def cache_key(config: ModelConfig, dataset: str) -> str:
    relevant = {
        "inputs": [f.model_dump(mode="json") for f in config.input_features],
        "outputs": [f.model_dump(mode="json") for f in config.output_features],
        "split": config.preprocessing.split.model_dump(mode="json"),
        "seed": config.trainer.seed,
        "format": 1,
    }
    files = []
    for uri in expand(dataset):
        fs, path = fsspec.core.url_to_fs(uri)
        info = fs.info(path)
        files.append([uri, info.get("size"), str(info.get("mtime", info.get("LastModified", "")))])
    blob = json.dumps({"config": relevant, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load(cache_dir: str, key: str) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray] | None]] | None:
    fs, root = fsspec.core.url_to_fs(cache_dir.rstrip("/") + "/" + key)
    if not fs.exists(f"{root}/meta.json"):
        return None
    with fs.open(f"{root}/meta.json", "r") as f:
        meta = json.load(f)
    splits: dict[str, dict[str, np.ndarray] | None] = {}
    for split in SPLITS:
        path = f"{root}/{split}.npz"
        if not fs.exists(path):
            splits[split] = None
            continue
        with fs.open(path, "rb") as f:
            data = np.load(io.BytesIO(f.read()), allow_pickle=False)
            splits[split] = {k: data[k] for k in data.files}
    return meta, splits


def save(cache_dir: str, key: str, meta: dict[str, Any], splits: dict[str, dict[str, np.ndarray] | None]) -> None:
    fs, root = fsspec.core.url_to_fs(cache_dir.rstrip("/") + "/" + key)
    fs.makedirs(root, exist_ok=True)
    for split, arrays in splits.items():
        if arrays is None:
            continue
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        with fs.open(f"{root}/{split}.npz", "wb") as f:
            f.write(buf.getvalue())
    with fs.open(f"{root}/meta.json", "w") as f:  # the commit marker, last
        json.dump(meta, f)
