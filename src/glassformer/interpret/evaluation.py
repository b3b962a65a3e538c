"""`glassformer evaluate --source-share`: the scores as usual, then how much of every output word the source explains.

decoding may not import interpret (tests/test_layout.py), so the command lives here and wraps decoding's:
without --source-share it is `decoding.commands.evaluate_command` itself. With it, that same evaluation runs
first (its JSON, hypotheses included, is read back from its output, so the scores are exactly the usual ones);
then every hypothesis is re-encoded by the target tokenizer and teacher-forced behind its source (the same
source ids the decoding used: raw segmentation or the gold units, cut at max_len), and each output word gets
its source share under --share-method (alti by default): the word's pieces merged as `glassformer attribute`
merges them (why.py: alti the mean of the pieces' rows, a gradient method their sum), the EOS row a word of
its own. Integrated gradients run at DEFAULT_STEPS (32) fixed steps, trapezoid.

Reported: the distribution over every word row of the split (mean, quartiles, the share of rows below 0.5:
rows that take more from the target prefix than from the source) and over the per-sentence means; the
sentences with the lowest means are the first to read when looking for hallucinations (Dale et al. 2023).
Attribution runs on the float32 weights whatever --dtype decoded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections.abc import Sequence
from typing import Any

from ..decoding import commands
from ..errors import UsageError
from .methods import SHARE_METHODS, SHARE_STEPS

DEFAULT_STEPS = SHARE_STEPS     # (no torch at import: the command's helpers fork before it loads)

DEFAULT_SHARE_METHOD = "alti"
LOW = 0.5                       # a row below this takes more from the target prefix than from the source
LOWEST = 3                      # sentences with the lowest mean share printed (--json: all in order)


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    commands.add_evaluate_arguments(parser)
    parser.add_argument("--source-share", action="store_true",
                        help="also the source share of every output word: its distribution over the split")
    parser.add_argument("--share-method", choices=SHARE_METHODS, default=None,
                        help=f"with --source-share: the attribution method (default {DEFAULT_SHARE_METHOD}; "
                             f"integrated gradients at {DEFAULT_STEPS} steps)")


def evaluate_command(args) -> int:
    if not getattr(args, "source_share", False):
        if getattr(args, "share_method", None) is not None:
            raise UsageError("--share-method: only with --source-share", "share_method")
        return commands.evaluate_command(args)
    method = args.share_method or DEFAULT_SHARE_METHOD
    inner = argparse.Namespace(**{**vars(args), "json": True, "hypotheses": True, "show": 0})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = commands.evaluate_command(inner)
    if code:
        return code
    scores = json.loads(printed.getvalue())
    hypotheses = scores.pop("hypotheses")
    import torch

    from ..threads import decoding_threads

    torch.set_num_threads(decoding_threads(1))                              # the shares: one sentence at a time
    share = split_shares(args, hypotheses, method)
    if args.json:
        out = {**scores, **({"hypotheses": hypotheses} if args.hypotheses else {}), "source_share": share}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(f"{args.split} ({scores['sentences']} sentences, input {args.input}, beam {args.beam}): "
              f"BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}")
        print(f"  {scores['bleu_signature']}")
        print(f"  {scores['chrf_signature']}")
        print(render(share))
    from ..data.datasets import load_split

    for pair, hyp in list(zip(load_split(args.split), hypotheses, strict=True))[: max(args.show, 0)]:
        print(f"  {pair.zh}\n    ref: {pair.en}\n    out: {hyp}")
    return 0


# ---- the shares ----------------------------------------------------------------------------------------

def source_ids(translator, pair, input: str) -> list[int]:
    """The ids decoding gave the model for `pair` (decoding/translator.py: raw analysis or gold units, cut)."""
    limit = translator.model.cfg.max_len
    if input == "gold":
        return translator.source.vocab.encode(list(pair.zh_units))[:limit]
    return translator.source.analyse(pair.zh).ids[:limit]


def word_shares(model, target, src: list[int], hypothesis: str, method: str,
                steps: int = DEFAULT_STEPS) -> list[float | None]:
    """The source share of every word of `hypothesis` teacher-forced behind `src` (EOS a word of its own)."""
    import torch

    from .attribution import attribute, source_share
    from .why import word_groups

    cfg = model.cfg
    device = next(model.parameters()).device
    ids = target.encode(hypothesis)
    inputs = [cfg.bos_id, *ids][: cfg.max_len]
    labels = [*ids, cfg.eos_id][: len(inputs)]
    tgt_in = torch.tensor([inputs], device=device)                          # (1, tgt)
    a = attribute(model, torch.tensor([src], device=device), tgt_in, list(range(len(labels))), labels, method,
                  steps=steps)
    pieces = ["</s>" if t == cfg.eos_id else (target.id_to_token(t) or "?") for t in labels]
    merge = torch.mean if method == "alti" else torch.sum                   # as why.py: alti rows still sum to 1
    return [source_share(merge(a.source[g], 0), merge(a.prefix[g], 0), method) for g in word_groups(pieces)]


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """count, mean, quartiles (numpy's linear rule) and the share below LOW; None entries when empty."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"count": 0, "mean": None, "q1": None, "median": None, "q3": None, "below_half": None}
    q1, median, q3 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return {"count": int(v.size), "mean": float(v.mean()), "q1": q1, "median": median, "q3": q3,
            "below_half": float((v < LOW).mean())}


def split_shares(args, hypotheses: list[str], method: str) -> dict[str, Any]:
    """Word-row and per-sentence source shares of the hypotheses of args.split (JSON-able)."""
    from ..data.datasets import load_split
    from ..decoding.translator import Translator
    from ..options import device_name, model_dir

    translator = Translator.load(model_dir(args), device_name(args.device))
    model = translator.model
    model.eval()
    rows: list[float] = []
    per_sentence: list[float | None] = []
    pairs = load_split(args.split)
    for pair, hyp in zip(pairs, hypotheses, strict=True):
        src = source_ids(translator, pair, args.input)
        if not src:                                                          # an empty source: no output
            per_sentence.append(None)
            continue
        shares = [s for s in word_shares(model, translator.target, src, hyp, method) if s is not None]
        rows += shares
        per_sentence.append(sum(shares) / len(shares) if shares else None)
    known = [(k, s) for k, s in enumerate(per_sentence) if s is not None]
    lowest = sorted(known, key=lambda item: item[1])[:LOWEST]
    return {"method": method, "steps": DEFAULT_STEPS if method == "integrated-gradients" else None,
            "rows": "every output word, its pieces merged, and the EOS row",
            "words": distribution(rows), "sentences": distribution([s for _, s in known]),
            "per_sentence": per_sentence,
            "lowest": [{"index": k, "share": s, "source": pairs[k].zh, "reference": pairs[k].en,
                        "hypothesis": hypotheses[k]} for k, s in lowest]}


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render(share: dict[str, Any]) -> str:
    how = share["method"] + (f", {share['steps']} steps" if share["steps"] else "")
    lines = [f"source share ({how}; every output word and the EOS row, teacher-forced):"]
    for name, d in (("word rows", share["words"]), ("sentence means", share["sentences"])):
        lines.append(f"  {name:<15} n {d['count']:>5}  mean {_f(d['mean'])}  quartiles {_f(d['q1'])} / "
                     f"{_f(d['median'])} / {_f(d['q3'])}  below {LOW}: "
                     + ("n/a" if d["below_half"] is None else f"{100 * d['below_half']:.1f} %"))
    for item in share["lowest"]:
        lines.append(f"  lowest: sentence {item['index']} share {item['share']:.3f}: {item['source']} → "
                     f"{item['hypothesis']} (ref: {item['reference']})")
    return "\n".join(lines)
