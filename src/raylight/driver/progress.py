"""The driver's live view of a run: epoch, step, samples/s, ETA, workers, batch size.

Everywhere it prints exactly one line per epoch, when the epoch's last report is in, and
one per resize; lines never wrap. An epoch's samples/s is the mean over that epoch
(``SampleRate.since``, the figure adaptive.jsonl and its plot give for their rows);
adaptive runs add the global batch, the LR factor and the statistical efficiency.
On a terminal, below those lines, a rich progress bar is redrawn in place (the epoch's
steps, elapsed time and the epoch's ETA) over one status line (the newest metrics, the
window's samples/s, workers, batch size); before the first step, lines say what is
starting (``announce``: Ray; ``phase``: the workers), where a pipe's reader gets the epoch
lines alone. ``progress=False`` silences it. A loop that reports without epochs (no
``epoch`` metric, no prepared loader) gets one line per report, at most one a second.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from raylight.adaptive.profile import SampleRate
from raylight.base.clock import monotonic
from raylight.worker.protocol import GroupPoll

# Shown elsewhere on the line (the epoch leads it, batch= follows the rate).
_NOT_METRICS = ("epoch", "step", "batch_size")


def format_metrics(metrics: dict[str, Any], limit: int = 4) -> str:
    parts = []
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            continue
        if key in _NOT_METRICS:
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
        if len(parts) == limit:
            break
    return " ".join(parts)


_Plan = tuple[int | None, str | None]  # (global batch, LR factor as shown)


def _plan_text(start: _Plan, now: _Plan) -> str:
    """``  batch=64  lr_factor=1.00``, with ``start->now`` for what changed between them."""
    text = ""
    for key, a, b in (("batch", start[0], now[0]), ("lr_factor", start[1], now[1])):
        if b is not None:
            text += f"  {key}={b}" if a is None or a == b else f"  {key}={a}->{b}"
    return text


def _terminal(console: Console) -> bool:
    """Whether the live view runs: a terminal, not a pipe that FORCE_COLOR made look like one."""
    return console.is_terminal and sys.stderr.isatty()


def announce(text: str, *, enabled: bool = True, console: Console | None = None) -> None:
    """A line saying what starts before the run's display exists (Ray), on a terminal only."""
    console = console or Console(stderr=True)
    if enabled and _terminal(console):
        console.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)


def _epoch_of(metrics: dict[str, Any], fallback: int | None) -> int | None:
    """A report's epoch: its ``epoch`` metric, else where rank 0's loader is."""
    value = metrics.get("epoch")
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return fallback


