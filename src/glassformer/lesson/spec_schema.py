"""Trace spec v1, the checking half: the document's schema, its shapes, and its work limits.

`validate_spec(doc)` checks a parsed JSON document in three passes, each naming the field it reads:
1. the schema (`AttentionSpec`, `EncoderBlockSpec`, `DecoderBlockSpec`) through the one validation
   layer: keys, types, finite numbers, literal choices;
2. the work limits (glassformer.limits: rows, widths, heads, elements of every matrix and of the
   answer), before any array is built;
3. the shapes the rest of the spec implies (d×d_k, (H·d_v)×d, n×m, ...).
It returns the document with defaults filled in and every matrix a float64 array; `spec.run_spec`
runs it through the model's layers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, Discriminator, Field, Tag

from .. import limits
from ..errors import UsageError
from ..validation import Schema, type_name, validate

VERSION = 1
KINDS = ("attention", "encoder_block", "decoder_block")
SUBLAYERS = {"encoder_block": ("self_attention", "ffn"),
             "decoder_block": ("self_attention", "cross_attention", "ffn")}


class SpecError(UsageError):
    """A trace spec that breaks the v1 contract; the message is one line naming the field and shapes,
    `.field` is that field's path."""


# ---- 1. the schema -----------------------------------------------------------------------------

def _version(value: int) -> int:
    if value != VERSION:
        raise ValueError(f"expected {VERSION}, got {value!r}")
    return value


def _not_negative(value: float) -> float:
    if value < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    return value


Matrix = Annotated[list[list[float]], Field(min_length=1)]   # rectangular and non-empty: checked in pass 2
Vector = Annotated[list[float], Field(min_length=1)]
Mask = Annotated[Annotated[Literal["none", "causal"], Tag("§word")] | Annotated[list[list[bool]], Tag("§table")],
                 Discriminator(lambda v: "§word" if isinstance(v, str) else "§table")]


class HeadSpec(Schema):
    w_q: Matrix
    w_k: Matrix
    w_v: Matrix
    b_q: Vector | None = None
    b_k: Vector | None = None
    b_v: Vector | None = None


class AttentionWeights(Schema):
    heads: Annotated[list[HeadSpec], Field(min_length=1)]
    w_o: Matrix
    b_o: Vector | None = None


class FFNSpec(Schema):
    w_1: Matrix
    w_2: Matrix
    b_1: Vector | None = None
    b_2: Vector | None = None
    activation: Literal["relu"] = "relu"


class LayerNormSpec(Schema):
    gamma: Vector | None = None
    beta: Vector | None = None


class _Common(Schema):
    version: Annotated[int, AfterValidator(_version)]
    scale: bool = True
    mask: Mask = "none"
    key_padding: list[bool] | None = None


class AttentionSpec(_Common):
    kind: Literal["attention"]
    q: Matrix
    k: Matrix
    v: Matrix


class EncoderBlockSpec(_Common):
    kind: Literal["encoder_block"]
    x: Matrix
    self_attention: AttentionWeights
    ffn: FFNSpec
    norm: Literal["post", "pre"] = "post"
    eps: Annotated[float, AfterValidator(_not_negative)] = 1e-5
    layer_norms: list[LayerNormSpec] | None = None
    disabled_heads: list[int] = []


class DecoderBlockSpec(EncoderBlockSpec):
    kind: Literal["decoder_block"]
    memory: Matrix
    cross_attention: AttentionWeights
    memory_padding: list[bool] | None = None


SCHEMAS = {"attention": AttentionSpec, "encoder_block": EncoderBlockSpec, "decoder_block": DecoderBlockSpec}


# ---- 2. limits and rectangular matrices, before any array is built ---------------------------------

def _shape(a: np.ndarray) -> str:
    return "×".join(str(n) for n in a.shape)


def _elements(what: str, n: int, field: str) -> None:
    limits.check(f"{what}: number of elements", n, "MAX_MATRIX_ELEMENTS", field)


