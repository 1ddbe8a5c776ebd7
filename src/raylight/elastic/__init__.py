"""Worker-side machinery of adaptive and elastic training (torch, no Ray).

``StepSync`` agrees the batch plan and stop requests across ranks at each optimizer-step
boundary; ``AdaptiveOptimizer`` applies accumulation, the LR rule and measures gradient
noise; ``Epochs`` and ``Accumulator`` carry their state through checkpoints.
"""
