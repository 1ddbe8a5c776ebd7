"""Lightning callbacks that report to Ray Tune (``ray.tune.report``).

Plain ``lightning.pytorch.Callback`` subclasses. In a ``pl.Trainer`` that runs in the Tune
trial's process they call ``ray.tune.report`` on global rank 0. Under ``RayStrategy`` the
callbacks run on raylight's workers, where there is no Tune session: every rank reports
through raylight (``ctx.report``; saving a checkpoint is a collective) and the trial's
process sends rank 0's report on to Tune. Metrics are read from
``trainer.callback_metrics``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("raylight.tune's Lightning callbacks need Lightning: pip install 'raylight[lightning]'") from exc

_HOOKS = {
    "train_batch_end": "on_train_batch_end",
    "train_epoch_end": "on_train_epoch_end",
    "validation_end": "on_validation_end",
    "validation_epoch_end": "on_validation_epoch_end",
    "test_end": "on_test_end",
    "fit_end": "on_fit_end",
}


def _metrics(trainer: Any, wanted: str | list[str] | dict[str, str] | None) -> dict[str, Any]:
    logged = trainer.callback_metrics
    if wanted is None:
        names = {k: k for k in logged}
    elif isinstance(wanted, str):
        names = {wanted: wanted}
    elif isinstance(wanted, list):
        names = {k: k for k in wanted}
    else:
        names = dict(wanted)
    out: dict[str, Any] = {}
    for report_as, key in names.items():
        if key not in logged:
            raise KeyError(
                f"TuneReportCallback: metric {key!r} was not logged (self.log) by the time of this hook; "
                f"logged: {sorted(logged)}"
            )
        value = logged[key]
        out[report_as] = value.item() if hasattr(value, "item") else value
    return out


def _check_on(on: str | list[str]) -> list[str]:
    hooks = [on] if isinstance(on, str) else list(on)
    bad = [h for h in hooks if h not in _HOOKS]
    if bad:
        raise ValueError(f"on={bad} is not a hook this callback reports at; choose from {sorted(_HOOKS)}")
    return hooks


class TuneReportCallback(pl.Callback):
    """Report ``metrics`` to Tune at the hooks named by ``on``.

    Args:
        metrics: a metric name, a list of names, or ``{name reported to Tune: name
            logged in Lightning}``; None reports every logged metric.
        on: one hook name or a list: validation_end (default), train_epoch_end,
            validation_epoch_end, train_batch_end, test_end, fit_end.
    """

    def __init__(self, metrics: str | list[str] | dict[str, str] | None = None, on: str | list[str] = "validation_end") -> None:
        self._metrics = metrics
        self._on = _check_on(on)
        for hook in self._on:
            setattr(self, _HOOKS[hook], self._hook)

    def _hook(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        if trainer.sanity_checking:
            return
        ctx = getattr(trainer.strategy, "_raylight_ctx", None)
        if ctx is not None:  # a raylight worker (RayStrategy): every rank takes part
            self._report_on_worker(ctx, trainer, _metrics(trainer, self._metrics))
        elif trainer.is_global_zero:
            self._report(trainer, _metrics(trainer, self._metrics))

    def _report(self, trainer: Any, metrics: dict[str, Any]) -> None:
        from ray import tune

        tune.report(metrics)

    def _report_on_worker(self, ctx: Any, trainer: Any, metrics: dict[str, Any]) -> None:
        ctx.report(metrics)


class TuneReportCheckpointCallback(TuneReportCallback):
    """Like ``TuneReportCallback``, and saves a Lightning checkpoint (``filename`` in a
    fresh directory) reported with the metrics as a ``ray.tune.Checkpoint``."""

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str = "checkpoint.ckpt",
        on: str | list[str] = "validation_end",
    ) -> None:
        super().__init__(metrics, on)
        self._filename = filename

    def _report(self, trainer: Any, metrics: dict[str, Any]) -> None:
        from ray import tune

        directory = tempfile.mkdtemp(prefix="raylight-lightning-")
        try:
            trainer.save_checkpoint(os.path.join(directory, self._filename))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
        finally:  # Tune copied it into the trial's storage
            shutil.rmtree(directory, ignore_errors=True)

    def _report_on_worker(self, ctx: Any, trainer: Any, metrics: dict[str, Any]) -> None:
        import torch

        from raylight.storage.checkpoint import LIGHTNING_CKPT_KEY, LIGHTNING_CKPT_METRIC

        directory = tempfile.mkdtemp(prefix="raylight-lightning-")
        try:
            path = os.path.join(directory, self._filename)
            trainer.save_checkpoint(path)  # every rank: a collective; rank 0 writes
            state = None
            if trainer.is_global_zero:
                with open(path, "rb") as f:
                    data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
                state = {LIGHTNING_CKPT_KEY: data, "filename": self._filename}
            ctx.report({**metrics, LIGHTNING_CKPT_METRIC: 1}, checkpoint=state)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
