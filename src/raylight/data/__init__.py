"""Data ingest for workers: sharded, restart-safe batch loading."""

from raylight.data.loader import GlobalBatchSampler, PreparedLoader, move_to_device

__all__ = ["GlobalBatchSampler", "PreparedLoader", "move_to_device"]
