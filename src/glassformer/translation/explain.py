"""The lesson's walk in numbers for one sentence: source units, right-shifted target inputs, and for
each target row what it may see, its top next tokens, and which source unit each cross-attention
head reads most. The row whose newest visible input is `gave` shows the probability of `him`.

Teacher-forced with a given target; otherwise the model's own greedy output is fed back.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UsageError
from ..readout import next_token_walk, walk_inputs
from .decode import Translator, greedy, output_limits
from .tokenize import BOS, EOS

FOCUS_INPUT, FOCUS_NEXT = "gave", "him"   # the lesson's row: input `gave` predicts `him`


def _ends_word(names: list[str], t: int, word: str) -> bool:
    """True if the visible inputs up to row t end with the whole word `word` (sub-words joined)."""
    text = "".join(names[1: t + 1]).replace("▁", " ")
    following = names[t + 1] if t + 1 < len(names) else "▁"               # the word must be complete
    return text.split()[-1:] == [word] and not text.endswith(" ") and following.startswith("▁")


@torch.no_grad()
def explain(translator: Translator, sentence: str, target: str | None = None, all_layers: bool = False,
            top: int = 5) -> dict[str, Any]:
    """The walk as a JSON-able dict (see module docstring); probes decoder.*.cross_attention and logits."""
    model, tgt_tok = translator.model, translator.target
    enc = translator.source.analyse(sentence)
    if not enc.ids:
        raise UsageError("explain: the sentence is empty")
    translator.check_lengths([enc])
    device = translator.device
    src = torch.tensor([enc.ids], dtype=torch.long, device=device)          # (1, src)
    finished = True
    if target is None:
        out = greedy(model, src)[0]
        mode = "free-running (greedy)"
        # an output as long as its limit was cut there: its last row predicts the model's choice, not EOS
        finished = len(out) < int(output_limits(model.source_padding(src), model.cfg.max_len)[0])
    else:
        out = tgt_tok.encode(target)
        mode = "teacher-forced"
    limit = model.cfg.max_len
    inputs = walk_inputs(out, BOS, limit, finished=finished)
    if len(inputs) > limit:
        raise UsageError(f"--target: {len(inputs)} target positions, over the model's limit of {limit}")
    tgt_in = torch.tensor([inputs], dtype=torch.long, device=device)       # (1, tgt)
    layers = range(model.cfg.decoder_layers) if all_layers else [model.cfg.decoder_layers - 1]
    model.eval()
    with model.probes(*[f"decoder.{i}.cross_attention.head.*.weights" for i in layers], "logits") as trace:
        model(src, tgt_in)
    walk = next_token_walk(trace["logits"][0], tgt_in[0].tolist(), EOS, finished=finished,
                           top=min(top, model.cfg.tgt_vocab))
    names = [tgt_tok.id_to_token(i) or "?" for i in tgt_in[0].tolist()]
    names[0] = "<s>"
    focus_piece = tgt_tok.tokens(FOCUS_NEXT)[0]                            # first sub-word of `him`
    focus_id = tgt_tok.token_to_id(focus_piece)
    rows = []
    focus = None
    for r in walk:
        t = r.row
        heads = []
        for layer in layers:
            for h in range(model.cfg.heads):
                w = trace[f"decoder.{layer}.cross_attention.head.{h}.weights"][0, t]  # (src,)
                j = int(w.argmax())
                heads.append({"layer": layer, "head": h, "unit": enc.units[j], "position": j,
                              "weight": round(float(w[j]), 4)})
        rows.append({"row": t, "sees": names[: t + 1], "next": _piece(tgt_tok, r.next_id),
                     "p_next": round(r.p_next, 4), "rank": r.rank,
                     "top": [{"token": _piece(tgt_tok, i), "p": round(q, 4)} for i, q in r.top],
                     "cross_attention": heads})
        if focus is None and focus_id is not None and _ends_word(names, t, FOCUS_INPUT):
            probs = torch.softmax(trace["logits"][0, t].double(), dim=-1)  # (vocab,)
            focus = {"row": t, "input": names[t], "token": focus_piece, "p": round(float(probs[focus_id]), 4)}
    return {"sentence": sentence, "units": enc.units, "unknown": enc.unknown, "mode": mode,
            "translation": tgt_tok.decode(out), "finished": finished, "inputs": names, "rows": rows, "focus": focus}


def _piece(tgt_tok, token_id: int) -> str:
    return "</s>" if token_id == EOS else tgt_tok.id_to_token(token_id) or "?"


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
