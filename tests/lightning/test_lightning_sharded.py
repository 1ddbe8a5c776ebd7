"""RayFSDPStrategy (FSDP2) and RayDeepSpeedStrategy (ZeRO) on a real local Ray (2 CPUs),
real gloo, real Lightning: the Trainer stays in this process, entry points run on 2
worker actors. Each strategy's runs are made once per module (fixtures) and checked
by several tests: fit, fit again, validate, predict, sharding on the workers,
checkpoints, resume, and the numerics against DDP."""

from __future__ import annotations

import glob
import os
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import ray.cloudpickle
import torch
from packaging.version import Version

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from raylight.lightning import RayFSDPStrategy, RayStrategy  # noqa: E402
from tests.conftest import REPO  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

sys.path.insert(0, os.path.join(REPO, "examples", "lightning"))
import ddp_digits  # noqa: E402

ray.cloudpickle.register_pickle_by_value(ddp_digits)  # workers need not import the example

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False}
STEPS = 22  # per epoch: 1400 samples / 2 workers / batch 32, rounded up


class ProcessProbe(pl.Callback):
    """Records, on the worker at the start of training, its pid and the malloc tunables it
    started with; its state comes back to the driver (rank 0's)."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def on_train_start(self, trainer, pl_module):
        self.seen = {"pid": os.getpid(), "tunables": os.environ.get("GLIBC_TUNABLES")}

    def state_dict(self) -> dict[str, Any]:
        return dict(self.seen)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = dict(state)


class ShardProbe(ProcessProbe):
    """And how many parameter elements this rank holds against the model's total."""

    def on_train_start(self, trainer, pl_module):
        from torch.distributed.tensor import DTensor

        super().on_train_start(trainer, pl_module)
        params = list(pl_module.parameters())
        if isinstance(params[0], DTensor):  # FSDP2
            local = sum(p.to_local().numel() for p in params)
            total = sum(p.numel() for p in params)
            kind = "dtensor"
        elif hasattr(params[0], "ds_numel"):  # ZeRO-3: each rank holds a partition
            local = sum(p.ds_tensor.numel() for p in params)
            total = sum(p.ds_numel for p in params)
            kind = "zero3"
        else:  # ZeRO-1/2: the fp32 master weights (and optimizer state) are partitioned
            optimizer = trainer.strategy.deepspeed_engine.optimizer
            local = sum(t.numel() for t in optimizer.single_partition_of_fp32_groups)
            total = sum(p.numel() for p in params)
            kind = "zero2"
        self.seen.update(kind=kind, local=local, total=total, rank=trainer.global_rank)


def _init_model() -> ddp_digits.DigitsClassifier:
    torch.manual_seed(0)
    return ddp_digits.DigitsClassifier()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def _fit_twice(strategy_factory, ckpt_dir, *, predict: bool = True) -> SimpleNamespace:
    """Fit 2 epochs (a checkpoint every epoch), fit the same Trainer again to epoch 3,
    then validate and (``predict``) predict with it."""
    dm = ddp_digits.DigitsDataModule(batch_size=32)
    model = _init_model()
    init = _weights(model)
    probe = ShardProbe()
    checkpoints = ModelCheckpoint(dirpath=ckpt_dir, monitor="val_acc", mode="max", save_top_k=-1, save_last=True)
    trainer = pl.Trainer(max_epochs=2, strategy=strategy_factory(), callbacks=[checkpoints, probe], **QUIET)
    trainer.fit(model, datamodule=dm)
    first = SimpleNamespace(
        weights=_weights(model),
        step=trainer.global_step,
        epoch=trainer.current_epoch,
        metrics=dict(trainer.callback_metrics),
        best=trainer.checkpoint_callback.best_model_path,
        best_score=float(trainer.checkpoint_callback.best_model_score),
        last=trainer.checkpoint_callback.last_model_path,
        probe=dict(probe.seen),
    )
    trainer.fit_loop.max_epochs = 3  # the second fit continues from epoch 2
    trainer.fit(model, datamodule=dm)
    second = SimpleNamespace(weights=_weights(model), step=trainer.global_step, epoch=trainer.current_epoch)
    dm.setup("validate")
    x, y = dm.val_set.tensors
    with torch.no_grad():
        expected = model(x).argmax(1)
    validated = trainer.validate(model, datamodule=dm)[0]
    val_metrics = dict(trainer.callback_metrics)
    predictions = torch.cat(trainer.predict(model, datamodule=dm)) if predict else None
    return SimpleNamespace(
        dm=dm, init=init, first=first, second=second, validated=validated,
        val_metrics=val_metrics, predictions=predictions, expected=expected, labels=y,
        ckpt_dir=str(ckpt_dir),
    )


