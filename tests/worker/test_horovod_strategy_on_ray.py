"""strategy="horovod" through raylight.fit on a real local Ray (2 CPUs, gloo): on
raylight.horovod (always) and on real Horovod (skipped where it is not installed; run with
``PYTHONPATH=<horovod site>:src``), a seeded job ends with the parameters DDP reaches,
Horovod is the one asked for inside the loop, and an elastic run survives a killed worker."""

from __future__ import annotations

import pytest
import torch

import raylight
from raylight.worker.hvd import compat
from tests.support import loops

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

CONFIG = {"lr": 0.05, "batch_size": 32, "epochs": 2}
REAL = pytest.mark.skipif(
    not compat.horovod_installed(),
    reason="real Horovod is not installed (docs/horovod.md: building Horovod 0.28.1)",
)


def _fit(tmp_path, name, strategy, **config):
    return raylight.fit(
        loops.prepared_sgd_loop, config={**CONFIG, **config}, num_workers=2, strategy=strategy,
        storage_path=str(tmp_path), name=name, progress=False,
    )


def _same_as_ddp(tmp_path, result) -> None:
    ddp = _fit(tmp_path, "ddp", "ddp").checkpoint.load()
    got = result.checkpoint.load()
    init = loops.initial_model().state_dict()
    for key, want in ddp["model"].items():
        assert (want - init[key]).abs().max() > 1e-2, "training must move the parameters"
        assert torch.allclose(got["model"][key], want, atol=1e-5, rtol=0), key
    # the optimizer's state (momentum) is saved by parameter name, as DDP's
    assert sorted(got["opt"]["state"]) == sorted(ddp["opt"]["state"])


def test_horovod_on_raylight_horovod_ends_where_ddp_ends(ray_cluster, tmp_path):
    strategy = raylight.Horovod(implementation="raylight")
    result = _fit(tmp_path, "hvd", strategy, hvd="raylight.horovod")
    assert result.metrics["hvd_real"] == 0 and result.metrics["hvd_size"] == 2
    assert result.metrics["hvd_rank_mean"] == 0.5  # (0 + 1) / 2 on the workers' group
    _same_as_ddp(tmp_path, result)


@REAL
def test_horovod_on_real_horovod_ends_where_ddp_ends(ray_cluster, tmp_path):
    result = _fit(tmp_path, "hvd", "horovod", hvd="horovod.torch")  # auto: real Horovod, installed
    assert result.metrics["hvd_real"] == 1 and result.metrics["hvd_size"] == 2
    assert result.metrics["hvd_rank_mean"] == 0.5  # real Horovod's allreduce across the two workers
    _same_as_ddp(tmp_path, result)


@pytest.mark.parametrize("implementation", ["raylight", pytest.param("horovod", marks=REAL)])
def test_an_elastic_horovod_run_shrinks_when_a_worker_dies_and_grows_back(ray_cluster, tmp_path, implementation):
    """Rank 1 is SIGKILLed; the group re-forms at 1 worker in place, Horovod starts again on
    it, and grows back to 2 when the CPU is free. Every epoch sees every sample once."""
    from tests.driver.test_elastic import fit_killed_and_regrown

    result, _ = fit_killed_and_regrown(tmp_path, raylight.Horovod(implementation=implementation))
    moves = [(r["from"], r["to"]) for r in result.resizes]
    assert moves[:2] == [(2, 1), (1, 2)], moves
