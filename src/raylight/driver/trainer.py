"""Trainer.fit(): wires the config to a controller and a worker group, returns a Result."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raylight.base import verbosity
from raylight.base.clock import monotonic, wall
from raylight.base.cost import CostMeter, Prices, WorkerPlace, prices_from_env
from raylight.base.exceptions import ConfigError
from raylight.config import (
    DDP,
    FSDP,
    AdaptiveConfig,
    DeepSpeed,
    FailureConfig,
    Horovod,
    RunConfig,
    ScalingConfig,
    TrainerConfig,
    validate,
)
from raylight.driver import local, termination
from raylight.driver.job_env import apply_job_env
from raylight.driver.loggers import RunLoggers
from raylight.driver.progress import ProgressDisplay, announce
from raylight.driver.recorder import RunRecorder
from raylight.storage.checkpoint import Checkpoint
from raylight.storage.run_dir import RunStorage, default_storage_path
from raylight.worker import process_group
from raylight.worker.notices import build_watchers
from raylight.worker.process_group import LaunchEnv
from raylight.worker.protocol import GroupPoll

log = logging.getLogger("raylight")


@dataclass
class Result:
    """What a finished run leaves behind.

    Attributes:
        metrics: the last metrics reported by rank 0 (empty if none).
        metrics_history: every report of rank 0, in order (restarts do not repeat rows).
        checkpoint: the last committed checkpoint, or None.
        path: URI of the run directory.
        num_failures: worker failures the run recovered from.
        num_preemptions: nodes the run lost (or let go) after a preemption notice; they
            do not count as failures.
        cost: what the run used (also in ``cost.json``): ``wall_s``, ``worker_seconds``
            by worker shape (``CPU:1``), ``node_seconds`` by node type, ``cost_usd``
            (node-hours x ``RunConfig.prices``; None where a node type has no price, listed
            in ``unpriced``). A resumed run counts its earlier attempts too.
    """

    metrics: dict[str, Any]
    metrics_history: list[dict[str, Any]]
    checkpoint: Checkpoint | None
    path: str
    num_failures: int = 0
    num_preemptions: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] | None = None


class Trainer:
    """Runs ``train_loop(ctx, config)`` data-parallel on Ray workers.

    Args:
        train_loop: the per-worker loop; takes a ``TrainContext`` and, optionally,
            the ``train_loop_config`` dict.
        train_loop_config: passed to the loop as its second argument.
        config: every other setting, validated (see ``TrainerConfig``).
        on_report: called on the driver after each of rank 0's reports is recorded, with
            its metrics and the checkpoint it committed (or None); Ray Tune integration
            forwards reports to ``ray.tune.report`` this way.
        resume_from: a checkpoint (e.g. from another run, or a Tune trial's) that a new
            run starts from, as if it had committed it itself.
        on_poll: called on the driver after each poll of the workers with the
            ``GroupPoll`` (``raylight run`` prints its ranks' output this way); an
            exception it raises ends the run.
        max_failures_setting: where the product that runs this trainer sets
            ``FailureConfig.max_failures`` (``backend.trainer.max_failures`` for a
            declarative run): the setting a failure's message says to raise.
        loop_stops_on_request: the loop stops itself at a boundary of its own when the
            driver asks (``raylight run``'s agent: its script checkpoints and exits), so
            a run of fixed size takes a snapshot on a notice as an elastic one does.
    """

    def __init__(
        self,
        train_loop: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        config: TrainerConfig | None = None,
        on_report: Callable[[dict[str, Any], Checkpoint | None], None] | None = None,
        resume_from: Checkpoint | None = None,
        on_poll: Callable[[GroupPoll], None] | None = None,
        max_failures_setting: str | None = None,
        loop_stops_on_request: bool = False,
    ) -> None:
        if not callable(train_loop):
            raise TypeError(f"train_loop must be callable, got {type(train_loop).__name__}")
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(
                f"the loop's config (fit(config=...), train_loop_config) must be a dict, got "
                f"{type(train_loop_config).__name__}"
            )
        self.train_loop = train_loop
        self.train_loop_config = dict(train_loop_config or {})
        # A job from `raylight submit` bounds the run and names it (job_env's rule).
        self.config = apply_job_env(config or TrainerConfig())
        self.on_report = on_report
        self.resume_from = resume_from
        self.on_poll = on_poll
        self.max_failures_setting = max_failures_setting
        self.loop_stops_on_request = loop_stops_on_request

    def fit(self) -> Result:
        run = self.config.run
        verbosity.apply(run.verbose)  # before Ray starts: its logging level is set then
        name = run.name or _default_name()
        storage = RunStorage(f"{(run.storage_path or default_storage_path()).rstrip('/')}/{name}")
        recorder = RunRecorder(
            storage,
            checkpoints_to_keep=run.checkpoints_to_keep,
            on_record=self.on_report,
            lease_timeout_s=run.lease_timeout_s,
            loggers=RunLoggers(run.loggers, storage, name=name, resume=run.resume) if run.loggers else None,
        )
        resolved = {
            **self.config.model_dump(),
            "run": {**run.model_dump(), "name": name},
            "train_loop_config": _describe(self.train_loop_config),
        }
        if self.resume_from is not None and run.resume:
            raise ValueError("pass either resume_from or RunConfig.resume=True, not both")
        try:  # the workers build them; a bad name is the driver's config error
            build_watchers(self.config.failure.preemption_notices)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        check_strategy_config(self.config.scaling.strategy)
        if self.config.scaling.sharded_checkpoints and storage.uri.startswith("memory://"):
            raise ConfigError(
                f"RunConfig.storage_path {storage.uri.rsplit('/', 1)[0]!r} is this process's memory, "
                f"which the workers of a sharded run (strategy {self.config.scaling.strategy_name!r}) "
                "cannot write their checkpoint shards to; use a directory or an object store, or "
                "checkpoint through the driver with strategy=raylight.FSDP(checkpoint='full')"
            )
        launch = self._launched()
        leader = launch is None or launch.rank == 0  # the process that records the run
        on_ray = self.config.scaling.num_workers != 0 and launch is None
        if on_ray:
            from raylight.driver import runtime

            if runtime.would_start_embedded(self.config.address):  # before starting Ray
                from raylight.worker_group.placement import check_embedded

                scaling = self.config.scaling
                check_embedded(scaling.min_workers, scaling.worker_resources(), scaling.placement, runtime.local_capacity())
        # Checks the run directory and, resuming, takes its lease: a second driver is
        # refused before it starts anything. A new run's directory appears only once
        # training starts.
        prices = Prices(run.prices if run.prices is not None else prices_from_env(os.environ) or {})
        if launch is not None and not leader:
            return self._fit_launched(launch, None, storage)
        recorder.open(resolved, resume=run.resume, start_from=self.resume_from)
        meter = CostMeter(monotonic(), previous=recorder.previous_cost() if run.resume else None)
        resizes: list[dict[str, Any]] = []
        try:
            embedded = False
            if on_ray:
                if runtime.would_start_embedded(self.config.address):
                    announce("starting Ray (a local cluster on this machine)...", enabled=run.progress)
                embedded = runtime.connect(
                    self.config.address, connect_timeout_s=self.config.failure.connect_timeout_s
                ).embedded
            # Lines, not a live display, where the loop runs in this process (a debugger may
            # stop it) or a launcher's ranks share the terminal.
            in_driver = launch is not None or self.config.scaling.num_workers == 0
            with ProgressDisplay(enabled=run.progress, live=not in_driver) as display:
                if launch is not None:
                    meter.observe(monotonic(), local.launcher_places(launch))
                    launched = self._fit_launched(launch, recorder, storage, display)
                    num_failures, num_preemptions = launched.num_failures, 0
                elif self.config.scaling.num_workers == 0:
                    meter.observe(monotonic(), [WorkerPlace(0, "local", "local", {"CPU": 1.0})])
                    local.fit_in_process(self.train_loop, self.train_loop_config, self.config, recorder, display)
                    num_failures, num_preemptions = 0, 0
                else:
                    num_failures, num_preemptions = self._fit_on_ray(
                        recorder, name, display, embedded=embedded, resizes=resizes, meter=meter
                    )
        except BaseException as exc:
            self._record_cost(recorder, meter, prices)
            recorder.close(exc)
            if termination.received() and not isinstance(exc, termination.Terminated):
                # The run was stopping for a SIGTERM and something failed on the way (the
                # cluster may be going too): the exit code still says "terminated".
                log.warning("while stopping for SIGTERM: %s: %s", type(exc).__name__, exc)
                raise termination.Terminated() from exc
            raise
        cost = self._record_cost(recorder, meter, prices)
        recorder.close()
        return Result(
            metrics=recorder.history[-1] if recorder.history else {},
            metrics_history=list(recorder.history),
            checkpoint=recorder.latest,
            path=recorder.path,
            num_failures=num_failures,
            num_preemptions=num_preemptions,
            config=resolved,
            resizes=resizes,
            cost=cost,
        )

    def _record_cost(self, recorder: RunRecorder, meter: CostMeter, prices: Prices) -> dict[str, Any]:
        """The run ended: stop the meter, write cost.json (and the trace's cost row)."""
        now = monotonic()
        meter.stop(now)
        cost = meter.summary(now, prices)
        try:
            recorder.write_cost(cost, trace=self.config.adaptive is not None or self.config.scaling.elastic)
        except Exception as exc:  # the run's own outcome matters more than its bill
            log.warning("could not write the run's cost to %s: %s", recorder.path, exc)
        return cost

    def _fit_on_ray(
        self,
        recorder: RunRecorder,
        name: str,
        display: ProgressDisplay,
        *,
        embedded: bool,
        resizes: list[dict[str, Any]],
        meter: CostMeter,
    ) -> tuple[int, int]:
        from raylight.driver.controller import Controller, FailurePolicy, RunTelemetry, State
        from raylight.driver.plots import plot_adaptive, why_no_plot
        from raylight.worker.context import run_worker_loop
        from raylight.worker_group.ray_group import RayWorkerGroup

        cfg = self.config
        adaptive_run = cfg.adaptive is not None or cfg.scaling.elastic
        group = RayWorkerGroup(
            self.train_loop,
            self.train_loop_config,
            entry=run_worker_loop,
            scaling=cfg.scaling,
            failure=cfg.failure,
            run_name=name,
            embedded=embedded,
            adaptive=adaptive_spec(cfg.adaptive) if adaptive_run else None,
        )
        policy: Any = None

        def trace(row: dict[str, Any]) -> None:
            recorder.trace({"time": wall(), **row}, policy.state_dict() if adaptive_run else None)

        def on_poll(poll: GroupPoll, c: Any) -> None:
            display.update(
                poll, num_workers=c.num_workers, num_restarts=c.num_restarts,
                **policy.display_fields(c.num_workers, c.threads),
            )
            if self.on_poll is not None:
                self.on_poll(poll)

        share = cluster_share(cfg, name, event=lambda row: telemetry.event(row))
        # A run the scheduler shares writes its allocations to adaptive.jsonl, adaptive or not.
        telemetry = RunTelemetry(cost=meter, trace=trace if adaptive_run or share is not None else None, on_poll=on_poll)
        policy = build_scaling_policy(
            cfg, trace=telemetry.trace_row, saved=recorder.engine_state() if cfg.run.resume else None,
            loop_stops_on_request=self.loop_stops_on_request, share=share,
        )
        failure = FailurePolicy(
            cfg.failure.max_failures, backoff_s=cfg.failure.restart_backoff_s,
            backoff_max_s=cfg.failure.restart_backoff_max_s, max_preemptions=cfg.failure.max_preemptions,
            rendezvous_retries=cfg.failure.rendezvous_retries,
            **({"setting": self.max_failures_setting, "advice": self.max_failures_setting} if self.max_failures_setting else {}),
        )
        controller = Controller(
            group=group, recorder=recorder, failure_policy=failure, scaling_policy=policy,
            telemetry=telemetry, poll_interval_s=cfg.failure.poll_interval_s, share=share,
        )
        low, high = cfg.scaling.min_workers, cfg.scaling.max_workers
        display.phase(f"starting {high if low == high else f'{low} to {high}'} workers...")
        try:
            controller.run()  # shuts the group down however it ends, Ctrl-C included
        finally:
            resizes.extend(controller.resizes)
            if adaptive_run and (png := plot_adaptive(recorder.trace_rows)) is not None:
                recorder.storage.write_bytes("adaptive.png", png)
            elif adaptive_run and controller.state is State.FINISHED and (why := why_no_plot(recorder.trace_rows)):
                display.message(why)
                log.debug(why)
        if controller.state is State.ERRORED:
            assert controller.error is not None
            raise controller.error
        return controller.num_failures, controller.num_preemptions

    def _launched(self) -> LaunchEnv | None:
        """The external launcher's group this run joins (``ScalingConfig.launcher``), or None."""
        if self.config.scaling.launcher == "ignore":
            return None
        launch = process_group.detect()
        if launch is None:
            return None
        if self.config.adaptive is not None or self.config.scaling.elastic:
            raise ConfigError(
                f"this process was started by {launch.launcher} ({launch.world_size} processes), whose size is "
                "fixed: adaptive and elastic training need raylight's own Ray workers. Run without the "
                "launcher (python script.py), or drop adaptive= and give a fixed num_workers "
                "(or ScalingConfig.launcher='ignore' to start Ray workers from every process)"
            )
        if launch.rank == 0:
            log.info(
                "started by %s: %d processes join its group (num_workers=%s is not used)",
                launch.launcher, launch.world_size, self.config.scaling.num_workers,
            )
        return launch

    def _fit_launched(
        self, launch: LaunchEnv, recorder: RunRecorder | None, storage: RunStorage, display: ProgressDisplay | None = None
    ) -> Result:
        history, checkpoint = local.fit_launched(
            self.train_loop, self.train_loop_config, self.config, launch, recorder, display
        )
        return Result(metrics=history[-1] if history else {}, metrics_history=history, checkpoint=checkpoint, path=storage.uri)

def check_strategy_config(strategy: Any) -> None:
    """What the driver can check of the strategy before Ray starts: a DeepSpeed JSON
    config's keys, against the DeepSpeed installed here (a driver without DeepSpeed leaves
    it to the workers, which build the engine)."""
    if not isinstance(strategy, DeepSpeed) or not strategy.config_dict:
        return
    try:
        from raylight.worker.strategies.deepspeed_keys import check_keys
    except ImportError:
        return
    try:
        check_keys(strategy.config_dict)
    except ImportError:
        log.info("DeepSpeed is not installed where the driver runs: the workers check the config's keys")
    except ValueError as exc:
        raise ConfigError(f"strategy DeepSpeed(config=...): {exc}") from None


def engine_settings(scaling: ScalingConfig, adaptive: AdaptiveConfig | None) -> Any:
    """The adaptive engine's settings from the run's config (every default's one home is
    the schema). Without ``adaptive`` (an elastic-only run) the global batch stays fixed,
    but the throughput model is still fitted, with the schema's profile settings."""
    from raylight.adaptive.engine import EngineSettings

    a = adaptive or AdaptiveConfig()
    return EngineSettings(
        adaptive=adaptive is not None,
        max_batch_size=a.max_batch_size,
        local_batch_bounds=a.local_batch_bounds,
        accumulation=adaptive is not None and a.accumulation,
        gain_threshold=a.gain_threshold,
        min_profile_steps=a.min_profile_steps,
        profile_memory_steps=a.profile_memory_steps,
        scaling_policy=scaling.scaling_policy,
        utility_threshold=scaling.utility_threshold,
        resize_hysteresis=scaling.resize_hysteresis,
        resize_horizon_s=scaling.resize_horizon_s,
    )


def adaptive_spec(adaptive: AdaptiveConfig | None) -> Any:
    """What a worker's context needs of the adaptive settings. None (an elastic run
    without ``adaptive=``): the schema's defaults drive the step sync, and the batch size
    and LR stay as the user set them."""
    from raylight.adaptive.plan import AdaptiveSpec

    settings = adaptive or AdaptiveConfig()
    return AdaptiveSpec(
        adaptive=adaptive is not None,
        lr_rule=settings.lr_rule if adaptive else "none",
        lr_warmup_steps=settings.lr_warmup_steps if adaptive else 0.0,
        noise_smoothing=settings.noise_smoothing,
        control_interval_steps=settings.control_interval_steps,
    )


def cluster_share(config: TrainerConfig, name: str, *, event: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """The run's part in the cluster's raylight scheduler, or None where none runs (the
    run then trains as it would without one). An elastic run registers its (min, max)
    workers; any other its one size, which it waits for."""
    from raylight.driver.scheduler_link import find_link

    link = find_link()
    if link is None:
        return None
    from raylight.driver.controller.cluster_share import ClusterShare

    scaling = config.scaling
    return ClusterShare(
        link, name, fixed=not scaling.elastic, min_workers=scaling.min_workers if scaling.elastic else scaling.max_workers,
        max_workers=scaling.max_workers, resources=scaling.worker_resources(), weight=scaling.scheduler_weight,
        event=event,
    )


def build_scaling_policy(
    config: TrainerConfig, *, trace: Callable[[dict[str, Any]], None] | None = None, saved: dict[str, Any] | None = None,
    loop_stops_on_request: bool = False, share: Any = None,
) -> Any:
    """The run's scaling policy: fixed for a run of one size without ``adaptive=``
    (snapshots on notices where the loop stops on request), else the goodput policy over
    an adaptive engine (restored from ``saved``, its state in a resumed run's directory)."""
    from raylight.driver.controller import FixedScalingPolicy, GoodputScalingPolicy, ScalingSettings

    scaling, adaptive = config.scaling, config.adaptive
    if adaptive is None and not scaling.elastic:
        return FixedScalingPolicy(scaling.max_workers, scaling.worker_threads(), snapshot_on_notice=loop_stops_on_request)
    from raylight.adaptive.engine import AdaptiveEngine

    engine = AdaptiveEngine(engine_settings(scaling, adaptive))
    if saved is not None:
        engine.load_state_dict(saved)
    fixed_threads = scaling.threads_per_worker is not None or not scaling.elastic
    settings = ScalingSettings(
        elastic=scaling.elastic,
        min_workers=scaling.min_workers,
        max_workers=scaling.max_workers,
        threads_per_worker=scaling.worker_threads(),
        thread_budget=None if fixed_threads else scaling.max_workers * scaling.worker_resources().get("CPU", 1.0),
        decision_interval_s=(adaptive or AdaptiveConfig()).decision_interval_s,
        resize_interval_s=scaling.resize_interval_s,
        autoscale=scaling.autoscale,
        resize_in_place=scaling.resizes_in_place,
    )
    return GoodputScalingPolicy(engine, settings, trace=trace, share=share)


def _describe(value: Any) -> Any:
    """``value`` for config.json: plain data as is, arrays and objects by their shape."""
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value] if len(value) <= 100 else f"<{type(value).__name__} of {len(value)}>"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} shape={tuple(shape)} dtype={getattr(value, 'dtype', '?')}>"
    return f"<{type(value).__name__}>"


def _default_name() -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"run-{stamp}-{uuid.uuid4().hex[:6]}"


def fit(
    train_loop: Callable[..., Any],
    *,
    config: dict[str, Any] | None = None,
    num_workers: int | tuple[int, int],
    adaptive: AdaptiveConfig | None = None,
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    placement: str = "PACK",
    strategy: str | DDP | FSDP | DeepSpeed | Horovod = "ddp",
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = 0,
    resume: bool = False,
    address: str | None = None,
    progress: bool = True,
    verbose: bool | None = None,
    loggers: list[Any] | None = None,
    prices: dict[str, float] | None = None,
) -> Result:
    """Train ``train_loop`` on ``num_workers`` data-parallel workers and return a Result.

    A thin convenience over ``Trainer``: each keyword is the setting of the same name
    in ``TrainerConfig`` (``scaling``, ``run``, ``failure``, ``adaptive``).
    ``num_workers=0`` runs the loop in this process without Ray; ``(min, max)`` makes the
    job elastic. ``adaptive=AdaptiveConfig(...)`` chooses batch size and learning rate
    online. ``strategy`` is ``"ddp"`` (default) or ``DDP(...)``, ``"fsdp"``, ``"deepspeed"``,
    ``FSDP(...)`` or ``DeepSpeed(...)`` (sharded), ``"horovod"`` or ``Horovod(...)`` (Horovod's
    optimizer).
    ``progress=False`` hides the progress display; ``verbose=True`` shows Ray's own logs
    too (default: ``RAYLIGHT_VERBOSE``). ``loggers=["tensorboard", {"type": "mlflow", ...},
    ...]`` writes every report to experiment loggers (``RunConfig.loggers``). ``prices={node_type: USD/h}`` prices the run
    (``Result.cost``).
    """
    trainer_config = fit_config(
        num_workers=num_workers, adaptive=adaptive, use_gpu=use_gpu, resources_per_worker=resources_per_worker,
        placement=placement, strategy=strategy, storage_path=storage_path, name=name, max_failures=max_failures,
        resume=resume, address=address, progress=progress, verbose=verbose, loggers=loggers, prices=prices,
    )
    return Trainer(train_loop, train_loop_config=config, config=trainer_config).fit()


def fit_config(
    *,
    num_workers: int | tuple[int, int],
    adaptive: AdaptiveConfig | None = None,
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    placement: str = "PACK",
    strategy: str | DDP | FSDP | DeepSpeed | Horovod = "ddp",
    storage_path: str | None = None,
    name: str | None = None,
    max_failures: int = 0,
    resume: bool = False,
    address: str | None = None,
    progress: bool = True,
    verbose: bool | None = None,
    loggers: list[Any] | None = None,
    prices: dict[str, float] | None = None,
) -> TrainerConfig:
    """``fit``'s keywords as the validated ``TrainerConfig`` it trains with (for a product
    that builds its ``Trainer`` itself)."""
    settings = dict(
        scaling=_scaling(num_workers, use_gpu, resources_per_worker, placement, strategy),
        run=validate(
            RunConfig,
            {
                "storage_path": storage_path,
                "name": name,
                "resume": resume,
                "progress": progress,
                "verbose": verbose,
                "loggers": loggers,
                "prices": prices,
            },
        ),
        failure=validate(FailureConfig, {"max_failures": max_failures}),
        adaptive=adaptive,
        address=address,
    )
    return validate(TrainerConfig, settings)  # the checks across sections


def _scaling(
    num_workers: int | tuple[int, int], use_gpu: bool, resources_per_worker: dict[str, float] | None, placement: str,
    strategy: str | DDP | FSDP | DeepSpeed | Horovod,
) -> ScalingConfig:
    """``fit``'s ScalingConfig from its keywords."""
    return validate(
        ScalingConfig,
        {
            "num_workers": num_workers,
            "use_gpu": use_gpu,
            "resources_per_worker": resources_per_worker,
            "placement": placement,
            "strategy": strategy,
        },
    )


def prestart_workers(
    *,
    num_workers: int | tuple[int, int],
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    placement: str = "PACK",
    strategy: str | DDP | FSDP | DeepSpeed | Horovod = "ddp",
    address: str | None = None,
    modules: tuple[str, ...] = (),
) -> int:
    """Start the worker processes of the next ``fit`` with these keywords now, on this
    driver's node, and return once they are asked for: they start and import torch (and
    ``modules``) while this process does other work (loading its data), and that ``fit``
    takes them as warm workers. Connects to Ray as ``fit`` does (``address``; the embedded
    local Ray by default), which takes seconds the first time. Returns how many it
    started: none where the fit's workers would not be pooled (GPU workers), where idle
    workers of that shape are already kept, or where this node cannot hold them all. They
    are idle workers (``ScalingConfig.reuse_workers``): no Ray resources, gone after
    ``idle_worker_timeout_s`` if no fit takes them."""
    from raylight.driver import runtime
    from raylight.worker_group.warm import prestart_workers as prestart

    scaling = _scaling(num_workers, use_gpu, resources_per_worker, placement, strategy)
    runtime.connect(address)
    return prestart(scaling, modules=modules)
