"""`raylight run -n 1:2` on a fake cluster whose nodes come and go:
python -m tests.support.run_cluster_driver WORKDIR.

The head has one CPU: the run starts with one worker. A node joins (the run grows to
two), is lost with no notice (it shrinks to one, from the last checkpoint), and another
joins (it grows to two and finishes). Each change is made when rank 0's script says it
waits for it (``tests.support.run_scripts nodes``). Prints one JSON line for the test.
"""

import io
import json
import sys
import threading

from raylight.driver import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from raylight.launch.driver import launch  # noqa: E402


class Lines(io.StringIO):
    """The run's stdout: every line, and an event set when rank 0 says ``waiting to ...``."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.waiting: list[str] = []
        self.changed = threading.Condition()

    def write(self, text: str) -> int:
        sys.stdout.write(text)
        for line in text.splitlines():
            with self.changed:
                self.lines.append(line)
                if line.startswith("[rank 0] waiting to "):
                    self.waiting.append(line.rsplit(" ", 1)[1])
                    self.changed.notify_all()
        return len(text)

    def wait_for(self, count: int, timeout: float) -> str:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.waiting) >= count, timeout):
                raise TimeoutError(f"rank 0 did not reach wait {count} within {timeout:g}s: {self.lines[-5:]}")
            return self.waiting[count - 1]


def main(workdir: str) -> None:
    fast_health = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 4}
    # No dashboard: nothing here uses it, and its process, killed at shutdown, left a
    # multiprocessing temp dir (/tmp/pymp-*) behind on every run.
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "_system_config": fast_health},
    )
    ray.init(address=cluster.address)
    out = Lines()
    result: dict = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", launch(
        "tests.support.run_scripts", ["nodes", workdir], module=True, num_workers=(1, 2), storage_path=workdir,
        name="nodes", out=out, resize_interval_s=1.0,  # grow soon after each node joins
    )))
    try:
        thread.start()
        assert out.wait_for(1, 120) == "grow"
        joined = cluster.add_node(num_cpus=1)
        assert out.wait_for(2, 120) == "shrink"
        cluster.remove_node(joined, allow_graceful=False)  # lost, no notice
        assert out.wait_for(3, 120) == "grow"
        cluster.add_node(num_cpus=1)
        thread.join(120)
        worlds = [line.split()[3] for line in out.lines if line.startswith("[rank 0] world ")]
        print("RESULT", json.dumps({"code": result.get("code"), "worlds": worlds,
                                    "starts": [ln for ln in out.lines if ln.startswith("[rank 0] world ")]}), flush=True)
    finally:
        thread.join(60)
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    with runtime._lean_head():  # as tests.support.cluster_driver
        main(*sys.argv[1:])
