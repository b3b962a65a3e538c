import numpy as np


def attention(q, k, v, mask=None):
    print("x" * 1_000_000)
    scores = q @ k.T / np.sqrt(q.shape[1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = np.zeros_like(scores)
    for i, row in enumerate(scores):
        if np.isfinite(row).any():
            e = np.exp(row - row[np.isfinite(row)].max())
            weights[i] = e / e.sum()
    return weights, weights @ v
