"""Two runs share a fake 2-node cluster through the raylight scheduler:
python -m tests.support.two_jobs_driver WORKDIR.

Two nodes of 2 CPUs. The scheduler starts; runs A and B (both elastic, 1 to 4 workers,
adaptive) register one after the other and start at their minimum (the scheduler gives a
run its minimum until its goodput model is fitted); then each grows or shrinks to what the
scheduler gives it from both models. Both stop at a stop file once B has trained and A has
resized. Prints one JSON line
(each run's adaptive.jsonl rows, its resizes, the scheduler's status while both ran and
at the end) for the test to check.
"""

import json
import logging
import os
import sys
import threading

from raylight.driver import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import raylight  # noqa: E402
from raylight import AdaptiveConfig, RunConfig, ScalingConfig, TrainerConfig  # noqa: E402
from raylight.scheduler import actor  # noqa: E402
from tests.helpers import read_trace, wait_until  # noqa: E402
from tests.support import loops  # noqa: E402


def _fit(out: dict, name: str, trainer) -> None:
    try:
        out[name] = trainer.fit()
    except Exception as exc:  # the test shows it
        out[name] = exc


def main(workdir: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    try:
        handle = actor.start()
        stop = os.path.join(workdir, "stop")
        positions = os.path.join(workdir, "positions_b")
        base = {"batch_size": 16, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 1000, "step_s": 0.02}

        def trainer(name: str, workers, adaptive, config):
            return raylight.Trainer(
                loops.elastic_loop, train_loop_config={**base, **config},
                config=TrainerConfig(
                    scaling=ScalingConfig(num_workers=workers, resize_interval_s=0.5),
                    adaptive=adaptive, run=RunConfig(storage_path=workdir, name=name, progress=False),
                ),
            )

        out: dict = {}
        quick = AdaptiveConfig(decision_interval_s=0.5, min_profile_steps=2)
        a = threading.Thread(target=_fit, args=(out, "a", trainer("a", (1, 4), quick, {})))
        a.start()
        run_a, run_b = os.path.join(workdir, "a"), os.path.join(workdir, "b")
        b = None
        try:
            wait_until(lambda: any(r.get("event") == "allocation" for r in read_trace(run_a)) or not a.is_alive(), 120, "A's first allocation")
            b = threading.Thread(target=_fit, args=(out, "b", trainer("b", (1, 4), quick, {"positions": positions})))
            b.start()

            def b_trained() -> bool:
                return (os.path.exists(positions) and sum(1 for _ in open(positions)) >= 5) or not b.is_alive()

            wait_until(b_trained, 120, "B to train")

            def a_resized() -> bool:  # to the allocation its goodput model won it (a step there)
                return any(r.get("event") == "resized" for r in read_trace(run_a)) or not a.is_alive()

            wait_until(a_resized, 120, "A to take its allocation")
            both = ray.get(handle.status.remote(), timeout=30)
        finally:
            open(stop, "w").close()
            a.join(300)
            if b is not None:
                b.join(300)
        end = ray.get(handle.status.remote(), timeout=30)
        print("RESULT", json.dumps({
            "errors": {k: repr(v) for k, v in out.items() if isinstance(v, Exception)},
            "resizes": {k: v.resizes for k, v in out.items() if not isinstance(v, Exception)},
            "trace": {"a": read_trace(run_a), "b": read_trace(run_b)},
            "both": both, "end": end,
        }, default=str), flush=True)
    finally:
        actor.stop()
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    with runtime._lean_head():
        main(*sys.argv[1:])
