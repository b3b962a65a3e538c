"""The tasks a student writes as code: a signature each, probes drawn from a seed, the lesson's outputs.

A task is one function of the lesson (`attention(q, k, v, mask=None)`, `layer_norm(x, gamma, beta, eps)`,
`encoder_block(x, params, norm="post")`...). Its probes are the calls the checker makes, drawn from a seed
and shaped to tell the bugs apart: n ≠ m, d_k ≠ d_v ≠ d_model, more than one head, a causal and a padding
mask, a query with no visible key, a single row. Each probe carries `Inputs`, a sheet-like object that the
bug library's one computation reads (bugs.cells / visible / layer_norm / sinusoidal_positions), so the
expected outputs and every bug's outputs come from the library's switches, never from a second copy of the
formulas. A property pairs two probes: the second is the first with one thing changed (rows permuted, a
future token or a padded row redrawn) and the lesson says what that does to the outputs.

The params layouts follow the lesson's x W convention: every weight is (in, out) and a row vector is
multiplied on the left, Q_r = X W_r^Q with W_r^Q of shape (d_model, d_k). Attention projections have no
bias (the lesson's formulas have none); the FFN has b_1 and b_2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .bugs import RIGHT, Switches, layer_norm, run, sinusoidal_positions, visible

# ---- the tasks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    name: str                          # the CLI's --task
    function: str                      # the function the student defines
    signature: str                     # its def line's arguments
    returns: tuple[str, ...]           # the arrays it returns, in order
    bugs: tuple[str, ...]              # the library's bugs that can show on this task
    zh: str                            # one line: what it computes
    en: str
    formula: str                       # the lesson's formula, plain text
    sublayers: tuple[str, ...] = ()    # a block's sub-layers, where a bug may sit in one alone


# Bugs a block can make in one sub-layer alone (its attention, or its LayerNorm and residual, written out
# twice rather than called from one helper): each gets a reading per sub-layer besides the one everywhere.
ONE_SITE = {"no-scale": "attention", "scale-after-softmax": "attention", "scale-by-d-model": "attention",
            "softmax-over-queries": "attention", "transposed-scores": "attention", "no-output-projection": "attention",
            "heads-concat-reversed": "attention", "ln-across-positions": "sublayer", "ln-unbiased-variance": "sublayer",
            "ln-eps-outside-sqrt": "sublayer", "no-residual": "sublayer"}


ATTENTION_BUGS = ("no-scale", "scale-after-softmax", "softmax-over-queries", "transposed-scores")
LN_BUGS = ("ln-across-positions", "ln-unbiased-variance", "ln-eps-outside-sqrt")
HEADS_BUGS = ("scale-by-d-model", "no-output-projection", "heads-concat-reversed")
MASK_BUGS = ("mask-after-softmax", "mask-inverted", "masked-row-not-zeroed")

TASKS: dict[str, Task] = {t.name: t for t in (
    Task("attention", "attention", "q, k, v, mask=None", ("weights", "output"),
         ATTENTION_BUGS + MASK_BUGS,
         "缩放点积注意力：一个 head，给定 Q、K、V 与可选的 mask",
         "scaled dot-product attention: one head from Q, K, V and an optional mask",
         "A = softmax_key(Q Kᵀ / √d_k + M),  Y = A V   (M: 0 where visible, −∞ where hidden)"),
    Task("causal-mask", "causal_mask", "n", ("mask",), ("causal-off-by-one", "mask-inverted"),
         "因果 mask：n×n 布尔表，True = 可以看",
         "the causal mask: an n×n boolean table, True = may attend",
         "mask[i, j] = (j <= i)   (query i sees keys 1..i, itself included)"),
    Task("layer-norm", "layer_norm", "x, gamma, beta, eps", ("output",), LN_BUGS,
         "LayerNorm：每一行在自己的 d 个特征上归一化",
         "LayerNorm: each row normalised over its own d features",
         "LN(x) = γ ⊙ (x − μ) / √(σ² + ε) + β,  μ = (1/d) Σ x_r,  σ² = (1/d) Σ (x_r − μ)²  (per row)"),
    Task("multi-head", "multi_head", "x, params, mask=None", ("output",), ATTENTION_BUGS + MASK_BUGS + HEADS_BUGS,
         "多头自注意力：每个 head 各自投影，拼接后乘 W^O",
         "multi-head self-attention: each head its own projections, concatenated, times W^O",
         "H_r = softmax(Q_r K_rᵀ / √d_k + M) V_r,  Q_r = X W_r^Q, K_r = X W_r^K, V_r = X W_r^V;  "
         "MHA(X) = Concat(H_1, ..., H_H) W^O"),
    Task("encoder-block", "encoder_block", 'x, params, norm="post"', ("output",),
         ATTENTION_BUGS + HEADS_BUGS + LN_BUGS
         + ("no-residual", "pre-norm-instead-of-post", "post-norm-instead-of-pre", "ffn-without-relu"),
         "encoder block：多头自注意力与 FFN，各带残差与 LayerNorm（post 或 pre）",
         "an encoder block: multi-head self-attention and the FFN, each with its residual and LayerNorm",
         "post: U = LN₁(X + MHA(X)),  Z = LN₂(U + FFN(U));   pre: U = X + MHA(LN₁(X)),  Z = U + FFN(LN₂(U));  "
         "FFN(u) = ReLU(u W₁ + b₁) W₂ + b₂", ("self_attention", "ffn")),
    Task("decoder-block", "decoder_block", "y, memory, params", ("output",),
         ATTENTION_BUGS + HEADS_BUGS + LN_BUGS + ("mask-after-softmax", "causal-off-by-one", "mask-inverted",
                                                   "masked-row-not-zeroed", "no-residual",
                                                   "pre-norm-instead-of-post", "ffn-without-relu"),
         "decoder block（post-norm）：masked 自注意力、读 memory 的 cross-attention、FFN",
         "a decoder block (post-norm): masked self-attention, cross-attention reading the memory, the FFN",
         "U = LN₁(Y + MHA_causal(Y)),  V = LN₂(U + MHA(U, memory)),  Z = LN₃(V + FFN(V))   "
         "(cross-attention: Q from U, K and V from the memory)", ("self_attention", "cross_attention", "ffn")),
    Task("positions", "sinusoidal_positions", "n, d", ("table",),
         ("positions-sin-cos-swapped", "positions-halves", "positions-frequency"),
         "正弦位置表：n 个位置、d 个通道",
         "the sinusoidal position table: n positions, d channels",
         "PE(p, 2r) = sin(p / 10000^(2r/d)),  PE(p, 2r+1) = cos(p / 10000^(2r/d)),  p = 0..n−1"),
)}


# ---- what the library computes on -----------------------------------------------------------------


@dataclass
class Inputs:
    """A probe as the bug library reads a sheet (the attributes bugs.cells uses), biases filled with zeros."""

    kind: str                          # attention | multi_head | block | decoder | mask | layer_norm | positions
    x: np.ndarray | None = None
    q: np.ndarray | None = None
    k: np.ndarray | None = None
    v: np.ndarray | None = None
    mask: str | np.ndarray = "none"            # "none", "causal", or an (n, m) bool table
    memory: np.ndarray | None = None
    attention: dict | None = None
    cross_attention: dict | None = None
    ffn: dict | None = None
    layer_norms: list | None = None
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None
    eps: float = 1e-5
    norm: str = "post"
    n: int = 0
    d: int = 0
    disabled_heads: tuple = ()

    @property
    def n_queries(self) -> int:
        return self.q.shape[0] if self.kind == "attention" else self.n if self.kind == "mask" else self.x.shape[0]

    @property
    def n_keys(self) -> int:
        return self.k.shape[0] if self.kind == "attention" else self.n_queries

    @property
    def d_model(self) -> int:
        return self.q.shape[1] if self.kind == "attention" else self.x.shape[1]


def compute(task: Task, inputs: Inputs, sw: Switches = RIGHT) -> tuple[np.ndarray, ...]:
    """The task's outputs on one probe, as the switches compute them (RIGHT: the lesson's)."""
    if task.name == "attention":
        values = run(inputs, sw)
        return values["weights"], values["output"]
    if task.name == "causal-mask":
        return (visible(inputs, sw),)
    if task.name == "layer-norm":
        return (layer_norm(inputs.x, inputs.gamma, inputs.beta, inputs.eps, sw),)
    if task.name == "positions":
        return (sinusoidal_positions(inputs.n, inputs.d, sw),)
    return (run(inputs, sw)["output"],)


# ---- probes and properties --------------------------------------------------------------------------


@dataclass
class Probe:
    args: tuple                                # the call's positional arguments
    kwargs: dict
    inputs: Inputs
    shows: tuple[str, ...] = ()                # what it is there for: "n≠m", "causal", "padding", "empty row", ...

    def numbers(self) -> int:
        """How many numbers its inputs hold (the smallest failing probe is the one printed)."""
        return sum(_count(a) for a in (*self.args, *self.kwargs.values()))


@dataclass(frozen=True)
class Property:
    name: str                                  # permutation | future | padding | rows | memory-order
    base: int                                  # the probe
    changed: int                               # the probe with one thing changed
    expect: Callable[[tuple], tuple]           # the changed probe's outputs (compared part), from the base's
    view: Callable[[tuple], tuple] = field(default=lambda outs: outs)   # the part of them compared


def _count(a) -> int:
    if isinstance(a, np.ndarray):
        return a.size
    if isinstance(a, dict):
        return sum(_count(v) for v in a.values())
    if isinstance(a, (list, tuple)):
        return sum(_count(v) for v in a)
    return 1


def _m(rng, n: int, d: int, scale: float = 2.0) -> np.ndarray:
    """An (n, d) table of two-decimal numbers in [−scale, scale] (exact as printed)."""
    return np.round(rng.uniform(-scale, scale, (n, d)), 2)


def _v(rng, d: int, low: float, high: float) -> np.ndarray:
    return np.round(rng.uniform(low, high, d), 2)


def _rows(outs: tuple, rows) -> tuple:
    return tuple(o[rows] for o in outs)


def _heads(rng, d: int, n_heads: int, d_k: int, d_v: int) -> dict:
    """Multi-head params as the student gets them: {"heads": [{"w_q", "w_k", "w_v"}], "w_o"}."""
    return {"heads": [{"w_q": _m(rng, d, d_k, 1), "w_k": _m(rng, d, d_k, 1), "w_v": _m(rng, d, d_v, 1)}
                      for _ in range(n_heads)],
            "w_o": _m(rng, n_heads * d_v, d, 1)}


def _biased(p: dict) -> dict:
    """The library's reading of multi-head params: zero biases where the lesson has none."""
    heads = [{**h, "b_q": np.zeros(h["w_q"].shape[1]), "b_k": np.zeros(h["w_k"].shape[1]),
              "b_v": np.zeros(h["w_v"].shape[1])} for h in p["heads"]]
    return {"heads": heads, "w_o": p["w_o"], "b_o": np.zeros(p["w_o"].shape[1])}


