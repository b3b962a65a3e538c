"""The bug library: each misconception a named float64 variant of the lesson's computation.

There is one computation, `cells(sheet, switches)`: the trace-spec v1 output of a sheet, cell by cell
(a cell is one table of the output, named by its dotted path: `self_attention.heads.0.weights`,
`sublayers.1.normed`, `output`). Each cell reads earlier cells, so the same computation can be run
from a student's own numbers (`run(..., own=answers)`): every cell is then recomputed from what the
student wrote before it. With the default `Switches()` it is the lesson's formula and agrees with
lesson/reference.py; a bug is a set of switches (one or a few readings of the same misconception),
never a table of numbers.

The same computation judges a student's own code (judge.py): its probes are sheet-like inputs of the kinds
"multi_head" (self-attention alone) and "decoder" (masked self-attention, cross-attention, FFN) besides
"attention" and "block", and `visible`, `layer_norm` and `sinusoidal_positions` serve the tasks that
return a mask, a LayerNorm or a position table. BUGS are the misconceptions a sheet can show; CODE_BUGS
those only code makes (a mask read the other way round, a masked row left NaN, a position table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

# ---- the switches: one field per place a computation can go wrong ------------------------------

@dataclass(frozen=True)
class Switches:
    """How one run computes. The defaults are the lesson's formulas."""

    divide_by: str = "d_k"            # "d_k" | "d_model" | "none" (before the softmax)
    divide_after_softmax: bool = False  # ÷√d_k applied to the weights instead
    softmax_over: str = "keys"        # "keys" | "queries"
    transposed_scores: bool = False   # S = K Qᵀ instead of Q Kᵀ
    mask_after_softmax: bool = False  # softmax over every key, then masked weights set to 0
    causal_shift: int = 0             # 0: query i sees keys j <= i; -1: j < i; +1: j <= i + 1
    ln_over: str = "features"         # "features" (one row) | "table" (all rows together) | "positions"
    ln_ddof: int = 0                  # 0: population variance (÷d); 1: the n-1 estimate
    eps_outside_sqrt: bool = False    # (x − μ)/(√σ² + ε) instead of (x − μ)/√(σ² + ε)
    residual: bool = True             # x + Sub(x) (False: Sub(x) alone)
    placement: str | None = None      # None: the sheet's; "pre" / "post": that placement instead
    output_projection: bool = True    # Concat(...) W^O (False: the concat itself)
    heads_reversed: bool = False      # Concat(H_H, ..., H_1)
    relu: bool = True                 # FFN hidden = ReLU(x W_1 + b_1) (False: no ReLU)
    mask_inverted: bool = False       # a given mask read as True = hidden (nn.MultiheadAttention's attn_mask)
    no_visible_key: str = "zeros"     # a query with no visible key: "zeros" | "nan" (softmax of all −∞) |
                                      # "uniform" (−1e9 in place of −∞: 1/m on every key)
    pe_swapped: bool = False          # cos at the even columns, sin at the odd ones
    pe_layout: str = "interleaved"    # "interleaved" (2r: sin, 2r+1: cos) | "halves" (all sines, then all cosines)
    pe_rate: str = "pair"             # exponent of column j: "pair" 2r/d (j = 2r, 2r+1) | "column" j/d | "double" 2j/d
    scope: str | None = None          # a block's sub-layer ("self_attention", "cross_attention", "ffn") whose
                                      # attention, residual and LayerNorm alone compute so (None: all of them)


RIGHT = Switches()


# ---- the bugs --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bug:
    id: str
    readings: tuple[Switches, ...]     # the ways a student (or a program) commits it
    claim: str                         # the lesson claim it breaks (shared/lesson/CLAIMS.md)
    en: str                            # the rule broken, one sentence
    zh: str
    source: str = ""                   # a public bug report where one was found
    needs: tuple[str, ...] = ()        # "mask", "causal", "block", "heads>1", "post", "pre"


