"""Activation patching for the lesson's question: how does `him` know about 他?

Run the clean sentence (我昨天给了他一本书。) and a corrupted one (我昨天给了她一本书。, or
他昨天给了我一本书。) with the same target input (BOS I gave him …). At the `gave` row the
clean run gives p(him) = p_clean, the corrupted run p_corrupt. Now rerun the corrupted sentence
with ONE activation written back from the clean run, through the model's hooks
(`model.intervene`), and read p(him) again:

    restored fraction = (p_patched − p_corrupt) / (p_clean − p_corrupt)

1 means that activation alone carries the difference; 0 that it carries none of it. Two scans:

- every cross-attention head of every decoder layer (`decoder.{i}.cross_attention.head.{h}.output`,
  the head's output at every target row): which heads read 他 into the target rows;
- every encoder position, layer by layer (`encoder.embedding`, then `encoder.{i}.output`): where in
  the source, and how deep, the information sits. Positions must align, so both sentences need the
  same number of units.

Every run of a scan uses the same hook points and so the same attention backend; patching every
head (or every position of one encoder layer) gives the clean run back, fraction 1.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import limits
from ..errors import UsageError
from ..lesson.examples import LESSON_CORRUPTIONS as DEFAULT_CORRUPT
from ..lesson.examples import LESSON_PREDICT as DEFAULT_PREDICT
from ..lesson.examples import LESSON_SENTENCE as DEFAULT_CLEAN
from ..lesson.examples import LESSON_TARGET as DEFAULT_TARGET
from .attribution_patching import approximate_scan, correlation
from .patch_sites import FLAT, Patched, scan_sites

MAX_CORRUPT = 4                 # corrupted sentences per request: each costs (heads + positions) forward passes

HookFn = Callable[[Tensor, str], Tensor]


def _copy(clean: dict[str, Tensor]) -> HookFn:
    """Replace a value by the clean run's value of the same probe."""
    return lambda value, name: clean[name]


def _copy_position(clean: dict[str, Tensor], position: int) -> HookFn:
    """Replace one source position of a (batch, src, d) value by the clean run's."""
    def put(value: Tensor, name: str) -> Tensor:
        out = value.clone()
        out[:, position] = clean[name][:, position]
        return out
    return put


@torch.no_grad()
def patch_scan(model, clean_src: Tensor, corrupt_src: Tensor, tgt_in: Tensor, row: int, token: int, *,
               positions: bool = True) -> dict[str, Any]:
    """Patch each cross-attention head and (when `positions`) each encoder position from clean into corrupt.

    clean_src, corrupt_src: (1, src) ids; tgt_in: (1, tgt) right-shifted target input; the quantity is
    p(token) at target row `row`. Returns p_clean, p_corrupt, heads[layer][head], positions[layer][pos]
    (layer 0 of positions is the embedding), and the two checks everything / nothing.
    """
    heads, every_head, layers = scan_sites(model, clean_src, corrupt_src, tgt_in, row, positions)
    # every run records the head outputs, so every run takes the same (math) attention path in the decoder
    watch = every_head

    def p_of(src: Tensor, fns: dict[str, HookFn]) -> float:
        with model.probes(*watch), model.intervene(fns):
            logits = model(src, tgt_in)                                     # (1, tgt, vocab)
        return float(torch.softmax(logits[0, row].double(), dim=-1)[token])

    with model.probes(*every_head, *layers) as rec:
        logits = model(clean_src, tgt_in)
    clean = {name: rec[name] for name in rec}
    p_clean = float(torch.softmax(logits[0, row].double(), dim=-1)[token])
    p_corrupt = p_of(corrupt_src, {})
    gap = p_clean - p_corrupt

    def patched(fns: dict[str, HookFn]) -> Patched:
        p = p_of(corrupt_src, fns)
        return Patched(p, (p - p_corrupt) / gap if abs(gap) >= FLAT else None)

    result: dict[str, Any] = {
        "p_clean": p_clean, "p_corrupt": p_corrupt,
        "heads": [[patched({name: _copy(clean)}) for name in layer] for layer in heads],
        "all_heads": patched({name: _copy(clean) for name in every_head}),
        "nothing": patched({}),
        "position_layers": layers,
        "positions": None,
    }
    if positions:
        n = clean_src.size(1)
        result["positions"] = [[patched({name: _copy_position(clean, j)}) for j in range(n)] for name in layers]
        result["all_positions"] = [patched({name: _copy(clean)}) for name in layers]
    return result


# ---- sentences in, a scan out ------------------------------------------------------------------

