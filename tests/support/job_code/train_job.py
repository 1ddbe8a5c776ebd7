"""A training script submitted as a Ray Job by tests/jobs/test_jobs_on_ray.py (its working dir).

    raylight submit --working-dir tests/support/job_code --env STORE=/tmp/x -- python train_job.py EPOCHS

Trains a tiny loop on one worker, checkpointing every epoch. With PREEMPT_AT=E, a first
attempt (no checkpoint to start from) stops at epoch E and exits with raylight's
"preempted, resume me" code, as a run that cannot go on after a preemption does. With
BLOCK_AFTER=E, a first attempt writes its driver's pid to STORE/driver.pid and waits after
epoch E's checkpoint until something ends it (a test's SIGTERM, as a node's shutdown sends).
"""

import os
import sys
import threading

import ray

import raylight
from raylight.base.exit_codes import PREEMPTED_EXIT_CODE
from raylight.driver import runtime


def loop(ctx, config):
    ckpt = ctx.get_checkpoint()
    start = ckpt.load()["epoch"] + 1 if ckpt else 0
    if ctx.rank == 0:
        print(f"LOOP starts at epoch {start}", flush=True)
    for epoch in range(start, config["epochs"]):
        if ckpt is None and epoch == config["preempt_at"]:
            raise RuntimeError("preempted")
        ctx.report({"epoch": epoch}, checkpoint={"epoch": epoch})
        if ckpt is None and epoch == config["block_after"]:
            threading.Event().wait(600)


def main() -> int:
    config = {
        "epochs": int(sys.argv[1]), "preempt_at": int(os.environ.get("PREEMPT_AT", "-1")),
        "block_after": int(os.environ.get("BLOCK_AFTER", "-1")),
    }
    if config["block_after"] >= 0 and os.environ.get("RAYLIGHT_RESUME") != "1":
        with open(os.path.join(os.environ["STORE"], "driver.pid"), "w") as f:
            f.write(str(os.getpid()))
    try:
        result = raylight.fit(
            loop, config=config, num_workers=1, resources_per_worker={"CPU": 1},
            storage_path=os.environ["STORE"], progress=False,
        )
    except raylight.TrainingFailedError:
        print("PREEMPTED: exiting for a resubmission", flush=True)
        return PREEMPTED_EXIT_CODE
    print("FITTED", result.path, "epochs", [m["epoch"] for m in result.metrics_history], flush=True)
    print("EMBEDDED", runtime.current().embedded, "CLUSTER", ray.get_runtime_context().gcs_address, flush=True)
    with open("helper.txt") as f:  # from the uploaded working dir
        print("HELPER", f.read().strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
