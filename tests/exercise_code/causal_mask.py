import numpy as np

BUGS = set()


def causal_mask(n):
    shift = -1 if "causal-off-by-one" in BUGS else 1 if "causal-off-by-one+" in BUGS else 0
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            mask[i, j] = j <= i + shift
    if "mask-inverted" in BUGS:                          # True marks what is hidden
        mask = ~mask
    return mask
