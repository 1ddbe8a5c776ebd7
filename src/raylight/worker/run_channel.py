"""``raylight.run_context()``: a script started by `raylight run` reports metrics and
commits checkpoints through its agent (the raylight worker that started it) to the
driver's run directory, and loads the last committed checkpoint after a restart.

The channel is a local TCP connection to the agent, authenticated both ways with the
run's key (its address and key are in the child's environment; ``run_wire.connect``). Messages are JSON; a checkpoint
travels as ``torch.save`` bytes and is loaded with ``weights_only=True`` at either end:
nothing is unpickled.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
from typing import Any

from raylight.worker.run_wire import CHANNEL_ENV, KEY_ENV, connect, recv_frame, send_frame


class RunContext:
    """What a script under `raylight run` has of raylight (``raylight.run_context()``).

    Attributes:
        rank, local_rank, world_size, local_world_size: as torchrun sets them.
        restart_count: how many times the group has restarted (0 on the first attempt).
    """

    def __init__(self, address: str, authkey: bytes) -> None:
        self._conn = connect(address, authkey)
        self._lock = threading.Lock()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def report(self, metrics: dict[str, Any], checkpoint: dict[str, Any] | None = None) -> None:
        """Record ``metrics`` (rank 0's go to the run's ``metrics.jsonl``) and, with
        ``checkpoint`` (a dict of tensors, state dicts and plain values), commit it
        atomically in the run directory. Call it on every rank, as ``TrainContext.report``;
        rank 0's checkpoint is the one committed."""
        if not isinstance(metrics, dict):
            raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
        if checkpoint is not None and not isinstance(checkpoint, dict):
            raise TypeError(f"a checkpoint must be a dict of state (e.g. {{'model': model.state_dict()}}), got {type(checkpoint).__name__}")
        payload = None
        if checkpoint is not None and self.rank == 0:
            import torch

            buf = io.BytesIO()
            torch.save(checkpoint, buf)
            payload = buf.getvalue()
        header = {"op": "report", "metrics": _plain(metrics), "checkpoint": checkpoint is not None}
        self._call(header, payload)

    def load_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint this run committed (after a restart with
        ``--max-failures``), as reported; None on a fresh start."""
        reply, payload = self._call({"op": "load"}, None)
        if not reply.get("checkpoint") or payload is None:
            return None
        import torch

        try:
            loaded: dict[str, Any] = torch.load(io.BytesIO(payload), weights_only=True)
        except pickle.UnpicklingError as exc:
            from raylight.storage.checkpoint import refused_pickle

            raise pickle.UnpicklingError(refused_pickle("the checkpoint the agent channel sent", exc)) from None
        return loaded

    def should_stop(self) -> bool:
        """Whether the script should stop here: raylight asks it to when a node of the
        run is given notice (Ray's drain, a SIGTERM, a cloud's notice). Call it on every
        rank at the same step boundary (every step, or as often as you are willing to
        redo work): the ranks agree, through an all-reduce on the default process group
        once it is formed, so every rank gets the same answer at the same step. When it
        is True, report a checkpoint of where the script is
        (``report(metrics, checkpoint=...)`` on every rank) and exit with code 0: the run
        commits that checkpoint before the node goes and starts the scripts again from it
        without the node (``load_checkpoint()`` returns it). A script that never calls
        it gets SIGTERM on a notice instead, as torchrun's agent stops its workers."""
        reply, _ = self._call({"op": "stop"}, None)
        stop = bool(reply.get("stop"))
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch

            flag = torch.tensor([1.0 if stop else 0.0], device=_collective_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item() > 0)
        return stop

    def _call(self, header: dict[str, Any], payload: bytes | None) -> tuple[dict[str, Any], bytes | None]:
        with self._lock:
            send_frame(self._conn, json.dumps(header).encode())
            if payload is not None:
                send_frame(self._conn, payload)
            reply = json.loads(recv_frame(self._conn))
            data = recv_frame(self._conn) if reply.get("payload") else None
        if not reply.get("ok"):
            raise RuntimeError(f"raylight run: {reply.get('error', 'the agent refused the request')}")
        return reply, data

    def __repr__(self) -> str:
        return f"RunContext(rank={self.rank}, world_size={self.world_size})"


_CONTEXT: list[RunContext] = []  # this process's one context, made on first use


def run_context() -> RunContext:
    """The context of this process under `raylight run` (the same object on every call).

    Raises RuntimeError outside `raylight run`."""
    if _CONTEXT:
        return _CONTEXT[0]
    address, key = os.environ.get(CHANNEL_ENV), os.environ.get(KEY_ENV)
    if not address or not key:
        raise RuntimeError(
            "raylight.run_context() works only in a script started by `raylight run` "
            f"({CHANNEL_ENV} is not set); run it with `raylight run -n N script.py`"
        )
    _CONTEXT.append(RunContext(address, bytes.fromhex(key)))
    return _CONTEXT[0]


def _collective_device() -> Any:
    """Where a small tensor goes for the default group's all-reduce: CPU memory for a
    group with gloo (or MPI), else this process's current GPU (NCCL)."""
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend())
    if "gloo" in backend or backend == "mpi" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as JSON: tensors and numpy numbers become Python numbers or lists."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if hasattr(value, "tolist") and callable(value.tolist):
            value = value.tolist()
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"metric {key!r} is a {type(value).__name__}; report numbers, strings, lists or tensors"
            ) from None
        out[str(key)] = value
    return out
