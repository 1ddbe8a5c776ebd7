"""raylight.lightning on a real local Ray (2 CPUs), real gloo, real Lightning: the
Trainer stays in this process, fit/validate/test/predict run on 2 worker actors."""

from __future__ import annotations

import copy
import glob
import json
import os
import sys

import pytest
import ray.cloudpickle
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import raylight  # noqa: E402
from raylight.lightning import RayStrategy  # noqa: E402
from tests.conftest import REPO  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

EXAMPLES = os.path.join(REPO, "examples", "lightning")
sys.path.insert(0, EXAMPLES)
import ddp_digits  # noqa: E402

ray.cloudpickle.register_pickle_by_value(ddp_digits)  # workers need not import the example

QUIET = {"enable_progress_bar": False, "enable_model_summary": False}


def _data() -> ddp_digits.DigitsDataModule:
    dm = ddp_digits.DigitsDataModule(batch_size=32)
    dm.setup("fit")
    return dm


def _loss(model: torch.nn.Module, dataset) -> float:
    x, y = dataset.tensors
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def test_two_workers_match_one_process_with_the_same_global_batch(ray_cluster, tmp_path):
    # Full-batch steps: 2 workers x 700 samples make the same gradient as 1 x 1400, so
    # the two runs must agree to float precision; a wrong sampler (each worker seeing
    # all the data) doubles the steps and fails.
    dm = _data()
    torch.manual_seed(0)
    init = ddp_digits.DigitsClassifier(lr=0.5)
    one, two = copy.deepcopy(init), copy.deepcopy(init)
    common = {"max_epochs": 12, "logger": False, "enable_checkpointing": False, **QUIET}
    single = pl.Trainer(accelerator="cpu", devices=1, **common)
    single.fit(one, DataLoader(dm.train_set, batch_size=1400))
    ray_trainer = pl.Trainer(strategy=RayStrategy(num_workers=2), callbacks=[CommHooks()], **common)
    ray_trainer.fit(two, DataLoader(dm.train_set, batch_size=700))
    assert ray_trainer.global_step == single.global_step == 12
    assert _loss(init, dm.train_set) - _loss(two, dm.train_set) > 0.5, "training must lower the loss"
    assert abs(_loss(one, dm.train_set) - _loss(two, dm.train_set)) < 1e-4
    for (name, p1), p2 in zip(one.state_dict().items(), two.state_dict().values(), strict=True):
        assert torch.allclose(p1, p2, atol=1e-5, rtol=0), name
    assert float(ray_trainer.callback_metrics["train_loss"]) == pytest.approx(
        float(single.callback_metrics["train_loss"]), abs=1e-4
    )
    # DDP's gradients went through raylight's shared memory; with shared_memory=False through
    # gloo alone, to the same bits (two ranks)
    assert float(ray_trainer.callback_metrics["comm_hooks"]) == 1
    gloo = copy.deepcopy(init)
    gloo_trainer = pl.Trainer(strategy=RayStrategy(num_workers=2, shared_memory=False), callbacks=[CommHooks()], **common)
    gloo_trainer.fit(gloo, DataLoader(dm.train_set, batch_size=700))
    assert float(gloo_trainer.callback_metrics["comm_hooks"]) == 0
    for (name, p2), pg in zip(two.state_dict().items(), gloo.state_dict().values(), strict=True):
        assert torch.equal(p2, pg), name


class CommHooks(pl.Callback):
    """Logs how many communication hooks the worker's DDP model has (torch keeps them in
    ``_comm_hooks``)."""

    def on_train_batch_end(self, trainer, pl_module, *args):
        pl_module.log("comm_hooks", float(len(getattr(trainer.strategy.model, "_comm_hooks", []))))


