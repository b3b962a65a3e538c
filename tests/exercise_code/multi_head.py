import numpy as np

BUGS = set()


def _softmax(row, seen):
    if "mask-after-softmax" in BUGS:
        e = np.exp(row - row.max())
        return np.where(seen, e / e.sum(), 0.0)
    if "masked-row-not-zeroed" in BUGS:
        s = np.where(seen, row, -np.inf)
        with np.errstate(invalid="ignore"):
            e = np.exp(s - s.max())
            return e / e.sum()
    if "masked-row-not-zeroed+" in BUGS:
        s = np.where(seen, row, -1e9)
        e = np.exp(s - s.max())
        return e / e.sum()
    out = np.zeros(len(row))
    if seen.any():
        e = np.exp(row[seen] - row[seen].max())
        out[seen] = e / e.sum()
    return out


def _head(x, h, seen):
    q, k, v = x @ h["w_q"], x @ h["w_k"], x @ h["w_v"]
    d_k = q.shape[1]
    scores = k @ q.T if "transposed-scores" in BUGS else q @ k.T
    if "scale-by-d-model" in BUGS:
        scores = scores / np.sqrt(x.shape[1])
    elif "no-scale" not in BUGS and "scale-after-softmax" not in BUGS:
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
    return weights @ v


def multi_head(x, params, mask=None):
    x = np.asarray(x, dtype=float)
    n = x.shape[0]
    if mask is None:
        seen = np.ones((n, n), dtype=bool)
    else:
        seen = np.asarray(mask, dtype=bool)
        if "mask-inverted" in BUGS:
            seen = ~seen
    outputs = [_head(x, h, seen) for h in params["heads"]]
    if "heads-concat-reversed" in BUGS:
        outputs = outputs[::-1]
    concat = np.concatenate(outputs, axis=1)
    if "no-output-projection" in BUGS:
        return concat
    return concat @ params["w_o"]
