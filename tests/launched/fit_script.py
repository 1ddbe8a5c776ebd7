"""A script an external launcher starts on every rank (torchrun, mpirun-style env):
``raylight.fit`` joins the launcher's group. Each rank writes what it saw to
``OUT/rank<r>.json`` and its place as raylight read it from the launcher's variables
to ``OUT/place<r>.json``; rank 0 also the trained parameters to ``OUT/model.pt``.

Usage: fit_script.py OUT STORAGE NAME [sgd|epochs EPOCHS] [--resume]
"""

from __future__ import annotations

import json
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import raylight  # noqa: E402
from raylight.worker import process_group  # noqa: E402
from tests.support import loops  # noqa: E402


def epochs_loop(ctx, config):
    """Checkpoints every epoch; every rank records where it started."""
    ckpt = ctx.get_checkpoint()
    start = ckpt.load()["epoch"] + 1 if ckpt is not None else 0
    model = ctx.prepare_model(loops.initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if ckpt is not None:
        ctx.unwrap_model(model).load_state_dict(ckpt.load()["model"])
    loader = ctx.prepare_loader(loops.regression_data(64), batch_size=16, shuffle=True)
    with open(os.path.join(config["out"], f"start{ctx.rank}.txt"), "a") as f:
        f.write(f"{start}\n")
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        total = loops.train_epoch(model, opt, loader)
        ctx.report({"epoch": epoch, "loss": ctx.all_reduce(total)}, checkpoint={"epoch": epoch, "model": ctx.unwrap_model(model).state_dict()})


def _keys_without_the_run_directory(checkpoint) -> list[str] | None:
    """The Result's checkpoint loaded as a rank on another machine would: it cannot open
    rank 0's run directory."""
    if checkpoint is None:
        return None
    import fsspec

    real = fsspec.open

    def elsewhere(*args, **kwargs):
        raise FileNotFoundError("rank 0's disk is on another machine")

    fsspec.open = elsewhere
    try:
        return sorted(checkpoint.load())
    finally:
        fsspec.open = real


def main() -> None:
    out, storage, name, kind = sys.argv[1:5]
    torch.set_num_threads(1)
    if kind == "sgd":
        result = raylight.fit(
            loops.sgd_loop, config={"lr": 0.05, "batch_size": 32, "epochs": 3}, num_workers=4,
            storage_path=storage, name=name, progress=False,
        )
    else:
        result = raylight.fit(
            epochs_loop, config={"epochs": int(sys.argv[5]), "out": out}, num_workers=2,
            storage_path=storage, name=name, progress=False, resume="--resume" in sys.argv,
        )
    launch = process_group.detect()
    rank = launch.rank if launch is not None else 0
    place = [launch.rank, launch.world_size, launch.local_rank, launch.local_world_size, launch.cross_rank,
             launch.cross_size, launch.rendezvous, launch.rendezvous_id] if launch is not None else None
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"history": result.metrics_history, "path": result.path, "checkpoint": result.checkpoint is not None,
                   "checkpoint_keys": _keys_without_the_run_directory(result.checkpoint)}, f)
    with open(os.path.join(out, f"place{rank}.json"), "w") as f:
        json.dump(place, f)
    if rank == 0 and result.checkpoint is not None:
        torch.save(result.checkpoint.load()["model"], os.path.join(out, "model.pt"))


if __name__ == "__main__":
    main()
