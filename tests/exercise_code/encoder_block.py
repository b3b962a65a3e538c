import numpy as np

BUGS = set()


def on(bug, site):
    """The bug is planted everywhere, or in this sub-layer alone ("no-residual@ffn")."""
    return bug in BUGS or f"{bug}@{site}" in BUGS


def _layer_norm(x, ln, eps, site):
    gamma, beta = ln["gamma"], ln["beta"]
    if on("ln-across-positions", site):
        mu, var = x.mean(), x.var()
    elif on("ln-across-positions+", site):
        mu, var = x.mean(axis=0, keepdims=True), x.var(axis=0, keepdims=True)
    else:
        mu = x.mean(axis=1, keepdims=True)
        var = x.var(axis=1, keepdims=True, ddof=1 if on("ln-unbiased-variance", site) else 0)
    spread = np.sqrt(var) + eps if on("ln-eps-outside-sqrt", site) else np.sqrt(var + eps)
    return gamma * (x - mu) / spread + beta


def _self_attention(x, p):
    outputs = []
    for h in p["heads"]:
        q, k, v = x @ h["w_q"], x @ h["w_k"], x @ h["w_v"]
        d_k = q.shape[1]
        scores = k @ q.T if "transposed-scores" in BUGS else q @ k.T
        if "scale-by-d-model" in BUGS:
            scores = scores / np.sqrt(x.shape[1])
        elif "no-scale" not in BUGS and "scale-after-softmax" not in BUGS:
            scores = scores / np.sqrt(d_k)
        axis = 0 if "softmax-over-queries" in BUGS else 1
        e = np.exp(scores - scores.max(axis=axis, keepdims=True))
        weights = e / e.sum(axis=axis, keepdims=True)
        if "scale-after-softmax" in BUGS:
            weights = weights / np.sqrt(d_k)
        outputs.append(weights @ v)
    if "heads-concat-reversed" in BUGS:
        outputs.reverse()
    concat = np.hstack(outputs)
    return concat if "no-output-projection" in BUGS else concat @ p["w_o"]


def _ffn(x, p):
    hidden = x @ p["w_1"] + p["b_1"]
    if "ffn-without-relu" not in BUGS:
        hidden = np.maximum(hidden, 0.0)
    return hidden @ p["w_2"] + p["b_2"]


def _add(x, sub, site):
    return sub if on("no-residual", site) else x + sub


def encoder_block(x, params, norm="post"):
    x = np.asarray(x, dtype=float)
    if "pre-norm-instead-of-post" in BUGS:
        norm = "pre"
    if "post-norm-instead-of-pre" in BUGS:
        norm = "post"
    ln_1, ln_2 = params["layer_norms"]
    eps = params["eps"]
    sa, ff = "self_attention", "ffn"
    if norm == "post":
        u = _layer_norm(_add(x, _self_attention(x, params["self_attention"]), sa), ln_1, eps, sa)
        return _layer_norm(_add(u, _ffn(u, params["ffn"]), ff), ln_2, eps, ff)
    u = _add(x, _self_attention(_layer_norm(x, ln_1, eps, sa), params["self_attention"]), sa)
    return _add(u, _ffn(_layer_norm(u, ln_2, eps, ff), params["ffn"]), ff)
