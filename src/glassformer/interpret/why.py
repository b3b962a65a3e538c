"""Why *him*, for one sentence: attribution rows by target word and the logit lens, as JSON and as text.

`glassformer attribute SENTENCE [--target TEXT] [--method M] [--contrast WORD] [--steps N|auto] [--tolerance T]
[--rule R] [--lens [--row R]]`.
The target rows are teacher-forced with --target, else the model's greedy output is fed back. Sub-word
pieces of one target word are merged into the word by summing: a word's row is the sum of its pieces'
rows (log p(word) = Σ log p(piece)), a prefix column the sum of its pieces' columns (alti: a word's row is the
mean of its pieces' rows, so it still sums to 1). Every row carries its `source_share` (attribution.source_share:
alti Σ source, gradient methods Σ|source| / (Σ|source| + Σ|prefix|), attention null). With a contrast
word c the first piece of each word competes with c: f = log p(word) − log p(c at the word's first row).
Integrated gradients: each word row carries its completeness error (its pieces' sums against their deltas),
its steps and passes; `--steps auto` (the default) doubles the steps until every word is within the tolerance,
and the words that are not are named on stderr.
"""

from __future__ import annotations

import string
from typing import Any

import torch

from .. import limits
from ..data.tokenize import UNK
from ..decoding.search import Greedy, generate
from ..errors import UsageError
from .attribution import (
    AUTO,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    METHODS,
    attribute,
    baseline_name,
    check_passes,
    check_steps,
    source_share,
    special_ids,
)
from .integrated import DEFAULT_RULE, DEFAULT_TOLERANCE, RULES, check_rule, check_tolerance, grouped_errors
from .lens import logit_lens
from .patching import DEFAULT_CLEAN, _source

LENS_INPUT = "gave"             # the lesson's row: its newest input is `gave`, it predicts `him`


# ---- target words ------------------------------------------------------------------------------

def _punct(piece: str) -> bool:
    text = piece.replace("▁", "")
    return bool(text) and all(c in string.punctuation or not c.isalnum() for c in text)


def word_groups(pieces: list[str]) -> list[list[int]]:
    """Indices of `pieces` grouped into words: a word starts at a ▁ piece, a special, or punctuation; a bare ▁ (the
    space SentencePiece cuts off before punctuation: '▁', '.') belongs to the piece after it."""
    groups: list[list[int]] = []
    for k, piece in enumerate(pieces):
        special = piece.startswith("<") and piece.endswith(">")
        starts = (not groups or piece.startswith("▁") or special or _punct(piece)
                  or _punct(pieces[k - 1]) or pieces[k - 1].startswith("<"))
        starts = starts and not (k > 0 and pieces[k - 1] == "▁" and not special)
        if starts:
            groups.append([k])
        else:
            groups[-1].append(k)
    return groups


def contrast_id(target, word: str | None) -> int | None:
    """The target id of a contrast word; one that is not a single token of the vocabulary is a UsageError."""
    if word is None:
        return None
    if not isinstance(word, str) or not word.strip() or len(word.strip().split()) != 1:
        raise UsageError("contrast: expected one English word", "contrast")
    pieces = target.tokens(word.strip())
    ids = [target.token_to_id(p) for p in pieces]
    if len(ids) != 1 or ids[0] is None or ids[0] == UNK:
        shown = " ".join(pieces) or "nothing"
        raise UsageError(f"contrast: {word.strip()!r} is not one token of the target vocabulary (it is {shown})",
                         "contrast")
    return ids[0]


# ---- one sentence ------------------------------------------------------------------------------

def sentence_rows(model, source, target, sentence: str, target_text: str | None) -> dict[str, Any]:
    """Source units/ids, the right-shifted target inputs and the label each row predicts."""
    sp = special_ids(model)
    units, ids = _source(source, sentence, "sentence")
    limit = model.cfg.max_len
    limits.check("sentence: units", len(ids), "MAX_SENTENCE_TOKENS", "sentence")
    if len(ids) > limit:
        raise UsageError(f"sentence: {len(ids)} units; the model takes at most {limit}", "sentence")
    device = next(model.parameters()).device
    src = torch.tensor([ids], device=device)                                # (1, src)
    if target_text is None:
        hyp = generate(model, src, Greedy())[0][0]                           # as `glassformer translate`
        out, finished = hyp.tokens, hyp.finished
        mode = "greedy"
    else:
        if not isinstance(target_text, str) or not target_text.strip():
            raise UsageError("target: expected a non-empty English sentence", "target")
        limits.check("target: characters", len(target_text), "MAX_TARGET_CHARS", "target")
        out, finished, mode = target_ids(target, sp, target_text), True, "teacher-forced"
        limits.check("target: tokens", len(out), "MAX_SENTENCE_TOKENS", "target")
    if finished and len(out) + 1 > limit:
        raise UsageError(f"target: {len(out)} tokens; the model takes at most {limit - 1}", "target")
    inputs = [sp.bos, *out][:limit]
    labels = [*out, sp.eos] if finished else out[: len(inputs)]
    return {"units": units, "src": src, "tgt_in": torch.tensor([inputs], device=device), "labels": labels, "mode": mode,
            "translation": target.decode(out), "finished": finished}


