"""Sheets from a seed (numbers a student can handle by hand) and the diagnostic audit of every sheet.

A sheet is issued only when the audit passes: every bug of the library that can happen on its kind
changes at least one asked cell by more than AUDIT_MARGIN times the sheet's rounding tolerance, and
no two bugs give the same numbers (within that margin) on every asked cell. Otherwise the seed's
generator draws again. A bug that cannot show on a kind at all is listed as not covered, with why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ... import limits
from ...errors import UsageError
from .bugs import BUGS, not_covered, run
from .sheet import Sheet, default_asked, from_spec

MAX_DRAWS = 200                 # draws of one seed before the generator gives up
AUDIT_MARGIN = 10.0             # a bug must move an asked cell by this many rounding tolerances
EPS = 0.1                       # the sheets' LayerNorm ε: 1e-5 would hide ε-outside-√ at four decimals


# ---- drawing numbers --------------------------------------------------------------------------
# The draws come from SplitMix64 (Steele, Lea & Flood 2014), written out here and, identically, in the lab's
# engine/exercises.js, so that the page makes the same sheet of a seed as `glassformer exercise new`:
# 64-bit state = seed mod 2^64; each draw adds 0x9E3779B97F4A7C15 and mixes; an integer in [0, n) is a draw
# below the largest multiple of n (rejection, no modulo bias) taken mod n; a weighted choice draws an
# integer below the weights' sum and walks their running total. Numbers are drawn row by row.

MASK64 = (1 << 64) - 1


class SplitMix64:
    """The sheets' random numbers (also in engine/exercises.js, draw for draw)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """Uniform in [0, n)."""
        limit = (1 << 64) - (1 << 64) % n
        while True:
            u = self.next()
            if u < limit:
                return u % n


def _ints(rng: SplitMix64, shape, low: int, high: int) -> list[list[float]]:
    return [[float(low + rng.below(high - low + 1)) for _ in range(shape[1])] for _ in range(shape[0])]


def _choice(rng: SplitMix64, shape, values, weights) -> list[list[float]]:
    """Each entry one of `values`, with probability weight / sum of the (integer) weights."""
    total = sum(weights)

    def one() -> float:
        r = rng.below(total)
        for value, w in zip(values, weights, strict=True):
            if r < w:
                return float(value)
            r -= w
        raise AssertionError("unreachable")
    return [[one() for _ in range(shape[1])] for _ in range(shape[0])]


SPARSE = ([0, 1, -1], [2, 1, 1])                                            # 0 half the time, ±1 a quarter
HALVES = ([0, 0.5, -0.5, 1, -1], [4, 2, 2, 1, 1])


def draw_attention(rng: SplitMix64, mask: str) -> dict:
    """Three queries, three keys/values, d_k = d_v = 2, small integers (the lesson's 2×3, one key more
    so that KQᵀ has the shape of QKᵀ)."""
    return {"version": 1, "kind": "attention", "q": _ints(rng, (3, 2), -2, 2), "k": _ints(rng, (3, 2), -2, 2),
            "v": _ints(rng, (3, 2), -3, 3), "scale": True, "mask": mask}


def draw_block(rng: SplitMix64, norm: str, mask: str, eps: float) -> dict:
    """The lesson's BLOCK shape: 3 rows, d = 4, two heads with d_k = d_v = 2, d_ff = 6; integers and halves.
    Drawn in this order: the heads (W^Q, W^K, W^V of head 1, then head 2), X, W^O, W_1, W_2."""
    heads = [{"w_q": _choice(rng, (4, 2), *SPARSE), "w_k": _choice(rng, (4, 2), *SPARSE),
              "w_v": _choice(rng, (4, 2), *SPARSE)} for _ in range(2)]
    x = _ints(rng, (3, 4), -2, 2)
    w_o = _choice(rng, (4, 4), *SPARSE)
    w_1 = _choice(rng, (4, 6), *SPARSE)
    w_2 = _choice(rng, (6, 4), *HALVES)
    return {"version": 1, "kind": "encoder_block", "x": x,
            "self_attention": {"heads": heads, "w_o": w_o},
            "ffn": {"w_1": w_1, "w_2": w_2, "activation": "relu"},
            "norm": norm, "eps": eps, "scale": True, "mask": mask}


# ---- the audit ---------------------------------------------------------------------------------

def distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference of two tables; a masked (−∞) entry against a number is infinitely far."""
    fa, fb = np.isfinite(a), np.isfinite(b)
    if (fa != fb).any() or (~fa & (a != b)).any():
        return float("inf")
    with np.errstate(invalid="ignore"):
        return float(np.max(np.abs(np.where(fa, a - b, 0.0)), initial=0.0))


def cells_distance(x: dict, y: dict, asked: list[str]) -> float:
    return max((distance(x[p], y[p]) for p in asked), default=0.0)


@dataclass
class Audit:
    covered: list[str] = field(default_factory=list)
    not_covered: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self, draws: int, margin: float) -> dict:
        return {"covered": self.covered, "not_covered": [{"bug": b, "reason": r} for b, r in self.not_covered.items()],
                "draws": draws, "margin": margin}


def bug_runs(sheet: Sheet) -> dict[str, list[dict[str, np.ndarray]]]:
    """Every covered bug's readings, each run from the sheet's own inputs (a student with that bug)."""
    return {b.id: [run(sheet, sw) for sw in b.readings] for b in BUGS if not_covered(b, sheet) is None}


def audit(sheet: Sheet, margin: float | None = None) -> Audit:
    """Does every bug that can happen here show on an asked cell, and can every two be told apart?"""
    margin = AUDIT_MARGIN * sheet.tolerance if margin is None else margin
    key = run(sheet)
    result = Audit()
    for b in BUGS:
        reason = not_covered(b, sheet)
        if reason is not None:
            result.not_covered[b.id] = reason
    runs = bug_runs(sheet)
    for bug_id, readings in runs.items():
        result.covered.append(bug_id)
        for r, values in enumerate(readings):
            if cells_distance(values, key, sheet.asked) <= margin:
                which = f" (reading {r + 1})" if len(readings) > 1 else ""
                result.problems.append(f"{bug_id}{which} changes no asked cell by more than {margin:g}")
    ids = list(runs)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            if any(cells_distance(x, y, sheet.asked) <= margin for x in runs[a] for y in runs[b]):
                result.problems.append(f"{a} and {b} give the same numbers on every asked cell")
    return result


# ---- a sheet from a seed ----------------------------------------------------------------------

KINDS = ("attention", "block")


def new_sheet(kind: str, seed: int, *, norm: str = "post", mask: str | None = None, eps: float = EPS,
              decimals: int = 4, lang: str = "zh", asked: list[str] | None = None) -> Sheet:
    """The sheet of `seed`: drawn again until its audit passes (at most MAX_DRAWS times)."""
    if kind not in KINDS:
        raise UsageError(f"--kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if not 0 <= decimals <= limits.MAX_SHEET_DECIMALS:
        raise UsageError(f"--decimals: expected 0..{limits.MAX_SHEET_DECIMALS}, got {decimals}")
    mask = mask or ("causal" if kind == "attention" else "none")
    rng = SplitMix64(seed)
    last: list[str] = []
    for draw in range(1, MAX_DRAWS + 1):
        doc = draw_attention(rng, mask) if kind == "attention" else draw_block(rng, norm, mask, eps)
        sheet = from_spec(doc, "sheet")
        sheet.decimals, sheet.seed, sheet.lang = decimals, seed, lang
        known = default_asked(sheet)
        if asked:
            unknown = [a for a in asked if a not in known]
            if unknown:
                raise UsageError(f"--ask: {unknown[0]!r} is not a cell of a {kind} sheet (cells: {', '.join(known)})")
        sheet.asked = list(asked) if asked else known
        result = audit(sheet)
        if result.ok:
            sheet.audit = result.as_json(draw, AUDIT_MARGIN * sheet.tolerance)
            return sheet
        last = result.problems
    raise UsageError(f"no {kind} sheet of seed {seed} passes the audit in {MAX_DRAWS} draws "
                     f"({last[0]}{' and more' if len(last) > 1 else ''}); ask more cells or fewer decimals")


def key_text(doc: dict) -> str:
    """key.json: exactly what `glassformer trace exercise.json` prints (the model's layers, float64)."""
    from ..spec import run_spec
    return json.dumps(run_spec(doc), ensure_ascii=False, allow_nan=False) + "\n"


def write_sheet(sheet: Sheet, folder: Path) -> None:
    """exercise.json, key.json, sheet.json, worksheet.md, worksheet.html and moodle.xml in `folder`."""
    from . import render
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "exercise.json").write_text(json.dumps(sheet.doc, ensure_ascii=False, indent=1) + "\n",
                                          encoding="utf-8")
    (folder / "key.json").write_text(key_text(sheet.doc), encoding="utf-8")
    (folder / "sheet.json").write_text(json.dumps(sheet.meta(), ensure_ascii=False, indent=1) + "\n",
                                       encoding="utf-8")
    (folder / "worksheet.md").write_text(render.worksheet_md(sheet), encoding="utf-8")
    (folder / "worksheet.html").write_text(render.worksheet_html(sheet), encoding="utf-8")
    (folder / "moodle.xml").write_text(render.moodle_xml([sheet]), encoding="utf-8")