def _matrix(rows: list[list[float]], path: str, *, data: bool = False) -> np.ndarray:
    """Rows of equal, non-zero length within the limits, as a float64 array. `data`: rows are tokens."""
    if data:
        limits.check(f"{path}: rows", len(rows), "MAX_SPEC_ROWS", path)
    width = len(rows[0])
    limits.check(f"{path}: columns", width, "MAX_SPEC_WIDTH", path)
    for i, row in enumerate(rows):
        if len(row) != width:
            raise SpecError(f"{path}[{i}]: ragged rows: row 0 has {width} numbers, row {i} has {len(row)}",
                            f"{path}[{i}]")
    if not width:
        raise SpecError(f"{path}: rows have no numbers (0 columns)", path)
    _elements(path, len(rows) * width, path)
    return _finite(np.array(rows, dtype=np.float64), path)


def _finite(a: np.ndarray, path: str) -> np.ndarray:
    """`a` when no number is beyond ±MAX_SPEC_MAGNITUDE: within it, within the size limits, no intermediate of a
    block overflows float64 (the largest, a layer norm's sum of squares, is below (width · magnitude)^6 < 1e89), so
    the model and the float64 reference agree and `null` means a masked or 0/0 number only."""
    bound, magnitude = limits.MAX_SPEC_MAGNITUDE, np.abs(a)
    if a.size and limits.enforced() and magnitude.max() > bound:
        at = np.unravel_index(int(magnitude.argmax()), a.shape)
        where = path + "".join(f"[{i}]" for i in at)
        number = np.format_float_scientific(a[at], trim="-")            # as the page's engine writes it
        raise limits.LimitError(f"{where}: {number} is beyond ±{bound:g} (MAX_SPEC_MAGNITUDE)", where)
    return a


def _expect(a: np.ndarray, path: str, rows: int | None, cols: int | None, what: str) -> np.ndarray:
    """Check a matrix against the shape the rest of the spec implies; `what` names the dimensions."""
    if (rows is not None and a.shape[0] != rows) or (cols is not None and a.shape[1] != cols):
        want = f"{'?' if rows is None else rows}×{'?' if cols is None else cols}"
        raise SpecError(f"{path}: expected {want} ({what}), got {_shape(a)}", path)
    return a


def _vector(value: list[float] | None, path: str, n: int, what: str, default: float = 0.0) -> np.ndarray:
    if value is None:
        return np.full(n, default)
    if len(value) != n:
        raise SpecError(f"{path}: expected length {n} ({what}), got {len(value)}", path)
    return _finite(np.array(value, dtype=np.float64), path)


def _bools(value: list[bool], path: str, n: int, what: str) -> np.ndarray:
    if len(value) != n:
        raise SpecError(f"{path}: expected length {n} ({what}), got {len(value)}", path)
    return np.array(value, dtype=bool)


# ---- 3. shapes ------------------------------------------------------------------------------------

def _attention_weights(p: AttentionWeights, path: str, d: int, n: int, m: int) -> dict:
    """One attention sub-layer: per-head projections, w_o, biases (omitted = zero)."""
    limits.check(f"{path}.heads: number of heads", len(p.heads), "MAX_SPEC_HEADS", f"{path}.heads")
    heads, d_k, d_v = [], None, None
    for r, head in enumerate(p.heads):
        hp = f"{path}.heads[{r}]"
        w_q = _expect(_matrix(head.w_q, f"{hp}.w_q"), f"{hp}.w_q", d, d_k, "d×d_k")
        d_k = w_q.shape[1]
        w_k = _expect(_matrix(head.w_k, f"{hp}.w_k"), f"{hp}.w_k", d, d_k, "d×d_k")
        w_v = _expect(_matrix(head.w_v, f"{hp}.w_v"), f"{hp}.w_v", d, d_v, "d×d_v")
        d_v = w_v.shape[1]
        heads.append({"w_q": w_q, "w_k": w_k, "w_v": w_v,
                      "b_q": _vector(head.b_q, f"{hp}.b_q", d_k, "d_k"),
                      "b_k": _vector(head.b_k, f"{hp}.b_k", d_k, "d_k"),
                      "b_v": _vector(head.b_v, f"{hp}.b_v", d_v, "d_v")})
    n_heads = len(heads)
    _elements(f"{path}: scores (n×m per head)", n * m, path)
    w_o = _expect(_matrix(p.w_o, f"{path}.w_o"), f"{path}.w_o", n_heads * d_v, d,
                  f"(H·d_v)×d with H={n_heads}, d_v={d_v}")
    return {"heads": heads, "w_o": w_o, "b_o": _vector(p.b_o, f"{path}.b_o", d, "d"), "d_k": d_k, "d_v": d_v}


