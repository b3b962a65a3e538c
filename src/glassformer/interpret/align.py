"""Word alignments from the model: each target word linked to one source unit, and their AER against gold links.

`glassformer align SENTENCE --target TEXT [--method M] [--layer L --head H] [--shift] [--json]` and
`glassformer align --gold [FILE] [--methods M ...] [--heads] [--json]`.

The target is teacher-forced: tgt_in = BOS y_1 … y_n, and row r of the decoder (newest input tgt_in[r])
predicts labels[r] (y_1 … y_n, EOS). A method gives one score per (row, source unit), a matrix (T, S):

- attention: cross-attention weights, the mean over decoder layers and heads (attribution.py), or with
  --layer/--head that one head's weights, read with `model.probes`;
- alti: ALTI+ contributions of the source units (non-negative; with the prefix's, each row sums to 1);
- a gradient method (saliency, input-x-gradient, integrated-gradients): the absolute scores |a_rs| —
  a large negative share is as much "this row reads that unit" as a large positive one.
  Integrated gradients run at a fixed number of steps (32 by default; --steps): alignment needs the
  ranking of the units, not completeness to 1 %.

Every score is taken as its absolute value (a no-op for attention and alti, which are non-negative).

Row convention (which rows stand for target word y_t):

- predict (default): the rows that *predict* y_t's pieces, whose newest input is the piece before;
- shift (--shift): the rows whose newest input *is* y_t's pieces, one row later ("shift-att",
  Chen et al. 2020, found this aligns better for attention: the decoder reads the source for a word once
  the word is its input). `--gold` measures both.

A target word of several sub-word pieces (why.word_groups) gets the *mean* of its pieces' rows: the argmax is
the same as with the sum, and the mean keeps attention and alti rows on the scale of one row (a
probability distribution for attention). Specials (BOS, EOS, PAD) get no links.

Extraction (Garg et al. 2019; Ferrando et al. 2022): each target word j is linked to its highest-scoring
source unit, argmax_i score[j, i] (the first on a tie): exactly one link per target word.

With --gold every pair's unit ↔ word links are projected onto the gold tokens (gold.project_units,
gold.project_links) and scored (gold.score: corpus-level AER, precision, recall); --heads adds every
cross-attention head, all heads read from one recording forward per pair. Source units the model does not
know are read as <unk> (their position still gets scores) and counted.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from .. import limits
from ..errors import UsageError
from .attribution import METHODS, attribute, check_steps, special_ids
from .gold import load_gold, project_links, project_units, score
from .integrated import DEFAULT_RULE
from .why import _piece, _word, target_ids, word_groups

ROWS = ("predict", "shift")     # row conventions: the row that predicts y_t / the row whose newest input is y_t
DEFAULT_METHOD = "attention"
DEFAULT_STEPS = 32              # integrated-gradients steps (fixed: a ranking of units needs no 1 % completeness)
CROSS = "decoder.{layer}.cross_attention.head.{head}.weights"
_CROSS = re.compile(r"decoder\.([0-9]+)\.cross_attention\.head\.([0-9]+)\.weights")


@dataclass
class Encoded:
    """One teacher-forced pair: source units and ids, target rows, and the target words (specials left out)."""

    units: list[str]            # source units, one per source position
    unknown: list[str]          # units the model's vocabulary lacks (read as <unk>)
    src: Tensor                 # (1, S) source ids
    tgt_in: Tensor              # (1, T) BOS y_1 … y_n
    labels: list[int]           # (T,) y_1 … y_n EOS: what row r predicts
    words: list[str]            # target words, in order
    groups: list[list[int]]     # the label positions (pieces) of each word


def check_model(model) -> None:
    if model.cfg.family != "encoder-decoder":
        raise UsageError(f"model: align needs an encoder-decoder model (cross-attention), not {model.cfg.family}",
                         "model")


def encode_pair(model, source, target, sentence: Any, target_text: Any) -> Encoded:
    """Encode one pair for alignment; an empty or over-long side is a UsageError naming it and its limit."""
    check_model(model)
    if not isinstance(sentence, str) or not sentence.strip():
        raise UsageError("sentence: expected a non-empty Chinese sentence", "sentence")
    limits.check("sentence: characters", len(sentence), "MAX_SOURCE_CHARS", "sentence")
    if not isinstance(target_text, str) or not target_text.strip():
        raise UsageError("target: expected a non-empty English sentence", "target")
    limits.check("target: characters", len(target_text), "MAX_TARGET_CHARS", "target")
    max_len = model.cfg.max_len
    enc = source.analyse(sentence)
    if not enc.ids:
        raise UsageError("sentence: no units after splitting", "sentence")
    limits.check("sentence: units", len(enc.ids), "MAX_SENTENCE_TOKENS", "sentence")
    if len(enc.ids) > max_len:
        raise UsageError(f"sentence: {len(enc.ids)} units; the model takes at most {max_len}", "sentence")
    sp = special_ids(model)
    ids = target_ids(target, sp, target_text)
    if not ids:
        raise UsageError("target: no tokens after splitting", "target")
    limits.check("target: tokens", len(ids), "MAX_SENTENCE_TOKENS", "target")
    if len(ids) + 1 > max_len:
        raise UsageError(f"target: {len(ids)} tokens; the model takes at most {max_len - 1}", "target")
    labels = [*ids, sp.eos]
    pieces = [_piece(target, sp, t) for t in labels]
    specials = {sp.bos, sp.eos, sp.pad}
    groups = [g for g in word_groups(pieces) if not any(labels[k] in specials for k in g)]
    words = [_word(target, [pieces[k] for k in g], [labels[k] for k in g]) for g in groups]
    device = next(model.parameters()).device
    return Encoded(enc.units, list(enc.unknown), torch.tensor([enc.ids], device=device),
                   torch.tensor([[sp.bos, *ids]], device=device), labels, words, groups)


def check_head(model, layer: int | None, head: int | None) -> None:
    """--layer and --head come together and name a decoder cross-attention head (0-based)."""
    if (layer is None) != (head is None):
        raise UsageError("--layer/--head: give both (one cross-attention head) or neither (the mean of all)",
                         "layer" if layer is None else "head")
    if layer is None:
        return
    if not 0 <= layer < model.cfg.decoder_layers:
        raise UsageError(f"--layer: {layer} is outside the decoder layers 0..{model.cfg.decoder_layers - 1}", "layer")
    if not 0 <= head < model.cfg.heads:
        raise UsageError(f"--head: {head} is outside the heads 0..{model.cfg.heads - 1}", "head")


@torch.no_grad()
def cross_attention(model, enc: Encoded) -> Tensor:
    """Every decoder cross-attention head's weights from one recording forward: (layers, heads, T, S)."""
    model.eval()
    with model.probes(CROSS.format(layer="*", head="*")) as rec:
        model(enc.src, enc.tgt_in)
    at = {tuple(int(x) for x in _CROSS.fullmatch(name).groups()): rec[name][0] for name in rec}   # (T, S) each
    layers, heads = 1 + max(k[0] for k in at), 1 + max(k[1] for k in at)
    return torch.stack([torch.stack([at[(i, h)] for h in range(heads)]) for i in range(layers)]).double().cpu()


