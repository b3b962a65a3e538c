"""The three systems, each written from its own public API the ordinary way a user would write it.

- glassformer: `Transformer.loss` for training; decoding through `glassformer.inference.prepare(model)`
  (`encode` / `new_cache` / `decode_step`) under the project's thread policy.
- torch: `torch.nn.Transformer` with its own embeddings, sinusoidal positions, tied generator and masks
  (the PyTorch translation tutorial's shape); decoding recomputes the whole prefix each step.
- marian: `transformers.MarianMTModel(MarianConfig(...))` with random weights; `generate` for decoding.

Every system offers the same methods, so the harness treats them alike:
`n_parameters()`, `prepare(pairs)`, `train_step(prepared) -> loss`, `greedy(src, n_new)`,
`beam(src, n_new, beams)`, `step_seconds(src, prefix, cached, steps)`.
"""

from __future__ import annotations

import inspect
import math
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .work import BOS, EOS, PAD, SPEC, Pairs, Spec

SYSTEMS = ("glassformer", "torch", "marian")


def unique_trainable(module: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once (`parameters()` already de-duplicates)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _sinusoidal(n: int, d: int) -> Tensor:
    """The 2017 table, interleaved sin/cos, as a user would write it for nn.Transformer."""
    position = torch.arange(n).unsqueeze(1)                                  # (n, 1)
    div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))       # (d/2,)
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)
    return table                                                            # (n, d)