BUGS: tuple[Bug, ...] = (
    Bug("no-scale", (Switches(divide_by="none"),), "A4",
        "Scores are divided by √d_k before the softmax; here they were not divided at all.",
        "softmax 之前要把得分除以 √d_k；这里完全没有除。",
        "https://github.com/PAIR-code/tiny-transformers/issues/71"),
    Bug("scale-after-softmax", (Switches(divide_by="none", divide_after_softmax=True),), "A4",
        "Dot product, then ÷√d_k, then softmax — never softmax first; here the weights were divided instead.",
        "先点积、再除以 √d_k、再 softmax，不能先 softmax；这里除的是权重。",
        "https://github.com/FrancescoSaverioZuppichini/ViT/issues/2"),
    Bug("scale-by-d-model", (Switches(divide_by="d_model"),), "B1",
        "Each head divides by √d_k, its own key width; here by √d_model, the width of the whole row.",
        "每个头除以自己的 √d_k；这里除的是整行宽度 √d_model。",
        "https://github.com/omihub777/ViT-CIFAR/pull/11", ("heads>1",)),
    Bug("softmax-over-queries", (Switches(softmax_over="queries"),), "A3",
        "Softmax runs along the keys: each query row sums to 1; here the columns do.",
        "softmax 沿 key 方向：每个 query 行之和为 1；这里是每列之和为 1。",
        "https://github.com/nerminnuraydogan/vision-transformer/issues/1"),
    Bug("transposed-scores", (Switches(transposed_scores=True),), "A2",
        "S = QKᵀ: row i is query i against every key; here the table was KQᵀ (rows and columns swapped).",
        "S = QKᵀ：第 i 行是第 i 个 query 对所有 key；这里算成了 KQᵀ（行列对调）。"),
    Bug("mask-after-softmax", (Switches(mask_after_softmax=True),), "D3",
        "Hidden keys get −∞ before the softmax, so visible weights still sum to 1; here the softmax ran over "
        "every key and the hidden weights were zeroed afterwards.",
        "被遮住的 key 在 softmax 之前置为 −∞，可见权重之和仍为 1；这里先对全部 key 做 softmax，再把遮住的权重清零。",
        "https://github.com/huggingface/pytorch-image-models/pull/2236", ("mask",)),
    Bug("causal-off-by-one", (Switches(causal_shift=-1), Switches(causal_shift=1)), "D3",
        "Under the causal mask query i reads keys 1..i, itself included; here the triangle was shifted by one.",
        "因果 mask 下第 i 个 query 读 key 1..i，包括它自己；这里三角错了一格。",
        "https://github.com/RVC-Boss/GPT-SoVITS/issues/965", ("causal",)),
    Bug("ln-across-positions", (Switches(ln_over="table"), Switches(ln_over="positions")), "B5",
        "LayerNorm takes μ and σ² over the d features of one position; here across positions.",
        "LayerNorm 对单个位置的 d 个特征求 μ 与 σ²；这里跨位置求了。",
        "https://github.com/jadore801120/attention-is-all-you-need-pytorch/pull/17", ("block",)),
    Bug("ln-unbiased-variance", (Switches(ln_ddof=1),), "B5",
        "σ² = (1/d) Σ (x_r − μ)²; here the n−1 estimate (÷(d−1)) was used.",
        "σ² = (1/d) Σ (x_r − μ)²；这里用了 n−1 的无偏估计（除以 d−1）。",
        "https://github.com/harvardnlp/annotated-transformer/pull/119", ("block",)),
    Bug("ln-eps-outside-sqrt", (Switches(eps_outside_sqrt=True),), "B5",
        "LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β; here ε was added outside the square root.",
        "LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + β；这里 ε 加在了根号外面。",
        "https://github.com/tracel-ai/burn/issues/2185", ("block",)),
    Bug("no-residual", (Switches(residual=False),), "B4",
        "Each sub-layer adds its input back: LN(x + Sub(x)); here the sub-layer output went on alone.",
        "每个子层都把输入加回来：LN(x + Sub(x))；这里只传了子层输出。",
        "", ("block",)),
    Bug("pre-norm-instead-of-post", (Switches(placement="pre"),), "B4",
        "The 2017 block is post-norm, U = LN₁(X + MHA(X)); here LayerNorm was applied before each sub-layer.",
        "2017 的 block 是 post-norm：U = LN₁(X + MHA(X))；这里把 LayerNorm 放到了子层之前。",
        "https://github.com/harvardnlp/annotated-transformer/issues/110", ("block", "post")),
    Bug("post-norm-instead-of-pre", (Switches(placement="post"),), "B4",
        "A pre-norm block is X + MHA(LN(X)); here LayerNorm was applied after the residual add.",
        "pre-norm block 是 X + MHA(LN(X))；这里把 LayerNorm 放到了残差相加之后。",
        "", ("block", "pre")),
    Bug("no-output-projection", (Switches(output_projection=False),), "B2",
        "MHA(X) = Concat(H_1..H_H) W^O; here the concat was used without W^O.",
        "MHA(X) = Concat(H_1..H_H) W^O；这里拼接后没有乘 W^O。",
        "https://github.com/Kyubyong/transformer/issues/117", ("block",)),
    Bug("heads-concat-reversed", (Switches(heads_reversed=True),), "B2",
        "Concat(H_1, ..., H_H) puts head 1 first; here the heads were concatenated in reverse order.",
        "Concat(H_1, ..., H_H) 中头 1 在最前；这里拼接顺序反了。",
        "", ("block", "heads>1")),
    Bug("ffn-without-relu", (Switches(relu=False),), "B6",
        "FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2; here the ReLU was left out, so negative entries stayed.",
        "FFN(x) = ReLU(x W_1 + b_1) W_2 + b_2；这里漏了 ReLU，负数没有被截为 0。",
        "", ("block",)),
)

