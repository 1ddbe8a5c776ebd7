"""A drain notice due before the next control step: python -m tests.support.deadline_driver WORKDIR.

A fake 3-node cluster (``ray.cluster_utils.Cluster``: a head and two nodes of 1 CPU, one
worker each) trains with steps of STEP_S (a long step's compute, modelled in the loop) and
checkpoints at epoch ends only. Just after a control step (the workers agree on plans and
stops at every 16th step: rank 0's 17th step at 3 workers is one), the third node is
drained the way a cloud's preemption reaches Ray, and DEADLINE_STEPS of rank 0's steps
later it is taken away without grace, as a cloud takes a node at its deadline: well before
the next control step. Prints one JSON line for the test to check.
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
from tests.support.cluster_driver import _lines, drain  # noqa: E402

STEP_S = 0.4
DRAIN_AFTER_STEPS = 17  # rank 0's steps at 3 workers: the second control step is the 17th
DEADLINE_STEPS = 8  # the node goes this many of rank 0's steps after the drain (the next control step is 16 away)


def main(workdir: str) -> None:
    fast_health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_health},
    )
    cluster.add_node(num_cpus=1)
    third = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        run_dir = os.path.join(workdir, "deadline")
        stop = os.path.join(workdir, "stop")
        positions = os.path.join(workdir, "positions")
        config = {"batch_size": 24, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 1000,
                  "objects": True, "positions": positions, "step_s": STEP_S}
        trainer = raylight.Trainer(
            loops.elastic_loop,
            train_loop_config=config,
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), scaling_policy="max", resize_interval_s=0.3),
                run=RunConfig(storage_path=workdir, name="deadline", progress=False),
            ),
        )
        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()))
        thread.start()

        def at_three() -> int:
            return sum(1 for line in _lines(positions) if line.split()[2:] == ["3"])

        try:
            wait_until(lambda: at_three() >= DRAIN_AFTER_STEPS or not thread.is_alive(), 180, "17 steps at 3 workers")
            drained_after = at_three()
            steps_then = len(_lines(positions))
            drained_at = time.time()
            drain(third.node_id, DEADLINE_STEPS * STEP_S)
            wait_until(lambda: len(_lines(positions)) >= steps_then + DEADLINE_STEPS or not thread.is_alive(), 120,
                       "the steps to the deadline")
            cluster.remove_node(third, allow_graceful=False)  # the cloud takes the node
            removed_at = time.time()
            steps_at_removal = len(_lines(positions))
            wait_until(lambda: len(_lines(positions)) >= steps_at_removal + 12 or not thread.is_alive(), 180,
                       "training to go on without the node")
        finally:
            open(stop, "w").close()
            thread.join(240)
        result = out["result"]
        trace = read_trace(run_dir)
        print("RESULT", json.dumps({
            "epochs": [m for m in result.metrics_history if m.get("kind") == "epoch"],
            "resizes": result.resizes, "num_failures": result.num_failures,
            "num_preemptions": result.num_preemptions,
            "notice": [r for r in trace if r.get("event") == "notice"],
            "snapshot": [r for r in trace if r.get("event") == "snapshot"],
            "drained_after": drained_after, "drained_at": drained_at, "removed_at": removed_at,
            "steps": [tuple(map(int, line.split())) for line in _lines(positions)],
        }), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    with runtime._lean_head():
        main(*sys.argv[1:])
