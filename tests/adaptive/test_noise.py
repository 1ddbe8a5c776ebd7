"""The gradient-noise-scale estimator on a problem whose noise scale is known exactly."""

import math

import numpy as np
import pytest

from raylight.adaptive.noise import NoiseScaleEstimator


def linear_regression_truth(delta: np.ndarray, sigma: float) -> float:
    """B_simple = tr(Sigma) / |G|^2 for loss 0.5 (x.w - y)^2, x ~ N(0, I), noise sigma,
    at w = w* + delta: G = delta, tr(Sigma) = |delta|^2 (d + 1) + sigma^2 d."""
    d = len(delta)
    sqr = float(delta @ delta)
    return (sqr * (d + 1) + sigma**2 * d) / sqr


def per_sample_grads(rng, delta, sigma, n):
    x = rng.standard_normal((n, len(delta)))
    eps = sigma * rng.standard_normal(n)
    return (x @ delta - eps)[:, None] * x


@pytest.mark.parametrize("replicas,atomic,accum", [(2, 16, 0), (4, 8, 0), (1, 16, 3), (2, 8, 2)])
def test_recovers_known_noise_scale_within_25_percent(replicas, atomic, accum):
    rng = np.random.default_rng(replicas * 100 + atomic + accum)
    d, sigma = 10, 2.0
    delta = 0.3 * rng.standard_normal(d)
    truth = linear_regression_truth(delta, sigma)
    est = NoiseScaleEstimator(smoothing=0.99)
    micro = replicas * (accum + 1)  # micro-batch gradients that are averaged into one step
    for _ in range(3000):
        local = [per_sample_grads(rng, delta, sigma, atomic).mean(0) for _ in range(micro)]
        big = np.mean(local, axis=0)
        est.update(
            small_sqr=float(np.mean([g @ g for g in local])),
            small_batch=atomic,
            big_sqr=float(big @ big),
            big_batch=atomic * micro,
        )
    assert est.noise_scale == pytest.approx(truth, rel=0.25)
    assert est.sqr == pytest.approx(float(delta @ delta), rel=0.25)


def test_bias_correction_makes_first_update_unbiased():
    est = NoiseScaleEstimator(smoothing=0.99)
    est.update(small_sqr=3.0, small_batch=1, big_sqr=2.0, big_batch=2)
    # |G|^2 = (2*2 - 1*3) / 1 = 1; tr(Sigma) = (3 - 2) / (1 - 0.5) = 2
    assert est.sqr == pytest.approx(1.0) and est.var == pytest.approx(2.0)
    assert est.noise_scale == pytest.approx(2.0)
    assert est.grad_params(init_batch_size=4).var == pytest.approx(0.5)


def test_non_finite_and_single_batch_steps_are_skipped():
    est = NoiseScaleEstimator()
    assert not est.update(small_sqr=math.inf, small_batch=8, big_sqr=1.0, big_batch=16)
    assert not est.update(small_sqr=1.0, small_batch=8, big_sqr=math.nan, big_batch=16)
    assert not est.update(small_sqr=1.0, small_batch=16, big_sqr=1.0, big_batch=16)
    assert est.num_skipped == 3 and not est.ready and est.noise_scale == math.inf


def test_state_round_trip():
    est = NoiseScaleEstimator()
    est.update(small_sqr=3.0, small_batch=1, big_sqr=2.0, big_batch=2)
    again = NoiseScaleEstimator()
    again.load_state_dict(est.state_dict())
    assert again.noise_scale == est.noise_scale and again.num_updates == 1
