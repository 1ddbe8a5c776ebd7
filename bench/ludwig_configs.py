"""Ludwig's own configs (issue 56): how many of tests/declarative/ludwig_configs/ load, and
how many of those train as written, end to end, on generated data.

Run:  python bench/ludwig_configs.py [--epochs 2]
      RAYLIGHT_BENCH_LUDWIG=/path/to/python3.12 python bench/ludwig_configs.py --against-ludwig

Each config is loaded as it is. One that loads is trained on the local backend (no Ray)
with only ``trainer.epochs`` capped (``--epochs``, so that a config written for 1,000
epochs finishes) and ``backend`` dropped (Ray's is measured elsewhere); every other key as
written, on 240 generated rows whose columns follow the features' types (PNG images
written beside the CSV for image inputs). A config trains if ``api.train`` returns a
test evaluation. Writes bench/results/ludwig_configs.json: per config, loaded / trained
and the first line of the error where it did not.

``--against-ludwig`` (issue 56's "held-out metrics within 1 point of Ludwig's at <= 0.5x
its time"): the tabular configs (every input and output binary, category, number, set or
vector), each on a generated dataset with a signal (``signal_dataset``: every target a
fixed random function of the inputs, plus noise) and one fixed split column (70% train,
10% validation, 20% held out; ``preprocessing.split: {type: fixed}``). The config as
written, with the same changes for both systems (``comparable``): epochs capped at
``--epochs``, a batch size where it has none (or ``auto``), ``backend: local``. raylight's
``raylight train`` and Ludwig 0.17's ``ludwig experiment`` (bench/common.py's runner: its
own interpreter, ``RAYLIGHT_BENCH_LUDWIG``) run it, each a process timed from launch to
exit; the held-out metric of each output is each system's own evaluation of the held-out
rows (accuracy for binary and category outputs, Ludwig's ``accuracy_micro`` for category;
RMSE and MAE for number, and R^2 from RMSE and the held-out target's variance). Points:
100 x accuracy, or 100 x R^2 for a number output. Ludwig runs only where raylight trained.
Writes bench/results/ludwig_vs_ludwig.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bench.common import (
    ludwig_available,
    ludwig_env,
    ludwig_python,
    machine_info,
    run_timed,
    write_results,
)

from raylight.declarative import api
from raylight.declarative.loading import load_config, load_yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "declarative" / "ludwig_configs"
RESULTS = REPO / "bench" / "results" / "ludwig_configs.json"
AGAINST = REPO / "bench" / "results" / "ludwig_vs_ludwig.json"
TABULAR = frozenset({"binary", "category", "number", "set", "vector"})
SPLIT = "bench_split"  # the fixed split's column: 0 train, 1 validation, 2 held out
DEFAULT_BATCH = 128  # where a config names no batch size (Ludwig 0.17's default, auto, searches for one)
WORDS = np.array(["alpha", "beta", "gamma", "delta", "eps"])


def _series(rng: np.random.Generator, rows: int, length: int) -> list[str]:
    return [" ".join(f"{v:.3f}" for v in rng.normal(size=length)) for _ in range(rows)]


def _images(directory: Path, rows: int, rng: np.random.Generator) -> list[str]:
    from PIL import Image

    (directory / "images").mkdir(exist_ok=True)
    paths = []
    for i in range(rows):
        path = f"images/{i:04d}.png"
        Image.fromarray(rng.integers(0, 256, (12, 12, 3)).astype(np.uint8)).save(directory / path)
        paths.append(path)
    return paths


def _column(kind: str, rows: int, rng: np.random.Generator, directory: Path) -> Any:
    if kind == "number":
        return rng.normal(size=rows)
    if kind == "binary":
        return rng.integers(0, 2, size=rows).astype(bool)
    if kind == "anomaly":  # Ludwig's labels: 0 normal, 1 anomaly (one in ten)
        return (rng.uniform(size=rows) < 0.1).astype(int)
    if kind == "category":
        return rng.choice(["red", "green", "blue"], size=rows)
    if kind in ("set", "bag", "text", "sequence"):
        return [" ".join(rng.choice(WORDS, size=3)) for _ in range(rows)]
    if kind == "date":
        return pd.date_range("2020-01-01", periods=rows, freq="D").strftime("%Y-%m-%d")
    if kind in ("timeseries", "vector"):
        return _series(rng, rows, 6)
    if kind == "image":
        return _images(directory, rows, rng)
    raise ValueError(f"no generator for the {kind} type")


def dataset(raw: dict[str, Any], directory: Path, rows: int = 240) -> str:
    """A CSV of ``rows`` generated rows for the config's columns (split columns too)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(index=range(rows))
    for feature in [*raw.get("input_features", []), *raw.get("output_features", [])]:
        frame[feature.get("column", feature["name"])] = _column(feature["type"], rows, rng, directory)
    split = (raw.get("preprocessing") or {}).get("split") or {}
    if split.get("column") and split["column"] not in frame:
        frame[split["column"]] = pd.date_range("2020-01-01", periods=rows, freq="D").strftime("%Y-%m-%d")
    if split.get("type") == "fixed" and not split.get("column"):  # Ludwig's split column: 0 train, 1 validation, 2 test
        frame["split"] = np.resize([0] * 7 + [1, 2, 2], rows)
    path = directory / "data.csv"
    frame.to_csv(path, index=False)
    return str(path)