def test_fit_twice_then_validate_test_predict(ray_cluster, tmp_path):
    dm = ddp_digits.DigitsDataModule(batch_size=32)
    torch.manual_seed(0)
    model = ddp_digits.DigitsClassifier()
    init = copy.deepcopy(model.state_dict())
    trainer = pl.Trainer(
        max_epochs=2,
        strategy=RayStrategy(num_workers=2),
        callbacks=[ModelCheckpoint(monitor="val_acc", mode="max")],
        default_root_dir=str(tmp_path),
        **QUIET,
    )
    trainer.fit(model, datamodule=dm)
    steps = 2 * 22  # 1400 samples / 2 workers / batch 32, rounded up, per epoch
    assert trainer.state.finished and trainer.current_epoch == 2 and trainer.global_step == steps
    assert not torch.equal(model.state_dict()["net.0.weight"], init["net.0.weight"])
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)
    assert {"train_loss", "val_acc"} <= set(trainer.logged_metrics)
    best = trainer.checkpoint_callback.best_model_path
    assert best.startswith(str(tmp_path)) and os.path.isfile(best)
    assert float(trainer.checkpoint_callback.best_model_score) == pytest.approx(float(trainer.callback_metrics["val_acc"]))

    # A second fit of the same Trainer behaves as in one process: max_epochs is reached.
    trained = copy.deepcopy(model.state_dict())
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == steps and trainer.current_epoch == 2
    assert all(torch.equal(trained[k], v) for k, v in model.state_dict().items())

    # validate/test/predict run the driver's (trained) weights on the workers.
    dm.setup("validate")
    val = dm.val_set
    x, y = val.tensors
    with torch.no_grad():
        pred = model(x).argmax(1)
    metrics = trainer.validate(model, datamodule=dm)[0]
    assert metrics["val_acc"] == pytest.approx(float((pred == y).float().mean()), abs=0.01)
    assert trainer.callback_metrics.keys() == {"val_loss", "val_acc"}
    assert metrics["val_acc"] > 0.8
    predictions = torch.cat(trainer.predict(model, datamodule=dm))
    # Rank 0's share, as with Lightning's own DDP: samples 0, 2, 4, ... of 397.
    assert torch.equal(predictions, pred[0::2])