def _resume(strategy_factory, ckpt_path: str) -> dict[str, torch.Tensor]:
    """A new Trainer resumes from the epoch-0 checkpoint and trains epoch 1."""
    model = _init_model()
    trainer = pl.Trainer(max_epochs=2, strategy=strategy_factory(), enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(batch_size=32), ckpt_path=ckpt_path)
    assert trainer.current_epoch == 2 and trainer.global_step == 2 * STEPS
    return _weights(model)


def _epoch0(ckpt_dir: str) -> str:
    (path,) = glob.glob(os.path.join(ckpt_dir, "epoch=0-*.ckpt"))
    return path


def _check_fit_twice_validate_predict(run: SimpleNamespace) -> None:
    first, second = run.first, run.second
    assert (first.epoch, first.step) == (2, 2 * STEPS)
    assert _max_diff(first.weights, run.init) > 0.05, "the driver's model holds the trained weights"
    assert {"train_loss", "val_loss", "val_acc"} <= set(first.metrics)
    assert float(first.metrics["val_acc"]) > 0.8
    assert (second.epoch, second.step) == (3, 3 * STEPS), "the second fit continues to epoch 3"
    assert _max_diff(second.weights, first.weights) > 0, "and trains"
    # validate/test/predict run the driver's weights on the workers.
    acc = float((run.expected == run.labels).float().mean())
    assert run.validated["val_acc"] == pytest.approx(acc, abs=0.01)
    assert set(run.val_metrics) == {"val_loss", "val_acc"}
    if run.predictions is not None:
        assert torch.equal(run.predictions, run.expected[0::2]), "rank 0's share, as with Lightning's DDP"


# ---------------------------------------------------------------- FSDP (FSDP2) ------


def _fsdp() -> RayFSDPStrategy:
    # The digits model has 4,810 parameters: net.0 (4,160) becomes its own block, the
    # rest (net.2) is sharded with the root.
    return RayFSDPStrategy(num_workers=2, min_block_params=1000)


@pytest.fixture(scope="module")
def fsdp_run(ray_session, tmp_path_factory):
    return _fit_twice(_fsdp, tmp_path_factory.mktemp("fsdp-ckpt"))


def test_fsdp_fit_twice_validate_predict(fsdp_run):
    _check_fit_twice_validate_predict(fsdp_run)


def test_fsdp_parameters_are_sharded_on_the_workers(fsdp_run):
    seen = fsdp_run.first.probe
    assert seen["kind"] == "dtensor" and seen["rank"] == 0
    assert seen["total"] == 4810 and seen["local"] == 4810 // 2, "rank 0 holds half of every parameter"


def test_fsdp_checkpoints_are_full_state_dicts(fsdp_run):
    # Whole tensors, not shards, written by rank 0 through AtomicCheckpointIO: the model
    # and the optimizer state (SGD momentum, keyed by parameter index as without sharding).
    epoch1 = torch.load(glob.glob(os.path.join(fsdp_run.ckpt_dir, "epoch=1-*.ckpt"))[0], weights_only=True)
    assert _max_diff(epoch1["state_dict"], fsdp_run.first.weights) == 0, "it holds what was trained"
    momentum = [s["momentum_buffer"].shape for s in epoch1["optimizer_states"][0]["state"].values()]
    assert momentum == [v.shape for v in fsdp_run.init.values()]
    last = torch.load(os.path.join(fsdp_run.ckpt_dir, "last.ckpt"), weights_only=True)
    assert last["epoch"] == 2 and last["global_step"] == 3 * STEPS, "last.ckpt is the second fit's"
    assert _max_diff(last["state_dict"], fsdp_run.second.weights) == 0
    # The best path came back to the driver, and Lightning's own loader reads the file.
    assert fsdp_run.first.best.startswith(fsdp_run.ckpt_dir) and fsdp_run.first.best_score > 0.8
    restored = ddp_digits.DigitsClassifier.load_from_checkpoint(fsdp_run.first.best)
    assert _max_diff(_weights(restored), torch.load(fsdp_run.first.best, weights_only=True)["state_dict"]) == 0


