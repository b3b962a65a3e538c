"""Encoder, Decoder, the encoder-decoder Transformer with its vocabulary head, and the
encoder-only / decoder-only families built from the same layers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cache import KVCache
from .config import ModelConfig
from .hooks import Hooked, HookPoint
from .layers import DecoderLayer, EncoderLayer
from .masks import padding_mask
from .positions import LearnedPositions, sinusoidal_positions


class Embeddings(nn.Module):
    """Token embedding x sqrt(d) plus the absolute position vector (sinusoidal or learned), then dropout.

    Relative bias and RoPE act inside attention instead, so they add nothing here.
    """

    def __init__(self, vocab: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token = nn.Embedding(vocab, cfg.d_model)
        nn.init.normal_(self.token.weight, std=cfg.d_model ** -0.5)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0
        self.learned = LearnedPositions(cfg.max_len, cfg.d_model) if cfg.positions == "learned" else None
        self.sinusoidal = cfg.positions == "sinusoidal"
        self._tables: dict[tuple[torch.dtype, torch.device], Tensor] = {}   # the fixed table, per dtype/device
        self.dropout = nn.Dropout(cfg.dropout)

    def position_table(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The sinusoidal table (max_len, d), computed in float64 and cast once per dtype and device."""
        key = (dtype, device)
        if key not in self._tables:
            table = sinusoidal_positions(self.cfg.max_len, self.cfg.d_model, torch.float64, self.cfg.position_layout)
            self._tables[key] = table.to(device=device, dtype=dtype)
        return self._tables[key]

    def forward(self, ids: Tensor, offset: int = 0, at: Tensor | None = None) -> Tensor:
        """ids: (batch, len) -> (batch, len, d); `offset` = absolute position of the first row; `at` = the
        rows' absolute positions (len,) as a tensor, or (batch, len) each row's own (a decoding step: the KV
        cache's, `offset` its length)."""
        n = ids.size(1)
        if offset + n > self.cfg.max_len and self.cfg.positions in ("sinusoidal", "learned"):
            raise ValueError(f"sequence length {offset + n} exceeds max_len {self.cfg.max_len}")
        x = self._lookup(ids)                                                # (batch, len, d)
        if at is not None and at.dim() == 2:          # a finished sentence's row, still computing: the last position
            at = at.clamp(max=self.cfg.max_len - 1)
        if self.sinusoidal:                                                  # one op: PE + sqrt(d) x
            table = self.position_table(x.dtype, x.device)
            if at is None:
                rows = table[offset: offset + n]                                 # (len, d)
            else:
                rows = table.index_select(0, at) if at.dim() == 1 else table[at]   # (len, d) | (batch, len, d)
            x = torch.add(rows, x, alpha=self.scale)
        else:
            x = x * self.scale
            if self.learned is not None:
                x = x + self.learned(torch.arange(offset, offset + n, device=ids.device) if at is None else at)
        return self.dropout(x)

    def _lookup(self, ids: Tensor) -> Tensor:
        """Embedding rows of `ids`; an id outside [0, vocab) is a ValueError naming the range.

        On the CPU the lookup bounds-checks by itself, so the hot path adds no reduction or host sync;
        on other devices (where a bad id would only trip a device assert) the ids are checked first.
        """
        vocab = self.token.num_embeddings
        if ids.device.type == "cpu":
            try:
                return self.token(ids)
            except IndexError:
                pass
        elif not ids.numel() or (int(ids.min()) >= 0 and int(ids.max()) < vocab):
            return self.token(ids)
        raise ValueError(f"token id out of range [0, {vocab}): min {int(ids.min())}, max {int(ids.max())}")


class Encoder(nn.Module):
    """A stack of EncoderLayers over embedded source rows (plus a final LN for pre-norm).

    Hook points: `embedding` (the embedded source rows, the stack's input), `output` H."""

    def __init__(self, cfg: ModelConfig, n_layers: int) -> None:
        super().__init__()
        self.embedding = HookPoint()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps) if cfg.use_final_norm else None
        self.output = HookPoint()

    def forward(self, x: Tensor, src_pad: Tensor | None = None, *, mask: Tensor | None = None) -> Tensor:
        """x: (batch, src, d); src_pad: (batch, src) True = PAD. Returns H: (batch, src, d)."""
        if mask is None and src_pad is not None:
            mask = padding_mask(src_pad)                                     # (batch, 1, 1, src)
        x = self.embedding(x)
        for layer in self.layers:
            x = layer(x, mask)
        if self.norm is not None:
            x = self.norm(x)
        return self.output(x)                                                # (batch, src, d)


