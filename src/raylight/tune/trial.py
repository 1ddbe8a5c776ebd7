"""A Ray Tune trial that is itself a distributed raylight run.

The trial function (Tune's trainable, running in the trial's head bundle) builds a
``raylight.Trainer`` whose worker group places its workers in the trial's placement
group. Each report of rank 0 goes to ``ray.tune.report`` from the trial driver, with the
committed checkpoint converted to a ``ray.tune.Checkpoint``; a trial that Tune restores
(PBT's exploit, a resumed experiment) starts from the Tune checkpoint converted back.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from raylight.config import DDP, FSDP, DeepSpeed, Horovod, TrainerConfig
from raylight.storage.checkpoint import (
    INTERNAL_METRIC,
    LIGHTNING_CKPT_KEY,
    LIGHTNING_CKPT_METRIC,
    Checkpoint,
)
from raylight.storage.run_dir import STATE_FILE, TUNE_META_FILE, write_committed
from raylight.tune.resources import get_tune_resources

log = logging.getLogger("raylight")


def to_tune_checkpoint(checkpoint: Checkpoint, directory: str) -> Any:
    """Write ``checkpoint`` into ``directory`` (a sharded one's shard files, the state
    file, its metadata last) and return it as a ``ray.tune.Checkpoint``."""
    from ray.tune import Checkpoint as TuneCheckpoint

    meta = json.dumps(checkpoint.metadata, default=str).encode()
    files: Any = [(STATE_FILE, checkpoint.to_bytes())]
    if checkpoint.sharded:
        source = checkpoint._shard_path()
        shards = ((name, _read(f"{source}/{name}")) for name in checkpoint.metadata.get("files", {}))
        files = itertools.chain(shards, files)
    write_committed(LocalFileSystem(), directory, files, (TUNE_META_FILE, meta))
    return TuneCheckpoint.from_directory(directory)


def _read(uri: str) -> bytes:
    with fsspec.open(uri, "rb") as f:
        return f.read()


def from_tune_checkpoint(checkpoint: Any) -> Checkpoint:
    """A raylight ``Checkpoint`` (loaded with ``weights_only=True``) from a
    ``ray.tune.Checkpoint`` written by ``to_tune_checkpoint``. A sharded one keeps its
    shards where Tune stores them when that is a local (or shared) directory; from remote
    storage they are downloaded to a local directory first."""
    if getattr(getattr(checkpoint, "filesystem", None), "type_name", "local") == "local":
        return _from_directory(checkpoint.path, checkpoint.path)
    with checkpoint.as_directory() as d:
        found = _from_directory(d, checkpoint.path)
    if found.sharded:
        # every worker reads its shards from where Tune keeps them: a directory downloaded
        # here would be on this node alone (and never removed)
        uri = _fsspec_uri(checkpoint)
        if uri is None:  # a filesystem fsspec cannot name: a copy here, for workers on this node
            uri = tempfile.mkdtemp(prefix="raylight-tune-restore-")
            checkpoint.to_directory(uri)
        found.path = uri
    return found


_PYARROW_SCHEMES = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}  # pyarrow's type_name -> fsspec's


def _fsspec_uri(checkpoint: Any) -> str | None:
    """The fsspec URI of a ``ray.tune.Checkpoint`` on remote storage (pyarrow's S3, GCS,
    HDFS or Azure filesystem, or an fsspec filesystem Tune was given through pyarrow's
    ``FSSpecHandler``); None for another kind."""
    fs = checkpoint.filesystem
    inner = getattr(getattr(fs, "handler", None), "fs", None)
    if isinstance(inner, fsspec.AbstractFileSystem):
        return str(inner.unstrip_protocol(checkpoint.path))
    scheme = _PYARROW_SCHEMES.get(getattr(fs, "type_name", ""))
    return f"{scheme}://{checkpoint.path.lstrip('/')}" if scheme else None


def _from_directory(directory: str, name: str) -> Checkpoint:
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        raise ValueError(f"Tune checkpoint {name!r} holds no raylight state ({STATE_FILE})")
    with open(path, "rb") as f:
        data = f.read()
    meta: dict[str, Any] = {}
    if os.path.exists(os.path.join(directory, TUNE_META_FILE)):
        with open(os.path.join(directory, TUNE_META_FILE)) as f:
            meta = json.load(f)
    return Checkpoint(directory, metadata=meta, data=data)


def in_tune_session() -> bool:
    """Whether this code runs in a Ray Tune trial's process."""
    import warnings

    from ray import tune

    with warnings.catch_warnings():  # outside a trial Ray warns and returns None
        warnings.simplefilter("ignore")
        try:
            return tune.get_context().get_trial_id() is not None
        except Exception:
            return False


DEFAULT_CKPT_NAME = "checkpoint.ckpt"


def safe_filename(name: Any) -> str:
    """``name`` (read from a checkpoint's content) as a plain file name inside the
    directory it is written to: a checkpoint's content never chooses a path. Anything
    else (a path, ``..``, an empty or odd name) becomes ``checkpoint.ckpt``."""
    text = name if isinstance(name, str) else ""
    bad = (
        not text or text in (".", "..") or text != os.path.basename(text) or "\\" in text
        or any(ord(c) < 32 for c in text) or len(text.encode()) > 255
    )
    if bad:
        log.warning("checkpoint file name %r is not a plain file name; writing %s", name, DEFAULT_CKPT_NAME)
        return DEFAULT_CKPT_NAME
    return text