def test_fsdp_resume_matches_the_uninterrupted_run(fsdp_run, ray_cluster):
    # Resuming from epoch 0 restores weights, SGD momentum (sharded again on load) and
    # the loops; epoch 1 then retraces the uninterrupted run exactly.
    resumed = _resume(_fsdp, _epoch0(fsdp_run.ckpt_dir))
    assert _max_diff(resumed, fsdp_run.first.weights) <= 1e-6


@pytest.fixture(scope="module")
def ddp_run(ray_session):
    """The reference: the same model, data order (DistributedSampler, seed 0) and 44 SGD
    steps under RayStrategy (DDP)."""
    model = _init_model()
    probe = ProcessProbe()
    trainer = pl.Trainer(max_epochs=2, strategy=RayStrategy(num_workers=2), enable_checkpointing=False, callbacks=[probe], **QUIET)
    trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(batch_size=32))
    assert trainer.global_step == 2 * STEPS
    return SimpleNamespace(weights=_weights(model), val_acc=float(trainer.callback_metrics["val_acc"]), probe=dict(probe.seen))


def test_fsdp_workers_start_as_fsdp_s_and_ddp_does_not_reuse_them(fsdp_run, ddp_run):
    # FSDP tunes malloc in its processes (strategies.base.keep_heap_small): they start with
    # the tunables raylight.fit's FSDP workers get, and a DDP run after it in this driver
    # takes other processes, not those the pool kept from the FSDP runs.
    from raylight.worker.strategies.base import HEAP_TUNABLES

    assert fsdp_run.first.probe["tunables"] == HEAP_TUNABLES
    assert ddp_run.probe["tunables"] is None
    assert ddp_run.probe["pid"] != fsdp_run.first.probe["pid"]


def test_fsdp_trains_like_ddp(fsdp_run, ddp_run):
    # With 2 ranks the averaged gradient is (g0 + g1) / 2 under both (a sum of two floats
    # and a halving are exact), the gathered parameters are bit copies of the full ones,
    # and SGD's update is elementwise, so only a different BLAS path for the sharded
    # layout could make a difference: it is measured at 0.0; 1e-6 leaves room for that.
    assert _max_diff(ddp_run.weights, fsdp_run.first.weights) <= 1e-6
    assert ddp_run.val_acc == pytest.approx(float(fsdp_run.first.metrics["val_acc"]), abs=1e-6)


# ---------------------------------------------------------------- DeepSpeed (ZeRO) --


def _deepspeed(stage: int, *, num_workers: int = 2, use_gpu: bool = False):
    pytest.importorskip("deepspeed")
    from raylight.lightning import RayDeepSpeedStrategy

    return lambda: RayDeepSpeedStrategy(num_workers=num_workers, use_gpu=use_gpu, stage=stage)


@pytest.fixture(scope="module")
def zero2_run(ray_session, tmp_path_factory):
    # No predict: it takes DeepSpeed's inference path, which validate takes already.
    return _fit_twice(_deepspeed(2), tmp_path_factory.mktemp("zero2-ckpt"), predict=False)


@pytest.mark.slow
def test_deepspeed_fit_twice_and_validate(zero2_run):
    _check_fit_twice_validate_predict(zero2_run)


def test_deepspeed_trains_like_ddp(zero2_run, ddp_run):
    # As for FSDP: ZeRO-2 averages the same two gradients and steps the same SGD on its
    # fp32 partitions (measured difference 0.0).
    assert _max_diff(ddp_run.weights, zero2_run.first.weights) <= 1e-6


