"""The static decoding step: one decoder step in preallocated buffers, written so torch.compile makes it one graph.

    step = StaticDecoder(model, compiled=True)          # the model's weights; the model is untouched
    hyps = generate(step, src, BeamSearch(4))            # decoding/search.py runs it like the model

What the model's `decode_step` does with tensors that grow, this step does in buffers sized ahead:

- self-attention K/V: one (rows, heads, positions, d) buffer per layer (SELF_START positions, doubled
  when full), this step's row written with `index_copy_` at `pos`, a 0-dim tensor (no Python int that
  changes per step, so nothing recompiles per step); the query reads the whole buffer through the mask
  `arange(positions) <= pos`;
- cross-attention K = H W^K, V = H W^V: projected once per batch, the source padded to a multiple of
  SOURCE_STEP positions (masked like PAD);
- rows: the live sentences padded up to a bucket of SENTENCE_BUCKETS (times the beam); when sentences
  leave, the rows that stay move to the front, into a smaller bucket when they fit one;
- the next token is chosen inside the step: float64 log-softmax, PAD never chosen, and the search
  strategy's own `step` (greedy max, or the top 2K of score + log-prob for beams).

The step is plain torch ops over a copy of the model's weights ([W^Q|W^K|W^V] fused, wide W stored as
W^T) with attention written out (one query row: q k^T, mask, softmax, v). It runs as is (eager) or under
`torch.compile(fullgraph=True)`: the first shape compiles a static graph, the next one a graph with the
changing sizes symbolic (torch.compile's automatic dynamic shapes), which then serves every bucket,
source length and buffer size (one row stays its own graph). Greedy and beams have their own `forward`,
so each has torch.compile's per-function graph budget to itself. Compiled code is cached on disk by
inductor (compiler.py). Tests hold the logits equal to the model's `decode_step` to 1e-5 and the tokens
identical (tests/test_compiled.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..model.transformer import Transformer

SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)   # live sentences per step, padded up to one of these
SOURCE_STEP = 16                               # source positions, padded up to a multiple of this
SELF_START = 32                                # self-attention positions allocated first (doubled when full)
STATIC_MAX_LEN = 512                           # longer max_len: decoded by the prepared copy


def bucket(n: int, sizes: tuple[int, ...] = SENTENCE_BUCKETS) -> int:
    """The smallest size >= n; past the largest, n rounded up to a multiple of it."""
    for size in sizes:
        if n <= size:
            return size
    return -(-n // sizes[-1]) * sizes[-1]


def unsupported(model) -> str | None:
    """Why the static step cannot run `model` (None when it can)."""
    if not isinstance(model, Transformer):
        return "not an encoder-decoder Transformer"
    if model.cfg.positions not in ("sinusoidal", "learned", "none"):
        return f"{model.cfg.positions} positions act inside attention"
    if model.cfg.max_len > STATIC_MAX_LEN:
        return f"max_len {model.cfg.max_len} over {STATIC_MAX_LEN}"
    if model.head.weight.dtype != torch.float32:
        return f"weights in {model.head.weight.dtype}, not float32"
    return None


def _fixed(t: Tensor | None) -> nn.Parameter | None:
    """A copy of `t` as a parameter without gradient (None stays None)."""
    return None if t is None else nn.Parameter(t.detach().clone(), requires_grad=False)


def _laid_out(weights: dict[str, Tensor | None]) -> nn.ParameterDict:
    """Copies of `weights`; a wide W `name_w` (out >= in) as its contiguous W^T `name_wt` (in, out), which a
    product of a few rows streams about twice as fast (weights.py)."""
    out = {}
    for name, t in weights.items():
        if t is None:
            continue
        if name.endswith("w") and t.dim() == 2 and t.size(0) >= t.size(1):
            out[name + "t"] = _fixed(t.t().contiguous())                     # (in, out)
        else:
            out[name] = _fixed(t)
    return nn.ParameterDict(out)


class DecoderStep(nn.Module):
    """The decoder's weights for one step: per layer [W^Q|W^K|W^V], W^O, cross W^Q, W^O, FFN and norms."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        cfg = self.cfg = model.cfg
        self.heads, self.d_k, self.d_v = cfg.heads, cfg.d_k, cfg.d_v
        self.score_scale = 1.0 / math.sqrt(cfg.d_k) if cfg.scale_scores else 1.0
        embed = model.tgt_embed
        self.token = _fixed(embed.token.weight)                             # (vocab, d)
        self.scale = embed.scale
        table = None
        if embed.sinusoidal:
            table = embed.position_table(torch.float32, embed.token.weight.device)
        elif embed.learned is not None:
            table = embed.learned.table.weight
        self.positions = _fixed(table)                                      # (max_len, d) or None
        self.post = cfg.norm_placement == "post"
        self.relu = cfg.activation == "relu"
        self.layers = nn.ModuleList(self._layer(layer) for layer in model.decoder.layers)
        norm = model.decoder.norm
        self.norm = None if norm is None else nn.ParameterList([_fixed(norm.weight), _fixed(norm.bias)])
        self.eps = cfg.eps
        self.head = _laid_out({"head_w": model.head.weight, "head_b": model.head.bias})   # W^T (d, vocab)

    @staticmethod
    def _layer(layer) -> nn.ParameterDict:
        sa, ca, ffn = layer.self_attention, layer.cross_attention, layer.ffn
        qkv = [sa.w_q, sa.w_k, sa.w_v]
        p = {"qkv_w": torch.cat([w.weight for w in qkv]),                   # [W^Q | W^K | W^V] (3 H d_k, d)
             "qkv_b": None if sa.w_q.bias is None else torch.cat([w.bias for w in qkv]),
             "o_w": sa.w_o.weight, "o_b": sa.w_o.bias,
             "cq_w": ca.w_q.weight, "cq_b": ca.w_q.bias, "ck_w": ca.w_k.weight, "ck_b": ca.w_k.bias,
             "cv_w": ca.w_v.weight, "cv_b": ca.w_v.bias, "co_w": ca.w_o.weight, "co_b": ca.w_o.bias,
             "f1_w": ffn.w_1.weight, "f1_b": ffn.w_1.bias, "f2_w": ffn.w_2.weight, "f2_b": ffn.w_2.bias}
        for i, sub in enumerate(layer.sublayer):
            p[f"n{i}_w"], p[f"n{i}_b"] = sub.layer_norm.weight, sub.layer_norm.bias
        return _laid_out(p)

    def _get(self, p: nn.ParameterDict, name: str) -> Tensor | None:
        return p[name] if name in p else None

    def _linear(self, p: nn.ParameterDict, name: str, x: Tensor) -> Tensor:
        """x W^T + b for x (..., in): from W^T (in, out) where `_laid_out` made one, else from W."""
        b = self._get(p, name + "_b")
        if name + "_wt" not in p:
            return F.linear(x, p[name + "_w"], b)
        wt = p[name + "_wt"]
        rows = x.reshape(-1, x.size(-1))                                     # (rows, in)
        out = torch.mm(rows, wt) if b is None else torch.addmm(b, rows, wt)  # (rows, out)
        return out.view(*x.shape[:-1], wt.size(1))

    def cross_kv(self, memory: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """K = H W^K, V = H W^V of every layer, once per batch: each (rows, heads, src, d_k | d_v)."""
        b, s, _ = memory.shape
        keys, values = [], []
        for p in self.layers:
            k = self._linear(p, "ck", memory).view(b, s, self.heads, self.d_k)
            v = self._linear(p, "cv", memory).view(b, s, self.heads, self.d_v)
            keys.append(k.transpose(1, 2).contiguous())                       # (rows, heads, src, d_k)
            values.append(v.transpose(1, 2).contiguous())                     # (rows, heads, src, d_v)
        return keys, values

    def _residual(self, x: Tensor, p: nn.ParameterDict, i: int, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """post: LN(x + Sub(x)); pre: x + Sub(LN(x))."""
        w, b = p[f"n{i}_w"], self._get(p, f"n{i}_b")
        if self.post:
            return F.layer_norm(x + sublayer(x), (x.size(-1),), w, b, self.eps)
        return x + sublayer(F.layer_norm(x, (x.size(-1),), w, b, self.eps))

    def logits(self, tokens: Tensor, pos: Tensor, self_k: list[Tensor], self_v: list[Tensor],
               cross_k: list[Tensor], cross_v: list[Tensor], source: Tensor) -> Tensor:
        """tokens (rows,) at position `pos` (0-dim) -> next-token logits (rows, vocab).

        Writes this step's K/V rows into self_k/self_v (rows, heads, positions, d) at `pos`; `source`
        (rows, 1, 1, src) True = may attend."""
        rows, H = tokens.size(0), self.heads
        x = F.embedding(tokens, self.token)                                 # (rows, d)
        if self.positions is not None:
            x = torch.add(self.positions.index_select(0, pos.view(1)), x, alpha=self.scale)
        else:
            x = x * self.scale
        x = x[:, None]                                                       # (rows, 1, d)
        at = pos.view(1)
        visible = (torch.arange(self_k[0].size(2), device=pos.device) <= pos).view(1, 1, 1, -1)  # (1, 1, 1, positions)

        for p, k_buf, v_buf, ck, cv in zip(self.layers, self_k, self_v, cross_k, cross_v, strict=True):
            def attend_self(h: Tensor, p=p, k_buf=k_buf, v_buf=v_buf) -> Tensor:
                qkv = self._linear(p, "qkv", h)                              # (rows, 1, 3 H d_k)
                q, k, v = qkv.view(rows, 1, 3, H, -1).permute(2, 0, 3, 1, 4)  # each (rows, heads, 1, d_k)
                k_buf.index_copy_(2, at, k)                                  # (rows, heads, positions, d_k)
                v_buf.index_copy_(2, at, v)
                out = self._attend(q, k_buf, v_buf, visible)                 # (rows, heads, 1, d_v)
                return self._linear(p, "o", out.transpose(1, 2).reshape(rows, 1, -1))

            def attend_source(h: Tensor, p=p, ck=ck, cv=cv) -> Tensor:
                q = self._linear(p, "cq", h).view(rows, 1, H, -1).transpose(1, 2)   # (rows, heads, 1, d_k)
                out = self._attend(q, ck, cv, source)                        # (rows, heads, 1, d_v)
                return self._linear(p, "co", out.transpose(1, 2).reshape(rows, 1, -1))

            def feed_forward(h: Tensor, p=p) -> Tensor:
                hidden = self._linear(p, "f1", h)                            # (rows, 1, d_ff)
                hidden = torch.relu(hidden) if self.relu else F.silu(hidden)
                return self._linear(p, "f2", hidden)                         # (rows, 1, d)

            x = self._residual(x, p, 0, attend_self)
            x = self._residual(x, p, 1, attend_source)
            x = self._residual(x, p, 2, feed_forward)
        if self.norm is not None:
            x = F.layer_norm(x, (x.size(-1),), self.norm[0], self.norm[1], self.eps)
        return self._linear(self.head, "head", x[:, 0])                      # (rows, vocab)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, visible: Tensor) -> Tensor:
        """softmax(q k^T / sqrt(d_k), masked) v for one query row: q (rows, heads, 1, d_k), k, v (rows, heads,
        keys, d), visible (rows | 1, 1, 1, keys) -> (rows, heads, 1, d_v)."""
        scores = (q @ k.transpose(-2, -1)) * self.score_scale               # (rows, heads, 1, keys)
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        return weights @ v                                                   # (rows, heads, 1, d_v)


class Choose(nn.Module):
    """A step and the choice of the next tokens: what one compiled graph runs."""

    def __init__(self, weights: DecoderStep, search) -> None:
        super().__init__()
        self.weights, self.search, self.pad_id = weights, search, weights.cfg.pad_id

    def choose(self, tokens: Tensor, pos: Tensor, scores: Tensor, self_k: list[Tensor], self_v: list[Tensor],
               cross_k: list[Tensor], cross_v: list[Tensor], source: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (sent*K,), scores (sent, K) float64 -> ranked candidates: scores, tokens, parents (sent, C)."""
        logits = self.weights.logits(tokens, pos, self_k, self_v, cross_k, cross_v, source)   # (rows, vocab)
        log_probs = F.log_softmax(logits.double(), dim=-1)                  # float64, as the eager loop's
        log_probs = log_probs.index_fill(-1, torch.tensor([self.pad_id], device=tokens.device), float("-inf"))
        return self.search.step(log_probs.view(scores.size(0), scores.size(1), -1), scores)


class ChooseGreedy(Choose):
    def forward(self, *args: Tensor | list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        return self.choose(*args)


class ChooseBeams(Choose):
    def forward(self, *args: Tensor | list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        return self.choose(*args)


class StaticDecoder:
    """The decoding API `generate` runs (cfg, encode, start): the model's encoder, then the static step.

    compiled: run the step under torch.compile with inductor `options`; else the same step eagerly. The
    weights stay graph inputs (no freezing), so a compiled graph serves every model of the same sizes.
    `compile_seconds` keeps each shape's first call (its compilation, or 0 s when a graph served it);
    `notes` hears why compiling failed (the step then runs eagerly)."""

    def __init__(self, model: Transformer, compiled: bool = False, *, options: dict | None = None,
                 encoder=None, notes: Callable[[str], None] | None = None) -> None:
        reason = unsupported(model)
        if reason:
            raise ValueError(f"the static decoding step cannot run this model: {reason}")
        self.cfg = model.cfg
        self._encoder = encoder if encoder is not None else model
        with torch.no_grad():
            self.weights = DecoderStep(model).eval()
        self.compiled, self.options = compiled, dict(options or {})
        self.notes = notes
        self._steps: dict[tuple, Callable] = {}
        self.compile_seconds: dict[tuple, float] = {}                        # shape -> first call, seconds

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self._encoder.encode(src, src_pad)

    def start(self, memory: Tensor, src_pad: Tensor, search) -> StaticRun:
        """A run over `memory` (sent*K, src, d) whose rows are the K beams of each sentence."""
        return StaticRun(self, memory, src_pad, search)

    def step_for(self, search, rows: int) -> Callable:
        """The step for this strategy and row count: compiled on its first call when `compiled`."""
        key = (type(search).__name__, search.beam, rows)
        step = self._steps.get(key)
        if step is None:
            step = (ChooseGreedy if search.beam == 1 else ChooseBeams)(self.weights, search)
            if self.compiled:                                                # timed on its first call
                step = _FirstCall(step, key, self)
            self._steps[key] = step
        return step

    def _note(self, line: str) -> None:
        if self.notes is not None:
            self.notes(line)


class _FirstCall:
    """A shape's step under torch.compile: the first call compiles (timed); should that fail (no working
    C++ toolchain), the shape runs eagerly from then on."""

    def __init__(self, step: Choose, key: tuple, owner: StaticDecoder) -> None:
        self.key, self.owner, self.eager = key, owner, step
        self.fn: Callable = torch.compile(step, fullgraph=True, options=owner.options)
        self.first = True

    def __call__(self, *args):
        if not self.first:
            return self.fn(*args)
        self.first = False
        began = time.perf_counter()
        try:
            out = self.fn(*args)
        except Exception as error:                                           # compiler missing or failing
            self.fn = self.eager
            self.owner._note(f"compiling the decoding step failed ({type(error).__name__}: "
                             f"{str(error).strip().splitlines()[0][:160] if str(error).strip() else ''}); "
                             "decoding eagerly")
            return self.eager(*args)
        self.owner.compile_seconds[self.key] = time.perf_counter() - began
        return out


class StaticRun:
    """One batch's buffers on the static step: K beams per sentence, live sentences padded to a bucket."""

    def __init__(self, decoder: StaticDecoder, memory: Tensor, src_pad: Tensor, search) -> None:
        self.decoder, self.search, self.K = decoder, search, search.beam
        cfg, w = decoder.cfg, decoder.weights
        rows, s = src_pad.shape
        self.src = -(-s // SOURCE_STEP) * SOURCE_STEP                        # padded source length
        self.length = 0                                                      # target positions written
        self.rows = rows                                                     # live rows (sent * K)
        self.capacity = bucket(rows // self.K) * self.K                      # rows the buffers hold
        index = self._padded(torch.arange(rows, device=memory.device))
        memory = F.pad(memory, (0, 0, 0, self.src - s))[index]              # (capacity, src, d)
        pad = F.pad(src_pad, (0, self.src - s), value=True)[index]           # (capacity, src) True = PAD
        with torch.no_grad():
            self.cross_k, self.cross_v = w.cross_kv(memory)
        empty = pad.all(dim=1)                                               # (capacity,) a source of only PAD:
        if bool(empty.any()):                                                # it reads every key of zero values,
            pad = pad & ~empty[:, None]                                      # a zero output, as the model's
            self.cross_v = [v.masked_fill(empty[:, None, None, None], 0.0) for v in self.cross_v]
        self.source = (~pad)[:, None, None, :]                               # (capacity, 1, 1, src) may attend
        shape = (self.capacity, cfg.heads, min(SELF_START, cfg.max_len))
        self.self_k = [memory.new_zeros(*shape, cfg.d_k) for _ in w.layers]  # (capacity, heads, positions, d_k)
        self.self_v = [memory.new_zeros(*shape, cfg.d_v) for _ in w.layers]

    def _padded(self, index: Tensor) -> Tensor:
        """`index` (rows,) extended to the buffers' capacity by repeating its first row (a real source)."""
        extra = self.capacity - index.numel()
        return index if extra == 0 else torch.cat([index, index[:1].expand(extra)])

    def step(self, tokens: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """tokens (rows, 1), scores (sent, K) -> the strategy's ranked candidates for the live sentences."""
        if self.decoder.cfg.max_len > self.length >= self.self_k[0].size(2):   # buffers full: double them
            n, size = self.length, min(2 * self.self_k[0].size(2), self.decoder.cfg.max_len)
            self.self_k = [_grown(t, size, n) for t in self.self_k]
            self.self_v = [_grown(t, size, n) for t in self.self_v]
        if self.length >= self.decoder.cfg.max_len:
            raise ValueError(f"sequence length {self.length + 1} exceeds max_len {self.decoder.cfg.max_len}")
        sent = scores.size(0)
        ids = tokens.new_zeros(self.capacity)                                # padding rows feed id 0
        ids[: self.rows] = tokens[:, 0]
        all_scores = scores.new_full((self.capacity // self.K, self.K), float("-inf"))
        all_scores[:sent] = scores
        pos = torch.tensor(self.length, device=tokens.device)               # 0-dim: no recompilation per step
        step = self.decoder.step_for(self.search, self.capacity)
        with torch.no_grad():
            best, chosen, parents = step(ids, pos, all_scores, self.self_k, self.self_v,
                                         self.cross_k, self.cross_v, self.source)
        self.length += 1
        return best[:sent], chosen[:sent], parents[:sent]

    def keep(self, index: Tensor, same_source: bool) -> None:
        """Keep rows `index` (beams follow their parents, finished sentences leave); a smaller bucket when
        the live sentences fit one."""
        n, capacity = self.length, bucket(index.numel() // self.K) * self.K
        if capacity != self.capacity:
            self.capacity = capacity
            full = self._padded(index)
            self.self_k = [_rows(t, full, n) for t in self.self_k]
            self.self_v = [_rows(t, full, n) for t in self.self_v]
        else:
            full = self._padded(index)
            for t in (*self.self_k, *self.self_v):
                t[:, :, :n] = t[:, :, :n].index_select(0, full)              # index_select copies first
        if not same_source:
            self.cross_k = [t.index_select(0, full) for t in self.cross_k]
            self.cross_v = [t.index_select(0, full) for t in self.cross_v]
            self.source = self.source.index_select(0, full)
        self.rows = index.numel()


def _grown(t: Tensor, size: int, n: int) -> Tensor:
    """A zeroed buffer of `size` positions holding positions :n of `t` (rows, heads, positions, d)."""
    out = t.new_zeros(*t.shape[:2], size, t.size(3))
    out[:, :, :n] = t[:, :, :n]
    return out


def _rows(t: Tensor, index: Tensor, n: int) -> Tensor:
    """A zeroed buffer of len(index) rows holding positions :n of rows `index` of `t`."""
    out = t.new_zeros(index.numel(), *t.shape[1:])
    out[:, :, :n] = t[:, :, :n].index_select(0, index)
    return out