def _ffn(rng, d: int, d_ff: int) -> dict:
    return {"w_1": _m(rng, d, d_ff, 1), "b_1": _v(rng, d_ff, -0.5, 0.5),
            "w_2": _m(rng, d_ff, d, 1), "b_2": _v(rng, d, -0.5, 0.5)}


def _norms(rng, d: int, count: int) -> list[dict]:
    return [{"gamma": _v(rng, d, 0.5, 1.5), "beta": _v(rng, d, -0.5, 0.5)} for _ in range(count)]


def _attention(rng) -> tuple[list[Probe], list[Property]]:
    def probe(q, k, v, mask, shows):
        args = (q, k, v) if mask is None else (q, k, v, mask)
        inputs = Inputs("attention", q=q, k=k, v=v, mask="none" if mask is None else mask)
        return Probe(args, {}, inputs, shows)

    def causal(n, m):
        return np.arange(m)[None, :] <= np.arange(n)[:, None]

    def draw(n, m, d_k, d_v, mask, shows):
        return probe(_m(rng, n, d_k), _m(rng, m, d_k), _m(rng, m, d_v), mask, shows)

    pad = np.ones((3, 5), dtype=bool)
    pad[:, 3:] = False                                      # keys 4 and 5 are padding
    pad[1, :] = False                                       # query 2 sees no key
    out = [draw(3, 4, 2, 3, None, ("n≠m", "d_k≠d_v")),
           draw(4, 4, 3, 2, causal(4, 4), ("causal",)),
           draw(3, 5, 2, 3, pad, ("padding", "empty row")),
           draw(1, 3, 2, 2, None, ("single row",)),
           draw(3, 3, 2, 4, None, ("n=m",))]
    b = out[0].inputs
    key_order, query_order = np.array([2, 0, 3, 1]), np.array([2, 0, 1])
    out.append(probe(b.q, b.k[key_order], b.v[key_order], None, ("keys permuted",)))
    out.append(probe(b.q[query_order], b.k, b.v, None, ("queries permuted",)))
    p = out[2].inputs
    k2, v2 = p.k.copy(), p.v.copy()
    k2[3:], v2[3:] = _m(rng, 2, 2), _m(rng, 2, 3)
    out.append(probe(p.q, k2, v2, pad, ("padding redrawn",)))
    c = out[1].inputs
    k3, v3 = c.k.copy(), c.v.copy()
    k3[3], v3[3] = _m(rng, 1, 3)[0], _m(rng, 1, 2)[0]
    out.append(probe(c.q, k3, v3, causal(4, 4), ("future key redrawn",)))
    props = [Property("permutation", 0, 5, lambda o: (o[0][:, key_order], o[1])),
             Property("permutation", 0, 6, lambda o: _rows(o, query_order)),
             Property("padding", 2, 7, lambda o: o),
             Property("future", 1, 8, lambda o: _rows(o, slice(0, 3)), lambda o: _rows(o, slice(0, 3)))]
    return out, props


