"""Ludwig's inference-time settings of a classifier's decoder (binary, category):
temperature scaling (``decoder.calibration: temperature_scaling``, Guo et al. 2017) and
Monte Carlo dropout (``decoder.mc_dropout_samples``, Gal & Ghahramani 2016).

Temperature scaling, as Ludwig's: after training, one temperature T per output is fitted
on the validation split (the training split where there is none or it has fewer than 3
rows, Ludwig's rule) to minimise the negative log-likelihood of logits / T, and kept at 1
where the fitted T would raise the expected calibration error (15 bins, Ludwig's ECELoss).
The decoder divides its logits by T in evaluation and prediction (``TemperatureScale``, a
buffer saved with the weights; 1 while training), so argmax predictions never change, a
binary's at its threshold may. One difference: the test loss is the calibrated logits'
(Ludwig's is computed on the raw ones).

Monte Carlo dropout: at prediction, the output's decoder runs ``mc_dropout_samples`` times
on the combiner's output with its dropout layers on (and nothing else in training mode),
seeded by ``trainer.seed``; the mean of the probabilities predicts and the variance is the
``<output>_uncertainty`` column (a binary's: of its true probability; a category's: one
per class, as Ludwig's ``[rows, classes]`` tensor). Evaluation uses one plain pass, as
Ludwig's."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

ECE_BINS = 15  # Ludwig's ECELoss
MIN_ROWS = 3  # Ludwig's MIN_DATASET_SPLIT_ROWS: a smaller validation split calibrates on the training one


class TemperatureScale(nn.Module):
    """The logits divided by the fitted temperature, in evaluation; as they are in training."""

    temperature: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("temperature", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.training else x / self.temperature


def _as_classes(logits: np.ndarray) -> np.ndarray:
    """A binary's logits (rows,) as two classes' (rows, 2): softmax([0, a])[1] == sigmoid(a)."""
    return np.stack([np.zeros_like(logits), logits], axis=1) if logits.ndim == 1 else logits


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """Mean negative log-likelihood of ``labels`` (class indices) under softmax(logits / T)."""
    z = _log_softmax(_as_classes(logits) / temperature)
    return float(-z[np.arange(len(labels)), labels].mean())


def ece(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0, bins: int = ECE_BINS) -> float:
    """Expected calibration error: per confidence bin (``bins`` equal ones over (0, 1]),
    |mean confidence - accuracy|, weighted by the bin's share of the rows."""
    probs = np.exp(_log_softmax(_as_classes(logits) / temperature))
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    right = predicted == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    total = 0.0
    for lo, hi in itertools.pairwise(edges):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            total += abs(confidence[inside].mean() - right[inside].mean()) * inside.mean()
    return float(total)


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature that minimises ``nll`` (searched over log T in [-5, 5]); 1 where it
    would raise ``ece`` (Ludwig's revert) or there are no rows."""
    from scipy.optimize import minimize_scalar

    if len(labels) == 0:
        return 1.0
    found = minimize_scalar(lambda log_t: nll(logits, labels, float(np.exp(log_t))), bounds=(-5.0, 5.0), method="bounded")
    temperature = float(np.exp(found.x))
    return temperature if ece(logits, labels, temperature) <= ece(logits, labels) else 1.0


def calibrated(model: Any, chunks: Iterator[dict[str, np.ndarray]], outputs: list[Any]) -> dict[str, float]:
    """Fit each calibrated output's temperature on ``chunks`` (a split's arrays) and set it
    in ``model`` (a DeclarativeModel, in evaluation); the temperatures by output name."""
    from raylight.declarative.models.ecd import module_key

    wanted = [out for out in outputs if out.decoder.calibration == "temperature_scaling"]
    logits: dict[str, list[np.ndarray]] = {out.name: [] for out in wanted}
    labels: dict[str, list[np.ndarray]] = {out.name: [] for out in wanted}
    model.eval()
    with torch.no_grad():
        for chunk in chunks:
            batch = {k: torch.from_numpy(np.array(v)) for k, v in chunk.items()}
            targets = {out.name: batch.pop(out.name) for out in outputs}
            raw = model(batch)
            for out in wanted:  # T is 1 until fitted: these are the raw logits
                logits[out.name].append(raw[out.name].double().numpy())
                labels[out.name].append(targets[out.name].long().numpy())
    fitted = {}
    for out in wanted:
        t = fit_temperature(np.concatenate(logits[out.name]), np.concatenate(labels[out.name]))
        scale = model.decoders[module_key(out.name)][-1]
        scale.temperature.fill_(t)
        fitted[out.name] = t
    return fitted


def mc_dropout(decoder: nn.Module, hidden: torch.Tensor, samples: int, *, seed: int, binary: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``decoder`` run ``samples`` times on ``hidden`` with its dropout on: the mean
    probabilities (a binary's of true, (rows,); else (rows, classes)) and their variance."""
    dropouts = [m for m in decoder.modules() if isinstance(m, nn.Dropout)]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for m in dropouts:
            m.train()
        try:
            raws = torch.stack([decoder(hidden) for _ in range(samples)])
        finally:
            for m in dropouts:
                m.eval()
    probs = torch.sigmoid(raws.squeeze(-1)) if binary else torch.softmax(raws, dim=-1)
    return probs.mean(0), probs.var(0)


def as_logits(mean: torch.Tensor, *, binary: bool) -> torch.Tensor:
    """Logits whose probabilities are ``mean`` (a binary's logit of it; a category's log), so
    the output's own prediction rule reads them as any logits."""
    eps = 1e-7
    p = mean.clamp(eps, 1 - eps) if binary else mean.clamp_min(eps)
    return torch.log(p) - torch.log1p(-p) if binary else torch.log(p)
