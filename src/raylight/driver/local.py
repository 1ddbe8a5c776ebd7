"""The executors that run the loop in this process, beside the Ray one (``trainer.py``).

- ``fit_launched``: every process an external launcher started (torchrun, deepspeed,
  horovodrun, mpirun) runs the loop in the launcher's group; rank 0 records the run.
- ``fit_in_process``: ``num_workers=0``, the loop in the driver's own process.

Each calls ``worker.session.run`` with what differs; ``InProcessSink`` carries their
reports to the recorder and the progress display.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from raylight.base.clock import monotonic
from raylight.base.cost import WorkerPlace
from raylight.base.exceptions import ConfigError
from raylight.config import TrainerConfig
from raylight.driver.progress import ProgressDisplay
from raylight.driver.recorder import RunRecorder
from raylight.storage.checkpoint import Checkpoint
from raylight.worker import process_group, session
from raylight.worker.process_group import GPU_BACKEND, LaunchEnv
from raylight.worker.protocol import GroupPoll, Progress, Report, WorkerPoll
from raylight.worker.session import RankInfo


def fit_launched(
    train_loop: Callable[..., Any],
    loop_config: dict[str, Any],
    config: TrainerConfig,
    launch: LaunchEnv,
    recorder: RunRecorder | None,
    display: ProgressDisplay | None = None,
) -> tuple[list[dict[str, Any]], Checkpoint | None]:
    """Every process an external launcher started runs the loop in its group; rank 0
    (``recorder`` given) records reports and commits checkpoints as a Ray run's driver
    does, and at the end every rank returns rank 0's result: its metrics history and
    last checkpoint."""
    scaling = config.scaling
    formed = process_group.formed()
    if formed is not None and formed != (launch.rank, launch.world_size):
        raise ConfigError(
            f"the process group already formed (rank {formed[0]} of {formed[1]}) is not "
            f"the launcher's ({launch.describe()}); destroy it before fit, or let raylight form it"
        )
    if formed is not None and "cpu:" not in process_group.backend_config():
        raise ConfigError(
            f"the process group already formed ({process_group.backend_config()}) has no backend for CPU "
            "tensors, which raylight's "
            "bookkeeping reduces (metric sums, data positions); form it with "
            f"init_process_group(backend={GPU_BACKEND!r}) (torch's default where CUDA is), or let "
            "raylight form it"
        )

    def form_group(strategy: Any) -> None:
        process_group.init_process_group(
            launch, strategy.backend(scaling.use_gpu), timeout_s=config.failure.collective_timeout_s
        )

    def start() -> dict[str, Any]:
        # Rank 0 knows where the run resumes from and where shards go; the others hear it.
        begin: dict[str, Any] | None = None
        if recorder is not None:
            recorder.begin()
            target = recorder.checkpoint_target() if scaling.sharded_checkpoints else None
            begin = {
                "checkpoint": _checkpoint_parts(recorder.latest),
                "checkpoint_dir": target.directory if target is not None else None,
                "next_checkpoint": target.next_index if target is not None else None,
            }
        begin = process_group.from_rank_zero(begin)
        return {**begin, "checkpoint": _checkpoint_of(begin["checkpoint"])}

    ended: dict[str, Any] = {}

    def finish() -> None:
        mine = None
        if recorder is not None:  # the checkpoint's bytes too: another machine's rank cannot read rank 0's disk
            mine = {"history": list(recorder.history), "checkpoint": _checkpoint_parts(recorder.latest)}
        ended.update(process_group.from_rank_zero(mine))

    session.run(
        train_loop,
        loop_config,
        place=RankInfo(launch.rank, launch.local_rank, launch.world_size, launch.local_world_size, launch.cross_rank),
        device=session.choose_device(scaling.use_gpu, launch.local_rank),
        sink=InProcessSink(recorder, num_workers=launch.world_size, display=display),
        strategy=scaling.strategy,
        form_group=form_group if formed is None else None,
        start=start,
        finish=finish,
    )
    return ended["history"], _checkpoint_of(ended["checkpoint"])


def fit_in_process(
    train_loop: Callable[..., Any],
    loop_config: dict[str, Any],
    config: TrainerConfig,
    recorder: RunRecorder,
    display: ProgressDisplay | None = None,
) -> None:
    """``num_workers=0``: the loop runs in this process, without Ray and without a group."""
    recorder.begin()
    session.run(
        train_loop,
        loop_config,
        place=session.SOLO,
        device=session.choose_device(config.scaling.use_gpu),
        sink=InProcessSink(recorder, display=display),
        strategy=config.scaling.strategy,
        checkpoint=recorder.latest,
    )


def _checkpoint_parts(ckpt: Checkpoint | None) -> tuple[Any, ...] | None:
    """A checkpoint as plain parts another rank can rebuild (its bytes included)."""
    return (ckpt.path, ckpt.metadata, ckpt.to_bytes()) if ckpt is not None else None


def _checkpoint_of(parts: tuple[Any, ...] | None) -> Checkpoint | None:
    if parts is None:
        return None
    path, metadata, data = parts
    return Checkpoint(path, metadata=metadata, data=data)


class InProcessSink:
    """ReportSink for num_workers=0 and a launcher's ranks: reports go straight to the
    recorder (rank 0's; the other ranks have none, rank 0 records the run), and to the
    progress display as a worker's poll would (``SHOW_EVERY_S`` at most between batches)."""

    SHOW_EVERY_S = 0.1

    def __init__(self, recorder: RunRecorder | None, num_workers: int = 1, display: ProgressDisplay | None = None) -> None:
        self.recorder = recorder
        self.num_workers = num_workers
        self._display = display if display is not None and display.enabled else None
        self._progress = Progress()
        self._shown = -1e9

    def report(self, report: Report) -> None:
        if self.recorder is not None:
            self.recorder.record(report, num_workers=self.num_workers)
        self._show([report])

    def progress(self, epoch: int, step: int, steps_per_epoch: int, samples: int) -> None:
        if self._display is None:
            return  # called at every batch: nothing to do without a display
        # every rank loads an equal share: this rank's samples times the ranks are the run's
        done = self._progress.samples + samples * self.num_workers
        self._progress = Progress(epoch, step + 1, steps_per_epoch, done)
        if monotonic() - self._shown >= self.SHOW_EVERY_S:
            self._show([])

    def _show(self, reports: list[Report]) -> None:
        if self._display is None:
            return
        self._shown = monotonic()
        poll = GroupPoll([WorkerPoll(0, "running", reports=reports, progress=self._progress)])
        self._display.update(poll, num_workers=self.num_workers, num_restarts=0)

    def heartbeat(self) -> None:
        pass

    def output(self, stream: str, text: str) -> None:
        print(text, file=sys.stderr if stream == "stderr" else sys.stdout, flush=True)

    def keep_commit(self, index: int, data: bytes, seq: int) -> None:
        pass


def launcher_places(launch: LaunchEnv) -> list[WorkerPlace]:
    per_node = max(launch.local_world_size, 1)
    return [WorkerPlace(r, f"{launch.launcher}-node{r // per_node}", launch.launcher, {"CPU": 1.0}) for r in range(launch.world_size)]