def _attention_numbers(p: dict, n: int, m: int, d: int) -> int:
    """Numbers one traced attention sub-layer answers with (q, k, v, three n×m tables, outputs)."""
    per_head = n * p["d_k"] + m * p["d_k"] + m * p["d_v"] + 3 * n * m + n * p["d_v"]
    return len(p["heads"]) * per_head + n * len(p["heads"]) * p["d_v"] + n * d


def _mask(value: str | list[list[bool]], n: int, m: int) -> str | np.ndarray:
    if isinstance(value, str):
        return value
    if len(value) != n:
        raise SpecError(f"mask: expected {n}×{m} (n×m), got {len(value)} rows", "mask")
    for i, row in enumerate(value):
        if len(row) != m:
            raise SpecError(f"mask: expected {n}×{m} (n×m), got row {i} of length {len(row)}", f"mask[{i}]")
    return np.array(value, dtype=bool).reshape(n, m)


def _parse(doc: Any) -> AttentionSpec | EncoderBlockSpec | DecoderBlockSpec:
    """Pass 1: the schema for the document's kind."""
    if not isinstance(doc, dict):
        raise SpecError(f"spec: expected a JSON object, got {type_name(doc)}", "spec")
    for key in ("version", "kind"):
        if key not in doc:
            raise SpecError(f"{key}: missing required key {key!r}", key)
    kind = doc["kind"]
    if not isinstance(kind, str) or kind not in SCHEMAS:
        shown = repr(kind) if isinstance(kind, str) and len(kind) < 40 else type_name(kind)
        raise SpecError(f"kind: expected one of {', '.join(KINDS)}, got {shown}", "kind")
    _bounded(doc, "")
    return validate(SCHEMAS[kind], doc, error_type=SpecError)