def row_scores(model, enc: Encoded, method: str, layer: int | None = None, head: int | None = None,
               steps: int = DEFAULT_STEPS) -> Tensor:
    """The method's score of every target row for every source unit, as absolute values: (T, S), float64."""
    if method not in METHODS:
        raise UsageError(f"method: expected one of {', '.join(METHODS)}, got {method!r}", "method")
    if layer is not None:
        if method != "attention":
            raise UsageError(f"--layer/--head: only with --method attention (one head's weights), not {method}",
                             "layer")
        check_head(model, layer, head)
        model.eval()
        name = CROSS.format(layer=layer, head=head)
        with torch.no_grad(), model.probes(name) as rec:
            model(enc.src, enc.tgt_in)
        return rec[name][0].double().cpu()                                  # (T, S)
    rows = list(range(len(enc.labels)))
    a = attribute(model, enc.src, enc.tgt_in, rows, enc.labels, method, steps=steps)
    return a.source.double().abs()                                          # (T, S)


def word_scores(rows: Tensor, groups: list[list[int]], shift: bool = False) -> Tensor:
    """(T, S) row scores -> (words, S): each word the mean of its pieces' rows (shift: the rows one later)."""
    offset = 1 if shift else 0
    return torch.stack([rows[[k + offset for k in g]].mean(0) for g in groups])   # (W, S)


def extract(scores: Tensor) -> list[tuple[int, int]]:
    """Argmax extraction: (source unit, target word) links, one per target word (row of `scores`, (W, S))."""
    return [(int(scores[j].argmax()), j) for j in range(scores.size(0))]


