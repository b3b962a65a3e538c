"""Shared fixtures: deterministic seeds and small thread counts for a 2-core machine."""

import os

# Idle OpenMP threads sleep instead of spinning: on a busy 2-core machine spinning threads stall each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
