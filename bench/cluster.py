"""Cost and time to a target accuracy on an autoscaling cluster, and one spot preemption.

Run:  make bench-cluster
      python bench/cluster.py            (about 3 minutes on 2 cores)
      python bench/cluster.py --quick    (smoke run: a low target, a short preemption run)

Every peer runs in a cold child process on a fresh autoscaling cluster of its own (Ray's
real autoscaler driving the fake multi-node provider: real raylets started and stopped on
this machine, tests/support/autoscaling.py), so nodes left by one peer never serve another:

  head   1 CPU, on-demand, 0.40 USD/h (always up)
  spot   1 CPU, 0 to 2 nodes, 0.12 USD/h, removed after IDLE_TIMEOUT_MIN idle

The job: an MLP 64-1024-1024-10 on scikit-learn's digits (the 1,347 training images
repeated 8 times with Gaussian pixel noise, 10,776 samples an epoch; 450 held out),
SGD lr 0.01 momentum 0.9, initial global batch 48, 1 torch thread per worker, evaluated
on the held-out set after every epoch; it stops at the first epoch at or above TARGET.
Peers:

  raylight_adaptive  raylight, num_workers=(1, 3), autoscale=True, the goodput policy
                     (the default), adaptive batch size (AdaScale)
  raylight_fixed     the same script with num_workers=3, no adaptive: its pending
                     placement group makes the autoscaler add the two spot nodes
  ray_train_elastic  Ray Train V2 TorchTrainer, ScalingConfig(num_workers=(1, 3)),
                     the same model and loop (prepare_model / prepare_data_loader,
                     ray.train.report with a checkpoint per epoch)

Cost is measured alike for the three, the way a cloud bills: a sampler thread in the
driver reads the cluster's alive nodes (ray.nodes(), every SAMPLE_S) from submission
(just before fit) until the cluster is back to the head alone; node-seconds by type times
the prices. raylight's own Result.cost (its workers' nodes while the run holds them) is
recorded beside it. Time to target: submission to rank 0's report of the first epoch at
or above TARGET.

A fourth scenario, preemption: raylight elastic (1, 3) with the 'max' policy on a cluster
with both spot nodes up, checkpoints at epoch ends only; mid-epoch one spot node is
drained the way a cloud's preemption reaches Ray (DRAIN_NODE_REASON_PREEMPTION, 10 s
deadline). Rank 0 logs (epoch, loader cursor, world size, time) each step; a position
logged twice is a step run twice (lost). Recovery is the resize's pause_s (workers told
to stop -> first step at the new size).

Drain deadlines (deadline_<strategy>_<seconds>, DDP and FSDP, deadlines 3, 8 and 30 s):
each on a fake 3-node cluster of its own (ray.cluster_utils.Cluster, no autoscaler), the
same model with global batch 480 (steps of 50-150 ms here), or 4800 for the _long
peers (steps of 0.3-0.4 s: the 16 steps between control steps outlast a 3 s deadline),
one node drained a third into epoch 1 and removed without
grace at its deadline, as a cloud takes it. Measured from the drain call: notice seen,
just-in-time checkpoint committed (the trace's snapshot row), resumed (rank 0's first step
at 2 workers), samples trained twice, and whether the commit came before the node went.
  python bench/cluster.py --peers deadline_ddp_3,deadline_ddp_8,deadline_ddp_30,\
      deadline_fsdp_3,deadline_fsdp_8,deadline_fsdp_30,deadline_ddp_3_long,... --out bench/results/cluster-deadlines.json

Results: a table on stdout and bench/results/cluster.json (figures, the raw per-peer
records, machine info, the git commit). One repetition of each peer (time budget).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.autoscaling: the private autoscaling cluster

import torch  # noqa: E402
from common import ChildRun, machine_info, run_child, script_command, write_results  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PRICES = {"head": 0.40, "spot": 0.12}  # USD per node-hour
NODE_TYPES = {"spot": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2}}
IDLE_TIMEOUT_MIN = 0.1  # the autoscaler removes a spot node idle this long (6 s)
SAMPLE_S = 0.25  # the node sampler's period
TARGET = 0.97
QUICK_TARGET = 0.93
MAX_EPOCHS = 30
DRAIN_DEADLINE_S = 10.0
COST_GOAL = 0.5  # raylight adaptive cost <= this x Ray Train elastic, at equal or better time
RECOVERY_GOAL_S = 5.0
PEERS = ("raylight_adaptive", "raylight_fixed", "ray_train_elastic")
# A drain notice per deadline and strategy: deadline_ddp_3, ..., deadline_fsdp_30, and
# the same with long steps: deadline_ddp_3_long, ...
DEADLINE_PEERS = tuple(
    f"deadline_{s}_{d}{tail}" for tail in ("", "_long") for s in ("ddp", "fsdp") for d in (3, 8, 30)
)
JIT_GOAL_S = 2.0  # notice -> just-in-time checkpoint committed
# The deadline runs' job: the same model, global batch 480 (160 a worker at 3): steps of
# 50-150 ms here.
DEADLINE_JOB: dict[str, Any] = {"batch_size": 480, "repeat": 8}
# Long steps: global batch 4800 on the training set repeated 40 times (11 steps an epoch):
# steps of 0.3-0.4 s here, so the 16 steps between control steps outlast a 3 s deadline.
DEADLINE_LONG_JOB: dict[str, Any] = {"batch_size": 4800, "repeat": 40}


# -- the job, shared by every peer ------------------------------------------------------


def job_data(repeat: int, seed: int = 1) -> tuple[TensorDataset, TensorDataset]:
    """digits, the training split repeated ``repeat`` times with pixel noise; the same on
    every rank (seeded)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    gen = torch.Generator().manual_seed(seed)
    x_tr, y_tr = x_tr.repeat(repeat, 1), y_tr.repeat(repeat)
    x_tr = (x_tr + 0.15 * torch.randn(x_tr.shape, generator=gen)).clamp(0.0, 1.0)
    return TensorDataset(x_tr, y_tr), TensorDataset(x_te, y_te)


