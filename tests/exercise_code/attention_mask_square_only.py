import numpy as np


def attention(q, k, v, mask=None):
    scores = q @ k.T / np.sqrt(q.shape[1])
    if mask is not None and mask.shape[0] == mask.shape[1]:     # only a square mask is applied
        scores = np.where(mask, scores, -np.inf)
    weights = np.zeros_like(scores)
    for i, row in enumerate(scores):
        if np.isfinite(row).any():
            e = np.exp(row - row[np.isfinite(row)].max())
            weights[i] = e / e.sum()
    return weights, weights @ v
