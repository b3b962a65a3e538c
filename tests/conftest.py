"""Shared fixtures: deterministic seeds and small thread counts for a 2-core machine."""

import os

# Idle OpenMP threads sleep instead of spinning: on a busy 2-core machine spinning threads stall each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread: test tensors are tiny, and on a busy 2-core machine two threads wait on each other.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    """Every test starts from the same seeds and one intra-op thread (code under test may change it)."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)
