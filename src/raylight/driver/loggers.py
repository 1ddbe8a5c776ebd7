"""Experiment loggers (TensorBoard, MLflow, Weights & Biases), written by the driver.

The workers never touch them: the ``RunRecorder`` hands every report of rank 0 it records
to ``RunLoggers.log`` (the step is the report's index in the run's history, as in
``metrics.jsonl``), the resolved config once when the run begins, and closes them when the
run ends, failed or not. A resumed run continues the same MLflow and W&B runs: their ids
are kept in the run directory (``loggers.json``); TensorBoard's writer drops the events of
steps that run again.

Each logger's package is imported only when a run asks for it (``pip install
'raylight[loggers]'``). A logger that fails while the run trains is dropped with a warning:
it never stops training.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import numbers
import os
import time
import uuid
from typing import Any, Protocol

from raylight.base.exceptions import ConfigError
from raylight.config.loggers import MLflow, TensorBoard, Wandb
from raylight.storage.run_dir import RunStorage

log = logging.getLogger("raylight")

STATE_FILE = "loggers.json"  # the MLflow and W&B run ids, for a resume
EXTRA = "pip install 'raylight[loggers]'"
PACKAGES = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "wandb": "wandb"}


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self, failed: bool) -> None: ...


def numbers_of(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a report (booleans and text are not metrics)."""
    return {
        k: float(v) for k, v in metrics.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and not k.startswith("_")
    }


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"run": {"name": x}}`` -> ``{"run.name": x}`` (MLflow's parameters are flat)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class RunLoggers:
    """The loggers of one run. Built (and checked) before the run starts; opened when its
    directory appears (``RunRecorder.begin``)."""

    def __init__(self, specs: list[Any], storage: RunStorage, *, name: str, resume: bool) -> None:
        self.specs = list(specs)
        self.storage, self.name, self.resume = storage, name, resume
        self._open: list[tuple[str, Logger]] = []
        for spec in self.specs:
            package = PACKAGES[spec.type]
            if importlib.util.find_spec(package) is None:
                raise ImportError(
                    f"RunConfig.loggers asks for {spec.type!r}, which needs the {package!r} package: {EXTRA}"
                )
            if self._default_dir(spec) and not storage.is_local:
                raise ConfigError(
                    f"RunConfig.loggers: the {spec.type} logger writes beside the run by default, but the "
                    f"run directory {storage.uri} is not on a local disk; give it a local "
                    f"{'log_dir' if spec.type == 'tensorboard' else 'tracking_uri' if spec.type == 'mlflow' else 'dir'}"
                )

            given = spec.log_dir if isinstance(spec, TensorBoard) else spec.dir if isinstance(spec, Wandb) else None
            if given is not None:
                check_writable_dir(given, f"RunConfig.loggers: the {spec.type} logger's {'log_dir' if isinstance(spec, TensorBoard) else 'dir'}")

    @staticmethod
    def _default_dir(spec: Any) -> bool:
        if isinstance(spec, TensorBoard):
            return spec.log_dir is None
        if isinstance(spec, MLflow):
            return spec.tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI")
        return bool(isinstance(spec, Wandb) and spec.dir is None)

    def open(self, config: dict[str, Any], *, first_step: int) -> None:
        """Start every logger (continuing a resumed run's) and record the config once.
        ``first_step``: the step of the next report (the history's length)."""
        if not self.specs or self._open:
            return
        state = self._state() if self.resume else {}
        try:
            for spec in self.specs:
                opener = _OPENERS[spec.type]
                self._open.append((spec.type, opener(spec, self, config, state, first_step)))
        except BaseException:
            self.close(failed=True)
            raise
        self.storage.write_text(STATE_FILE, json.dumps(state))

    def _state(self) -> dict[str, Any]:
        if not self.storage.exists(STATE_FILE):
            return {}
        try:
            value = json.loads(self.storage.read_text(STATE_FILE))
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("%s of %s is damaged (%s); the loggers start new runs", STATE_FILE, self.storage.uri, exc)
            return {}
        return value if isinstance(value, dict) else {}

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = numbers_of(metrics)
        if not values:
            return
        for entry in list(self._open):
            kind, logger = entry
            try:
                logger.log(values, step)
            except Exception as exc:  # a logger never stops training
                log.warning("the %s logger failed (%s: %s); the run goes on without it", kind, type(exc).__name__, exc)
                self._open.remove(entry)
                self._close_one(kind, logger, failed=True)

    def close(self, failed: bool) -> None:
        while self._open:
            kind, logger = self._open.pop()
            self._close_one(kind, logger, failed=failed)

    @staticmethod
    def _close_one(kind: str, logger: Logger, *, failed: bool) -> None:
        try:
            logger.close(failed)
        except Exception as exc:
            log.warning("could not close the %s logger: %s: %s", kind, type(exc).__name__, exc)


def check_writable_dir(path: str, what: str) -> None:
    """Before anything is written: ``path`` is a directory that can be written, or can be
    created (its nearest existing parent is a writable directory)."""
    if "://" in path and not path.startswith("file://"):
        return  # an object store: its logger says what it cannot reach
    target = os.path.abspath(os.path.expanduser(path.removeprefix("file://")))
    found = target
    while not os.path.exists(found):
        found = os.path.dirname(found)
    if not os.path.isdir(found):
        raise ConfigError(f"{what} {path!r} cannot be created: {found!r} is a file, not a directory; choose another directory")
    if not os.access(found, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path!r} is not writable ({found!r} does not let this user write); choose a directory you can write to")


def _local(loggers: RunLoggers, rel: str) -> str:
    return os.path.join(loggers.storage.root, rel)


class _TensorBoard:
    def __init__(self, spec: TensorBoard, loggers: RunLoggers, config: dict[str, Any], state: dict[str, Any], first_step: int) -> None:
        from tensorboardX import SummaryWriter

        log_dir = spec.log_dir or _local(loggers, "tensorboard")
        # purge_step: TensorBoard hides the events a resumed run writes again
        self.writer = SummaryWriter(log_dir, purge_step=first_step if first_step else None)
        if not first_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, spec: MLflow, loggers: RunLoggers, config: dict[str, Any], state: dict[str, Any], first_step: int) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from raylight.base import verbosity

        verbosity.library_loggers()  # importing MLflow set its logger to INFO

        # MLflow's own recommended local store (its file store refuses to open by default)
        uri = spec.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///" + _local(loggers, "mlflow.db")
        self.client = MlflowClient(tracking_uri=uri)
        run_id = state.get("mlflow")
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(spec.experiment)
            exp_id = experiment.experiment_id if experiment is not None else self.client.create_experiment(spec.experiment)
            run = self.client.create_run(exp_id, run_name=spec.run_name or loggers.name, tags=dict(spec.tags))
            run_id = run.info.run_id
            state["mlflow"] = run_id
            params = [Param(k, json.dumps(v, default=str)[:6000] if not isinstance(v, str) else v[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
                self.client.log_batch(run_id, params=params[i : i + 100])
        self.run_id = run_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class _Wandb:
    def __init__(self, spec: Wandb, loggers: RunLoggers, config: dict[str, Any], state: dict[str, Any], first_step: int) -> None:
        import wandb

        from raylight.base import verbosity

        run_id = state.get("wandb") or uuid.uuid4().hex[:12]
        state["wandb"] = run_id
        # console="off": W&B would otherwise wrap this process's stdout and stderr.
        settings = wandb.Settings(console="off", quiet=not verbosity.is_verbose(), silent=not verbosity.is_verbose())
        self.run = wandb.init(
            project=spec.project, entity=spec.entity, name=spec.run_name or loggers.name, id=run_id,
            resume="allow", dir=spec.dir or loggers.storage.root, mode=spec.mode, config=config,
            tags=list(spec.tags) or None, settings=settings, reinit="create_new",
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


_OPENERS: dict[str, Any] = {"tensorboard": _TensorBoard, "mlflow": _MLflow, "wandb": _Wandb}
