"""Fitting the throughput model to observed step times (bounded least squares on log time).

Observations come from normal training: for each step, the layout (nodes N, replicas K,
atomic batch m) and two times measured on the worker: ``accum_step_time``, a
micro-step that does not synchronise (T_grad; NaN where the step had no accumulation), and
``optim_step_time``, the micro-step that all-reduces gradients
((T_grad^gamma + T_sync^gamma)^(1/gamma)).

Parameters the data cannot identify are pinned, optimistically, so the policy is willing
to explore: with one batch size seen, alpha_c is 10% of the compute time; with no
multi-replica data, synchronisation is free; with one node, cross-node terms are the
in-node ones plus 10% (``CROSS_NODE_PRIOR``, AdaptDL's prior: a layout over several nodes
is never predicted as fast as one node, so a policy packs a job where it can); with
K <= 2 only, per-replica terms are 0; with no synchronisation seen, gamma = 1.

The search runs with BLAS limited to one thread: its vectors are a handful of numbers, and
OpenBLAS's idle threads spin for tens of milliseconds after each call. On the driver,
beside the workers, that spinning took 16-20% of a core from a 2-core machine's workers
while a run refitted every half second.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike
from threadpoolctl import ThreadpoolController

from raylight.adaptive.goodput import PerfParams, predict_grad_time, predict_sync_time

_FIELDS = PerfParams._fields  # alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma
_INDEX = {k: i for i, k in enumerate(_FIELDS)}
_TINY = 1e-8
# A cross-node parameter the data cannot identify is its in-node one times this (AdaptDL's
# fit_perf_params: alpha_n >= 1.1 alpha_r with no multi-node observation).
CROSS_NODE_PRIOR = 1.1
_blas: ThreadpoolController | None = None  # found on first use, once scipy's BLAS is loaded


def serial_blas() -> AbstractContextManager[object]:
    """A context in which the BLAS libraries loaded in this process use one thread."""
    global _blas
    if _blas is None:
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


def _optim_time(p: np.ndarray, nodes, replicas, atomic) -> np.ndarray:
    params = PerfParams(*p)
    grad = predict_grad_time(params, atomic)
    sync = predict_sync_time(params, nodes, replicas)
    g = params.gamma
    return (grad**g + sync**g) ** (1.0 / g)


class _Observations(NamedTuple):
    """The validated observation arrays, one row per observed step."""

    nodes: np.ndarray
    replicas: np.ndarray
    atomic: np.ndarray
    accum: np.ndarray  # T_grad where has_accum, else anything
    optim: np.ndarray
    has_accum: np.ndarray
    weights: np.ndarray  # summing to 1


def _observations(
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_step_time: ArrayLike,
    optim_step_time: ArrayLike,
    weights: ArrayLike | None,
) -> _Observations:
    nodes = np.asarray(num_nodes, dtype=float)
    replicas = np.asarray(num_replicas, dtype=float)
    atomic = np.asarray(atomic_bsz, dtype=float)
    accum = np.asarray(accum_step_time, dtype=float)
    optim = np.asarray(optim_step_time, dtype=float)
    if not (len(nodes) == len(replicas) == len(atomic) == len(accum) == len(optim)) or len(optim) == 0:
        raise ValueError("fit_perf_params needs equally long, non-empty observation arrays")
    if np.any(~np.isfinite(optim)) or np.any(optim <= 0):
        raise ValueError("optim_step_time must be positive and finite")
    has_accum = np.isfinite(accum) & (accum > 0)
    wt = np.ones_like(optim) if weights is None else np.asarray(weights, dtype=float)
    if wt.shape != optim.shape or np.any(~np.isfinite(wt)) or np.any(wt <= 0):
        raise ValueError("weights must be positive, finite and one per observation")
    return _Observations(nodes, replicas, atomic, accum, optim, has_accum, wt / wt.sum())


def _initial_guess(obs: _Observations) -> dict[str, float]:
    """Starting values of the log-space parameters, from the compute time per micro-step:
    accumulation steps where seen, else single-replica optimizer steps (no sync), else
    half the fastest step; synchronisation takes the rest of the mean step."""
    single = obs.replicas <= 1
    compute = np.where(obs.has_accum, obs.accum, np.where(single, obs.optim, np.nan))
    if not np.any(np.isfinite(compute)):
        compute = np.full_like(obs.optim, 0.5 * obs.optim.min())
    mean_compute = float(np.nanmean(compute))
    mean_m = float(np.mean(obs.atomic))
    sync_guess = max(float(np.mean(obs.optim)) - mean_compute, 0.1 * mean_compute)
    return {
        "alpha_c": 0.1 * mean_compute,
        "beta_c": 0.9 * mean_compute / mean_m,
        "alpha_n": sync_guess,
        "beta_n": 0.1 * sync_guess,
        "alpha_r": sync_guess,
        "beta_r": 0.1 * sync_guess,
    }


def _unidentified(obs: _Observations, init: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """The parameters the data cannot identify (see the module docstring): those pinned
    to a value, and those tied to another parameter (parameter -> the one whose value it
    takes)."""
    pinned: dict[str, float] = {}
    tied: dict[str, str] = {}
    if len(np.unique(obs.atomic)) == 1:
        pinned["alpha_c"] = init["alpha_c"]
    multi = obs.replicas > 1
    if not np.any(multi):
        pinned.update(alpha_n=0.0, beta_n=0.0, alpha_r=0.0, beta_r=0.0, gamma=1.0)
    else:
        if not np.any(obs.replicas > 2):
            pinned.update(beta_r=0.0, beta_n=0.0)
        if not np.any(multi & (obs.nodes > 1)):
            tied.update(alpha_n="alpha_r", beta_n="beta_r")
        elif not np.any(multi & (obs.nodes > 1) & (obs.replicas > 2)):
            tied["beta_n"] = "beta_r"
    return pinned, tied


class _Loss:
    """The least-squares loss on log step time and its analytic gradient (L-BFGS-B needs
    no finite differences, so a fit costs the driver a fraction of the CPU), over the free
    parameters x: log values, gamma as itself.

        loss = sum_i w_i (log T_optim(row i) - log optim_i)^2        optimizer steps
             + sum_i v_i (log T_grad(m_i) - log accum_i)^2           accumulation steps
             + 1e-2 ((p_r - p_n) / p_r)^2 where p_r > p_n, p in alpha, beta   cross-node >= in-node
             + 1e-4 (gamma - 1)^2                                     gamma near 1 (no overlap)
    """

    def __init__(self, obs: _Observations, pinned: dict[str, float], tied: dict[str, str]) -> None:
        self.obs, self.pinned, self.tied = obs, pinned, tied
        self.free = [k for k in _FIELDS if k not in pinned and k not in tied]
        self.log_optim = np.log(obs.optim)
        self.log_accum = np.log(np.where(obs.has_accum, obs.accum, 1.0))
        self.n_accum = int(np.count_nonzero(obs.has_accum))
        accum_wt = np.where(obs.has_accum, obs.weights, 0.0)
        if self.n_accum:
            accum_wt = accum_wt / accum_wt.sum()  # the accumulation rows' weights, summing to 1
        self.accum_wt = accum_wt
        # Which sync term each row uses (none with one replica): d T_sync / d parameter.
        extra = np.maximum(obs.replicas - 2, 0.0)
        cross = (obs.replicas > 1) & (obs.nodes > 1)
        local = (obs.replicas > 1) & (obs.nodes <= 1)
        self.d_sync = {"alpha_n": cross * 1.0, "beta_n": cross * extra, "alpha_r": local * 1.0, "beta_r": local * extra}

    def unpack(self, x: np.ndarray) -> np.ndarray:
        """All seven parameters, in PerfParams order, from the free ones."""
        vals = dict(self.pinned)
        for k, v in zip(self.free, x, strict=True):
            vals[k] = float(v) if k == "gamma" else float(np.exp(v))
        for k, src in self.tied.items():
            vals[k] = vals[src] * CROSS_NODE_PRIOR
        return np.array([vals[k] for k in _FIELDS], dtype=float)

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        p = self.unpack(x)
        d = np.zeros(len(_FIELDS))  # d loss / d p, added to by each term
        total = self._optim_steps(p, d)
        if self.n_accum:
            total += self._accum_steps(p, d)
        total = sum(self._priors(p, d), start=total)  # term by term, in order
        # Chain to x: log-space parameters (and the ones tied to them) scale by their value.
        for k, src in self.tied.items():
            d[_INDEX[src]] += d[_INDEX[k]] * CROSS_NODE_PRIOR
        dx = np.array([d[_INDEX[k]] * (1.0 if k == "gamma" else p[_INDEX[k]]) for k in self.free])
        return total, dx

    def _optim_steps(self, p: np.ndarray, d: np.ndarray) -> float:
        """Optimizer steps: T = (G^g + S^g)^(1/g) on log scale."""
        obs = self.obs
        a_c, b_c, g = p[_INDEX["alpha_c"]], p[_INDEX["beta_c"]], p[_INDEX["gamma"]]
        grad = a_c + b_c * obs.atomic
        sync = predict_sync_time(PerfParams(*p), obs.nodes, obs.replicas)
        has_sync = sync > 0
        safe_sync = np.where(has_sync, sync, 1.0)  # no 0 ** (g - 1) or log(0) where unsynced
        g_pow = grad**g
        s_pow = sync**g  # 0 without sync (g >= 1)
        total_pow = g_pow + s_pow
        step = total_pow ** (1.0 / g)
        err = np.log(np.maximum(step, _TINY)) - self.log_optim
        w = 2.0 * obs.weights * err * (step > _TINY)  # d loss / d log T, per row
        d_grad = w * grad ** (g - 1.0) / total_pow
        d_s = w * has_sync * safe_sync ** (g - 1.0) / total_pow
        d[_INDEX["alpha_c"]] += np.sum(d_grad)
        d[_INDEX["beta_c"]] += np.sum(d_grad * obs.atomic)
        for k, mask in self.d_sync.items():
            d[_INDEX[k]] += np.sum(d_s * mask)
        s_log = s_pow * np.log(safe_sync)  # S^g log S, 0 without sync
        d[_INDEX["gamma"]] += np.sum(w * (-np.log(total_pow) / g**2 + (g_pow * np.log(grad) + s_log) / (g * total_pow)))
        return float(np.sum(obs.weights * err**2))

    def _accum_steps(self, p: np.ndarray, d: np.ndarray) -> float:
        """Accumulation micro-steps: T_grad = alpha_c + beta_c * m."""
        atomic = self.obs.atomic
        grad = p[_INDEX["alpha_c"]] + p[_INDEX["beta_c"]] * atomic
        clamped = np.maximum(grad, _TINY)
        e = np.where(self.obs.has_accum, np.log(clamped) - self.log_accum, 0.0)
        we = 2.0 * self.accum_wt * e * (grad > _TINY) / clamped
        d[_INDEX["alpha_c"]] += np.sum(we)
        d[_INDEX["beta_c"]] += np.sum(we * atomic)
        return float(np.sum(self.accum_wt * e**2))

    @staticmethod
    def _priors(p: np.ndarray, d: np.ndarray) -> list[float]:
        """Priors, one loss term each: cross-node sync no cheaper than in-node; gamma near 1."""
        terms = []
        for n_key, r_key in (("alpha_n", "alpha_r"), ("beta_n", "beta_r")):
            vn, vr = p[_INDEX[n_key]], p[_INDEX[r_key]]
            if vr > vn and vr > _TINY:
                r = (vr - vn) / vr
                terms.append(1e-2 * r**2)
                d[_INDEX[n_key]] += 2e-2 * r * (-1.0 / vr)
                d[_INDEX[r_key]] += 2e-2 * r * (vn / vr**2)
        g = p[_INDEX["gamma"]]
        terms.append(1e-4 * (g - 1.0) ** 2)
        d[_INDEX["gamma"]] += 2e-4 * (g - 1.0)
        return terms


def _search(loss: _Loss, init: dict[str, float], start: PerfParams | None) -> np.ndarray:
    """The best free parameters x from L-BFGS-B within bounds (log values in [1e-8, 1e4],
    gamma in [1, 10]), from one start per initial gamma."""
    # Imported here: 0.6 s on this project's 2-core machine, on the driver's path to every
    # run's workers (the controller imports this module), while only adaptive runs fit.
    from scipy.optimize import minimize

    free = loss.free
    log_bounds, gamma_bounds = (np.log(_TINY), np.log(1e4)), (1.0, 10.0)
    bounds = [gamma_bounds if k == "gamma" else log_bounds for k in free]
    if start is not None:
        init = {**init, **{k: v for k, v in start._asdict().items() if k != "gamma"}}
    # The overlap term is not convex in gamma: start from several values when it is free,
    # unless a previous fit says where to start.
    gammas = (start.gamma,) if start is not None else (1.0, 2.0, 5.0) if "gamma" in free else (1.0,)
    best = None
    with serial_blas():
        for gamma0 in gammas:
            x0 = np.array([
                np.clip(gamma0, *gamma_bounds) if k == "gamma" else np.clip(np.log(max(init[k], _TINY)), *log_bounds)
                for k in free
            ])
            res = minimize(loss, x0, jac=True, method="L-BFGS-B", bounds=bounds)
            if best is None or res.fun < best.fun:
                best = res
    assert best is not None
    return np.asarray(best.x)


def fit_perf_params(
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_step_time: ArrayLike,
    optim_step_time: ArrayLike,
    *,
    start: PerfParams | None = None,
    weights: ArrayLike | None = None,
) -> PerfParams:
    """Fit PerfParams to observations (one row per observed step, arrays of equal length).

    ``start``: a previous fit to the same layouts (more steps of each since), to start a
    single local search from instead of the several starts a fresh fit makes: about a
    tenth of the cost, for a driver that refits as observations accumulate.
    ``weights``: how much each row counts in the least squares (the engine passes each
    layout's decayed step count); rows count alike without it.
    """
    obs = _observations(num_nodes, num_replicas, atomic_bsz, accum_step_time, optim_step_time, weights)
    init = _initial_guess(obs)
    loss = _Loss(obs, *_unidentified(obs, init))
    x = _search(loss, init, start) if loss.free else np.array([])
    return PerfParams(*(float(v) for v in loss.unpack(x)))


def fit_loss(
    params: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_step_time: ArrayLike,
    optim_step_time: ArrayLike,
) -> float:
    """The objective ``fit_perf_params`` minimises (``_Loss``, rows weighted alike), at
    ``params``: to compare a fit with other parameters on the same observations."""
    obs = _observations(num_nodes, num_replicas, atomic_bsz, accum_step_time, optim_step_time, None)
    fixed = dict(zip(_FIELDS, (float(v) for v in params), strict=True))
    return _Loss(obs, fixed, {})(np.array([]))[0]


def fit_error(
    params: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_step_time: ArrayLike,
    optim_step_time: ArrayLike,
) -> float:
    """The largest relative error of ``params`` on the observed mean step times (the
    arrays ``fit_perf_params`` takes; NaN accumulation times are not compared)."""
    p = np.asarray(params, dtype=float)
    atomic = np.asarray(atomic_bsz, dtype=float)
    optim = np.asarray(optim_step_time, dtype=float)
    accum = np.asarray(accum_step_time, dtype=float)
    errors = np.abs(_optim_time(p, np.asarray(num_nodes, dtype=float), np.asarray(num_replicas, dtype=float), atomic) / optim - 1.0)
    seen = np.isfinite(accum) & (accum > 0)
    if np.any(seen):
        grad = predict_grad_time(params, atomic[seen])
        errors = np.concatenate([errors, np.abs(grad / accum[seen] - 1.0)])
    return float(np.max(errors)) if errors.size else 0.0
