"""HorovodRayStrategy on a real local Ray (2 CPUs): a LightningModule calling hvd.rank(),
hvd.size() and hvd.allreduce trains on 2 workers, fits twice, its metrics come back."""

from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import raylight.horovod as hvd  # noqa: E402
from raylight.exceptions import ConfigError  # noqa: E402
from raylight.lightning import HorovodRayStrategy  # noqa: E402

pytestmark = pytest.mark.timeout(150)

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
    trainer = pl.Trainer(max_epochs=2, strategy=HorovodRayStrategy(num_hosts=1, num_slots=2), **QUIET)
    trainer.fit(model, _loader())
    metrics = trainer.callback_metrics
    assert float(metrics["hvd_size"]) == 2.0 and float(metrics["hvd_local_size"]) == 2.0
    assert float(metrics["hvd_rank_mean"]) == 0.5  # (0 + 1) / 2: hvd.allreduce on the workers' group
    first = float(metrics["train_loss"])
    trainer = pl.Trainer(max_epochs=2, strategy=HorovodRayStrategy(num_workers=2), **QUIET)
    trainer.fit(model, _loader())  # the trained weights came back: fitting again starts from them
    assert float(trainer.callback_metrics["train_loss"]) < first
    assert not hvd.is_initialized()  # the driver never joined a group


def test_constructor_arguments():
    with pytest.raises(ConfigError, match="not both"):
        HorovodRayStrategy(num_workers=2, num_hosts=1)
    with pytest.raises(ConfigError, match="num_slots=0"):
        HorovodRayStrategy(num_hosts=2, num_slots=0)
    assert HorovodRayStrategy(num_hosts=2, num_slots=3).settings.scaling.num_workers == 6
    assert HorovodRayStrategy().settings.scaling.num_workers == 1
