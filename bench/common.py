"""Helpers shared by the benchmarks (process and cluster set-up, not measurement)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any


def init_local_ray(num_cpus: int, temp_dir: str) -> Any:
    """Start a local Ray for one child run, bound to 127.0.0.1, with its own temp dir."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # bind Ray to 127.0.0.1
    import ray

    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.WARNING,
        _temp_dir=temp_dir,
    )
    return ray


def run_ray_train(
    loop: Callable[[dict[str, Any]], None], job: dict[str, Any], num_workers: int
) -> None:
    """One child run of Ray Train: ``loop(job)`` on ``num_workers`` workers of 1 CPU
    under ``TorchTrainer``, on a local Ray of its own that is shut down afterwards."""
    ray = init_local_ray(num_workers, job["ray_temp_dir"])
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    try:
        TorchTrainer(
            loop,
            train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=num_workers, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=job["storage_path"], name="bench"),
        ).fit()
    finally:
        ray.shutdown()
