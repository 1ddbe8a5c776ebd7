"""Run on a host by tests/hosts/test_cluster_over_hosts.py: DDP with 2 workers, one per raylet host."""

import json
import sys

import raylight
from tests.support import loops

config = {"lr": 0.05, "batch_size": 32, "epochs": 3, "report_hooks": True, "report_hosts": True}
two = raylight.fit(
    loops.sgd_loop,
    config=config,
    num_workers=2,
    storage_path=sys.argv[1],
    name="two",
    progress=False,
)
ref = loops.reference_sgd(config)
p2 = two.checkpoint.load()["model"]
print(
    json.dumps(
        {"metrics": two.metrics, "diff": max(float((p2[k] - ref[k]).abs().max()) for k in ref)}
    )
)
