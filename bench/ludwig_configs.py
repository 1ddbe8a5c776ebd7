"""Ludwig's own configs (issue 56): how many of tests/declarative/ludwig_configs/ load, and
how many of those train as written, end to end, on generated data.

Run:  python bench/ludwig_configs.py [--epochs 2]

Each config is loaded as it is. One that loads is trained on the local backend (no Ray)
with only ``trainer.epochs`` capped (``--epochs``, so that a config written for 1,000
epochs finishes) and ``backend`` dropped (Ray's is measured elsewhere); every other key as
written, on 240 generated rows whose columns follow the features' types (PNG images
written beside the CSV for image inputs). A config trains if ``api.train`` returns a
test evaluation. Writes bench/results/ludwig_configs.json: per config, loaded / trained
and the first line of the error where it did not.
"""

from __future__ import annotations

import argparse
import tempfile
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from bench.common import machine_info, write_results

from raylight.declarative import api
from raylight.declarative.loading import load_config, load_yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "declarative" / "ludwig_configs"
RESULTS = REPO / "bench" / "results" / "ludwig_configs.json"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2, help="at most this many epochs per config")
    args = parser.parse_args()
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
