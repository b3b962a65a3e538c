"""The learning-rate schedule of the 2017 paper (section 5.3): a linear warm-up, then 1/sqrt(step) decay."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def noam_lr(step: int, d_model: int, factor: float, warmup: int) -> float:
    """lr = factor * d^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam_schedule(optimizer: torch.optim.Optimizer, d_model: int, factor: float, warmup: int,
                  done: int = 0) -> LambdaLR:
    """The Noam schedule as a LambdaLR: step k (from 1) runs at noam_lr(k); `done` steps are already behind."""
    for group in optimizer.param_groups:
        group["initial_lr"] = 1.0                       # the schedule gives the learning rate itself
    return LambdaLR(optimizer, lambda taken: noam_lr(taken + 1, d_model, factor, warmup), last_epoch=done - 1)