class System:
    """Shared training and beam-search plumbing; subclasses provide the model calls."""

    name = "?"

    def __init__(self, spec: Spec = SPEC, seed: int = 0) -> None:
        self.spec = spec
        torch.manual_seed(seed)
        self.model = self.build(spec)                                        # trained by the training cases
        torch.manual_seed(seed)
        self.fresh = self.build(spec).eval()                                 # decoding: untrained weights
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.lr)

    @staticmethod
    def build(spec: Spec) -> nn.Module:
        """The model with random weights from the shared sizes."""
        raise NotImplementedError

    def n_parameters(self) -> int:
        return unique_trainable(self.model)

    def prepare(self, pairs: Pairs) -> Pairs:
        """Put a batch into the form this system's users feed it (done once, outside the timing)."""
        return pairs

    def loss(self, batch) -> Tensor:
        raise NotImplementedError

    def train_step(self, batch) -> float:
        """Forward, backward and one AdamW update on a prepared batch; returns the mean loss."""
        self.model.train()
        loss = self.loss(batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    # ---- decoding: subclasses give `start(src)` and `next_logits(state, tokens)` ---------------
    def greedy(self, src: Tensor, n_new: int) -> Tensor:
        raise NotImplementedError

    def beam(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        raise NotImplementedError

    def step_seconds(self, src: Tensor, prefix: int, cached: bool, steps: int) -> float:
        raise NotImplementedError


def beam_loop(start, advance, reorder, batch: int, n_new: int, beams: int, vocab: int) -> Tensor:
    """A plain beam search of exactly `n_new` tokens (EOS forbidden, as min_new_tokens does).

    start() -> state for batch * beams rows; advance(state, tokens (rows, 1)) -> logits (rows, vocab);
    reorder(state, index) keeps rows `index`. Returns the best hypothesis per source: (batch, n_new).
    """
    rows = batch * beams
    tokens = torch.full((rows, 1), BOS, dtype=torch.long)
    scores = torch.zeros(batch, beams)
    scores[:, 1:] = float("-inf")                                            # one live beam at first
    history = torch.empty(rows, 0, dtype=torch.long)
    base = (torch.arange(batch) * beams).unsqueeze(1)                       # (batch, 1)
    state = start()
    for _ in range(n_new):
        logp = torch.log_softmax(advance(state, tokens).float(), dim=-1)     # (rows, vocab)
        logp[:, EOS] = float("-inf")
        total = (scores.view(rows, 1) + logp).view(batch, beams * vocab)
        scores, flat = total.topk(beams, dim=-1)                            # (batch, beams)
        index = (flat // vocab + base).view(-1)                             # rows to keep
        tokens = (flat % vocab).view(rows, 1)
        state = reorder(state, index)
        history = torch.cat([history.index_select(0, index), tokens], dim=1)
    return history.view(batch, beams, n_new)[:, 0]


# ---- glassformer ---------------------------------------------------------------------------------
class Glassformer(System):
    name = "glassformer"

    @staticmethod
    def build(spec: Spec) -> nn.Module:
        from glassformer.model import ModelConfig, Transformer

        cfg = ModelConfig(src_vocab=spec.vocab, tgt_vocab=spec.vocab, d_model=spec.d_model, heads=spec.heads,
                          d_ff=spec.d_ff, encoder_layers=spec.layers, decoder_layers=spec.layers,
                          dropout=spec.dropout, norm_placement="post", positions="sinusoidal",
                          tie_target=True, max_len=spec.max_len, pad_id=PAD)
        return Transformer(cfg)

    def loss(self, batch: Pairs) -> Tensor:
        total, n = self.model.loss(batch.src, batch.tgt_in, batch.labels)
        return total / n

    @property
    def decoder(self):
        """glassformer.inference.prepare of the decoding model (built once: its weights stay fixed)."""
        if getattr(self, "_decoder", None) is None:
            from glassformer.inference import prepare
            self._decoder = prepare(self.fresh)
        return self._decoder

    @staticmethod
    def threads(rows: int):
        """The project's thread policy for a decoding job of `rows` rows per step (never above --threads)."""
        from glassformer.inference import decoding_threads, use_threads
        return use_threads(decoding_threads(rows))

    @torch.inference_mode()
    def greedy(self, src: Tensor, n_new: int) -> Tensor:
        m = self.decoder
        with self.threads(src.size(0)):
            src_pad = src == PAD
            memory = m.encode(src, src_pad)                                  # (batch, S, d)
            cache = m.new_cache()
            token = torch.full((src.size(0), 1), BOS, dtype=torch.long)
            out = []
            for _ in range(n_new):
                token = m.decode_step(token, memory, src_pad, cache)[:, -1].argmax(-1, keepdim=True)
                out.append(token)
        return torch.cat(out, dim=1)                                         # (batch, n_new)

    @torch.inference_mode()
    def beam(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        """glassformer.decoding.search.beam_search capped at n_new tokens (the project's own beam search).

        It stops a hypothesis at EOS; the harness checks that every one ran the full n_new steps.
        """
        m = self.decoder
        try:
            from glassformer.decoding.search import beam_search
        except ImportError:
            return self._beam_loop(src, n_new, beams)
        with self.threads(src.size(0) * beams):
            out = beam_search(m, src, beam=beams, max_len=n_new)
        if any(len(ids) != n_new for ids in out):
            raise RuntimeError(f"beam_search stopped at EOS: lengths {[len(ids) for ids in out]}")
        return torch.tensor(out, dtype=torch.long)

    def _beam_loop(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        m = self.decoder
        src_pad = (src == PAD).repeat_interleave(beams, 0)                   # (batch*beams, S)
        memory = m.encode(src, src == PAD).repeat_interleave(beams, 0)       # (batch*beams, S, d)

        def advance(cache, tokens):
            return m.decode_step(tokens, memory, src_pad, cache)[:, -1]

        def reorder(cache, index):
            cache.reorder(index)
            return cache

        return beam_loop(m.new_cache, advance, reorder, src.size(0), n_new, beams, self.spec.vocab)

    @torch.inference_mode()
    def step_seconds(self, src: Tensor, prefix: int, cached: bool, steps: int) -> float:
        m = self.fresh
        src_pad = src == PAD
        memory = m.encode(src, src_pad)
        ids = torch.randint(4, self.spec.vocab, (src.size(0), prefix + steps))
        if cached:
            d = self.decoder
            cache = d.new_cache()
            with self.threads(src.size(0)):
                for i in range(prefix):                                      # prefill, untimed
                    d.decode_step(ids[:, i: i + 1], memory, src_pad, cache)
                t0 = time.perf_counter()
                for i in range(prefix, prefix + steps):
                    d.decode_step(ids[:, i: i + 1], memory, src_pad, cache)
                return (time.perf_counter() - t0) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            m.logits(m.decode(ids[:, : prefix + 1], memory, src_pad)[:, -1])
        return (time.perf_counter() - t0) / steps


# ---- torch.nn.Transformer ------------------------------------------------------------------------
class TorchSeq2Seq(nn.Module):
    """nn.Transformer with token embeddings x sqrt(d), a sinusoidal table, dropout and a tied generator."""

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        d = spec.d_model
        self.scale = math.sqrt(d)
        self.src_embed = nn.Embedding(spec.vocab, d)
        self.tgt_embed = nn.Embedding(spec.vocab, d)
        self.register_buffer("pe", _sinusoidal(spec.max_len, d), persistent=False)
        self.dropout = nn.Dropout(spec.dropout)
        self.transformer = nn.Transformer(d, spec.heads, spec.layers, spec.layers, spec.d_ff, spec.dropout,
                                          activation="relu", batch_first=True, norm_first=False)
        self.generator = nn.Linear(d, spec.vocab, bias=False)
        self.generator.weight = self.tgt_embed.weight                        # tied output layer

    def embed(self, table: nn.Embedding, ids: Tensor) -> Tensor:
        return self.dropout(table(ids) * self.scale + self.pe[: ids.size(1)])

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self.transformer.encoder(self.embed(self.src_embed, src), src_key_padding_mask=src_pad)

    def decode(self, tgt: Tensor, memory: Tensor, src_pad: Tensor, tgt_pad: Tensor | None = None) -> Tensor:
        n = tgt.size(1)
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)  # True = blocked
        return self.transformer.decoder(self.embed(self.tgt_embed, tgt), memory, tgt_mask=causal,
                                        tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
                                        tgt_is_causal=True)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_pad, tgt_pad = src == PAD, tgt == PAD
        return self.generator(self.decode(tgt, self.encode(src, src_pad), src_pad, tgt_pad))


class TorchTransformer(System):
    name = "torch"

    @staticmethod
    def build(spec: Spec) -> nn.Module:
        return TorchSeq2Seq(spec)

    def loss(self, batch: Pairs) -> Tensor:
        logits = self.model(batch.src, batch.tgt_in)                         # (batch, T, vocab)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1),
                               ignore_index=PAD)

    @torch.inference_mode()
    def greedy(self, src: Tensor, n_new: int) -> Tensor:
        m = self.fresh
        src_pad = src == PAD
        memory = m.encode(src, src_pad)
        ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
        for _ in range(n_new):
            token = m.generator(m.decode(ys, memory, src_pad)[:, -1]).argmax(-1, keepdim=True)
            ys = torch.cat([ys, token], dim=1)
        return ys[:, 1:]

    @torch.inference_mode()
    def beam(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        m = self.fresh
        src_pad = (src == PAD).repeat_interleave(beams, 0)
        memory = m.encode(src, src == PAD).repeat_interleave(beams, 0)

        rows = src.size(0) * beams

        def start():
            return {"ys": torch.empty(rows, 0, dtype=torch.long)}

        def advance(state, tokens):
            state["ys"] = torch.cat([state["ys"], tokens], dim=1)            # the whole prefix, recomputed
            return m.generator(m.decode(state["ys"], memory, src_pad)[:, -1])

        def reorder(state, index):
            state["ys"] = state["ys"].index_select(0, index)
            return state

        return beam_loop(start, advance, reorder, src.size(0), n_new, beams, self.spec.vocab)

    @torch.inference_mode()
    def step_seconds(self, src: Tensor, prefix: int, cached: bool, steps: int) -> float:
        if cached:
            raise NotImplementedError("nn.Transformer has no KV cache")
        m = self.fresh
        src_pad = src == PAD
        memory = m.encode(src, src_pad)
        ids = torch.randint(4, self.spec.vocab, (src.size(0), prefix + 1))
        t0 = time.perf_counter()
        for _ in range(steps):
            m.generator(m.decode(ids, memory, src_pad)[:, -1])
        return (time.perf_counter() - t0) / steps


# ---- Hugging Face Marian -------------------------------------------------------------------------
def marian_config(spec: Spec):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=spec.vocab, decoder_vocab_size=spec.vocab, d_model=spec.d_model,
        encoder_layers=spec.layers, decoder_layers=spec.layers,
        encoder_attention_heads=spec.heads, decoder_attention_heads=spec.heads,
        encoder_ffn_dim=spec.d_ff, decoder_ffn_dim=spec.d_ff, activation_function="relu",
        dropout=spec.dropout, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=spec.max_len, scale_embedding=True, normalize_before=False,
        share_encoder_decoder_embeddings=False, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS,
        forced_eos_token_id=None)


class Marian(System):
    name = "marian"

    @staticmethod
    def build(spec: Spec) -> nn.Module:
        from transformers import MarianMTModel
        from transformers.utils import logging

        logging.set_verbosity_error()
        return MarianMTModel(marian_config(spec))

    def prepare(self, pairs: Pairs) -> dict:
        """The usual Hugging Face batch: attention_mask 1/0, labels -100 at PAD."""
        return {"input_ids": pairs.src, "attention_mask": (pairs.src != PAD).long(),
                "decoder_input_ids": pairs.tgt_in,
                "labels": pairs.labels.masked_fill(pairs.labels == PAD, -100)}

    def loss(self, batch: dict) -> Tensor:
        return self.model(**batch).loss

    def _generate(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        out = self.fresh.generate(
            input_ids=src, attention_mask=(src != PAD).long(), max_new_tokens=n_new, min_new_tokens=n_new,
            do_sample=False, num_beams=beams, use_cache=True)
        return out[:, 1:]                                                    # drop the start token

    @torch.inference_mode()
    def greedy(self, src: Tensor, n_new: int) -> Tensor:
        return self._generate(src, n_new, 1)

    @torch.inference_mode()
    def beam(self, src: Tensor, n_new: int, beams: int) -> Tensor:
        return self._generate(src, n_new, beams)

    @torch.inference_mode()
    def step_seconds(self, src: Tensor, prefix: int, cached: bool, steps: int) -> float:
        m = self.fresh
        mask = (src != PAD).long()
        encoded = m.get_encoder()(input_ids=src, attention_mask=mask)
        ids = torch.randint(4, self.spec.vocab, (src.size(0), prefix + steps))
        if cached:
            # transformers 5 calls the cache argument `cache`; 4.x called it `past_key_values`
            name = "cache" if "cache" in inspect.signature(m.forward).parameters else "past_key_values"
            out = m(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids[:, :prefix],
                    use_cache=True)
            cache = getattr(out, name)
            t0 = time.perf_counter()
            for i in range(prefix, prefix + steps):
                out = m(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids[:, i: i + 1],
                        use_cache=True, **{name: cache})
                cache = getattr(out, name)
            return (time.perf_counter() - t0) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            m(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids[:, : prefix + 1],
              use_cache=False)
        return (time.perf_counter() - t0) / steps


def make_system(name: str, spec: Spec = SPEC, seed: int = 0) -> System:
    classes = {"glassformer": Glassformer, "torch": TorchTransformer, "marian": Marian}
    if name not in classes:
        raise ValueError(f"unknown system {name!r}; expected one of {SYSTEMS}")
    return classes[name](spec, seed)
