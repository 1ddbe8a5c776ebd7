"""The main demo (`make run`): declarative, distributed, adaptive training on a real dataset.

Run:  python examples/declarative/demo.py [--epochs N] [--quiet] [--output-directory DIR]
      python examples/declarative/demo.py --dataset-path   (where diamonds.csv is)
Needs: pip install 'raylight[demo]'

Trains examples/declarative/diamonds.yaml on plotnine's diamonds.csv (53,940 diamonds:
predict the cut from carat, colour, clarity, price and the measurements), read where
plotnine's wheel installed it (no download; plotnine itself is not imported), exactly as
`raylight train` would: preprocessing in the driver while Ray starts, 2 DDP workers on an
embedded local Ray, and the adaptive engine choosing the global batch and the learning
rate as it measures the gradient noise and the step times.

What to watch: each epoch's line shows the batch and the LR factor changing, with the
samples/s of that epoch; then the held-out evaluation, the engine's decisions, and a
closing line comparing the starting fixed batch with the adaptive one, both measured in
this run. The run directory (`results/demo-<date>-<time>` under the current directory,
unless --output-directory) holds adaptive.png (the story as six panels), adaptive.jsonl,
the model and `raylight report`'s input.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EXTRA = "pip install -e '.[demo]' (make run does it)"


def diamonds_csv() -> str:
    """plotnine's diamonds.csv, found without importing plotnine (its import takes seconds)."""
    spec = importlib.util.find_spec("plotnine")
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    for place in places:
        path = os.path.join(place, "data", "diamonds.csv")
        if os.path.exists(path):
            return path
    why = "plotnine is not installed" if not places else f"plotnine at {places[0]} has no data/diamonds.csv"
    raise SystemExit(f"the demo trains on plotnine's diamonds.csv, and {why}: {EXTRA}")


def trace(run_dir: str) -> list[dict[str, Any]]:
    """The rows of the run's adaptive.jsonl."""
    path = os.path.join(run_dir, "adaptive.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


MIN_STEPS = 5  # an interval of fewer optimizer steps (the run's last moments) is not a rate


def rates_by_batch(rows: list[dict[str, Any]]) -> dict[int, float]:
    """Samples/s at each global batch: the time-weighted mean of the trace rows' rates (each
    over the interval since the row before, the epoch lines' definition) at that batch."""
    seconds: dict[int, float] = {}
    samples: dict[int, float] = {}
    previous = None
    for row in rows:
        if "event" in row or "time" not in row:
            continue  # events are not the engine's rows: they take no interval
        if previous is not None and row.get("global_batch") and row.get("measured_steps", 0) >= MIN_STEPS:
            dt = row["time"] - previous
            seconds[row["global_batch"]] = seconds.get(row["global_batch"], 0.0) + dt
            samples[row["global_batch"]] = samples.get(row["global_batch"], 0.0) + dt * row["throughput"]
        previous = row["time"]
    return {batch: samples[batch] / t for batch, t in seconds.items() if t > 0}


def closing_line(rows: list[dict[str, Any]]) -> str:
    """The starting batch, which a fixed-batch run would keep, against the batch the engine
    ended with, both measured in this run (its trace): samples/s and the progress per second
    the efficiency makes of them. A fixed-batch run to a target accuracy would not fit the
    demo's time, so the line says what it compares instead."""
    rates = rates_by_batch(rows)
    batches = [r["global_batch"] for r in rows if r.get("global_batch")]
    if not batches or batches[0] not in rates or batches[-1] not in rates or batches[0] == batches[-1]:
        return "adaptive vs fixed batch: this run did not measure both the starting and a later batch (a longer run: --epochs)"
    first, last = batches[0], batches[-1]
    speed = rates[last] / rates[first]
    efficiency = next(float(r["efficiency"]) for r in reversed(rows) if r.get("global_batch") == last and "efficiency" in r)
    return (
        f"adaptive vs fixed batch, both measured in this run: batch {first} (the start, which a fixed-batch "
        f"run keeps; the workers' first steps included) trained {rates[first]:,.0f} samples/s, batch {last} "
        f"(the engine's last) {rates[last]:,.0f}: {speed:.1f}x the samples/s at statistical efficiency "
        f"{efficiency:.2f}, {speed * efficiency:.1f}x the training progress per second. Time to a target "
        "accuracy against a fixed-batch run is `make bench-adaptive`'s measure (two runs do not fit this "
        "demo's ~20 s)."
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--output-directory", default=None)
    parser.add_argument("--dataset-path", action="store_true", help="print where diamonds.csv is and exit")
    args = parser.parse_args(argv)
    data = diamonds_csv()
    if args.dataset_path:
        print(data)
        return {}
    # before the imports (pandas, Ray: seconds), so the first line comes at once
    print(f"raylight demo: 2 workers learn a diamond's cut from {os.path.basename(data)} (53,940 diamonds); "
          "the adaptive engine chooses the batch size and learning rate as it trains", flush=True)
    from rich.console import Console
    from rich.table import Table

    from raylight.declarative import api
    from raylight.declarative.loading import load_config

    output_directory = args.output_directory or os.path.join("results", time.strftime("demo-%Y%m%d-%H%M%S"))
    config = load_config(os.path.join(HERE, "diamonds.yaml"), [f"trainer.epochs={args.epochs}"])
    out = api.train(config, data, output_directory=output_directory, progress=not args.quiet)
    run = out["output_directory"]
    table = Table(title="held-out test split")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in out["evaluation"]["test"].items():
        table.add_row(key, f"{value:.4f}")
    table.add_row("best epoch", str(out["evaluation"]["best_epoch"]))
    table.add_row("training s", f"{out['evaluation']['seconds']['train']:.1f}")
    Console().print(table)
    rows = trace(run)
    chosen = [r for r in rows if r.get("decision") == "batch"]
    batches = [chosen[0]["global_batch"], *(r["decided_batch"] for r in chosen)] if chosen else []
    print(f"adaptive decisions: {len(chosen)}, global batch {' -> '.join(map(str, batches)) or 'unchanged'} "
          f"(`raylight report {run}` lists them with their reasons)")
    plot = "adaptive.png, " if os.path.exists(os.path.join(run, "adaptive.png")) else ""
    print(f"run directory: {run} ({plot}adaptive.jsonl, model/, metrics.jsonl, evaluation.json)")
    print(closing_line(rows))
    return out


if __name__ == "__main__":
    main()
