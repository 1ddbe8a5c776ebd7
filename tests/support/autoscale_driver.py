"""An elastic run that grows with Ray's real autoscaler: python -m tests.support.autoscale_driver WORKDIR.

A head of 1 CPU and a node type of 1 CPU (0 to 2 nodes) that Ray's fake multi-node
provider starts as real raylets when the autoscaler asks. The run (1 to 3 workers,
autoscale=True) starts on the head alone, asks the autoscaler for the workers its
policy wants, grows as the nodes join, and, once it has run at 3 workers, is told to
stop; its request is withdrawn and the nodes go once idle. An uninterrupted run in one
process is the reference. Prints one JSON line: the node count over time, epochs,
resizes, cost and the reference.
"""

import json
import os
import sys
import threading
import time

from raylight.driver import runtime

runtime._force_loopback()

import ray  # noqa: E402

import raylight  # noqa: E402
from raylight import RunConfig, ScalingConfig, TrainerConfig  # noqa: E402
from tests.helpers import read_trace, wait_until  # noqa: E402
from tests.support import loops  # noqa: E402
from tests.support.autoscaling import autoscaling_cluster  # noqa: E402

N = 2400  # samples: 100 steps an epoch
NODE_TYPES = {"cpu_node": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2}}


def alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def main(workdir: str) -> None:
    with autoscaling_cluster(head_cpus=1, worker_types=NODE_TYPES, idle_timeout_minutes=0.05) as address:
        ray.init(address=address)
        began = time.monotonic()
        timeline: list[tuple[float, int]] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                timeline.append((round(time.monotonic() - began, 2), alive_nodes()))
                sampling.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        run_dir, stop = os.path.join(workdir, "grow"), os.path.join(workdir, "stop")
        config = {"batch_size": 24, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 1000, "objects": True, "n": N}
        trainer = raylight.Trainer(
            loops.elastic_loop,
            train_loop_config=config,
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), scaling_policy="max", autoscale=True, resize_interval_s=0.5),
                run=RunConfig(storage_path=workdir, name="grow", progress=False, prices={"head": 0.4, "cpu_node": 0.1}),
            ),
        )
        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()))
        thread.start()
        try:
            wait_until(
                lambda: any(m.get("workers") == 3 for m in _metrics(run_dir)) or not thread.is_alive(),
                180, "an epoch at 3 workers",
            )
        finally:
            open(stop, "w").close()
            thread.join(120)
        result = out["result"]
        ended = time.monotonic() - began
        wait_until(lambda: alive_nodes() == 1, 90, "the autoscaler to remove the idle nodes")
        released = time.monotonic() - began
        sampling.set()
        sampler.join(5)
        timeline.append((round(released, 2), alive_nodes()))
        epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
        reference = raylight.fit(
            loops.elastic_loop, config={**config, "epochs": len(epochs), "stop_file": None, "epoch_checkpoints": False},
            num_workers=0, storage_path=workdir, name="reference", progress=False,
        )
        ref_epochs = [m for m in reference.metrics_history if m.get("kind") == "epoch"]
        first_report = min(r["_time"] for r in _metrics(run_dir)) - (time.time() - (time.monotonic() - began))
        print("RESULT", json.dumps({
            "timeline": timeline, "ended": ended, "released": released, "first_report": first_report,
            "epochs": epochs, "reference": ref_epochs, "resizes": result.resizes, "cost": result.cost,
            "requests": [r for r in read_trace(run_dir) if r.get("event") == "resized"],
        }), flush=True)
        ray.shutdown()


def _metrics(run_dir: str) -> list[dict]:
    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    main(sys.argv[1])