# Misconceptions only code can show: a sheet gives no mask to misread, no masked-out row, no position table.
CODE_BUGS: tuple[Bug, ...] = (
    Bug("mask-inverted", (Switches(mask_inverted=True),), "E2",
        "A mask is boolean with True = may attend; here True was read as hidden (nn.MultiheadAttention's "
        "attn_mask convention), so each query read exactly the keys it must not see.",
        "mask 为布尔表，True = 可以看；这里把 True 当成了遮住（nn.MultiheadAttention 的 attn_mask 约定），"
        "每个 query 读的恰好是它不该看的 key。",
        "https://github.com/rasbt/LLMs-from-scratch/issues/1061", ("mask",)),
    Bug("masked-row-not-zeroed", (Switches(no_visible_key="nan"), Switches(no_visible_key="uniform")), "E4",
        "A query with no visible key gets zero weights and a zero output; here its row became NaN (softmax of "
        "all −∞) or spread 1/m over the hidden keys (−1e9 in place of −∞).",
        "没有可见 key 的 query，权重和输出都应为 0；这里这一行成了 NaN（全是 −∞ 的 softmax），"
        "或把 1/m 平均分给了被遮住的 key（用 −1e9 代替 −∞）。",
        "https://github.com/pytorch/pytorch/issues/41508", ("mask",)),
    Bug("positions-sin-cos-swapped", (Switches(pe_swapped=True),), "C4",
        "PE(p, 2r) = sin(p/10000^(2r/d)) and PE(p, 2r+1) = cos(...); here cos went to the even columns and sin to "
        "the odd ones.",
        "PE(p, 2r) = sin(p/10000^(2r/d))，PE(p, 2r+1) = cos(...)；这里偶数列放了 cos，奇数列放了 sin。"),
    Bug("positions-halves", (Switches(pe_layout="halves"),), "C4",
        "The lesson interleaves: column 2r is a sine, column 2r+1 its cosine; here all sines came first and "
        "all cosines after (the layout of tensor2tensor and Marian, not the lesson's).",
        "课文是交错排列：第 2r 列是 sin，第 2r+1 列是同一频率的 cos；这里先放全部 sin 再放全部 cos"
        "（tensor2tensor、Marian 的排法，不是课文的）。"),
    Bug("positions-frequency", (Switches(pe_rate="column"), Switches(pe_rate="double")), "C4",
        "Columns 2r and 2r+1 share one frequency 1/10000^(2r/d); here the exponent came from the column index "
        "(j/d, so each cosine got its own frequency, or 2j/d, the 2 counted twice).",
        "第 2r 与 2r+1 列共用频率 1/10000^(2r/d)；这里指数用了列号（j/d，于是每个 cos 有了自己的频率；"
        "或 2j/d，2 算了两次）。",
        "https://github.com/Kyubyong/transformer/issues/38"),
)

BUG_IDS = tuple(b.id for b in BUGS)
BY_ID = {b.id: b for b in BUGS + CODE_BUGS}