def target_ids(target, sp, text: str) -> list[int]:
    """The ids of a user's target sentence; the text of a special token in it (`</s>`, `<s>`, `<pad>`, which the
    tokenizer reads as the token itself) is refused: a target is English text, its end marker the model's own."""
    ids = target.encode(text)
    named = {sp.bos: "<s>", sp.eos: "</s>", sp.pad: "<pad>"}
    found = [named[i] for i in ids if i in named]
    if found:
        raise UsageError(f"target: {found[0]!r} is one of the vocabulary's special tokens (<s>, </s>, <pad>), not "
                         "English text; write the words (the end marker is added)", "target")
    return ids


def _piece(target, sp, token_id: int) -> str:
    named = {sp.bos: "<s>", sp.eos: "</s>", sp.pad: "<pad>"}
    return named.get(token_id) or target.id_to_token(token_id) or "?"


def _readable(piece: str) -> str:
    """A piece without its word-start mark ('▁gave' → 'gave'); specials stay as they are."""
    return piece.replace("▁", "") or piece


def _word(target, pieces: list[str], ids: list[int]) -> str:
    if len(pieces) == 1 and pieces[0].startswith("<"):
        return pieces[0]
    return target.decode(ids).strip() or "".join(pieces).replace("▁", "") or "?"


def lens_row(words: list[dict], row: int | None, n_rows: int) -> tuple[int, str]:
    """The row the lens reads: `row`, else the row whose newest input is `gave`, else row 0."""
    if row is not None:
        if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < n_rows:
            raise UsageError(f"row: {row} is outside the target rows 0..{n_rows - 1}", "row")
        return row, "chosen"
    for w in words:
        if w["token"].lower() == LENS_INPUT and w["last"] + 1 < n_rows:
            return w["last"] + 1, f"the row whose newest input is '{LENS_INPUT}'"
    return 0, f"no '{LENS_INPUT}' in the target: row 0"


