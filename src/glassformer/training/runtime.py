"""Where and how a training run executes: the device, DDP ranks (torchrun), the compiled step (--compile),
and stopping on Ctrl-C / SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..inference.compiler import cxx_compiler, use_compile_cache


# ---- distributed ---------------------------------------------------------------------------
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def agree(self, loss_sum: float, stop: bool, device: torch.device) -> tuple[float, bool]:
        """The loss summed over ranks, and whether any rank asked to stop (then all stop at this step)."""
        if not self.active:
            return loss_sum, stop
        import torch.distributed as dist

        t = torch.tensor([loss_sum, float(stop)], dtype=torch.float64,
                         device=device if device.type == "cuda" else "cpu")
        dist.all_reduce(t)
        return float(t[0]), bool(t[1] > 0)

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Wait for every rank, then leave the process group."""
        if self.active:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()


def init_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes (gloo on CPU, nccl on CUDA); single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


# ---- the compiled step ---------------------------------------------------------------------
def compiled_step(module: nn.Module, enabled: bool) -> nn.Module:
    """`module` (the loss: forward and label-smoothed NLL) under torch.compile when `enabled`: inductor turns
    forward, loss and backward into generated C++ kernels (AOTAutograd traces the backward), cached where the
    decoding step's are (inference/compiler.py). Batches come in many shapes (token-count batching), so the
    sizes are symbolic from the start: one graph, not one per shape. Without a C++ compiler the step runs
    eagerly, after one line on stderr. The numbers are the eager model's up to float rounding
    (tests/test_train.py)."""
    if not enabled:
        return module
    if cxx_compiler() is None:
        print("glassformer train: --compile: no C++ compiler found (g++); training eagerly", file=sys.stderr)
        return module
    use_compile_cache()
    return torch.compile(module, dynamic=True)


# ---- stopping ------------------------------------------------------------------------------
class StopFlag:
    """SIGINT/SIGTERM set a flag checked between steps, so a checkpoint is saved at a clean point.

    A second SIGINT raises KeyboardInterrupt at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopFlag:
        if _in_main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _in_main_thread() -> bool:

    return threading.current_thread() is threading.main_thread()