class Decoder(nn.Module):
    """A stack of DecoderLayers: masked self-attention, cross-attention to H, FFN (final LN for pre).

    Hook points: `embedding` (the embedded target rows), `output` (the last rows before the head)."""

    def __init__(self, cfg: ModelConfig, n_layers: int, cross: bool = True) -> None:
        super().__init__()
        self.embedding = HookPoint()
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross=cross) for _ in range(n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.eps) if cfg.use_final_norm else None
        self.output = HookPoint()

    def forward(self, y: Tensor, memory: Tensor | None = None, src_pad: Tensor | None = None,
                tgt_pad: Tensor | None = None, *, cache: KVCache | None = None) -> Tensor:
        """y: (batch, tgt, d): the whole target, or with `cache` the newest rows of a decoding step.

        tgt_pad is optional: right padding is already hidden from every real row by the triangle, so
        training may skip it (the padded rows are excluded from the loss)."""
        self_mask = padding_mask(tgt_pad) if tgt_pad is not None else None  # (batch, 1, 1, tgt)
        memory_mask = padding_mask(src_pad) if src_pad is not None else None  # no triangle on cross
        y = self.embedding(y)
        for layer in self.layers:
            y = layer(y, memory, self_mask, memory_mask, causal=True, cache=cache)
        if cache is not None:
            cache.advance(y.size(1))
        if self.norm is not None:
            y = self.norm(y)
        return self.output(y)                                                # (batch, tgt, d)


def _label_smoothed_nll(logits: Tensor, labels: Tensor, smoothing: float) -> Tensor:
    """Summed cross-entropy over rows (rows are already non-PAD), with label smoothing."""
    return F.cross_entropy(logits.float(), labels, reduction="sum", label_smoothing=smoothing)


