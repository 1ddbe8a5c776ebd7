"""A driver process for the resume test: python -m tests.support.resume_driver STORAGE TEMP RESUME LOG [rival].

A rival (a second driver resuming a run another driver holds) starts no Ray of its own:
``fit`` refuses it before it starts anything."""

import sys

import raylight
from raylight.driver import runtime
from tests.support import loops

if __name__ == "__main__":
    storage, temp_dir, resume, log = sys.argv[1:5]
    if sys.argv[5:] != ["rival"]:
        runtime.start_embedded(num_cpus=2, temp_dir=temp_dir, object_store_memory=256 * 1024**2)
    config = {"epochs": 5, "log": log}
    if resume == "0":
        config["block_after"] = 2  # hang after checkpoint 2 until this driver is killed
    result = raylight.fit(
        loops.epoch_loop, config=config, num_workers=2, storage_path=storage, name="resumable",
        resume=resume == "1", progress=False,
    )
    print("EPOCHS", [m["epoch"] for m in result.metrics_history], flush=True)
