"""Invariants of the goodput model over random parameters, and fitting it back."""

import numpy as np
import pytest

from raylight.adaptive.goodput import GoodputFunction, GradParams, PerfParams, predict_step_time
from raylight.adaptive.perf_model import fit_perf_params


def random_models(seed: int, n: int = 50):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        perf = PerfParams(
            alpha_c=rng.uniform(1e-3, 0.1), beta_c=rng.uniform(1e-5, 1e-2),
            alpha_n=rng.uniform(1e-3, 0.5), beta_n=rng.uniform(0, 0.1),
            alpha_r=rng.uniform(1e-4, 0.1), beta_r=rng.uniform(0, 0.05), gamma=rng.uniform(1, 10),
        )
        grad = GradParams(sqr=rng.uniform(1e-3, 10), var=rng.uniform(1e-3, 100))
        yield GoodputFunction(perf, grad, int(rng.integers(8, 512)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_efficiency_invariants(seed):
    for fn in random_models(seed):
        m0 = fn.init_batch_size
        batches = m0 * np.geomspace(1, 1000, 50)
        eff = fn.efficiency(batches)
        assert np.all(eff > 0) and np.all(eff <= 1 + 1e-12)
        assert fn.efficiency(m0) == pytest.approx(1.0)
        assert np.all(np.diff(eff) <= 1e-12), "efficiency must not increase with batch size"
        gain = fn.gain(batches)
        assert np.all(gain >= 1 - 1e-12) and np.all(np.diff(gain) >= -1e-12)


@pytest.mark.parametrize("seed", [3, 4])
def test_goodput_is_throughput_times_efficiency_and_throughput_monotone(seed):
    nodes, replicas = np.meshgrid([1, 2, 4], [1, 2, 3, 8])
    for fn in random_models(seed):
        m = np.array([1, 4, 16, 64, 256])
        for s in (0, 1, 3):
            good = fn.evaluate(nodes[..., None], replicas[..., None], m, s)
            thr = fn.throughput(nodes[..., None], replicas[..., None], m, s)
            eff = fn.efficiency(replicas[..., None] * m * (s + 1))
            np.testing.assert_allclose(good, thr * eff)
            assert np.all(np.diff(thr, axis=-1) > 0), "throughput grows with the atomic batch"
        step = predict_step_time(fn.perf_params, 1, np.arange(1, 10), 32, 0)
        assert np.all(np.diff(step) >= 0), "step time never falls as replicas are added"


def test_optimize_returns_feasible_argmax():
    perf = PerfParams(0.02, 1e-3, 0.2, 0.02, 0.05, 0.01, 1.5)
    for var in (0.01, 1.0, 100.0):
        fn = GoodputFunction(perf, GradParams(1.0, var), 64)
        for k in (1, 2, 4):
            good, m, s = fn.optimize(1, k, max_batch_size=4096, atomic_bsz_range=(16, 256), accumulation=True)
            assert 16 <= m <= 256 and s >= 0 and k * m * (s + 1) >= 64
            assert good == pytest.approx(fn.evaluate(1, k, m, s))
            # No feasible layout on a fine brute-force grid beats it by more than grid error
            # (one worker above M0: two micro-steps at least, the single-worker rule).
            best = max(
                fn.evaluate(1, k, mm, ss)
                for mm in range(16, 257, 4) for ss in range(0, 8) if 64 <= k * mm * (ss + 1) <= 4096
                and (k > 1 or ss > 0 or mm == 64)
            )
            assert good >= 0.97 * best


def test_noisier_gradients_choose_larger_batches():
    perf = PerfParams(0.02, 1e-3, 0.2, 0.02, 0.05, 0.01, 1.0)
    quiet = GoodputFunction(perf, GradParams(sqr=1.0, var=1e-3), 64).optimize(1, 2, 4096, (16, 512), True)
    noisy = GoodputFunction(perf, GradParams(sqr=1.0, var=100.0), 64).optimize(1, 2, 4096, (16, 512), True)
    assert 2 * noisy[1] * (noisy[2] + 1) > 2 * quiet[1] * (quiet[2] + 1)


def test_optimize_vectorised_over_layouts():
    fn = GoodputFunction(PerfParams(0.02, 1e-3, 0.2, 0.02, 0.05, 0.01, 1.0), GradParams(1.0, 5.0), 32)
    good, m, s = fn.optimize(np.array([1, 1, 2]), np.array([1, 2, 4]), 1024, (8, 128), True)
    assert good.shape == m.shape == s.shape == (3,)
    for i, (n, k) in enumerate([(1, 1), (1, 2), (2, 4)]):
        g1, m1, s1 = fn.optimize(n, k, 1024, (8, 128), True)
        assert (good[i], m[i], s[i]) == (pytest.approx(g1), m1, s1)


def test_layout_that_cannot_reach_m0_has_zero_goodput():
    fn = GoodputFunction(PerfParams(0.02, 1e-3, 0.2, 0.02, 0.05, 0.01, 1.0), GradParams(1.0, 1.0), 512)
    good, _, _ = fn.optimize(1, 1, 512, (8, 64), accumulation=False)
    assert good == 0.0
    good, m, s = fn.optimize(1, 1, 512, (8, 64), accumulation=True)
    assert good > 0 and m * (s + 1) >= 512


def _observations(true: PerfParams, rng, noise=0.05):
    rows = []
    for nodes, replicas in [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 6)]:
        for m in (16, 32, 64, 128):
            for _ in range(3):
                grad = true.alpha_c + true.beta_c * m
                optim = float(predict_step_time(true, nodes, replicas, m, 0))
                rows.append((nodes, replicas, m, grad * rng.lognormal(0, noise), optim * rng.lognormal(0, noise)))
    return np.array(rows).T


@pytest.mark.parametrize("seed", range(8))
def test_fit_recovers_step_times_within_10_percent(seed):
    rng = np.random.default_rng(seed)
    alpha_r, beta_r = rng.uniform(0.005, 0.05), rng.uniform(0.001, 0.01)
    true = PerfParams(  # within the model's priors: cross-node sync no cheaper than in-node
        alpha_c=rng.uniform(0.005, 0.05), beta_c=rng.uniform(1e-4, 1e-3), alpha_n=alpha_r + rng.uniform(0.0, 0.2),
        beta_n=beta_r + rng.uniform(0.0, 0.04), alpha_r=alpha_r, beta_r=beta_r, gamma=rng.uniform(1, 3),
    )
    nodes, replicas, m, accum, optim = _observations(true, rng)
    fitted = fit_perf_params(nodes, replicas, m, accum, optim)
    # Held out: the noise-free truth, at batch sizes and accumulation steps never observed,
    # over the layouts (nodes, replicas) that were.
    layouts = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4), (2, 6)]
    n, k = (np.array(v)[:, None, None] for v in zip(*layouts, strict=True))
    m, s = np.array([24, 48, 96])[None, :, None], np.array([0, 2])[None, None, :]
    want = predict_step_time(true, n, k, m, s)
    got = predict_step_time(fitted, n, k, m, s)
    assert np.max(np.abs(got / want - 1)) < 0.10
    # A refit started from this fit (the driver's refits as steps accumulate) is as good.
    nodes2, replicas2, m2, accum2, optim2 = _observations(true, rng)
    refined = fit_perf_params(nodes2, replicas2, m2, accum2, optim2, start=fitted)
    assert np.max(np.abs(predict_step_time(refined, n, k, m, s) / want - 1)) < 0.10


