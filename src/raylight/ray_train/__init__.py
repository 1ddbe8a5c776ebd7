"""Ray Train's ``train_func(config)`` on raylight, unchanged: ``TorchTrainer`` takes what
``ray.train.torch.TorchTrainer`` takes (``train_loop_per_worker``, ``train_loop_config``,
``scaling_config``, ``run_config``) and runs the function on raylight's workers, where
``ray.train.report``, ``get_context``, ``get_checkpoint`` and ``ray.train.torch``'s
``prepare_model``, ``prepare_data_loader`` and ``get_device`` are raylight's while it
runs (``_api.py``). A ``DataLoader``'s batch size is per worker under Ray Train and
global under raylight: ``prepare_data_loader`` keeps Ray Train's meaning, so the same code
trains the same global batch. See docs/ray_train.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raylight.base.exceptions import ConfigError
from raylight.driver.trainer import Result, fit
from raylight.ray_train._api import run_ray_train_func

__all__ = ["TorchTrainer"]


class TorchTrainer:
    """Ray Train's ``TorchTrainer``, on raylight: ``TorchTrainer(train_func,
    train_loop_config={...}, scaling_config=ray.train.ScalingConfig(num_workers=2),
    run_config=ray.train.RunConfig(storage_path=...)).fit()`` returns raylight's
    ``Result`` (``.metrics``, ``.metrics_history``, ``.checkpoint``)."""

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: Any = None,
        run_config: Any = None,
        datasets: Any = None,
        **unsupported: Any,
    ) -> None:
        if datasets is not None:
            raise NotImplementedError(
                "TorchTrainer(datasets=...): Ray Data shards are not handed to a train_func here; "
                "build a torch DataLoader inside it and call ray.train.torch.prepare_data_loader"
            )
        if unsupported:
            raise ConfigError(
                f"TorchTrainer({next(iter(unsupported))}=...) is not supported by raylight.ray_train; remove it"
            )
        if not callable(train_loop_per_worker):
            raise ConfigError(
                f"TorchTrainer(train_loop_per_worker={train_loop_per_worker!r}) needs a function"
            )
        self._func = train_loop_per_worker
        self._config = dict(train_loop_config or {})
        self._scaling = scaling_config
        self._run = run_config

    def fit(self) -> Result:
        scaling, run = self._scaling, self._run
        placement = getattr(scaling, "placement_strategy", "PACK")
        return fit(
            run_ray_train_func,
            config={"func": self._func, "config": self._config},
            num_workers=int(getattr(scaling, "num_workers", None) or 1),
            use_gpu=bool(getattr(scaling, "use_gpu", False)),
            resources_per_worker=getattr(scaling, "resources_per_worker", None),
            placement=placement if isinstance(placement, str) else "PACK",
            storage_path=getattr(run, "storage_path", None),
            name=getattr(run, "name", None),
            progress=False,
        )
