"""Loops the DeepSpeed Ray tests run on workers (importable as tests.support.deepspeed_loops)."""

from __future__ import annotations

import os
import signal

import torch
from torch import nn

from tests.helpers import wait_until
from tests.support.loops import train_epoch

BATCH, EPOCHS, LR = 16, 5, 0.01


def data(n: int = 64, d: int = 8) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, d, generator=gen)
    y = x @ torch.randn(d, 1, generator=gen) + 0.1 * torch.randn(n, 1, generator=gen)
    return torch.utils.data.TensorDataset(x, y)


def initial_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 17), nn.Tanh(), nn.Linear(17, 1))


def epoch_loop(ctx, config):
    """The README's loop under DeepSpeed: objects in the checkpoint every epoch; optionally
    SIGKILLs rank 1 once, after checkpoint ``kill_after`` is committed."""
    model = ctx.prepare_model(initial_model())
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=LR))
    rest = ctx.load_checkpoint({"model": model, "opt": opt})
    start = rest["epoch"] + 1 if rest is not None else 0
    loader = ctx.prepare_loader(data(), batch_size=BATCH, shuffle=True)
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        total = train_epoch(model, opt, loader)
        engine = model.engine
        ctx.report(
            {"epoch": epoch, "start": start, "loss": ctx.all_reduce(total),
             "batch": [engine.train_micro_batch_size_per_gpu(), engine.train_batch_size()]},
            checkpoint={"epoch": epoch, "model": model, "opt": opt},
        )
        kill = config.get("kill_after")
        if kill is not None and epoch == kill and ctx.rank == 1 and not os.path.exists(config["marker"]):
            committed = os.path.join(config["run_dir"], "checkpoints", f"checkpoint_{kill:06d}", "meta.json")
            wait_until(lambda path=committed: os.path.exists(path), 60, "the checkpoint to be committed")
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def reference(epochs: int = EPOCHS) -> dict[str, torch.Tensor]:
    """The same training in one plain process: the loader's order, whole global batches."""
    model = initial_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    x, y = data().tensors
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for lo in range(0, len(x), BATCH):
            idx = order[lo : lo + BATCH]
            opt.zero_grad()
            nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.state_dict()