def not_covered(bug: Bug, sheet) -> str | None:
    """Why `bug` cannot show on this kind of sheet (None when it can)."""
    reasons = {
        "block": "the sheet has no LayerNorm, residual, W^O or FFN (an attention sheet)",
        "mask": "the sheet has no mask",
        "causal": "the sheet has no causal mask",
        "heads>1": ("one head" if sheet.kind == "block" else "one head given its Q, K, V")
                   + ": √d_model = √d_k and a concat of one head has no order",
        "post": "the sheet is pre-norm",
        "pre": "the sheet is post-norm",
    }
    for need in bug.needs:
        ok = {"block": sheet.kind == "block", "mask": sheet.has_mask,
              "causal": isinstance(sheet.mask, str) and sheet.mask == "causal",     # (a table: an array)
              "heads>1": sheet.kind == "block" and sheet.n_heads > 1,
              "post": sheet.norm == "post", "pre": sheet.norm == "pre"}[need]
        if not ok:
            return reasons[need]
    if bug.id == "transposed-scores" and sheet.n_queries != sheet.n_keys:
        return "as many queries as keys are needed for KQᵀ to have the shape of QKᵀ"
    if bug.id == "no-output-projection" and sheet.kind == "block" and any(sum(h["w_v"].shape[1] for h in sheet.spec[
            name]["heads"]) != sheet.d_model for name in ("self_attention", "cross_attention") if sheet.spec.get(name)):
        return "H·d_v ≠ d_model: without W^O the heads' concat cannot be added to the residual"
    return None


# ---- the one computation ---------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    path: str
    inputs: tuple[str, ...]
    fn: Callable[..., np.ndarray]


def _visible(sheet, shift: int) -> np.ndarray:
    """(n, m) True = may attend, with the causal triangle shifted by `shift` (0 = the sheet's own)."""
    n, m = sheet.n_queries, sheet.n_keys
    if isinstance(sheet.mask, str) and sheet.mask == "causal":
        i, j = np.arange(n)[:, None], np.arange(m)[None, :]
        return j <= i + shift
    if isinstance(sheet.mask, np.ndarray):
        return sheet.mask.copy()
    return np.ones((n, m), dtype=bool)


def visible(sheet, sw: Switches = RIGHT) -> np.ndarray:
    """(n, m) what each query reads as the switches take the sheet's mask: the causal triangle shifted by
    `sw.causal_shift`, and with `sw.mask_inverted` a given mask read the other way round (no mask: all)."""
    seen = _visible(sheet, sw.causal_shift)
    masked = not (isinstance(sheet.mask, str) and sheet.mask == "none")
    return ~seen if sw.mask_inverted and masked else seen


