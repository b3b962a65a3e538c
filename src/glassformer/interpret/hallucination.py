"""The hallucination signal: how much of a target the source explains, right targets against wrong ones.

Dale, Voita, Barrault, Costa-jussà 2023 ("Detecting and Mitigating Hallucinations in Machine Translation:
Model Internal Workings Alone Do Well, Sentence Similarity Even Better", ACL) find that a translation the
model writes without reading the source — a hallucination — shows as a low total source contribution
under ALTI+ (Ferrando et al. 2022, alti.py). Here the same signal is measured on targets whose status is
known by construction, teacher-forced behind each held-out source:

- "right":   the pair's own reference;
- "swapped": the reference of another pair (nothing in it comes from this source);
- "half":    the reference's first ⌊n/2⌋ words kept exactly, the rest replaced by the words from position
             ⌊m/2⌋ on of another pair's reference of m words (a translation that drifts off the source halfway;
             a one-word reference keeps nothing).

The other pair is chosen by a seeded derangement (Sattolo's algorithm: one random cycle through every pair, so
no pair is its own partner). Where the partner's reference equals this one (whitespace aside), or the "half"
target would, the next pairs in index order (partner + 1, partner + 2, … modulo the count, skipping the pair
itself) are tried in turn, so no wrong target equals its own reference.

Sentence share = the mean, over every target row, of the row's source share (attribution.source_share; alti
Σ source, a gradient method Σ|source| / (Σ|source| + Σ|prefix|) of f = log p(y_t)). The rows are the pieces
and the EOS row: the EOS row asks "is the sentence over, given this source", which a wrong target answers as
badly as any word, and Dale et al. average over every target token. Separation is the ROC AUC of right against
wrong by the Mann–Whitney statistic (higher share = right; a tie counts 1/2). For comparison every run also
scores Dale et al.'s Seq-Logprob, the target's mean log p(y_t) over the same rows (`reference`).

`glassformer hallucination [--split tatoeba] [--sentences N] [--methods M,…] [--steps S] [--seed K] [--json]`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import limits
from ..errors import UsageError
from .attribution import attribute, check_passes, check_steps, source_share
from .methods import SHARE_METHODS, SHARE_STEPS

KINDS = ("right", "swapped", "half")
WRONG = KINDS[1:]
DEFAULT_METHODS = ("alti", "integrated-gradients", "input-x-gradient")
DEFAULT_STEPS = SHARE_STEPS     # integrated gradients, trapezoid (interpret/methods.py)
DEFAULT_SENTENCES = 200
DEFAULT_SPLIT = "tatoeba"
REFERENCE = "seq-logprob"       # not a share: the mean log-probability of the target, for comparison


# ---- the contrast set ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Contrast:
    """One held-out pair and its three targets; `swapped_from` / `half_from` index the pairs that gave them."""

    id: str
    zh: str
    right: str
    swapped: str
    half: str
    swapped_from: int
    half_from: int

    def target(self, kind: str) -> str:
        return {"right": self.right, "swapped": self.swapped, "half": self.half}[kind]


def derangement(n: int, seed: int = 0) -> list[int]:
    """A seeded permutation of 0 … n − 1 with no fixed point (Sattolo's algorithm: a single n-cycle), n ≥ 2."""
    if n < 2:
        raise UsageError(f"contrast set: needs at least 2 pairs, got {n}", "sentences")
    perm = list(range(n))
    rng = random.Random(seed)
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)                      # j < i: never i itself, which makes one cycle
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _same(a: str, b: str) -> bool:
    return a.split() == b.split()


