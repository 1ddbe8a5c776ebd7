"""Elastic training on a fake 3-node cluster: python -m tests.ray.cluster_driver WORKDIR.

Trains with one worker per node, removes a node mid-training (the job continues on
fewer workers), adds it back (the job grows), stops, then trains an uninterrupted
reference for the same number of epochs. Prints one JSON line for the test to check.
"""

import json
import logging
import os
import sys
import threading

from raylight import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raylight  # noqa: E402
from raylight import RunConfig, ScalingConfig, TrainerConfig  # noqa: E402
from tests.helpers import read_trace, wait_until  # noqa: E402
from tests.ray import loops  # noqa: E402


def main(workdir: str) -> None:
    fast_health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": fast_health})
    cluster.add_node(num_cpus=1)
    third = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        run_dir = os.path.join(workdir, "elastic")
        stop = os.path.join(workdir, "stop")
        config = {"batch_size": 24, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 3}
        trainer = raylight.Trainer(
            loops.elastic_loop,
            train_loop_config=config,
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), scaling_policy="max", resize_interval_s=0.3),
                run=RunConfig(storage_path=workdir, name="elastic", progress=False),
            ),
        )
        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()))
        thread.start()
        try:
            wait_until(lambda: os.path.exists(os.path.join(run_dir, "metrics.jsonl")) and os.path.getsize(os.path.join(run_dir, "metrics.jsonl")) > 0, 120, "training to start")
            cluster.remove_node(third)
            wait_until(lambda: sum(1 for r in read_trace(run_dir) if r.get("event") == "resized") >= 1 or not thread.is_alive(), 120, "the shrink")
            cluster.add_node(num_cpus=1)
            wait_until(lambda: sum(1 for r in read_trace(run_dir) if r.get("event") == "resized") >= 2 or not thread.is_alive(), 120, "the grow")
        finally:
            open(stop, "w").close()
            thread.join(300)
        result = out["result"]
        epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
        reference = raylight.fit(
            loops.elastic_loop,
            config={**config, "epochs": len(epochs), "stop_file": None},
            num_workers=3,
            storage_path=workdir,
            name="reference",
            progress=False,
        )
        ref_epochs = [m for m in reference.metrics_history if m.get("kind") == "epoch"]
        print("RESULT", json.dumps({"epochs": epochs, "resizes": result.resizes, "reference": ref_epochs}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(sys.argv[1])
