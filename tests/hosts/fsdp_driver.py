"""Run on host a by tests/hosts/test_storage_over_hosts.py: FSDP with sharded checkpoints
(``tests.support.loops.epoch_loop``, a checkpoint every epoch) into ``storage_path``.

``fsdp_driver.py STORAGE NAME WORKERS EPOCHS [resume] [deepspeed]``; ``deepspeed``: DeepSpeed
ZeRO-3 (``tests.support.deepspeed_loops.epoch_loop``) instead of FSDP. STORAGE may be a
directory or an ``s3://`` URI. Prints as its last line (JSON) the
run's epochs' starts and its checkpoint's parameters as lists, or the error it raised (its
type and message) and whether the run directory appeared."""

import json
import os
import sys

import raylight
from tests.support import loops

storage, name, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
flags = set(sys.argv[5:])
resume = "resume" in flags
loop, strategy = loops.epoch_loop, raylight.FSDP(min_block_params=1)
if "deepspeed" in flags:  # partition even tiny tensors
    from tests.support import deepspeed_loops

    zero3 = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}
    loop, strategy = deepspeed_loops.epoch_loop, raylight.DeepSpeed(stage=3, config=zero3)
try:
    result = raylight.fit(
        loop,
        config={"epochs": epochs, "run_dir": os.path.join(storage, name)},
        num_workers=workers,
        strategy=strategy,
        storage_path=storage,
        name=name,
        resume=resume,
        max_failures=3,
        progress=False,
    )
except Exception as exc:  # what the test asserts on
    print(json.dumps({
        "error": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "run_dir": os.path.exists(os.path.join(storage, name)),
    }))
    sys.exit(0)
model = result.checkpoint.load()["model"]
print(json.dumps({
    "starts": [m["start"] for m in result.metrics_history],
    "num_failures": result.num_failures,
    "sharded": result.checkpoint.sharded,
    "files": sorted(result.checkpoint.metadata.get("files", [])),
    "model": {k: v.tolist() for k, v in model.items()},
}))