def half_target(right: str, other: str) -> str:
    """The first ⌊n/2⌋ words of `right`, then `other` from its word ⌊m/2⌋ on (n, m: their word counts)."""
    words, tail = right.split(), other.split()
    return " ".join([*words[: len(words) // 2], *tail[len(tail) // 2:]])


def contrast_set(pairs: Sequence[Any], seed: int = 0) -> list[Contrast]:
    """The right, swapped and half targets of every pair (objects with id, zh, en; module docstring)."""
    n = len(pairs)
    perm = derangement(n, seed)
    out = []
    for i, pair in enumerate(pairs):
        order = [(perm[i] + k) % n for k in range(n)]
        order = [j for j in order if j != i]
        swapped = next((j for j in order if not _same(pairs[j].en, pair.en)), None)
        half = next((j for j in order if not _same(half_target(pair.en, pairs[j].en), pair.en)), None)
        if swapped is None or half is None:
            raise UsageError(f"contrast set: no other reference differs from that of pair {pair.id!r}", "sentences")
        out.append(Contrast(pair.id, pair.zh, pair.en, pairs[swapped].en, half_target(pair.en, pairs[half].en),
                            swapped, half))
    return out


# ---- the statistic -------------------------------------------------------------------------------------

def roc_auc(right: Sequence[float], wrong: Sequence[float]) -> float:
    """P(a right score > a wrong score) + ½ P(equal): the Mann–Whitney U over n_right · n_wrong.

    U = R_right − n_right (n_right + 1) / 2, R_right the sum of the right scores' ranks in the pooled sample
    (tied values share their mean rank)."""
    a, b = np.asarray(right, dtype=np.float64), np.asarray(wrong, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("roc_auc: needs at least one score on each side")
    pooled = np.concatenate([a, b])
    order = np.argsort(pooled, kind="mergesort")
    ranks = np.empty(pooled.size, dtype=np.float64)
    ranks[order] = np.arange(1, pooled.size + 1)
    values, first, counts = np.unique(pooled[order], return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):          # ties: the mean of the ranks they span
        if count > 1:
            ranks[order[start: start + count]] = start + (count + 1) / 2
    u = ranks[: a.size].sum() - a.size * (a.size + 1) / 2
    return float(u / (a.size * b.size))


# ---- shares --------------------------------------------------------------------------------------------

def teacher_forced(model, target, text: str) -> tuple[torch.Tensor, list[int]] | None:
    """tgt_in (1, tgt) = BOS y_1 … y_n and the labels y_1 … y_n EOS of `text`; None when over max_len."""
    cfg = model.cfg
    ids = target.encode(text)
    if len(ids) + 1 > cfg.max_len:
        return None
    device = next(model.parameters()).device
    return torch.tensor([[cfg.bos_id, *ids]], device=device), [*ids, cfg.eos_id]


def row_shares(model, src: torch.Tensor, tgt_in: torch.Tensor, labels: list[int], method: str,
               steps: int = DEFAULT_STEPS) -> list[float | None]:
    """The source share of every target row (pieces and EOS): src (1, src), tgt_in (1, tgt), labels (tgt,).

    attribution.source_shares, but integrated gradients at a fixed `steps` (its default is auto)."""
    rows = list(range(len(labels)))
    a = attribute(model, src, tgt_in, rows, list(labels), method, steps=steps)
    return [source_share(a.source[r], a.prefix[r], method) for r in rows]


@torch.no_grad()
def seq_logprob(model, src: torch.Tensor, tgt_in: torch.Tensor, labels: list[int]) -> float:
    """Mean log p(y_t) over the target rows (pieces and EOS): Dale et al.'s Seq-Logprob, the reference signal."""
    logits = model(src, tgt_in)[0].double()                                # (tgt, vocab)
    rows = torch.arange(len(labels), device=logits.device)
    return float(torch.log_softmax(logits, -1)[rows, torch.tensor(labels, device=logits.device)].mean())


def sentence_share(shares: Sequence[float | None]) -> float | None:
    """The mean of a sentence's row shares (rows without one left out; None when none has one)."""
    known = [s for s in shares if s is not None]
    return sum(known) / len(known) if known else None


def check_methods(methods: Sequence[str]) -> list[str]:
    """Known, distinct methods that have a source share; anything else is a UsageError naming `methods`."""
    methods = [m.strip() for m in methods]
    if not methods or any(not m for m in methods):
        raise UsageError("--methods: expected a comma-separated list of methods", "methods")
    for m in methods:
        if m == "attention":
            raise UsageError("--methods: attention has no source share (its cross and self weights each sum to 1); "
                             f"use {', '.join(SHARE_METHODS)}", "methods")
        if m not in SHARE_METHODS:
            raise UsageError(f"--methods: {m!r} is not one of {', '.join(SHARE_METHODS)}", "methods")
    if len(set(methods)) != len(methods):
        raise UsageError("--methods: a method is named twice", "methods")
    return methods


def measure(model, source, target, pairs: Sequence[Any], methods: Sequence[str] = DEFAULT_METHODS,
            steps: int = DEFAULT_STEPS, seed: int = 0) -> dict[str, Any]:
    """Sentence shares of the right, swapped and half targets of `pairs` under each method, and the AUCs.

    A pair whose source is empty or longer than max_len, or one of whose targets is, is skipped (counted)."""
    methods = check_methods(methods)
    check_steps(steps)
    contrasts = contrast_set(pairs, seed)
    cfg = model.cfg
    device = next(model.parameters()).device
    model.eval()
    jobs = []                                                   # (source ids, {kind: (tgt_in, labels)})
    for c in contrasts:
        ids = source.analyse(c.zh).ids                          # unknown units read as <unk>, as translate does
        forced = {kind: teacher_forced(model, target, c.target(kind)) for kind in KINDS}
        if ids and len(ids) <= cfg.max_len and all(f is not None for f in forced.values()):
            jobs.append((torch.tensor([ids], device=device), forced))
    if "integrated-gradients" in methods and jobs:
        longest = max(len(labels) for _, forced in jobs for _, labels in forced.values())
        check_passes(longest, steps)                            # before anything runs
    shares: dict[str, dict[str, list[float | None]]] = {m: {k: [] for k in KINDS} for m in [*methods, REFERENCE]}
    for src, forced in jobs:
        for kind, (tgt_in, labels) in forced.items():
            shares[REFERENCE][kind].append(seq_logprob(model, src, tgt_in, labels))
            for m in methods:
                shares[m][kind].append(sentence_share(row_shares(model, src, tgt_in, labels, m, steps)))
    result: dict[str, Any] = {"sentences": len(jobs), "skipped": len(contrasts) - len(jobs), "seed": seed,
                              "steps": steps if "integrated-gradients" in methods else None,
                              "rows": "every target row: the pieces and the EOS row", "methods": {}}
    for m in methods:
        result["methods"][m] = summarise(shares[m])
    result["reference"] = {REFERENCE: summarise(shares[REFERENCE])}
    return result


def summarise(shares: dict[str, list[float | None]]) -> dict[str, Any]:
    """Mean share per kind; per wrong kind the ROC AUC of right against it and how often right is above."""
    def known(values):
        return [v for v in values if v is not None]

    out: dict[str, Any] = {"mean": {k: (float(np.mean(known(v))) if known(v) else None) for k, v in shares.items()},
                           "auc": {}, "right_above": {}}
    for kind in WRONG:
        right, wrong = known(shares["right"]), known(shares[kind])
        out["auc"][kind] = roc_auc(right, wrong) if right and wrong else None
        paired = [(r, w) for r, w in zip(shares["right"], shares[kind], strict=True) if r is not None and w is not None]
        out["right_above"][kind] = sum(r > w for r, w in paired) / len(paired) if paired else None
    return out


# ---- text ----------------------------------------------------------------------------------------------

def _f(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.3f}"


def render(result: dict[str, Any]) -> str:
    lines = [f"hallucination signal on {result['split']}: {result['sentences']} sentences"
             f" ({result['skipped']} skipped: too long for the model), seed {result['seed']}",
             "sentence share = mean source share of every target row (the pieces and the EOS row)",
             "right: the reference; swapped: another pair's reference; half: the reference's first half, another's "
             "second half", "",
             f"{'method':<32} {'mean share: right':>17} {'swapped':>8} {'half':>7}   "
             f"{'ROC AUC vs swapped':>18} {'vs half':>8}"]
    for m, r in result["methods"].items():
        name = m + (f" ({result['steps']} steps)" if m == "integrated-gradients" else "")
        mean, auc = r["mean"], r["auc"]
        lines.append(f"{name:<32} {_f(mean['right']):>17} {_f(mean['swapped']):>8} {_f(mean['half']):>7}   "
                     f"{_f(auc['swapped']):>18} {_f(auc['half']):>8}")
    ref = result["reference"][REFERENCE]
    mean, auc = ref["mean"], ref["auc"]
    lines += ["", f"reference, not a share: {REFERENCE} = mean log p(y_t) of the target (Dale et al.'s Seq-Logprob)",
              f"{REFERENCE:<32} {mean['right']:>17.3f} {mean['swapped']:>8.3f} {mean['half']:>7.3f}   "
              f"{_f(auc['swapped']):>18} {_f(auc['half']):>8}"]
    return "\n".join(lines)


# ---- glassformer hallucination -------------------------------------------------------------------------

def add_hallucination_arguments(parser) -> None:
    from ..data.datasets import EVAL_SPLIT_HELP, EVAL_SPLITS
    from ..options import add_model_arguments, positive

    parser.add_argument("--split", choices=EVAL_SPLITS, default=DEFAULT_SPLIT,
                        help=f"{EVAL_SPLIT_HELP} (default {DEFAULT_SPLIT})")
    parser.add_argument("--sentences", type=positive, default=DEFAULT_SENTENCES, metavar="N",
                        help=f"the first N pairs of the split (default {DEFAULT_SENTENCES}; at most "
                             f"{limits.MAX_HALLUCINATION_SENTENCES})")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS), metavar="M,…",
                        help=f"comma-separated, of {', '.join(SHARE_METHODS)} (default {','.join(DEFAULT_METHODS)})")
    parser.add_argument("--steps", type=positive, default=DEFAULT_STEPS,
                        help=f"integrated-gradients steps, trapezoid (default {DEFAULT_STEPS}; at most "
                             f"{limits.MAX_IG_STEPS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the derangement that picks the wrong targets")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def hallucination_command(args) -> int:
    import json

    from ..data.datasets import load_split
    from ..decoding.translator import Translator
    from ..options import device_name, model_dir
    from ..threads import decoding_threads

    limits.check("--sentences", args.sentences, "MAX_HALLUCINATION_SENTENCES", "sentences")
    methods = check_methods(args.methods.split(","))
    check_steps(args.steps, "steps")
    folder = model_dir(args)
    torch.set_num_threads(decoding_threads(1))                  # one sentence at a time
    translator = Translator.load(folder, device_name(args.device))
    pairs = load_split(args.split)[: args.sentences]
    result = {"model": str(folder), "split": args.split,
              **measure(translator.model, translator.source, translator.target, pairs, methods, args.steps,
                        args.seed)}
    print(json.dumps(result, ensure_ascii=False) if args.json else render(result))
    return 0