def make_model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


def accuracy(model: nn.Module, test: TensorDataset) -> float:
    model.eval()
    with torch.no_grad():
        x, y = test.tensors
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def log_row(path: str, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def raylight_loop(ctx: Any, config: dict[str, Any]) -> None:
    train, test = job_data(config["repeat"])
    model = ctx.prepare_model(make_model(config["hidden"]))
    opt = ctx.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9))
    ctx.load_checkpoint({"model": model, "opt": opt})
    loader = ctx.prepare_loader(train, batch_size=config["batch_size"], shuffle=True, adaptive=config["elastic"])
    loss_fn = nn.CrossEntropyLoss()
    # positions: rank 0 logs each step's position; a line logged twice is a step run twice
    positions = open(config["positions"], "a") if config.get("positions") and ctx.rank == 0 else None  # noqa: SIM115
    for epoch in ctx.epochs(config["max_epochs"]):
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if positions is not None:
                positions.write(f"{epoch} {loader.cursor} {ctx.world_size} {time.time():.4f}\n")
                positions.flush()
        acc = accuracy(model, test)
        ctx.report({"epoch": epoch, "test_accuracy": acc, "batch_size": ctx.batch_size},
                   checkpoint={"model": model, "opt": opt})
        if ctx.rank == 0:
            log_row(config["epochs_path"], {"epoch": epoch, "test_accuracy": acc, "time": time.time(),
                                            "workers": ctx.world_size, "batch_size": ctx.batch_size})
        if config["stop_at_target"] and acc >= config["target"]:
            break  # every rank evaluates the same model: all stop together


