"""What a job submitted by ``raylight submit`` tells its runs, through its environment.

``raylight submit`` is a process boundary: the job's driver (and every Ray worker of the
job) gets these variables in its runtime environment, and ``Trainer`` applies them to
its config in one place, ``apply_job_env``. The rule:

- ``RAYLIGHT_MAX_WORKERS=M`` (``--max-workers``): the elastic upper bound. An elastic
  run's ``num_workers=(min, max)`` becomes ``(min(min, M), M)``; a fixed-size run keeps
  its size when it is at most M and is capped at M (with a warning) otherwise; a run in
  the driver's process (``num_workers=0``) is left alone.
- ``RAYLIGHT_CPUS_PER_WORKER=C`` / ``RAYLIGHT_GPUS_PER_WORKER=G`` (``--cpus`` /
  ``--gpus``): ``resources_per_worker`` CPU / GPU, replacing what the script set (with a
  warning when it differs); G > 0 turns ``use_gpu`` on.
- ``RAYLIGHT_RUN_NAME=NAME`` (``--name``): ``RunConfig.name``, over a name the script set
  (with a warning naming both): a retried or resumed job finds its run by the job's name,
  so that name must win. It names the runs of the job's driver process; a run inside a
  Ray actor (a Tune trial's, which raylight names per trial) keeps its own name.
- ``RAYLIGHT_RESUME=1`` (``--resume``, and every retry): ``RunConfig.resume=True`` when
  the run directory exists and holds a committed checkpoint, so a resubmitted job
  continues its run from there; without one the run starts (again) from scratch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from raylight.base.exceptions import ConfigError
from raylight.config import RunConfig, ScalingConfig, TrainerConfig, validate

log = logging.getLogger("raylight")

MAX_WORKERS_ENV = "RAYLIGHT_MAX_WORKERS"
CPUS_ENV = "RAYLIGHT_CPUS_PER_WORKER"
GPUS_ENV = "RAYLIGHT_GPUS_PER_WORKER"
RUN_NAME_ENV = "RAYLIGHT_RUN_NAME"
RESUME_ENV = "RAYLIGHT_RESUME"
JOB_ENV_VARS = (MAX_WORKERS_ENV, CPUS_ENV, GPUS_ENV, RUN_NAME_ENV, RESUME_ENV)


def _number(environ: Mapping[str, str], key: str, kind: type[int] | type[float]) -> float | None:
    raw = environ.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if value < 0 or (kind is int and value < 1):
        raise ConfigError(
            f"environment variable {key}={raw!r} (set by raylight submit) must be a "
            f"{'positive whole' if kind is int else 'non-negative'} number; fix the submit flag"
        )
    return value


def apply_job_env(config: TrainerConfig, environ: Mapping[str, str] | None = None) -> TrainerConfig:
    """``config`` with the bounds, name and resume flag of a submitted job applied
    (the module's docstring has the rule). Without those variables: ``config`` itself."""
    env = os.environ if environ is None else environ
    if not any(env.get(k) for k in JOB_ENV_VARS):
        return config
    scaling = _scaling(config.scaling, env)
    run = _run(config.run, env)
    if scaling is config.scaling and run is config.run:
        return config
    return validate(TrainerConfig, {**dict(config), "scaling": scaling, "run": run})


def run_name(name: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The run's name: the job's (``RAYLIGHT_RUN_NAME``) where there is one, over ``name``
    (the script's ``RunConfig.name`` or ``raylight run --name``, with a warning naming
    both); otherwise ``name``."""
    env = os.environ if environ is None else environ
    job_name = env.get(RUN_NAME_ENV) or None
    if job_name is None or (name is not None and _in_ray_actor()):
        return name
    if name is not None and name != job_name:
        log.warning(
            "the script names its run %r but its job names it %r (raylight submit --name, %s): "
            "the job's name is used, so that a resubmitted or resumed job finds the run",
            name, job_name, RUN_NAME_ENV,
        )
    return job_name


def _in_ray_actor() -> bool:
    """Whether this process is a Ray actor: a Tune trial's (its runs are named per trial;
    the job's name would give every trial the same run), not the job's driver."""
    import sys

    if "ray" not in sys.modules:  # never imported: not a Ray worker
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _scaling(scaling: ScalingConfig, env: Mapping[str, str]) -> ScalingConfig:
    update: dict[str, object] = {}
    limit = _number(env, MAX_WORKERS_ENV, int)
    if limit is not None and scaling.num_workers != 0:
        m = int(limit)
        if scaling.elastic:
            lo, hi = scaling.min_workers, scaling.max_workers
            if lo > m:
                log.warning("%s=%d is below the run's min_workers=%d: the run's size is now (%d, %d)", MAX_WORKERS_ENV, m, lo, m, m)
            update["num_workers"] = (min(lo, m), m)
            if hi != m:
                log.info("elastic run: max_workers %d -> %d (%s)", hi, m, MAX_WORKERS_ENV)
        elif scaling.max_workers > m:
            log.warning(
                "the run asks for %d workers but its job allows at most %s=%d: capped at %d",
                scaling.max_workers, MAX_WORKERS_ENV, m, m,
            )
            update["num_workers"] = m
    resources = dict(scaling.resources_per_worker or {})
    for key, name in ((CPUS_ENV, "CPU"), (GPUS_ENV, "GPU")):
        value = _number(env, key, float)
        if value is None:
            continue
        if name in resources and resources[name] != value:
            log.warning("resources_per_worker %s=%g replaced by %s=%g (the job's setting)", name, resources[name], key, value)
        resources[name] = value
    if resources != (scaling.resources_per_worker or {}):
        update["resources_per_worker"] = resources
        if resources.get("GPU", 0) > 0:
            update["use_gpu"] = True
    if not update:
        return scaling
    capped = validate(ScalingConfig, {**dict(scaling), **update}, prefix="scaling")
    return capped.for_processes_of(scaling.process_kind)  # not a field: carried over


def _run(run: RunConfig, env: Mapping[str, str]) -> RunConfig:
    update: dict[str, object] = {}
    name = run_name(run.name, env)
    if name != run.name:
        update["name"] = name
    if env.get(RESUME_ENV) == "1" and not run.resume and _has_checkpoint(run, update.get("name") or run.name):
        update["resume"] = True
    if not update:
        return run
    return validate(RunConfig, {**dict(run), **update}, prefix="run")


def _has_checkpoint(run: RunConfig, name: object) -> bool:
    if not isinstance(name, str):
        return False
    from raylight.storage.run_dir import RunStorage, default_storage_path

    storage = RunStorage(f"{(run.storage_path or default_storage_path()).rstrip('/')}/{name}")
    try:
        return bool(storage.list_checkpoints())
    except FileNotFoundError:
        return False