def _causal_mask(rng) -> tuple[list[Probe], list[Property]]:
    return [Probe((n,), {}, Inputs("mask", mask="causal", n=n), ("single row",) if n == 1 else ())
            for n in (1, 2, 4, 6)], []


def _layer_norm(rng) -> tuple[list[Probe], list[Property]]:
    def probe(x, gamma, beta, eps, shows=()):
        return Probe((x, gamma, beta, eps), {}, Inputs("layer_norm", x=x, gamma=gamma, beta=beta, eps=eps), shows)

    out = [probe(_m(rng, 3, 4), _v(rng, 4, 0.5, 1.5), _v(rng, 4, -0.5, 0.5), 0.1),
           probe(_m(rng, 1, 5), _v(rng, 5, 0.5, 1.5), _v(rng, 5, -0.5, 0.5), 0.5, ("single row",)),
           probe(_m(rng, 4, 3), _v(rng, 3, 0.5, 1.5), _v(rng, 3, -0.5, 0.5), 1e-5),
           probe(_m(rng, 2, 6), np.ones(6), np.zeros(6), 0.1)]
    b = out[0].inputs
    x = b.x.copy()
    x[1] = _m(rng, 1, 4)[0]
    out.append(probe(x, b.gamma, b.beta, b.eps, ("row 2 redrawn",)))
    keep = [0, 2]
    return out, [Property("rows", 0, 4, lambda o: _rows(o, keep), lambda o: _rows(o, keep))]


