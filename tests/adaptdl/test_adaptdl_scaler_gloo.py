"""``AdaptiveDataParallel(mp_scaler=GradScaler)`` across two real gloo ranks (no Ray), the
script calling ``scaler.scale(loss).backward()``, ``scaler.step(opt)``, ``scaler.update()``
at every micro-step as AdaptDL's CIFAR example does, two micro-steps per optimizer step:
the summed gradient is unscaled once (the run steps exactly as one without a scaler, and
measures the same gradient noise), and an inf in one replica's accumulation micro-step
skips that step on both replicas, whose scales back off alike."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.helpers import run_gloo_ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]

STEPS = 4  # optimizer steps: 64 samples, 2 replicas x 4 samples x 2 micro-steps each


def _train(name: str, scaler: torch.amp.GradScaler | None, inf_at: tuple[int, int, int] | None) -> dict:
    """One epoch; ``inf_at`` = (rank, step, micro-step) whose loss is made inf."""
    import raylight.adaptdl.torch as adl
    from raylight.adaptive.plan import BatchPlan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    net = adl.AdaptiveDataParallel(model, optimizer, mp_scaler=scaler, name=name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g))
    loader = adl.AdaptiveDataLoader(data, batch_size=16, shuffle=True)
    loader._adapter.plan = BatchPlan(4, 1, 0)  # what the engine would choose: 2 micro-steps of 4 per replica
    params, scales = [], []
    for i, (inputs, targets) in enumerate(loader):
        step, micro = divmod(i, 2)
        optimizer.zero_grad()
        loss = F.mse_loss(net(inputs), targets)
        if inf_at == (dist.get_rank(), step, micro):
            loss = loss * float("inf")
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if micro == 1:
            params.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
            scales.append(None if scaler is None else scaler.get_scale())
    return {"params": params, "scales": scales, "noise": net._state.noise.state_dict(), "gain": net.gain}


def run_rank(rank: int, port: int, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import raylight.adaptdl.torch as adl

    adl.init_process_group("gloo")
    try:
        queue.put({
            "rank": rank,
            "plain": _train("plain", None, None),
            "scaled": _train("scaled", torch.amp.GradScaler("cpu"), None),
            "inf": _train("inf", torch.amp.GradScaler("cpu"), (1, 1, 0)),  # rank 1, step 1's first micro-step
        })
    finally:
        dist.destroy_process_group()


def close(a: list, b: list) -> None:
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


def test_the_scaler_unscales_once_per_step_and_an_inf_on_one_replica_skips_the_step_on_both():
    out = run_gloo_ranks(run_rank, timeout_s=100)
    plain = out[0]["plain"]
    assert len(plain["params"]) == STEPS
    for rank in (0, 1):
        # One unscale of the summed gradient: the scaled run steps as the plain one.
        close(out[rank]["scaled"]["params"], plain["params"])
        assert out[rank]["scaled"]["scales"] == [65536.0] * STEPS  # no inf: no back-off (growth after 2000)
        assert out[rank]["scaled"]["noise"] == pytest.approx(plain["noise"], rel=1e-4)  # the scale divided out
        assert out[rank]["scaled"]["gain"] == pytest.approx(plain["gain"], rel=1e-4)
        # Rank 1's inf at step 1: the step is skipped on both, both scales halve once.
        assert out[rank]["inf"]["scales"] == [65536.0, 32768.0, 32768.0, 32768.0]
        assert out[rank]["inf"]["params"][1] == out[rank]["inf"]["params"][0]
        close(out[rank]["inf"]["params"][0], plain["params"][0])
        assert out[rank]["inf"]["params"][2] != out[rank]["inf"]["params"][1]  # the next step steps
    assert out[0]["inf"]["params"] == out[1]["inf"]["params"]
    assert all(v == v and abs(v) < 1e6 for v in out[0]["inf"]["params"][-1])  # no nan left in the weights
