"""RayLauncher: Lightning's launcher axis, implemented with raylight's worker group.

This is the one module that uses private Lightning APIs: the launcher base class
(``lightning.pytorch.strategies.launchers.launcher._Launcher``) that a strategy's
``_configure_launcher`` hook installs (Lightning has no public way to plug in a
launcher), and the file loggers' cached ``_version`` (no public setter); everything else
here uses public Trainer attributes. Supported range and the
reason are in docs/lightning.md.

On the driver, ``launch`` runs the Trainer's entry point (fit, validate, test or
predict) on ``num_workers`` Ray actors through ``raylight.Trainer``, so placement
groups, rendezvous, health checks and every timeout are raylight's own. Rank 0 sends
back what the driver's Trainer needs (see ``_worker.collect``); ``recover`` puts it in
place, so the driver's model is trained afterwards.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning.pytorch.strategies.launchers.launcher import _Launcher
from lightning.pytorch.trainer.states import RunningStage, TrainerFn, TrainerStatus
from torch import nn

from raylight.lightning._worker import CALL_KEY, CHECKPOINT_STATE_KEYS, file_loggers, run_on_worker
from raylight.storage.checkpoint import RAYLIGHT_KEY

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from raylight.lightning.strategies import RaySettings

log = logging.getLogger("raylight")


class RayLauncher(_Launcher):
    """Runs a Trainer entry point on raylight workers and recovers rank 0's results."""

    def __init__(self, settings: RaySettings, *, check_model: Callable[[Any], None] | None = None) -> None:
        self._settings = settings
        # the strategy's checks of the LightningModule in the driver, before Ray starts
        self._check_model = check_model

    @property
    def is_interactive_compatible(self) -> bool:
        return True  # workers are Ray actors, not forks of a notebook kernel

    def launch(self, function: Any, *args: Any, trainer: pl.Trainer | None = None, **kwargs: Any) -> Any:
        if trainer is None:
            raise ValueError("RayLauncher.launch needs the Trainer (trainer=...)")
        from raylight.driver.trainer import Trainer

        if self._check_model is not None:
            module = args[0] if args and isinstance(args[0], nn.Module) else trainer.lightning_module
            if module is not None:
                self._check_model(module)
        run_dir = tempfile.mkdtemp(prefix="raylight-lightning-")
        forward = _tune_forwarder()
        try:
            config = self._settings.trainer_config(storage_path=run_dir)
            result = Trainer(
                run_on_worker,
                train_loop_config={CALL_KEY: (trainer, function, args, kwargs)},
                config=config,
                on_report=forward,
            ).fit()
            if result.checkpoint is None:
                raise RuntimeError("rank 0 finished without sending its results back")
            output = result.checkpoint.load()  # torch.load(weights_only=True)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        output.pop(RAYLIGHT_KEY, None)
        recover(trainer, output)
        return output["results"]

    def kill(self, signum: Any) -> None:
        pass  # the workers are Ray actors: raylight's group kills them on any exit


def _tune_forwarder() -> Any:
    """Inside a Ray Tune trial: what sends the workers' reports (``TuneReportCallback``
    on rank 0) on to Tune from here, the trial's process; otherwise None."""
    if "ray.tune" not in sys.modules:
        return None
    from raylight.tune.trial import TuneForwarder, in_tune_session

    return TuneForwarder() if in_tune_session() else None


def _take_logger_versions(trainer: pl.Trainer, versions: list[Any]) -> None:
    """The file loggers' versions rank 0 resolved, where it writes (``_worker.collect``),
    set on the driver's loggers, so ``trainer.log_dir`` here points where rank 0 wrote and a
    later call (``trainer.test`` after ``fit``) writes there too. Resolved here instead, a
    version would be read from the driver's disk, which on a cluster is not the workers'
    (issue 57: an earlier run's ``version_0`` on rank 0's disk was written into). Lightning
    has no public setter: ``_version`` is what its ``version`` property caches."""
    for logger, version in zip(file_loggers(trainer), versions, strict=False):
        logger._version = version


def recover(trainer: pl.Trainer, output: dict[str, Any]) -> None:
    """Put rank 0's results in the driver's Trainer: weights (after fit), checkpoint
    callbacks' best paths, other callbacks' states, metrics, the fit loop's progress and
    the trainer state."""
    _take_logger_versions(trainer, output.get("logger_versions", []))
    weights = output.get("weights")
    if weights is not None:
        module = trainer.lightning_module
        missing, unexpected = module.load_state_dict(weights, strict=False)
        if missing or unexpected:
            log.warning(
                "the driver's model differs from the trained one: missing %s, unexpected %s",
                missing, unexpected,
            )
    for callback, state in zip(trainer.checkpoint_callbacks, output["checkpoint_callbacks"], strict=False):
        for key in CHECKPOINT_STATE_KEYS:
            if key in state:
                setattr(callback, key, state[key])
    states = output.get("callback_states", {})
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # set by Lightning at init
        if callback.state_key in states:
            callback.load_state_dict(states[callback.state_key])
    for name in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
        target = getattr(trainer, name)
        target.clear()
        target.update(output[name])
    if output.get("fit_loop") is not None:
        trainer.fit_loop.load_state_dict(output["fit_loop"])
    state = output["state"]
    trainer.state.fn = TrainerFn(state["fn"]) if state["fn"] else None
    trainer.state.status = TrainerStatus(state["status"])
    trainer.state.stage = RunningStage(state["stage"]) if state["stage"] else None
    trainer.should_stop = bool(output.get("should_stop", False))
