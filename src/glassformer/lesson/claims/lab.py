"""Chapter G, diagnosis (the lab): the BLOCK re-checked after each change; how 他/她 reaches the `gave` row."""

from __future__ import annotations

import math

import torch

from .. import examples as ex
from ..reference import max_difference, run_reference
from ..spec import run_spec
from .common import EXACT, block, diff, seeded_model, source_ids, target_ids
from .registry import Reading, check, reading


@check("G1", "the BLOCK traced, a head switched off, the norm moved: each pass re-checked")
def block_variants_rechecked() -> Reading:
    variants = {"post": {}, "pre": {"norm": "pre"}, "head 1 off": {"disabled_heads": [0]},
                "head 2 off": {"disabled_heads": [1]}, "pre + head 2 off": {"norm": "pre", "disabled_heads": [1]}}
    base = block()
    worst, moved = 0.0, math.inf
    for changes in variants.values():
        doc = {**ex.block_spec(), **changes}
        r = run_spec(doc)
        worst = max(worst, max_difference(r, run_reference(doc)))
        if changes:
            moved = min(moved, diff(r["output"][0], base["output"][0]))
    stages = len(base["sublayers"]) * 3 + len(base["self_attention"]["heads"]) * 7 + 5
    return reading("{passes} forward passes vs the float64 reference: max |Δ| = {reference:Δ}; "
                   "each change moves Z row 1 by ≥ {moved:.3f}; {stages} intermediates per pass",
                   worst <= EXACT and moved > 1e-3, tolerance={"exact": EXACT, "moves": 1e-3},
                   passes=len(variants), reference=worst, moved=moved, stages=stages)


@check("G2", "她 → 他 diagnosis: source info reaches the target row; PAD and future tokens do not")
def source_reaches_gave_row() -> Reading:
    model = seeded_model(17)
    units = [*ex.SIX_UNITS, ex.PAD, ex.PAD]
    src = source_ids(units)
    src_pad = src == 0
    tgt = target_ids([*ex.SIX_TARGET_PREFIX, "her"])
    g = len(ex.SIX_TARGET_PREFIX) - 1                                         # the `gave` row predicts her
    with torch.no_grad():
        base = model(src, tgt, src_pad=src_pad)[0, g]
        she_he = src.clone()
        she_he[0, units.index("她")] = ex.SOURCE_VOCAB["他"]
        source = diff(model(she_he, tgt, src_pad=src_pad)[0, g], base)
        pad_row = src.clone()
        pad_row[0, -1] = ex.SOURCE_VOCAB["书"]                               # still flagged PAD
        pad = diff(model(pad_row, tgt, src_pad=src_pad)[0, g], base)
        future = tgt.clone()
        future[0, -1] = ex.TARGET_VOCAB["him"]
        ahead = diff(model(src, future, src_pad=src_pad)[0, g], base)
    her, him = float(base[ex.TARGET_VOCAB["her"]]), float(base[ex.TARGET_VOCAB["him"]])
    return reading("gave row logits move: 她→他 in the source {source:.3f}, a PAD source row {pad:Δ}, "
                   "a future target token {future:Δ}; untrained scores her {her:.3f}, him {him:.3f}",
                   source > 1e-4 and pad == 0 and ahead == 0, tolerance={"moves": 1e-4},
                   source=source, pad=pad, future=ahead, her=her, him=him)

