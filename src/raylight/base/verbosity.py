"""How much of Ray's own output a raylight driver shows: the one home of that setting.

Quiet (the default) shows raylight's output: its progress display, its warnings, errors
(Ray's too). Verbose (``raylight --verbose ...``, ``RAYLIGHT_VERBOSE=1``,
``RunConfig(verbose=True)`` / ``fit(verbose=True)``) gives Ray's output back as Ray
prints it. Each kind of noise is turned off where it is made, never filtered afterwards:

- Ray Core's driver logger ``ray`` (``ray.init(logging_level=...)``): WARNING, not INFO.
- Ray's note that token authentication is on (a WARNING at every embedded start, though
  it reports the safe default; raylight warns itself when authentication is off).
- Ray's Jobs client (``raylight submit``): its INFO lines (the working directory packaged
  and uploaded, a WebSocket closed), on two loggers that set their own level to INFO when
  imported, so ``apply`` is called after importing it.
- The experiment loggers' libraries: MLflow's (and alembic's) INFO lines, W&B's banner
  (``raylight.driver.loggers`` starts W&B quiet unless verbose).
- Ray Data: its progress bars (``DataContext.enable_progress_bars``, or
  ``RAY_DATA_DISABLE_PROGRESS_BARS`` before Ray Data is imported), and its console
  handler at WARNING (``RAY_DATA_LOGGING_CONFIG``: Ray Data's own logging configuration,
  ``ray_data_logging.yaml``), which drops each dataset's "Starting execution", plan,
  logged progress, "execution finished" and tips such as ``take_batch()``. Ray Data keeps
  writing all of it to ``ray-data.log`` in the session's log directory.

Worker output (a loop's ``print``, tracebacks) still reaches the driver: Ray's
``log_to_driver`` stays on in both modes. Ray colours the ``(name pid=...)`` prefix of each
such line; where the driver's output is not a terminal (a pipe, a file) it prints no colour
codes (``RAY_COLOR_PREFIX=0``, read as each line is printed; a user's own value stays). In the workers, quiet turns off Ray's log of a
call argument a worker cannot unpickle (``worker_loggers``): the driver reports that error.

Logging is process-wide, so the setting is too: ``apply`` sets it (``Trainer.fit`` with
``RunConfig.verbose``), ``before_ray_starts`` reads it for ``ray.init`` and, quiet, puts Ray
Data's two variables into the environment the Ray processes started then inherit (a
process boundary; a user's own values stay).
"""

from __future__ import annotations

import logging
import os
import sys

ENV = "RAYLIGHT_VERBOSE"
_RAY_DATA_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_data_logging.yaml")
# Ray Data reads these when imported (each Ray worker process imports it anew).
_RAY_DATA_ENV = {"RAY_DATA_LOGGING_CONFIG": _RAY_DATA_CONFIG, "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
# Ray logs "Token authentication is enabled for this Ray cluster" here at WARNING.
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_TRUE = {"1", "true", "yes", "on"}
# In a worker, Ray logs a call argument it cannot unpickle here, with its traceback.
_RAY_UNPICKLING_LOGGER = "ray._private.serialization"
# Ray's driver wraps the "(name pid=N)" prefix of each worker line in colour codes unless "0".
_COLOR_PREFIX_ENV = "RAY_COLOR_PREFIX"
# Experiment loggers' libraries log INFO lines too (MLflow creating its database).
_LIBRARY_LOGGERS = ("mlflow", "alembic", "wandb")
# Ray's Jobs client logs its INFO lines here (each logger set to INFO by its module).
_JOBS_CLIENT_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk")

_current: list[bool] = []  # what apply() last set (logging is process-wide)


def from_env() -> bool:
    """``RAYLIGHT_VERBOSE`` as a bool (1/true/yes/on)."""
    return os.environ.get(ENV, "").strip().lower() in _TRUE


def resolve(verbose: bool | None = None) -> bool:
    """An explicit setting, else ``RAYLIGHT_VERBOSE``."""
    return from_env() if verbose is None else bool(verbose)


def apply(verbose: bool | None = None) -> bool:
    """Make this process quiet or verbose (``verbose=None``: ``RAYLIGHT_VERBOSE``).
    Returns the setting applied."""
    on = resolve(verbose)
    logging.getLogger("ray").setLevel(logging.INFO if on else logging.WARNING)
    logging.getLogger(_AUTH_LOGGER).setLevel(logging.NOTSET if on else logging.ERROR)
    for name in _JOBS_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if on else logging.WARNING)
    _current[:] = [on]
    library_loggers()
    if on:  # a Ray Data imported from now on prints as Ray's default says
        for name, value in _RAY_DATA_ENV.items():
            if os.environ.get(name) == value:
                del os.environ[name]
    if "ray.data" in sys.modules:
        _ray_data(on)
    return on


def library_loggers() -> None:
    """Set the experiment loggers' libraries' logging (again: MLflow sets its own level
    when imported)."""
    on = is_verbose()
    for name in _LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if on else logging.WARNING)


def worker_loggers(on: bool) -> None:
    """In a worker process (verbose or not, as its driver): Ray's log of a call argument
    the worker cannot unpickle (a page of traceback per rank; the driver gets the same
    error with the call's result and says it once, ``WorkerImportError``) only when
    verbose. ``is_verbose()`` in the worker says the driver's setting from now on (the
    Lightning strategies' workers read it)."""
    _current[:] = [on]
    logging.getLogger(_RAY_UNPICKLING_LOGGER).setLevel(logging.NOTSET if on else logging.CRITICAL)


def is_verbose() -> bool:
    """The setting in effect: the last ``apply``, else ``RAYLIGHT_VERBOSE``."""
    return _current[0] if _current else from_env()


def before_ray_starts() -> int:
    """Called just before this process starts (or joins) Ray: quiet, Ray Data's settings
    go into the environment, which the Ray processes started now inherit and a Ray Data
    imported later reads (a user's own values stay). Returns ``ray.init``'s
    ``logging_level``."""
    on = _current[0] if _current else apply()
    if not on:
        for name, value in _RAY_DATA_ENV.items():
            os.environ.setdefault(name, value)
    if not _terminal():
        os.environ.setdefault(_COLOR_PREFIX_ENV, "0")
    return logging.INFO if on else logging.WARNING


def _terminal() -> bool:
    """Whether both of this process's output streams are terminals (colour is read there)."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def _ray_data(on: bool) -> None:
    """Ray Data is imported already: set what importing it configured."""
    from ray.data import DataContext

    DataContext.get_current().enable_progress_bars = on
    level = logging.INFO if on else logging.WARNING
    for handler in logging.getLogger("ray.data").handlers:
        if handler.get_name() == "console":  # Ray Data's configuration names its handlers
            handler.setLevel(level)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.NOTSET if on else logging.ERROR)
