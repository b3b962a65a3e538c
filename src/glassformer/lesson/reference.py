"""The block and single-head attention in float64 NumPy, written straight from the formulas.

An independent second implementation of trace spec v1: it shares no code with the model (no
torch, no glassformer.model), reads the same spec document and returns the same JSON structure,
so `run_spec` can be checked against it number by number. It assumes a valid document.
"""

from __future__ import annotations

import math

import numpy as np

SUBLAYERS = {"encoder_block": ("self_attention", "ffn"),
             "decoder_block": ("self_attention", "cross_attention", "ffn")}


def _a(rows) -> np.ndarray:
    return np.array(rows, dtype=np.float64)


def _json(a: np.ndarray) -> list:
    """Nested lists of floats; -inf (a masked score) becomes None."""
    obj = a.astype(object)
    obj[~np.isfinite(a)] = None
    return obj.tolist()


def softmax_over_keys(scaled: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the visible keys; a row with no visible key gets all-zero weights."""
    weights = np.zeros_like(scaled)
    for i in range(scaled.shape[0]):
        seen = visible[i]
        if seen.any():
            s = scaled[i, seen]
            e = np.exp(s - s.max())
            weights[i, seen] = e / e.sum()
    return weights


def attention_head(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: bool) -> dict:
    """S = QKᵀ; S/√d_k (if scale); -inf where masked; A = softmax over keys; Y = AV."""
    scores = q @ k.T                                                        # (n, m)
    scaled = scores / math.sqrt(q.shape[1]) if scale else scores.copy()
    scaled = np.where(visible, scaled, -np.inf)
    weights = softmax_over_keys(scaled, visible)
    return {"scores": scores, "scaled_scores": scaled, "weights": weights, "output": weights @ v}


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """γ ⊙ (x − μ)/√(σ² + ε) + β with μ, σ² over the d features of each row (population variance)."""
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def _visible(doc: dict, n: int, m: int) -> np.ndarray:
    """(n, m) True = may attend: the mask word or table, AND the key padding."""
    mask = doc.get("mask", "none")
    if isinstance(mask, list):
        visible = np.array(mask, dtype=bool)
    elif mask == "causal":
        visible = np.array([[j <= i for j in range(m)] for i in range(n)], dtype=bool)
    else:
        visible = np.ones((n, m), dtype=bool)
    if "key_padding" in doc:
        visible = visible & ~np.array(doc["key_padding"], dtype=bool)[None, :]
    return visible


def multi_head(xq: np.ndarray, xkv: np.ndarray, p: dict, visible: np.ndarray, scale: bool,
               disabled=()) -> dict:
    """Concat(H_1..H_H) W^O + b_o with H_r = softmax(Q_r K_rᵀ/√d_k + M) V_r; switched-off heads give zeros."""
    heads, parts = [], []
    for r, h in enumerate(p["heads"]):
        d_k, d_v = len(h["w_q"][0]), len(h["w_v"][0])
        q = xq @ _a(h["w_q"]) + _a(h.get("b_q", [0.0] * d_k))
        k = xkv @ _a(h["w_k"]) + _a(h.get("b_k", [0.0] * d_k))
        v = xkv @ _a(h["w_v"]) + _a(h.get("b_v", [0.0] * d_v))
        head = {"q": q, "k": k, "v": v, **attention_head(q, k, v, visible, scale)}
        heads.append(head)
        parts.append(np.zeros_like(head["output"]) if r in disabled else head["output"])
    concat = np.concatenate(parts, axis=1)                                  # (n, H·d_v)
    w_o = _a(p["w_o"])
    output = concat @ w_o + _a(p.get("b_o", [0.0] * w_o.shape[1]))
    return {"heads": [{**{key: _json(val) for key, val in head.items()}, "disabled": r in disabled}
                      for r, head in enumerate(heads)],
            "concat": _json(concat), "output": _json(output), "_output": output}


def ffn(x: np.ndarray, p: dict) -> dict:
    """ReLU(x W_1 + b_1) W_2 + b_2, row by row."""
    w_1, w_2 = _a(p["w_1"]), _a(p["w_2"])
    hidden = np.maximum(x @ w_1 + _a(p.get("b_1", [0.0] * w_1.shape[1])), 0.0)
    output = hidden @ w_2 + _a(p.get("b_2", [0.0] * w_2.shape[1]))
    return {"hidden": _json(hidden), "output": _json(output), "_output": output}


def run_reference(doc: dict) -> dict:
    """The trace-spec v1 output of `doc`, computed from the formulas alone."""
    scale = doc.get("scale", True)
    if doc["kind"] == "attention":
        q, k, v = _a(doc["q"]), _a(doc["k"]), _a(doc["v"])
        head = attention_head(q, k, v, _visible(doc, q.shape[0], k.shape[0]), scale)
        return {"version": 1, "kind": "attention", **{key: _json(val) for key, val in head.items()}}

    kind = doc["kind"]
    x = _a(doc["x"])
    n, d = x.shape
    eps = float(doc.get("eps", 1e-5))
    norm = doc.get("norm", "post")
    names = SUBLAYERS[kind]
    norms = doc.get("layer_norms") or [{} for _ in names]
    disabled = set(doc.get("disabled_heads", []))
    self_visible = _visible(doc, n, n)
    if kind == "decoder_block":
        memory = _a(doc["memory"])
        pad = np.array(doc.get("memory_padding", [False] * memory.shape[0]), dtype=bool)
        cross_visible = np.broadcast_to(~pad[None, :], (n, memory.shape[0]))   # no triangle

    result: dict = {"version": 1, "kind": kind}
    sublayers = []
    for s, name in enumerate(names):
        gamma = _a(norms[s].get("gamma", [1.0] * d))
        beta = _a(norms[s].get("beta", [0.0] * d))
        inp = x
        normed_in = layer_norm(x, gamma, beta, eps) if norm == "pre" else x
        if name == "self_attention":
            part = multi_head(normed_in, normed_in, doc["self_attention"], self_visible, scale, disabled)
        elif name == "cross_attention":
            part = multi_head(normed_in, memory, doc["cross_attention"], cross_visible, scale)
        else:
            part = ffn(normed_in, doc["ffn"])
        residual = inp + part.pop("_output")
        if norm == "post":                                                  # LN(x + Sub(x))
            normed = layer_norm(residual, gamma, beta, eps)
            x = normed
        else:                                                               # x + Sub(LN(x))
            normed = normed_in
            x = residual
        result[name] = part
        sublayers.append({"name": name, "input": _json(inp), "residual": _json(residual), "normed": _json(normed)})
    result["sublayers"] = sublayers
    result["output"] = _json(x)
    return result


def max_difference(left, right) -> float:
    """Largest absolute difference between two trace outputs of the same structure.

    None (a masked score) must meet None; any difference in keys, lengths or kinds gives inf.
    """
    if isinstance(left, dict) and isinstance(right, dict):
        if set(left) != set(right):
            return math.inf
        return max((max_difference(left[key], right[key]) for key in left), default=0.0)
    if isinstance(left, list) and isinstance(right, list):
        if len(left) != len(right):
            return math.inf
        return max((max_difference(a, b) for a, b in zip(left, right, strict=True)), default=0.0)
    if left is None or right is None:
        return 0.0 if left is None and right is None else math.inf
    if isinstance(left, bool) or isinstance(right, bool) or isinstance(left, str) or isinstance(right, str):
        return 0.0 if left == right else math.inf
    return abs(float(left) - float(right))