def _bounded(node: Any, path: str) -> None:
    """Pass 0, on the parsed JSON before the schema builds anything of it: no list holds more than
    MAX_MATRIX_ELEMENTS values (a matrix: counted over its rows) and no sub-layer more than MAX_SPEC_HEADS heads,
    so the schema's work and its list of problems (one per bad cell) stay small for any file within its limit."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "heads" and isinstance(value, list):
                limits.check(f"{where}: number of heads", len(value), "MAX_SPEC_HEADS", where)
            _bounded(value, where)
    elif isinstance(node, list):
        _elements(path, sum(len(item) if isinstance(item, list) else 1 for item in node), path)
        for i, item in enumerate(node):                   # deeper than a matrix's rows: objects, nested lists
            if isinstance(item, dict) or isinstance(item, list) and any(isinstance(x, (dict, list)) for x in item):
                _bounded(item, f"{path}[{i}]")


def validate_spec(doc: Any) -> dict:
    """Check a trace-spec v1 document; return it with defaults filled in and every matrix a float64 array.

    Raises SpecError (one line: the field path and the shapes involved; `.field` the path) for anything
    the contract calls an error, and LimitError for a size over one of glassformer.limits.
    """
    s = _parse(doc)
    out: dict[str, Any] = {"version": VERSION, "kind": s.kind, "scale": s.scale}
    if isinstance(s, AttentionSpec):
        q = _matrix(s.q, "q", data=True)
        k = _expect(_matrix(s.k, "k", data=True), "k", None, q.shape[1], "m×d_k, d_k from q")
        v = _expect(_matrix(s.v, "v", data=True), "v", k.shape[0], None, "m×d_v, m from k")
        n, (m, d_v) = q.shape[0], v.shape
        _elements("scores (n×m)", n * m, "k")
        limits.check("answer: numbers", 3 * n * m + n * d_v, "MAX_OUTPUT_ELEMENTS")
        out.update(q=q, k=k, v=v)
    else:
        x = _matrix(s.x, "x", data=True)
        n, d = x.shape
        m = n
        out["x"] = x
        decoder = isinstance(s, DecoderBlockSpec)
        if decoder:
            out["memory"] = _expect(_matrix(s.memory, "memory", data=True), "memory", None, d, "m×d, d from x")
        out["self_attention"] = _attention_weights(s.self_attention, "self_attention", d, n, n)
        numbers = _attention_numbers(out["self_attention"], n, n, d)
        if decoder:
            m_mem = out["memory"].shape[0]
            out["cross_attention"] = _attention_weights(s.cross_attention, "cross_attention", d, n, m_mem)
            numbers += _attention_numbers(out["cross_attention"], n, m_mem, d)
        w_1 = _expect(_matrix(s.ffn.w_1, "ffn.w_1"), "ffn.w_1", d, None, "d×d_ff")
        d_ff = w_1.shape[1]
        _elements("ffn: hidden (n×d_ff)", n * d_ff, "ffn.w_1")
        w_2 = _expect(_matrix(s.ffn.w_2, "ffn.w_2"), "ffn.w_2", d_ff, d, "d_ff×d")
        n_sub = len(SUBLAYERS[s.kind])
        limits.check("answer: numbers", numbers + n * d_ff + n * d * (3 * n_sub + 2), "MAX_OUTPUT_ELEMENTS")
        out["ffn"] = {"w_1": w_1, "w_2": w_2, "activation": s.ffn.activation,
                      "b_1": _vector(s.ffn.b_1, "ffn.b_1", d_ff, "d_ff"), "b_2": _vector(s.ffn.b_2, "ffn.b_2", d, "d")}
        out["norm"], out["eps"] = s.norm, s.eps
        if s.layer_norms is None:
            out["layer_norms"] = [{"gamma": np.ones(d), "beta": np.zeros(d)} for _ in range(n_sub)]
        elif len(s.layer_norms) != n_sub:
            raise SpecError(f"layer_norms: expected {n_sub} (one per sub-layer of {s.kind}), got "
                            f"{len(s.layer_norms)}", "layer_norms")
        else:
            out["layer_norms"] = [{"gamma": _vector(ln.gamma, f"layer_norms[{i}].gamma", d, "d", 1.0),
                                   "beta": _vector(ln.beta, f"layer_norms[{i}].beta", d, "d")}
                                  for i, ln in enumerate(s.layer_norms)]
        n_heads = len(out["self_attention"]["heads"])
        for i, h in enumerate(s.disabled_heads):
            if not 0 <= h < n_heads:
                raise SpecError(f"disabled_heads[{i}]: head {h} out of range 0..{n_heads - 1} (H={n_heads})",
                                f"disabled_heads[{i}]")
        out["disabled_heads"] = sorted(set(s.disabled_heads))
        if decoder:
            out["memory_padding"] = (_bools(s.memory_padding, "memory_padding", out["memory"].shape[0],
                                            "rows of memory") if s.memory_padding is not None else None)
    out["mask"] = _mask(s.mask, n, m)
    out["key_padding"] = (_bools(s.key_padding, "key_padding", m, "m, the number of keys")
                          if s.key_padding is not None else None)
    return out
