"""Training loops the Tune tests run on raylight workers (importable as tests.ray.tune_loops)."""

from __future__ import annotations

import torch
from torch import nn

from tests.ray.loops import initial_model, regression_data


def offset_loop(ctx, config):
    """Real SGD on a linear regression; the reported loss is the training loss plus
    ``offset``, so a test knows which trials are bad."""
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ctx.prepare_loader(regression_data(64), batch_size=16, shuffle=True, seed=7)
    for epoch in ctx.epochs(config["epochs"]):
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        ctx.report({"epoch": epoch, "loss": ctx.all_reduce(total) + config["offset"]})


def pbt_loop(ctx, config):
    """``score`` grows by ``rate`` per epoch and lives in the checkpoint, so a trial
    restored from another's checkpoint continues from the donor's score."""
    start, score, restored = 0, 0.0, None
    if (ckpt := ctx.get_checkpoint()) is not None:
        state = ckpt.load()
        start, score = state["epoch"] + 1, float(state["score"])
        restored = {"restored_epoch": state["epoch"], "restored_score": score}
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = regression_data(64).tensors
    for epoch in range(start, config["epochs"]):
        score += config["rate"]
        for _ in range(config["steps"]):  # real work, so the two trials run side by side
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        metrics = {"epoch": epoch, "score": ctx.all_reduce(score), "start_epoch": start, **(restored or {})}
        ctx.report(metrics, checkpoint={"epoch": epoch, "score": score})


def long_loop(ctx, config):
    """Many short epochs of real work: only a time budget ends it early."""
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = regression_data(64)
    x, y = data.tensors
    for epoch in range(config["epochs"]):
        for _ in range(20):
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        ctx.report({"epoch": epoch, "loss": float(nn.functional.mse_loss(model(x), y))})