class Transformer(Hooked, nn.Module):
    """The 2017 encoder-decoder: source encoder, target decoder with cross-attention, vocabulary head.

    Hook point `logits`; every other probe lives in the encoder and decoder (docs/probes.md).
    `model.probes(...)` records, `model.intervene(...)` replaces values (hooks.py).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embeddings(cfg.src_vocab, cfg)
        self.tgt_embed = Embeddings(cfg.tgt_vocab, cfg)
        self.encoder = Encoder(cfg, cfg.encoder_layers)
        self.decoder = Decoder(cfg, cfg.decoder_layers, cross=True)
        if cfg.share_embeddings:                                             # one matrix for source and target
            self.tgt_embed.token.weight = self.src_embed.token.weight
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=cfg.head_bias)  # the vocabulary head
        self.logits_hook = HookPoint("logits")
        if cfg.tie_target:
            self.head.weight = self.tgt_embed.token.weight
        else:
            nn.init.normal_(self.head.weight, std=cfg.d_model ** -0.5)
        if self.head.bias is not None:
            nn.init.zeros_(self.head.bias)

    # ---- pieces ------------------------------------------------------------------------
    def source_padding(self, src: Tensor) -> Tensor:
        return src == self.cfg.pad_id                                        # (batch, src) True = PAD

    def encode(self, src: Tensor, src_pad: Tensor | None = None) -> Tensor:
        """src ids (batch, src) -> H (batch, src, d)."""
        src_pad = self.source_padding(src) if src_pad is None else src_pad
        return self.encoder(self.src_embed(src), src_pad)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor | None = None,
               tgt_pad: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Right-shifted target ids (batch, tgt) + H -> decoder output rows (batch, tgt, d).

        With `cache`, tgt_in holds only the newest ids (positions cache.length..); their rows attend to
        the cached ones (incremental decoding), and `memory` may be None once the cache holds its K/V."""
        if cache is None:
            return self.decoder(self.tgt_embed(tgt_in), memory, src_pad, tgt_pad)
        at = cache.start(tgt_in.size(1), tgt_in.device)                      # (new,) the cache's columns
        y = self.tgt_embed(tgt_in, cache.length if cache.joined is None else 0, cache.positions(at))
        src_pad = cache.source_padding(src_pad)                              # None when no source row has PAD
        return self.decoder(y, memory, src_pad, tgt_pad, cache=cache)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.logits_hook(self.head(hidden))                      # (..., tgt_vocab)

    # ---- whole passes --------------------------------------------------------------------
    def forward(self, src: Tensor, tgt_in: Tensor, src_pad: Tensor | None = None,
                tgt_pad: Tensor | None = None) -> Tensor:
        """Teacher forcing: every target row's next-token logits in one pass, (batch, tgt, vocab)."""
        src_pad = self.source_padding(src) if src_pad is None else src_pad
        memory = self.encode(src, src_pad)
        return self.logits(self.decode(tgt_in, memory, src_pad, tgt_pad))

    def loss(self, src: Tensor, tgt_in: Tensor, labels: Tensor, label_smoothing: float = 0.0,
             src_pad: Tensor | None = None) -> tuple[Tensor, int]:
        """Summed label-smoothed cross-entropy over non-PAD labels (`loss_sum`), and their count."""
        total = self.loss_sum(src, tgt_in, labels, label_smoothing, src_pad)
        return total, int((labels != self.cfg.pad_id).sum())

    def loss_sum(self, src: Tensor, tgt_in: Tensor, labels: Tensor, label_smoothing: float = 0.0,
                 src_pad: Tensor | None = None) -> Tensor:
        """Summed label-smoothed cross-entropy over non-PAD labels, a 0-dim tensor (no host sync: the
        training step, compiled or not, calls this).

        Only rows with a real label reach the vocabulary head: no logits are computed at PAD."""
        src_pad = self.source_padding(src) if src_pad is None else src_pad
        keep = labels != self.cfg.pad_id                                     # (batch, tgt)
        hidden = self.decode(tgt_in, self.encode(src, src_pad), src_pad)     # (batch, tgt, d)
        logits = self.logits(hidden[keep])                                   # (n_real, tgt_vocab)
        return _label_smoothed_nll(logits, labels[keep], label_smoothing)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache, its buffers first sized for `capacity` target positions (default GROW; they grow)."""
        return KVCache(capacity)

    def decode_step(self, tokens: Tensor, memory: Tensor | None, src_pad: Tensor | None, cache: KVCache) -> Tensor:
        """Feed the newest target token(s) (batch, new) through the cache; logits (batch, new, vocab).

        The one incremental decoder: `decode` with the cache. It runs as it is, on the copy that
        `glassformer.inference.prepare(model)` makes (faster weights, the same method), and compiled
        ahead of time (glassformer.inference.compiler traces this method)."""
        return self.logits(self.decode(tokens, memory, src_pad, cache=cache))


class EncoderOnlyModel(Hooked, nn.Module):
    """BERT-like: bidirectional encoder layers and a tied head for masked-token reconstruction."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg.src_vocab, cfg)
        self.encoder = Encoder(cfg, cfg.encoder_layers)
        self.head = nn.Linear(cfg.d_model, cfg.src_vocab, bias=False)
        self.head.weight = self.embed.token.weight
        self.logits_hook = HookPoint("logits")

    def forward(self, ids: Tensor, pad: Tensor | None = None) -> Tensor:
        pad = ids == self.cfg.pad_id if pad is None else pad
        return self.logits_hook(self.head(self.encoder(self.embed(ids), pad)))   # (batch, len, vocab)


class DecoderOnlyModel(Hooked, nn.Module):
    """GPT-like: causal layers (no cross-attention) and a tied head for next-token prediction."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg.tgt_vocab, cfg)
        self.decoder = Decoder(cfg, cfg.decoder_layers, cross=False)
        self.head = nn.Linear(cfg.d_model, cfg.tgt_vocab, bias=False)
        self.head.weight = self.embed.token.weight
        self.logits_hook = HookPoint("logits")

    def forward(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        x = self.embed(ids) if cache is None else self.embed(ids, cache.length, cache.start(ids.size(1), ids.device))
        return self.logits_hook(self.head(self.decoder(x, cache=cache)))    # (batch, len, vocab)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return KVCache(capacity)


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model of `cfg.family`, from the same layers."""
    if cfg.family == "encoder-only":
        return EncoderOnlyModel(cfg)
    if cfg.family == "decoder-only":
        return DecoderOnlyModel(cfg)
    return Transformer(cfg)
