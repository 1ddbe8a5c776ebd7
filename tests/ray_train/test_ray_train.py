"""A Ray Train ``train_func(config)``, written as Ray's own torch_linear_example, runs
unchanged on raylight through ``raylight.ray_train.TorchTrainer``: real local Ray, 2
workers, real gloo. Ray Train's per-worker DataLoader batch stays per worker (the same
global batch), checkpoints made with ``ray.train.Checkpoint`` come back."""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import pytest
import ray.train as train
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig, get_context
from torch import nn

from raylight.ray_train import TorchTrainer

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]


class LinearDataset(torch.utils.data.Dataset):
    """y = a * x + b (Ray's example)"""

    def __init__(self, a, b, size=1000):
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy(a * x + b)

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self):
        return len(self.x)


def train_func(config):
    # the shape of Ray's torch_linear_example.train_func, plus what the test checks
    batch_size = config.get("batch_size", 32)
    epochs = config.get("epochs", 3)
    train_loader = torch.utils.data.DataLoader(
        LinearDataset(2, 5, size=config.get("data_size", 1000)), batch_size=batch_size
    )
    train_loader = train.torch.prepare_data_loader(train_loader)
    model = train.torch.prepare_model(nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))
    for epoch in range(epochs):
        if train.get_context().get_world_size() > 1:
            train_loader.sampler.set_epoch(epoch)
        rows = []
        for X, y in train_loader:
            loss = nn.MSELoss()(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows.append(len(X))
        result = {
            "loss": loss.item(),
            "rows_per_step": max(rows),
            "steps": len(rows),
            "world": train.get_context().get_world_size(),
            "rank": train.get_context().get_world_rank(),
        }
        with tempfile.TemporaryDirectory() as tmpdir:
            torch.save(model.state_dict(), os.path.join(tmpdir, "model.pt"))
            train.report(result, checkpoint=Checkpoint.from_directory(tmpdir))
    return result


def test_ray_trains_example_runs_unchanged_with_the_same_global_batch(ray_cluster, tmp_path):
    import ray.train.torch

    before = ray.train.torch.prepare_model
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"lr": 1e-2, "batch_size": 4, "epochs": 2, "data_size": 400},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(tmp_path), name="linear"),
    )
    result = trainer.fit()
    metrics = result.metrics
    # Ray Train's batch_size=4 is each worker's: 4 rows a step on each of 2 workers, so
    # 400 samples take 50 steps an epoch, as under Ray Train (raylight alone: 2 rows, 100)
    assert (metrics["world"], metrics["rows_per_step"], metrics["steps"]) == (2, 4, 50)
    assert len(result.metrics_history) == 2
    # the Ray Train checkpoint's files came back through raylight's checkpoint
    files = result.checkpoint.load()["ray_train_files"]
    state = torch.load(io.BytesIO(files["model.pt"].numpy().tobytes()), weights_only=True)
    assert set(state) == {"module.weight", "module.bias"}  # a DDP replica's, as under Ray Train
    assert ray.train.torch.prepare_model is before  # the driver's Ray Train is untouched


def test_a_train_func_gets_ray_trains_names_back_after_it_ran():
    import ray.train.torch

    from raylight.ray_train._api import ray_train_api

    class Ctx:
        world_size, rank, local_rank, node_rank = 2, 1, 1, 0

    originals = (train.report, train.get_context, ray.train.torch.prepare_data_loader)
    with ray_train_api(Ctx(), train_func):
        assert train.get_context().get_world_rank() == 1
        assert train.report is not originals[0]
    assert (train.report, train.get_context, ray.train.torch.prepare_data_loader) == originals


def test_a_ray_train_checkpoint_comes_back_as_a_directory_and_imported_names_are_swapped(tmp_path):
    from raylight.ray_train import _api

    def uses_the_imported_name(config):  # `from ray.train import get_context`, bound before it ran
        return get_context().get_world_size()

    saved = {"ray_train_files": {"sub/model.pt": torch.frombuffer(bytearray(b"weights"), dtype=torch.uint8)}}

    class Ctx:
        world_size, rank, local_rank, node_rank = 3, 0, 0, 0

        def get_checkpoint(self):
            return type("Found", (), {"load": lambda self: saved})()

    with _api.ray_train_api(Ctx(), uses_the_imported_name):
        assert uses_the_imported_name({}) == 3
        checkpoint = train.get_checkpoint()
    assert uses_the_imported_name.__globals__["get_context"] is get_context  # put back
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "sub", "model.pt"), "rb") as f:
        assert f.read() == b"weights"


def test_what_raylight_ray_train_does_not_take_is_refused_naming_it():
    from raylight.base.exceptions import ConfigError

    with pytest.raises(NotImplementedError, match=r"TorchTrainer\(datasets=\.\.\.\).*prepare_data_loader"):
        TorchTrainer(train_func, datasets={"train": object()})
    with pytest.raises(ConfigError, match=r"TorchTrainer\(resume_from_checkpoint=\.\.\.\)"):
        TorchTrainer(train_func, resume_from_checkpoint=None)
