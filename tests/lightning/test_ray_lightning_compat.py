"""ray_lightning users' code on raylight.lightning, without Ray: ray_lightning's
arguments (``num_cpus_per_worker``, ``init_hook``, ``resources_per_worker``, ``use_gpu``)
and attributes, ``RayShardedStrategy``, ``LightningCLI`` building the strategy, and a
``pytorch_lightning`` (the old package name) Trainer told in one line what to import."""

from __future__ import annotations

import pytest

pl = pytest.importorskip("lightning.pytorch")

from raylight.base.exceptions import ConfigError  # noqa: E402
from raylight.lightning import RayFSDPStrategy, RayShardedStrategy, RayStrategy  # noqa: E402


def _hook() -> None:
    pass


def test_ray_lightnings_arguments_reach_the_workers_settings():
    strategy = RayStrategy(num_workers=3, num_cpus_per_worker=2, init_hook=_hook)
    assert strategy.settings.scaling.resources_per_worker == {"CPU": 2}
    assert strategy.settings.init_hook is _hook
    # the attributes ray_lightning's Tune helpers read
    assert (strategy.num_workers, strategy.use_gpu, strategy.num_cpus_per_worker) == (3, False, 2.0)
    merged = RayStrategy(num_workers=2, num_cpus_per_worker=2, resources_per_worker={"accel": 1})
    assert merged.settings.scaling.resources_per_worker == {"accel": 1, "CPU": 2}
    assert RayStrategy(resources_per_worker={"CPU": 3}).num_cpus_per_worker == 3.0
    assert RayStrategy().num_cpus_per_worker == 1.0
    gpu = RayStrategy(num_workers=2, use_gpu=True, resources_per_worker={"GPU": 1})
    assert (gpu.use_gpu, gpu.settings.scaling.resources_per_worker) == (True, {"GPU": 1})
    fsdp = RayFSDPStrategy(num_workers=2, num_cpus_per_worker=1, init_hook=_hook)
    assert (fsdp.num_workers, fsdp.num_cpus_per_worker, fsdp.settings.init_hook) == (2, 1.0, _hook)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_cpus_per_worker": 0}, r"RayStrategy\(num_cpus_per_worker=0\): needs a number > 0"),
        ({"num_cpus_per_worker": "2"}, r"RayStrategy\(num_cpus_per_worker='2'\)"),
        (
            {"num_cpus_per_worker": 2, "resources_per_worker": {"CPU": 1}},
            r"num_cpus_per_worker=2\).*disagree",
        ),
        ({"init_hook": "setup"}, r"RayStrategy\(init_hook='setup'\): needs a function"),
        ({"parallel_devices": ["cpu"]}, r"RayStrategy\(parallel_devices=\.\.\.\) is not accepted"),
    ],
)
def test_ray_lightnings_arguments_are_checked_at_construction(kwargs, message):
    # before: init_hook and num_cpus_per_worker went on to DDP and failed in the worker
    with pytest.raises(ConfigError, match=message):
        RayStrategy(num_workers=2, **kwargs)


def test_lightnings_default_for_a_reserved_argument_is_accepted():
    # LightningCLI passes every DDPStrategy argument at its default, these included
    strategy = RayStrategy(
        num_workers=2, parallel_devices=None, accelerator=None, start_method="popen"
    )
    assert strategy.num_workers == 2


def test_lightning_cli_builds_a_trainer_with_rays_strategy():
    pytest.importorskip("jsonargparse")
    import torch
    from lightning.pytorch.cli import LightningCLI

    class Tiny(pl.LightningModule):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(width, 1)

    args = [
        "--trainer.strategy=raylight.lightning.RayStrategy",
        "--trainer.strategy.num_workers=2",
        "--trainer.strategy.num_cpus_per_worker=1",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    ]
    cli = LightningCLI(
        Tiny, run=False, save_config_callback=None, seed_everything_default=False, args=args
    )
    assert isinstance(cli.trainer.strategy, RayStrategy)
    assert (cli.trainer.strategy.num_workers, cli.trainer.strategy.num_cpus_per_worker) == (2, 1.0)


def test_ray_sharded_strategy_runs_as_fsdp_and_says_so():
    with pytest.warns(UserWarning, match="RayShardedStrategy runs as RayFSDPStrategy"):
        strategy = RayShardedStrategy(num_workers=2, num_cpus_per_worker=1, init_hook=_hook)
    assert isinstance(strategy, RayFSDPStrategy)
    assert (strategy.num_workers, strategy.settings.scaling.resources_per_worker) == (2, {"CPU": 1})
    trainer = pl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
    assert trainer.strategy is strategy


_OLD_PACKAGE = """
import pytorch_lightning as ptl
import lightning.pytorch as pl
from raylight.base.exceptions import ConfigError
from raylight.lightning import RayFSDPStrategy, RayStrategy

for strategy in (RayStrategy(num_workers=2), RayFSDPStrategy(num_workers=2)):
    try:
        ptl.Trainer(strategy=strategy, logger=False, enable_progress_bar=False)
    except ConfigError as error:
        print("REFUSED", type(strategy).__name__, repr(str(error)))
    else:
        print("ACCEPTED", type(strategy).__name__)
# the lightning.pytorch Trainer still takes it
print("TAKES", type(pl.Trainer(strategy=RayStrategy(num_workers=2), logger=False).strategy).__name__)
"""


def test_a_pytorch_lightning_trainer_is_told_which_package_in_one_line():
    # In a fresh interpreter: importing the old package changes process-wide warning and
    # logging state that other tests of this session check.
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("pytorch_lightning") is None:
        pytest.skip("pytorch_lightning is not installed")
    out = subprocess.run(
        [sys.executable, "-c", _OLD_PACKAGE], capture_output=True, text=True, timeout=240, check=True
    ).stdout.splitlines()
    refused = [line for line in out if line.startswith(("REFUSED", "ACCEPTED"))]
    assert [line.split()[:2] for line in refused] == [
        ["REFUSED", "RayStrategy"],
        ["REFUSED", "RayFSDPStrategy"],
    ], out
    for line in refused:
        message = line.split(" ", 2)[2]
        assert "built on lightning.pytorch, and this Trainer is a pytorch_lightning.Trainer" in message
        assert "\\n" not in message and "import lightning.pytorch as pl" in message
    assert "TAKES RayStrategy" in out
