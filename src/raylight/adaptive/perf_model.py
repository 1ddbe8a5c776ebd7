"""Fitting the throughput model to observed step times (bounded least squares on log time).

Observations come from normal training: for each step, the layout (nodes N, replicas K,
atomic batch m) and two times measured on the worker: ``accum_step_time``, a
micro-step that does not synchronise (T_grad; NaN where the step had no accumulation), and
``optim_step_time``, the micro-step that all-reduces gradients
((T_grad^gamma + T_sync^gamma)^(1/gamma)).

Parameters the data cannot identify are pinned, optimistically, so the policy is willing
to explore: with one batch size seen, alpha_c is 10% of the compute time; with no
multi-replica data, synchronisation is free; with one node, cross-node terms equal the
in-node ones; with K <= 2 only, per-replica terms are 0; with no synchronisation seen,
gamma = 1.

The search runs with BLAS limited to one thread: its vectors are a handful of numbers, and
OpenBLAS's idle threads spin for tens of milliseconds after each call. On the driver,
beside the workers, that spinning took 16-20% of a core from a 2-core machine's workers
while a run refitted every half second.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import numpy as np
from numpy.typing import ArrayLike
from threadpoolctl import ThreadpoolController

from raylight.adaptive.goodput import PerfParams, predict_grad_time, predict_sync_time

_FIELDS = PerfParams._fields  # alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma
_TINY = 1e-8
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
    wt = wt / wt.sum()

    # Compute time per micro-step, for initial guesses: accumulation steps where seen,
    # else single-replica optimizer steps (no sync), else the fastest step.
    single = replicas <= 1
    compute = np.where(has_accum, accum, np.where(single, optim, np.nan))
    if not np.any(np.isfinite(compute)):
        compute = np.full_like(optim, 0.5 * optim.min())
    mean_compute = float(np.nanmean(compute))
    mean_m = float(np.mean(atomic))
    sync_guess = max(float(np.mean(optim)) - mean_compute, 0.1 * mean_compute)

    init = {
        "alpha_c": 0.1 * mean_compute,
        "beta_c": 0.9 * mean_compute / mean_m,
        "alpha_n": sync_guess,
        "beta_n": 0.1 * sync_guess,
        "alpha_r": sync_guess,
        "beta_r": 0.1 * sync_guess,
    }
    pinned: dict[str, float] = {}
    tied: dict[str, str] = {}  # parameter -> the parameter whose value it takes
    if len(np.unique(atomic)) == 1:
        pinned["alpha_c"] = 0.1 * mean_compute
    multi = replicas > 1
    if not np.any(multi):
        pinned.update(alpha_n=0.0, beta_n=0.0, alpha_r=0.0, beta_r=0.0, gamma=1.0)
    else:
        if not np.any(replicas > 2):
            pinned.update(beta_r=0.0, beta_n=0.0)
        if not np.any(multi & (nodes > 1)):
            tied.update(alpha_n="alpha_r", beta_n="beta_r")
        elif not np.any(multi & (nodes > 1) & (replicas > 2)):
            tied["beta_n"] = "beta_r"
    free = [k for k in _FIELDS if k not in pinned and k not in tied]

    def unpack(x: np.ndarray) -> np.ndarray:
        vals = dict(pinned)
        for k, v in zip(free, x, strict=True):
            vals[k] = float(v) if k == "gamma" else float(np.exp(v))
        for k, src in tied.items():
            vals[k] = vals[src]
        return np.array([vals[k] for k in _FIELDS], dtype=float)

    log_optim = np.log(optim)
    log_accum = np.log(np.where(has_accum, accum, 1.0))
    n_accum = int(np.count_nonzero(has_accum))
    accum_wt = np.where(has_accum, wt, 0.0)
    if n_accum:
        accum_wt = accum_wt / accum_wt.sum()  # the accumulation rows' weights, summing to 1
    # Which sync term each row uses (none with one replica): d T_sync / d parameter.
    extra = np.maximum(replicas - 2, 0.0)
    cross = (replicas > 1) & (nodes > 1)
    local = (replicas > 1) & (nodes <= 1)
    d_sync = {"alpha_n": cross * 1.0, "beta_n": cross * extra, "alpha_r": local * 1.0, "beta_r": local * extra}
    index = {k: i for i, k in enumerate(_FIELDS)}

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        """The loss and its gradient in x (analytic: L-BFGS-B needs no finite differences,
        so a fit costs the driver a fraction of the CPU)."""
        p = unpack(x)
        a_c, b_c, g = p[index["alpha_c"]], p[index["beta_c"]], p[index["gamma"]]
        d = np.zeros(len(_FIELDS))  # d loss / d p
        # Optimizer steps: T = (G^g + S^g)^(1/g) on log scale.
        grad = a_c + b_c * atomic
        sync = predict_sync_time(PerfParams(*p), nodes, replicas)
        has_sync = sync > 0
        safe_sync = np.where(has_sync, sync, 1.0)  # no 0 ** (g - 1) or log(0) where unsynced
        g_pow = grad**g
        s_pow = sync**g  # 0 without sync (g >= 1)
        total_pow = g_pow + s_pow
        step = total_pow ** (1.0 / g)
        err = np.log(np.maximum(step, _TINY)) - log_optim
        total = float(np.sum(wt * err**2))
        w = 2.0 * wt * err * (step > _TINY)  # d loss / d log T, per row
        d_grad = w * grad ** (g - 1.0) / total_pow
        d_s = w * has_sync * safe_sync ** (g - 1.0) / total_pow
        d[index["alpha_c"]] += np.sum(d_grad)
        d[index["beta_c"]] += np.sum(d_grad * atomic)
        for k, mask in d_sync.items():
            d[index[k]] += np.sum(d_s * mask)
        s_log = s_pow * np.log(safe_sync)  # S^g log S, 0 without sync
        d[index["gamma"]] += np.sum(w * (-np.log(total_pow) / g**2 + (g_pow * np.log(grad) + s_log) / (g * total_pow)))
        # Accumulation micro-steps: T_grad = alpha_c + beta_c * m.
        if n_accum:
            clamped = np.maximum(grad, _TINY)
            e = np.where(has_accum, np.log(clamped) - log_accum, 0.0)
            total += float(np.sum(accum_wt * e**2))
            we = 2.0 * accum_wt * e * (grad > _TINY) / clamped
            d[index["alpha_c"]] += np.sum(we)
            d[index["beta_c"]] += np.sum(we * atomic)
        # Priors: cross-node sync no cheaper than in-node; gamma near 1 (no overlap).
        for n_key, r_key in (("alpha_n", "alpha_r"), ("beta_n", "beta_r")):
            vn, vr = p[index[n_key]], p[index[r_key]]
            if vr > vn and vr > _TINY:
                r = (vr - vn) / vr
                total += 1e-2 * r**2
                d[index[n_key]] += 2e-2 * r * (-1.0 / vr)
                d[index[r_key]] += 2e-2 * r * (vn / vr**2)
        total += 1e-4 * (g - 1.0) ** 2
        d[index["gamma"]] += 2e-4 * (g - 1.0)
        # Chain to x: log-space parameters (and the ones tied to them) scale by their value.
        for k, src in tied.items():
            d[index[src]] += d[index[k]]
        dx = np.array([d[index[k]] * (1.0 if k == "gamma" else p[index[k]]) for k in free])
        return total, dx

    if not free:
        return PerfParams(*(float(v) for v in unpack(np.array([]))))
    # Imported here: 0.6 s on this project's 2-core machine, on the driver's path to every
    # run's workers (the controller imports this module), while only adaptive runs fit.
    from scipy.optimize import minimize

    log_bounds, gamma_bounds = (np.log(_TINY), np.log(1e4)), (1.0, 10.0)
    bounds = [gamma_bounds if k == "gamma" else log_bounds for k in free]
    best = None
    if start is not None:
        init.update({k: v for k, v in start._asdict().items() if k != "gamma"})
    # The overlap term is not convex in gamma: start from several values when it is free,
    # unless a previous fit says where to start.
    gammas = (start.gamma,) if start is not None else (1.0, 2.0, 5.0) if "gamma" in free else (1.0,)
    with serial_blas():
        for gamma0 in gammas:
            x0 = np.array([
                np.clip(gamma0, *gamma_bounds) if k == "gamma" else np.clip(np.log(max(init[k], _TINY)), *log_bounds)
                for k in free
            ])
            res = minimize(objective, x0, jac=True, method="L-BFGS-B", bounds=bounds)
            if best is None or res.fun < best.fun:
                best = res
    assert best is not None
    return PerfParams(*(float(v) for v in unpack(best.x)))


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
