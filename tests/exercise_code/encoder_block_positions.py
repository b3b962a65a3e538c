import numpy as np


def _ln(x, ln, eps):
    mu = x.mean(axis=1, keepdims=True)
    return ln["gamma"] * (x - mu) / np.sqrt(x.var(axis=1, keepdims=True) + eps) + ln["beta"]


def _mha(x, p):
    heads = []
    for h in p["heads"]:
        q, k, v = x @ h["w_q"], x @ h["w_k"], x @ h["w_v"]
        s = q @ k.T / np.sqrt(q.shape[1])
        e = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append(e / e.sum(axis=1, keepdims=True) @ v)
    return np.concatenate(heads, axis=1) @ p["w_o"]


def encoder_block(x, params, norm="post"):
    n, d = x.shape
    x = x + 0.1 * np.sin(np.arange(n))[:, None] * np.ones(d)     # a position signal of its own
    ln_1, ln_2 = params["layer_norms"]
    f, eps = params["ffn"], params["eps"]

    def ffn(u):
        return np.maximum(u @ f["w_1"] + f["b_1"], 0) @ f["w_2"] + f["b_2"]

    if norm == "post":
        u = _ln(x + _mha(x, params["self_attention"]), ln_1, eps)
        return _ln(u + ffn(u), ln_2, eps)
    u = x + _mha(_ln(x, ln_1, eps), params["self_attention"])
    return u + ffn(_ln(u, ln_2, eps))