def test_fit_pins_what_the_data_cannot_identify():
    # One replica, one batch size: no sync data, alpha_c unidentifiable.
    fitted = fit_perf_params([1] * 5, [1] * 5, [32] * 5, [np.nan] * 5, [0.1] * 5)
    assert fitted.alpha_r == fitted.beta_r == fitted.alpha_n == fitted.beta_n == 0.0
    assert fitted.gamma == 1.0
    assert fitted.alpha_c == pytest.approx(0.01)
    assert float(predict_step_time(fitted, 1, 1, 32, 0)) == pytest.approx(0.1, rel=0.02)
    # One node: cross-node terms tied to in-node ones, 10% above (AdaptDL's prior: a spread
    # is never predicted as fast as one node, so a job is packed where it can be).
    fitted = fit_perf_params([1, 1, 1, 1], [1, 2, 1, 2], [32, 32, 64, 64], [np.nan] * 4, [0.1, 0.15, 0.18, 0.23])
    assert fitted.alpha_n == pytest.approx(1.1 * fitted.alpha_r, rel=1e-12)
    assert fitted.beta_n == fitted.beta_r == 0.0
    assert float(predict_step_time(fitted, 2, 2, 32, 0)) > float(predict_step_time(fitted, 1, 2, 32, 0))


def test_fit_rejects_bad_observations():
    with pytest.raises(ValueError, match="equally long"):
        fit_perf_params([1], [1, 2], [32], [0.1], [0.1])
    with pytest.raises(ValueError, match="positive"):
        fit_perf_params([1], [1], [32], [0.1], [0.0])


