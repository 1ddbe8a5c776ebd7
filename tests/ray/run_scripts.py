"""Scripts `raylight run` runs in tests/ray/test_run.py, as `-m tests.ray.run_scripts MODE ...`:

- ``context DIR``: trains a counter through raylight.run_context(): reports every step with
  a checkpoint, resumes from the last committed one; rank 1 exits with code 4 at step 3
  of the first attempt (TORCHELASTIC_RESTART_COUNT=0).
- ``noinit``: rank 1 never calls init_process_group (it exits 0); rank 0 waits in it.
- ``sleep``: every rank inits, says "ready" and sleeps (Ctrl-C tests).
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def context() -> None:
    import raylight

    ctx = raylight.run_context()
    dist.init_process_group("gloo")
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    state = ctx.load_checkpoint()
    start = 0 if state is None else int(state["step"]) + 1
    weight = torch.zeros(2) if state is None else state["weight"]
    print(f"attempt {attempt} starts at step {start} of {ctx.world_size}")
    for step in range(start, 6):
        if step == 3 and ctx.rank == 1 and attempt == 0:
            sys.exit(4)
        weight = weight + 1
        ctx.report({"step": step, "weight_sum": weight.sum()}, checkpoint={"step": step, "weight": weight})
        dist.barrier()  # rank 0 reported step 2 before rank 1 fails at step 3
    dist.destroy_process_group()


def noinit() -> None:
    if os.environ["RANK"] == "1":
        print("rank 1 does not init")
        return
    dist.init_process_group("gloo")


def sleep() -> None:
    dist.init_process_group("gloo")
    print("ready", flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    {"context": context, "noinit": noinit, "sleep": sleep}[sys.argv[1]]()
