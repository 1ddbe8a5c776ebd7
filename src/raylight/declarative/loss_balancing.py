"""Ludwig's ``trainer.loss_balancing``: how a model with several outputs turns their losses
into the one it trains on. Pure math on torch tensors and numpy, no Ray: the training loop
(``train.py``) gives each step's per-output losses, each output's ``loss_weight`` and a
``reduce`` that averages a tensor over the workers (the identity in one process), and
trains on what ``total`` returns. Every balancer decides from values averaged over the
workers, so all of them take the same decision and a run on N workers follows the one
process's (docs/declarative.md, "Loss balancing").

- ``none``: the weighted sum, sum_i w_i L_i (Ludwig's default).
- ``log_transform``: sum_i w_i log(1 + L_i) (DB-MTL's compression of the losses' scales).
- ``uncertainty``: Kendall, Gal and Cipolla (CVPR 2018), homoscedastic uncertainty: one
  learned log-variance s_i per output, sum_i w_i (exp(-s_i) L_i + s_i / 2); the s_i train
  with the model (``parameters``), their gradients averaged over the workers.
- ``famo``: Liu et al., "FAMO: Fast Adaptive Multitask Optimization" (NeurIPS 2023):
  softmax weights z = softmax(xi) over the outputs; the step descends sum_i c z_i log L_i
  (c = 1 / sum_i z_i / L_i), whose gradient is the linear combination sum_i (c z_i / L_i)
  grad L_i, taken here with the L_i of the step (averaged over the workers) as constants;
  after each step xi takes an Adam step (rate ``loss_balancing_lr``, weight decay 1e-3,
  the paper's) down J_softmax(xi)^T delta, delta_i the decrease of log L_i since the last
  step (the paper measures it on the same batch after the update; here on the next batch,
  which costs no extra forward pass).
- ``nash_mtl``: Navon et al., "Multi-Task Learning as a Bargaining Game" (ICML 2022): the
  per-output gradients g_i of the shared parameters (averaged over the workers) give
  M = G G^T; the weights alpha > 0 solve M alpha = 1 / alpha, the minimum of the strictly
  convex 1/2 alpha^T M alpha - sum_i log alpha_i (``nash_weights``: damped Newton in numpy,
  no cvxpy); the step descends sum_i w_i alpha_i L_i. It costs one backward pass per
  output.
- ``pareto_mtl``: preference-vector scalarisation: with lambda (``preference_vector``,
  normalised; null: uniform) and t (``tchebycheff_weight``), (1 - t) sum_i lambda_i w_i L_i
  + t max_i lambda_i w_i L_i.

Ludwig 0.17's own famo and nash_mtl are simpler heuristics under the same names (an
exponential average of loss ratios, and of inverse losses); raylight follows the papers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]
BALANCINGS = ("none", "log_transform", "uncertainty", "famo", "nash_mtl", "pareto_mtl")
FAMO_WEIGHT_DECAY = 1e-3  # FAMO's gamma (the paper's default)
LOG_VAR_LIMIT = 20.0  # uncertainty: |s_i| clamped, so exp(-s_i) neither overflows nor vanishes
_TINY = 1e-8


def _same(value: torch.Tensor) -> torch.Tensor:
    return value


def nash_weights(gram: np.ndarray, *, tol: float = 1e-10, max_iter: int = 100) -> np.ndarray:
    """The alpha > 0 with ``gram @ alpha == 1 / alpha`` (Nash-MTL's bargaining solution for
    the Gram matrix of the per-task gradients): the minimum of 1/2 a^T M a - sum log a_i,
    by Newton's method with a backtracking line search that keeps alpha positive. A task
    without a gradient (a zero row) gets the largest weight the others' scale allows."""
    m = np.asarray(gram, dtype=np.float64)
    k = m.shape[0]
    scale = float(np.trace(m)) / k if k else 0.0
    if not np.isfinite(scale) or scale <= 0:
        return np.ones(k)  # no gradient at all: every task alike
    m = m / scale + 1e-9 * np.eye(k)  # solved at unit scale: alpha scales by 1 / sqrt(scale)

    def objective(a: np.ndarray) -> float:
        return float(0.5 * a @ m @ a - np.log(a).sum())

    alpha = 1.0 / np.sqrt(np.diag(m))
    for _ in range(max_iter):
        grad = m @ alpha - 1.0 / alpha
        if float(np.abs(grad * alpha).max()) < tol:
            break
        step = np.linalg.solve(m + np.diag(1.0 / alpha**2), grad)
        t, now = 1.0, objective(alpha)
        while t > 1e-12:
            trial = alpha - t * step
            if (trial > 0).all() and objective(trial) <= now - 1e-4 * t * float(grad @ step):
                break
            t /= 2
        alpha = alpha - t * step
    return alpha / np.sqrt(scale)


class Balancer:
    """``none``: the weighted sum. Subclasses change ``total``; a balancer that learns
    keeps its state in ``state_dict``."""

    needs_gradients = False  # whether ``total`` needs the shared parameters (nash_mtl)

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = [float(w) for w in weights]

    def parameters(self) -> list[torch.nn.Parameter]:
        """Parameters that train with the model's (their gradients averaged over the workers)."""
        return []

    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """The loss to train on, from each output's loss of this step."""
        return torch.stack([w * loss for w, loss in zip(self.weights, losses, strict=True)]).sum()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class LogTransform(Balancer):
    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        return torch.stack([w * torch.log1p(loss) for w, loss in zip(self.weights, losses, strict=True)]).sum()


