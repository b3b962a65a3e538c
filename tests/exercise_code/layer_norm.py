import math

import numpy as np

BUGS = set()


def layer_norm(x, gamma, beta, eps):
    x = np.asarray(x, dtype=float)
    n, d = x.shape
    out = np.zeros((n, d))
    if "ln-across-positions" in BUGS:                    # one mean and variance for the whole table
        mu = sum(x[i, r] for i in range(n) for r in range(d)) / (n * d)
        var = sum((x[i, r] - mu) ** 2 for i in range(n) for r in range(d)) / (n * d)
        return gamma * (x - mu) / math.sqrt(var + eps) + beta
    if "ln-across-positions+" in BUGS:                   # a mean and variance per feature, over the rows
        for r in range(d):
            column = x[:, r]
            mu = column.sum() / n
            var = ((column - mu) ** 2).sum() / n
            out[:, r] = gamma[r] * (column - mu) / math.sqrt(var + eps) + beta[r]
        return out
    for i in range(n):
        row = x[i]
        mu = row.sum() / d
        squares = ((row - mu) ** 2).sum()
        var = squares / (d - 1) if "ln-unbiased-variance" in BUGS else squares / d
        spread = math.sqrt(var) + eps if "ln-eps-outside-sqrt" in BUGS else math.sqrt(var + eps)
        out[i] = gamma * (row - mu) / spread + beta
    return out