def run_one(path: Path, epochs: int) -> dict[str, Any]:
    record: dict[str, Any] = {"loaded": False, "trained": False}
    try:
        load_config(str(path))
    except Exception as exc:
        record["error"] = str(exc).splitlines()[0] + " " + (str(exc).splitlines()[1:2] or [""])[0].strip()
        return record
    record["loaded"] = True
    raw = load_yaml(str(path))
    written = int((raw.get("trainer") or {}).get("epochs", 100))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            config = load_config(str(path), [f"trainer.epochs={min(written, epochs)}", "backend=null"])
            data = dataset(raw, Path(tmp))
            out = api.train(config, data, output_directory=str(Path(tmp) / "run"), backend="local", progress=False)
            record["trained"] = "test" in out["evaluation"]
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            record["traceback"] = traceback.format_exc().splitlines()[-3:]
    return record


# -- --against-ludwig ------------------------------------------------------------------


def tabular(raw: dict[str, Any]) -> bool:
    kinds = {f["type"] for f in [*raw.get("input_features", []), *raw.get("output_features", [])]}
    return bool(kinds) and kinds <= TABULAR


def _signal_input(kind: str, rows: int, rng: np.random.Generator) -> tuple[Any, np.ndarray]:
    """A column of ``kind`` and its numeric value (about unit variance) for the targets."""
    if kind == "number":
        x = rng.normal(size=rows)
        return x, x
    if kind == "binary":
        b = rng.integers(0, 2, size=rows).astype(bool)
        return b, 2.0 * b - 1.0
    if kind == "category":
        levels = np.array([f"c{i}" for i in range(5)])
        idx = rng.integers(0, 5, size=rows)
        return levels[idx], rng.normal(size=5)[idx]
    if kind == "set":
        words = np.array([*WORDS, "zeta", "eta", "theta"])
        value = dict(zip(words, rng.normal(size=len(words)), strict=True))
        cells = [rng.choice(words, size=3, replace=False) for _ in range(rows)]
        return [" ".join(c) for c in cells], np.array([sum(value[w] for w in c) / np.sqrt(3) for c in cells])
    v = rng.normal(size=(rows, 6))  # vector
    return [" ".join(f"{x:.4f}" for x in row) for row in v], v @ rng.normal(size=6) / np.sqrt(6)


def _target(kind: str, score: np.ndarray) -> Any:
    if kind == "binary":
        return score > np.median(score)
    if kind == "category":
        return np.array(["low", "mid", "high"])[np.digitize(score, np.quantile(score, [1 / 3, 2 / 3]))]
    if kind == "number":
        return score
    raise ValueError(f"no generated target for a {kind} output")


