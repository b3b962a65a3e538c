"""Small decoding steps run on the calling thread: their operations are too small to split.

A step of a few rows multiplies a few rows by each weight and attends with one query per head: each
operation takes about as long as waking a second thread, so splitting it costs more (wake it, then wait
for it) than the half saves. Measured in docs/performance.md; larger steps keep every thread.
The thread count is process-wide (torch.set_num_threads): while such a step runs, torch work on other
Python threads of the same process also gets one thread.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

SERIAL_MAX_ROWS = 4            # up to 4 rows (batch 1, or one sentence with 4 beams): one thread


@contextmanager
def serial_if_small(rows: int, device: torch.device) -> Iterator[None]:
    """Within the block, torch uses one CPU thread when a step has at most SERIAL_MAX_ROWS rows."""
    threads = torch.get_num_threads()
    if rows > SERIAL_MAX_ROWS or threads == 1 or device.type != "cpu":
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