def align(model, source, target, sentence: str, target_text: str, method: str = DEFAULT_METHOD,
          layer: int | None = None, head: int | None = None, shift: bool = False,
          steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """One pair's alignment: {method, layer, head, rows, source, target, links [[i, j]], scores (W, S), unknown}."""
    if method not in METHODS:
        raise UsageError(f"method: expected one of {', '.join(METHODS)}, got {method!r}", "method")
    check_model(model)
    check_head(model, layer, head)
    enc = encode_pair(model, source, target, sentence, target_text)
    w = word_scores(row_scores(model, enc, method, layer, head, steps), enc.groups, shift)
    return {"method": method, "layer": layer, "head": head, "rows": ROWS[shift], "source": enc.units,
            "target": enc.words, "links": [list(link) for link in extract(w)], "scores": w.tolist(),
            "unknown": enc.unknown}


def evaluate_gold(model, source, target, pairs, methods=METHODS, heads: bool = False,
                  steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """AER / precision / recall of every method (and with `heads` every cross-attention head) on gold pairs,
    under both row conventions. Returns {pairs, unknown_units, steps, rule, methods: [...], heads: [...] | None}."""
    check_model(model)
    methods = list(dict.fromkeys(methods))
    for m in methods:
        if m not in METHODS:
            raise UsageError(f"methods: expected some of {', '.join(METHODS)}, got {m!r}", "methods")
    limits.check("gold: pairs", len(pairs), "MAX_ALIGN_PAIRS", "gold")
    if "integrated-gradients" in methods:
        check_steps(steps)
    by_method: dict[tuple[str, str], list[set]] = {(m, r): [] for m in methods for r in ROWS}
    by_head: dict[tuple[int, int, str], list[set]] = {}
    unknown = 0
    for pair in pairs:
        try:
            enc = encode_pair(model, source, target, pair.zh, pair.en)
            unknown += len(enc.unknown)
            src_map = project_units(pair.zh, enc.units, pair.src)           # source unit -> gold tokens
            tgt_map = project_units(pair.en, enc.words, pair.tgt)           # target word -> gold tokens
            for m in methods:
                rows = row_scores(model, enc, m, steps=steps)               # (T, S)
                for r in ROWS:
                    links = extract(word_scores(rows, enc.groups, r == "shift"))
                    by_method[(m, r)].append(project_links(links, src_map, tgt_map))
            if heads:
                weights = cross_attention(model, enc)                       # (layers, heads, T, S)
                for i in range(weights.size(0)):
                    for h in range(weights.size(1)):
                        for r in ROWS:
                            links = extract(word_scores(weights[i, h], enc.groups, r == "shift"))
                            by_head.setdefault((i, h, r), []).append(project_links(links, src_map, tgt_map))
        except UsageError as error:
            raise UsageError(f"gold pair {pair.id}: {error}", "gold") from None
    return {"pairs": len(pairs), "unknown_units": unknown, "steps": steps, "rule": DEFAULT_RULE,
            "methods": [{"method": m, "rows": r, **asdict(score(p, pairs))} for (m, r), p in by_method.items()],
            "heads": None if not heads else [{"layer": i, "head": h, "rows": r, **asdict(score(p, pairs))}
                                             for (i, h, r), p in sorted(by_head.items())]}


# ---- text --------------------------------------------------------------------------------------

def render_links(result: dict[str, Any]) -> str:
    """One line per link, in target order: 昨天 ↔ yesterday."""
    return "\n".join(f"{result['source'][i]} ↔ {result['target'][j]}" for i, j in result["links"])


def _row(label: str, s: dict[str, Any]) -> str:
    return (f"{label:<26} {s['rows']:<8} {s['aer']:>6.3f} {s['precision']:>9.3f} {s['recall']:>7.3f} "
            f"{s['predicted']:>6}")


def render_gold(result: dict[str, Any], best: int = 5) -> str:
    """The method table, and with heads the per-head table and the best heads by AER."""
    header = f"{'':<26} {'rows':<8} {'AER':>6} {'precision':>9} {'recall':>7} {'links':>6}"
    lines = [f"gold: {result['pairs']} pairs from {result['gold']}; integrated-gradients at {result['steps']} steps "
             f"({result['rule']} rule); rows: predict = the row predicting the word, shift = the row whose newest "
             f"input is the word",
             "", f"{'method':<26}" + header[26:]]
    lines += [_row(s["method"], s) for s in result["methods"]]
    if result["unknown_units"]:
        lines.append(f"({result['unknown_units']} source units not in the model's vocabulary, read as <unk>)")
    if result["heads"] is not None:
        lines += ["", f"{'cross-attention head':<26}" + header[26:]]
        lines += [_row(f"layer {s['layer']} head {s['head']}", s) for s in result["heads"]]
        ranked = sorted(result["heads"], key=lambda s: (s["aer"], s["layer"], s["head"], s["rows"]))[:best]
        lines += ["", "best heads (lowest AER): " + "; ".join(
            f"layer {s['layer']} head {s['head']} {s['rows']} {s['aer']:.3f}" for s in ranked)]
    return "\n".join(lines)


# ---- glassformer align -------------------------------------------------------------------------

def add_align_arguments(parser) -> None:
    from ..options import add_model_arguments, non_negative, positive, utf8_text

    parser.add_argument("sentence", nargs="?", type=utf8_text, help="Chinese sentence (not with --gold)")
    parser.add_argument("--target", type=utf8_text, help="the English sentence to align to it (teacher-forced)")
    parser.add_argument("--method", choices=METHODS, help=f"score method (default {DEFAULT_METHOD})")
    parser.add_argument("--layer", type=non_negative, help="with --head and --method attention: one decoder layer "
                                                           "(0-based)")
    parser.add_argument("--head", type=non_negative, help="with --layer: one cross-attention head (0-based)")
    parser.add_argument("--shift", action="store_true",
                        help="use the rows whose newest input is the word (shift-att), not the rows predicting it")
    parser.add_argument("--steps", type=positive,
                        help=f"integrated-gradients steps (default {DEFAULT_STEPS}, at most {limits.MAX_IG_STEPS})")
    parser.add_argument("--gold", nargs="?", const="", metavar="FILE",
                        help="score against gold links: the packaged set, or FILE (see docs/alignment.md)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, metavar="METHOD",
                        help=f"with --gold: the methods to score (default all: {', '.join(METHODS)})")
    parser.add_argument("--heads", action="store_true", help="with --gold: also score every cross-attention head")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def _check_options(args) -> None:
    """Options that do not belong together: one line naming the first."""
    if args.gold is not None:
        for flag, given in (("SENTENCE", args.sentence is not None), ("--target", args.target is not None),
                            ("--method", args.method is not None), ("--layer", args.layer is not None),
                            ("--head", args.head is not None), ("--shift", args.shift)):
            if given:
                raise UsageError(f"{flag}: not with --gold (it scores every gold pair, both row conventions; "
                                 "choose methods with --methods)", flag.lstrip("-").lower())
        if args.steps is not None and args.methods and "integrated-gradients" not in args.methods:
            raise UsageError("--steps: only with integrated-gradients among --methods", "steps")
        return
    for flag, given in (("--methods", args.methods is not None), ("--heads", args.heads)):
        if given:
            raise UsageError(f"{flag}: only with --gold", flag.lstrip("-"))
    if args.sentence is None:
        raise UsageError("sentence: expected a Chinese sentence (or --gold)", "sentence")
    if args.target is None:
        raise UsageError("--target: required (the English sentence to align, teacher-forced)", "target")
    method = args.method or DEFAULT_METHOD
    if (args.layer is not None or args.head is not None) and method != "attention":
        raise UsageError(f"--layer/--head: only with --method attention (one head's weights), not {method}", "layer")
    if args.steps is not None and method != "integrated-gradients":
        raise UsageError(f"--steps: only with --method integrated-gradients, not {method}", "steps")


def align_command(args) -> int:
    import json
    import sys

    from ..decoding.translator import Translator
    from ..options import device_name, model_dir
    from ..threads import decoding_threads

    _check_options(args)
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    check_steps(steps, "--steps")
    pairs = None
    if args.gold is not None:
        pairs = load_gold(args.gold or None)                                # the gold file before the model
        limits.check("gold: pairs", len(pairs), "MAX_ALIGN_PAIRS", "gold")
    else:
        torch.set_num_threads(decoding_threads(1))
    t = Translator.load(model_dir(args), device_name(args.device))
    if pairs is not None:
        result = evaluate_gold(t.model, t.source, t.target, pairs, args.methods or METHODS, args.heads, steps)
        result = {"gold": args.gold or "packaged (glassformer/data/alignment_gold.jsonl)", **result}
        print(json.dumps(result, ensure_ascii=False) if args.json else render_gold(result))
        return 0
    result = align(t.model, t.source, t.target, args.sentence, args.target, args.method or DEFAULT_METHOD,
                   args.layer, args.head, args.shift, steps)
    print(json.dumps(result, ensure_ascii=False) if args.json else render_links(result))
    if result["unknown"]:
        print(f"note: {len(result['unknown'])} source units not in the model's vocabulary, read as <unk>: "
              + " ".join(result["unknown"]), file=sys.stderr)
    return 0
