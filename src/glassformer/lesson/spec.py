"""Trace spec v1: validate a JSON document, run it through the model's own layers in float64,
and return every intermediate as plain JSON (the contract is summarised in docs/lesson.md).

Conventions of the lesson: row vectors, `x @ W`, so a projection is stored d_in × d_out (the
transpose of `nn.Linear.weight`). Masks: true = may attend. Padding flags: true = PAD.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from ..model.attention import CrossAttention, MultiHeadAttention
from ..model.config import ModelConfig
from ..model.hooks import intervene, probes
from ..model.layers import DecoderLayer, EncoderLayer
from ..model.masks import causal_mask, padding_mask
from .spec_schema import KINDS, SUBLAYERS, VERSION, SpecError, validate_spec

__all__ = ["KINDS", "SUBLAYERS", "VERSION", "SpecError", "run_spec", "validate_spec"]

HEAD_KEYS = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")

# ---- running it through the model's layers --------------------------------------------------

def _plain(t: torch.Tensor) -> list:
    """A float64 tensor as nested lists of Python floats; non-finite entries (masked scores) become None."""
    a = t.detach().cpu().numpy().astype(np.float64)
    obj = a.astype(object)
    obj[~np.isfinite(a)] = None
    return obj.tolist()


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))


def _visibility(spec: dict, n: int, m: int) -> torch.Tensor | None:
    """(1, n, m) explicit mask AND key padding, or None when neither restricts anything."""
    visible = None
    if isinstance(spec["mask"], np.ndarray):
        visible = torch.from_numpy(spec["mask"].copy())[None]               # (1, query, key)
    if spec["key_padding"] is not None:
        keys = padding_mask(torch.from_numpy(spec["key_padding"])[None])[:, 0]  # (1, 1, key)
        visible = keys if visible is None else visible & keys
    return visible


def _load_attention(mha: MultiHeadAttention, p: dict) -> None:
    """Spec weights (x @ W per head) into W^Q, W^K, W^V (heads side by side) and W^O."""
    heads = p["heads"]
    state = {}
    for name in ("q", "k", "v"):
        w = np.concatenate([h[f"w_{name}"] for h in heads], axis=1)       # (d, H*d_k | H*d_v)
        state[f"w_{name}.weight"] = _t(w.T)
        state[f"w_{name}.bias"] = _t(np.concatenate([h[f"b_{name}"] for h in heads]))
    mha.load_state_dict({**state, "w_o.weight": _t(p["w_o"].T), "w_o.bias": _t(p["b_o"])})  # (d, H·d_v)


def _attention_output(records: dict, prefix: str, n_heads: int, disabled: list[int]) -> dict:
    heads = []
    for h in range(n_heads):
        head = {key: _plain(records[f"{prefix}.head.{h}.{key}"][0]) for key in HEAD_KEYS}
        head["disabled"] = h in disabled
        heads.append(head)
    return {"heads": heads, "concat": _plain(records[f"{prefix}.concat"][0]),
            "output": _plain(records[f"{prefix}.output"][0])}


def _run_attention(spec: dict) -> dict:
    """One head from Q, K, V directly: a 1-head MultiHeadAttention whose projections pick Q, K and V."""
    q, k, v = spec["q"], spec["k"], spec["v"]
    (n, d_k), (m, d_v) = q.shape, v.shape
    width = d_k + d_v
    mha = CrossAttention(width, 1, d_k, d_v, bias=False, scale=spec["scale"], path="glass").double()
    pick_k = torch.eye(d_k, width, dtype=torch.float64)                    # the first d_k channels
    pick_v = torch.eye(width, dtype=torch.float64)[d_k:]                     # the last d_v channels
    mha.load_state_dict({"w_q.weight": pick_k, "w_k.weight": pick_k, "w_v.weight": pick_v,
                         "w_o.weight": mha.w_o.weight.detach()})
    queries = torch.cat([_t(q), torch.zeros(n, d_v, dtype=torch.float64)], dim=1)[None]  # (1, n, d_k+d_v)
    keys_values = torch.cat([_t(k), _t(v)], dim=1)[None]                    # (1, m, d_k+d_v)
    visible = _visibility(spec, n, m)
    if isinstance(spec["mask"], str) and spec["mask"] == "causal":           # query i sees keys j <= i
        tri = causal_mask(n, m)[None]
        visible = tri if visible is None else visible & tri
    with torch.no_grad(), probes(mha, "head.0.*") as r:
        mha.eval()(queries, keys_values, mask=visible)
    return {"version": VERSION, "kind": "attention",
            **{key: _plain(r[f"head.0.{key}"][0]) for key in ("scores", "scaled_scores", "weights", "output")}}


def _config(spec: dict, attn: dict) -> ModelConfig:
    """A ModelConfig for one block: sizes from the weights, positions none, dropout 0, glass path."""
    x, ffn = spec["x"], spec["ffn"]
    return ModelConfig(src_vocab=1, tgt_vocab=1, d_model=x.shape[1], heads=len(attn["heads"]), d_k=attn["d_k"],
                       d_v=attn["d_v"], d_ff=ffn["w_1"].shape[1], encoder_layers=1, decoder_layers=1,
                       dropout=0.0, attention_dropout=0.0, norm_placement=spec["norm"], bos_id=0, eos_id=0,
                       eps=spec["eps"] if spec["eps"] > 0 else 1e-5, positions="none",
                       scale_scores=spec["scale"], bias=True, attention_path="glass")


def _switched_off(value: torch.Tensor, name: str) -> torch.Tensor:
    return torch.zeros_like(value)


def _run_block(spec: dict, attach: Callable[[nn.Module], nn.Module] | None) -> dict:
    kind = spec["kind"]
    cfg = _config(spec, spec["self_attention"])
    decoder = kind == "decoder_block"
    if decoder:
        layer = DecoderLayer(cfg, cross=True)
        cross = spec["cross_attention"]
        layer.cross_attention = CrossAttention(cfg.d_model, len(cross["heads"]), cross["d_k"], cross["d_v"],
                                               bias=True, scale=spec["scale"], path="glass")
    else:
        layer = EncoderLayer(cfg)
    layer = layer.double().eval()
    if attach is not None:
        layer = attach(layer)                                               # hooks attached before the probes
    _load_attention(layer.self_attention, spec["self_attention"])
    if decoder:
        _load_attention(layer.cross_attention, spec["cross_attention"])
    ffn = spec["ffn"]
    with torch.no_grad():
        layer.ffn.w_1.weight.copy_(_t(ffn["w_1"].T))
        layer.ffn.w_1.bias.copy_(_t(ffn["b_1"]))
        layer.ffn.w_2.weight.copy_(_t(ffn["w_2"].T))
        layer.ffn.w_2.bias.copy_(_t(ffn["b_2"]))
        for sub, ln in zip(layer.sublayer, spec["layer_norms"], strict=True):
            sub.layer_norm.weight.copy_(_t(ln["gamma"]))
            sub.layer_norm.bias.copy_(_t(ln["beta"]))
            sub.layer_norm.eps = spec["eps"]
    off = {f"self_attention.head.{h}.output": _switched_off for h in spec["disabled_heads"]}

    x = _t(spec["x"])[None]                                                 # (1, n, d)
    n = x.size(1)
    visible = _visibility(spec, n, n)
    causal = isinstance(spec["mask"], str) and spec["mask"] == "causal"
    # recorded before the switch: a switched-off head's own output is still shown, its concat columns are 0
    with torch.no_grad(), probes(layer) as r, intervene(layer, off):
        if decoder:
            memory = _t(spec["memory"])[None]                               # (1, m, d)
            pad = spec["memory_padding"]
            memory_mask = padding_mask(torch.from_numpy(pad)[None]) if pad is not None else None
            layer(x, memory, visible, memory_mask, causal=causal)
        else:
            layer(x, visible, causal=causal)
    result = {"version": VERSION, "kind": kind,
              "self_attention": _attention_output(r, "self_attention", len(spec["self_attention"]["heads"]),
                                                  spec["disabled_heads"])}
    if decoder:
        result["cross_attention"] = _attention_output(r, "cross_attention", len(spec["cross_attention"]["heads"]),
                                                      [])
    result["ffn"] = {"hidden": _plain(r["ffn.hidden"][0]), "output": _plain(r["ffn.output"][0])}
    result["sublayers"] = [{"name": name, **{key: _plain(r[f"sublayer.{s}.{key}"][0])
                                             for key in ("input", "residual", "normed")}}
                           for s, name in enumerate(SUBLAYERS[kind])]
    result["output"] = _plain(r["output"][0])
    return result


def run_spec(doc: Any, attach: Callable[[nn.Module], nn.Module] | None = None) -> dict:
    """Validate a trace-spec v1 document and compute every intermediate with the model's layers in float64.

    Returns plain JSON: lists of floats, None (null) for masked scaled scores. `attach` is called with
    the block's layer once it is built (the claims use it to plant a bug through the hook points).
    """
    spec = validate_spec(doc)
    if spec["kind"] == "attention":
        return _run_attention(spec)
    return _run_block(spec, attach)
