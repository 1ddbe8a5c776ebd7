"""The driver side of `raylight run`: a torchrun-style script on raylight's engine.

``launch`` runs ``agent_loop`` (``agent.py``) on N raylight workers through
``raylight.Trainer``, so placement, rendezvous, fail-fast resource checks, failure
handling and restarts are the core's. On the driver it prints each rank's output lines
as ``[rank N] line`` (stdout to stdout, stderr to stderr) from the group's polls, names
the ranks that never call ``init_process_group`` (``InitWatch``) and turns the outcome
into an exit code: 0, the failing rank's code, 1 for other failures, 130 for Ctrl-C.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from raylight.base.clock import monotonic
from raylight.base.exceptions import ConfigError, RaylightError, TrainingFailedError
from raylight.config import FailureConfig, RunConfig, ScalingConfig, TrainerConfig, validate
from raylight.launch.agent import CHANNEL_TIMEOUT_S, EVENT, LaunchSpec, ScriptExitError, agent_loop
from raylight.worker.protocol import GroupPoll

INIT_TIMEOUT_S = 300.0  # --init-timeout's default: a rank may take this long to call init after the first did
INTERRUPTED_EXIT_CODE = 130  # a shell's code for SIGINT


class InitTimeoutError(RaylightError):
    """Some ranks called ``torch.distributed.init_process_group`` and others did not
    within ``--init-timeout`` seconds of the first."""


@dataclass
class InitWatch:
    """Which ranks entered ``init_process_group`` and when (driver clock): the ranks
    still missing ``timeout_s`` after the first entered. A script that never calls it on
    any rank (a single-process script) is never missing anything."""

    timeout_s: float
    entered: dict[int, float] = field(default_factory=dict)

    def event(self, rank: int, event: str, now: float) -> None:
        if event == "init_entered":
            self.entered.setdefault(rank, now)

    def reset(self) -> None:
        """The group restarts: its ranks call init again."""
        self.entered.clear()

    def missing(self, now: float, world_size: int) -> list[int]:
        if not self.entered or now - min(self.entered.values()) < self.timeout_s:
            return []
        return [r for r in range(world_size) if r not in self.entered]


class RankOutput:
    """``Trainer(on_poll=...)`` of `raylight run`: prints what each rank's child wrote,
    watches the init calls, counts the group's restarts after failures and lost workers
    (``restarts[0]``, which the agents read as ``TORCHELASTIC_RESTART_COUNT``; a restart
    to grow does not count, as torchrun's membership changes do not), and says when an
    elastic run's group comes back at another size."""

    def __init__(
        self, watch: InitWatch, restarts: list[int], *, out: IO[str], err: IO[str],
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self.watch = watch
        self.restarts = restarts
        self.out = out
        self.err = err
        self.clock = clock
        self.size: int | None = None  # ranks of the group last polled without failures

    def __call__(self, poll: GroupPoll) -> None:
        now = self.clock()
        for p in sorted(poll.polls, key=lambda p: p.rank):
            for stream, text in p.output:
                if stream == EVENT:
                    self.watch.event(p.rank, text, now)
                else:
                    print(f"[rank {p.rank}] {text}", file=self.err if stream == "stderr" else self.out, flush=True)
        if poll.failures:  # the controller restarts the group, or gives up
            self.restarts[0] += 1
            self.watch.reset()
            return
        if self.size is not None and len(poll.polls) != self.size:
            print(f"raylight run: the scripts restarted with WORLD_SIZE={len(poll.polls)} (was {self.size})", file=self.err, flush=True)
        self.size = len(poll.polls)
        missing = self.watch.missing(now, len(poll.polls))
        if missing:
            called = sorted(self.watch.entered)
            raise InitTimeoutError(
                f"rank(s) {', '.join(map(str, missing))} did not call torch.distributed.init_process_group "
                f"within --init-timeout={self.watch.timeout_s:g}s of rank(s) {', '.join(map(str, called))} "
                "calling it; every rank of a distributed script must call it (raise --init-timeout if "
                "some ranks only start slowly)"
            )


def launch(
    target: str,
    args: list[str] | tuple[str, ...] = (),
    *,
    module: bool = False,
    num_workers: int | tuple[int, int] = 1,
    cpus: float = 1.0,
    gpus: float = 0.0,
    address: str | None = None,
    max_failures: int = 0,
    init_timeout_s: float = INIT_TIMEOUT_S,
    name: str | None = None,
    storage_path: str | None = None,
    verbose: bool | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    resize_interval_s: float | None = None,
    channel_timeout_s: float = CHANNEL_TIMEOUT_S,
    resume: bool = False,
) -> int:
    """Run ``python TARGET ARGS`` (``module``: ``python -m TARGET ARGS``) on
    ``num_workers`` raylight workers as torchrun would run it; returns the exit code.
    ``resume`` (``--resume``): continue run ``name`` from its last committed checkpoint,
    which ``raylight.run_context().load_checkpoint()`` returns; a run without one starts
    from scratch (as ``RAYLIGHT_RESUME=1``, which ``raylight submit`` sets, still does).

    Raises ConfigError (and the core's InsufficientResourcesError,
    ClusterConnectionError) for what the user must fix; InitTimeoutError and the core's
    TrainingFailedError for failures other than a script's exit code.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    target = _check_target(target, module)
    if init_timeout_s <= 0:
        raise ConfigError(f"--init-timeout must be > 0 seconds, got {init_timeout_s:g}")
    if not channel_timeout_s > 0 or channel_timeout_s == float("inf"):
        raise ConfigError(f"--channel-timeout must be a finite number of seconds > 0, got {channel_timeout_s:g}")
    if resize_interval_s is not None and (resize_interval_s <= 0 or not isinstance(num_workers, tuple)):
        raise ConfigError(
            f"--resize-interval must be > 0 seconds, got {resize_interval_s:g}" if resize_interval_s <= 0
            else "--resize-interval is for an elastic run: give -n MIN:MAX"
        )
    if resume and not name:
        raise ConfigError("--resume continues the run of that name: give it with --name NAME")
    from raylight.driver.job_env import run_name

    name = run_name(name) or _default_name()  # a submitted job's name wins (driver/job_env.py)
    config = _config(
        num_workers=num_workers, cpus=cpus, gpus=gpus, address=address, max_failures=max_failures, name=name,
        storage_path=storage_path, verbose=verbose, resize_interval_s=resize_interval_s, resume=resume,
    )
    spec = LaunchSpec(
        target=target, args=tuple(args), module=module, cwd=os.getcwd(), run_name=name, max_restarts=max_failures,
        channel_timeout_s=channel_timeout_s,
    )
    from raylight.driver.trainer import Trainer

    restarts = [0]
    on_poll = RankOutput(InitWatch(init_timeout_s), restarts, out=out, err=err)
    trainer = Trainer(
        agent_loop, train_loop_config={"spec": spec, "restarts": restarts}, config=config, on_poll=on_poll,
        loop_stops_on_request=True,  # a notice: the agents tell their scripts (agent.py)
    )
    try:
        result = trainer.fit()
    except KeyboardInterrupt:
        print("raylight run: interrupted; every worker stopped", file=err, flush=True)
        return INTERRUPTED_EXIT_CODE
    except TrainingFailedError as exc:
        cause = exc.__cause__
        if isinstance(cause, ScriptExitError):
            print(f"raylight run: {cause} (after {exc.num_failures} failure(s); --max-failures={max_failures})", file=err, flush=True)
            return cause.code
        if isinstance(cause, ConfigError):  # a rank's own check (its node lacks the script): exit 2, its words
            raise cause from None
        raise
    if result.metrics_history or result.checkpoint is not None:
        print(f"raylight run: reports and checkpoints in {result.path}", file=err, flush=True)
    return 0


def parse_size(text: str) -> int | tuple[int, int]:
    """``-n``: ``N`` or ``MIN:MAX`` workers (at least 1)."""
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) < 1 or parts[0] > parts[-1]:
        raise ConfigError(
            f"-n/--nproc must be a number of workers >= 1 (N) or an elastic range MIN:MAX with "
            f"1 <= MIN <= MAX, got {text!r}"
        )
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def _check_target(target: str, module: bool) -> str:
    if module:
        # Its top-level package only: finding a submodule would import the user's package
        # here, on the driver; the scripts' own `python -m` reports a missing submodule.
        top = target.split(".")[0]
        sys.path.insert(0, os.getcwd())  # where `python -m` looks first
        try:
            found = importlib.util.find_spec(top) if top else None
        except (ImportError, ValueError):
            found = None
        finally:
            sys.path.pop(0)
        if found is None:
            raise ConfigError(f"-m {target}: no module {top!r} importable from {os.getcwd()} or the installed packages")
        return target
    if not os.path.isfile(target):
        raise ConfigError(f"script {target!r} does not exist (or is not a file); give the path of a Python script, or -m MODULE")
    return os.path.abspath(target)


def _config(
    *, num_workers: int | tuple[int, int], cpus: float, gpus: float, address: str | None, max_failures: int,
    name: str, storage_path: str | None, verbose: bool | None, resize_interval_s: float | None = None,
    resume: bool = False,
) -> TrainerConfig:
    if cpus <= 0:
        raise ConfigError(f"--cpus must be > 0 per worker, got {cpus:g}")
    if gpus < 0:
        raise ConfigError(f"--gpus must be >= 0 per worker, got {gpus:g}")
    resources: dict[str, Any] = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    scaling = validate(ScalingConfig, {
        "num_workers": num_workers, "use_gpu": gpus > 0, "resources_per_worker": resources,
        # A worker process serves one script run: never pooled, no warm spare, and an
        # elastic run changes size by restarting its scripts. Its size is as many workers
        # as fit (policy 'max'): scripts report no step times for the goodput model, and
        # each worker's torch threads stay its CPUs (the script's threads are its own).
        "reuse_workers": False, "warm_spare": False, "resize_in_place": False,
        "scaling_policy": "max", "threads_per_worker": max(1, int(cpus)),
        **({"resize_interval_s": resize_interval_s} if resize_interval_s is not None else {}),
    })
    from raylight.driver.job_env import RESUME_ENV

    # RAYLIGHT_RESUME=1 (a submitted job's retry) resumes in the Trainer, as any run's does.
    last = None if os.environ.get(RESUME_ENV) == "1" else _last_checkpoint(storage_path, name, resume=resume)
    run = validate(RunConfig, {
        "name": name, "storage_path": storage_path, "progress": False, "verbose": verbose,
        "resume": resume and last is not None,
    })
    failure = validate(FailureConfig, {"max_failures": max_failures})
    return validate(TrainerConfig, {"scaling": scaling, "run": run, "failure": failure, "address": address})


def _last_checkpoint(storage_path: str | None, name: str, *, resume: bool) -> int | None:
    """The index of run ``name``'s last committed checkpoint, or None. ``resume``
    (``--resume``) continues from it; without one the run starts from scratch (a directory
    whose attempt never checkpointed is replaced), as a retried job's does. Without
    ``resume`` a run that has one is refused, saying how to continue it."""
    from raylight.storage.run_dir import RunStorage, default_storage_path

    storage = RunStorage(f"{(storage_path or default_storage_path()).rstrip('/')}/{name}")
    try:
        committed = storage.list_checkpoints()
    except FileNotFoundError:
        committed = []
    last = committed[-1].index if committed else None
    if resume and last is None:
        print(f"raylight run: --resume: run {name!r} has no checkpoint in {storage.uri} yet; it starts from scratch", file=sys.stderr, flush=True)
    if not resume and last is not None:
        raise ConfigError(
            f"run {name!r} already exists in {storage.uri} (last checkpoint: {last}); pass --resume to continue it "
            "from there, or choose another --name"
        )
    return last


def _default_name() -> str:
    return f"launch-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
