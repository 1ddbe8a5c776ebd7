"""Lightning on Ray: Ray Train's Lightning integration vs raylight's RayStrategy.

Run:  make bench-lightning
      python bench/lightning.py [--reps 2] [--samples 16000] [--epochs 2]

One LightningModule (an MLP 32 -> 256 -> 256 -> 10 on a seeded synthetic set, SGD,
global batch 128 = 2 workers x 64, gloo on CPU, 1 torch thread per worker), trained by:

  ray_train  Ray Train's TorchTrainer running the Lightning Trainer in each worker, with
             ray.train.lightning's RayDDPStrategy, RayLightningEnvironment and
             prepare_trainer (the documented way)
  raylight   pl.Trainer on the driver with raylight.lightning.RayStrategy(num_workers=2)
  raylight_fsdp  the same with RayFSDPStrategy(num_workers=2): FSDP2; the MLP's 76,810
             parameters are under the default block size (100k), so the whole model is
             one FSDP unit (one all-gather and one reduce-scatter per step); it prices
             sharding against DDP in the same run

Each run is a cold child process with its own local Ray (2 CPUs); the systems are
interleaved across repetitions. A callback on global rank 0 timestamps every optimizer
step; measured from the moment the parent launched the child (the same way as
bench/overhead.py): start_to_first_step_s, wall_s (to the last step), process_s (the
child has exited), steady_samples_per_s (after step 20). Results: a table, ratios
(raylight / Ray Train, raylight_fsdp / raylight) and bench/results/lightning.json.
``--systems`` runs a subset (e.g. ``raylight raylight_fsdp``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# This file is named lightning.py: with its directory first on sys.path, `import
# lightning` would find it instead of the package, here and in Ray's workers (which put
# the driver script's directory first). So the bench helpers' directory goes after
# site-packages, and children run from a boot snippet in their own directory, with this
# module and its helpers pickled by value (see CHILD_BOOT).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

from common import machine_info, package_version, run_once, run_ray_train  # noqa: E402
from overhead import WARM_SAMPLES, StepClock, fmt, make_dataset, make_model, medians, ratio  # noqa: E402

SYSTEMS = ("ray_train", "raylight", "raylight_fsdp")
NUM_WORKERS = 2
RESULTS = Path(__file__).resolve().parent / "results" / "lightning.json"


def lightning_parts(job: dict[str, Any]) -> tuple[Any, Any, Any]:
    """The LightningModule, its DataLoader (per-worker batch) and the step-timing callback."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model(job["seed"])

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=job["lr"], momentum=0.9)

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.clock = StepClock()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if trainer.is_global_zero:
                self.clock.tick(len(batch[1]) * trainer.world_size)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.is_global_zero:
                Path(job["result_path"]).write_text(json.dumps(self.clock.summary()))

    loader = DataLoader(
        make_dataset(job["samples"], job["seed"]),
        batch_size=job["batch_size"] // NUM_WORKERS,
        shuffle=True,
    )
    return MLP(), loader, StepTimer()