@pytest.mark.parametrize(
    "obs",
    [
        # several nodes, more than 2 replicas, accumulation seen: every parameter free
        ([1, 1, 2, 2, 2, 1, 1], [1, 2, 2, 4, 3, 3, 4], [16, 32, 32, 16, 64, 8, 8],
         [0.01, np.nan, 0.02, np.nan, 0.03, 0.005, np.nan], [0.012, 0.03, 0.05, 0.06, 0.07, 0.02, 0.025]),
        # one node, up to 2 replicas: cross-node terms tied to in-node ones (+10%), beta_* pinned
        ([1, 1, 1, 1], [1, 2, 1, 2], [32, 32, 64, 64], [np.nan] * 4, [0.1, 0.15, 0.18, 0.23]),
        # one replica: no sync terms
        ([1] * 3, [1] * 3, [8, 16, 32], [0.01, 0.02, np.nan], [0.011, 0.021, 0.04]),
    ],
)
def test_fit_objective_gradient_matches_finite_differences(obs, monkeypatch):
    """The fit hands L-BFGS-B an analytic gradient; it must be the objective's."""
    import scipy.optimize

    seen = []
    minimize = scipy.optimize.minimize

    def spy(fun, x0, **kwargs):
        seen.append((fun, x0, kwargs["bounds"]))
        return minimize(fun, x0, **kwargs)

    monkeypatch.setattr(scipy.optimize, "minimize", spy)  # the fit imports it when it runs
    fit_perf_params(*obs)
    fit_perf_params(*obs, weights=np.arange(1.0, len(obs[0]) + 1))  # weighted rows too
    for fun, x0, bounds in (seen[0], seen[-1]):
        _check_gradient(fun, x0, bounds)


