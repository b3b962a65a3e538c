"""Sentences joining a running batch: greedy decoding on compiled steps keeps its rows full.

A batch's sentences end at different steps; a compiled step costs about as much for 8 live rows as for 16, so the
last sentences of each batch decoded at a fraction of the full batch's rate per row (docs/performance.md). Here the
sentences of the next batches take the slots of those that ended, one step into the run: each gets BOS, its
cross-attention K/V and source padding in the slot's row, and the cache's `joined` holds the column it began at
(model/cache.py: its row sees its own keys only, its positions count from there). `search.generate` runs it with
`more`, the padded sources of the batches to come; the Translator passes them where `joins`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from .hypotheses import Finished
from .sizes import sentence_limits

JOIN_AT = 4      # free slots that let waiting sentences join a running batch (fewer: the dead rows run on a while)
SHIFT_AT = 16    # a cache's first columns, once every live sentence began after them, are dropped


def joins(search, compiled) -> bool:
    """Whether sentences of later batches can join a running batch (`generate`'s `more`): greedy on compiled steps,
    one step a call (their packages take each row's first column)."""
    return compiled is not None and search.beam == 1 and max(compiled.per_call.values()) == 1


class Waiting:
    """The sentences of the batches still to come (`more`: padded sources, taken a batch at a time once the last is
    used up), each joining the running batch in a slot whose sentence ended: its row gets BOS, the sentence's limit
    counted from the column it joins at, its cross-attention K/V and source padding; the cache's `joined` keeps that
    column, so the row sees its own sentence's keys only and its positions count from there. While sentences wait the
    batch keeps its rows; the columns before every live sentence's first are dropped once there are SHIFT_AT."""

    def __init__(self, run, more: Iterator[Tensor], max_len: int | Tensor | None, n_best: int) -> None:
        if not joins(run.search, run.compiled):
            raise ValueError("more: sentences join a running batch on compiled greedy steps only (`joins`)")
        self.run, self.more, self.max_len, self.n_best = run, more, max_len, n_best
        self.cross: dict = {}
        self.src_pad = self.ends = self.limits = None
        self.next, self.sizes, self.done = 0, [], False      # sizes: sentences of each batch taken from `more`

    def _load(self, live: Tensor) -> bool:
        """The next batch of `more` encoded, its source columns and the running batch's made alike (as many as the
        longest source of the live rows and the batch: a long sentence that ended leaves none to read); False: none."""
        src = next(self.more, None)
        if src is None:
            self.done = True
            return False
        run, cfg = self.run, self.run.model.cfg
        src_pad, cache = src == cfg.pad_id, run.model.new_cache()
        run.compiled.source(cache, src, src_pad, torch.arange(src.size(0), device=src.device))
        width = max(src.size(1), int(((~run.src_pad).sum(dim=1) * live).max()))   # sources: right-padded
        if width < run.src_pad.size(1):                    # the cross-attention K/V of the live rows' sources only
            run.cache.cross = {a: (k[:, :, :width].contiguous(), v[:, :, :width].contiguous())
                               for a, (k, v) in run.cache.cross.items()}
            run.src_pad = run.src_pad[:, :width].contiguous()                 # (a package reads it as laid out)
        run.cache.cross = {a: (_widen(k, width), _widen(v, width)) for a, (k, v) in run.cache.cross.items()}
        run.src_pad = _widen(run.src_pad, width, dim=1, value=True)
        self.cross = {a: (_widen(k, width), _widen(v, width)) for a, (k, v) in cache.cross.items()}
        self.src_pad = _widen(src_pad, width, dim=1, value=True)
        self.ends = sentence_limits(src_pad, cfg.max_len, self.max_len).to(src.device)   # each limit, a tensor
        self.limits = self.ends.tolist()                                                # and on the host
        self.next = 0
        self.sizes.append(src.size(0))
        return True

    def after(self, slots, sentence: list[int], starts: list[int], finished: list, length: int, alive: int) -> tuple:
        """After a step where sentences ended: waiting sentences joined, columns dropped: the slots, the tokens' count
        (columns), the live count."""
        live = slots.live.tolist()
        if not self.done:
            slots = self.join(slots, live, sentence, starts, finished, length)
            alive = sum(live)
        return (*self.shift(slots, live, starts, length), alive)

    def join(self, slots, live: list[bool], sentence: list[int], starts: list[int], finished: list, length: int):
        """Waiting sentences in the free slots (at most those of one batch), joining at column `length`; `live` (the
        host's copy) updated. In place: the slots' tensors are this step's own (a package's outputs, the loop's)."""
        free = [slot for slot, alive in enumerate(live) if not alive]
        if len(free) < JOIN_AT and len(free) < len(sentence):
            return slots
        if (self.limits is None or self.next >= len(self.limits)) and not self._load(slots.live):
            return slots
        m = min(len(free), len(self.limits) - self.next)
        rows, free = slice(self.next, self.next + m), free[:m]
        into = torch.tensor(free, device=slots.tokens.device)
        run = self.run
        for (k, v), (nk, nv) in zip(run.cache.cross.values(), self.cross.values(), strict=True):
            k.index_copy_(0, into, nk[rows])                                # the cache's own rows
            v.index_copy_(0, into, nv[rows])
        run.src_pad.index_copy_(0, into, self.src_pad[rows])
        run.cache.joined.index_fill_(0, into, length)
        slots.limits.index_copy_(0, into, self.ends[rows] + length)
        for tensor, value in ((slots.tokens, run.model.cfg.bos_id), (slots.scores, 0.0), (slots.live, True),
                              (slots.worst, -math.inf)):
            tensor.index_fill_(0, into, value)
        for slot in free:
            sentence[slot], starts[slot], live[slot] = len(finished), length, True
            finished.append(Finished(self.n_best))
        self.next += m
        history = _widen(slots.history, length + max(self.limits[rows]), dim=1, value=0)
        return slots._replace(history=history)

    def at_last_column(self, length: int) -> bool:
        """Whether the tokens' columns reach the model's last: the first columns are dropped then, at a step where no
        sentence ended too (a sentence that joined late would otherwise run past the cache's buffers)."""
        return length >= self.run.model.cfg.max_len - 1

    def shift(self, slots, live: list[bool], starts: list[int], length: int) -> tuple:
        """Drop the cache's and the history's first columns where every live sentence began SHIFT_AT or more after
        them (or the columns reach the model's last): the slots and the tokens' count, as columns, after it."""
        first = min((start for start, alive in zip(starts, live, strict=True) if alive), default=length)
        if first == 0 or first < SHIFT_AT and not self.at_last_column(length):
            return slots, length
        cache = self.run.cache
        cache.k = {a: t[:, :, first:].contiguous() for a, t in cache.k.items()}
        cache.v = {a: t[:, :, first:].contiguous() for a, t in cache.v.items()}
        cache.length -= first
        cache.joined = (cache.joined - first).clamp(min=0)
        starts[:] = [max(start - first, 0) for start in starts]
        return slots._replace(limits=slots.limits - first, history=slots.history[:, first:].contiguous()), \
            length - first


def _widen(t: Tensor, width: int, dim: int = 2, value: float | bool = 0) -> Tensor:
    """`t` with at least `width` columns along `dim`, the new ones `value`."""
    if t.size(dim) >= width:
        return t
    shape = list(t.shape)
    shape[dim] = width - t.size(dim)
    return torch.cat([t, t.new_full(shape, value)], dim=dim)
