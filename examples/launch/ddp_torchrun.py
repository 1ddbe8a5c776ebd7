"""A plain torchrun-style DDP script: it runs unchanged under torchrun and raylight run.

    raylight run -n 2 examples/launch/ddp_torchrun.py --steps 20 --out /tmp/ddp.pt
    torchrun --nproc-per-node 2 examples/launch/ddp_torchrun.py --steps 20 --out /tmp/ddp.pt

Needs: pip install raylight

Each rank trains a small MLP on its shard of a fixed synthetic regression problem with
DistributedDataParallel (gloo); rank 0 saves the final parameters to --out. With
--checkpoint it saves its own checkpoint every step and resumes from it after a restart
(torchrun --max-restarts, raylight run --max-failures), and --fail-once-at STEP makes
rank 1 exit with code 5 at that step on the first attempt (TORCHELASTIC_RESTART_COUNT=0).
"""

import argparse
import gc
import os
import sys

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--fail-once-at", type=int, default=None)
    parser.add_argument("--exit-code", type=int, default=None, help="rank 1 exits with this code at once")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.exit_code is not None and rank == 1:
        print(f"rank {rank} exiting with {args.exit_code}", file=sys.stderr)
        sys.exit(args.exit_code)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64 * world, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    mine = slice(rank * 64, (rank + 1) * 64)

    start = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        print(f"resumed at step {start}")
    for step in range(start, args.steps):
        if step == args.fail_once_at and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            print(f"failing at step {step}", file=sys.stderr)
            sys.exit(5)
        loss = nn.functional.mse_loss(ddp(x[mine]), y[mine])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and args.checkpoint:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.checkpoint)
        dist.barrier()  # every rank sees the checkpoint of this step before the next
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.5f}")
    if rank == 0 and args.out:
        torch.save(model.state_dict(), args.out)
    # DDP leaves collective work objects in reference cycles; free them while the
    # interpreter is whole: left to its teardown, torch 2.13's gloo group can abort a
    # finished run with exit code 134 (docs/launch.md, "Ending a script cleanly").
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
