import numpy as np


def causal_mask(n):
    return np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)