def test_deepspeed_zero2_partitions_the_optimizer_state(zero2_run):
    seen = zero2_run.first.probe
    # DeepSpeed pads the flat fp32 buffer before cutting it: rank 0 holds about half.
    assert seen["kind"] == "zero2" and seen["total"] == 4810 and 4810 // 2 <= seen["local"] <= 4810 // 2 + 8


def test_deepspeed_checkpoints_hold_the_trained_weights(zero2_run, tmp_path):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # A DeepSpeed checkpoint is a directory (each rank wrote its partitions); DeepSpeed's
    # reader (and, from Lightning 2.6, Lightning's converter) makes it whole.
    epoch1 = glob.glob(os.path.join(zero2_run.ckpt_dir, "epoch=1-*.ckpt"))[0]
    assert os.path.isdir(epoch1) and zero2_run.first.best.startswith(zero2_run.ckpt_dir)
    weights = get_fp32_state_dict_from_zero_checkpoint(epoch1)
    assert _max_diff(weights, zero2_run.first.weights) == 0
    ddp_digits.DigitsClassifier().load_state_dict(weights)
    if Version(pl.__version__) >= Version("2.6"):
        # Older converters load DeepSpeed's files with torch.load's default, which torch
        # >= 2.6 makes weights_only: DeepSpeed's pickled LossScaler is refused.
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        out = str(tmp_path / "epoch1.pt")
        convert_zero_checkpoint_to_fp32_state_dict(epoch1, out)
        state = torch.load(out, weights_only=True)
        assert state["epoch"] == 1 and _max_diff(state["state_dict"], zero2_run.first.weights) == 0


def test_deepspeed_resume_matches_the_uninterrupted_run(zero2_run, ray_cluster):
    # Resuming from epoch 0 restores the ZeRO partitions and retraces epoch 1 exactly.
    resumed = _resume(_deepspeed(2), _epoch0(zero2_run.ckpt_dir))
    assert _max_diff(resumed, zero2_run.first.weights) <= 1e-6


def test_deepspeed_zero3_gathers_the_weights_for_the_driver(zero2_run, ray_cluster):
    # ZeRO-3 partitions the parameters themselves; the driver still gets whole tensors,
    # the same as ZeRO-2's (the same arithmetic, partitioned differently).
    model = _init_model()
    probe = ShardProbe()
    trainer = pl.Trainer(
        max_epochs=2, strategy=_deepspeed(3)(), callbacks=[probe], enable_checkpointing=False, **QUIET
    )
    trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(batch_size=32))
    assert probe.seen["kind"] == "zero3" and 4810 // 2 <= probe.seen["local"] <= 4810 // 2 + 8
    assert _max_diff(_weights(model), zero2_run.first.weights) <= 1e-6
    assert float(trainer.callback_metrics["val_acc"]) > 0.8


# ---------------------------------------------------------------- GPU ---------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fsdp_on_gpus(ray_cluster):
    # NCCL, and a sanity-check validation before training: under inference_mode it would
    # break FSDP2's next training step (the strategy switches the loops to no_grad).
    n = min(torch.cuda.device_count(), 2)
    model = _init_model()
    init = _weights(model)
    trainer = pl.Trainer(
        max_epochs=1, strategy=RayFSDPStrategy(num_workers=n, use_gpu=True), enable_checkpointing=False, **QUIET
    )
    trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(batch_size=32))
    assert trainer.global_step > 0 and _max_diff(_weights(model), init) > 0
    assert all(v.device.type == "cpu" for v in model.state_dict().values())
    assert float(trainer.callback_metrics["val_acc"]) > 0.5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_deepspeed_on_gpus(ray_cluster):
    n = min(torch.cuda.device_count(), 2)
    model = _init_model()
    init = _weights(model)
    strategy = _deepspeed(3, num_workers=n, use_gpu=True)()
    trainer = pl.Trainer(max_epochs=1, strategy=strategy, enable_checkpointing=False, **QUIET)
    trainer.fit(model, datamodule=ddp_digits.DigitsDataModule(batch_size=32))
    assert trainer.global_step > 0 and _max_diff(_weights(model), init) > 0
