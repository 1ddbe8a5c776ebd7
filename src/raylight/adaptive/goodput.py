"""Goodput = throughput x statistical efficiency (Pollux / AdaptDL), pure and vectorised.

Notation: K replicas on N nodes, atomic (per-replica, per-micro-step) batch m, s extra
gradient-accumulation steps, global batch M = K * m * (s + 1), initial batch M0.

Throughput model (seconds per optimizer step)::

    T_grad(m)   = alpha_c + beta_c * m                           compute, one micro-batch
    T_sync(K,N) = 0                                  if K == 1
                = alpha_r + beta_r * max(K - 2, 0)   if N == 1   all-reduce within a node
                = alpha_n + beta_n * max(K - 2, 0)   if N > 1    all-reduce across nodes
    T_iter      = s * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)   gamma: overlap
    THROUGHPUT  = M / T_iter

Statistical efficiency from the gradient noise (sqr = |G|^2, var = tr(Sigma) at M0)::

    S = M / M0;  gain r = (var + sqr) / (var / S + sqr);  EFFICIENCY = r / S
      = (phi + M0) / (phi + M)  with phi = M0 * var / sqr, the noise scale

Every function broadcasts over numpy arrays of its arguments. Scalars in, scalars out, as
in AdaptDL: where every argument is a scalar the result is a Python float (``optimize``: a
float and two ints), else an array of the broadcast shape.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
Value = float | Array  # a float where every argument was a scalar, else an array
IntValue = int | NDArray[np.int_]


def _value(result: ArrayLike) -> Value:
    """A 0-d result (every argument a scalar) as a Python float, else the array."""
    out = np.asarray(result, dtype=float)
    return float(out) if out.ndim == 0 else out


class PerfParams(NamedTuple):
    """Throughput-model parameters, in seconds (gamma is unitless, in [1, 10])."""

    alpha_c: float  # compute: fixed cost of a micro-step
    beta_c: float  # compute: cost per sample
    alpha_n: float  # sync across nodes: fixed cost
    beta_n: float  # sync across nodes: cost per replica beyond 2
    alpha_r: float  # sync within a node: fixed cost
    beta_r: float  # sync within a node: cost per replica beyond 2
    gamma: float  # overlap of compute and sync: 1 none, large perfect


class GradParams(NamedTuple):
    """Gradient statistics at the initial batch size M0."""

    sqr: float  # |G|^2, squared norm of the true gradient
    var: float  # tr(Sigma) / M0, the variance of a gradient estimate at batch M0


def predict_grad_time(params: PerfParams, atomic_bsz: ArrayLike) -> Value:
    return _value(params.alpha_c + params.beta_c * np.asarray(atomic_bsz, dtype=float))


def predict_sync_time(params: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike) -> Value:
    nodes = np.asarray(num_nodes, dtype=float)
    replicas = np.asarray(num_replicas, dtype=float)
    extra = np.maximum(replicas - 2, 0)
    cross = params.alpha_n + params.beta_n * extra
    local = params.alpha_r + params.beta_r * extra
    return _value(np.where(replicas <= 1, 0.0, np.where(nodes > 1, cross, local)))


def predict_step_time(
    params: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_steps: ArrayLike,
) -> Value:
    """Seconds per optimizer step: s accumulation micro-steps plus one synchronising one."""
    grad = np.asarray(predict_grad_time(params, atomic_bsz))
    sync = np.asarray(predict_sync_time(params, num_nodes, num_replicas))
    gamma = params.gamma
    overlapped = (grad**gamma + sync**gamma) ** (1.0 / gamma)
    return _value(np.asarray(accum_steps, dtype=float) * grad + overlapped)


def gain(scale: ArrayLike, grad_params: GradParams) -> Value:
    """AdaScale's gain r = (var + sqr) / (var / S + sqr) at batch scale S = M / M0: the
    progress of one step in steps at M0 (1 when nothing is known about the noise)."""
    s = np.asarray(scale, dtype=float)
    sqr, var = max(grad_params.sqr, 0.0), max(grad_params.var, 0.0)
    denom = var / s + sqr
    return _value(np.where(denom > 0, (var + sqr) / np.where(denom > 0, denom, 1.0), 1.0))


class GoodputFunction:
    """GOODPUT(N, K, m, s) = THROUGHPUT(N, K, m, s) * EFFICIENCY(K * m * (s + 1))."""

    def __init__(self, perf_params: PerfParams, grad_params: GradParams, init_batch_size: int) -> None:
        if init_batch_size < 1:
            raise ValueError(f"init_batch_size must be >= 1, got {init_batch_size}")
        self.perf_params = PerfParams(*perf_params)
        self.grad_params = GradParams(*grad_params)
        self.init_batch_size = init_batch_size

    def __call__(self, num_nodes, num_replicas, atomic_bsz, accum_steps) -> Value:
        return self.evaluate(num_nodes, num_replicas, atomic_bsz, accum_steps)

    def evaluate(self, num_nodes, num_replicas, atomic_bsz, accum_steps) -> Value:
        batch = (
            np.asarray(num_replicas, dtype=float)
            * np.asarray(atomic_bsz, dtype=float)
            * (np.asarray(accum_steps, dtype=float) + 1)
        )
        throughput = np.asarray(self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps))
        return _value(throughput * self.efficiency(batch))

    def throughput(self, num_nodes, num_replicas, atomic_bsz, accum_steps) -> Value:
        """Samples per second."""
        batch = (
            np.asarray(num_replicas, dtype=float)
            * np.asarray(atomic_bsz, dtype=float)
            * (np.asarray(accum_steps, dtype=float) + 1)
        )
        return _value(batch / predict_step_time(self.perf_params, num_nodes, num_replicas, atomic_bsz, accum_steps))

    def efficiency(self, batch_size: ArrayLike) -> Value:
        """Progress per sample at ``batch_size`` relative to M0; 1 at M0, in (0, 1] above."""
        scale = np.asarray(batch_size, dtype=float) / self.init_batch_size
        return _value(np.asarray(gain(scale, self.grad_params)) / scale)

    def gain(self, batch_size: ArrayLike) -> Value:
        """r: progress of one step at ``batch_size`` in steps at M0 (AdaScale's gain)."""
        return gain(np.asarray(batch_size, dtype=float) / self.init_batch_size, self.grad_params)

    def optimize(
        self,
        num_nodes: ArrayLike,
        num_replicas: ArrayLike,
        max_batch_size: int | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
        grid_size: int = 64,
    ) -> tuple[Value, IntValue, IntValue]:
        """Best (goodput, atomic_bsz, accum_steps) for each (num_nodes, num_replicas): a
        float and two ints for one layout given as scalars, else arrays of their shape.

        Searches a geometric grid of global batch sizes in [max(M0, K * m_min), M_max],
        splits each into the fewest accumulation steps that keep m within
        ``atomic_bsz_range`` (memory), and takes the argmax. A layout that cannot reach
        M0 within the bounds gets goodput 0.

        One worker (K = 1), as in AdaptDL: a batch above M0 takes at least two micro-steps
        (s >= 1), and without ``accumulation`` the batch stays M0. One worker has no second
        replica to compare its gradient with; two micro-steps at the same parameters are an
        unbiased pair, while two consecutive steps (the only pair without accumulation) are
        biased by the step between them, towards more noise and so larger batches.
        """
        m0 = self.init_batch_size
        low, high = atomic_bsz_range or (None, None)  # either may be None, as in AdaptDL
        m_min, m_max = low or 1, high or max_batch_size or m0
        nodes, replicas = np.broadcast_arrays(
            np.asarray(num_nodes, dtype=float), np.asarray(num_replicas, dtype=float)
        )
        max_bsz = float(max_batch_size or m0)
        lo = np.maximum(m0, replicas * m_min)
        hi = np.maximum(lo, max_bsz)
        frac = np.linspace(0.0, 1.0, grid_size)
        # grid[..., g] geometric between lo and hi (the last axis is the candidates).
        grid = np.exp(np.log(lo)[..., None] + frac * (np.log(hi) - np.log(lo))[..., None])
        one = replicas[..., None] == 1
        if accumulation:
            steps = np.maximum(np.ceil(grid / (replicas[..., None] * m_max)) - 1, 0)
            # The single-worker rule: one worker reaches a batch above M0 in two micro-steps
            # at least, whose gradients (same parameters) give the noise scale unbiased.
            steps = np.where(one & (grid > m0), np.maximum(steps, 1), steps)
        else:
            steps = np.zeros_like(grid)
        atomic = np.ceil(grid / (replicas[..., None] * (steps + 1)))
        atomic = np.maximum(atomic, m_min)
        feasible = (atomic <= m_max) & (replicas[..., None] * atomic * (steps + 1) >= m0)
        if not accumulation:  # ... and without accumulation it keeps M0 (or the memory's minimum)
            feasible &= ~one | (atomic <= max(m0, m_min))
        good = self.evaluate(nodes[..., None], replicas[..., None], atomic, steps)
        good = np.where(feasible, good, 0.0)
        best = np.argmax(good, axis=-1)[..., None]
        pick = lambda a: np.take_along_axis(a, best, axis=-1)[..., 0]  # noqa: E731
        good, atomic, steps = pick(good), pick(atomic).astype(int), pick(steps).astype(int)
        if good.ndim == 0:  # one layout asked for by scalars: a float and two ints
            return float(good), int(atomic), int(steps)
        return good, atomic, steps