def why(model, source, target, sentence: str = DEFAULT_CLEAN, target_text: str | None = None,
        method: str = DEFAULT_METHOD, contrast: str | None = None, steps: int | str = DEFAULT_STEPS,
        row: int | None = None, lens: bool = True, tolerance: float = DEFAULT_TOLERANCE,
        rule: str = DEFAULT_RULE) -> dict[str, Any]:
    """Attribution rows by word (JSON keys method / contrast / integration / rows) plus what a view needs."""
    if method not in METHODS:
        raise UsageError(f"method: expected one of {', '.join(METHODS)}, got {method!r}", "method")
    c = contrast_id(target, contrast)
    integrating = method == "integrated-gradients"
    if integrating:
        check_steps(steps)
        check_tolerance(tolerance)
        check_rule(rule)
    model.eval()
    s = sentence_rows(model, source, target, sentence, target_text)
    labels, tgt_in = s["labels"], s["tgt_in"]
    n = len(labels)
    if integrating:
        check_passes(n, steps, rule, positions=s["src"].size(1) + tgt_in.size(1))
    else:
        limits.check("rows × passes", n, "MAX_ATTRIBUTION_PASSES", "steps")     # one pass per row
    sp = special_ids(model)
    pieces = [_piece(target, sp, t) for t in labels]
    groups = word_groups(pieces)
    firsts = {g[0] for g in groups}
    contrasts = None if c is None else [c if r in firsts else -1 for r in range(n)]
    group = [k for k, g in enumerate(groups) for _ in g]                   # the word of each piece row
    a = attribute(model, s["src"], tgt_in, list(range(n)), labels, method, contrasts, steps, rule=rule,
                  tolerance=tolerance, group=group)
    word_error = grouped_errors(a.source, a.prefix, a.value - a.baseline, torch.tensor(group)) if integrating else None
    columns = [[0], *[[p + 1 for p in g] for g in groups]]                 # input positions: <s>, then words
    names = ["<s>", *(_word(target, [pieces[k] for k in g], [labels[k] for k in g]) for g in groups)]
    rows, words = [], []
    for g in groups:
        token = _word(target, [pieces[k] for k in g], [labels[k] for k in g])
        words.append({"token": token, "last": g[-1]})
        merge = torch.mean if method == "alti" else torch.sum               # alti rows stay summing to 1
        src_scores = merge(a.source[g], 0)                                  # (src,)
        pre = merge(a.prefix[g], 0)                                         # (tgt,)
        prefix = [[name, float(pre[[p for p in col if p < tgt_in.size(1)]].sum())]
                  for name, col in zip(names, columns, strict=True) if col[0] <= g[-1]]
        source_list = [[u, float(v)] for u, v in zip(s["units"], src_scores.tolist(), strict=True)]
        total = sum(v for _, v in source_list) + sum(v for _, v in prefix)
        delta = float((a.value[g] - a.baseline[g]).sum()) if a.baseline is not None else None
        rows.append({"position": g[0], "token": token, "source": source_list, "prefix": prefix, "sum": total,
                     "delta": delta, **_completeness(a, word_error, g),
                     "source_share": source_share(src_scores, pre, method)})
    integration = None
    if integrating:
        integration = {"rule": rule, "steps": steps, "tolerance": tolerance,
                       "unconverged": [r["token"] for r in rows if r["error"] > tolerance]}
    result: dict[str, Any] = {"method": method, "contrast": contrast.strip() if contrast else None,
                              "integration": integration, "rows": rows}
    extra = {"units": s["units"], "translation": s["translation"], "mode": s["mode"], "finished": s["finished"],
             "inputs": [_readable(_piece(target, sp, t)) for t in tgt_in[0].tolist()],
             "pieces": [_readable(p) for p in pieces],
             "steps": steps if integrating else None, "baseline": baseline_name(model) if integrating else None}
    if lens:
        r, why_row = lens_row(words, row, n)
        reading = logit_lens(model, s["src"], tgt_in, r, labels[r], c)
        extra["lens"] = {**reading, "token": _readable(pieces[r]), "contrast": result["contrast"], "why": why_row,
                         "sees": extra["inputs"][: r + 1]}
    return {**result, "details": extra}


def _completeness(a, word_error, g: list[int]) -> dict[str, Any]:
    """A word row's error, steps (the largest of its pieces: they converge together) and passes (their sum)."""
    if word_error is None:
        return {"error": None, "steps": None, "passes": None}
    return {"error": float(word_error[g[0]]), "steps": int(a.steps[g].max()), "passes": int(a.passes[g].sum())}


def unconverged_line(result: dict[str, Any]) -> str | None:
    """One line naming the rows over the tolerance and their error (None when every row is within it)."""
    spec = result.get("integration")
    if not spec or not spec["unconverged"]:
        return None
    over = [f"row {r['position']} {r['token']} {100 * r['error']:.2f} % at {r['steps']} steps" for r in result["rows"]
            if r["error"] > spec["tolerance"]]
    bound = (f" (auto stops at MAX_IG_AUTO_STEPS {limits.MAX_IG_AUTO_STEPS} or MAX_ATTRIBUTION_PASSES "
             f"{limits.MAX_ATTRIBUTION_PASSES}, fewer by MAX_ATTRIBUTION_POSITIONS for a long sentence)"
             if spec["steps"] == AUTO else "")
    return f"integrated gradients: not complete within {100 * spec['tolerance']:g} %{bound}: " + "; ".join(over)


# ---- text --------------------------------------------------------------------------------------

def _scores(pairs: list[list]) -> str:
    return "  ".join(f"{name} {value:+.3f}" for name, value in pairs)