def test_checkpoint_resume_and_rank_zero_loggers(ray_cluster, tmp_path):
    dm = ddp_digits.DigitsDataModule(batch_size=64)
    ckpt_dir = tmp_path / "ckpt"

    def trainer(epochs: int) -> pl.Trainer:
        return pl.Trainer(
            max_epochs=epochs,
            strategy=RayStrategy(num_workers=2),
            callbacks=[ModelCheckpoint(dirpath=ckpt_dir, save_last=True)],
            logger=[CSVLogger(tmp_path / "csv"), TensorBoardLogger(tmp_path / "tb")],
            log_every_n_steps=1,
            **QUIET,
        )

    first = trainer(2)
    first.fit(ddp_digits.DigitsClassifier(), datamodule=dm)
    last = os.path.join(ckpt_dir, "last.ckpt")
    state = torch.load(last, weights_only=True)
    assert state["epoch"] == 1 and state["global_step"] == 2 * 11
    assert not glob.glob(os.path.join(ckpt_dir, ".tmp-*")), "atomic writes leave no temp files"
    # Rank 0 alone logs, where the driver's loggers point.
    assert first.logger.log_dir == str(tmp_path / "csv" / "lightning_logs" / "version_0")
    assert os.listdir(tmp_path / "csv" / "lightning_logs") == ["version_0"]
    assert os.path.isfile(os.path.join(first.logger.log_dir, "metrics.csv"))
    assert glob.glob(str(tmp_path / "tb" / "lightning_logs" / "version_0" / "events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "lightning_logs" / "version_0"))
    events.Reload()  # rank 0 logged every step where the driver's logger points
    assert [e.step for e in events.Scalars("train_loss")] == list(range(2 * 11))

    resumed = trainer(4)
    model = ddp_digits.DigitsClassifier()
    resumed.fit(model, datamodule=dm, ckpt_path=last)
    assert resumed.current_epoch == 4 and resumed.global_step == 4 * 11
    import csv

    with open(os.path.join(resumed.logger.log_dir, "metrics.csv")) as f:
        epochs = {int(row["epoch"]) for row in csv.DictReader(f) if row.get("epoch")}
    assert epochs == {2, 3}, "the resumed run trains epochs 2 and 3 only"
    assert torch.equal(
        torch.load(last, weights_only=True)["state_dict"]["net.0.weight"], model.state_dict()["net.0.weight"]
    )


def test_adaptive_batch_size_and_lr(ray_cluster, tmp_path):
    # The driver's AdaptiveEngine picks the batch plan from the workers' step times and
    # gradient noise; the workers log what they train with.
    import csv

    dm = ddp_digits.DigitsDataModule(batch_size=8)
    adaptive = raylight.AdaptiveConfig(max_batch_size=256, decision_interval_s=1.0, control_interval_steps=4)
    trainer = pl.Trainer(
        max_epochs=5,
        strategy=RayStrategy(num_workers=2, adaptive=adaptive),
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
        enable_checkpointing=False,
        **QUIET,
    )
    model = ddp_digits.DigitsClassifier(lr=0.05)
    trainer.fit(model, datamodule=dm)
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("adaptive/batch_size")]
    sizes = [float(r["adaptive/batch_size"]) for r in rows]
    factors = [float(r["adaptive/lr_factor"]) for r in rows]
    assert sizes[0] == 16 and max(sizes) > 16, "the global batch starts at 2 x 8 and grows"
    assert max(factors) > 1.0, "AdaScale raises the LR once the noise is measured"
    assert trainer.global_step < 5 * 88, "bigger batches take fewer steps"
    assert float(trainer.callback_metrics["val_acc"]) > 0.85


class _Regression(pl.LightningModule):
    """A linear regression trained with plain SGD (lr 0.1): a step moves the weights by
    exactly lr x the norm of the gradient it applies."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 4, generator=g)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.5 * torch.randn(512, 1, generator=g)
        return DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


class _StepSizes(pl.Callback):
    """Rank 0 writes, to ``path``, how far each optimizer step moved the weights."""

    def __init__(self, path):
        self.path, self.sizes, self.before = path, [], None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.before = torch.cat([p.detach().flatten().clone() for p in pl_module.parameters()])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        after = torch.cat([p.detach().flatten() for p in pl_module.parameters()])
        self.sizes.append(float((after - self.before).norm()))

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            with open(self.path, "w") as f:
                json.dump(self.sizes, f)


def test_adaptive_clipping_clips_the_averaged_gradient_on_every_step(ray_cluster, tmp_path):
    """``Trainer(gradient_clip_val=c)`` under ``RayStrategy(adaptive=...)``: every step
    applies the workers' averaged gradient clipped to norm c, so each SGD step moves the
    weights by lr x c. Lightning clipping it itself clipped each worker's own gradient on
    the steps that measure the gradient noise (one in two here), whose average is shorter
    than c. (lr_rule none: the LR is not scaled.)"""
    path = str(tmp_path / "steps.json")
    adaptive = raylight.AdaptiveConfig(lr_rule="none", control_interval_steps=2, decision_interval_s=1.0)
    trainer = pl.Trainer(
        max_epochs=2, strategy=RayStrategy(num_workers=2, adaptive=adaptive), gradient_clip_val=1e-3,
        callbacks=[_StepSizes(path)], logger=False, enable_checkpointing=False, **QUIET,
    )
    trainer.fit(_Regression())
    with open(path) as f:
        sizes = json.load(f)
    assert len(sizes) >= 8
    assert sizes == pytest.approx([0.1 * 1e-3] * len(sizes), rel=1e-3)
    assert trainer.gradient_clip_val == 1e-3  # the driver's Trainer as it was
    value = pl.Trainer(
        max_epochs=1, strategy=RayStrategy(num_workers=2, adaptive=adaptive), gradient_clip_val=1.0,
        gradient_clip_algorithm="value", logger=False, enable_checkpointing=False, **QUIET,
    )
    with pytest.raises(Exception, match="gradient_clip_algorithm='norm'"):
        value.fit(_Regression())


class _FailsOnRank1(ddp_digits.DigitsClassifier):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 2:
            raise ValueError("boom on rank 1")
        return super().training_step(batch, batch_idx)


def test_worker_error_reaches_the_driver(ray_cluster, tmp_path):
    seen = []

    class Seen(pl.Callback):
        def on_exception(self, trainer, pl_module, exception):
            seen.append(type(exception).__name__)

    trainer = pl.Trainer(max_epochs=1, strategy=RayStrategy(num_workers=2), callbacks=[Seen()], logger=False, **QUIET)
    with pytest.raises(raylight.WorkerError) as info:
        trainer.fit(_FailsOnRank1(), datamodule=ddp_digits.DigitsDataModule())
    assert info.value.rank == 1 and "boom on rank 1" in str(info.value)
    assert "training_step" in info.value.worker_traceback
    assert trainer.state.status == "interrupted" and seen == ["WorkerError"]


def test_example_runs(ray_cluster, tmp_path):
    out = ddp_digits.main(["--num-workers", "2", "--epochs", "1", "--root-dir", str(tmp_path)])
    # Seeded (weights and data order): one epoch reaches 0.77 test accuracy; chance is 0.1.
    assert out["epochs"] == 1 and out["test_acc"] > 0.7
    assert glob.glob(str(tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "*.ckpt"))


@pytest.mark.timeout(480)
def test_example_in_a_pipe_is_quiet(tmp_path):
    """The example as a user runs it, its output piped: the results and raylight's lines,
    not Lightning's tips (GPU/TPU lines, litlogger, the logging interval), its deprecation
    warnings or model summary, and no colour codes (Ray's "(name pid=N)" prefix)."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("RAYLIGHT_VERBOSE", "RAY_COLOR_PREFIX", "RAY_ADDRESS")}
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "ddp_digits.py"), "--epochs", "1", "--root-dir", str(tmp_path)],
        capture_output=True, timeout=450, env=env, cwd=tmp_path,
    )
    out = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, out
    assert "test_acc 0.769 after 1 epochs" in out, out
    assert "\x1b" not in out, out
    for noise in ("GPU available", "TPU available", "Tip:", "litlogger", "deprecated", "Warning", "logging interval",
                  "DistributedSampler", "Trainable params", "`Trainer.fit` stopped"):
        assert noise not in out, (noise, out)