def test_fit_searches_with_one_blas_thread(monkeypatch):
    """OpenBLAS's idle threads spin after each call: a driver refitting beside its
    workers must not start them. The search runs with every BLAS at one thread, and the
    caller's setting is back afterwards."""
    import scipy.optimize
    from threadpoolctl import threadpool_info, threadpool_limits

    minimize = scipy.optimize.minimize

    def blas_threads():
        return {lib["filepath"]: lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    during = []

    def spy(fun, x0, **kwargs):
        during.append(blas_threads())
        return minimize(fun, x0, **kwargs)

    monkeypatch.setattr(scipy.optimize, "minimize", spy)  # the fit imports it when it runs
    obs = ([1, 1, 1, 1], [1, 2, 1, 2], [32, 32, 64, 64], [np.nan] * 4, [0.1, 0.15, 0.18, 0.23])
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()
        assert before and set(before.values()) == {2}  # a setting the fit must change
        fit_perf_params(*obs)
        assert blas_threads() == before
    assert during and all(set(seen.values()) == {1} for seen in during)


def _check_gradient(fun, x0, bounds):
    import scipy.optimize

    lo, hi = np.array(bounds).T
    rng = np.random.default_rng(0)
    for _ in range(10):
        x = np.clip(x0 + rng.normal(0, 0.5, len(x0)), lo, hi)
        _, grad = fun(x)
        numeric = scipy.optimize.approx_fprime(x, lambda z: fun(z)[0], 1e-7)
        assert np.allclose(grad, numeric, rtol=1e-4, atol=1e-6 * np.max(np.abs(numeric)))


def test_fit_weights_favour_the_well_measured_layouts():
    """Means the model cannot match all at once (per-sample cost that falls with the
    batch): the weighted fit is closest where the weight is."""
    nodes, replicas = [1, 1, 1], [1, 1, 1]
    atomic = [16, 64, 256]
    optim = [0.016, 0.040, 0.100]  # concave in the batch: no line through all three
    accum = [np.nan] * 3

    def miss(**kw):
        fitted = fit_perf_params(nodes, replicas, atomic, accum, optim, **kw)
        return np.abs(predict_step_time(fitted, 1, 1, np.array(atomic), 0) / np.array(optim) - 1)

    plain = miss()
    heavy = miss(weights=[1.0, 1.0, 1000.0])
    assert heavy[2] < 0.005 < plain[2]
    assert heavy[2] < plain[2] / 4
    with pytest.raises(ValueError, match="weights"):
        fit_perf_params(nodes, replicas, atomic, accum, optim, weights=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="weights"):
        fit_perf_params(nodes, replicas, atomic, accum, optim, weights=[1.0, 1.0])


def test_scalars_in_give_python_scalars_out_and_arrays_give_arrays():
    """AdaptDL's contract (its own tests check isinstance(goodput, float)): a layout given
    as scalars gets a float and two ints, not 0-d arrays; arrays keep their shape."""
    from raylight.adaptive.goodput import gain, predict_grad_time, predict_sync_time

    perf = PerfParams(0.02, 1e-3, 0.2, 0.02, 0.05, 0.01, 1.5)
    fn = GoodputFunction(perf, GradParams(1.0, 5.0), 32)
    good, m, s = fn.optimize(1, 2, max_batch_size=1024, atomic_bsz_range=(8, 128), accumulation=True)
    assert (type(good), type(m), type(s)) == (float, int, int)
    for value in (fn(1, 2, 16, 1), fn.evaluate(1, 2, 16, 1), fn.throughput(1, 2, 16, 1), fn.efficiency(64),
                  fn.gain(64), gain(2.0, fn.grad_params), predict_step_time(perf, 1, 2, 16, 1),
                  predict_grad_time(perf, 16), predict_sync_time(perf, 1, 2)):
        assert type(value) is float, value
    good, m, s = fn.optimize(np.ones(3), np.array([1, 2, 4]), 1024, (8, 128), True)
    assert all(isinstance(a, np.ndarray) and a.shape == (3,) for a in (good, m, s))
    assert m.dtype.kind == s.dtype.kind == "i"
    assert fn.evaluate(1, np.array([1, 2]), 16, 0).shape == (2,)
    assert fn.efficiency(np.array([[32, 64]])).shape == (1, 2)
    # AdaptDL's bounds may leave either end open (None)
    assert fn.optimize(1, 2, 1024, (None, 128), True) == fn.optimize(1, 2, 1024, (1, 128), True)
    assert fn.optimize(1, 2, 1024, (8, None)) == fn.optimize(1, 2, 1024, (8, 1024))


def test_the_single_worker_rule():
    """One worker: above M0 only with two micro-steps at least (an unbiased noise pair),
    and at M0 without accumulation; two workers may take a larger batch in one micro-step."""
    # Cheap fixed cost, noisy gradients: every layout wants a batch well above M0 = 32.
    fn = GoodputFunction(PerfParams(0.05, 1e-4, 0.2, 0.02, 0.05, 0.01, 1.0), GradParams(1.0, 500.0), 32)
    _, m, s = fn.optimize(1, 1, max_batch_size=1024, atomic_bsz_range=(8, 1024), accumulation=True)
    assert m * (s + 1) > 32 and s >= 1, (m, s)
    assert fn.optimize(1, 1, max_batch_size=1024, atomic_bsz_range=(8, 1024)) == (
        pytest.approx(fn.evaluate(1, 1, 32, 0)), 32, 0)
    _, m2, s2 = fn.optimize(1, 2, max_batch_size=1024, atomic_bsz_range=(8, 1024))
    assert 2 * m2 > 32 and s2 == 0, "the rule is one worker's only"
    many = fn.optimize(np.ones(3), np.array([1, 2, 3]), 1024, (8, 1024), False)
    assert many[1][0] == 32 and np.all(many[1][1:] * np.array([2, 3]) > 32)