def render(result: dict[str, Any]) -> str:
    """The rows as text: per target word its source scores, its prefix scores, Σ and (IG) Δ, error, steps."""
    d, spec = result["details"], result["integration"]
    quantity = "log p(word)" + (f" − log p({result['contrast']})" if result["contrast"] else "")
    how = result["method"] + (f", {spec['rule']} rule, steps {spec['steps']} (tolerance {100 * spec['tolerance']:g} %) "
                              f"from the {d['baseline']} baseline" if spec else "")
    described = {
        "attention": "method: attention (cross- and self-attention weights, mean over decoder layers and heads)",
        "alti": "method: alti (ALTI+ contributions of the source units and the target prefix; each row sums to 1, "
                "whatever token it predicts)"}
    lines = [f"source units: {' ／ '.join(d['units'])}", f"target ({d['mode']}): {d['translation']}",
             described.get(result["method"], f"method: {how}; quantity: {quantity}")]
    for row in result["rows"]:
        top = max(row["source"], key=lambda pair: abs(pair[1]))
        delta = f"   Δ {row['delta']:+.4f}" if row["delta"] is not None else ""
        share = f"   source share {row['source_share']:.3f}" if row["source_share"] is not None else ""
        lines += ["", f"row {row['position']} → {row['token']}   Σ {row['sum']:+.4f}{delta}{share}   "
                      f"largest source: {top[0]} {top[1]:+.3f}",
                  f"  source: {_scores(row['source'])}", f"  prefix: {_scores(row['prefix'])}"]
    if spec:
        lines += ["", "completeness: error = |Σ − Δ| / |Δ|",
                  f"{'row':>4}  {'word':<12} {'Σ':>10} {'Δ':>10} {'error':>8} {'steps':>6} {'passes':>7}"]
        lines += [f"{r['position']:>4}  {r['token']:<12} {r['sum']:>+10.4f} {r['delta']:>+10.4f} "
                  f"{100 * r['error']:>7.2f}% {r['steps']:>6} {r['passes']:>7}"
                  + ("  over" if r["error"] > spec["tolerance"] else "") for r in result["rows"]]
    return "\n".join(lines)


def render_lens(result: dict[str, Any]) -> str:
    lens = result["details"]["lens"]
    other = f"   p({lens['contrast']})" if lens["contrast"] else ""
    lines = [f"logit lens at row {lens['row']} ({lens['why']}; sees {' '.join(lens['sees'])}), "
             f"token {lens['token']}", f"reading: {lens['reading']}", f"            p({lens['token']}){other}"]
    for step in lens["steps"]:
        c = f"   {step['p_contrast']:.6f}" if step["p_contrast"] is not None else ""
        lines.append(f"  L{step['layer']} {step['name']:<16} {step['p']:.6f}{c}")
    c = f", p({lens['contrast']}) = {lens['p_contrast_model']:.6f}" if lens["contrast"] else ""
    lines.append(f"the model's own: p({lens['token']}) = {lens['p_model']:.6f}{c}")
    return "\n".join(lines)


# ---- glassformer attribute ---------------------------------------------------------------------

def add_attribute_arguments(parser) -> None:
    from ..options import add_model_arguments, utf8_text

    parser.add_argument("sentence", nargs="?", default=DEFAULT_CLEAN, type=utf8_text,
                        help=f"Chinese sentence (default {DEFAULT_CLEAN})")
    parser.add_argument("--target", type=utf8_text,
                        help="teacher-force this English target (default: the greedy output)")
    parser.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD,
                        help=f"attribution method (default {DEFAULT_METHOD})")
    parser.add_argument("--contrast", metavar="WORD", type=utf8_text,
                        help="attribute log p(token) − log p(WORD), e.g. her")
    parser.add_argument("--steps", type=_steps, default=DEFAULT_STEPS,
                        help=f"integrated-gradients steps, or {AUTO!r}: doubled until every row is complete within "
                             f"--tolerance (default {DEFAULT_STEPS}; a number: at most {limits.MAX_IG_STEPS}, "
                             f"auto: at most {limits.MAX_IG_AUTO_STEPS})")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"completeness tolerance |Σ − Δ| / |Δ|, in (0, 1) (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--rule", choices=RULES, default=DEFAULT_RULE,
                        help=f"integrated-gradients quadrature rule (default {DEFAULT_RULE})")
    parser.add_argument("--lens", action="store_true", help="print the logit lens of one row instead")
    parser.add_argument("--row", type=int, help="the lens row (default: the row whose newest input is 'gave')")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


def _steps(text: str) -> int | str:
    import argparse

    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or {AUTO!r}, got {text!r}") from None


def attribute_command(args) -> int:
    import json
    import sys

    from ..decoding.translator import Translator
    from ..options import device_name, model_dir
    from ..threads import decoding_threads

    if args.row is not None and not args.lens:
        raise UsageError("--row: only with --lens (the attribution covers every row)", "row")
    torch.set_num_threads(decoding_threads(1))
    translator = Translator.load(model_dir(args), device_name(args.device))
    result = why(translator.model, translator.source, translator.target, args.sentence, args.target, args.method,
                 args.contrast, args.steps, args.row, lens=args.lens, tolerance=args.tolerance, rule=args.rule)
    if args.lens:
        print(json.dumps(result["details"]["lens"], ensure_ascii=False) if args.json else render_lens(result))
    else:
        print(json.dumps({k: result[k] for k in ("method", "contrast", "integration", "rows")}, ensure_ascii=False)
              if args.json else render(result))
        line = unconverged_line(result)
        if line:
            print(line, file=sys.stderr)
    return 0
