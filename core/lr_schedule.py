"""The learning-rate schedule: a pure function of the optimizer step.

`lr_multiplier(i)` scales the peak learning rate for the update with index i (0 for the first update):
linear warmup over `warmup_steps` updates (the first update uses 1/warmup of the peak), then constant, or a
cosine or linear decay over `decay_steps` updates down to `min_ratio` of the peak, which then holds.
"""
from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear")


def lr_multiplier(step: int, *, warmup_steps: int = 0, schedule: str = "constant", decay_steps: int = 0,
                  min_ratio: float = 0.0) -> float:
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule: expected one of {SCHEDULES}, got {schedule!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if decay_steps <= 0:
        raise ValueError(f"lr_schedule={schedule} needs decay_steps > 0")
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - (1.0 - min_ratio) * progress
