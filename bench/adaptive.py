"""python bench/adaptive.py: adaptive vs fixed batch, time to target accuracy, and costs.

Run:  make bench-adaptive   (installs the `bench` and `examples` extras, then runs this file)
      python bench/adaptive.py [--dataset diamonds|digits] [--reps 3] [--resize-reps 2]
                               [--epochs N] [--target ACC]
      python bench/adaptive.py --quick   (smoke run: a quarter of the epochs, target - 5 points)

The time-to-target job (--dataset, no download either way):
  diamonds (default)  plotnine's bundled diamonds: the 5-class cut from 22 numeric and
                      one-hot columns, 43,940 training / 10,000 held-out rows; MLP
                      22 -> 64 -> 64 -> 5; budget 8 epochs, target 75% (a fixed batch of 32
                      needs about 5 epochs, 1,373 steps each)
  digits              scikit-learn's 8x8 digits, 1,347 / 450 images; MLP 64 -> 128 -> 10;
                      budget 40 epochs, target 95% (a fixed batch needs about 13 epochs of
                      42 steps: about a second of training, too short for the engine to
                      profile before the target)
SGD (lr 0.01, momentum 0.9), initial global batch 32, 2 workers of 1 CPU and 1 torch
thread, DDP over gloo; the same for every system, with model init and data order seeded
by the repetition. Every epoch each system evaluates held-out accuracy on the same test
split. Every run trains the same budget in scale-invariant steps (AdaScale): --epochs
epochs of optimizer steps at the initial batch, counted as steps by the fixed runs and as
the adaptive optimizer's progress (the sum of its gains) by the adaptive run, which
therefore runs more, shorter epochs; the LR drops 10x at --lr-decay-at of the budget. The adaptive run may grow the global
batch to 512 (local_batch_bounds (8, 256)) and decides every 0.5 s (the default 3 s is
long against runs this short). The resize measurements always use digits.

  raylight_fixed     raylight.fit, fixed global batch (no adaptive=)
  ray_train_fixed    Ray Train's TorchTrainer, prepare_model / prepare_data_loader,
                     ray.train.report every epoch (with Ray Train V2's defaults a report
                     waits while the previous one is undrained: the controller polls every
                     2 s, RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, so short epochs last 2 s)
  raylight_adaptive  raylight.fit(adaptive=AdaptiveConfig(..., lr_rule="adascale")),
                     ctx.prepare_optimizer, ctx.prepare_loader(..., adaptive=True)

Every run is its own child process started cold (its own local Ray), systems interleaved
across repetitions, medians reported. Rank 0 writes wall-clock timestamps; against the
moment the parent launched the child they give, identically for all systems:

  to_target_from_launch_s      launch -> the end of the first evaluation at or above the
                               target accuracy (interpreter, Ray and worker start included)
  to_target_from_first_step_s  start of the first training step -> the same evaluation
                               (start-up separated out: training time only)
  final_accuracy               held-out accuracy once the budget is spent (the adaptive
                               run's accuracy after as many epochs as the fixed runs is
                               accuracy_at_epoch_budget)

Also measured, each in child processes of its own:

  noise overhead     on a bigger MLP (64 -> 512 -> 512 -> 10), raylight adaptive with the
                     batch pinned at the initial size: the time its noise-measuring steps
                     (1 in control_interval_steps) add over its other steps, timed in the
                     same run (median over runs). Beside it, adaptive overhead: steady
                     samples/s of raylight fixed vs pinned (the whole adaptive machinery:
                     measurement, plan agreement, the driver's polls and fits); per
                     repetition, --tput-blocks blocks of runs fixed, pinned, pinned, fixed;
                     the median of the blocks' overheads
  resize latency     an elastic job num_workers=(1, 2), scaling_policy="max", started while
                     a blocker actor holds one of the 2 CPUs; after the first checkpoint the
                     blocker is killed and the job grows 1 -> 2, in place or from the
                     checkpoint. result.resizes gives first_step_s (decision -> rank 0's first
                     batch at the new size, by rank 0's own clock stamp), pause_s (old workers
                     told to stop -> that batch) and, in place, the phases spawn/warm/stop/launch.
  prediction error   on held-out steps: at each decision of the adaptive runs, the
                     engine's predicted seconds per optimizer step for the running plan
                     (adaptive.jsonl's predicted_step_time) against the mean over the steps
                     up to the next decision (the next row's measured_step_time: steps
                     after the fit it predicted with), weighted by those steps; intervals
                     where the plan changed or with fewer than 5 steps are left out.
                     Also given, for unseen layouts: leave-one-layout-out on the profile
                     in adaptive_state.json (for each layout with at least 5 optimizer
                     steps, fit_perf_params on the other layouts, predict its mean seconds
                     per optimizer step). When no adaptive run saw 3 such layouts, layouts
                     are forced: short adaptive runs pinned at atomic batches 4, 8, 16, 64
                     and 256 (one Ray session), their profiles merged.

adaptive_vs_fixed_time_to_target is raylight fixed over raylight adaptive, medians of
to_target_from_first_step_s (both pay the same start-up; the from-launch ratio is also
given). A run that misses the target counts as slower than any that reached it. The
1-minute load average before and after each child is recorded: other work on the machine
distorts the timings.

Results: a table on stdout, bench/results/adaptive.json (named figures, goals, medians, raw
repetitions, machine info) and bench/results/adaptive.png (the adaptive trace of the median
adaptive repetition); --quick writes adaptive-quick.json / adaptive-quick.png instead.

This file is the command line and the entry point of the parent and of every child
process (--child); the benchmark itself is the package bench/adaptive_bench/ beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive_bench import benchmark
from adaptive_bench.children import CHILDREN
from adaptive_bench.tasks import DATASETS

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_BUDGET = {"diamonds": (8, 0.75), "digits": (40, 0.95)}  # epochs, target


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each system")
    parser.add_argument(
        "--resize-reps", type=int, default=2, help="repetitions of each resize kind"
    )
    parser.add_argument(
        "--dataset", choices=sorted(DATASETS), default="diamonds", help="the time-to-target task"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epoch budget (diamonds 8, digits 40)"
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="target held-out accuracy (diamonds 0.75, digits 0.95)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="initial global batch")
    parser.add_argument("--lr", type=float, default=0.01, help="initial learning rate")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument(
        "--lr-decay-at",
        type=float,
        default=0.75,
        help="time to target: the LR drops 10x after this fraction of the budget, in "
        "scale-invariant steps (0: constant LR)",
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=512, help="adaptive: largest global batch"
    )
    parser.add_argument(
        "--decision-interval", type=float, default=0.5, help="adaptive: seconds between decisions"
    )
    parser.add_argument("--tput-hidden", type=int, default=512, help="width of the throughput MLP")
    parser.add_argument(
        "--tput-samples", type=int, default=20_000, help="samples of each throughput run"
    )
    parser.add_argument(
        "--tput-blocks",
        type=int,
        default=4,
        help="blocks of fixed, pinned, pinned, fixed runs per repetition",
    )
    parser.add_argument(
        "--sweep-steps", type=int, default=30, help="steps per forced layout (if needed)"
    )
    parser.add_argument("--sections", default="ttt,tput,resize", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per child run")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 8 epochs, target 0.9, 1 repetition"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON results (default bench/results/adaptive.json, adaptive-quick.json with --quick)",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    epochs, target = DEFAULT_BUDGET[args.dataset]
    args.epochs = epochs if args.epochs is None else args.epochs
    args.target = target if args.target is None else args.target
    if args.quick:
        args.reps, args.resize_reps = 1, 1
        args.epochs, args.target = max(3, args.epochs // 4), args.target - 0.05
        args.tput_samples, args.sweep_steps, args.tput_blocks = 3_200, 12, 1
    if args.out is None:
        args.out = RESULTS_DIR / ("adaptive-quick.json" if args.quick else "adaptive.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child](json.loads(args.job))
        return
    benchmark.main(args)


if __name__ == "__main__":
    main()
