"""Issue 56's trainer side of Ludwig's configs: the optimizers torch's classes do not give
as one class (muon's split, schedule_free_adamw's two points, lbfgs's closure) and
``trainer.loss_balancing``'s math, without Ray; lbfgs's step on two gloo ranks (no Ray)
against one process's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from raylight.declarative.loss_balancing import (
    Famo,
    ParetoMTL,
    Uncertainty,
    build_balancer,
    nash_weights,
)
from raylight.declarative.models.ecd import build_model
from raylight.declarative.optimizers import SplitOptimizer, build_optimizer, eval_mode, train_mode
from raylight.declarative.suggest import validate_config
from raylight.declarative.train import TrainStep
from tests.helpers import run_gloo_ranks

BASE: dict[str, Any] = {
    "input_features": [{"name": "a", "type": "number"}, {"name": "b", "type": "number"}],
    "output_features": [{"name": "y", "type": "number"}, {"name": "z", "type": "binary"}],
    "combiner": {"type": "concat", "num_fc_layers": 1, "output_size": 8},
}
NUMBER = {"mean": 0.0, "std": 1.0, "min": -3.0, "span": 6.0}
META = {"a": NUMBER, "b": NUMBER, "y": {"mean": 0.0, "std": 1.0}, "z": {}}


def _batch(rows: int = 64, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(rows, generator=g, dtype=dtype), torch.randn(rows, generator=g, dtype=dtype)
    return {"a": a[:, None], "b": b[:, None]}, {"y": 2 * a - b, "z": (a > 0).float()}


# -- loss balancing: the math --------------------------------------------------------
def test_nash_weights_solve_the_bargaining_equations():
    # orthogonal gradients: alpha_i = 1 / |g_i| (Nash-MTL's closed form)
    g = np.array([[3.0, 0.0, 0.0], [0.0, 0.5, 0.0]])
    assert np.allclose(nash_weights(g @ g.T), [1 / 3, 2.0], rtol=1e-6)
    rng = np.random.default_rng(0)
    for k in (2, 3, 5):
        g = rng.normal(size=(k, 20)) * rng.uniform(0.1, 10, size=(k, 1))
        m = g @ g.T
        alpha = nash_weights(m)
        assert (alpha > 0).all() and np.allclose(m @ alpha, 1 / alpha, rtol=1e-5), (k, alpha)
    assert np.allclose(nash_weights(np.zeros((2, 2))), [1.0, 1.0])  # no gradient: alike


def test_uncertainty_weighting_is_kendall_s_and_learns_the_log_variances():
    bal = Uncertainty([1.0, 2.0])
    with torch.no_grad():
        bal.log_vars.copy_(torch.tensor([0.5, -1.0]))
    losses = [torch.tensor(3.0), torch.tensor(0.25)]
    want = 1.0 * (np.exp(-0.5) * 3.0 + 0.25) + 2.0 * (np.exp(1.0) * 0.25 - 0.5)
    total = bal.total(losses)
    assert float(total.detach()) == pytest.approx(want, rel=1e-6)
    total.backward()
    # d/ds_i of w_i (exp(-s_i) L_i + s_i / 2) = w_i (1/2 - exp(-s_i) L_i)
    assert bal.log_vars.grad.tolist() == pytest.approx([0.5 - np.exp(-0.5) * 3.0, 2.0 * (0.5 - np.exp(1.0) * 0.25)], rel=1e-5)


def test_famo_weighs_down_the_output_that_improves_faster():
    bal = Famo([1.0, 1.0], lr=0.1)
    param = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    total = bal.total([param[0] * 4.0, param[1] * 1.0])
    # the first step: z uniform; c = 1 / sum z_i / L_i; weights c z_i / L_i
    c = 1 / (0.5 / 4.0 + 0.5 / 1.0)
    total.backward()
    assert param.grad.tolist() == pytest.approx([c * 0.5 / 4.0 * 4.0, c * 0.5 / 1.0 * 1.0], rel=1e-5)
    assert float(bal.softmax()[0]) == pytest.approx(0.5)
    for _ in range(5):  # output 0 halves its loss each step, output 1 stays
        bal.total([torch.tensor(float(bal.previous[0]) / 2), torch.tensor(1.0)])
    z = bal.softmax()
    assert float(z[0]) < 0.5 < float(z[1]), z
    again = Famo([1.0, 1.0], lr=0.1)
    again.load_state_dict(bal.state_dict())
    assert torch.equal(again.softmax(), z) and torch.equal(again.previous, bal.previous)


def test_pareto_and_log_transform_and_none():
    losses = [torch.tensor(2.0), torch.tensor(6.0)]
    assert float(build_balancer("none", [1.0, 0.5]).total(losses)) == pytest.approx(5.0)
    assert float(build_balancer("log_transform", [1.0, 1.0]).total(losses)) == pytest.approx(np.log(3) + np.log(7))
    pareto = ParetoMTL([1.0, 1.0], [3.0, 1.0], 0.5)  # lambda = (0.75, 0.25): 1.5 and 1.5
    assert float(pareto.total(losses)) == pytest.approx(0.5 * 3.0 + 0.5 * 1.5)


def _ctx(model: torch.nn.Module, world: int = 1) -> Any:
    import torch.distributed as dist

    def all_reduce(value: torch.Tensor) -> torch.Tensor:
        out = value.detach().clone()
        dist.all_reduce(out)
        return out / world

    unwrap = getattr(model, "module", model)
    return SimpleNamespace(world_size=world, all_reduce=all_reduce, unwrap_model=lambda m: unwrap)


@pytest.mark.parametrize("kind", ["uncertainty", "famo", "nash_mtl", "pareto_mtl"])
def test_each_balancing_trains_a_two_output_model(kind):
    cfg = validate_config({**BASE, "trainer": {"loss_balancing": kind, "batch_size": 64}})
    torch.manual_seed(0)
    model = build_model(cfg, META)
    bal = build_balancer(kind, [1.0, 1.0])
    opt = build_optimizer(cfg.trainer.optimizer, [*model.parameters(), *bal.parameters()], 0.01)
    step = TrainStep(_ctx(model), model, cfg, bal)
    batch, targets = _batch()
    first = [float(x) for x in step(opt, dict(batch), targets)[0]]
    for _ in range(150):
        losses, _ = step(opt, dict(batch), targets)
    assert all(float(now) < before for now, before in zip(losses, first, strict=True)), (first, losses)
    if kind == "uncertainty":
        assert bal.log_vars.abs().sum() > 0  # the log-variances trained with the model
    if kind == "nash_mtl":
        assert (bal.alpha > 0).all()


# -- optimizers -------------------------------------------------------------------------
def test_muon_takes_the_2d_weights_and_adamw_the_rest():
    cfg = validate_config({**BASE, "trainer": {"optimizer": {"type": "muon", "momentum": 0.9}}})
    model = build_model(cfg, META)
    opt = build_optimizer(cfg.trainer.optimizer, model.parameters(), 0.01)
    assert isinstance(opt, SplitOptimizer)
    muon, adamw = opt.parts
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"]) and muon.param_groups[0]["momentum"] == 0.9
    assert all(p.ndim != 2 for g in adamw.param_groups for p in g["params"])
    for group in opt.param_groups:  # a rate schedule sets each part's rate
        group["lr"] = 0.005
    assert muon.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] == 0.005
    step = TrainStep(_ctx(model), model, cfg, build_balancer("none", [1.0, 1.0]))
    batch, targets = _batch()
    before = [p.detach().clone() for p in model.parameters()]
    step(opt, dict(batch), targets)
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    again = build_optimizer(cfg.trainer.optimizer, model.parameters(), 0.01)
    again.load_state_dict(opt.state_dict())
    assert again.state_dict()["parts"][0]["state"].keys() == opt.state_dict()["parts"][0]["state"].keys()
    with pytest.raises(ValueError, match=r"another trainer\.optimizer\.type"):
        again.load_state_dict(torch.optim.Adam(model.parameters()).state_dict())


def test_schedule_free_adamw_evaluates_at_its_average_and_trains_at_its_point():
    cfg = validate_config({**BASE, "trainer": {"optimizer": {"type": "schedule_free_adamw", "warmup_steps": 2}}})
    model = build_model(cfg, META)
    opt = build_optimizer(cfg.trainer.optimizer, model.parameters(), 0.01)
    step = TrainStep(_ctx(model), model, cfg, build_balancer("none", [1.0, 1.0]))
    batch, targets = _batch()
    train_mode(opt)
    for _ in range(5):
        step(opt, dict(batch), targets)
    trained = [p.detach().clone() for p in model.parameters()]
    eval_mode(opt)
    averaged = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.allclose(t, a) for t, a in zip(trained, averaged, strict=True))
    train_mode(opt)  # back at the training point
    assert all(torch.allclose(t, p, atol=1e-6) for t, p in zip(trained, model.parameters(), strict=True))


def test_adafactor_and_lbfgs_train():
    batch, targets = _batch()
    for optimizer, lr, steps in (({"type": "adafactor"}, 0.01, 30), ({"type": "lbfgs", "max_iter": 10}, 1.0, 3)):
        cfg = validate_config({**BASE, "trainer": {"optimizer": optimizer}})
        torch.manual_seed(0)
        model = build_model(cfg, META)
        opt = build_optimizer(cfg.trainer.optimizer, model.parameters(), lr)
        step = TrainStep(_ctx(model), model, cfg, build_balancer("none", [1.0, 1.0]))
        first = float(step(opt, dict(batch), targets)[1])
        for _ in range(steps):
            last = float(step(opt, dict(batch), targets)[1])
        assert last < first, (optimizer, first, last)


# -- lbfgs on two ranks ----------------------------------------------------------------
LBFGS = {**BASE, "trainer": {"optimizer": {"type": "lbfgs", "max_iter": 15, "history_size": 5}, "batch_size": 64}}


def _lbfgs_weights(model: torch.nn.Module, ctx: Any, batch: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    cfg = validate_config(LBFGS)
    opt = build_optimizer(cfg.trainer.optimizer, model.parameters(), 1.0)
    step = TrainStep(ctx, model, cfg, build_balancer("none", [1.0, 1.0]))
    for _ in range(2):
        step(opt, dict(batch), targets)
    return [p.detach().clone() for p in ctx.unwrap_model(model).parameters()]


def _lbfgs_rank(rank: int, port: int, queue: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, 2, rank == 0), rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(build_model(validate_config(LBFGS), META).double())
        batch, targets = _batch(dtype=torch.float64)
        half = slice(rank * 32, (rank + 1) * 32)
        mine = _lbfgs_weights(model, _ctx(model, 2), {k: v[half] for k, v in batch.items()}, {k: v[half] for k, v in targets.items()})
        queue.put({"rank": rank, "weights": [w.numpy() for w in mine]})
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_lbfgs_on_two_ranks_takes_one_process_s_steps():
    """Each closure call averages the gradients (DDP) and the loss over the ranks, so both
    ranks' line searches agree and follow the one process's over the whole batch."""
    torch.manual_seed(0)
    model = build_model(validate_config(LBFGS), META).double()  # float64: LBFGS's iterations amplify rounding
    batch, targets = _batch(dtype=torch.float64)
    alone = _lbfgs_weights(model, _ctx(model), batch, targets)
    ranks = run_gloo_ranks(_lbfgs_rank, world_size=2, timeout_s=240)
    for rank in (0, 1):
        for w, a in zip(ranks[rank]["weights"], alone, strict=True):
            np.testing.assert_allclose(w, a.numpy(), rtol=1e-6, atol=1e-9)
