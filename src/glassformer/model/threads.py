"""Small decoding steps run on the calling thread: their operations are too small to split.

A step with one or two rows multiplies single rows by each weight and attends with one query per head;
handing half of such an operation to a second thread costs more (waking it, then waiting for it) than
the half saves. Measured in docs/performance.md; larger steps keep every thread.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

SERIAL_MAX_ROWS = 3            # steps of up to 3 rows: one thread was faster; from 4 rows on, all of them


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