def ray_train_loop(config: dict[str, Any]) -> None:
    import tempfile

    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    ctx = ray.train.get_context()
    world, rank = ctx.get_world_size(), ctx.get_world_rank()
    train, test = job_data(config["repeat"])
    model = make_model(config["hidden"])
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # an elastic resize restarts the group from the last one
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    model = ray.train.torch.prepare_model(model)
    loader = ray.train.torch.prepare_data_loader(
        DataLoader(train, batch_size=max(1, config["batch_size"] // world), shuffle=True)
    )
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(start, config["max_epochs"]):
        if world > 1:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        acc = accuracy(model, test)
        metrics = {"epoch": epoch, "test_accuracy": acc}
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                torch.save({"model": model.module.state_dict() if world > 1 else model.state_dict(),
                            "opt": opt.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
                ckpt = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=ckpt)
        if rank == 0:
            log_row(config["epochs_path"], {**metrics, "time": time.time(), "workers": world,
                                            "batch_size": config["batch_size"] // world * world})
        if acc >= config["target"]:
            break


# -- in a child: one peer on a fresh autoscaling cluster --------------------------------


class NodeSampler:
    """Alive nodes by type, sampled every SAMPLE_S by a thread of the driver: what a cloud
    bills (a node costs from join to removal, here from registration to death)."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.samples: list[tuple[float, int, int]] = []  # (wall time, head, spot)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def counts(self) -> tuple[int, int]:
        alive = [n for n in self.ray.nodes() if n.get("Alive")]
        head = sum(1 for n in alive if "node:__internal_head__" in n.get("Resources", {}))
        return head, len(alive) - head

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                self.samples.append((time.time(), *self.counts()))
            self.stop.wait(SAMPLE_S)

    def node_seconds(self, start: float, end: float) -> dict[str, float]:
        """Each sample's counts held until the next sample, within [start, end]."""
        totals = {"head": 0.0, "spot": 0.0}
        points = [s for s in self.samples if s[0] <= end]
        for (t, head, spot), (t_next, _, _) in zip(points, [*points[1:], (end, 0, 0)], strict=True):
            lo, hi = max(t, start), min(t_next, end)
            if hi > lo:
                totals["head"] += head * (hi - lo)
                totals["spot"] += spot * (hi - lo)
        return totals


def wait_for(predicate: Any, timeout_s: float, period_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period_s)
    return predicate()


def read_rows(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def note_cluster_dir(job: dict[str, Any], address: str) -> None:
    """Tell the parent which temp dir is this cluster's, so it can end the cluster by PID
    if this child is killed before its own clean-up runs."""
    for config in glob.glob("/tmp/rl-as-*/autoscaling.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(Path(config).read_text())["provider"]["gcs_address"] == address:
                Path(job["cluster_dir_path"]).write_text(os.path.dirname(config))


def on_cluster(job: dict[str, Any], train: Any) -> None:
    """Start a fresh autoscaling cluster, run ``train(ray, record)`` from submission, wait
    until the cluster is back to the head alone, and write the child's record."""
    from raylight.driver import runtime

    runtime._force_loopback()
    import ray

    from tests.support.autoscaling import autoscaling_cluster

    record: dict[str, Any] = {"prices_usd_per_h": PRICES}
    with autoscaling_cluster(head_cpus=1, worker_types=NODE_TYPES, idle_timeout_minutes=IDLE_TIMEOUT_MIN) as address:
        note_cluster_dir(job, address)
        ray.init(address=address, logging_level="WARNING")
        sampler = NodeSampler(ray)
        sampler.thread.start()
        try:
            wait_for(lambda: bool(sampler.samples), 10)
            submitted = time.time()
            record["submitted"] = submitted
            train(ray, record)
            record["fit_s"] = time.time() - submitted
            back = wait_for(lambda: sampler.counts() == (1, 0), job["release_timeout_s"], 0.25)
            released = time.time()
        finally:
            sampler.stop.set()
            sampler.thread.join(5)
        record["released_to_head_alone"] = back
        record["released_s"] = released - submitted
        seconds = sampler.node_seconds(submitted, released)
        record["node_seconds"] = {k: round(v, 2) for k, v in seconds.items()}
        record["cost_usd"] = sum(seconds[k] * PRICES[k] for k in seconds) / 3600.0
        record["max_spot_nodes"] = max((s[2] for s in sampler.samples), default=0)
        record["node_timeline"] = compress_timeline(sampler.samples, submitted)
        rows = read_rows(job["epochs_path"])
        record["epochs"] = [{**r, "time": round(r["time"] - submitted, 3)} for r in rows]
        target = record.get("target", job["target"])
        hit = None if target is None else next((r for r in rows if r["test_accuracy"] >= target), None)
        record["time_to_target_s"] = None if hit is None else hit["time"] - submitted
        ray.shutdown()
    Path(job["result_path"]).write_text(json.dumps(record, default=str))


def compress_timeline(samples: list[tuple[float, int, int]], t0: float) -> list[list[float]]:
    """[seconds from submission, head, spot] at each change of the counts."""
    out: list[list[float]] = []
    for t, head, spot in samples:
        if not out or out[-1][1:] != [head, spot]:
            out.append([round(t - t0, 2), head, spot])
    return out


def raylight_config(job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    keys = ("repeat", "hidden", "lr", "batch_size", "max_epochs", "target", "epochs_path")
    return {**{k: job[k] for k in keys}, "stop_at_target": True, **extra}


def run_raylight(job: dict[str, Any], *, adaptive: bool) -> Any:
    import raylight
    from raylight import AdaptiveConfig, RunConfig, ScalingConfig, TrainerConfig

    def train(ray: Any, record: dict[str, Any]) -> None:
        scaling = ScalingConfig(num_workers=(1, 3), autoscale=True) if adaptive else ScalingConfig(num_workers=3)
        trainer = raylight.Trainer(
            raylight_loop,
            train_loop_config=raylight_config(job, elastic=adaptive),
            config=TrainerConfig(
                scaling=scaling,
                run=RunConfig(storage_path=job["storage_path"], name="run", progress=False, prices=PRICES),
                adaptive=AdaptiveConfig(max_batch_size=768, local_batch_bounds=(8, 256), lr_rule="adascale",
                                        decision_interval_s=1.0) if adaptive else None,
            ),
        )
        result = trainer.fit()
        record["raylight_cost"] = result.cost
        record["resizes"] = result.resizes
        trace = read_rows(os.path.join(job["storage_path"], "run", "adaptive.jsonl"))
        record["trace_events"] = [r for r in trace if r.get("event") in ("resized", "notice", "autoscale")]
        record["trace_sizes"] = size_decisions(trace)

    on_cluster(job, train)


def size_decisions(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine's decision rows, cut to the fields that say why a size was chosen."""
    keep = ("time", "workers", "global_batch", "atomic_bsz", "accum_steps", "noise_scale", "efficiency",
            "predicted_goodput", "measured_step_time", "decision", "reason")
    rows = [r for r in trace if "event" not in r]
    return [{k: r[k] for k in keep if k in r} for r in rows[:: max(1, len(rows) // 20)]]


def run_ray_train(job: dict[str, Any]) -> None:
    def train(ray: Any, record: dict[str, Any]) -> None:
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        TorchTrainer(
            ray_train_loop,
            train_loop_config={**raylight_config(job)},
            scaling_config=ScalingConfig(num_workers=(1, 3), use_gpu=False),
            run_config=RunConfig(storage_path=job["storage_path"], name="ray_train"),
        ).fit()

    on_cluster(job, train)


def run_preemption(job: dict[str, Any]) -> None:
    import raylight
    from raylight import RunConfig, ScalingConfig, TrainerConfig
    from tests.support.cluster_driver import drain

    def train(ray: Any, record: dict[str, Any]) -> None:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"CPU": 1}] * 3)  # both spot nodes up before the run
        record["spot_nodes_up"] = wait_for(lambda: spot_nodes(ray) == 2, 120)
        positions = os.path.join(job["storage_path"], "positions")
        run_dir = os.path.join(job["storage_path"], "run")
        trainer = raylight.Trainer(
            raylight_loop,
            train_loop_config=raylight_config(job, elastic=True, stop_at_target=False,
                                              max_epochs=job["preempt_epochs"], positions=positions),
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), scaling_policy="max", resize_interval_s=1.0),
                run=RunConfig(storage_path=job["storage_path"], name="run", progress=False, prices=PRICES),
            ),
        )
        out: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()), daemon=True)
        thread.start()
        steps_per_epoch = -(-job["repeat"] * 1347 // job["batch_size"])
        mid = wait_for(lambda: mid_epoch(positions, steps_per_epoch // 3), 180)
        victim = next((n["NodeID"] for n in ray.nodes()
                       if n.get("Alive") and "node:__internal_head__" not in n.get("Resources", {})), None)
        record["drained_mid_epoch"] = mid
        noticed_at = time.time()
        if victim is not None:
            drain(victim, DRAIN_DEADLINE_S)
        record["noticed_at"] = noticed_at - record["submitted"]
        thread.join(job["preempt_timeout_s"])
        request_resources(num_cpus=0)  # withdraw: the cluster goes back to the head alone
        if "result" not in out:
            record["error"] = "the preemption run did not finish"
            return
        result = out["result"]
        record["raylight_cost"] = result.cost
        record["resizes"] = result.resizes
        record["num_preemptions"] = result.num_preemptions
        trace = read_rows(os.path.join(run_dir, "adaptive.jsonl"))
        record["trace_events"] = [r for r in trace if r.get("event") in ("resized", "notice")]
        record.update(preemption_figures(positions, noticed_at, record["trace_events"]))
        record["target"] = None  # this scenario trains a fixed number of epochs

    on_cluster(job, train)


def spot_nodes(ray: Any) -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive") and "node:__internal_head__" not in n.get("Resources", {}))


def read_positions(path: str) -> list[tuple[int, int, int, float]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    return [(int(e), int(c), int(w), float(t)) for e, c, w, t in rows]


def mid_epoch(path: str, steps: int) -> bool:
    """Rank 0 is at least ``steps`` steps into epoch 1, at 3 workers."""
    rows = read_positions(path)
    return sum(1 for e, _, w, _ in rows if e == 1 and w == 3) >= steps


def preemption_figures(path: str, noticed_at: float, events: list[dict[str, Any]]) -> dict[str, Any]:
    rows = read_positions(path)
    keys = [(e, c) for e, c, _, _ in rows]
    lost = len(keys) - len(set(keys))
    shrink = next((r for r in rows if r[3] > noticed_at and r[2] < 3), None)
    window = sum(1 for r in rows if r[3] > noticed_at and (shrink is None or r[3] < shrink[3]))
    notice = next((r for r in events if r.get("event") == "notice"), None)
    shrunk = next((r for r in events if r.get("event") == "resized" and r.get("to", 3) < r.get("from", 3)), None)
    return {
        "steps_logged": len(rows),
        "preemption_lost_steps": lost,
        "notice_window_steps": window,  # steps rank 0 took between the drain call and the shrink
        "notice_seen_s": None if notice is None else notice["time"] - noticed_at,
        "notice_to_shrunk_first_step_s": None if shrink is None else shrink[3] - noticed_at,
        "preemption_recovery_s": None if shrunk is None else shrunk["pause_s"],
        "shrink_first_step_s": None if shrunk is None else shrunk["first_step_s"],
        "world_sizes": sorted({w for _, _, w, _ in rows}),
    }


# -- drain notices with short deadlines (issue 53) ---------------------------------------

DEADLINES_S = (3.0, 8.0, 30.0)
DEADLINE_STRATEGIES = ("ddp", "fsdp")
FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}


def run_deadline(job: dict[str, Any]) -> None:
    """One drain notice with ``job["deadline_s"]`` on a fake 3-node cluster
    (``ray.cluster_utils.Cluster``: a head and two nodes of 1 CPU, one worker each), the
    node taken away at its deadline as a cloud takes it (removed without grace, whether or
    not the run let it go). Elastic (1, 3), checkpoints at epoch ends only, the drain a
    third into epoch 1. Measured from the drain call: when the driver saw the notice, when
    the just-in-time checkpoint was committed, when rank 0 took its first step at the
    smaller size, the samples trained twice (positions rank 0 logged twice x the global
    batch), and the resize's phases."""
    from raylight.driver import runtime

    runtime._force_loopback()
    import ray
    from ray.cluster_utils import Cluster

    import raylight
    from raylight import RunConfig, ScalingConfig, TrainerConfig
    from tests.support.cluster_driver import drain

    record: dict[str, Any] = {"deadline_s": job["deadline_s"], "strategy": job["strategy"]}
    with runtime._lean_head():
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH})
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        positions = os.path.join(job["storage_path"], "positions")
        run_dir = os.path.join(job["storage_path"], "run")
        trainer = raylight.Trainer(
            raylight_loop,
            train_loop_config=raylight_config(job, elastic=True, stop_at_target=False,
                                              max_epochs=job["preempt_epochs"], positions=positions),
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), scaling_policy="max", resize_interval_s=1.0,
                                      warm_spare=False, strategy=job["strategy"]),
                run=RunConfig(storage_path=job["storage_path"], name="run", progress=False),
            ),
        )
        out: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()), daemon=True)
        thread.start()
        steps_per_epoch = -(-job["repeat"] * 1347 // job["batch_size"])
        record["drained_mid_epoch"] = wait_for(lambda: mid_epoch(positions, steps_per_epoch // 3), 240)
        victim = nodes[-1]
        noticed_at = time.time()
        drain(victim.node_id, job["deadline_s"])
        gone_at = noticed_at + job["deadline_s"]
        wait_for(lambda: time.time() >= gone_at, job["deadline_s"] + 1, 0.05)
        cluster.remove_node(victim, allow_graceful=False)  # the cloud takes the node at its deadline
        removed_at = time.time()
        thread.join(job["preempt_timeout_s"])
        if "result" not in out:
            record["error"] = "the run did not finish"
            return
        result = out["result"]
        record["num_preemptions"] = result.num_preemptions
        record["num_failures"] = result.num_failures
        trace = read_rows(os.path.join(run_dir, "adaptive.jsonl"))
        events = [r for r in trace if r.get("event") in ("resized", "notice", "snapshot")]
        record["trace_events"] = events
        record["node_removed_s"] = removed_at - noticed_at
        record.update(deadline_figures(positions, noticed_at, removed_at, events, job["batch_size"]))
    finally:
        ray.shutdown()
        cluster.shutdown()
        Path(job["result_path"]).write_text(json.dumps(record, default=str))


def deadline_figures(
    path: str, noticed_at: float, removed_at: float, events: list[dict[str, Any]], batch: int
) -> dict[str, Any]:
    rows = read_positions(path)
    keys = [(e, c) for e, c, _, _ in rows]
    twice = len(keys) - len(set(keys))
    resumed = next((r for r in rows if r[3] > noticed_at and r[2] < 3), None)
    notice = next((r for r in events if r.get("event") == "notice"), None)
    snap = next((r for r in events if r.get("event") == "snapshot"), None)
    shrunk = next((r for r in events if r.get("event") == "resized" and r.get("to", 3) < r.get("from", 3)), None)
    return {
        "notice_seen_s": None if notice is None else notice["time"] - noticed_at,
        "checkpoint_committed_s": None if snap is None else snap["time"] - noticed_at,
        "committed_before_node_removed": snap is not None and snap["time"] < removed_at,
        "resumed_s": None if resumed is None else resumed[3] - noticed_at,
        "steps_twice": twice,
        "samples_twice": twice * batch,
        "resize_kind": None if shrunk is None else shrunk.get("kind"),
        "resize_phases": None if shrunk is None else shrunk.get("phases"),
        "world_sizes": sorted({w for _, _, w, _ in rows}),
        "median_step_s_at_3": _median_step([r for r in rows if r[3] < noticed_at and r[2] == 3]),
    }


def _median_step(rows: list[tuple[int, int, int, float]]) -> float | None:
    gaps = sorted(b[3] - a[3] for a, b in itertools.pairwise(rows) if b[0] == a[0])
    return gaps[len(gaps) // 2] if gaps else None


CHILDREN = {
    "raylight_adaptive": lambda job: run_raylight(job, adaptive=True),
    "raylight_fixed": lambda job: run_raylight(job, adaptive=False),
    "ray_train_elastic": run_ray_train,
    "preemption": run_preemption,
    "deadline": run_deadline,
}


# -- the parent ---------------------------------------------------------------------------


def end_cluster(pointer: Path) -> list[int]:
    """Kill, by PID, what is left of a child's cluster (its processes name its temp dir)."""
    if not pointer.exists():
        return []
    temp_dir = pointer.read_text().strip()
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    pids = [int(line.split(None, 1)[0]) for line in out.splitlines() if temp_dir in line]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def run_peer(name: str, base_job: dict[str, Any], timeout_s: float, child: str | None = None) -> dict[str, Any]:
    run = ChildRun(base_job, prefix="rlc-")
    run.job.update(epochs_path=str(run.dir / "epochs.jsonl"), cluster_dir_path=str(run.dir / "cluster_dir"))
    record: dict[str, Any] = {"peer": name, "ok": False}
    print(f"{name}: running (timeout {timeout_s:.0f}s)", flush=True)
    run.launch(script_command(__file__, child or name, run.job), timeout_s)
    record["process_s"] = round(run.process_s, 2)
    record["leftover_pids"] = run.reap() + end_cluster(Path(run.job["cluster_dir_path"]))
    if run.error is not None:
        record["error"] = run.error
    else:
        try:
            record.update(json.loads(Path(run.job["result_path"]).read_text()))
        except (OSError, ValueError):
            record["error"] = "the child wrote no result"
    return run.finish(record)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def git_commit() -> str | None:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: low target, short preemption run")
    parser.add_argument("--peers", default=",".join([*PEERS, "preemption", *DEADLINE_PEERS]),
                        help="comma-separated subset")
    parser.add_argument("--out", default=None, help="results file (default bench/results/cluster.json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if run_child(args, CHILDREN):
        return
    job = {
        "repeat": 2 if args.quick else 8, "hidden": 1024, "lr": 0.01, "batch_size": 48,
        "max_epochs": MAX_EPOCHS, "target": QUICK_TARGET if args.quick else TARGET,
        "preempt_epochs": 3, "preempt_timeout_s": 150, "release_timeout_s": 90,
    }
    began = time.time()
    records = {}
    for name in args.peers.split(","):
        if name.startswith("deadline_"):
            _, strategy, deadline, *long = name.split("_")
            peer_job = {**job, "strategy": strategy, "deadline_s": float(deadline),
                        **(DEADLINE_LONG_JOB if long else DEADLINE_JOB)}
            records[name] = run_peer(name, peer_job, timeout_s=330, child="deadline")
            rec = records[name]
            print(f"  {name}: ok={rec.get('ok')} notice seen {rec.get('notice_seen_s')} s, checkpoint committed "
                  f"{rec.get('checkpoint_committed_s')} s, resumed {rec.get('resumed_s')} s, samples twice "
                  f"{rec.get('samples_twice')}, resize {rec.get('resize_kind')} {rec.get('error', '')}", flush=True)
            continue
        records[name] = run_peer(name, job, timeout_s=330)
        rec = records[name]
        print(f"  {name}: ok={rec.get('ok')} to target {rec.get('time_to_target_s')} s, "
              f"cost {rec.get('cost_usd')} USD, process {rec['process_s']} s {rec.get('error', '')}", flush=True)
    ada, fixed, rt = (records.get(p, {}) for p in PEERS)
    pre = records.get("preemption", {})
    figures = {
        "cost_vs_fixed": ratio(ada.get("cost_usd"), fixed.get("cost_usd")),
        "time_to_target_vs_fixed": ratio(ada.get("time_to_target_s"), fixed.get("time_to_target_s")),
        "cost_vs_ray_train_elastic": ratio(ada.get("cost_usd"), rt.get("cost_usd")),
        "time_to_target_vs_ray_train_elastic": ratio(ada.get("time_to_target_s"), rt.get("time_to_target_s")),
        "preemption_lost_steps": pre.get("preemption_lost_steps"),
        "preemption_notice_window_steps": pre.get("notice_window_steps"),
        "preemption_recovery_s": pre.get("preemption_recovery_s"),
        "preemption_first_step_s": pre.get("shrink_first_step_s"),
        "preemption_notice_to_shrunk_first_step_s": pre.get("notice_to_shrunk_first_step_s"),
        "deadlines": {
            name.removeprefix("deadline_"): {k: records[name].get(k) for k in (
                "deadline_s", "notice_seen_s", "checkpoint_committed_s", "resumed_s", "samples_twice",
                "committed_before_node_removed", "resize_kind", "median_step_s_at_3")}
            for name in DEADLINE_PEERS if name in records
        },
    }
    goals = {
        "cost_vs_ray_train_elastic": f"<= {COST_GOAL} at time_to_target_vs_ray_train_elastic <= 1",
        "preemption_lost_steps": "<= preemption_notice_window_steps",
        "preemption_recovery_s": f"< {RECOVERY_GOAL_S}",
        "deadlines": f"checkpoint_committed_s < {JIT_GOAL_S} (and before the node goes), samples_twice 0",
    }
    results = {
        "benchmark": "cluster",
        "quick": args.quick,
        "repetitions": 1,
        "git_commit": git_commit(),
        "machine": machine_info(),
        "job": job,
        "prices_usd_per_h": PRICES,
        "idle_timeout_minutes": IDLE_TIMEOUT_MIN,
        "figures": figures,
        "goals": goals,
        "wall_s": round(time.time() - began, 1),
        "records": records,
    }
    print(json.dumps(figures, indent=2))
    default = RESULTS_DIR / ("cluster-quick.json" if args.quick else "cluster.json")
    write_results(Path(args.out) if args.out else default, results)


if __name__ == "__main__":
    main()
