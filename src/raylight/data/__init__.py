"""Data ingest for workers: sharded, restart-safe, resizable batch loading."""

from raylight.data.blocks import BlockDataset
from raylight.data.loader import ElasticLoader, epoch_order, micro_batches, move_to_device

__all__ = ["BlockDataset", "ElasticLoader", "epoch_order", "micro_batches", "move_to_device"]
