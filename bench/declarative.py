"""Declarative training: `raylight train` against `ludwig train`, same data, model, epochs.

Run:  make bench-declarative     (or: python bench/declarative.py [--sizes 1000,50000,500000])
      RAYLIGHT_BENCH_LUDWIG=/path/to/python3.12 python bench/declarative.py   (with Ludwig)

Two parts, every run a separate process timed from launch to exit:

1. breast cancer (scikit-learn's 569 rows, 13 numeric inputs, binary target,
   examples/declarative/breast_cancer.yaml): `raylight train` on the Ray backend (2
   workers), 30 epochs; and Ludwig's `experiment` on its Ray backend where installed.
2. diamonds (plotnine's diamonds.csv: 53,940 rows; predict the 5-class `cut` from
   carat, depth, table, price, x, y, z and the categories color and clarity). 10,000 rows
   are held out once; the training file of each size (1k, 50k, 500k rows) is drawn from
   the other 43,940 (with replacement above that: replicated rows). Both systems train a
   concat combiner of 64 and 32 units, Adam at 1e-3, batch 256, no early stopping,
   validating on 10% of the file, on the local backend and on the Ray backend (2 workers;
   Ludwig's with 0.5 CPU each, since 2 workers of 1 CPU deadlock on 2 cores); the
   held-out accuracy is computed here from each system's predictions on the same 10,000
   rows. raylight's preprocessing and training seconds come from its evaluation.json;
   the Ray backend also runs with `processor: ray_data` forced (the larger-than-memory
   path). Ludwig is run where an interpreter that imports it is given
   (`RAYLIGHT_BENCH_LUDWIG` or `--ludwig-python`; Ludwig 0.17 needs Python 3.12),
   otherwise each Ludwig row says why it is missing.

3. Parquet reader (`--parquet-reps`, 5 by default): `raylight train` on the Ray backend
   with `processor: ray_data` forced, on the 50k-row diamonds training file written as
   one Parquet file, 5 epochs. Two variants, interleaved in each repetition: raylight's
   reader (Ray Data's first Parquet reader, which raylight picks for its own read) and
   Ray's default (`RAY_DATA_USE_DATASOURCE_V2=1`, which raylight leaves to the user: Ray
   2.60's DataSourceV2, which starts 32 FooterReader actors per read). Medians of the
   preprocessing seconds (evaluation.json: read, checks, split, statistics, transform) and
   of the wall time, and their ratios.

4. Ray against local against torchrun (`--floor-reps`, 3 by default; `--floor-sizes`):
   the diamonds config at each size run five ways, interleaved in each repetition: the
   local backend (one process), the same config under `torchrun --nproc-per-node 2` (two
   DDP ranks, no Ray: docs/launchers.md), the Ray backend (two workers), the Ray backend
   with every gradient all-reduce by gloo (`strategy: {type: ddp, shared_memory: false}`:
   raylight before its shared-memory all-reduce), and the Ray backend with `batch_size:
   auto` (the adaptive engine chooses the batch). Medians of the wall time, of fit's
   seconds, of the steady epoch (the gap between epoch reports in metrics.jsonl) and of
   the held-out accuracy, and the ratios ray/local (the goal: <= 1.5), torchrun/local
   (what data parallelism itself costs on this machine and model), ray/torchrun (what Ray
   adds to it), ray/ray_gloo (what the shared-memory all-reduce gives) and ray_auto/local.

Results: bench/results/declarative.json (breast cancer at the top level as before, the
diamonds runs under "diamonds", the readers under "parquet_reader", part 4 under
"ddp_floor") and tables on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples", "declarative")
RESULTS = os.path.join(HERE, "results", "declarative.json")
sys.path.insert(0, HERE)
from common import (  # noqa: E402
    ludwig_available,
    ludwig_env,
    ludwig_python,
    machine_info,
    median_of,
    ratio,
    run_timed,
    torchrun_command,
)

HELD_OUT = 10_000
TARGET = "cut"
NUMBERS = ["carat", "depth", "table", "price", "x", "y", "z"]
CATEGORIES = ["color", "clarity"]
EPOCHS = {1_000: 30, 50_000: 5, 500_000: 2}  # the same for both systems at each size


def raylight_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# -- part 1: breast cancer -------------------------------------------------------------


def run_raylight_breast_cancer(data: str, epochs: int, workdir: str) -> dict:
    out = os.path.join(workdir, "raylight")
    cmd = [
        sys.executable, "-m", "raylight.cli", "train", "--config", os.path.join(EXAMPLES, "breast_cancer.yaml"),
        "--dataset", data, "--output-directory", out, "--quiet",
        "--set", f"trainer.epochs={epochs}", "--set", "trainer.early_stop=-1",
    ]
    res, wall, _ = run_timed(cmd, timeout=900, env=raylight_env(), marker=workdir)
    if res.returncode != 0:
        return {"ok": False, "error": res.stderr[-2000:]}
    with open(os.path.join(out, "evaluation.json")) as f:
        evaluation = json.load(f)
    return {"ok": True, "wall_s": wall, "test_accuracy": evaluation["test"]["accuracy"], "seconds": evaluation.get("seconds")}


LUDWIG_BREAST_CANCER = """
input_features: {inputs}
output_features: [{{name: diagnosis, type: category}}]
combiner: {{type: concat, fc_layers: [{{output_size: 64}}, {{output_size: 32}}]}}
trainer: {{epochs: {epochs}, optimizer: {{type: adam}}, early_stop: -1}}
backend: {{type: ray, trainer: {{num_workers: 2, resources_per_worker: {{CPU: 0.5}}}}}}
"""


def run_ludwig_breast_cancer(python: str, data: str, epochs: int, workdir: str) -> dict:
    import yaml

    with open(os.path.join(EXAMPLES, "breast_cancer.yaml")) as f:
        inputs = yaml.safe_load(f)["input_features"]
    cfg = os.path.join(workdir, "ludwig.yaml")
    os.makedirs(workdir, exist_ok=True)
    with open(cfg, "w") as f:
        f.write(LUDWIG_BREAST_CANCER.format(inputs=json.dumps(inputs), epochs=epochs))
    out = os.path.join(workdir, "ludwig")
    cmd = [python, "-m", "ludwig.cli", "experiment", "--config", cfg, "--dataset", data, "--output_directory", out]
    res, wall, _ = run_timed(cmd, timeout=1800, env=ludwig_env(), marker=workdir)
    if res.returncode != 0:
        return {"ok": False, "error": res.stderr[-2000:]}
    stats = next(
        os.path.join(root, "test_statistics.json") for root, _, files in os.walk(out) if "test_statistics.json" in files
    )
    with open(stats) as f:
        acc = json.load(f)["diagnosis"]["accuracy_micro"]  # 0.17's `accuracy` is macro-averaged
    return {"ok": True, "wall_s": wall, "test_accuracy": acc}


def breast_cancer(args: argparse.Namespace, work: str, why_not: str | None, python: str) -> dict:
    sys.path.insert(0, EXAMPLES)
    from make_datasets import write_all

    data = write_all(os.path.join(work, "data"))["breast_cancer"]
    runs: dict[str, list[dict]] = {"raylight": [], "ludwig": []}
    for rep in range(args.reps):
        runs["raylight"].append(run_raylight_breast_cancer(data, args.epochs, os.path.join(work, f"r{rep}")))
        if why_not is None:
            runs["ludwig"].append(run_ludwig_breast_cancer(python, data, args.epochs, os.path.join(work, f"l{rep}")))
    summary: dict[str, dict] = {}
    for system, reps in runs.items():
        ok = [r for r in reps if r["ok"]]
        summary[system] = {
            "runs": reps,
            "wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None,
            "test_accuracy": statistics.median(r["test_accuracy"] for r in ok) if ok else None,
        }
    if why_not is not None:
        summary["ludwig"]["not_measured"] = why_not
    return {"dataset": "sklearn breast_cancer (569 rows)", "epochs": args.epochs, "workers": 2, "systems": summary}


# -- part 2: diamonds at several sizes ----------------------------------------------------


def diamonds_files(work: str, sizes: list[int]) -> tuple[str, dict[int, str]]:
    """The held-out file and one training file per size (see the module docstring)."""
    import numpy as np
    import pandas as pd
    import plotnine

    base = pd.read_csv(os.path.join(os.path.dirname(plotnine.__file__), "data", "diamonds.csv"))
    rng = np.random.default_rng(0)
    order = rng.permutation(len(base))
    held, pool = base.iloc[order[:HELD_OUT]], base.iloc[order[HELD_OUT:]]
    os.makedirs(work, exist_ok=True)
    held_path = os.path.join(work, "heldout.csv")
    held.to_csv(held_path, index=False)
    files = {}
    for n in sizes:
        rows = pool.sample(n=n, replace=n > len(pool), random_state=n)
        files[n] = os.path.join(work, f"train-{n}.csv")
        rows.to_csv(files[n], index=False)
    return held_path, files


def raylight_config(
    path: str, backend: str, processor: str, epochs: int, batch_size: int | str = 256, strategy: str | dict = "ddp"
) -> None:
    import yaml

    cfg = {
        "input_features": [{"name": c, "type": "number"} for c in NUMBERS] + [{"name": c, "type": "category"} for c in CATEGORIES],
        "output_features": [{"name": TARGET, "type": "category"}],
        "combiner": {"type": "concat", "fc_layers": [{"output_size": 64}, {"output_size": 32}]},
        "trainer": {"epochs": epochs, "batch_size": batch_size, "learning_rate": 0.001, "optimizer": {"type": "adam"}, "early_stop": -1},
        "preprocessing": {"split": {"type": "random", "probabilities": [0.9, 0.1, 0.0]}},
        "backend": {"type": backend, "processor": {"type": processor},
                    "trainer": {"num_workers": 2, "resources_per_worker": {"CPU": 1}, "strategy": strategy}},
    }
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


def ludwig_config(path: str, backend: str, epochs: int) -> None:
    import yaml

    cfg = {
        "input_features": [{"name": c, "type": "number", "preprocessing": {"normalization": "zscore"}} for c in NUMBERS]
        + [{"name": c, "type": "category", "encoder": {"type": "dense", "embedding_size": 32}} for c in CATEGORIES],
        "output_features": [{"name": TARGET, "type": "category"}],
        "combiner": {"type": "concat", "fc_layers": [{"output_size": 64}, {"output_size": 32}]},
        "trainer": {"epochs": epochs, "batch_size": 256, "learning_rate": 0.001, "optimizer": {"type": "adam"}, "early_stop": -1},
        "preprocessing": {"split": {"type": "random", "probabilities": [0.9, 0.1, 0.0]}},
        "backend": {"type": "local"} if backend == "local" else {
            "type": "ray", "processor": {"type": "dask"},
            "trainer": {"num_workers": 2, "resources_per_worker": {"CPU": 0.5}},
        },
    }
    with open(path, "w") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)


def held_out_accuracy(predicted: list[Any], held_path: str) -> float:
    import pandas as pd

    truth = pd.read_csv(held_path)[TARGET].astype(str).tolist()
    assert len(predicted) == len(truth), (len(predicted), len(truth))
    return sum(str(p) == t for p, t in zip(predicted, truth, strict=True)) / len(truth)


def steady_epoch_s(metrics_path: str) -> float | None:
    """Seconds per epoch once training runs: the median gap between consecutive epoch
    reports in the run's metrics.jsonl (start-up and the first epoch excluded); None with
    fewer than 2 epochs."""
    with open(metrics_path) as f:
        times = [json.loads(line)["_time"] for line in f if line.strip()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) if gaps else None


def run_raylight(
    data: str, held: str, backend: str, processor: str, epochs: int, workdir: str,
    *, env_extra: dict[str, str] | None = None, held_csv: bool = True, torchrun: bool = False, batch_size: int | str = 256,
    strategy: str | dict = "ddp",
) -> dict:
    """One `raylight train`; ``held_csv=False`` skips the held-out accuracy; ``torchrun``
    launches it as 2 ranks under torchrun (the local backend's config, no Ray)."""
    os.makedirs(workdir, exist_ok=True)
    cfg, out = os.path.join(workdir, "raylight.yaml"), os.path.join(workdir, "run")
    raylight_config(cfg, backend, processor, epochs, batch_size, strategy)
    # torchrun: 2 processes in one DDP group (gloo), no Ray; docs/launchers.md
    front = torchrun_command(2, workdir) if torchrun else [sys.executable]
    cmd = [*front, "-m", "raylight.cli", "train", "--config", cfg, "--dataset", data, "--output-directory", out, "--quiet"]
    res, wall, _ = run_timed(cmd, timeout=1800, env={**raylight_env(), **(env_extra or {})}, marker=workdir)
    if res.returncode != 0:
        return {"ok": False, "error": res.stderr[-2000:]}
    with open(os.path.join(out, "evaluation.json")) as f:
        evaluation = json.load(f)
    seconds = evaluation["seconds"]
    row = {
        "ok": True, "wall_s": wall,
        "chosen_processor": evaluation["processor"], "connect_s": seconds["connect"],
        "preprocess_s": seconds["preprocess"], "train_s": seconds["train"],
        "epoch_s": steady_epoch_s(os.path.join(out, "metrics.jsonl")),
    }
    if held_csv:
        import pandas as pd

        sys.path.insert(0, os.path.join(REPO, "src"))
        import raylight

        pred = raylight.load_model(os.path.join(out, "model")).predict(pd.read_csv(held))[f"{TARGET}_predictions"]
        row["held_out_accuracy"] = held_out_accuracy(pred.tolist(), held)
    return row


def run_ludwig(python: str, data: str, held: str, backend: str, epochs: int, workdir: str) -> dict:
    os.makedirs(workdir, exist_ok=True)
    cfg, out = os.path.join(workdir, "ludwig.yaml"), os.path.join(workdir, "run")
    ludwig_config(cfg, backend, epochs)
    cmd = [python, "-m", "ludwig.cli", "train", "--config", cfg, "--dataset", data, "--output_directory", out, "--skip_save_processed_input"]
    res, wall, left = run_timed(cmd, timeout=1800, env=ludwig_env(), marker=workdir)
    if res.returncode != 0:
        return {"ok": False, "error": (res.stderr or res.stdout)[-2000:], "wall_s": wall}
    model = os.path.join(out, "experiment_run", "model")
    pred_dir = os.path.join(workdir, "pred")
    cmd = [python, "-m", "ludwig.cli", "predict", "--model_path", model, "--dataset", held, "--output_directory", pred_dir, "--backend", "local"]
    pres, _, _ = run_timed(cmd, timeout=1800, env=ludwig_env(), marker=workdir)
    if pres.returncode != 0:
        return {"ok": False, "wall_s": wall, "error": "ludwig predict: " + (pres.stderr or pres.stdout)[-2000:]}
    with open(os.path.join(pred_dir, f"{TARGET}_predictions.csv")) as f:
        predicted = [line.rstrip("\n") for line in f if line.strip()]
    return {"ok": True, "wall_s": wall, "held_out_accuracy": held_out_accuracy(predicted, held), "leftover_pids": left}


def diamonds(args: argparse.Namespace, work: str, why_not: str | None, python: str) -> dict:
    sizes = [int(s) for s in args.sizes.split(",")]
    ludwig_sizes = {int(s) for s in args.ludwig_sizes.split(",") if s}
    held, files = diamonds_files(os.path.join(work, "diamonds"), sizes)
    runs: list[dict] = []
    for n in sizes:
        epochs = EPOCHS.get(n, 5)
        variants = [("raylight", "local", "auto"), ("raylight", "ray", "auto"), ("raylight", "ray", "ray_data")]
        variants += [("ludwig", "local", "pandas"), ("ludwig", "ray", "dask")]
        for system, backend, processor in variants:
            where = os.path.join(work, f"d{n}-{system}-{backend}-{processor}")
            row: dict[str, Any] = {"rows": n, "epochs": epochs, "system": system, "backend": backend, "processor": processor}
            if system == "raylight":
                row.update(run_raylight(files[n], held, backend, processor, epochs, where))
            elif why_not is not None:
                row.update({"ok": False, "not_measured": why_not})
            elif n not in ludwig_sizes:
                row.update({"ok": False, "not_measured": f"Ludwig runs only at --ludwig-sizes {sorted(ludwig_sizes)} (time)"})
            else:
                row.update(run_ludwig(python, files[n], held, backend, epochs, where))
            print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
            runs.append(row)
    ratios = []
    for n in sizes:
        for backend in ("local", "ray"):
            ours = next((r for r in runs if r["rows"] == n and r["system"] == "raylight" and r["backend"] == backend and r["processor"] == "auto"), None)
            theirs = next((r for r in runs if r["rows"] == n and r["system"] == "ludwig" and r["backend"] == backend), None)
            if ours and theirs and ours.get("ok") and theirs.get("ok"):
                ratios.append({
                    "rows": n, "backend": backend,
                    "wall_ratio": ours["wall_s"] / theirs["wall_s"],
                    "accuracy_points": 100 * (ours["held_out_accuracy"] - theirs["held_out_accuracy"]),
                })
    return {
        "dataset": f"plotnine diamonds.csv: predict cut; {HELD_OUT} rows held out, training files of {sizes} rows",
        "model": "concat 64-32, adam 1e-3, batch 256, validation 10% of the file, no early stop",
        "runs": runs,
        "raylight_vs_ludwig": ratios,
    }


PARQUET_ROWS = 50_000
READERS = {"raylight": None, "ray_default": "1"}  # RAY_DATA_USE_DATASOURCE_V2 for each variant


def parquet_reader(args: argparse.Namespace, work: str) -> dict:
    """Part 3 of the module docstring: raylight's Parquet reader against Ray's default."""
    import pandas as pd

    _, files = diamonds_files(os.path.join(work, "parquet"), [PARQUET_ROWS])
    data = files[PARQUET_ROWS].replace(".csv", ".parquet")
    pd.read_csv(files[PARQUET_ROWS]).to_parquet(data)
    epochs = EPOCHS[PARQUET_ROWS]
    runs: list[dict] = []
    for rep in range(args.parquet_reps):
        for reader, v2 in READERS.items():
            where = os.path.join(work, f"parquet-{rep}-{reader}")
            row: dict[str, Any] = {"rep": rep, "reader": reader}
            row.update(run_raylight(data, data, "ray", "ray_data", epochs, where, env_extra={} if v2 is None else {"RAY_DATA_USE_DATASOURCE_V2": v2}, held_csv=False))
            print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
            runs.append(row)
    medians = {
        reader: {key: median_of([r for r in runs if r["reader"] == reader], key) for key in ("preprocess_s", "wall_s")}
        for reader in READERS
    }
    ours, theirs = medians["raylight"], medians["ray_default"]
    return {
        "dataset": f"plotnine diamonds, {PARQUET_ROWS} training rows as one Parquet file; ray backend, processor ray_data, {epochs} epochs",
        "readers": {"raylight": "Ray Data's first Parquet reader (raylight's choice for its read)",
                    "ray_default": "RAY_DATA_USE_DATASOURCE_V2=1: Ray 2.60's default DataSourceV2 reader"},
        "runs": runs,
        "medians": medians,
        "raylight_vs_ray_default_preprocess": ratio(ours["preprocess_s"], theirs["preprocess_s"]),
        "raylight_vs_ray_default_wall": ratio(ours["wall_s"], theirs["wall_s"]),
    }


FLOOR = {"local": "local backend: 1 process", "torchrun": "torchrun, 2 ranks (DDP), no Ray",
         "ray": "ray backend, 2 workers (DDP)",
         "ray_gloo": "ray backend, 2 workers (DDP, every all-reduce by gloo: strategy {type: ddp, shared_memory: false})",
         "ray_auto": "ray backend, 2 workers, batch_size: auto (the adaptive engine chooses the batch)"}
NO_SHARED_MEMORY = {"type": "ddp", "shared_memory": False}


def ddp_floor(args: argparse.Namespace, work: str) -> dict:
    """Part 4 of the module docstring: where the ray backend's time over the local
    backend's goes. The same config at each size, four ways (FLOOR), interleaved in each
    repetition: one process (local), two DDP ranks under torchrun (no Ray), two Ray
    workers, and two Ray workers with the adaptive batch. torchrun over local is what data
    parallelism itself costs (or gains) on this machine and model; ray over torchrun is what
    Ray adds."""
    sizes = [int(n) for n in args.floor_sizes.split(",") if n]
    held, files = diamonds_files(os.path.join(work, "floor"), sizes)
    runs: list[dict] = []
    epochs = {n: EPOCHS.get(n, 5) for n in sizes}
    for n in sizes:
        for rep in range(args.floor_reps):
            for way in FLOOR:
                where = os.path.join(work, f"floor-{n}-{rep}-{way}")
                row: dict[str, Any] = {"rows": n, "epochs": epochs[n], "rep": rep, "way": way}
                backend = "ray" if way.startswith("ray") else "local"
                row.update(run_raylight(files[n], held, backend, "auto", epochs[n], where, torchrun=way == "torchrun",
                                        batch_size="auto" if way == "ray_auto" else 256,
                                        strategy=NO_SHARED_MEMORY if way == "ray_gloo" else "ddp"))
                print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
                runs.append(row)
    keys = ("wall_s", "train_s", "epoch_s", "held_out_accuracy")
    sized = []
    for n in sizes:
        m = {way: {k: median_of([r for r in runs if r["rows"] == n and r["way"] == way], k) for k in keys} for way in FLOOR}
        sized.append({
            "rows": n, "epochs": epochs[n], "medians": m,
            **{f"{a}_vs_{b}_{k.removesuffix('_s')}": ratio(m[a][k], m[b][k])
               for a, b in (("ray", "local"), ("torchrun", "local"), ("ray", "torchrun"), ("ray_auto", "local"),
                            ("ray_gloo", "local"), ("ray", "ray_gloo"))
               for k in ("wall_s", "epoch_s")},
        })
    return {
        "dataset": "plotnine diamonds (training files as in the diamonds part), the diamonds config, processor auto",
        "ways": FLOOR, "reps": args.floor_reps, "runs": runs, "sizes": sized,
        "goal_ray_vs_local_wall": 1.5,
    }


def print_tables(result: dict) -> None:
    bc = result["systems"]
    print(f"\nbreast cancer\n{'system':10} {'wall s':>8} {'test accuracy':>14}")
    for system, s in bc.items():
        wall = f"{s['wall_s']:.1f}" if s["wall_s"] is not None else "-"
        acc = f"{s['test_accuracy']:.4f}" if s["test_accuracy"] is not None else "-"
        print(f"{system:10} {wall:>8} {acc:>14}")

    def f(r: dict, key: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(r[key]) if r.get(key) is not None else "-"

    d = result.get("diamonds")
    if d:
        print(f"\ndiamonds\n{'rows':>8} {'system':9} {'backend':8} {'processor':10} {'wall s':>7} {'prep s':>7} {'train s':>8} {'held-out acc':>13}")
        for r in d["runs"]:
            print(f"{r['rows']:>8} {r['system']:9} {r['backend']:8} {r['processor']:10} {f(r, 'wall_s', '{:.1f}'):>7} {f(r, 'preprocess_s'):>7} {f(r, 'train_s'):>8} {f(r, 'held_out_accuracy', '{:.4f}'):>13}")
        for q in d["raylight_vs_ludwig"]:
            print(f"raylight/ludwig wall at {q['rows']} rows, {q['backend']}: {q['wall_ratio']:.2f}; accuracy {q['accuracy_points']:+.2f} points")
    pr = result.get("parquet_reader")
    if pr:
        print(f"\nparquet reader ({pr['dataset']})\n{'reader':12} {'prep s':>7} {'wall s':>7}")
        for reader, m in pr["medians"].items():
            print(f"{reader:12} {f(m, 'preprocess_s'):>7} {f(m, 'wall_s', '{:.1f}'):>7}")
        for key in ("raylight_vs_ray_default_preprocess", "raylight_vs_ray_default_wall"):
            print(f"{key}: {f(pr, key, '{:.3f}')}")
    fl = result.get("ddp_floor")
    if fl:
        print(f"\nray vs local vs torchrun (medians of {fl['reps']})\n{'rows':>8} {'way':9} {'wall s':>7} {'train s':>8} {'epoch s':>8} {'held-out acc':>13}")
        for size in fl["sizes"]:
            for way, m in size["medians"].items():
                print(f"{size['rows']:>8} {way:9} {f(m, 'wall_s', '{:.1f}'):>7} {f(m, 'train_s'):>8} {f(m, 'epoch_s'):>8} {f(m, 'held_out_accuracy', '{:.4f}'):>13}")
            print("         " + ", ".join(f"{k} {f(size, k)}" for k in size if k.endswith(("_wall", "_epoch"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30, help="breast cancer epochs")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--ludwig-python", default=None, help="an interpreter with Ludwig (default: $RAYLIGHT_BENCH_LUDWIG)")
    parser.add_argument("--sizes", default="1000,50000,500000", help="diamonds training-file sizes ('' skips diamonds)")
    parser.add_argument("--ludwig-sizes", default="1000,50000", help="the sizes Ludwig also runs at")
    parser.add_argument("--skip-breast-cancer", action="store_true", help="keep the breast-cancer figures of the last results")
    parser.add_argument("--parquet-reps", type=int, default=5, help="repetitions of the Parquet reader part (0 keeps the last results)")
    parser.add_argument("--floor-reps", type=int, default=3, help="repetitions of the ray/local/torchrun part (0 keeps the last results)")
    parser.add_argument("--keep-work", action="store_true", help="keep the generated data and the runs' directories (default: removed at the end)")
    parser.add_argument("--floor-sizes", default="1000,50000,500000", help="the sizes of the ray/local/torchrun part")
    args = parser.parse_args()
    if args.sizes or args.parquet_reps or args.floor_reps:  # before the breast-cancer runs, whose figures would be lost with it
        try:
            import plotnine  # noqa: F401
        except ImportError:
            parser.error("the diamonds and Parquet runs need plotnine (its diamonds.csv): pip install -e '.[bench]', "
                         "as make bench-declarative does, or --sizes '' --parquet-reps 0 --floor-reps 0 to skip them")
    python = ludwig_python(args.ludwig_python)
    why_not = ludwig_available(python)
    work = tempfile.mkdtemp(prefix="bench-declarative-")
    try:
        previous: dict = {}
        if os.path.exists(RESULTS):
            with open(RESULTS) as f:
                previous = json.load(f)
        if args.skip_breast_cancer and "systems" in previous:
            result = {k: previous[k] for k in ("dataset", "epochs", "workers", "systems")}
        else:
            result = breast_cancer(args, work, why_not, python)
        if args.sizes:
            result["diamonds"] = diamonds(args, work, why_not, python)
        elif "diamonds" in previous:
            result["diamonds"] = previous["diamonds"]
        if args.parquet_reps:
            result["parquet_reader"] = parquet_reader(args, work)
        elif "parquet_reader" in previous:
            result["parquet_reader"] = previous["parquet_reader"]
        if args.floor_reps:
            result["ddp_floor"] = ddp_floor(args, work)
        elif "ddp_floor" in previous:
            result["ddp_floor"] = previous["ddp_floor"]
        result["machine"] = machine_info()
        if why_not is None:
            res = subprocess.run([python, "-c", "import ludwig; print(ludwig.__version__)"], capture_output=True, text=True, timeout=300)
            result["machine"]["ludwig"] = res.stdout.strip()
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump(result, f, indent=2)
    finally:  # the generated data and every run's directory (tens of MB); failures are in the results
        if args.keep_work:
            print(f"kept the runs' data and directories in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print_tables(result)
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
