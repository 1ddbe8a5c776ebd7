"""What runs on each raylight worker: the Trainer entry point, then rank 0's results.

The Trainer arrives pickled (by Ray, with cloudpickle, so modules defined in a script or
a notebook travel by value). The strategy learns its rank from the TrainContext, a
heartbeat callback keeps raylight's hang detection fed, and after the entry point
returns every rank joins in building the state dict (a collective under FSDP); rank 0
reports it as raylight's checkpoint, which the driver loads with ``weights_only=True``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from raylight.lightning._quiet import quiet_worker
from raylight.storage.checkpoint import INTERNAL_METRIC, to_cpu

log = logging.getLogger("raylight")

CALL_KEY = "lightning_call"
# ModelCheckpoint attributes the driver gets back (all public, all plain data).
CHECKPOINT_STATE_KEYS = (
    "dirpath",
    "best_model_path",
    "best_model_score",
    "best_k_models",
    "kth_best_model_path",
    "kth_value",
    "last_model_path",
    "current_score",
)


class _Heartbeat(Callback):
    """Tells raylight the worker is alive after every batch of every stage."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.ctx.heartbeat()

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.ctx.heartbeat()

    def on_test_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.ctx.heartbeat()

    def on_predict_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.ctx.heartbeat()


def run_on_worker(ctx: Any, config: dict[str, Any]) -> None:
    """raylight train loop: run the Trainer entry point, then report rank 0's results."""
    trainer, function, args, kwargs = config[CALL_KEY]
    quiet_worker(trainer)  # Lightning's tips and summary, unless the driver is verbose
    trainer.strategy.attach_worker(ctx, trainer)
    trainer.callbacks.append(_Heartbeat(ctx))
    results = function(*args, **kwargs)
    output = collect(trainer, results)
    metrics: dict[str, Any] = {
        k: v for k, v in output["callback_metrics"].items() if isinstance(v, torch.Tensor) and v.numel() == 1
    }
    metrics[INTERNAL_METRIC] = 1  # the driver's results, not a report for Ray Tune
    ctx.report(metrics, checkpoint=output if ctx.rank == 0 else None)


def file_loggers(trainer: Any) -> list[Any]:
    """The Trainer's loggers that pick a ``version_N`` directory by listing their save_dir."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    return [lg for lg in trainer.loggers if isinstance(lg, CSVLogger | TensorBoardLogger)]


def _callback_states(trainer: Any) -> dict[str, Any]:
    """Other callbacks' ``state_dict()`` (e.g. EarlyStopping's), by ``state_key``; a state
    a ``weights_only`` load would refuse stays on the worker, with a warning."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from raylight.storage.checkpoint import deserialize_state, serialize_state

    states = {}
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint | _Heartbeat) or type(callback).__module__.startswith("raylight."):
            continue
        state = to_cpu(callback.state_dict())
        if not state:
            continue
        try:
            deserialize_state(serialize_state({"state": state}))
        except Exception as exc:
            log.warning("the state of callback %s stays on the worker: %s", callback.state_key, exc)
            continue
        states[callback.state_key] = state
    return states


def collect(trainer: Any, results: Any) -> dict[str, Any]:
    """Rank 0's results for the driver, as plain data a ``weights_only`` load accepts.
    Every rank must call it: gathering a sharded state dict is a collective."""
    fitting = trainer.state.fn == TrainerFn.FITTING
    # raylight's strategies say how the full weights are had (gathered where sharded);
    # any other strategy's state dict is taken as it is.
    gather = getattr(trainer.strategy, "driver_weights", trainer.strategy.lightning_module_state_dict)
    weights = gather() if fitting else None
    callbacks = []
    for callback in trainer.checkpoint_callbacks:
        callbacks.append(
            {k: to_cpu(getattr(callback, k)) for k in CHECKPOINT_STATE_KEYS if hasattr(callback, k)}
        )
    state = trainer.state
    return {
        "callback_states": _callback_states(trainer),
        "weights": to_cpu(weights) if weights is not None else None,
        "checkpoint_callbacks": callbacks,
        "callback_metrics": to_cpu(dict(trainer.callback_metrics)),
        "logged_metrics": to_cpu(dict(trainer.logged_metrics)),
        "progress_bar_metrics": to_cpu(dict(trainer.progress_bar_metrics)),
        "fit_loop": trainer.fit_loop.state_dict() if fitting else None,
        "state": {
            "fn": state.fn.value if state.fn else None,
            "status": state.status.value,
            "stage": state.stage.value if state.stage else None,
        },
        "should_stop": bool(trainer.should_stop),
        # resolved here, on rank 0's filesystem, where its loggers wrote
        "logger_versions": [lg.version for lg in file_loggers(trainer)],
        "results": to_cpu(results),
    }
