"""Data ingest for workers: sharded, restart-safe, resizable batch loading."""

from raylight.data.loader import ElasticLoader, epoch_order, micro_batches, move_to_device

__all__ = ["ElasticLoader", "epoch_order", "micro_batches", "move_to_device"]
