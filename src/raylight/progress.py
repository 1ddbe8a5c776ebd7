"""The driver's live view of a run: epoch progress, metrics, global samples/s.

On a terminal it is a rich progress bar redrawn in place; elsewhere (CI, logs) it
prints one line per epoch and on every restart. ``progress=False`` silences it.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from raylight._time import monotonic
from raylight.adaptive.profile import SampleRate
from raylight.worker_group.protocol import GroupPoll


def format_metrics(metrics: dict[str, Any], limit: int = 4) -> str:
    parts = []
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Number):
            continue
        if key in ("epoch", "step"):
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
        if len(parts) == limit:
            break
    return " ".join(parts)


class ProgressDisplay:
    def __init__(self, *, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console or Console(stderr=True)
        self.live = enabled and self.console.is_terminal and sys.stderr.isatty()
        self._progress: Progress | None = None
        self._live: Live | None = None
        self._status = Text("starting workers...", style="dim")
        self._task: Any = None
        self._rate = SampleRate()
        self._metrics: dict[str, Any] = {}
        self._restarts = 0
        self._last_line = -1e9

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self._progress = Progress(
                TextColumn("[bold cyan]{task.description:>10}"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._progress.add_task("starting", total=None)
            self._live = Live(
                Group(self._progress, self._status), console=self.console, refresh_per_second=8
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._progress = None

    def message(self, text: str) -> None:
        if self.enabled:
            self.console.print(text)

    def update(
        self,
        poll: GroupPoll,
        *,
        num_workers: int,
        num_restarts: int,
        batch_size: int | None = None,
        efficiency: float | None = None,
    ) -> None:
        if not self.enabled:
            return
        for report in poll.reports:
            self._metrics = report.metrics
        samples = sum(p.progress.samples for p in poll.polls)
        rate = self._rate.update(samples, monotonic())
        rank0 = next((p for p in poll.polls if p.rank == 0), None)
        epoch = rank0.progress.epoch if rank0 is not None else None
        info = f"{format_metrics(self._metrics)}  {rate:,.0f} samples/s  workers={num_workers}"
        if batch_size is not None:
            info += f"  batch={batch_size}"
        if efficiency is not None:
            info += f"  efficiency={efficiency:.2f}"
        if num_restarts:
            info += f"  restarts={num_restarts}"
        if self._progress is not None and rank0 is not None:
            prog = rank0.progress
            desc = f"epoch {prog.epoch}" if prog.epoch is not None else "running"
            self._progress.update(
                self._task, description=desc, total=prog.steps_per_epoch, completed=prog.step
            )
            self._status.plain = info.strip()
            self._status.style = ""
        elif not self.live and (poll.reports or num_restarts != self._restarts):
            now = monotonic()
            if now - self._last_line >= 1.0 or num_restarts != self._restarts:
                where = f"epoch {epoch}" if epoch is not None else "report"
                self.console.print(f"{where}  {info}", highlight=False)
                self._last_line = now
        self._restarts = num_restarts