def _multi_head(rng) -> tuple[list[Probe], list[Property]]:
    def probe(x, params, mask, shows):
        inputs = Inputs("multi_head", x=x, attention=_biased(params), mask="none" if mask is None else mask)
        return Probe((x, params) if mask is None else (x, params, mask), {}, inputs, shows)

    causal = np.tril(np.ones((4, 4), dtype=bool))
    pad = np.ones((3, 3), dtype=bool)
    pad[:, 2] = False                                       # position 3 is padding
    pad[0, :] = False                                       # query 1 sees no key
    out = [probe(_m(rng, 4, 5), _heads(rng, 5, 2, 3, 2), None, ("2 heads", "d_k≠d_v≠d_model")),
           probe(_m(rng, 4, 6), _heads(rng, 6, 3, 2, 2), causal, ("3 heads", "causal")),
           probe(_m(rng, 3, 4), _heads(rng, 4, 2, 3, 2), pad, ("padding", "empty row")),
           probe(_m(rng, 1, 4), _heads(rng, 4, 2, 2, 3), None, ("single row",))]
    order = np.array([2, 0, 3, 1])
    out.append(probe(out[0].args[0][order], out[0].args[1], None, ("rows permuted",)))
    x = out[1].args[0].copy()
    x[3] = _m(rng, 1, 6)[0]
    out.append(probe(x, out[1].args[1], causal, ("future row redrawn",)))
    x = out[2].args[0].copy()
    x[2] = _m(rng, 1, 4)[0]
    out.append(probe(x, out[2].args[1], pad, ("padding redrawn",)))
    first, real = slice(0, 3), slice(0, 2)
    return out, [Property("permutation", 0, 4, lambda o: _rows(o, order)),
                 Property("future", 1, 5, lambda o: _rows(o, first), lambda o: _rows(o, first)),
                 Property("padding", 2, 6, lambda o: _rows(o, real), lambda o: _rows(o, real))]


