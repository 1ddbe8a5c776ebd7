"""A fake Ray cluster of a test's own: python -m tests.support.own_cluster CPUS [CPUS ...].

One node per argument (the first the head), each with that many CPUs, on loopback.
Prints ``ADDRESS <gcs address>`` once every node is up, runs until its stdin closes (the
test is done with it, or died), then shuts every node down.
"""

import sys

from raylight.driver import runtime

runtime._force_loopback()  # the fake nodes listen on 127.0.0.1 only

from ray.cluster_utils import Cluster  # noqa: E402


def main(cpus: list[int]) -> None:
    # No dashboard: nothing here uses it, and its process left /tmp/pymp-* behind.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus[0], "include_dashboard": False})
    try:
        for n in cpus[1:]:
            cluster.add_node(num_cpus=n)
        cluster.wait_for_nodes()
        print("ADDRESS", cluster.address, flush=True)
        sys.stdin.read()
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1])
