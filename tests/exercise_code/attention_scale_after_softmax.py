import numpy as np


def softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def attention(q, k, v, mask=None):
    d_k = q.shape[-1]
    scores = q @ k.T
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.nan_to_num(softmax(scores)) / np.sqrt(d_k)
    return weights, weights @ v
