import numpy as np

BUGS = set()


def _softmax_rows(scores, seen):
    out = np.zeros(scores.shape)
    for i in range(scores.shape[0]):
        row, ok = scores[i], seen[i]
        if "mask-after-softmax" in BUGS:
            e = np.exp(row - row.max())
            out[i] = np.where(ok, e / e.sum(), 0.0)
        elif "masked-row-not-zeroed" in BUGS:
            s = np.where(ok, row, -np.inf)
            with np.errstate(invalid="ignore"):
                e = np.exp(s - s.max())
                out[i] = e / e.sum()
        elif "masked-row-not-zeroed+" in BUGS:
            s = np.where(ok, row, -1e9)
            e = np.exp(s - s.max())
            out[i] = e / e.sum()
        elif ok.any():
            e = np.exp(row[ok] - row[ok].max())
            out[i, ok] = e / e.sum()
    return out


def on(bug, site):
    """The bug is planted everywhere, or in this sub-layer alone ("no-scale@cross_attention")."""
    return bug in BUGS or f"{bug}@{site}" in BUGS


def _attend(xq, xkv, p, seen, site):
    outputs = []
    for h in p["heads"]:
        q, k, v = xq @ h["w_q"], xkv @ h["w_k"], xkv @ h["w_v"]
        d_k = q.shape[1]
        scores = k @ q.T if on("transposed-scores", site) else q @ k.T
        if on("scale-by-d-model", site):
            scores = scores / np.sqrt(xq.shape[1])
        elif not on("no-scale", site) and not on("scale-after-softmax", site):
            scores = scores / np.sqrt(d_k)
        if on("softmax-over-queries", site):
            weights = _softmax_rows(scores.T, seen.T).T
        else:
            weights = _softmax_rows(scores, seen)
        if on("scale-after-softmax", site):
            weights = weights / np.sqrt(d_k)
        outputs.append(weights @ v)
    if on("heads-concat-reversed", site):
        outputs = outputs[::-1]
    concat = np.concatenate(outputs, axis=1)
    return concat if on("no-output-projection", site) else concat @ p["w_o"]


def _layer_norm(x, ln, eps, site):
    if on("ln-across-positions", site):
        mu, var = x.mean(), ((x - x.mean()) ** 2).mean()
    elif on("ln-across-positions+", site):
        mu = x.mean(axis=0, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=0, keepdims=True)
    else:
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) ** 2).sum(axis=1, keepdims=True) / (x.shape[1] - (1 if on("ln-unbiased-variance", site) else 0))
    spread = np.sqrt(var) + eps if on("ln-eps-outside-sqrt", site) else np.sqrt(var + eps)
    return ln["gamma"] * (x - mu) / spread + ln["beta"]


def _ffn(x, p):
    hidden = x @ p["w_1"] + p["b_1"]
    if "ffn-without-relu" not in BUGS:
        hidden = np.maximum(hidden, 0.0)
    return hidden @ p["w_2"] + p["b_2"]


def decoder_block(y, memory, params):
    y, memory = np.asarray(y, dtype=float), np.asarray(memory, dtype=float)
    n, m = y.shape[0], memory.shape[0]
    shift = -1 if "causal-off-by-one" in BUGS else 1 if "causal-off-by-one+" in BUGS else 0
    causal = np.array([[j <= i + shift for j in range(n)] for i in range(n)], dtype=bool).reshape(n, n)
    if "unmasked" in BUGS:                               # no causal mask at all: row i reads the future too
        causal[:] = True
    if "mask-inverted" in BUGS:                          # the table of hidden keys, read as the visible ones
        causal = ~causal
    everything = np.ones((n, m), dtype=bool)
    ln_1, ln_2, ln_3 = params["layer_norms"]
    eps = params["eps"]

    def add(x, sub, site):
        return sub if on("no-residual", site) else x + sub

    if "pre-norm-instead-of-post" in BUGS:
        normed = _layer_norm(y, ln_1, eps, "self_attention")
        u = add(y, _attend(normed, normed, params["self_attention"], causal, "self_attention"), "self_attention")
        v = add(u, _attend(_layer_norm(u, ln_2, eps, "cross_attention"), memory, params["cross_attention"],
                           everything, "cross_attention"), "cross_attention")
        return add(v, _ffn(_layer_norm(v, ln_3, eps, "ffn"), params["ffn"]), "ffn")
    u = _layer_norm(add(y, _attend(y, y, params["self_attention"], causal, "self_attention"), "self_attention"),
                    ln_1, eps, "self_attention")
    v = _layer_norm(add(u, _attend(u, memory, params["cross_attention"], everything, "cross_attention"),
                        "cross_attention"), ln_2, eps, "cross_attention")
    return _layer_norm(add(v, _ffn(v, params["ffn"]), "ffn"), ln_3, eps, "ffn")
