"""Trace spec v1: validate a JSON document, run it through the model's own layers in float64,
and return every intermediate as plain JSON (the contract is summarised in docs/lesson.md).

Conventions of the lesson: row vectors, `x @ W`, so a projection is stored d_in × d_out (the
transpose of `nn.Linear.weight`). Masks: true = may attend. Padding flags: true = PAD.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..model.attention import CrossAttention, MultiHeadAttention
from ..model.config import ModelConfig
from ..model.hooks import intervene, probes
from ..model.layers import DecoderLayer, EncoderLayer
from ..model.masks import causal_mask, padding_mask

VERSION = 1
KINDS = ("attention", "encoder_block", "decoder_block")
NORMS = ("post", "pre")
MASK_WORDS = ("none", "causal")
ACTIVATIONS = ("relu",)
HEAD_KEYS = ("q", "k", "v", "scores", "scaled_scores", "weights", "output")
SUBLAYERS = {"encoder_block": ("self_attention", "ffn"),
             "decoder_block": ("self_attention", "cross_attention", "ffn")}

_COMMON = {"version", "kind", "scale", "mask", "key_padding"}
_KEYS = {
    "attention": (_COMMON | {"q", "k", "v"}, {"version", "kind", "q", "k", "v"}),
    "encoder_block": (_COMMON | {"x", "self_attention", "ffn", "norm", "eps", "layer_norms", "disabled_heads"},
                      {"version", "kind", "x", "self_attention", "ffn"}),
    "decoder_block": (_COMMON | {"x", "memory", "self_attention", "cross_attention", "ffn", "norm", "eps",
                                 "layer_norms", "disabled_heads", "memory_padding"},
                      {"version", "kind", "x", "memory", "self_attention", "cross_attention", "ffn"}),
}


class SpecError(UsageError):
    """A trace spec that breaks the v1 contract; the message is one line naming the field and shapes."""


# ---- small parsers: each names the field it reads ---------------------------------------------

def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def _shape(a: np.ndarray) -> str:
    return "×".join(str(n) for n in a.shape)


def _keys(obj: Any, path: str, allowed: set[str], required: set[str]) -> dict:
    """An object with only `allowed` keys and every `required` one."""
    if not isinstance(obj, dict):
        raise SpecError(f"{path}: expected an object, got {_type_name(obj)}")
    for key in obj:
        if key not in allowed:
            where = f"{path}.{key}" if path != "spec" else str(key)
            raise SpecError(f"{where}: unknown key (allowed here: {', '.join(sorted(allowed))})")
    for key in sorted(required):
        if key not in obj:
            raise SpecError(f"{path}: missing required key {key!r}")
    return obj


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{path}: expected a number, got {_type_name(value)}")
    if not math.isfinite(value):
        raise SpecError(f"{path}: non-finite number {value!r}")
    return float(value)


def _vector(value: Any, path: str) -> np.ndarray:
    """A non-empty list of finite numbers."""
    if not isinstance(value, list):
        raise SpecError(f"{path}: expected a list of numbers, got {_type_name(value)}")
    if not value:
        raise SpecError(f"{path}: empty list")
    return np.array([_number(v, f"{path}[{i}]") for i, v in enumerate(value)], dtype=np.float64)


def _matrix(value: Any, path: str) -> np.ndarray:
    """A non-empty list of equally long, non-empty rows of finite numbers."""
    if not isinstance(value, list):
        raise SpecError(f"{path}: expected a matrix (list of rows), got {_type_name(value)}")
    if not value:
        raise SpecError(f"{path}: no rows")
    rows = []
    for i, row in enumerate(value):
        if not isinstance(row, list):
            raise SpecError(f"{path}[{i}]: expected a row (list of numbers), got {_type_name(row)}")
        rows.append([_number(v, f"{path}[{i}][{j}]") for j, v in enumerate(row)])
        if len(rows[i]) != len(rows[0]):
            raise SpecError(f"{path}[{i}]: ragged rows: row 0 has {len(rows[0])} numbers, row {i} has {len(rows[i])}")
    if not rows[0]:
        raise SpecError(f"{path}: rows have no numbers (0 columns)")
    return np.array(rows, dtype=np.float64)


def _expect(a: np.ndarray, path: str, rows: int | None, cols: int | None, what: str) -> np.ndarray:
    """Check a matrix against the shape the rest of the spec implies; `what` names the dimensions."""
    if (rows is not None and a.shape[0] != rows) or (cols is not None and a.shape[1] != cols):
        want = f"{'?' if rows is None else rows}×{'?' if cols is None else cols}"
        raise SpecError(f"{path}: expected {want} ({what}), got {_shape(a)}")
    return a


def _sized_vector(value: Any, path: str, n: int, what: str) -> np.ndarray:
    v = _vector(value, path)
    if v.shape[0] != n:
        raise SpecError(f"{path}: expected length {n} ({what}), got {v.shape[0]}")
    return v


def _bools(value: Any, path: str, n: int, what: str) -> np.ndarray:
    if not isinstance(value, list):
        raise SpecError(f"{path}: expected a list of true/false, got {_type_name(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, bool):
            raise SpecError(f"{path}[{i}]: expected true/false, got {_type_name(v)}")
    if len(value) != n:
        raise SpecError(f"{path}: expected length {n} ({what}), got {len(value)}")
    return np.array(value, dtype=bool)


def _mask(value: Any, n: int, m: int) -> str | np.ndarray:
    if isinstance(value, str):
        if value not in MASK_WORDS:
            raise SpecError(f"mask: expected \"none\", \"causal\" or an n×m table of true/false, got {value!r}")
        return value
    if not isinstance(value, list):
        raise SpecError(f"mask: expected \"none\", \"causal\" or an n×m table of true/false, got {_type_name(value)}")
    if len(value) != n:
        raise SpecError(f"mask: expected {n}×{m} (n×m), got {len(value)} rows")
    for i, row in enumerate(value):
        if not isinstance(row, list):
            raise SpecError(f"mask[{i}]: expected a row of true/false, got {_type_name(row)}")
        for j, v in enumerate(row):
            if not isinstance(v, bool):
                raise SpecError(f"mask[{i}][{j}]: expected true/false, got {_type_name(v)}")
        if len(row) != m:
            raise SpecError(f"mask: expected {n}×{m} (n×m), got row {i} of length {len(row)}")
    return np.array(value, dtype=bool).reshape(n, m)


def _attention_weights(obj: Any, path: str, d: int) -> dict:
    """One attention sub-layer: per-head projections, w_o, biases (omitted = zero)."""
    _keys(obj, path, {"heads", "w_o", "b_o"}, {"heads", "w_o"})
    heads_in = obj["heads"]
    if not isinstance(heads_in, list):
        raise SpecError(f"{path}.heads: expected a list of heads, got {_type_name(heads_in)}")
    if not heads_in:
        raise SpecError(f"{path}.heads: no heads")
    heads, d_k, d_v = [], None, None
    for r, head in enumerate(heads_in):
        hp = f"{path}.heads[{r}]"
        _keys(head, hp, {"w_q", "w_k", "w_v", "b_q", "b_k", "b_v"}, {"w_q", "w_k", "w_v"})
        w_q = _expect(_matrix(head["w_q"], f"{hp}.w_q"), f"{hp}.w_q", d, d_k, "d×d_k")
        d_k = w_q.shape[1]
        w_k = _expect(_matrix(head["w_k"], f"{hp}.w_k"), f"{hp}.w_k", d, d_k, "d×d_k")
        w_v = _expect(_matrix(head["w_v"], f"{hp}.w_v"), f"{hp}.w_v", d, d_v, "d×d_v")
        d_v = w_v.shape[1]
        bias = {name: (_sized_vector(head[name], f"{hp}.{name}", size, what) if name in head
                       else np.zeros(size))
                for name, size, what in (("b_q", d_k, "d_k"), ("b_k", d_k, "d_k"), ("b_v", d_v, "d_v"))}
        heads.append({"w_q": w_q, "w_k": w_k, "w_v": w_v, **bias})
    n_heads = len(heads)
    w_o = _expect(_matrix(obj["w_o"], f"{path}.w_o"), f"{path}.w_o", n_heads * d_v, d,
                  f"(H·d_v)×d with H={n_heads}, d_v={d_v}")
    b_o = _sized_vector(obj["b_o"], f"{path}.b_o", d, "d") if "b_o" in obj else np.zeros(d)
    return {"heads": heads, "w_o": w_o, "b_o": b_o, "d_k": d_k, "d_v": d_v}


def validate_spec(doc: Any) -> dict:
    """Check a trace-spec v1 document; return it with defaults filled in and every matrix a float64 array.

    Raises SpecError (one line: the field path and the shapes involved) for anything the contract
    calls an error.
    """
    if not isinstance(doc, dict):
        raise SpecError(f"spec: expected a JSON object, got {_type_name(doc)}")
    if "version" not in doc:
        raise SpecError("spec: missing required key 'version'")
    version = doc["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version != VERSION:
        raise SpecError(f"version: expected {VERSION}, got {version!r}")
    if "kind" not in doc:
        raise SpecError("spec: missing required key 'kind'")
    kind = doc["kind"]
    if kind not in KINDS:
        raise SpecError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    allowed, required = _KEYS[kind]
    _keys(doc, "spec", allowed, required)

    out: dict[str, Any] = {"version": VERSION, "kind": kind}
    scale = doc.get("scale", True)
    if not isinstance(scale, bool):
        raise SpecError(f"scale: expected true/false, got {_type_name(scale)}")
    out["scale"] = scale

    if kind == "attention":
        q = _matrix(doc["q"], "q")
        k = _expect(_matrix(doc["k"], "k"), "k", None, q.shape[1], "m×d_k, d_k from q")
        v = _expect(_matrix(doc["v"], "v"), "v", k.shape[0], None, "m×d_v, m from k")
        n, m = q.shape[0], k.shape[0]
        out.update(q=q, k=k, v=v)
    else:
        x = _matrix(doc["x"], "x")
        n, d = x.shape
        m = n
        out["x"] = x
        if kind == "decoder_block":
            out["memory"] = _expect(_matrix(doc["memory"], "memory"), "memory", None, d, "m×d, d from x")
        out["self_attention"] = _attention_weights(doc["self_attention"], "self_attention", d)
        if kind == "decoder_block":
            out["cross_attention"] = _attention_weights(doc["cross_attention"], "cross_attention", d)
        ffn = _keys(doc["ffn"], "ffn", {"w_1", "b_1", "w_2", "b_2", "activation"}, {"w_1", "w_2"})
        w_1 = _expect(_matrix(ffn["w_1"], "ffn.w_1"), "ffn.w_1", d, None, "d×d_ff")
        d_ff = w_1.shape[1]
        w_2 = _expect(_matrix(ffn["w_2"], "ffn.w_2"), "ffn.w_2", d_ff, d, "d_ff×d")
        activation = ffn.get("activation", "relu")
        if activation not in ACTIVATIONS:
            raise SpecError(f"ffn.activation: expected one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        out["ffn"] = {"w_1": w_1, "w_2": w_2, "activation": activation,
                      "b_1": _sized_vector(ffn["b_1"], "ffn.b_1", d_ff, "d_ff") if "b_1" in ffn else np.zeros(d_ff),
                      "b_2": _sized_vector(ffn["b_2"], "ffn.b_2", d, "d") if "b_2" in ffn else np.zeros(d)}
        norm = doc.get("norm", "post")
        if norm not in NORMS:
            raise SpecError(f"norm: expected \"post\" or \"pre\", got {norm!r}")
        out["norm"] = norm
        eps = _number(doc.get("eps", 1e-5), "eps")
        if eps < 0:
            raise SpecError(f"eps: must not be negative, got {eps!r}")
        out["eps"] = eps
        n_sub = len(SUBLAYERS[kind])
        norms = doc.get("layer_norms")
        if norms is None:
            out["layer_norms"] = [{"gamma": np.ones(d), "beta": np.zeros(d)} for _ in range(n_sub)]
        else:
            if not isinstance(norms, list):
                raise SpecError(f"layer_norms: expected a list of {n_sub} objects, got {_type_name(norms)}")
            if len(norms) != n_sub:
                raise SpecError(f"layer_norms: expected {n_sub} (one per sub-layer of {kind}), got {len(norms)}")
            out["layer_norms"] = []
            for s, entry in enumerate(norms):
                p = f"layer_norms[{s}]"
                _keys(entry, p, {"gamma", "beta"}, set())
                out["layer_norms"].append({
                    "gamma": _sized_vector(entry["gamma"], f"{p}.gamma", d, "d") if "gamma" in entry else np.ones(d),
                    "beta": _sized_vector(entry["beta"], f"{p}.beta", d, "d") if "beta" in entry else np.zeros(d)})
        disabled = doc.get("disabled_heads", [])
        if not isinstance(disabled, list):
            raise SpecError(f"disabled_heads: expected a list of head indices, got {_type_name(disabled)}")
        n_heads = len(out["self_attention"]["heads"])
        for i, h in enumerate(disabled):
            if isinstance(h, bool) or not isinstance(h, int):
                raise SpecError(f"disabled_heads[{i}]: expected a head index (integer), got {_type_name(h)}")
            if not 0 <= h < n_heads:
                raise SpecError(f"disabled_heads[{i}]: head {h} out of range 0..{n_heads - 1} (H={n_heads})")
        out["disabled_heads"] = sorted(set(disabled))
        if kind == "decoder_block":
            m_rows = out["memory"].shape[0]
            out["memory_padding"] = (_bools(doc["memory_padding"], "memory_padding", m_rows, "rows of memory")
                                     if "memory_padding" in doc else None)
    out["mask"] = _mask(doc.get("mask", "none"), n, m)
    out["key_padding"] = (_bools(doc["key_padding"], "key_padding", m, "m, the number of keys")
                          if "key_padding" in doc else None)
    return out


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
    """Spec weights (x @ W, head-major) into the fused in_proj rows [W^Q heads | W^K heads | W^V heads]."""
    heads = p["heads"]
    w = np.concatenate([h[name] for name in ("w_q", "w_k", "w_v") for h in heads], axis=1)  # (d, H(2d_k+d_v))
    b = np.concatenate([h[name] for name in ("b_q", "b_k", "b_v") for h in heads])
    mha.load_state_dict({"in_proj.weight": _t(w.T), "in_proj.bias": _t(b),   # cross-attention splits the rows
                         "out_proj.weight": _t(p["w_o"].T), "out_proj.bias": _t(p["b_o"])})  # (d, H·d_v)


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
    pick = torch.zeros(2 * d_k + d_v, width, dtype=torch.float64)           # rows: [W^Q | W^K | W^V]
    pick[:d_k, :d_k] = torch.eye(d_k)
    pick[d_k: 2 * d_k, :d_k] = torch.eye(d_k)
    pick[2 * d_k:, d_k:] = torch.eye(d_v)
    mha.load_state_dict({"in_proj.weight": pick, "out_proj.weight": mha.out_proj.weight.detach()})
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
                       dropout=0.0, attention_dropout=0.0, norm=spec["norm"],
                       eps=spec["eps"] if spec["eps"] > 0 else 1e-5, positions="none",
                       scale_scores=spec["scale"], bias=True, attention_path="glass")


def _switched_off(value: torch.Tensor, name: str) -> torch.Tensor:
    return torch.zeros_like(value)


def _run_block(spec: dict) -> dict:
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
            sub.norm.weight.copy_(_t(ln["gamma"]))
            sub.norm.bias.copy_(_t(ln["beta"]))
            sub.norm.eps = spec["eps"]
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


def run_spec(doc: Any) -> dict:
    """Validate a trace-spec v1 document and compute every intermediate with the model's layers in float64.

    Returns plain JSON: lists of floats, None (null) for masked scaled scores.
    """
    spec = validate_spec(doc)
    if spec["kind"] == "attention":
        return _run_attention(spec)
    return _run_block(spec)