class TuneForwarder:
    """``Trainer(on_report=...)`` inside a Tune trial: sends each of rank 0's reports to
    ``ray.tune.report``, its checkpoint as a ``ray.tune.Checkpoint``. A raylight checkpoint
    becomes the state file (``from_tune_checkpoint`` reads it back); one made by
    ``TuneReportCheckpointCallback`` on a worker becomes the Lightning ``.ckpt`` file it
    holds. Reports raylight makes for itself, and its marker metrics, are not sent. A
    checkpoint is staged in a temporary directory of its own, removed once Tune has copied
    it: nothing is left behind, whoever created the forwarder and however the trial ends."""

    def __call__(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> None:
        from ray import tune

        if metrics.get(INTERNAL_METRIC):
            return
        public = {k: v for k, v in metrics.items() if not k.startswith("raylight/")}
        if checkpoint is None:
            tune.report(public)
            return
        staging = tempfile.mkdtemp(prefix="raylight-tune-")
        target = os.path.join(staging, "checkpoint")
        try:
            if metrics.get(LIGHTNING_CKPT_METRIC):
                state = checkpoint.load()  # weights_only
                os.makedirs(target)
                with open(os.path.join(target, safe_filename(state.get("filename"))), "wb") as f:
                    f.write(state[LIGHTNING_CKPT_KEY].numpy().tobytes())
                tune_checkpoint = tune.Checkpoint.from_directory(target)
            else:
                tune_checkpoint = to_tune_checkpoint(checkpoint, target)
            tune.report(public, checkpoint=tune_checkpoint)
        finally:  # Tune has copied it into the trial's storage
            shutil.rmtree(staging, ignore_errors=True)


def run_trial(
    train_loop: Callable[..., Any],
    loop_config: dict[str, Any],
    trainer_config: TrainerConfig,
) -> None:
    """Run one trial from inside Tune: train, forwarding every report to Tune."""
    from ray import tune

    from raylight.driver.trainer import Trainer

    ctx = tune.get_context()
    storage = trainer_config.run.storage_path or ctx.get_trial_dir()
    restored = tune.get_checkpoint()
    run = trainer_config.run.model_copy(
        update={"storage_path": storage, "name": f"raylight-{uuid.uuid4().hex[:8]}", "progress": False}
    )
    cfg = trainer_config.model_copy(update={"run": run})
    Trainer(
        train_loop,
        train_loop_config=loop_config,
        config=cfg,
        on_report=TuneForwarder(),
        resume_from=from_tune_checkpoint(restored) if restored is not None else None,
    ).fit()


def trainable(
    train_loop: Callable[..., Any],
    *,
    num_workers: int = 1,
    use_gpu: bool = False,
    resources_per_worker: dict[str, float] | None = None,
    strategy: str | DDP | FSDP | DeepSpeed | Horovod = "ddp",
    config: TrainerConfig | None = None,
    base_config: dict[str, Any] | None = None,
) -> Any:
    """A Tune trainable (pass it to ``ray.tune.Tuner``) whose every trial trains
    ``train_loop(ctx, config)`` on ``num_workers`` raylight workers.

    Each trial's ``config`` is Tune's sampled config merged over ``base_config``. The
    trial's resources are ``get_tune_resources(...)``: an empty head bundle for the
    trial's driver and one bundle per worker, where the workers are placed. ``config``
    gives every other raylight setting (failures, adaptive, ...); its scaling section is
    replaced by ``num_workers``, ``use_gpu``, ``resources_per_worker`` and ``strategy``
    (``"ddp"``, ``"fsdp"``, ``"deepspeed"``, ``"horovod"``, ``raylight.DDP(...)``,
    ``raylight.FSDP(...)``, ``raylight.DeepSpeed(...)`` or ``raylight.Horovod(...)``).

    With ``tune.TuneConfig(reuse_actors=True)`` a trial runs in the process the previous
    one ran in, on the worker processes that one's finished run left idle: its first step
    comes in a fraction of a second instead of after new processes start (docs/tune.md).
    """
    from ray import tune

    from raylight.config import ScalingConfig, validate

    scaling = validate(
        ScalingConfig,
        {
            "num_workers": num_workers,
            "use_gpu": use_gpu,
            "resources_per_worker": resources_per_worker,
            "strategy": strategy,
        },
    )
    if scaling.elastic or num_workers < 1:
        raise ValueError(f"a Tune trial needs a fixed num_workers >= 1, got {num_workers}")
    given = config or TrainerConfig()
    sections = {name: getattr(given, name) for name in TrainerConfig.model_fields}
    base = validate(TrainerConfig, {**sections, "scaling": scaling})  # the checks across sections
    fixed = dict(base_config or {})

    def raylight_trial(trial_config: dict[str, Any]) -> None:
        run_trial(train_loop, {**fixed, **trial_config}, base)

    per_worker = scaling.worker_resources()
    return tune.with_resources(
        raylight_trial,
        get_tune_resources(num_workers, use_gpu=use_gpu, resources_per_worker=per_worker),
    )