class ProgressDisplay:
    """``live=False``: lines even on a terminal (a loop in the driver's own process, where a
    debugger may stop it, or a launcher's rank, whose output a launcher interleaves)."""

    def __init__(self, *, enabled: bool, console: Console | None = None, live: bool = True) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.live = live and enabled and _terminal(self.console)
        self._progress: Progress | None = None
        self._live: Live | None = None
        # One line however narrow the terminal: the end is cut, not wrapped.
        self._status = Text("starting workers...", style="dim", no_wrap=True, overflow="ellipsis")
        self._task: Any = None
        self._task_epoch: int | None = None
        self._rate = SampleRate()
        self._metrics: dict[str, Any] = {}
        self._restarts = 0
        self._workers: int | None = None
        self._pending: tuple[int | None, str] | None = None  # (epoch, line) not printed yet
        self._last_line = -1e9
        # (time, samples) at the previous epoch's last report, and at the last report:
        # an epoch's samples/s is the mean from the one to its own last report.
        self._epoch_mark: tuple[float, int] | None = None
        self._report_mark: tuple[float, int] | None = None
        self._report_epoch: int | None = None
        self._report_plan: _Plan | None = None  # (batch, LR factor) at the last report
        self._plan_from: _Plan | None = None  # ... where the current epoch began
        self._started = False  # a poll with progress came: the workers are training

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold cyan]{task.description:>10}"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("starting", total=None)
            # transient: at the end the bar goes and the lines above it are the run's history
            self._live = Live(
                Group(self._progress, self._status), console=self.console, refresh_per_second=8,
                transient=True,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._flush()  # above the bar, before it goes
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._progress = None

    def message(self, text: str) -> None:
        if self.enabled:
            self._line(text)

    def phase(self, text: str) -> None:
        """What the run is doing before its first step (starting the workers): a line and
        the status on a terminal; nothing in a pipe, whose reader gets the epoch lines."""
        if self._live is not None:
            self.console.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)
            self._status.plain, self._status.style = text, "dim"

    def _line(self, text: str) -> None:
        """One physical line, however narrow the console (a pipe's is 80 columns); on a
        terminal it is printed above the live bar, which never erases it."""
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def _flush(self) -> None:
        if self._pending is not None:
            self._line(self._pending[1])
            self._pending = None

    def update(
        self,
        poll: GroupPoll,
        *,
        num_workers: int,
        num_restarts: int,
        batch_size: int | None = None,
        efficiency: float | None = None,
        lr_factor: float | None = None,
    ) -> None:
        if not self.enabled:
            return
        samples = sum(p.progress.samples for p in poll.polls)
        window = self._rate.update(samples, monotonic())
        rank0 = next((p for p in poll.polls if p.rank == 0), None)
        at = rank0.progress.epoch if rank0 is not None else None
        plan = (batch_size, None if lr_factor is None else f"{lr_factor:.2f}")
        tail = ""
        if efficiency is not None:
            tail += f"  efficiency={efficiency:.2f}"
        if num_restarts:
            tail += f"  restarts={num_restarts}"
        changed = self._change(num_workers, num_restarts)
        self._lines(poll, at, f"workers={num_workers}", plan, tail, changed)
        info = f"workers={num_workers}{_plan_text(plan, plan)}{tail}"
        if self._progress is not None:
            for report in poll.reports:
                self._metrics = report.metrics
            if rank0 is not None and at is not None:
                prog = rank0.progress
                if at != self._task_epoch:  # a new epoch: its own bar and ETA
                    self._progress.reset(self._task, total=prog.steps_per_epoch, completed=0)
                    self._task_epoch = at
                self._progress.update(
                    self._task, description=f"epoch {at}", total=prog.steps_per_epoch, completed=prog.step
                )
            if samples > 0:
                self._started = True
            if self._started:
                self._status.plain = f"{window:,.0f} samples/s  {info}  {format_metrics(self._metrics)}".strip()
                self._status.style = ""

    def _change(self, num_workers: int, num_restarts: int) -> str | None:
        """The line for a resize since the last poll, if there was one. A restart gets
        none here: the controller's warning already said why and where from (a checkpoint's
        index, or the beginning), and the status counts ``restarts=N``."""
        line = None
        if self._workers is not None and num_workers != self._workers:
            line = f"resized: {self._workers} -> {num_workers} workers"
        self._restarts, self._workers = num_restarts, num_workers
        return line

    def _lines(
        self, poll: GroupPoll, at: int | None, workers: str, plan: _Plan, tail: str, changed: str | None
    ) -> None:
        """The line of an epoch once its last report is in (a report of a later epoch
        arrives, the loader moves on, or the run ends), with the epoch's mean samples/s and
        its batch and LR factor (``64->2048`` where they changed during it)."""
        mark = self._rate.mark()
        # the first plan known is where the first epoch began (none exists before the workers start)
        start = self._plan_from or (None, None)
        self._plan_from = (start[0] if start[0] is not None else plan[0], start[1] if start[1] is not None else plan[1])
        for report in poll.reports:
            epoch = _epoch_of(report.metrics, at)
            if self._pending is not None and self._pending[0] != epoch:
                self._flush()
            if epoch is None or epoch != self._report_epoch:
                if self._report_plan is not None:  # this epoch began where the last one ended
                    self._plan_from = self._report_plan
                # the previous epoch (report, without epochs) ended at its last report;
                # epochs whose reports came in one poll share the interval up to it
                if self._report_mark is not None and mark is not None and self._report_mark[0] < mark[0]:
                    self._epoch_mark = self._report_mark
            self._report_mark, self._report_epoch, self._report_plan = mark, epoch, plan
            rate = self._rate.since(self._epoch_mark)
            where = f"epoch {epoch}" if epoch is not None else "report"
            info = f"{workers}{_plan_text(self._plan_from, plan)}{tail}"
            self._pending = (epoch, f"{where}  {format_metrics(report.metrics)}  {rate:,.0f} samples/s  {info}")
        if self._pending is not None:
            epoch = self._pending[0]
            if epoch is None:  # no epochs to wait for: a line a second at most
                now = monotonic()
                if now - self._last_line >= 1.0:
                    self._flush()
                    self._last_line = now
            elif at is not None and at > epoch:
                self._flush()
        if changed:
            self._flush()
            self._line(changed)
