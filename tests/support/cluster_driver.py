"""Elastic training on a fake 3-node cluster: python -m tests.support.cluster_driver WORKDIR.

Trains with one worker per node, checkpointing at epoch ends only. Mid-epoch, one node is
given notice the way a cloud's preemption reaches Ray (``ray drain-node --reason
DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds 10``) and goes at its deadline
(the run checkpoints where it stops and shrinks in place); then another node is lost with
no notice (the run shrinks again, from its last checkpoint); then two nodes are added back
(the run grows). An uninterrupted one-process run of as many epochs is the reference.
Prints one JSON line for the test to check.
"""

import json
import logging
import os
import sys
import threading
import time

from raylight.driver import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raylight  # noqa: E402
from raylight import RunConfig, ScalingConfig, TrainerConfig  # noqa: E402
from tests.helpers import read_trace, wait_until  # noqa: E402
from tests.support import loops  # noqa: E402

DRAIN_DEADLINE_S = 10.0


def drain(node_id: str, deadline_s: float) -> None:
    """Ray's node drain with a preemption reason (what ``ray drain-node`` sends)."""
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    accepted, why = gcs.drain_node(node_id, reason, "spot preemption (test)", int((time.time() + deadline_s) * 1000))
    assert accepted, why


def main(workdir: str) -> None:
    fast_health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}
    # No dashboard: nothing here uses it, and its process, killed at shutdown, left a
    # multiprocessing temp dir (/tmp/pymp-*) behind on every run.
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_health},
    )
    second = cluster.add_node(num_cpus=1)
    third = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        run_dir = os.path.join(workdir, "elastic")
        stop = os.path.join(workdir, "stop")
        positions = os.path.join(workdir, "positions")
        config = {"batch_size": 24, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 1000,
                  "objects": True, "positions": positions}
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

        def resized(count: int) -> bool:
            return sum(1 for r in read_trace(run_dir) if r.get("event") == "resized") >= count or not thread.is_alive()

        def alive(node) -> bool:
            return any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node.node_id)

        try:
            wait_until(lambda: any(line.split()[2:] == ["3"] for line in _lines(positions)[8:]), 120, "3 workers mid-epoch")
            noticed_at = time.time()
            drain(third.node_id, DRAIN_DEADLINE_S)
            wait_until(lambda: resized(1), 120, "the shrink after the notice")
            shrunk_at = time.time()
            # The node goes: by itself once idle, else at its deadline.
            wait_until(lambda: not alive(third) or time.time() > noticed_at + DRAIN_DEADLINE_S, 60, "the drained node to go")
            went_by_itself = not alive(third)
            cluster.remove_node(third, allow_graceful=False)
            cluster.remove_node(second)  # no notice: a node lost
            wait_until(lambda: resized(2), 120, "the shrink after the loss")
            cluster.add_node(num_cpus=1)
            cluster.add_node(num_cpus=1)
            wait_until(lambda: any(line.split()[2:] == ["3"] for line in _lines(positions)[-3:]) and resized(3), 120, "the grow")
        finally:
            open(stop, "w").close()
            thread.join(300)
        result = out["result"]
        epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
        reference = raylight.fit(
            loops.elastic_loop,
            config={**config, "epochs": len(epochs), "stop_file": None, "positions": None, "epoch_checkpoints": False},
            num_workers=0, storage_path=workdir, name="reference", progress=False,
        )
        ref_epochs = [m for m in reference.metrics_history if m.get("kind") == "epoch"]
        steps = [tuple(map(int, line.split())) for line in _lines(positions)]
        print("RESULT", json.dumps({
            "epochs": epochs, "resizes": result.resizes, "reference": ref_epochs, "steps": steps,
            "num_failures": result.num_failures, "num_preemptions": result.num_preemptions,
            "notice": [r for r in read_trace(run_dir) if r.get("event") == "notice"],
            "noticed_at": noticed_at, "shrunk_at": shrunk_at, "node_went_by_itself": went_by_itself,
        }), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line for line in f.read().splitlines() if line.strip()]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    # Its nodes start as raylight's embedded cluster does: Ray's minimal node agent (the
    # full one, with ray[default] installed, cost about 4 CPU-s per node here) and no
    # autoscaler monitor; nothing here uses either.
    with runtime._lean_head():
        main(*sys.argv[1:])