def _source(source, text: Any, field: str) -> tuple[list[str], list[int]]:
    """Units and ids of one sentence; an empty, over-long or unknown-unit sentence is a UsageError naming `field`."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{field}: expected a non-empty Chinese sentence", field)
    limits.check(f"{field}: characters", len(text), "MAX_SOURCE_CHARS", field)
    enc = source.analyse(text)
    if enc.unknown:
        raise UsageError(f"{field}: unknown unit {enc.unknown[0]!r} (not in the model's source vocabulary)", field)
    if not enc.ids:
        raise UsageError(f"{field}: no units after splitting", field)
    return enc.units, enc.ids


def focus_row(target, text: str, word: str) -> tuple[int, int, list[int]]:
    """(row, token id, target ids): the row whose next token is the first piece of `word` in `text`.

    The row is the one whose newest input is the token just before `word` (BOS I gave → row 2 predicts him).
    A word cut into several sub-word pieces is measured by its first piece (`word_pieces` counts them).
    """
    if not isinstance(text, str) or not text.strip():
        raise UsageError("target: expected a non-empty English sentence", "target")
    limits.check("target: characters", len(text), "MAX_TARGET_CHARS", "target")
    if not isinstance(word, str) or not word.strip() or " " in word.strip():
        raise UsageError("predict: expected one English word", "predict")
    word = word.strip()
    words = text.split()
    at = next((k for k, w in enumerate(words) if w.strip(".,!?;:\"'").lower() == word.lower()), None)
    if at is None:
        raise UsageError(f"predict: {word!r} is not a word of the target {text!r}", "predict")
    ids = target.encode(text)
    before = target.encode(" ".join(words[:at])) if at else []
    if ids[: len(before)] != before or len(before) >= len(ids):
        raise UsageError(f"predict: the target's tokens do not split before {word!r}", "predict")
    return len(before), ids[len(before)], ids


def word_pieces(target, text: str, word: str) -> int:
    """How many target tokens the word `word` of `text` is (after focus_row accepted them)."""
    words = text.split()
    at = next(k for k, w in enumerate(words) if w.strip(".,!?;:\"'").lower() == word.strip().lower())
    bare = words[at].strip(".,!?;:\"'")
    before = len(target.encode(" ".join(words[:at]))) if at else 0
    return max(1, len(target.encode(" ".join([*words[:at], bare]))) - before)


def focus_note(target, word: str, token: int, pieces: int) -> str:
    """What the scans measure, in words: the whole word, or the first of its sub-word pieces."""
    piece = _readable(target.id_to_token(token))
    if pieces > 1:
        return f"{word!r} is {pieces} sub-word pieces here: p is that of its first piece {piece!r}"
    return f"{word!r} is one token here ({piece!r})"


METHODS = ("activation", "attribution")   # rerun per site (patch_scan) | one backward (approximate_scan)


def lesson_patching(model, source, target, clean: str = DEFAULT_CLEAN, corrupt=DEFAULT_CORRUPT,
                    text: str = DEFAULT_TARGET, predict: str = DEFAULT_PREDICT, *,
                    positions: bool = True, method: str = "activation") -> dict[str, Any]:
    """The scans for one clean sentence against each corrupted one, as JSON-able values.

    method "activation" reruns the corrupted sentence per site; "attribution" estimates every cell from one
    backward pass (attribution_patching.py)."""
    if method not in METHODS:
        raise UsageError(f"method: expected one of {', '.join(METHODS)}, got {method!r}", "method")
    scan_of = patch_scan if method == "activation" else approximate_scan
    corrupt = [corrupt] if isinstance(corrupt, str) else list(corrupt)
    if not corrupt:
        raise UsageError("corrupt: give at least one corrupted sentence", "corrupt")
    if len(corrupt) > MAX_CORRUPT:
        raise UsageError(f"corrupt: {len(corrupt)} sentences; the limit is {MAX_CORRUPT} (MAX_CORRUPT)", "corrupt",
                         status=413)
    limit = model.cfg.max_len
    clean_units, clean_ids = _source(source, clean, "clean")
    row, token, ids = focus_row(target, text, predict)
    pieces = word_pieces(target, text, predict)
    if len(clean_ids) > limit:
        raise UsageError(f"clean: {len(clean_ids)} units; the model takes at most {limit}", "clean")
    if len(ids) + 1 > limit:
        raise UsageError(f"target: {len(ids) + 1} positions (BOS and the tokens); the model takes at most {limit}",
                         "target")
    runs = []
    for k, sentence in enumerate(corrupt):
        units, src_ids = _source(source, sentence, f"corrupt[{k}]")
        if len(src_ids) > limit:
            raise UsageError(f"corrupt[{k}]: {len(src_ids)} units; the model takes at most {limit}", f"corrupt[{k}]")
        if positions and len(src_ids) != len(clean_ids):
            raise UsageError(f"corrupt[{k}]: {len(src_ids)} units ({' '.join(units)}) but the clean sentence has "
                             f"{len(clean_ids)}; patching positions needs the same count (or heads only)",
                             f"corrupt[{k}]")
        tgt_in = torch.tensor([[model.cfg.bos_id, *ids]])                  # the decoder starts from cfg.bos_id
        scan = scan_of(model, torch.tensor([clean_ids]), torch.tensor([src_ids]), tgt_in, row, token,
                       positions=positions)
        runs.append({"corrupt": sentence, "units": units, **_plain(scan)})
    names = ["<s>", *(_readable(target.id_to_token(i)) for i in ids)]
    return {"method": method, "clean": clean, "clean_units": clean_units, "target": text, "inputs": names, "row": row,
            "row_sees": names[: row + 1], "predict": _readable(target.id_to_token(token)), "token_id": token,
            "layers": {"encoder": model.cfg.encoder_layers, "decoder": model.cfg.decoder_layers},
            "heads": model.cfg.heads, "note": focus_note(target, predict.strip(), token, pieces), "runs": runs}


def _readable(piece: str | None) -> str:
    """A target sub-word without its word-start mark ('▁gave' → 'gave')."""
    return (piece or "?").replace("▁", "") or piece or "?"


def _plain(value: Any) -> Any:
    if isinstance(value, Patched):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _cell(patch: dict) -> str:
    if patch["fraction"] is None:
        return "   n/a"
    value = round(patch["fraction"], 2)
    return f"{value if value != 0 else 0.0:+6.2f}"                          # no "-0.00"


def _right(text: str, width: int) -> str:
    """Right-aligned in `width` terminal columns (a CJK character takes two)."""
    used = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return " " * max(0, width - used) + text


def render(result: dict[str, Any]) -> str:
    """The scans as text: a heads × layers table and a layers × positions table per corrupted sentence."""
    lines = [f"clean: {result['clean']} ({' '.join(result['clean_units'])})",
             f"target input: {' '.join(result['inputs'])}",
             f"quantity: p({result['predict']}) at row {result['row']} (sees {' '.join(result['row_sees'])})",
             f"  ({result['note']})"]
    if result.get("method") == "attribution":
        lines.append("  method: attribution patching — each cell estimated from one backward pass (first order)")
    for run in result["runs"]:
        lines += ["", f"corrupted: {run['corrupt']} ({' '.join(run['units'])})",
                  f"  p clean {run['p_clean']:.4f}   p corrupted {run['p_corrupt']:.4f}   "
                  f"all heads patched → {_cell(run['all_heads']).strip()}   nothing patched → "
                  f"{_cell(run['nothing']).strip()}",
                  *([f"  correlation with activation patching: {run['correlation']:.3f}"]
                    if run.get("correlation") is not None else []),
                  "  restored fraction, cross-attention head output (rows: decoder layer, columns: head):",
                  "       " + "".join(_right(f"h{h}", 7) for h in range(result["heads"]))]
        for i, layer in enumerate(run["heads"]):
            lines.append(f"  L{i:<4} " + " ".join(_cell(p) for p in layer))
        if run["positions"] is not None:
            lines.append("  restored fraction, one encoder position (rows: residual stream after that layer):")
            lines.append("       " + "".join(_right(u, 7) for u in run["units"]))
            for name, layer in zip(run["position_layers"], run["positions"], strict=True):
                label = "emb" if name == "encoder.embedding" else "L" + name.split(".")[1]
                lines.append(f"  {label:<5} " + " ".join(_cell(p) for p in layer))
    return "\n".join(lines)


# ---- glassformer patch -------------------------------------------------------------------------

def add_patch_arguments(parser) -> None:
    from ..options import add_model_arguments, utf8_text

    parser.add_argument("clean", nargs="?", default=DEFAULT_CLEAN, type=utf8_text,
                        help=f"the clean sentence (default {DEFAULT_CLEAN})")
    parser.add_argument("--corrupt", action="append", metavar="SENTENCE", type=utf8_text,
                        help=f"a corrupted sentence; repeat for several, at most {MAX_CORRUPT} "
                             f"(default: {' and '.join(DEFAULT_CORRUPT)})")
    parser.add_argument("--target", default=DEFAULT_TARGET, type=utf8_text,
                        help=f"the English target (default {DEFAULT_TARGET!r})")
    parser.add_argument("--predict", default=DEFAULT_PREDICT, type=utf8_text,
                        help=f"the target word whose probability is measured, at the row before it (default "
                             f"{DEFAULT_PREDICT})")
    parser.add_argument("--heads-only", action="store_true",
                        help="patch cross-attention heads only (sentences of different unit counts)")
    parser.add_argument("--approximate", action="store_true",
                        help="attribution patching: every cell estimated from one backward pass instead of a "
                             "forward pass per site")
    parser.add_argument("--compare", action="store_true",
                        help="with --approximate: also run activation patching and print their correlation")
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the scans as JSON")


def patch_command(args) -> int:
    import json

    from ..decoding.translator import Translator
    from ..options import device_name, model_dir
    from ..threads import decoding_threads

    torch.set_num_threads(decoding_threads(1))              # one sentence at a time: batch-1 forward passes
    translator = Translator.load(model_dir(args), device_name(args.device))
    if args.compare and not args.approximate:
        raise UsageError("--compare: only with --approximate (it compares the estimate with the real scan)")
    scan = [translator.model, translator.source, translator.target, args.clean, args.corrupt or DEFAULT_CORRUPT,
            args.target, args.predict]
    method = "attribution" if args.approximate else "activation"
    result = lesson_patching(*scan, positions=not args.heads_only, method=method)
    if args.compare:
        exact = lesson_patching(*scan, positions=not args.heads_only, method="activation")
        for run, real in zip(result["runs"], exact["runs"], strict=True):
            run["correlation"] = correlation(run, real)
    print(json.dumps(result, ensure_ascii=False) if args.json else render(result))
    return 0
