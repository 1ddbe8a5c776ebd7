"""Reading tabular datasets: CSV, Parquet, JSON lines; local paths, globs, fsspec URIs."""

from __future__ import annotations

import fsspec
import pandas as pd

from raylight.exceptions import ConfigError

FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "json", ".json": "json"}


def dataset_format(path: str) -> str:
    lower = path.lower().rstrip("/")
    for suffix, fmt in FORMATS.items():
        if lower.endswith(suffix):
            return fmt
    raise ConfigError(
        f"dataset {path!r}: unknown format; use a file ending in .csv, .parquet or .jsonl"
    )


def expand(path: str) -> list[str]:
    """The files a path or glob names, as URIs fsspec can open; an error if none exist."""
    fs, _ = fsspec.core.url_to_fs(path)
    matches = fs.glob(path) if any(c in path for c in "*?[") else ([path] if fs.exists(path) else [])
    if not matches:
        raise ConfigError(f"dataset {path!r} does not exist (no file matches); check the path")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return sorted(matches)
    return sorted(m if "://" in m else f"{protocol}://{m}" for m in matches)


def read_pandas(path: str) -> pd.DataFrame:
    """Read all files of ``path`` into one DataFrame (the local backend)."""
    fmt = dataset_format(path)
    frames = []
    for uri in expand(path):
        with fsspec.open(uri, "rb") as f:
            if fmt == "csv":
                frames.append(pd.read_csv(f))
            elif fmt == "parquet":
                frames.append(pd.read_parquet(f))
            else:
                frames.append(pd.read_json(f, lines=True))
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(df) == 0:
        raise ConfigError(f"dataset {path!r} is empty: it has no rows")
    return df
