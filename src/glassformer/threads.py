"""The thread policy: torch's thread count is process-wide, so it is set where a program starts (a command, the lab
server, training, a benchmark case), never in library code. A few rows a step (batch 1, one sentence with 4 beams):
one thread; larger batches and training: every usable core (split between DDP ranks); the lab: one thread."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

SERIAL_MAX_ROWS = 4            # up to 4 rows per step (batch 1, or one sentence with 4 beams): one thread
LESSON_THREADS = 1             # the lesson's traces and checks: tiny tensors, a second thread only waits
SERVING_THREADS = 1            # the lab server: small requests, more threads only add synchronisation


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                                   # macOS, Windows
        return max(1, os.cpu_count() or 1)


def training_threads(world: int = 1, requested: int | None = None) -> int:
    """Threads per training process: `requested`, else the usable cores shared by the `world` ranks."""
    return requested if requested else max(1, usable_cores() // max(1, world))


def decoding_threads(rows: int, available: int | None = None) -> int:
    """Threads for decoding `rows` rows per step (batch x beams): 1 for a few rows, else `available`
    (default: the count already set for this process, so a decoding job never raises it)."""
    import torch

    available = torch.get_num_threads() if available is None else available
    return 1 if rows <= SERIAL_MAX_ROWS else max(1, available)


@contextmanager
def use_threads(n: int) -> Iterator[int]:
    """Run the block with `n` intra-op threads and give the previous count back afterwards."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(saved)
