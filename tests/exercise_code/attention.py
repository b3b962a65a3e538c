import numpy as np

BUGS = set()


def _softmax(row, seen):
    """Softmax of the entries of `row` that are seen; a row with none seen gets zeros."""
    if "mask-after-softmax" in BUGS:
        e = np.exp(row - row.max())
        return np.where(seen, e / e.sum(), 0.0)
    if "masked-row-not-zeroed" in BUGS:                 # -inf, then a plain softmax: 0/0 when nothing is seen
        s = np.where(seen, row, -np.inf)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max())
            return e / e.sum()
    if "masked-row-not-zeroed+" in BUGS:                # -1e9 in place of -inf
        s = np.where(seen, row, -1e9)
        e = np.exp(s - s.max())
        return e / e.sum()
    out = np.zeros(len(row))
    if seen.any():
        e = np.exp(row[seen] - row[seen].max())
        out[seen] = e / e.sum()
    return out


def attention(q, k, v, mask=None):
    q, k, v = np.asarray(q, dtype=float), np.asarray(k, dtype=float), np.asarray(v, dtype=float)
    d_k = q.shape[1]
    scores = k @ q.T if "transposed-scores" in BUGS else q @ k.T
    if mask is None:
        seen = np.ones(scores.shape, dtype=bool)
    else:
        seen = np.asarray(mask, dtype=bool)
        if "mask-inverted" in BUGS:
            seen = ~seen
    if "no-scale" not in BUGS and "scale-after-softmax" not in BUGS:
        scores = scores / np.sqrt(d_k)
    weights = np.zeros(scores.shape)
    if "softmax-over-queries" in BUGS:
        for j in range(scores.shape[1]):
            weights[:, j] = _softmax(scores[:, j], seen[:, j])
    else:
        for i in range(scores.shape[0]):
            weights[i] = _softmax(scores[i], seen[i])
    if "scale-after-softmax" in BUGS:
        weights = weights / np.sqrt(d_k)
    return weights, weights @ v
