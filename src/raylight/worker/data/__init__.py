"""Data ingest for workers: sharded, restart-safe, resizable batch loading."""

from raylight.worker.data.blocks import BlockDataset
from raylight.worker.data.loader import ElasticLoader, epoch_order, micro_batches, move_to_device

__all__ = ["BlockDataset", "ElasticLoader", "epoch_order", "micro_batches", "move_to_device"]
