"""``adaptdl.torch.scaling_rules``: how the learning rate follows the batch size, as
raylight's LR rules (``raylight.adaptive.lr``): AdaScale -> adascale, LinearScale ->
linear, SqrtScale and AdamScale -> sqrt, LEGWScale -> legw. A subclass of
``ScalingRuleBase`` with its own ``scale_lr(scale)`` is used as it is."""

from __future__ import annotations

from typing import Any

import numpy as np

from raylight.adaptive.lr import lr_factor


class ScalingRuleBase:
    rule = ""  # raylight's LR rule, where the subclass is one of AdaptDL's

    def scale_lr(self, scale: float) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.scale_lr(scale): return the LR factor for batch scale `scale`")

    def factor(self, scale: float, gain: float, progress: float) -> float:
        """The LR multiplier at batch scale ``scale`` with AdaScale gain ``gain``."""
        if type(self).scale_lr is not ScalingRuleBase.scale_lr and not self.rule:
            return float(np.average(self.scale_lr(scale)))
        return float(lr_factor(self.rule, scale, gain, progress=progress, warmup_steps=self.warmup_steps()))  # type: ignore[arg-type]

    def warmup_steps(self) -> float:
        return 0.0


class AdaScale(ScalingRuleBase):
    rule = "adascale"


class AdamScale(ScalingRuleBase):
    rule = "sqrt"


class LinearScale(ScalingRuleBase):
    rule = "linear"


class SqrtScale(ScalingRuleBase):
    rule = "sqrt"


class LEGWScale(ScalingRuleBase):
    """Linear scaling warmed up over ``base_warmup_epochs`` epochs of ``data_size`` samples
    (at the initial batch size), the warm-up growing with the batch."""

    rule = "legw"

    def __init__(self, base_warmup_epochs: float, data_size: int) -> None:
        self.base_warmup_epochs = base_warmup_epochs
        self.data_size = data_size
        self.init_batch_size = 1

    def warmup_steps(self) -> float:
        return self.base_warmup_epochs * self.data_size / max(1, self.init_batch_size)
