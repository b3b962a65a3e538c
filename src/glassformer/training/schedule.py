"""The learning-rate schedule of the 2017 paper (section 5.3): a linear warm-up, then 1/sqrt(step) decay."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def noam_lr(step: int, d_model: int, factor: float, warmup: int) -> float:
    """lr = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def cooled(lr: float, step: int, total: int, cooldown: float) -> float:
    """A cool-down over the last `cooldown` fraction of `total` steps: lr times a factor falling linearly from
    1 at the cool-down's start to 0 after the last step (1 before it; lr itself with cooldown 0)."""
    if cooldown <= 0 or total <= 0:
        return lr
    start = total - cooldown * total                    # the cool-down's first step is the one after `start`
    return lr * min(1.0, max(total - step + 1, 0) / max(total - start, 1.0))


def noam_schedule(optimizer: torch.optim.Optimizer, d_model: int, factor: float, warmup: int,
                  done: int = 0, total: int = 0, cooldown: float = 0.0) -> LambdaLR:
    """The Noam schedule as a LambdaLR: step k (from 1) runs at noam_lr(k), cooled over the last `cooldown`
    fraction of `total` steps; `done` steps are already behind."""
    for group in optimizer.param_groups:
        group["initial_lr"] = 1.0                       # the schedule gives the learning rate itself
    return LambdaLR(optimizer, lambda taken: cooled(noam_lr(taken + 1, d_model, factor, warmup), taken + 1, total,
                                                    cooldown), last_epoch=done - 1)
