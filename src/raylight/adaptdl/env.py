"""``adaptdl.env``: where a replica is, from AdaptDL's ``ADAPTDL_*`` variables where they
are set, else from the torchrun variables `raylight run` (or torchrun) sets.

| function | ADAPTDL_ variable | else |
| --- | --- | --- |
| replica_rank | ADAPTDL_REPLICA_RANK | RANK, 0 |
| num_replicas | ADAPTDL_NUM_REPLICAS | WORLD_SIZE, 1 |
| num_nodes | ADAPTDL_NUM_NODES | WORLD_SIZE / LOCAL_WORLD_SIZE, rounded up |
| num_restarts | ADAPTDL_NUM_RESTARTS | TORCHELASTIC_RESTART_COUNT, 0 |
| job_id | ADAPTDL_JOB_ID | TORCHELASTIC_RUN_ID (raylight run's run name), None |
| master_addr, master_port | ADAPTDL_MASTER_ADDR/PORT | MASTER_ADDR/PORT, 0.0.0.0 / 0 |
| checkpoint_path | ADAPTDL_CHECKPOINT_PATH | None (under raylight run: the run's checkpoints) |
| share_path | ADAPTDL_SHARE_PATH | None |
"""

from __future__ import annotations

import math
import os
import tempfile


def _get(name: str, fallback: str | None, default: str | None) -> str | None:
    value = os.environ.get(name)
    if value is None and fallback is not None:
        value = os.environ.get(fallback)
    return default if value is None else value


def _int(name: str, fallback: str | None, default: int) -> int:
    raw = _get(name, fallback, None)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name if name in os.environ else fallback}={raw!r}: expected an integer") from None


def checkpoint_path() -> str | None:
    """The directory of AdaptDL checkpoint files (``ADAPTDL_CHECKPOINT_PATH``), or None.
    Under `raylight run` checkpoints go to the run's directory instead (see
    ``adaptdl.checkpoint``)."""
    return os.environ.get("ADAPTDL_CHECKPOINT_PATH")


def share_path() -> str | None:
    """A directory shared by the replicas (``ADAPTDL_SHARE_PATH``), or None."""
    return os.environ.get("ADAPTDL_SHARE_PATH")


def job_id() -> str | None:
    """The job's name: ``ADAPTDL_JOB_ID``, else the run's (``TORCHELASTIC_RUN_ID``), else None."""
    return _get("ADAPTDL_JOB_ID", "TORCHELASTIC_RUN_ID", None)


def master_addr() -> str:
    return _get("ADAPTDL_MASTER_ADDR", "MASTER_ADDR", "0.0.0.0") or "0.0.0.0"


def master_port() -> int:
    return _int("ADAPTDL_MASTER_PORT", "MASTER_PORT", 0)


def replica_rank() -> int:
    return _int("ADAPTDL_REPLICA_RANK", "RANK", 0)


def num_replicas() -> int:
    return _int("ADAPTDL_NUM_REPLICAS", "WORLD_SIZE", 1)


def num_nodes() -> int:
    if "ADAPTDL_NUM_NODES" in os.environ:
        return _int("ADAPTDL_NUM_NODES", None, 1)
    per_node = max(1, _int("LOCAL_WORLD_SIZE", None, num_replicas()))
    return max(1, math.ceil(num_replicas() / per_node))


def num_restarts() -> int:
    return _int("ADAPTDL_NUM_RESTARTS", "TORCHELASTIC_RESTART_COUNT", 0)


def adaptdl_sched_version() -> str | None:
    return os.environ.get("ADAPTDL_SCHED_VERSION")


def supervisor_url() -> str | None:
    """AdaptDL's scheduler (``ADAPTDL_SUPERVISOR_URL``); raylight has none of its own to give."""
    return os.environ.get("ADAPTDL_SUPERVISOR_URL")


def from_ray() -> bool:
    """False: this is not adaptdl_ray's Tune path (raylight run's group is formed by torch's env://)."""
    return False


def get_tensorboard_dir() -> str:
    """Where to write TensorBoard logs: ``ADAPTDL_TENSORBOARD_LOGDIR`` (joined with the job's
    name where it has one), else a directory under the system's temporary one."""
    base = os.environ.get("ADAPTDL_TENSORBOARD_LOGDIR") or os.path.join(tempfile.gettempdir(), "adaptdl-tensorboard")
    return os.path.join(base, job_id() or "standalone")
