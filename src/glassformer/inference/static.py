"""The static decoding step: one decoder step in preallocated buffers, written so one compiled graph runs it.

    step = StaticDecoder(model, compiled=True)          # the model's weights; the model is untouched
    hyps = generate(step, src, BeamSearch(4))            # decoding/search.py runs it like the model

What the model's `decode_step` does with tensors that grow, this step does in buffers sized ahead:

- self-attention K/V: one (rows, heads, positions, d) buffer per layer (SELF_STEP positions more whenever
  it is full), this step's row written with `index_copy_` at `pos`, a 0-dim tensor; the query reads the
  whole buffer through the mask `arange(positions) <= pos`;
- cross-attention K = H W^K, V = H W^V: projected once per batch;
- rows: the live sentences padded up to a bucket of SENTENCE_BUCKETS (times the beam); when sentences
  leave, the rows that stay move to the front, into a smaller bucket when they fit one;
- the next token is chosen inside the step: the search's own `advance` (float64 log-softmax, PAD never
  chosen, the ranked candidates, which finish and which stay live, which sentences are done), and with
  beams the self-attention rows then follow their parents.

The step is plain torch ops over a copy of the model's weights ([W^Q|W^K|W^V] fused, wide W stored as
W^T) with attention written out (one query row: q k^T, mask, softmax, v). It runs as is (eager) or as a
package compiled ahead of time with every size symbolic (compiler.py), so one package per model and
beam size serves every bucket, source length and buffer size. Tests hold the logits equal to the model's
`decode_step` to 1e-5 and the tokens identical (tests/test_compiled.py).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ..model.transformer import Transformer
from .compiler import compiled, package_path
from .step import DecoderStep

SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)   # live sentences per step, padded up to one of these
SELF_STEP = 16                                 # self-attention positions allocated at a time
STATIC_MAX_LEN = 512                           # longer max_len: decoded by the prepared copy
MAX_ROWS = 1 << 14                             # rows a compiled package accepts (sentences x beam)


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


class SourceStep(nn.Module):
    """What a batch's sources give every step, once: the encoder output H and each decoder layer's
    cross-attention K = H W^K, V = H W^V, through the model's own encoder and `project_kv`.

    src (sent, src) ids, src_pad (sent, src) True = PAD, index (rows,) the sentence of each row (its K beams,
    padded up to a bucket) -> cross K of every layer, cross V of every layer (rows, heads, src, d_k | d_v),
    and `source` (rows, 1, 1, src) True = may attend: one flat tuple. A source of only PAD reads every key
    of zero values (a zero output, as the model's attention gives)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.embed, self.encoder = model.src_embed, model.encoder
        if self.embed.sinusoidal:                                            # its table cached before any tracing
            self.embed.position_table(torch.float32, self.embed.token.weight.device)
        self.cross = nn.ModuleList(layer.cross_attention for layer in model.decoder.layers)

    def forward(self, src: Tensor, src_pad: Tensor, index: Tensor) -> tuple[Tensor, ...]:
        memory = self.encoder(self.embed(src), src_pad).index_select(0, index)   # (rows, src, d)
        pad = src_pad.index_select(0, index)                                 # (rows, src) True = PAD
        empty = pad.all(dim=1)[:, None]                                      # (rows, 1) no source key at all
        keys, values = [], []
        for attention in self.cross:
            k, v = attention.project_kv(memory)                              # (rows, heads, src, d_k | d_v)
            keys.append(k.contiguous())
            values.append(v.masked_fill(empty[:, :, None, None], 0.0).contiguous())
        return (*keys, *values, (~pad | empty)[:, None, None, :])           # ..., source (rows, 1, 1, src)


class StepGraph(nn.Module):
    """One decoding step and the search's choice: what one compiled graph runs.

    The logits of every row, then `search.advance` (decoding/search.py: the ranked candidates, which
    finish, which K stay live, the sentences done); with beams, the self-attention buffers are then
    gathered anew in the order of the beams' parents, so the next step reads each beam's own past. (Gathered
    into new buffers: copying the gathered rows back into a buffer this step also wrote gave wrong rows once
    compiled ahead of time.)"""

    def __init__(self, weights: DecoderStep, search) -> None:
        super().__init__()
        self.weights, self.search = weights, search
        self.pad_id, self.eos_id = weights.cfg.pad_id, weights.cfg.eos_id

    def forward(self, tokens: Tensor, scores: Tensor, limits: Tensor, live: Tensor, worst: Tensor, history: Tensor,
                pos: Tensor, alpha: Tensor, self_k: list[Tensor], self_v: list[Tensor], cross_k: list[Tensor],
                cross_v: list[Tensor], source: Tensor) -> tuple:
        """The fields of decoding/search.py's `Slots`, `pos` (0-dim) the position of `tokens` -> one flat tuple:
        the fields of an `Advance`, then the self-attention K and V buffers the next step reads (this step's
        rows written at `pos`; with beams, new buffers whose rows follow the beams)."""
        logits = self.weights.logits(tokens, pos, self_k, self_v, cross_k, cross_v, source)   # (rows, vocab)
        slots = (tokens, scores, limits, live, worst, history)
        out = self.search.advance(logits, slots, pos + 1, alpha, self.pad_id, self.eos_id)
        if self.search.beam > 1:
            rows = out[1]                                                    # (rows,) each beam's parent row
            self_k = [t.index_select(0, rows) for t in self_k]              # (rows, heads, positions, d)
            self_v = [t.index_select(0, rows) for t in self_v]
        return (*out, *self_k, *self_v)


class StaticDecoder:
    """The decoding API `generate` runs (cfg, start): SourceStep once per batch, then the static step.

    compiled: SourceStep and the step of each strategy (one per beam size) run as packages compiled ahead
    of time, built on first use and kept on disk (compiler.py), else eagerly; either way the same numbers
    to float rounding. `compile_seconds` keeps what each package cost to build or load; `notes` hears
    why compiling failed (that part then runs eagerly)."""

    def __init__(self, model: Transformer, compiled: bool = False, *,
                 notes: Callable[[str], None] | None = None) -> None:
        reason = unsupported(model)
        if reason:
            raise ValueError(f"the static decoding step cannot run this model: {reason}")
        self.cfg, self.model = model.cfg, model
        with torch.no_grad():
            self.weights = DecoderStep(model).eval()
        self.compiled, self.notes = compiled, notes
        self.positions = tuple(torch.tensor(i) for i in range(self.cfg.max_len))   # 0-dim: a step's `pos`
        self._parts: dict[str, Callable] = {}
        self._paths: dict[str, Path] = {}                                    # part name -> its package
        self.compile_seconds: dict[str, float] = {}                          # "source" / step_name -> seconds

    def start(self, src: Tensor, src_pad: Tensor, search) -> StaticRun:
        """A run for the sentences `src` (sent, src) with K = search.beam beams each."""
        return StaticRun(self, src, src_pad, search)

    def packages(self, search) -> list[Path]:
        """Where the packages this strategy runs on are kept (compiler.py): the source side's, the step's."""
        return [self._path("source", lambda: SourceStep(self.model)),
                self._path(step_name(search), lambda: StepGraph(self.weights, search), search)]

    def _path(self, name: str, make: Callable[[], nn.Module], search=None) -> Path:
        """A part's package path, worked out once per decoder (it hashes every weight)."""
        if name not in self._paths:
            self._paths[name] = package_path(make(), self._facts("source" if search is None else "step", search))
        return self._paths[name]

    def built(self, search) -> bool:
        """Whether the packages this strategy runs on are already in the cache folder."""
        return all(path.exists() for path in self.packages(search))

    def part(self, name: str, make: Callable[[], nn.Module], inputs: tuple, search=None) -> Callable:
        """SourceStep ("source") or the step of a strategy (`step_name`): compiled on its first call."""
        part = self._parts.get(name)
        if part is None:
            part = make()
            if self.compiled:
                began = time.perf_counter()
                kind = "source" if search is None else "step"
                example = _example(inputs, kind, 1 if search is None else search.beam)
                built = compiled(part, example, dynamic_shapes(example, kind, self.cfg.max_len, search),
                                 self._facts(kind, search), self.notes, self._path(name, lambda: part, search))
                self.compiled = built is not part                            # failed once: eager from now on
                part = built
                self.compile_seconds[name] = time.perf_counter() - began
            self._parts[name] = part
        return part

    def _facts(self, kind: str, search=None) -> dict:
        """What a package of `kind` depends on besides its weights and the model and speed-layer code."""
        facts = {"kind": kind, "config": repr(self.cfg)}
        if search is not None:
            code = sorted({inspect.getsourcefile(type(search)), *getattr(search, "traced_files", ())})   # traced too
            facts.update(search=type(search).__name__, beam=search.beam, code=code,
                         threads=step_threads(search))
        return facts


def step_threads(search) -> int:
    """The threads a strategy's step package is built for: greedy for one (its rows are few, or many small
    sentences: a second thread only waits); beams for the threads decoding runs on now (threads.py), which the
    package's own loops over every beam's vocabulary then share. A package runs on any thread count; built
    for two, a beam-4 step of 32 sentences took 0.78x the time of one built for one (docs/performance.md)."""
    return 1 if search.beam == 1 else torch.get_num_threads()


def step_name(search) -> str:
    """The name of a strategy's step package: "beam K", and the threads it is built for when more than one."""
    threads = step_threads(search)
    return f"beam {search.beam}" + ("" if threads == 1 else f" on {threads} threads")


def dynamic_shapes(example: tuple, kind: str, max_len: int, search=None) -> tuple:
    """torch.export's symbolic sizes for the inputs of SourceStep ("source") or StepGraph ("step"): sentence
    slots, rows (slots × beam), source positions, self-attention positions, the history's width."""
    Dim = torch.export.Dim
    source = Dim("source", min=1, max=max_len)
    if kind == "source":
        sentences, rows = Dim("sentences", min=1, max=MAX_ROWS), Dim("rows", min=1, max=MAX_ROWS)
        return ({0: sentences, 1: source}, {0: sentences, 1: source}, {0: rows})
    slots = Dim("slots", min=1, max=MAX_ROWS // search.beam)
    rows = slots if search.beam == 1 else search.beam * slots
    positions, limit = Dim("positions", min=1, max=max_len), Dim("limit", min=1, max=max_len)
    *_, self_k, self_v, cross_k, cross_v, _ = example
    state = ({0: rows}, {0: slots}, {0: slots}, {0: slots}, {0: slots}, {0: rows, 1: limit})
    return (*state, None, None, [{0: rows, 2: positions}] * len(self_k), [{0: rows, 2: positions}] * len(self_v),
            [{0: rows, 2: source}] * len(cross_k), [{0: rows, 2: source}] * len(cross_v), {0: rows, 3: source})


def _example(inputs: tuple, kind: str, K: int) -> tuple:
    """Inputs like `inputs` with every dynamic size 2 or 3 (2 sentences, 3 positions): above 1, so tracing
    keeps each size symbolic."""
    def sized(t: Tensor, **dims: int) -> Tensor:
        shape = list(t.shape)
        for dim, size in dims.items():
            shape[int(dim[1:])] = size
        return t.new_zeros(shape)
    if kind == "source":
        src, src_pad, index = inputs
        return sized(src, d0=2, d1=3) + 5, sized(src_pad, d0=2, d1=3), torch.tensor([0, 1, 1])
    tokens, scores, limits, live, worst, history, pos, alpha, self_k, self_v, cross_k, cross_v, source = inputs
    rows, slot = {"d0": 2 * K}, {"d0": 2}
    slots = (sized(tokens, **rows), sized(scores, **slot), sized(limits, **slot) + 3, sized(live, **slot),
             sized(worst, **slot), sized(history, **rows, d1=3))
    buffers = [[sized(t, **rows, d2=3) for t in ts] for ts in (self_k, self_v, cross_k, cross_v)]
    return (*slots, pos, alpha, *buffers, sized(source, **rows, d3=3))


class StaticRun:
    """One batch's buffers on the static step: K beams per sentence, live sentences padded to a bucket."""

    def __init__(self, decoder: StaticDecoder, src: Tensor, src_pad: Tensor, search) -> None:
        self.decoder, self.search, self.K = decoder, search, search.beam
        self.name = step_name(search)                                        # its package, for this run's threads
        cfg = decoder.cfg
        self.length = 0                                                      # target positions written
        sentences = src.size(0)
        index = torch.arange(sentences, device=src.device).repeat_interleave(self.K)
        index = _padded(index, self.capacity(sentences) * self.K)            # (rows,) the sentence of each row
        inputs = (src, src_pad, index)
        source = decoder.part("source", lambda: SourceStep(decoder.model), inputs)
        with torch.no_grad():
            *cross, self.source = source(*inputs)
        layers = len(cross) // 2
        self.cross_k, self.cross_v = list(cross[:layers]), list(cross[layers:])
        shape = (index.numel(), cfg.heads, min(SELF_STEP, cfg.max_len))
        self.self_k = [src.new_zeros(*shape, cfg.d_k, dtype=torch.float32) for _ in self.cross_k]
        self.self_v = [src.new_zeros(*shape, cfg.d_v, dtype=torch.float32) for _ in self.cross_k]

    def capacity(self, sentences: int) -> int:
        """Slots for `sentences` live sentences: the smallest bucket that holds them."""
        return bucket(sentences)

    def step(self, slots: tuple, length: int, alpha: Tensor) -> tuple:
        """The step that makes `length` tokens: the fields of an `Advance` (decoding/search.py)."""
        cfg, pos = self.decoder.cfg, length - 1
        if pos >= cfg.max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {cfg.max_len}")
        if pos >= self.self_k[0].size(2):                                    # buffers full: SELF_STEP more
            size = min(self.self_k[0].size(2) + SELF_STEP, cfg.max_len)
            self.self_k = [_grown(t, size, pos) for t in self.self_k]
            self.self_v = [_grown(t, size, pos) for t in self.self_v]
        inputs = (*slots, self.decoder.positions[pos], alpha, self.self_k, self.self_v, self.cross_k, self.cross_v,
                  self.source)
        step = self.decoder.part(self.name, lambda: StepGraph(self.decoder.weights, self.search), inputs,
                                 self.search)
        out = step(*inputs)                                                  # (generate runs without gradients)
        layers, fields = len(self.self_k), len(out) - 2 * len(self.self_k)
        self.self_k, self.self_v = list(out[fields: fields + layers]), list(out[fields + layers:])
        self.length = length
        return out[:fields]

    def keep(self, rows: Tensor) -> None:
        """Keep rows `rows`: the live sentences' slots first, padded to a smaller bucket."""
        n = self.length
        self.self_k = [_rows(t, rows, n) for t in self.self_k]
        self.self_v = [_rows(t, rows, n) for t in self.self_v]
        self.cross_k = [t.index_select(0, rows) for t in self.cross_k]
        self.cross_v = [t.index_select(0, rows) for t in self.cross_v]
        self.source = self.source.index_select(0, rows)


def _padded(index: Tensor, size: int) -> Tensor:
    """`index` (rows,) extended to `size` rows by repeating its first row (a real source)."""
    extra = size - index.numel()
    return index if extra == 0 else torch.cat([index, index[:1].expand(extra)])


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
