"""Which engine preprocesses a run: pandas in the driver, or Ray Data (the rule, pure).

Preprocessing cost should grow with the data, not with Ray's scheduling: data that fits
in the driver's memory is preprocessed there with pandas and numpy, the local backend's
code path (so both backends see the same arrays), in a second for tens of thousands of
rows where Ray Data tasks take seconds to schedule. Data estimated larger than
``backend.processor.in_memory_limit_mb`` goes to Ray Data, which streams it through the
object store. ``backend.processor.type`` overrides the rule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import fsspec

from raylight.declarative.config.backend import ProcessorConfig
from raylight.declarative.dataset import dataset_format, expand

log = logging.getLogger("raylight")

# Bytes a pandas DataFrame takes per byte of the file, roughly (numbers as float64 take
# about what their text does, strings become Python objects; Parquet is compressed).
IN_MEMORY_FACTOR = {"csv": 2.0, "json": 1.5, "parquet": 5.0}
AUTO_LIMIT_SHARE = 0.25  # in_memory_limit_mb: auto is this share of the available memory
MB = 1024**2


@dataclass(frozen=True)
class Choice:
    processor: str  # "pandas" or "ray_data"
    reason: str


def estimated_memory(dataset: str) -> int:
    """Bytes the dataset is expected to take as a pandas DataFrame: its files' sizes
    (fsspec: local paths, globs, any URI) times the format's factor."""
    total = 0
    for uri in expand(dataset):
        fs, path = fsspec.core.url_to_fs(uri)
        total += int(fs.info(path).get("size") or 0)
    return int(total * IN_MEMORY_FACTOR[dataset_format(dataset)])


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def memory_limit(setting: int | str, available: int) -> int:
    """The in-memory limit in bytes: ``setting`` MB, or for ``auto`` a quarter of
    ``available``."""
    return int(available * AUTO_LIMIT_SHARE) if setting == "auto" else int(setting) * MB


def choose(config: ProcessorConfig, backend: str, estimated: int, limit: int) -> Choice:
    """The engine for a run on ``backend`` ("local", "launcher" or "ray") of a dataset estimated at
    ``estimated`` bytes in memory, with an in-memory limit of ``limit`` bytes."""
    kind = config.type
    if backend in ("local", "launcher"):  # a launcher's ranks each preprocess as the local backend does
        how = "the local backend preprocesses" if backend == "local" else "under a launcher every rank preprocesses"
        if kind in ("ray_data", "dask"):
            return Choice("pandas", f"backend.processor.type {kind} needs the ray backend; {how} with pandas")
        return Choice("pandas", f"{how} with pandas")
    if kind == "dask":
        return Choice("ray_data", "backend.processor.type dask (Ludwig's Dask on Ray) runs on Ray Data")
    if kind in ("pandas", "ray_data"):
        return Choice(kind, f"backend.processor.type is {kind}")
    size = f"about {estimated / MB:,.0f} MB in memory"
    if estimated <= limit:
        return Choice("pandas", f"the dataset ({size}) fits within backend.processor.in_memory_limit_mb ({limit / MB:,.0f} MB): pandas in the driver")
    return Choice("ray_data", f"the dataset ({size}) exceeds backend.processor.in_memory_limit_mb ({limit / MB:,.0f} MB): Ray Data")


def resolve(config: ProcessorConfig, backend: str, dataset: str) -> Choice:
    """``choose`` for ``dataset`` on this driver; says the choice once in the log (a
    warning where a setting is not followed)."""
    if backend == "ray" and config.type == "auto":
        choice = choose(config, backend, estimated_memory(dataset), memory_limit(config.in_memory_limit_mb, available_memory()))
    else:
        choice = choose(config, backend, 0, 0)
    if config.type == "dask" or (backend != "ray" and config.type == "ray_data"):
        log.warning("%s", choice.reason)  # a setting read differently than a Ludwig user may expect
    else:
        log.info("preprocessing: %s", choice.reason)
    return choice