TRAINER_KWARGS = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def ray_train_loop(job: dict[str, Any]) -> None:
    import lightning.pytorch as pl
    import torch
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    torch.set_num_threads(1)
    model, loader, timer = lightning_parts(job)
    trainer = pl.Trainer(
        max_epochs=job["epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[timer],
        **TRAINER_KWARGS,
    )
    prepare_trainer(trainer).fit(model, loader)


def child_ray_train(job: dict[str, Any]) -> None:
    run_ray_train(ray_train_loop, job, NUM_WORKERS)


def child_raylight(job: dict[str, Any], *, fsdp: bool = False) -> None:
    import lightning.pytorch as pl
    import ray

    from raylight.driver import runtime
    from raylight.lightning import RayFSDPStrategy, RayStrategy

    runtime.start_embedded(num_cpus=NUM_WORKERS, temp_dir=job["ray_temp_dir"])
    try:
        model, loader, timer = lightning_parts(job)
        kind = RayFSDPStrategy if fsdp else RayStrategy
        trainer = pl.Trainer(
            max_epochs=job["epochs"],
            strategy=kind(num_workers=NUM_WORKERS, threads_per_worker=1),
            callbacks=[timer],
            default_root_dir=job["storage_path"],
            **TRAINER_KWARGS,
        )
        trainer.fit(model, loader)
        warm = None
        if not fsdp:  # the notebook user's next fit: a new Trainer, workers from the pool
            again = {**job, "samples": WARM_SAMPLES, "epochs": 1, "result_path": job["result_path"] + ".warm"}
            model, loader, timer = lightning_parts(again)
            called = time.time()
            pl.Trainer(
                max_epochs=1, strategy=RayStrategy(num_workers=NUM_WORKERS, threads_per_worker=1),
                callbacks=[timer], default_root_dir=job["storage_path"], **TRAINER_KWARGS,
            ).fit(model, loader)
            warm = json.loads(Path(again["result_path"]).read_text())["first_step_end"] - called
    finally:
        ray.shutdown()
    if warm is not None:
        result = Path(job["result_path"])
        result.write_text(json.dumps({**json.loads(result.read_text()), "warm_fit_start_s": warm}))


def child_raylight_fsdp(job: dict[str, Any]) -> None:
    child_raylight(job, fsdp=True)


CHILDREN = {"ray_train": child_ray_train, "raylight": child_raylight, "raylight_fsdp": child_raylight_fsdp}
RATIOS = {  # name: (system, baseline)
    "raylight_vs_ray_train": ("raylight", "ray_train"),
    "raylight_fsdp_vs_raylight": ("raylight_fsdp", "raylight"),
}

CHILD_BOOT = """
import importlib.util, json, sys
sys.path.append({here!r})
spec = importlib.util.spec_from_file_location("bench_lightning", {file!r})
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_lightning"] = bench
spec.loader.exec_module(bench)
import overhead, ray.cloudpickle
ray.cloudpickle.register_pickle_by_value(bench)
ray.cloudpickle.register_pickle_by_value(overhead)
bench.CHILDREN[sys.argv[1]](json.loads(sys.argv[2]))
"""


def child_command(system: str, job: dict[str, Any]) -> list[str]:
    boot = CHILD_BOOT.format(here=_HERE, file=os.path.abspath(__file__))
    return [sys.executable, "-c", boot, system, json.dumps(job)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = parser.parse_args(argv)
    job = {"samples": args.samples, "epochs": args.epochs, "batch_size": 128, "lr": 0.05, "seed": 0}
    reps: dict[str, list[dict[str, Any]]] = {name: [] for name in args.systems}
    for rep in range(args.reps):
        for name in args.systems:  # interleaved, so drift hits all alike
            print(f"rep {rep + 1}/{args.reps}: {name} ...", end=" ", flush=True)
            # booted by CHILD_BOOT, in its own directory
            record = run_once(name, job, args.timeout, command=child_command, in_run_dir=True)
            reps[name].append(record)
            print(f"{record['process_s']:.1f}s" if record["ok"] else f"FAILED ({record['error']})")
    summary = {
        n: {"median": medians(r), "ok_reps": sum(x["ok"] for x in r), "reps": r}
        for n, r in reps.items()
    }
    med = {n: s["median"] for n, s in summary.items()}
    ratios = {
        f"{key}_{metric}": ratio(med[system][metric], med[baseline][metric])
        for key, (system, baseline) in RATIOS.items()
        if system in med and baseline in med
        for metric in ("start_to_first_step_s", "wall_s", "process_s", "steady_samples_per_s")
    }
    print(
        f"\n{'system':<14} {'ok':>5} {'start->1st step s':>18} {'wall s':>8} {'process s':>10} {'steady samples/s':>17}"
    )
    for name, s in summary.items():
        m = s["median"]
        print(
            f"{name:<14} {s['ok_reps']}/{len(s['reps']):<3} {fmt(m['start_to_first_step_s'], '.2f'):>18} "
            f"{fmt(m['wall_s'], '.2f'):>8} {fmt(m['process_s'], '.2f'):>10} {fmt(m['steady_samples_per_s'], ',.0f'):>17}"
        )
        for rep in s["reps"]:
            if not rep["ok"]:
                print(f"  FAILED: {rep['error']}\n    " + rep["stderr_tail"][-600:])
    print("(medians over successful repetitions)")
    for key, value in ratios.items():
        print(f"{key}: {fmt(value, '.3f')}")
    results = {
        "config": {
            **job,
            "num_workers": NUM_WORKERS,
            "reps": args.reps,
            "model": "MLP 32-256-256-10",
            "backend": "gloo (CPU)",
            "torch_threads_per_worker": 1,
        },
        "machine": {**machine_info(), "lightning": package_version("lightning")},
        "systems": summary,
        **ratios,
        # a second trainer.fit in the same driver, from its call to its first step
        "warm_fit_start_s": med.get("raylight", {}).get("warm_fit_start_s"),
    }
    print(f"raylight warm fit start-to-first-step: {fmt(results['warm_fit_start_s'], '.3f')} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