def _softmax(scaled: np.ndarray, visible: np.ndarray, axis: int) -> np.ndarray:
    """Softmax of the visible entries along `axis` (1: over keys, 0: over queries); none visible: zeros."""
    s = np.where(visible, scaled, -np.inf)
    top = np.max(s, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(visible, np.exp(np.where(visible, s - top, 0.0)), 0.0)
    total = e.sum(axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float, sw: Switches = RIGHT) -> np.ndarray:
    """γ ⊙ (x − μ)/√(σ² + ε) + β, μ and σ² over the features of each row (as the switches say)."""
    axis = {"features": 1, "positions": 0, "table": None}[sw.ln_over]
    mu = x.mean(axis=axis, keepdims=True)
    count = x.shape[1] if axis == 1 else x.shape[0] if axis == 0 else x.size
    var = ((x - mu) ** 2).sum(axis=axis, keepdims=True) / max(count - sw.ln_ddof, 1)
    scale = np.sqrt(var) + eps if sw.eps_outside_sqrt else np.sqrt(var + eps)
    return gamma * (x - mu) / scale + beta


def sinusoidal_positions(n: int, d: int, sw: Switches = RIGHT) -> np.ndarray:
    """(n, d) PE(p, 2r) = sin(p / 10000^(2r/d)), PE(p, 2r+1) = cos(p / 10000^(2r/d)) (as the switches say)."""
    p = np.arange(n, dtype=np.float64)[:, None]                             # (n, 1)
    j = np.arange(d)
    pair = j - j % 2                                                        # 2r for columns 2r and 2r+1
    exponent = {"pair": pair, "column": j, "double": 2 * j}[sw.pe_rate] / d
    angle = p / 10000.0 ** exponent                                         # (n, d): column j's angle
    even = j % 2 == 0
    sin, cos = np.sin(angle), np.cos(angle)
    if sw.pe_swapped:
        sin, cos = cos, sin
    table = np.where(even, sin, cos)                                        # (n, d)
    if sw.pe_layout == "halves":
        table = np.concatenate([table[:, even], table[:, ~even]], axis=1)
    return table


def _attention_cells(sheet, sw: Switches, prefix: str, d_k: int, q_in: str, k_in: str | None,
                     v_path: str | None, seen: np.ndarray | None = None) -> list[Cell]:
    """scores, scaled_scores, weights, output of one head; `q_in`/`k_in` the cells holding Q and K; `seen`
    the (n, m) visible table (default: the sheet's mask as the switches read it)."""
    visible_ = visible(sheet, sw) if seen is None else seen
    divisor = {"d_k": math.sqrt(d_k), "d_model": math.sqrt(sheet.d_model), "none": 1.0}[sw.divide_by]

    def scores(q, k):
        return k @ q.T if sw.transposed_scores else q @ k.T                # (query, key)

    def scaled(s):
        if s.shape != visible_.shape:                                      # K Qᵀ with n ≠ m: no broadcasting
            raise ValueError(f"scores of shape {s.shape} against a mask of shape {visible_.shape}")
        out = s / divisor
        return out if sw.mask_after_softmax else np.where(visible_, out, -np.inf)

    def weights(a):
        seen_ = np.isfinite(a) if sw.mask_after_softmax else (visible_ & np.isfinite(a))
        axis = 1 if sw.softmax_over == "keys" else 0
        w = _softmax(a, seen_, axis)
        if sw.no_visible_key != "zeros":                                    # a row (or column) with none seen
            fill = np.nan if sw.no_visible_key == "nan" else 1.0 / a.shape[axis]
            w = np.where(seen_.any(axis=axis, keepdims=True), w, fill)
        if sw.divide_after_softmax:
            w = w / math.sqrt(d_k)
        if sw.mask_after_softmax:
            w = np.where(visible_, w, 0.0)
        return w

    p = f"{prefix}." if prefix else ""
    return [Cell(f"{p}scores", (q_in, k_in) if k_in else (), scores if k_in else lambda: scores(sheet.q, sheet.k)),
            Cell(f"{p}scaled_scores", (f"{p}scores",), scaled),
            Cell(f"{p}weights", (f"{p}scaled_scores",), weights),
            Cell(f"{p}output", (f"{p}weights", v_path) if v_path else (f"{p}weights",),
                 (lambda w, v: w @ v) if v_path else (lambda w: w @ sheet.v))]


def _multi_head_cells(sheet, sw: Switches, name: str, params: dict, q_in: str, kv_in: str | None,
                      seen: np.ndarray, disabled=()) -> list[Cell]:
    """Every head's q, k, v and attention, the concat and the output Concat(H_1..H_H) W^O + b_o of the
    sub-layer `name`; K and V from the cell `kv_in`, or from the sheet's memory when it is None."""
    out: list[Cell] = []
    heads = params["heads"]
    for r, h in enumerate(heads):
        hp = f"{name}.heads.{r}"
        out.append(Cell(f"{hp}.q", (q_in,), lambda a, w=h["w_q"], b=h["b_q"]: a @ w + b))
        for part in ("k", "v"):
            w, b = h[f"w_{part}"], h[f"b_{part}"]
            out.append(Cell(f"{hp}.{part}", (kv_in,), lambda a, w=w, b=b: a @ w + b) if kv_in else
                       Cell(f"{hp}.{part}", (), lambda w=w, b=b: sheet.memory @ w + b))
        out += _attention_cells(sheet, sw, hp, h["w_q"].shape[1], f"{hp}.q", f"{hp}.k", f"{hp}.v", seen)
    off = set(disabled)

    def concat(*outputs):
        parts = [np.zeros_like(o) if r in off else o for r, o in enumerate(outputs)]
        return np.concatenate(parts[::-1] if sw.heads_reversed else parts, axis=1)   # (n, H·d_v)

    out.append(Cell(f"{name}.concat", tuple(f"{name}.heads.{r}.output" for r in range(len(heads))), concat))
    w_o, b_o = params["w_o"], params["b_o"]
    out.append(Cell(f"{name}.output", (f"{name}.concat",),
                    (lambda c: c @ w_o + b_o) if sw.output_projection else (lambda c: c.copy())))
    return out


def cells(sheet, sw: Switches = RIGHT) -> list[Cell]:
    """Every cell of the sheet's trace output in computation order, each computed as `sw` says.

    Kinds: "attention" (one head from Q, K, V), "multi_head" (self-attention of x alone, output = its
    W^O product), "block" (an encoder block: self-attention, FFN) and "decoder" (masked self-attention,
    cross-attention reading `sheet.memory`, FFN), each sub-layer with its residual and LayerNorm."""
    if sheet.kind == "attention":
        return _attention_cells(sheet, sw, "", sheet.q.shape[1], "", None, None)
    out: list[Cell] = [Cell("sublayers.0.input", (), lambda: sheet.x.copy())]
    if sheet.kind == "multi_head":
        out += _multi_head_cells(sheet, sw, "self_attention", sheet.attention, "sublayers.0.input",
                                 "sublayers.0.input", visible(sheet, sw), sheet.disabled_heads)
        return out + [Cell("output", ("self_attention.output",), np.copy)]

    placement = sw.placement or sheet.norm
    ln = sheet.layer_norms
    names = ("self_attention", "cross_attention", "ffn") if sheet.kind == "decoder" else ("self_attention", "ffn")

    def norm(s, sw):
        return lambda a: layer_norm(a, ln[s]["gamma"], ln[s]["beta"], sheet.eps, sw)

    f = sheet.ffn
    last = "sublayers.0.input"
    for s, name in enumerate(names):
        here = sw if sw.scope in (None, name) else replace(RIGHT, placement=sw.placement)   # this sub-layer's
        inp = f"sublayers.{s}.input"
        if s:
            out.append(Cell(inp, (last,), np.copy))
        if placement == "pre":
            out.append(Cell(f"sublayers.{s}.normed", (inp,), norm(s, here)))
        sub_in = f"sublayers.{s}.normed" if placement == "pre" else inp
        if name == "self_attention":
            out += _multi_head_cells(sheet, here, name, sheet.attention, sub_in, sub_in, visible(sheet, here),
                                     sheet.disabled_heads)
        elif name == "cross_attention":                      # every query reads every memory row
            out += _multi_head_cells(sheet, here, name, sheet.cross_attention, sub_in, None,
                                     np.ones((sheet.n_queries, sheet.memory.shape[0]), dtype=bool))
        else:
            out.append(Cell("ffn.hidden", (sub_in,), lambda a, relu=here.relu:
                            np.maximum(a @ f["w_1"] + f["b_1"], 0.0) if relu else a @ f["w_1"] + f["b_1"]))
            out.append(Cell("ffn.output", ("ffn.hidden",), lambda h: h @ f["w_2"] + f["b_2"]))
        out.append(Cell(f"sublayers.{s}.residual", (inp, f"{name}.output"),
                        lambda a, b, residual=here.residual: a + b if residual else b.copy()))
        if placement == "post":
            out.append(Cell(f"sublayers.{s}.normed", (f"sublayers.{s}.residual",), norm(s, here)))
            last = f"sublayers.{s}.normed"
        else:
            last = f"sublayers.{s}.residual"
    out.append(Cell("output", (last,), np.copy))
    return out


def merge(own: np.ndarray | None, computed: np.ndarray) -> np.ndarray:
    """A student's table where they wrote a number, the computed one where they left an entry empty (NaN)."""
    if own is None:
        return computed
    return np.where(np.isnan(own), computed, own)


def run(sheet, sw: Switches = RIGHT, own: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every cell as `sw` computes it; with `own`, each cell from the student's own earlier cells (quietly)."""
    values: dict[str, np.ndarray] = {}
    with quiet():
        for cell in cells(sheet, sw):
            args = [merge(own.get(p) if own else None, values[p]) for p in cell.inputs]
            values[cell.path] = cell.fn(*args)
    return values


def quiet():
    """The overflow (±1e308, 1e300) and 0/0 of float64 cells: inf or NaN, never judged right; NumPy's warnings off."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore")
