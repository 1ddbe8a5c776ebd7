"""Training loops the Tune tests run on raylight workers (importable as tests.support.tune_loops)."""

from __future__ import annotations

import torch
from torch import nn

from tests.support.loops import initial_model, regression_data, train_epoch


def offset_loop(ctx, config):
    """Real SGD on a linear regression; the reported loss is the training loss plus
    ``offset``, so a test knows which trials are bad."""
    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ctx.prepare_loader(regression_data(64), batch_size=16, shuffle=True, seed=7)
    for epoch in ctx.epochs(config["epochs"]):
        total = train_epoch(model, opt, loader)
        ctx.report({"epoch": epoch, "loss": ctx.all_reduce(total) + config["offset"]})


def pid_loop(ctx, config):
    """A few real SGD steps; each report names the worker process that ran them."""
    import os

    model = ctx.prepare_model(initial_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = ctx.prepare_loader(regression_data(64), batch_size=16, shuffle=True, seed=config["seed"])
    for epoch in ctx.epochs(2):
        total = train_epoch(model, opt, loader)
        ctx.report({"epoch": epoch, "loss": ctx.all_reduce(total), "worker_pid": os.getpid()})


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


def lightning_trial(config):
    """A Tune trainable running a tiny Lightning fit in the trial's process, reporting
    through raylight's Lightning callbacks."""
    import lightning.pytorch as pl

    from raylight.tune import TuneReportCallback, TuneReportCheckpointCallback

    torch.set_num_threads(1)

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = initial_model().float()

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=config["lr"])

    x, y = regression_data(64).tensors
    data = torch.utils.data.TensorDataset(x.float(), y.float())
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    trainer = pl.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=config["root"],
        callbacks=[
            TuneReportCallback({"loss": "val_loss"}, on="validation_end"),
            TuneReportCheckpointCallback({"loss": "val_loss"}, filename="model.ckpt", on="train_epoch_end"),
        ],
    )
    trainer.fit(Regressor(), loader, loader)


def fit_inside_placement_group(num_workers):
    """Run raylight.fit from a Ray task placed in a placement group; the error's text
    (or None) comes back."""
    import raylight
    from tests.support.loops import sgd_loop

    try:
        raylight.fit(sgd_loop, config={"lr": 0.1, "batch_size": 16, "epochs": 1}, num_workers=num_workers, progress=False,
                     storage_path="memory://pg-test")
    except raylight.InsufficientResourcesError as exc:
        return str(exc)
    return None


def sharded_loop(ctx, config):
    """The README's object loop under any strategy (the DeepSpeed tests' model, data and
    one-process reference): model and optimizer in the checkpoint every epoch. Rank 0
    raises once after the report of epoch ``fail_after`` (a marker file says it did), so
    Tune restarts the trial from its last checkpoint."""
    import os

    from tests.support import deepspeed_loops as ds

    model = ctx.prepare_model(ds.initial_model())
    opt = ctx.prepare_optimizer(torch.optim.Adam(model.parameters(), lr=ds.LR))
    rest = ctx.load_checkpoint({"model": model, "opt": opt})
    start = rest["epoch"] + 1 if rest is not None else 0
    loader = ctx.prepare_loader(ds.data(), batch_size=ds.BATCH, shuffle=True)
    for epoch in range(start, config["epochs"]):
        loader.set_epoch(epoch)
        total = train_epoch(model, opt, loader)
        ctx.report({"epoch": epoch, "start": start, "loss": ctx.all_reduce(total)},
                   checkpoint={"epoch": epoch, "model": model, "opt": opt})
        if epoch == config["fail_after"] and ctx.rank == 0 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError(f"failing once after epoch {epoch}")
