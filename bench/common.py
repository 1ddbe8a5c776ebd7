"""Helpers shared by the benchmarks (process and cluster set-up, not measurement)."""

from __future__ import annotations

import logging
import os
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
