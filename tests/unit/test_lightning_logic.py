"""raylight.lightning without Ray: argument checks, the environment, the adaptive batch
sampler, atomic and safe checkpoint I/O, and the driver-side recovery of rank 0's
results (round trip through the same serialisation the workers use)."""

from __future__ import annotations

import ast
import os
import pathlib
import pickle
from types import SimpleNamespace

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.callbacks import EarlyStopping  # noqa: E402
from torch.utils.data import DataLoader, SequentialSampler, TensorDataset  # noqa: E402

import raylight  # noqa: E402
from raylight.adaptive.plan import BatchPlan  # noqa: E402
from raylight.checkpoint import deserialize_state, serialize_state  # noqa: E402
from raylight.exceptions import ConfigError  # noqa: E402
from raylight.lightning import AtomicCheckpointIO, RayFSDPStrategy, RaylightEnvironment, RayStrategy  # noqa: E402
from raylight.lightning._launcher import RayLauncher, recover  # noqa: E402
from raylight.lightning._worker import collect  # noqa: E402
from raylight.lightning.adaptive import PlanBatchSampler, lightning_adaptive  # noqa: E402

SRC = pathlib.Path(raylight.__file__).parent


@pytest.mark.parametrize("bad", [0, -1, (1, 2), True, 1.5])
def test_num_workers_must_be_a_positive_int(bad):
    with pytest.raises(ConfigError, match=r"RayStrategy\(num_workers="):
        RayStrategy(num_workers=bad)


def test_reserved_and_invalid_arguments_name_the_setting():
    with pytest.raises(ConfigError, match=r"RayStrategy\(cluster_environment=\.\.\.\)"):
        RayStrategy(num_workers=2, cluster_environment=RaylightEnvironment())
    with pytest.raises(ConfigError, match=r"RayStrategy.resources_per_worker"):
        RayStrategy(num_workers=2, resources_per_worker={"CPU": -1})
    with pytest.raises(ConfigError, match="FailureConfig"):
        RayStrategy(num_workers=2, failure={"max_failures": 1})


def test_fsdp_on_cpu_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"use_gpu=True.*RayStrategy \(DDP\)"):
        RayFSDPStrategy(num_workers=2)


def test_adaptive_accumulation_belongs_to_lightning():
    assert lightning_adaptive(None) is None
    assert lightning_adaptive(raylight.AdaptiveConfig()).accumulation is False
    with pytest.raises(ConfigError, match="accumulate_grad_batches"):
        lightning_adaptive(raylight.AdaptiveConfig(accumulation=True))


def test_driver_side_trainer_sees_the_ray_world():
    strategy = RayStrategy(num_workers=3)
    trainer = pl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
    assert isinstance(trainer.strategy.launcher, RayLauncher)
    assert trainer.strategy.launcher.is_interactive_compatible
    assert trainer.world_size == 3 and trainer.global_rank == 0
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 3, "rank": 0}
    env = RaylightEnvironment(world_size=4, global_rank=2, local_rank=1, node_rank=1)
    env.set_world_size(1)
    env.set_global_rank(0)  # Lightning's own guesses are ignored: raylight placed the ranks
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 2, 1, 1)
    assert env.creates_processes_externally and not RaylightEnvironment.detect()


def test_plan_batch_sampler_follows_the_plan_live():
    sync = SimpleNamespace(plan=BatchPlan(2))
    sampler = PlanBatchSampler(SequentialSampler(range(10)), sync)
    it = iter(sampler)
    assert next(it) == [0, 1]
    sync.plan = BatchPlan(3, 0, 1)  # a new plan takes effect at the next batch
    assert list(it) == [[2, 3, 4], [5, 6, 7], [8, 9]]
    assert list(PlanBatchSampler(SequentialSampler(range(10)), sync, drop_last=True)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(TypeError):
        len(sampler)  # on purpose: Lightning then ends epochs when the data runs out


class _Opaque:
    pass


def test_checkpoint_io_writes_atomically_and_loads_safely(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = str(tmp_path / "sub" / "a.ckpt")
    io.save_checkpoint({"w": torch.ones(2)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2))
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"]

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"w": torch.zeros(2)}, path)
    monkeypatch.undo()
    assert os.listdir(tmp_path / "sub") == ["a.ckpt"], "a failed write leaves no temp file"
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(2)), "and the old file intact"

    unsafe = str(tmp_path / "unsafe.ckpt")
    io.save_checkpoint({"obj": _Opaque()}, unsafe)
    with pytest.raises(pickle.UnpicklingError, match=r"weights_only=False"):
        io.load_checkpoint(unsafe)
    assert isinstance(io.load_checkpoint(unsafe, weights_only=False)["obj"], _Opaque)


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_rank_zero_results_round_trip_to_a_fresh_trainer(tmp_path):
    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,))), batch_size=4)
    kwargs = {"max_epochs": 2, "default_root_dir": str(tmp_path), "enable_progress_bar": False, "enable_model_summary": False}
    worker = pl.Trainer(accelerator="cpu", devices=1, callbacks=[EarlyStopping("loss", patience=0, mode="max")], **kwargs)
    trained = _Tiny()
    worker.fit(trained, data)
    # What a worker sends, through the same serialisation (loaded with weights_only=True).
    output = deserialize_state(serialize_state(collect(worker, None)))

    driver = pl.Trainer(accelerator="cpu", devices=1, callbacks=[EarlyStopping("loss", patience=0, mode="max")], **kwargs)
    fresh = _Tiny()
    driver.strategy.connect(fresh)
    recover(driver, output)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), trained.state_dict().values(), strict=True))
    assert driver.state.finished and driver.current_epoch == 2 and driver.global_step == 8
    assert driver.checkpoint_callback.best_model_path == worker.checkpoint_callback.best_model_path
    assert float(driver.callback_metrics["loss"]) == float(worker.callback_metrics["loss"])
    assert set(driver.logged_metrics) == set(worker.logged_metrics)
    # The loss falls, so this EarlyStopping (mode="max", patience=0) stops after epoch 1.
    stopper = driver.early_stopping_callback
    assert stopper.stopped_epoch == worker.early_stopping_callback.stopped_epoch > 0
    assert float(stopper.best_score) == float(worker.early_stopping_callback.best_score)


def _lightning_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_private_lightning_api_is_isolated_in_one_module():
    private = {
        p.name: {n for n in _lightning_imports(p) if any(part.startswith("_") for part in n.split("."))}
        for p in (SRC / "lightning").glob("*.py")
    }
    assert {k for k, v in private.items() if v} == {"_launcher.py"}
    assert private["_launcher.py"] == {"lightning.pytorch.strategies.launchers.launcher._Launcher"}


def test_core_never_imports_the_lightning_leaf():
    for path in SRC.rglob("*.py"):
        if "lightning" in path.relative_to(SRC).parts:
            continue
        assert "raylight.lightning" not in path.read_text(), path
