"""raylight.base.verbosity: the one switch between raylight's output and Ray's (no cluster)."""

from __future__ import annotations

import logging
import os

import pytest

from raylight.base import verbosity


@pytest.fixture
def restore():
    """Logging is process-wide: leave Ray's loggers and Ray Data's context as found."""
    from ray.data import DataContext

    names = ["ray", verbosity._AUTH_LOGGER, "ray.data._internal.progress", *verbosity._JOBS_CLIENT_LOGGERS]
    levels = {n: logging.getLogger(n).level for n in names}
    handlers = {h: h.level for h in logging.getLogger("ray.data").handlers}
    bars = DataContext.get_current().enable_progress_bars
    current = list(verbosity._current)
    env = {n: os.environ.get(n) for n in [*verbosity._RAY_DATA_ENV, verbosity._COLOR_PREFIX_ENV]}
    yield DataContext
    for n, value in env.items():
        os.environ.pop(n, None)
        if value is not None:
            os.environ[n] = value
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)
    for h, level in handlers.items():
        h.setLevel(level)
    DataContext.get_current().enable_progress_bars = bars
    verbosity._current[:] = current


def _console_levels() -> set[int]:
    return {h.level for h in logging.getLogger("ray.data").handlers if h.get_name() == "console"}


def test_quiet_and_verbose_set_rays_own_knobs(restore, monkeypatch):
    monkeypatch.delenv(verbosity.ENV, raising=False)
    monkeypatch.delenv("RAY_DATA_LOGGING_CONFIG", raising=False)
    monkeypatch.delenv("RAY_DATA_DISABLE_PROGRESS_BARS", raising=False)
    assert verbosity.apply() is False  # the default
    assert "RAY_DATA_LOGGING_CONFIG" not in os.environ  # only when Ray starts
    assert logging.getLogger("ray").level == logging.WARNING and verbosity.before_ray_starts() == logging.WARNING
    assert logging.getLogger(verbosity._AUTH_LOGGER).level == logging.ERROR
    assert restore.get_current().enable_progress_bars is False and _console_levels() == {logging.WARNING}
    # ... and for Ray processes started from here, and a Ray Data imported later
    assert os.environ["RAY_DATA_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["RAY_DATA_LOGGING_CONFIG"].endswith("ray_data_logging.yaml")

    monkeypatch.setenv(verbosity.ENV, "1")
    assert verbosity.apply() is True and verbosity.is_verbose()
    assert logging.getLogger("ray").level == logging.INFO and verbosity.before_ray_starts() == logging.INFO
    assert restore.get_current().enable_progress_bars is True and _console_levels() == {logging.INFO}
    assert "RAY_DATA_LOGGING_CONFIG" not in os.environ and "RAY_DATA_DISABLE_PROGRESS_BARS" not in os.environ
    assert verbosity.apply(False) is False  # an explicit setting beats the environment


def test_a_users_own_ray_data_settings_are_kept(restore, monkeypatch):
    monkeypatch.setenv("RAY_DATA_LOGGING_CONFIG", "/etc/mine.yaml")
    verbosity.apply(False)
    verbosity.before_ray_starts()
    verbosity.apply(True)
    assert os.environ["RAY_DATA_LOGGING_CONFIG"] == "/etc/mine.yaml"


def test_the_ray_data_logging_config_is_ray_datas_default_with_a_quiet_console():
    """Ray Data loads this file itself (RAY_DATA_LOGGING_CONFIG); it must stay its default
    but for the console's level and the progress logger."""
    import yaml
    from ray.data._internal.logging import DEFAULT_CONFIG

    with open(verbosity._RAY_DATA_CONFIG) as f:
        ours = yaml.safe_load(f)
    assert ours["handlers"]["console"]["level"] == "WARNING"
    assert ours["loggers"]["ray.data"] == DEFAULT_CONFIG["loggers"]["ray.data"]
    for name in ("file", "console"):
        assert ours["handlers"][name]["class"] == DEFAULT_CONFIG["handlers"][name]["class"]


@pytest.mark.parametrize("terminal", [False, True])
def test_ray_colours_worker_prefixes_only_on_a_terminal(restore, monkeypatch, terminal):
    """Ray wraps each worker line's "(name pid=N)" in colour codes: where the driver's
    output is a pipe or a file, raylight asks it not to (RAY_COLOR_PREFIX=0), in both modes;
    a user's own value stays."""
    monkeypatch.delenv(verbosity._COLOR_PREFIX_ENV, raising=False)
    monkeypatch.setattr(verbosity, "_terminal", lambda: terminal)
    for verbose in (False, True):
        verbosity.apply(verbose)
        verbosity.before_ray_starts()
        assert os.environ.get(verbosity._COLOR_PREFIX_ENV) == (None if terminal else "0")
    os.environ[verbosity._COLOR_PREFIX_ENV] = "1"
    verbosity.before_ray_starts()
    assert os.environ[verbosity._COLOR_PREFIX_ENV] == "1"


def test_the_ray_jobs_clients_info_lines_are_made_only_when_verbose(restore):
    import ray.job_submission  # noqa: F401  # its modules set their loggers to INFO when imported

    for verbose in (False, True):
        verbosity.apply(verbose)
        for name in verbosity._JOBS_CLIENT_LOGGERS:
            assert logging.getLogger(name).isEnabledFor(logging.INFO) is verbose
