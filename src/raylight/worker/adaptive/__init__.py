"""The worker side of adaptive and elastic training (torch, no Ray); the driver side, the
pure goodput engine, is ``raylight.adaptive``.

``StepSync`` agrees the batch plan and stop requests across ranks at each optimizer-step
boundary; ``AdaptiveOptimizer`` applies accumulation, the LR rule and measures gradient
noise; ``Epochs`` and ``Accumulator`` carry their state through checkpoints.
"""
