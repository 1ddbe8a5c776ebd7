"""Declarative training: `raylight train` against `ludwig train`, same data, model size, epochs.

Run:  make bench-declarative        (or: python bench/declarative.py [--epochs 30] [--reps 1])

Dataset: scikit-learn's breast-cancer data (569 rows, 13 numeric inputs used, binary
target), written by examples/declarative/make_datasets.py. Both systems train a concat
combiner with layers of 64 and 32 units for the same number of epochs with Adam, on the
same Ray-backend kind (2 workers on a local Ray). Each run is a separate process, timed
from launch to exit; the test-split accuracy comes from each system's own evaluation.
Ludwig runs only where it installs (`--ludwig-python` names an interpreter that has it:
Ludwig 0.17 needs Python 3.12 and a torch build for it); otherwise the result says why it
was not measured. Results: bench/results/declarative.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples", "declarative")
RESULTS = os.path.join(HERE, "results", "declarative.json")


def run_raylight(data: str, epochs: int, workdir: str) -> dict:
    out = os.path.join(workdir, "raylight")
    cmd = [
        sys.executable, "-m", "raylight.cli", "train", "--config", os.path.join(EXAMPLES, "breast_cancer.yaml"),
        "--dataset", data, "--output-directory", out, "--quiet",
        "--set", f"trainer.epochs={epochs}", "--set", "trainer.early_stop=-1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    wall = time.time() - start
    if res.returncode != 0:
        return {"ok": False, "error": res.stderr[-2000:]}
    with open(os.path.join(out, "evaluation.json")) as f:
        evaluation = json.load(f)
    return {"ok": True, "wall_s": wall, "test_accuracy": evaluation["test"]["accuracy"]}


LUDWIG_CONFIG = """
input_features: {inputs}
output_features: [{{name: diagnosis, type: category}}]
combiner: {{type: concat, output_size: 64, num_fc_layers: 2}}
trainer: {{epochs: {epochs}, optimizer: {{type: adam}}, early_stop: -1}}
backend: {{type: ray, trainer: {{num_workers: 2, resources_per_worker: {{CPU: 1}}}}}}
"""


def ludwig_available(python: str) -> str | None:
    """None when `python` can import ludwig, else why not."""
    if not shutil.which(python) and not os.path.exists(python):
        return f"no interpreter {python!r}"
    res = subprocess.run([python, "-c", "import ludwig; print(ludwig.__version__)"], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        lines = [ln.strip() for ln in res.stderr.splitlines() if ln.strip()]
        why = next((ln for ln in lines if "Error" in ln or "not found" in ln or "command" in ln), lines[-1] if lines else "?")
        return (
            f"{python} cannot import ludwig ({why}); Ludwig 0.17 needs Python 3.12 and a torch "
            "build for it, and this machine's only CPU torch wheel is for Python 3.11"
        )
    return None


def run_ludwig(python: str, data: str, epochs: int, workdir: str) -> dict:
    import yaml

    with open(os.path.join(EXAMPLES, "breast_cancer.yaml")) as f:
        inputs = yaml.safe_load(f)["input_features"]
    cfg = os.path.join(workdir, "ludwig.yaml")
    with open(cfg, "w") as f:
        f.write(LUDWIG_CONFIG.format(inputs=json.dumps(inputs), epochs=epochs))
    out = os.path.join(workdir, "ludwig")
    start = time.time()
    res = subprocess.run(
        [python, "-m", "ludwig.cli", "experiment", "--config", cfg, "--dataset", data, "--output_directory", out],
        capture_output=True, text=True, timeout=1800,
    )
    wall = time.time() - start
    if res.returncode != 0:
        return {"ok": False, "error": res.stderr[-2000:]}
    stats = next(
        os.path.join(root, "test_statistics.json") for root, _, files in os.walk(out) if "test_statistics.json" in files
    )
    with open(stats) as f:
        acc = json.load(f)["diagnosis"]["accuracy"]
    return {"ok": True, "wall_s": wall, "test_accuracy": acc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--ludwig-python", default="python3.12")
    args = parser.parse_args()
    sys.path.insert(0, EXAMPLES)
    from make_datasets import write_all

    work = tempfile.mkdtemp(prefix="bench-declarative-")
    data = write_all(os.path.join(work, "data"))["breast_cancer"]
    why_not = ludwig_available(args.ludwig_python)
    runs: dict[str, list[dict]] = {"raylight": [], "ludwig": []}
    for rep in range(args.reps):
        runs["raylight"].append(run_raylight(data, args.epochs, os.path.join(work, f"r{rep}")))
        if why_not is None:
            runs["ludwig"].append(run_ludwig(args.ludwig_python, data, args.epochs, os.path.join(work, f"l{rep}")))
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
    result = {"dataset": "sklearn breast_cancer (569 rows)", "epochs": args.epochs, "workers": 2, "systems": summary}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{'system':10} {'wall s':>8} {'test accuracy':>14}")
    for system, s in summary.items():
        wall = f"{s['wall_s']:.1f}" if s["wall_s"] is not None else "-"
        acc = f"{s['test_accuracy']:.4f}" if s["test_accuracy"] is not None else "-"
        print(f"{system:10} {wall:>8} {acc:>14}")
    if why_not is not None:
        print(f"ludwig not measured: {why_not}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