def signal_dataset(raw: dict[str, Any], directory: Path, rows: int, seed: int = 0) -> tuple[str, dict[str, float]]:
    """A CSV whose targets are a fixed random function of its inputs (a linear score, a
    product of two more, noise at 0.3 of the signal's spread), with the fixed split
    column; and each number target's held-out variance (for R^2)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(index=range(rows))
    values = []
    for feature in raw.get("input_features", []):
        column, value = _signal_input(feature["type"], rows, rng)
        frame[feature.get("column", feature["name"])] = column
        values.append(value)
    x = np.stack(values, axis=1)
    variances = {}
    split = rng.choice([0, 1, 2], size=rows, p=[0.7, 0.1, 0.2])
    for feature in raw.get("output_features", []):
        w = rng.normal(size=(3, x.shape[1]))
        lin = x @ w.T / np.sqrt(x.shape[1])
        score = lin[:, 0] + 0.5 * lin[:, 1] * lin[:, 2]
        score = (score - score.mean()) / score.std() + rng.normal(scale=0.3, size=rows)
        frame[feature.get("column", feature["name"])] = _target(feature["type"], score)
        if feature["type"] == "number":
            variances[feature["name"]] = float(np.var(score[split == 2]))
    frame[SPLIT] = split
    path = directory / "data.csv"
    frame.to_csv(path, index=False)
    return str(path), variances


def comparable(raw: dict[str, Any], epochs: int) -> dict[str, Any]:
    """The config as written with what both systems get changed alike (module docstring)."""
    import copy

    cfg = copy.deepcopy(raw)
    trainer = cfg.setdefault("trainer", {}) or {}
    cfg["trainer"] = trainer
    trainer["epochs"] = min(int(trainer.get("epochs", 100)), epochs)
    if trainer.get("batch_size") in (None, "auto"):
        trainer["batch_size"] = DEFAULT_BATCH
    prep = cfg.setdefault("preprocessing", {}) or {}
    cfg["preprocessing"] = prep
    prep["split"] = {"type": "fixed", "column": SPLIT}
    cfg["backend"] = {"type": "local"}
    cfg.pop("hyperopt", None)  # a search is not one training run
    return cfg


def _points(kind: str, metrics: dict[str, float], variance: float | None) -> float | None:
    if kind in ("binary", "category"):
        return 100 * metrics["accuracy"] if metrics.get("accuracy") is not None else None
    if kind == "number" and metrics.get("rmse") is not None and variance:
        return 100 * (1 - metrics["rmse"] ** 2 / variance)
    return None


def _raylight_metrics(evaluation: dict[str, Any], outputs: dict[str, str]) -> dict[str, dict[str, float]]:
    test = evaluation["test"]
    keys = ("accuracy", "rmse", "mae")
    if len(outputs) == 1:
        return {next(iter(outputs)): {k: test[k] for k in keys if k in test}}
    return {name: {k: test[f"{name}/{k}"] for k in keys if f"{name}/{k}" in test} for name in outputs}


def _ludwig_metrics(stats: dict[str, Any], outputs: dict[str, str]) -> dict[str, dict[str, float]]:
    found = {}
    for name, kind in outputs.items():
        s = stats[name]
        if kind == "category":  # 0.17's `accuracy` is macro-averaged; `accuracy_micro` is the usual one
            found[name] = {"accuracy": s["accuracy_micro"]}
        elif kind == "binary":
            found[name] = {"accuracy": s["accuracy"]}
        else:
            found[name] = {"rmse": s["root_mean_squared_error"], "mae": s["mean_absolute_error"]}
    return found


def _run_raylight_cli(cfg: str, data: str, work: Path) -> dict[str, Any]:
    import os
    import sys

    out = work / "raylight"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "raylight.cli", "train", "--config", cfg, "--dataset", data,
           "--output-directory", str(out), "--quiet", "--backend", "local"]
    res, wall, _ = run_timed(cmd, timeout=1800, env=env, marker=str(work))
    if res.returncode != 0:
        return {"ok": False, "wall_s": wall, "error": (res.stderr or res.stdout).strip().splitlines()[-1:]}
    return {"ok": True, "wall_s": wall, "evaluation": json.loads((out / "evaluation.json").read_text())}


def _run_ludwig_experiment(python: str, cfg: str, data: str, work: Path) -> dict[str, Any]:
    out = work / "ludwig"
    cmd = [python, "-m", "ludwig.cli", "experiment", "--config", cfg, "--dataset", data, "--output_directory", str(out),
           "--backend", "local", "--skip_save_processed_input", "--skip_save_predictions"]
    res, wall, left = run_timed(cmd, timeout=1800, env=ludwig_env(), marker=str(work), cwd=work)
    if res.returncode != 0:
        return {"ok": False, "wall_s": wall, "error": (res.stderr or res.stdout).strip().splitlines()[-3:]}
    stats = next(out.rglob("test_statistics.json"))
    return {"ok": True, "wall_s": wall, "stats": json.loads(stats.read_text()), "leftover_pids": left}


def against_one(path: Path, python: str, epochs: int, rows: int) -> dict[str, Any]:
    import yaml

    raw = load_yaml(str(path))
    outputs = {f["name"]: f["type"] for f in raw["output_features"]}
    cfg = comparable(raw, epochs)
    record: dict[str, Any] = {"epochs": cfg["trainer"]["epochs"], "batch_size": cfg["trainer"]["batch_size"],
                              "outputs": outputs}
    with tempfile.TemporaryDirectory(prefix="bench-lvl-") as tmp:
        work = Path(tmp)
        data, variances = signal_dataset(raw, work, rows)
        cfg_path = work / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        ours = _run_raylight_cli(str(cfg_path), data, work)
        record["raylight"] = {k: v for k, v in ours.items() if k != "evaluation"}
        if not ours["ok"]:
            return record
        record["raylight"]["metrics"] = _raylight_metrics(ours["evaluation"], outputs)
        theirs = _run_ludwig_experiment(python, str(cfg_path), data, work)
        record["ludwig"] = {k: v for k, v in theirs.items() if k != "stats"}
        if not theirs["ok"]:
            return record
        record["ludwig"]["metrics"] = _ludwig_metrics(theirs["stats"], outputs)
    per_output = {}
    for name, kind in outputs.items():
        a = _points(kind, record["raylight"]["metrics"][name], variances.get(name))
        b = _points(kind, record["ludwig"]["metrics"][name], variances.get(name))
        per_output[name] = {"raylight_points": a, "ludwig_points": b,
                            "points_behind": None if a is None or b is None else b - a}
    record["points"] = per_output
    behind = [o["points_behind"] for o in per_output.values()]
    record["within_1_point"] = all(d is not None and d <= 1.0 for d in behind)
    record["time_ratio"] = record["raylight"]["wall_s"] / record["ludwig"]["wall_s"]
    return record


def against_ludwig(args: argparse.Namespace) -> None:
    python = ludwig_python(args.ludwig_python)
    why_not = ludwig_available(python)
    if why_not is not None:
        raise SystemExit(f"--against-ludwig: {why_not}")
    every = [p for p in sorted(CONFIGS.glob("*.yaml")) if tabular(load_yaml(str(p)))]
    by_name = {p.stem: p for p in every}
    unknown = [n for n in args.only.split(",") if n and n not in by_name]
    if unknown:
        raise SystemExit(f"--only {','.join(unknown)}: not tabular configs of {CONFIGS}; these are: {', '.join(by_name)}")
    paths = [by_name[n] for n in args.only.split(",") if n] or every  # in --only's order
    info = machine_info()
    info["ludwig"] = subprocess.run([python, "-c", "import ludwig; print(ludwig.__version__)"], capture_output=True,
                                    text=True, timeout=600).stdout.strip()
    configs: dict[str, Any] = {}
    if args.resume_results and AGAINST.exists():  # keep what an earlier run measured; measure the rest
        configs = json.loads(AGAINST.read_text())["configs"]
        paths = [p for p in paths if p.stem not in configs]
    for p in paths:  # the results are written after each config: a run cut short keeps what it measured
        configs[p.stem] = against_one(p, python, args.epochs, args.rows)
        r = configs[p.stem]
        print(p.stem, r.get("points"), f"time ratio {r.get('time_ratio', float('nan')):.2f}", flush=True)
        summary = _against_summary(args, every, configs)
        write_results(AGAINST, {"summary": summary, "configs": configs, "machine": info})
    print(json.dumps(_against_summary(args, every, configs), indent=1))


def _against_summary(args: argparse.Namespace, paths: list[Path], configs: dict[str, Any]) -> dict[str, Any]:
    import statistics

    compared = [r for r in configs.values() if "time_ratio" in r]
    return {
        "tabular_configs": len(paths), "run": len(configs), "raylight_trained": sum(r["raylight"]["ok"] for r in configs.values()),
        "compared": len(compared), "within_1_point": sum(r["within_1_point"] for r in compared),
        "time_ratio_median": statistics.median(r["time_ratio"] for r in compared) if compared else None,
        "goal": "held-out metric within 1 point of Ludwig's (100 x accuracy, 100 x R^2) at <= 0.5x its wall time",
        "epochs_cap": args.epochs, "rows": args.rows, "split": "fixed column: 70% train, 10% validation, 20% held out",
        "not_trained_by_raylight": sorted(n for n, r in configs.items() if not r["raylight"]["ok"]),
        "tabular": sorted(p.stem for p in paths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=None, help="at most this many epochs per config (default 2; 10 against Ludwig)")
    parser.add_argument("--against-ludwig", action="store_true", help="the tabular configs, raylight against Ludwig 0.17")
    parser.add_argument("--ludwig-python", default=None, help="an interpreter with Ludwig (default: $RAYLIGHT_BENCH_LUDWIG)")
    parser.add_argument("--rows", type=int, default=5000, help="--against-ludwig: generated rows per config")
    parser.add_argument("--only", default="", help="--against-ludwig: these configs only (comma-separated names)")
    parser.add_argument("--resume-results", action="store_true",
                        help="--against-ludwig: keep the configs bench/results/ludwig_vs_ludwig.json has, run the others")
    args = parser.parse_args()
    if args.against_ludwig:
        args.epochs = args.epochs or 10
        against_ludwig(args)
        return
    args.epochs = args.epochs or 2
    configs = {p.stem: run_one(p, args.epochs) for p in sorted(CONFIGS.glob("*.yaml"))}
    loaded = sum(r["loaded"] for r in configs.values())
    trained = sum(r["trained"] for r in configs.values())
    summary = {"configs": len(configs), "load": loaded, "train_as_written": trained, "epochs_cap": args.epochs}
    write_results(RESULTS, {"summary": summary, "configs": configs, "machine": machine_info()})
    print(f"{loaded} of {len(configs)} load; {trained} train as written (epochs capped at {args.epochs})")
    for name, record in configs.items():
        if record["loaded"] and not record["trained"]:
            print(f"  {name}: {record.get('error')}")


if __name__ == "__main__":
    main()
