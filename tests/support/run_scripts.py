"""Scripts `raylight run` runs in tests/launch/test_run.py, as `-m tests.support.run_scripts MODE ...`:

- ``context DIR``: trains a counter through raylight.run_context(): reports every step with
  a checkpoint, resumes from the last committed one; rank 1 exits with code 4 at step 3
  of the first attempt (TORCHELASTIC_RESTART_COUNT=0).
- ``noinit``: rank 1 never calls init_process_group (it exits 0); rank 0 waits in it.
- ``sleep``: every rank inits, says "ready" and sleeps (Ctrl-C tests).
- ``world``: every rank inits and prints its WORLD_SIZE.
- ``elastic``: trains a counter through raylight.run_context() under ``-n 1:2``; on the
  first attempt rank 1 kills its own worker process (its agent, RAYLIGHT_RUN_PARENT) at
  step 3; at one worker the script does a step, then waits for the run to grow back
  (exit 5 if it never does); at two it finishes.
- ``fit DIR``: every rank calls ``raylight.fit(loops.sgd_loop, num_workers=2)`` with its
  run in DIR/fit, prints ``result`` and the result's history and path; rank 0 saves the
  trained parameters to DIR/model.pt.
- ``steps N``: counts to step N (exclusive) through raylight.run_context(), resuming
  from its last checkpoint (``raylight run --resume``), one report and checkpoint a step.
- ``nodes``: under ``-n 1:2`` on a fake cluster whose nodes come and go
  (``run_cluster_driver``): at one worker as ``elastic``; at two, before any loss
  (TORCHELASTIC_RESTART_COUNT=0), it waits for a node to be taken away, else it finishes.
- ``drain DIR N``: counts to step N (exclusive) in steps of DRAIN_STEP_S, each ended by an
  all-reduce (the ranks in lockstep, as DDP's), checkpointing through run_context() only
  at step 0; it asks ``should_stop()`` at every step boundary and, told to stop, reports
  a checkpoint of where it is and exits 0 (``run_drain_driver``). Rank 0 logs
  ``step world attempt time`` per step to DIR/steps.
"""

import os
import signal
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


def world() -> None:
    dist.init_process_group("gloo")
    print(f"world size {dist.get_world_size()} (WORLD_SIZE={os.environ['WORLD_SIZE']})")
    dist.destroy_process_group()


def fit() -> None:
    import json

    import raylight
    from tests.support import loops

    out = sys.argv[2]
    torch.set_num_threads(1)
    result = raylight.fit(
        loops.sgd_loop, config={"lr": 0.05, "batch_size": 32, "epochs": 3}, num_workers=2, storage_path=out,
        name="fit", progress=False,
    )
    print("result", json.dumps({"history": result.metrics_history, "path": result.path}), flush=True)
    if os.environ["RANK"] == "0" and result.checkpoint is not None:
        torch.save(result.checkpoint.load()["model"], os.path.join(out, "model.pt"))


GROW_WAIT_S = 120.0  # at one worker: how long to wait for the run to grow back before failing


def _resumed():
    """The run's context, the step to start at and the weight, from its last checkpoint."""
    import raylight

    ctx = raylight.run_context()
    state = ctx.load_checkpoint()
    start = 0 if state is None else int(state["step"]) + 1
    weight = torch.zeros(2) if state is None else state["weight"]
    print(f"world {ctx.world_size} restart {ctx.restart_count} starts at step {start}", flush=True)
    return ctx, start, weight


def _step(ctx, step: int, weight: torch.Tensor) -> torch.Tensor:
    """One step of the counter: the weight goes up by one, reported with a checkpoint."""
    weight = weight + 1
    ctx.report({"step": step, "world": ctx.world_size, "weight_sum": weight.sum()}, checkpoint={"step": step, "weight": weight})
    return weight


def _one_step_then_wait_to_grow(ctx, start: int, weight: torch.Tensor) -> None:
    """One step alone, reported before the rendezvous: the run grows again only once the
    script is at work (its first report or its process group), so it is recorded. The run
    then restarts this script at two workers; exit 5 if it never does."""
    _step(ctx, start, weight)
    dist.init_process_group("gloo")
    print("waiting to grow", flush=True)
    time.sleep(GROW_WAIT_S)
    sys.exit(5)


def elastic() -> None:
    ctx, start, weight = _resumed()
    if ctx.world_size == 1:
        _one_step_then_wait_to_grow(ctx, start, weight)
    dist.init_process_group("gloo")
    for step in range(start, 6):
        if step == 3 and ctx.rank == 1 and ctx.restart_count == 0:
            os.kill(int(os.environ["RAYLIGHT_RUN_PARENT"]), signal.SIGKILL)  # this rank's worker is lost
            time.sleep(60)  # killed with it (PR_SET_PDEATHSIG)
        weight = _step(ctx, step, weight)
        dist.barrier()
    dist.destroy_process_group()


def steps() -> None:
    ctx, start, weight = _resumed()
    dist.init_process_group("gloo")
    for step in range(start, int(sys.argv[2])):
        weight = _step(ctx, step, weight)
        dist.barrier()
    dist.destroy_process_group()


def nodes() -> None:
    ctx, start, weight = _resumed()
    if ctx.world_size == 1:  # as in elastic(): one step, then wait for a node to join
        _one_step_then_wait_to_grow(ctx, start, weight)
    dist.init_process_group("gloo")
    for step in range(start, 6):
        weight = _step(ctx, step, weight)
        dist.barrier()
        if ctx.restart_count == 0:  # no node lost yet: wait for the test to take one away
            print("waiting to shrink", flush=True)
            time.sleep(GROW_WAIT_S)
            sys.exit(6)
    dist.destroy_process_group()


DRAIN_STEP_S = 0.1


def _count_start(path: str) -> int:
    """This start's number (0, 1, ...): rank 0 notes each start in ``path``."""
    with open(path, "a+") as f:
        f.seek(0)
        attempt = len(f.read().splitlines())
        f.write(f"{time.time():.6f}\n")
    return attempt


def drain() -> None:
    ctx, start, weight = _resumed()
    dist.init_process_group("gloo")
    log = os.path.join(sys.argv[2], "steps") if ctx.rank == 0 else None
    attempt = ctx.restart_count if log is None else _count_start(os.path.join(sys.argv[2], "starts"))
    should_stop = getattr(ctx, "should_stop", lambda: False)  # the code before it had none
    for step in range(start, int(sys.argv[3])):
        if should_stop():  # a notice: every rank agreed to stop here
            print(f"stopping at step {step}", flush=True)
            ctx.report({"step": step - 1, "world": ctx.world_size, "weight_sum": weight.sum()},
                       checkpoint={"step": step - 1, "weight": weight})
            break
        time.sleep(DRAIN_STEP_S)  # the step's compute
        weight = weight + 1
        dist.all_reduce(torch.zeros(1))  # the gradients' all-reduce
        ctx.report({"step": step, "world": ctx.world_size, "weight_sum": weight.sum()},
                   checkpoint={"step": step, "weight": weight} if step == 0 else None)
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{step} {ctx.world_size} {attempt} {time.time():.6f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    {"context": context, "noinit": noinit, "sleep": sleep, "world": world, "fit": fit, "elastic": elastic, "nodes": nodes, "steps": steps,
     "drain": drain}[sys.argv[1]]()
