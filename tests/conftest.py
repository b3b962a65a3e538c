"""Shared fixtures: deterministic seeds and small thread counts for a 2-core machine."""

import random

import numpy as np
import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
