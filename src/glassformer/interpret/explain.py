"""The lesson's walk in numbers for one sentence: source units, right-shifted target inputs, and for
each target row what it may see, its top next tokens, and which source unit each cross-attention
head reads most. The row whose newest visible input is `gave` shows the probability of `him`.

Teacher-forced with a given target; otherwise the model's own greedy output is fed back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import limits
from ..decoding.search import Greedy, generate
from ..decoding.translator import Translator
from ..errors import UsageError
from ..model.hooks import Recording
from ..model.readout import NextToken, next_token_walk, walk_inputs
from ..options import add_model_arguments, device_name, model_dir, positive, utf8_text

FOCUS_INPUT, FOCUS_NEXT = "gave", "him"   # the lesson's row: input `gave` predicts `him`


@dataclass
class SentenceWalk:
    """One sentence read row by row: the target read back, its right-shifted inputs, what was recorded."""

    output: list[int]        # target ids read back (given, or the model's greedy output), no BOS/EOS
    finished: bool           # False: a greedy output cut at the length limit (its last row predicts no EOS)
    inputs: list[int]        # right-shifted target inputs, BOS first (tgt,)
    logits: Tensor           # (tgt, vocab) next-token logits of each row
    trace: Recording         # the probes asked for, recorded on the teacher-forced pass
    rows: list[NextToken]    # per row: the token it should predict, its probability and rank, the top k


@torch.no_grad()
def walk_sentence(model, source_ids: Sequence[int], target_ids: Sequence[int] | None = None,
                  probes: Sequence[str] = (), top: int = 5) -> SentenceWalk:
    """Teacher-forced pass over BOS + target (the model's own greedy output when no target is given),
    recording `probes`; shared by `glassformer explain` and the lab's Sentence view."""
    cfg = model.cfg
    src = torch.tensor([list(source_ids)], dtype=torch.long, device=next(model.parameters()).device)
    if target_ids is None:
        hyp = generate(model, src, Greedy())[0][0]                           # as `glassformer translate`
        output, finished = hyp.tokens, hyp.finished
    else:
        output, finished = list(target_ids), True
    inputs = walk_inputs(output, cfg.bos_id, cfg.max_len, finished=finished)
    if len(inputs) > cfg.max_len:
        raise UsageError(f"target: {len(inputs)} target positions, over the model's limit of {cfg.max_len}",
                         "target")
    tgt_in = torch.tensor([inputs], dtype=torch.long, device=src.device)   # (1, tgt)
    model.eval()
    with model.probes(*probes) if probes else contextlib.nullcontext(Recording()) as trace:  # nothing: no probe
        logits = model(src, tgt_in)[0]                                       # (tgt, vocab)
    rows = next_token_walk(logits, inputs, cfg.eos_id, finished=finished, top=min(top, cfg.tgt_vocab))
    return SentenceWalk(output, finished, inputs, logits, trace, rows)


def _ends_word(names: list[str], t: int, word: str) -> bool:
    """True if the visible inputs up to row t end with the whole word `word` (sub-words joined)."""
    text = "".join(names[1: t + 1]).replace("▁", " ")
    following = names[t + 1] if t + 1 < len(names) else "▁"               # the word must be complete
    return text.split()[-1:] == [word] and not text.endswith(" ") and following.startswith("▁")


def explain(translator: Translator, sentence: str, target: str | None = None, all_layers: bool = False,
            top: int = 5) -> dict[str, Any]:
    """The walk as a JSON-able dict (see module docstring); probes decoder.*.cross_attention."""
    model, tgt_tok = translator.model, translator.target
    enc = translator.source.analyse(sentence)
    if not enc.ids:
        raise UsageError("the sentence is empty")
    translator.check_lengths([enc])
    layers = range(model.cfg.decoder_layers) if all_layers else [model.cfg.decoder_layers - 1]
    walk = walk_sentence(model, enc.ids, None if target is None else tgt_tok.encode(target),
                         [f"decoder.{i}.cross_attention.head.*.weights" for i in layers], top)
    eos = model.cfg.eos_id
    names = [tgt_tok.id_to_token(i) or "?" for i in walk.inputs]
    names[0] = "<s>"
    focus_piece = tgt_tok.tokens(FOCUS_NEXT)[0]                            # first sub-word of `him`
    focus_id = tgt_tok.token_to_id(focus_piece)
    rows = []
    focus = None
    for r in walk.rows:
        t = r.row
        heads = []
        for layer in layers:
            for h in range(model.cfg.heads):
                w = walk.trace[f"decoder.{layer}.cross_attention.head.{h}.weights"][0, t]  # (src,)
                j = int(w.argmax())
                heads.append({"layer": layer, "head": h, "unit": enc.units[j], "position": j,
                              "weight": round(float(w[j]), 4)})
        rows.append({"row": t, "sees": names[: t + 1], "next": _piece(tgt_tok, r.next_id, eos),
                     "p_next": round(r.p_next, 4), "rank": r.rank,
                     "top": [{"token": _piece(tgt_tok, i, eos), "p": round(q, 4)} for i, q in r.top],
                     "cross_attention": heads})
        if focus is None and focus_id is not None and _ends_word(names, t, FOCUS_INPUT):
            probs = torch.softmax(walk.logits[t].double(), dim=-1)          # (vocab,)
            focus = {"row": t, "input": names[t], "token": focus_piece, "p": round(float(probs[focus_id]), 4)}
    return {"sentence": sentence, "units": enc.units, "unknown": enc.unknown,
            "mode": "free-running (greedy)" if target is None else "teacher-forced",
            "translation": tgt_tok.decode(walk.output), "finished": walk.finished, "inputs": names, "rows": rows,
            "focus": focus}


def _piece(tgt_tok, token_id: int, eos: int) -> str:
    return "</s>" if token_id == eos else tgt_tok.id_to_token(token_id) or "?"


def render(walk: dict[str, Any]) -> str:
    """The walk as plain text, one block per target row."""
    lines = [f"source units ({len(walk['units'])}): {' ／ '.join(walk['units'])}"]
    if walk["unknown"]:
        lines.append(f"unknown units (read as <unk>): {' '.join(walk['unknown'])}")
    lines.append(f"target ({walk['mode']}): {walk['translation']}"
                 + ("" if walk.get("finished", True) else "  [cut at the length limit: no EOS]"))
    lines.append(f"right-shifted inputs: {' '.join(walk['inputs'])}")
    for row in walk["rows"]:
        lines.append("")
        lines.append(f"row {row['row']}: sees {' '.join(row['sees'])}")
        lines.append(f"  next {row['next']}  p={row['p_next']:.3f}    top: "
                     + "  ".join(f"{c['token']} {c['p']:.3f}" for c in row["top"]))
        lines.append("  cross-attention reads most: " + "  ".join(
            f"L{h['layer']}h{h['head']} {h['unit']} {h['weight']:.2f}" for h in row["cross_attention"]))
    focus = walk.get("focus")
    lines.append("")
    if focus:
        lines.append(f"the lesson's row: row {focus['row']} (newest input {focus['input']}) gives "
                     f"p({focus['token']}) = {focus['p']:.3f}; it sees only the inputs up to {focus['input']}")
    else:
        lines.append(f"no row has the input '{FOCUS_INPUT}' (pass --target to teacher-force one)")
    return "\n".join(lines)


# ---- the `explain` command -------------------------------------------------------------------------------
def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentence", type=utf8_text, help="one Chinese sentence")
    parser.add_argument("--target", type=utf8_text,
                        help="English to teacher-force (default: the model's own greedy output)")
    add_model_arguments(parser)
    parser.add_argument("--all-layers", action="store_true", help="cross-attention of every decoder layer")
    parser.add_argument("--top", type=positive, default=5, help="next-token candidates per row (default 5)")
    parser.add_argument("--json", action="store_true", help="print the walk as JSON")


def explain_command(args) -> int:
    from ..data.checkpoint import origin_summary

    limits.check("--top", args.top, "MAX_TOP_K")
    translator = Translator.load(model_dir(args), device_name(args.device))
    units = len(translator.source.analyse(args.sentence).ids)
    if units > translator.max_source_len:                   # explain walks the whole sentence: no cutting
        raise UsageError(f"sentence: {units} units, over the model's limit of {translator.max_source_len} "
                         "source units (shorten it)")
    walk = explain(translator, args.sentence, target=args.target, all_layers=args.all_layers, top=args.top)
    walk["model"] = origin_summary(model_dir(args))
    print(json.dumps(walk, ensure_ascii=False, indent=1) if args.json else f"model: {walk['model']}\n{render(walk)}")
    return 0
