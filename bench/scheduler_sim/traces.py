"""The Pollux evaluation inputs as the simulator reads them (bench/data/pollux/README.md).

An application is what one job type measured on the paper's testbed (16 nodes x 4 GPUs):

- ``placements.csv`` and ``scalability.csv``: seconds per optimizer step and its all-reduce
  part, per placement (GPUs per node, e.g. ``224``: three nodes with 2, 2 and 4) or per
  (nodes, replicas), and per atomic (per-GPU) batch size;
- ``validation-<M>.csv``: per epoch of a run at global batch M, the progress made by the
  epoch's end (in steps at the initial batch M0) and the gradient statistics
  (``grad_sqr`` = |G|^2, ``grad_var`` = the variance at M0) measured during it.

The truth the simulator runs on is these tables, interpolated: step times linearly in the
atomic batch for a measured placement (the order of the nodes does not matter here: every
measured ordering of the same GPUs-per-node counts is averaged), else linearly over
(nodes, replicas, atomic batch) from all measurements; gradient statistics linearly
between the two measured batch sizes around M.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent.parent / "data" / "pollux"

# Epochs to completion per application, and AdaptDL's per-GPU batch limits where the
# traces' own range is not the limit (yolov3: 8 per GPU fits in memory): the artifact's
# simulator settings (simulator/applications.py), so jobs are the paper's jobs.
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclass
class Application:
    name: str
    max_epochs: int
    validation: dict[int, dict[str, np.ndarray]]  # batch size -> column -> per-epoch values
    exact: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]]  # placement -> bsz, step, sync
    grouped: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]]  # (nodes, replicas) -> ...
    min_local_bsz: int
    max_local_bsz: int
    _memo: dict[tuple[tuple[int, ...], int], tuple[float, float]] = field(default_factory=dict)
    _points: np.ndarray | None = None
    _values: np.ndarray | None = None

    @property
    def init_batch_size(self) -> int:
        return min(self.validation)

    @property
    def max_batch_size(self) -> int:
        return max(self.validation)

    def progress_at(self, epoch: int) -> float:
        """Progress (steps at M0) needed to finish ``epoch`` epochs: the least any measured
        batch size needed, so a job at any batch size ends its epoch at the same progress."""
        if epoch <= 0:
            return 0.0
        return float(min(v["progress"][epoch - 1] for v in self.validation.values()))

    @property
    def total_progress(self) -> float:
        return self.progress_at(self.max_epochs)

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(|G|^2, variance at M0) during ``epoch`` at global batch ``batch_size``."""
        sizes = sorted(self.validation)
        b = min(max(batch_size, sizes[0]), sizes[-1])
        hi = next(s for s in sizes if s >= b)
        lo = max(s for s in sizes if s <= b)
        e = min(epoch, self.max_epochs - 1)
        sqr_lo, var_lo = self.validation[lo]["grad_sqr"][e], self.validation[lo]["grad_var"][e]
        if hi == lo:
            return float(sqr_lo), float(var_lo)
        w = (b - lo) / (hi - lo)
        sqr_hi, var_hi = self.validation[hi]["grad_sqr"][e], self.validation[hi]["grad_var"][e]
        return float((1 - w) * sqr_lo + w * sqr_hi), float((1 - w) * var_lo + w * var_hi)

    def step_time(self, placement: tuple[int, ...], atomic_bsz: int) -> tuple[float, float]:
        """(seconds per synchronising step, its all-reduce part) for GPUs-per-node
        ``placement`` at ``atomic_bsz`` per GPU."""
        key = (tuple(sorted(p for p in placement if p)), int(atomic_bsz))
        if key not in self._memo:
            self._memo[key] = self._interpolate(*key)
        return self._memo[key]

    def _interpolate(self, placement: tuple[int, ...], bsz: int) -> tuple[float, float]:
        table = self.exact.get(placement) or self.grouped.get((len(placement), sum(placement)))
        if table is not None:
            sizes, step, sync = table
            return float(np.interp(bsz, sizes, step)), float(np.interp(bsz, sizes, sync))
        from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator

        if self._points is None:
            pts, vals = [], []
            for (n, r), (sizes, step, sync) in self.grouped.items():
                for b, s, y in zip(sizes, step, sync, strict=True):
                    pts.append((n, r, b))
                    vals.append((s, y))
            self._points, self._values = np.array(pts, float), np.array(vals, float)
        assert self._values is not None
        q = np.array([[min(len(placement), 16), sum(placement), bsz]], float)
        out = LinearNDInterpolator(self._points, self._values)(q)[0]
        if not np.all(np.isfinite(out)):
            out = NearestNDInterpolator(self._points, self._values)(q)[0]
        return float(out[0]), float(out[1])


def _table(rows: dict[object, dict[int, list[tuple[float, float]]]]) -> dict:
    """Mean step and sync time per atomic batch size, sorted by batch size."""
    out = {}
    for key, by_bsz in rows.items():
        sizes = np.array(sorted(by_bsz), float)
        step = np.array([np.mean([s for s, _ in by_bsz[int(b)]]) for b in sizes])
        sync = np.array([np.mean([y for _, y in by_bsz[int(b)]]) for b in sizes])
        out[key] = (sizes, step, sync)
    return out


def load_application(name: str, data: Path = DATA) -> Application:
    root = data / "traces" / name
    validation = {}
    for path in root.glob("validation-*.csv"):
        rows = _rows(path)
        cols = {c: np.array([float(r[c]) for r in rows]) for c in ("progress", "grad_sqr", "grad_var")}
        validation[int(path.stem.split("-")[1])] = cols
    exact: dict = {}
    grouped: dict = {}
    local = []
    for r in _rows(root / "placements.csv"):
        placement = tuple(sorted(int(c) for c in r["placement"]))
        bsz, times = int(r["local_bsz"]), (float(r["step_time"]), float(r["sync_time"]))
        exact.setdefault(placement, {}).setdefault(bsz, []).append(times)
        grouped.setdefault((len(placement), sum(placement)), {}).setdefault(bsz, []).append(times)
        local.append(bsz)
    for r in _rows(root / "scalability.csv"):
        key = (int(r["num_nodes"]), int(r["num_replicas"]))
        times = (float(r["step_time"]), float(r["sync_time"]))
        grouped.setdefault(key, {}).setdefault(int(r["local_bsz"]), []).append(times)
    return Application(
        name=name,
        max_epochs=min(MAX_EPOCHS[name], min(len(v["progress"]) for v in validation.values())),
        validation=validation,
        exact=_table(exact),
        grouped=_table(grouped),
        min_local_bsz=min(local),
        max_local_bsz=MAX_LOCAL_BSZ.get(name, max(local)),
    )


@dataclass(frozen=True)
class Arrival:
    """One row of a workload: a job of ``application`` submitted at ``time`` (s), with the
    GPU count and batch size a user tuned it to (what fixed-size policies run it at)."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


def load_workload(path: Path) -> list[Arrival]:
    return sorted(
        (
            Arrival(r["name"], float(r["time"]), r["application"], int(r["num_replicas"]), int(r["batch_size"]))
            for r in _rows(path)
        ),
        key=lambda a: (a.time, a.name),
    )


def workload_paths(data: Path = DATA) -> list[Path]:
    return sorted((data / "workloads").glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1]))


def load_reference(policy: str, data: Path = DATA) -> dict:
    """The artifact's own results for ``policy`` (pollux, tiresias, optimus) on the 8
    workloads: JCT per job per workload, as AdaptDL's simulator measured them (quoted)."""
    return json.loads((data / "reference" / f"{policy}.json").read_text())
