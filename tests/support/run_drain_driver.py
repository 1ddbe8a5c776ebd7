"""`raylight run -n 2` and a drain notice on a fake cluster:
python -m tests.support.run_drain_driver WORKDIR DEADLINE_S [STEPS [SIZE]].

A head and two nodes of 1 CPU (``ray.cluster_utils.Cluster``); the run's two workers take
two of them. Once rank 0's script (``tests.support.run_scripts drain``: steps of 0.1 s,
a checkpoint at step 0 only) has done 10 steps, the node of a worker that is not the head
is drained the way a cloud's preemption reaches Ray (``DRAIN_NODE_REASON_PREEMPTION``,
DEADLINE_S), and at its deadline it is taken away without grace, as a cloud takes it. The
run goes on to STEPS (default 40). SIZE is ``-n``'s (default 2; ``1:2`` an elastic run). Prints one JSON line: the drain's and the node's
removal's times, when the driver logged the notice, each committed checkpoint (its step
and when its ``meta.json`` appeared), rank 0's steps (step, world, start, time) and the
exit code.
"""

import io
import json
import logging
import os
import sys
import threading
import time

from raylight.driver import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from raylight.launch.driver import launch, parse_size  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.support.cluster_driver import drain  # noqa: E402

FAST_HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}
DRAIN_AFTER_STEPS = 10


class NoticeLog(logging.Handler):
    """When the driver logged each node's notice."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.times: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "was given notice" in record.getMessage():
            self.times.append(record.created)


def steps(workdir: str) -> list[tuple[int, int, int, float]]:
    path = os.path.join(workdir, "steps")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = [line.split() for line in f.read().splitlines() if line.strip()]
    return [(int(s), int(w), int(a), float(t)) for s, w, a, t in rows]


def checkpoints(run_dir: str) -> list[dict]:
    """Each committed checkpoint: its index, the step it holds, when it was committed."""
    out = []
    root = os.path.join(run_dir, "checkpoints")
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        meta = os.path.join(root, name, "meta.json")
        if name.startswith("checkpoint_") and os.path.exists(meta):
            state = torch.load(os.path.join(root, name, "state.pt"), weights_only=True)
            out.append({"name": name, "step": int(state["step"]), "committed": os.stat(meta).st_mtime})
    return out


def used_worker_node(head_id: str) -> str:
    """A node other than the head whose CPU a worker holds."""
    free = ray._private.state.state.available_resources_per_node()
    used = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != head_id and free.get(n["NodeID"], {}).get("CPU", 0) < 1]
    assert used, f"no worker on a node other than the head: {free}"
    return used[0]["NodeID"]


def main(workdir: str, deadline_s: str, total: str = "40", size: str = "2") -> None:
    notices = NoticeLog()
    logging.getLogger("raylight").addHandler(notices)
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": FAST_HEALTH},
    )
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    head_id = ray.get_runtime_context().get_node_id()
    result: dict = {}
    out = io.StringIO()
    thread = threading.Thread(target=lambda: result.setdefault("code", launch(
        "tests.support.run_scripts", ["drain", workdir, total], module=True, num_workers=parse_size(size), storage_path=workdir,
        name="drain", out=out,
    )), daemon=True)
    try:
        thread.start()
        wait_until(lambda: len(steps(workdir)) >= DRAIN_AFTER_STEPS or not thread.is_alive(), 180, "10 steps at 2 workers")
        victim_id = used_worker_node(head_id)
        victim = next(n for n in nodes if n.node_id == victim_id)
        drained_at = time.time()
        drain(victim_id, float(deadline_s))
        while time.time() < drained_at + float(deadline_s):
            time.sleep(0.05)
        cluster.remove_node(victim, allow_graceful=False)  # the cloud takes the node at its deadline
        removed_at = time.time()
        thread.join(240)
        print("RESULT", json.dumps({
            "code": result.get("code"), "drained_at": drained_at, "removed_at": removed_at,
            "notice_logged": notices.times, "checkpoints": checkpoints(os.path.join(workdir, "drain")),
            "steps": steps(workdir), "output": out.getvalue().splitlines()[-20:],
        }), flush=True)
    finally:
        thread.join(60)
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with runtime._lean_head():  # as tests.support.cluster_driver
        main(*sys.argv[1:])
