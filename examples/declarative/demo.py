"""The main demo (`make run`): declarative, distributed, adaptive training on a real dataset.

Run:  python examples/declarative/demo.py [--epochs N] [--quiet]
Needs: pip install 'raylight[declarative,examples]'

Writes scikit-learn's breast-cancer data (569 tumours, no download) to a temporary
directory (removed at the end), then trains examples/declarative/breast_cancer.yaml exactly
as `raylight train` would: preprocessing in the driver (data this small fits in memory;
`backend.processor.type: ray_data` sends it to Ray Data), 2 DDP workers on an embedded
local Ray, batch size and learning rate chosen by the adaptive engine. Prints the evaluation
on the held-out test split and where the run is: `results/demo-<date>-<time>` under the
current directory, as `raylight train` writes `results/run`, unless --output-directory.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from rich.console import Console
from rich.table import Table

from raylight.declarative import api
from raylight.declarative.loading import load_config

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--output-directory", default=None)
    args = parser.parse_args(argv)
    import sys

    sys.path.insert(0, HERE)
    from make_datasets import write_all

    output_directory = args.output_directory or os.path.join("results", time.strftime("demo-%Y%m%d-%H%M%S"))
    config = load_config(os.path.join(HERE, "breast_cancer.yaml"), [f"trainer.epochs={args.epochs}"])
    with tempfile.TemporaryDirectory(prefix="raylight-demo-") as work:
        data = write_all(work)["breast_cancer"]
        out = api.train(config, data, output_directory=output_directory, progress=not args.quiet)
    table = Table(title="breast cancer: held-out test split")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in out["evaluation"]["test"].items():
        table.add_row(key, f"{value:.4f}")
    table.add_row("best epoch", str(out["evaluation"]["best_epoch"]))
    Console().print(table)
    print(f"run directory: {out['output_directory']} (model/, metrics.jsonl, adaptive.jsonl, *.png, evaluation.json)")
    return out


if __name__ == "__main__":
    main()
