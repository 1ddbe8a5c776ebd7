"""A search's progress as lines, in place of Ray Tune's status tables.

Tune prints a table of every trial every few seconds and at the end (~160 lines for a
small search). A raylight search prints one line per trial event instead: a trial
started, each report (its iteration and the metric), and its end; the one table is the
product's, at the end. ``TrialLines`` is a Tune callback (``tune.RunConfig(callbacks=...)``)
and runs in the search's driver.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ray.tune import Callback


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class TrialLines(Callback):
    """One line per trial event: ``trial <id> <what> (<running> running, <done>/<total> done)``."""

    def __init__(self, metric: str, *, num_trials: int, write: Callable[[str], None] | None = None) -> None:
        self.metric, self.num_trials = metric, num_trials
        self.write = write or _to_stderr  # a function: Tune pickles its callbacks with the experiment
        self._done = 0

    def _say(self, trials: list[Any], trial: Any, what: str) -> None:
        running = sum(1 for t in trials if t.status == "RUNNING")
        self.write(f"hyperopt: trial {trial.trial_id} {what} ({running} running, {self._done}/{self.num_trials} done)")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        params = ", ".join(f"{k}={_number(v)}" for k, v in (trial.config or {}).items())
        self._say(trials, trial, f"started: {params}")

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
        if self.metric not in result:
            return
        step = result.get("training_iteration")
        self._say(trials, trial, f"iteration {step}: {self.metric}={_number(result[self.metric])}")

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._done += 1
        self._say(trials, trial, "finished")

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._done += 1
        self._say(trials, trial, "failed")
