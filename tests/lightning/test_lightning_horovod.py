"""HorovodRayStrategy on a real local Ray (2 CPUs): a LightningModule calling hvd.rank(),
hvd.size() and hvd.allreduce trains on 2 workers, fits twice, its metrics come back; on
raylight.horovod always, on real Horovod where it is installed (else skipped)."""

from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import raylight.horovod as hvd  # noqa: E402
from raylight.base.exceptions import ConfigError  # noqa: E402
from raylight.lightning import HorovodRayStrategy  # noqa: E402
from raylight.worker.hvd import compat  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(150)]

QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False, "enable_checkpointing": False}


class HorovodModule(pl.LightningModule):
    """Horovod user code inside Lightning: the world from hvd, a metric averaged by hvd."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.log("hvd_size", float(hvd.size()))
        self.log("hvd_rank_mean", hvd.allreduce(torch.tensor(float(hvd.rank()))))
        self.log("hvd_local_size", float(hvd.local_size()))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)


def test_hvd_calls_inside_the_module_fit_twice(ray_cluster):
    torch.manual_seed(0)
    model = HorovodModule()
    strategy = HorovodRayStrategy(num_hosts=1, num_slots=2, implementation="raylight")
    trainer = pl.Trainer(max_epochs=2, strategy=strategy, **QUIET)
    trainer.fit(model, _loader())
    metrics = trainer.callback_metrics
    assert float(metrics["hvd_size"]) == 2.0 and float(metrics["hvd_local_size"]) == 2.0
    assert float(metrics["hvd_rank_mean"]) == 0.5  # (0 + 1) / 2: hvd.allreduce on the workers' group
    first = float(metrics["train_loss"])
    trainer = pl.Trainer(max_epochs=2, strategy=HorovodRayStrategy(num_workers=2, implementation="raylight"), **QUIET)
    trainer.fit(model, _loader())  # the trained weights came back: fitting again starts from them
    assert float(trainer.callback_metrics["train_loss"]) < first
    assert not hvd.is_initialized()  # the driver never joined a group


class RealHorovodModule(HorovodModule):
    """The same, with real Horovod's module (imported on the worker)."""

    def training_step(self, batch, batch_idx):
        import horovod.torch as real

        x, y = batch
        loss = ((self.net(x) - y) ** 2).mean()
        self.log("hvd_real", float(real.__name__ == "horovod.torch" and hasattr(real, "mpi_lib_v2")))
        self.log("hvd_size", float(real.size()))
        self.log("hvd_rank_mean", real.allreduce(torch.tensor(float(real.rank()))))
        self.log("hvd_local_size", float(real.local_size()))
        self.log("train_loss", loss)
        return loss


@pytest.mark.skipif(not compat.horovod_installed(), reason="real Horovod is not installed (docs/horovod.md)")
def test_real_horovod_inside_the_module_fit_twice(ray_cluster):
    torch.manual_seed(0)
    model = RealHorovodModule()
    losses = []
    for _ in range(2):  # the second fit's workers start real Horovod again (reused processes or new)
        strategy = HorovodRayStrategy(num_workers=2)  # auto: real Horovod, installed
        assert strategy.implementation == "horovod"
        trainer = pl.Trainer(max_epochs=2, strategy=strategy, **QUIET)
        trainer.fit(model, _loader())
        metrics = trainer.callback_metrics
        assert float(metrics["hvd_real"]) == 1.0
        assert float(metrics["hvd_size"]) == 2.0 and float(metrics["hvd_local_size"]) == 2.0
        assert float(metrics["hvd_rank_mean"]) == 0.5  # real Horovod's allreduce across the workers
        losses.append(float(metrics["train_loss"]))
    assert losses[1] < losses[0]  # the trained weights came back between the fits


def test_constructor_arguments():
    with pytest.raises(ConfigError, match="not both"):
        HorovodRayStrategy(num_workers=2, num_hosts=1)
    with pytest.raises(ConfigError, match="num_slots=0"):
        HorovodRayStrategy(num_hosts=2, num_slots=0)
    assert HorovodRayStrategy(num_hosts=2, num_slots=3).settings.scaling.num_workers == 6
    assert HorovodRayStrategy().settings.scaling.num_workers == 1
    with pytest.raises(ConfigError, match=r"implementation='mpi'.*\['auto', 'horovod', 'raylight'\]"):
        HorovodRayStrategy(implementation="mpi")
    assert HorovodRayStrategy(implementation="raylight").implementation == "raylight"
    if not compat.horovod_installed():
        with pytest.raises(ConfigError, match=r"HorovodRayStrategy\(implementation=...\).*docs/horovod\.md"):
            HorovodRayStrategy(implementation="horovod")