class Uncertainty(Balancer):
    def __init__(self, weights: Sequence[float], device: torch.device | None = None) -> None:
        super().__init__(weights)
        self.log_vars = torch.nn.Parameter(torch.zeros(len(self.weights), device=device))

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.log_vars]

    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        s = self.log_vars.clamp(-LOG_VAR_LIMIT, LOG_VAR_LIMIT).to(losses[0].device)
        w = torch.tensor(self.weights, device=losses[0].device)
        return (w * (torch.exp(-s) * torch.stack(list(losses)) + 0.5 * s)).sum()

    def state_dict(self) -> dict[str, Any]:
        return {"log_vars": self.log_vars.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            with torch.no_grad():
                self.log_vars.copy_(state["log_vars"])


class Famo(Balancer):
    def __init__(self, weights: Sequence[float], lr: float) -> None:
        super().__init__(weights)
        self.logits = torch.zeros(len(self.weights), dtype=torch.float64, requires_grad=True)
        self.opt = torch.optim.Adam([self.logits], lr=lr, weight_decay=FAMO_WEIGHT_DECAY)
        self.previous: torch.Tensor | None = None

    def softmax(self) -> torch.Tensor:
        return torch.softmax(self.logits.detach(), 0)

    def observe(self, mean_losses: torch.Tensor) -> None:
        """Update the logits from the losses now (averaged over the workers) against the last step's."""
        now = mean_losses.detach().to(torch.float64).cpu().clamp_min(_TINY)
        if self.previous is not None:
            delta = self.previous.log() - now.log()  # each output's decrease of log L
            z = self.softmax()
            self.logits.grad = z * (delta - (z * delta).sum())  # J_softmax^T delta
            self.opt.step()
        self.previous = now

    def linear_weights(self, mean_losses: torch.Tensor) -> torch.Tensor:
        """c z_i / L_i: the gradient of sum_i c z_i log L_i as a combination of the grad L_i."""
        z, big_l = self.softmax(), mean_losses.detach().to(torch.float64).cpu().clamp_min(_TINY)
        c = 1.0 / (z / big_l).sum()
        return c * z / big_l

    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        stacked = torch.stack(list(losses))
        mean = reduce(stacked.detach())
        self.observe(mean)
        a = self.linear_weights(mean).to(stacked.device, stacked.dtype)
        w = torch.tensor(self.weights, device=stacked.device, dtype=stacked.dtype)
        return (w * a * stacked).sum()

    def state_dict(self) -> dict[str, Any]:
        return {"logits": self.logits.detach().clone(), "opt": self.opt.state_dict(), "previous": self.previous}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        with torch.no_grad():
            self.logits.copy_(state["logits"])
        self.opt.load_state_dict(state["opt"])
        self.previous = state["previous"]


class NashMTL(Balancer):
    needs_gradients = True

    def __init__(self, weights: Sequence[float]) -> None:
        super().__init__(weights)
        self.alpha = np.ones(len(self.weights))

    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        params = [p for p in shared if p.requires_grad]
        rows = []
        for loss in losses:
            grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params, strict=True)]))
        g = reduce(torch.stack(rows).detach())  # each output's gradient, averaged over the workers
        self.alpha = nash_weights((g @ g.T).double().cpu().numpy())
        a = torch.tensor(self.alpha * np.array(self.weights), device=losses[0].device, dtype=losses[0].dtype)
        return (a * torch.stack(list(losses))).sum()


class ParetoMTL(Balancer):
    def __init__(self, weights: Sequence[float], preference: Sequence[float] | None, tchebycheff: float) -> None:
        super().__init__(weights)
        pref = np.ones(len(self.weights)) if preference is None else np.asarray(preference, dtype=np.float64)
        self.preference = (pref / pref.sum()).tolist()
        self.tchebycheff = tchebycheff

    def total(self, losses: Sequence[torch.Tensor], reduce: Reduce = _same, shared: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        scaled = torch.stack([p * w * loss for p, w, loss in zip(self.preference, self.weights, losses, strict=True)])
        return (1 - self.tchebycheff) * scaled.sum() + self.tchebycheff * scaled.max()


def build_balancer(
    kind: str, weights: Sequence[float], *, lr: float = 0.01, preference: Sequence[float] | None = None,
    tchebycheff: float = 0.5, device: torch.device | None = None,
) -> Balancer:
    """The balancer ``trainer.loss_balancing`` names, for outputs of these ``loss_weight``s."""
    if kind == "none":
        return Balancer(weights)
    if kind == "log_transform":
        return LogTransform(weights)
    if kind == "uncertainty":
        return Uncertainty(weights, device)
    if kind == "famo":
        return Famo(weights, lr)
    if kind == "nash_mtl":
        return NashMTL(weights)
    if kind == "pareto_mtl":
        return ParetoMTL(weights, preference, tchebycheff)
    raise ValueError(f"trainer.loss_balancing: {kind!r} is not one of {', '.join(BALANCINGS)}")