@pytest.mark.timeout(240)
def test_notebook_runs_in_a_real_kernel(tmp_path):
    # The kernel is its own driver process with its own embedded Ray; the model is
    # defined in the notebook, so it reaches the workers by value.
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(os.path.join(EXAMPLES, "notebook.ipynb"), as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    text = "".join(
        out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    assert "epochs=2 steps=44" in text
    values = dict(part.split("=") for part in text.split() if part.startswith("local_acc="))
    assert float(values["local_acc"]) > 0.8, "the kernel's model object is trained"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tune_example_reports_from_workers_through_the_trial(ray_cluster, tmp_path):
    """ray_lightning's Tune example: RayStrategy inside Tune trials, the report callback
    on the workers; each epoch's report and the Lightning checkpoint reach Tune."""
    pytest.importorskip("ray.tune")
    import tune_digits

    ray.cloudpickle.register_pickle_by_value(tune_digits)
    out = tune_digits.main(["--num-samples", "2", "--epochs", "2", "--num-workers", "2", "--storage-path", str(tmp_path)])
    assert out["trials"] == 2 and out["errors"] == 0
    assert out["iterations"] == [2, 2], "one report per epoch, and none for the driver's results"
    assert 0 < out["best_loss"] < 2.3 and 0 <= out["best_acc"] <= 1
    with out["checkpoint"].as_directory() as d:
        restored = ddp_digits.DigitsClassifier.load_from_checkpoint(os.path.join(d, tune_digits.CHECKPOINT))
    assert restored.hparams.lr == pytest.approx(out["best_config"]["lr"])


class _HookSeen(pl.Callback):
    """Writes, as training starts in a worker, whether the init_hook ran in this process."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_train_start(self, trainer, pl_module):
        hooked = os.path.exists(os.path.join(self.folder, f"hook-{os.getpid()}"))
        with open(os.path.join(self.folder, f"train-{os.getpid()}"), "w") as f:
            f.write("after the hook" if hooked else "no hook")


def _touch_hook_file(folder: str) -> None:
    open(os.path.join(folder, f"hook-{os.getpid()}"), "w").close()


def test_ray_lightnings_init_hook_runs_in_each_worker_before_training(ray_cluster, tmp_path):
    import functools

    dm = _data()
    hook = functools.partial(_touch_hook_file, str(tmp_path))
    trainer = pl.Trainer(
        strategy=RayStrategy(num_workers=2, num_cpus_per_worker=1, init_hook=hook),
        callbacks=[_HookSeen(str(tmp_path))], max_epochs=1, limit_train_batches=2, logger=False,
        enable_checkpointing=False, **QUIET,
    )
    trainer.fit(ddp_digits.DigitsClassifier(), DataLoader(dm.train_set, batch_size=64))
    hooks = sorted(p.name for p in tmp_path.glob("hook-*"))
    assert len(hooks) == 2 and f"hook-{os.getpid()}" not in hooks, hooks  # two workers, not the driver
    seen = {p.name: p.read_text() for p in tmp_path.glob("train-*")}
    assert seen == {name.replace("hook", "train"): "after the hook" for name in hooks}
