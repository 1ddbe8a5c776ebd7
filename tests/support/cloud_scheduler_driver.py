"""The raylight scheduler in cloud mode on Ray's real autoscaler:
python -m tests.support.cloud_scheduler_driver WORKDIR.

A head of 1 CPU and a node type of 1 CPU (0 to 2 nodes) that Ray's fake multi-node
provider starts as real raylets (tests/support/autoscaling.py). The scheduler starts in
cloud mode; one adaptive run (1 to 3 workers, autoscale off: the scheduler asks) starts
on the head alone. Once its goodput model is fitted the scheduler asks the autoscaler for
nodes, a node joins and the run grows onto it; then the run is told to stop, and the
scheduler's request drops. Prints one JSON line: the scheduler's view each half second
(nodes, asked for, the run's workers), the run's trace, the request at the end.
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
from raylight import AdaptiveConfig, RunConfig, ScalingConfig, TrainerConfig  # noqa: E402
from raylight.scheduler import actor  # noqa: E402
from tests.helpers import read_trace, wait_until  # noqa: E402
from tests.support import loops  # noqa: E402
from tests.support.autoscaling import autoscaling_cluster  # noqa: E402

NODE = {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2}
CLOUD = {
    "node_types": {"cpu_node": {"resources": {"CPU": 1}, "max_workers": 2}},
    "prices": {"head": 0.4, "cpu_node": 0.1}, "max_nodes": 3, "release_after_s": 10.0, "interval_s": 0.5,
}


def main(workdir: str) -> None:
    with autoscaling_cluster(head_cpus=1, worker_types={"cpu_node": NODE}, idle_timeout_minutes=0.05,
                             start_timeout_s=120) as address:
        ray.init(address=address)
        handle = actor.start(cloud=CLOUD)
        began = time.monotonic()
        views: list[dict] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                status = ray.get(handle.status.remote(), timeout=30)
                views.append({"t": round(time.monotonic() - began, 2), "nodes": status["cloud"]["nodes"],
                              "asked": status["cloud"]["asked"], "workers": {j["job_id"]: j["workers"] for j in status["jobs"]}})
                sampling.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        run_dir, stop = os.path.join(workdir, "grow"), os.path.join(workdir, "stop")
        trainer = raylight.Trainer(
            loops.elastic_loop,
            train_loop_config={"batch_size": 16, "epochs": 10_000, "stop_file": stop, "checkpoint_every": 1000, "step_s": 0.02},
            config=TrainerConfig(
                scaling=ScalingConfig(num_workers=(1, 3), resize_interval_s=0.5),
                adaptive=AdaptiveConfig(decision_interval_s=0.5, min_profile_steps=2),
                run=RunConfig(storage_path=workdir, name="grow", progress=False),
            ),
        )
        out: dict = {}
        thread = threading.Thread(target=lambda: out.setdefault("result", trainer.fit()))
        thread.start()
        try:
            wait_until(
                lambda: any(r.get("event") == "resized" and r.get("to", 0) >= 2 for r in read_trace(run_dir)) or not thread.is_alive(),
                120, "the run to grow onto a node the autoscaler added",
            )
        finally:
            open(stop, "w").close()
            thread.join(60)
        ended = round(time.monotonic() - began, 2)
        wait_until(lambda: bool(views) and views[-1]["asked"] == {} and views[-1]["t"] > ended, 45, "the request to drop")
        sampling.set()
        sampler.join(30)
        final = ray.get(handle.status.remote(), timeout=30)
        actor.stop()
        print("RESULT", json.dumps({
            "views": views, "ended": ended, "trace": read_trace(run_dir), "cloud": final["cloud"],
            "jobs": final["jobs"], "finished": "result" in out,
        }, default=str), flush=True)
        ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
