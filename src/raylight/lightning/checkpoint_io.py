"""AtomicCheckpointIO: Lightning checkpoints written atomically and loaded safely.

A local checkpoint is written to a temporary file in the same directory and renamed
over the target, so a crash mid-write never leaves a truncated file under the final
name. Loading uses ``torch.load(weights_only=True)`` unless the caller explicitly asks
otherwise (``trainer.fit(..., weights_only=False)`` for a checkpoint you trust).
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from raylight.storage.run_dir import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic local writes and ``weights_only`` loads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        fs = get_filesystem(path)
        if storage_options is not None or "file" not in fs.protocol:
            super().save_checkpoint(checkpoint, path, storage_options)  # remote: fsspec transaction
            return
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        buf = io.BytesIO()
        torch.save(checkpoint, buf)
        atomic_write(path, buf.getvalue())

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        safe = True if weights_only is None else weights_only
        fs = get_filesystem(path)
        if not fs.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        try:
            # Loaded here, not by the base class: its weights_only argument is Lightning >= 2.5.
            with fs.open(path, "rb") as f:
                return torch.load(f, map_location=map_location, weights_only=safe)
        except pickle.UnpicklingError as exc:
            if not safe:
                raise
            from raylight.storage.checkpoint import refusal_reason

            raise pickle.UnpicklingError(
                f"checkpoint {path} holds objects a safe load (torch.load(weights_only=True)) "
                f"refuses ({refusal_reason(exc)}): loading it would run code the file chooses. If you "
                "trust this file, load it with "
                "trainer.fit(..., weights_only=False) (or validate/test/predict)."
            ) from None