def _encoder_block(rng) -> tuple[list[Probe], list[Property]]:
    def draw(n, d, n_heads, d_k, d_v, d_ff, norm, eps, shows):
        params = {"self_attention": _heads(rng, d, n_heads, d_k, d_v), "ffn": _ffn(rng, d, d_ff),
                  "layer_norms": _norms(rng, d, 2), "eps": eps}
        return probe(_m(rng, n, d), params, norm, shows)

    def probe(x, params, norm, shows):
        inputs = Inputs("block", x=x, attention=_biased(params["self_attention"]), ffn=params["ffn"],
                        layer_norms=params["layer_norms"], eps=params["eps"], norm=norm)
        return Probe((x, params), {} if norm == "post" else {"norm": norm}, inputs, (norm + "-norm", *shows))

    out = [draw(3, 4, 2, 3, 2, 6, "post", 0.1, ("d_k≠d_v",)),
           draw(4, 6, 3, 2, 3, 5, "pre", 0.1, ("3 heads", "H·d_v≠d_model")),
           draw(1, 4, 2, 2, 2, 3, "post", 1e-5, ("single row",)),
           draw(3, 4, 2, 2, 2, 6, "pre", 0.1, ())]
    order = np.array([2, 0, 1])
    out.append(probe(out[0].args[0][order], out[0].args[1], "post", ("rows permuted",)))
    return out, [Property("permutation", 0, 4, lambda o: _rows(o, order))]


def _decoder_block(rng) -> tuple[list[Probe], list[Property]]:
    def draw(n, m, d, n_heads, d_k, d_v, d_ff, eps, shows):
        params = {"self_attention": _heads(rng, d, n_heads, d_k, d_v),
                  "cross_attention": _heads(rng, d, n_heads, d_k, d_v), "ffn": _ffn(rng, d, d_ff),
                  "layer_norms": _norms(rng, d, 3), "eps": eps}
        return probe(_m(rng, n, d), _m(rng, m, d), params, shows)

    def probe(y, memory, params, shows):
        inputs = Inputs("decoder", x=y, memory=memory, mask="causal", attention=_biased(params["self_attention"]),
                        cross_attention=_biased(params["cross_attention"]), ffn=params["ffn"],
                        layer_norms=params["layer_norms"], eps=params["eps"], norm="post")
        return Probe((y, memory, params), {}, inputs, shows)

    out = [draw(3, 4, 4, 2, 3, 2, 6, 0.1, ("n≠m", "d_k≠d_v")),
           draw(4, 2, 6, 3, 2, 2, 5, 0.1, ("3 heads",)),
           draw(1, 3, 4, 2, 2, 2, 3, 1e-5, ("single row",)),
           draw(3, 3, 4, 2, 2, 2, 4, 0.1, ("n=m",))]
    y, memory, params = out[0].args
    y2 = y.copy()
    y2[2] = _m(rng, 1, 4)[0]
    out.append(probe(y2, memory, params, ("future row redrawn",)))
    out.append(probe(y, memory[np.array([2, 0, 3, 1])], params, ("memory permuted",)))
    first = slice(0, 2)
    return out, [Property("future", 0, 4, lambda o: _rows(o, first), lambda o: _rows(o, first)),
                 Property("memory-order", 0, 5, lambda o: o)]


def _positions(rng) -> tuple[list[Probe], list[Property]]:
    return [Probe((n, d), {}, Inputs("positions", n=n, d=d), ("single row",) if n == 1 else ())
            for n, d in ((4, 6), (1, 4), (7, 8), (3, 2), (6, 10))], []


_DRAW = {"attention": _attention, "causal-mask": _causal_mask, "layer-norm": _layer_norm,
         "multi-head": _multi_head, "encoder-block": _encoder_block, "decoder-block": _decoder_block,
         "positions": _positions}


def probes(task: Task, seed: int) -> tuple[list[Probe], list[Property]]:
    """The task's probes and properties for `seed` (the same seed gives the same numbers)."""
    return _DRAW[task.name](np.random.default_rng(seed))
