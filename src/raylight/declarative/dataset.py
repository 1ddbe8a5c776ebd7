"""Reading tabular datasets: CSV, Parquet, JSON lines; local paths, globs, fsspec URIs.

Every way a file can be unreadable (missing, a directory, permissions, not UTF-8,
ragged rows, corrupt Parquet, malformed JSON, no rows) is a ``ConfigError`` that names
the file and what to do.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pandas as pd

from raylight.base.exceptions import ConfigError

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
    fmt = dataset_format(path)
    files = []
    for match in matches:
        if not fs.isdir(match):
            files.append(match)
            continue
        inside = sorted(fs.glob(f"{match.rstrip('/')}/*.parquet")) if fmt == "parquet" else []
        if not inside:  # a directory of Parquet parts (Spark, Ray Data) is read whole
            raise ConfigError(
                f"dataset {match!r} is a directory; pass a file, or a glob of files such as "
                f"'{match.rstrip('/')}/*.{'jsonl' if fmt == 'json' else fmt}'"
            )
        files += inside
    matches = files
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return sorted(matches)
    return sorted(m if "://" in m else f"{protocol}://{m}" for m in matches)


def dataset_directory(path: str) -> str:
    """The directory where the relative file paths a dataset holds (an image column's)
    start: its file's (a glob's), as Ludwig's; a URI's parent for one on object storage."""
    if "://" in path and not path.startswith("file://"):
        return path.rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(path.removeprefix("file://")))


def read_fix(fmt: str) -> str:
    """What a file of ``fmt`` must be (the end of a read error)."""
    return {
        "csv": "it must be UTF-8 CSV with a header row and the same number of fields on every row",
        "parquet": "it must be a Parquet file (written by pandas, pyarrow, Spark, ...)",
        "json": "it must hold one JSON object per line (JSON lines)",
    }[fmt]


# Parquet extension types whose values are pickles: Ray Data registers this one with pyarrow
# when imported, after which reading such a column (pandas' reader too) unpickles each value.
PICKLED_EXTENSIONS = ("ray.data.arrow_pickled_object",)


def refuse_pickled_columns(uri: str, f: Any) -> None:
    """A ConfigError naming the file and the column when the Parquet file ``f`` holds a
    column of pickled Python objects: reading it would run code the file chooses. Reads the
    schema only (the footer), then rewinds ``f``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def pickled(kind: Any) -> bool:
        if isinstance(kind, pa.BaseExtensionType) and (
            kind.extension_name in PICKLED_EXTENSIONS or "pickle" in kind.extension_name.lower()
        ):
            return True
        return any(pickled(kind.field(i).type) for i in range(kind.num_fields)) or pickled_value(kind)

    def pickled_value(kind: Any) -> bool:
        inner = getattr(kind, "value_type", None)
        return inner is not None and pickled(inner)

    try:
        schema = pq.read_schema(f)
    finally:
        f.seek(0)
    for field in schema:
        if pickled(field.type):
            raise ConfigError(
                f"dataset {uri!r}: column {field.name!r} holds pickled Python objects ({field.type}); "
                "reading it would run code the file chooses, so raylight does not. Save that column "
                "as plain values (numbers, strings, lists of them)"
            )


def _read_one(uri: str, fmt: str) -> pd.DataFrame:
    import pyarrow

    try:
        with fsspec.open(uri, "rb") as f:
            if fmt == "csv":
                return pd.read_csv(f, encoding="utf-8")
            if fmt == "parquet":
                refuse_pickled_columns(uri, f)
                return pd.read_parquet(f)
            frame = pd.read_json(f, lines=True)
            return frame if isinstance(frame, pd.DataFrame) else pd.DataFrame(frame)
    except PermissionError:
        raise ConfigError(f"dataset {uri!r} cannot be read: permission denied") from None
    except pd.errors.EmptyDataError:
        raise ConfigError(f"dataset {uri!r} is empty: it has no header and no rows") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"dataset {uri!r} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except (pd.errors.ParserError, pyarrow.ArrowException, ValueError, OSError) as exc:
        problem = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConfigError(f"dataset {uri!r} cannot be read as {fmt}: {problem}; {read_fix(fmt)}") from None


def read_pandas(path: str) -> pd.DataFrame:
    """Read all files of ``path`` into one DataFrame (the local backend)."""
    fmt = dataset_format(path)
    frames = [_read_one(uri, fmt) for uri in expand(path)]
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if len(df) == 0:
        raise ConfigError(f"dataset {path!r} is empty: it has no rows")
    df.columns = [str(c) for c in df.columns]
    return df
