"""``adaptdl.torch`` on raylight: ``init_process_group``, ``AdaptiveDataLoader``,
``AdaptiveDataParallel``, the epoch loop and ``Accumulator`` (docs/adaptdl.md)."""

from __future__ import annotations

import os
import tempfile

import torch.distributed as dist

from raylight.adaptdl import env
from raylight.adaptdl.torch.accumulator import Accumulator
from raylight.adaptdl.torch.data import AdaptiveDataLoader, ElasticSampler, current_dataloader
from raylight.adaptdl.torch.epoch import current_epoch, finished_epochs, remaining_epochs_until
from raylight.adaptdl.torch.parallel import AdaptiveDataParallel


def init_process_group(backend: str, init_method: str | None = None, world_size: int | None = None,
                       rank: int | None = None) -> None:
    """Join the replicas' process group: under `raylight run` (or torchrun) the group of the
    run (``env://``); else AdaptDL's ``ADAPTDL_*`` variables' (or ``init_method``); one
    replica alone forms a group of one on loopback."""
    if dist.is_initialized():
        return
    if env.supervisor_url():
        raise NotImplementedError(
            "ADAPTDL_SUPERVISOR_URL is set: raylight's AdaptDL layer does not join AdaptDL's scheduler; run the script "
            "with `raylight run -n N script.py` (or unset the variable)"
        )
    rank = env.replica_rank() if rank is None else rank
    world_size = env.num_replicas() if world_size is None else world_size
    if init_method is None:
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            init_method = "env://"
        elif world_size == 1:
            init_method = f"file://{tempfile.mkstemp(prefix='adaptdl-group-')[1]}"
        elif env.master_port():
            init_method = f"tcp://{env.master_addr()}:{env.master_port()}"
        else:
            raise ValueError(
                f"init_process_group: {world_size} replicas but no address to meet at; set ADAPTDL_MASTER_ADDR and "
                "ADAPTDL_MASTER_PORT, or run the script with `raylight run -n N script.py`"
            )
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank)


__all__ = [
    "Accumulator", "AdaptiveDataLoader", "AdaptiveDataParallel", "ElasticSampler", "current_dataloader",
    "current_epoch", "finished_epochs", "init_process_group", "remaining_epochs_until",
]
