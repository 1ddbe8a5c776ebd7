"""Run on host a by tests/hosts/test_cluster_over_hosts.py: an elastic run of 1-2 workers (one
per raylet host) until the test writes ``<dir>/stop``; prints the epochs' sample sums and the
resizes as the last line (JSON). A second argument, JSON, sets ``FailureConfig`` fields (the
partition test's short timeouts)."""

import json
import os
import sys

import raylight
from raylight import FailureConfig, RunConfig, ScalingConfig, TrainerConfig
from tests.support import loops

shared = sys.argv[1]
failure = FailureConfig(**json.loads(sys.argv[2])) if len(sys.argv) > 2 else FailureConfig()
config = {
    "batch_size": 24,
    "epochs": 10_000,
    "stop_file": os.path.join(shared, "stop"),
    "checkpoint_every": 1000,
    "objects": True,
    "positions": os.path.join(shared, "positions"),
}
trainer = raylight.Trainer(
    loops.elastic_loop,
    train_loop_config=config,
    config=TrainerConfig(
        scaling=ScalingConfig(num_workers=(1, 2), scaling_policy="max", resize_interval_s=0.3),
        run=RunConfig(storage_path=os.path.join(shared, "runs"), name="elastic", progress=False),
        failure=failure,
    ),
)
result = trainer.fit()
epochs = [m for m in result.metrics_history if m.get("kind") == "epoch"]
print(
    json.dumps({"epochs": epochs, "resizes": result.resizes, "num_failures": result.num_failures})
)
