"""The checker: each filled cell of a student's answers is right, carried, or wrong with a named bug.

- right:   equal to the key at the sheet's decimals (or, when every table it reads is right, equal to
           what those tables give — a student may round intermediate results);
- carried: not the key, but what the lesson's formula gives from the student's own earlier cells,
           so an early mistake costs once;
- wrong:   neither. The bug of the library whose variant reproduces the cell — from the student's own
           earlier cells, or from the sheet's inputs all the way — is named; `slip` when none does.

"From the student's own cells" allows for their rounding: an entry may differ by the sheet's half-unit
plus what the half-unit rounding of every entry it reads can move it (a finite-difference bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import UsageError
from ...validation import type_name
from .bugs import BUGS, BY_ID, RIGHT, Cell, cells, merge, not_covered, run
from .sheet import Sheet

MASKED_WORDS = ("-inf", "−∞", "-∞", "-Infinity")
IGNORED = {"": ("version", "kind"), "heads": ("disabled",), "sublayers": ("name",)}


# ---- reading answers -----------------------------------------------------------------------------

def _tree(paths: list[str]) -> dict:
    """Nested dicts of the output's structure; list levels have int keys, leaves are the paths."""
    root: dict = {}
    for path in paths:
        node = root
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(int(part) if part.isdigit() else part, {})
        node[parts[-1]] = path
    return root


def _table(value: Any, shape: tuple[int, int], path: str, where: str) -> np.ndarray | None:
    """A student's table: numbers, null (left empty) or "-inf" (a masked score); None when all empty."""
    if value is None:
        return None
    n, m = shape
    if not isinstance(value, list) or not all(isinstance(r, list) or r is None for r in value):
        raise UsageError(f"{where}: {path}: expected a table ({n} rows of {m} numbers), got {type_name(value)}", path)
    if len(value) != n:
        raise UsageError(f"{where}: {path}: expected {n}×{m}, got {len(value)} rows", path)
    out = np.full((n, m), np.nan)
    for i, row in enumerate(value):
        if row is None:
            continue
        if len(row) != m:
            raise UsageError(f"{where}: {path}[{i}]: expected {m} numbers ({n}×{m}), got {len(row)}", f"{path}[{i}]")
        for j, v in enumerate(row):
            at = f"{path}[{i}][{j}]"
            if v is None:
                continue
            if isinstance(v, str) and v.strip() in MASKED_WORDS:
                out[i, j] = -np.inf
            elif isinstance(v, bool) or not isinstance(v, (int, float)):
                shown = repr(v)[:40] if isinstance(v, str) else type_name(v)
                raise UsageError(f"{where}: {at}: expected a number, null or \"-inf\", got {shown}", at)
            elif not np.isfinite(float(v)):
                raise UsageError(f"{where}: {at}: non-finite number {v!r} (write null to leave it empty, "
                                 "\"-inf\" for a masked score)", at)
            else:
                out[i, j] = float(v)
    return None if np.isnan(out).all() else out


def parse_answers(doc: Any, sheet: Sheet, where: str) -> dict[str, np.ndarray]:
    """The filled cells of an answers document (a trace-spec v1 output, any subset filled in)."""
    key = run(sheet)
    tree = _tree(list(key))
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: expected a JSON object (a trace output with the cells you computed), "
                         f"got {type_name(doc)}")
    if "version" in doc and doc["version"] != 1:
        raise UsageError(f"{where}: version: expected 1, got {doc['version']!r}", "version")
    spec_kind = sheet.spec["kind"]
    if "kind" in doc and doc["kind"] != spec_kind:
        shown = repr(doc["kind"])[:40] if isinstance(doc["kind"], str) else type_name(doc["kind"])
        raise UsageError(f"{where}: kind: the sheet is {spec_kind}, got {shown}", "kind")
    found: dict[str, np.ndarray] = {}

    def walk(value: Any, node: Any, path: str, level: str) -> None:
        if isinstance(node, str):                                           # a cell
            table = _table(value, key[node].shape, node, where)
            if table is not None:
                found[node] = table
            return
        if value is None:
            return
        listed = all(isinstance(k, int) for k in node)
        if listed:
            if not isinstance(value, list):
                raise UsageError(f"{where}: {path}: expected a list, got {type_name(value)}", path)
            if len(value) > len(node):
                raise UsageError(f"{where}: {path}: {len(value)} entries, the sheet has {len(node)}", path)
            for i, item in enumerate(value):
                walk(item, node[i], f"{path}.{i}", path.rsplit(".", 1)[-1])
            return
        if not isinstance(value, dict):
            raise UsageError(f"{where}: {path or 'answers'}: expected an object, got {type_name(value)}", path)
        for name, item in value.items():
            sub = f"{path}.{name}" if path else name
            if name in node:
                walk(item, node[name], sub, name)
            elif name in IGNORED.get(level, ()):
                continue
            else:
                known = ", ".join(str(k) for k in node)
                raise UsageError(f"{where}: {sub}: unknown cell (here: {known})", sub)

    walk(doc, tree, "", "")
    return found


# ---- comparing ---------------------------------------------------------------------------------

def agrees(own: np.ndarray, ref: np.ndarray, tol) -> np.ndarray:
    """Per entry: True where the student left it empty or wrote what `ref` holds within `tol`."""
    filled = ~np.isnan(own)
    masked = ~np.isfinite(ref) | ~np.isfinite(own)
    with np.errstate(invalid="ignore"):
        close = np.abs(np.where(masked, 0.0, own - ref)) <= tol
    same_masked = np.isinf(own) & np.isinf(ref)
    return ~filled | np.where(masked, same_masked, close)


def rounding_bound(cell: Cell, args: list[np.ndarray], half: float, h: float = 1e-6) -> np.ndarray:
    """Per output entry: half + half · Σ|∂out/∂in| over every finite entry the cell reads."""
    base = cell.fn(*args)
    total = np.zeros(base.shape)
    for a, arg in enumerate(args):
        for idx in zip(*np.nonzero(np.isfinite(arg)), strict=True):
            slopes = []
            for step in (h, -h):
                moved = [x.copy() for x in args]
                moved[a][idx] += step
                out = cell.fn(*moved)
                with np.errstate(invalid="ignore"):
                    slopes.append(np.where(np.isfinite(out) & np.isfinite(base), np.abs(out - base) / h, 0.0))
            total += np.maximum(*slopes)
    return half + half * total + 1e-9


@dataclass
class CellVerdict:
    path: str
    verdict: str                       # right | carried | wrong
    bug: str | None = None             # a bug id or "slip" (wrong cells only)
    off: list[list[int]] = field(default_factory=list)   # entries not following from the cell's inputs

    def as_json(self) -> dict:
        out = {"path": self.path, "verdict": self.verdict, "bug": self.bug}
        if self.off:
            out["off"] = self.off
        return out


@dataclass
class Report:
    cells: list[CellVerdict]
    bugs: list[str]
    asked: list[str] = field(default_factory=list)     # the sheet's asked cells

    @property
    def verdict(self) -> str:
        """empty (no cell filled: a blank hand-in never passes), right (every filled cell right) or wrong."""
        if not self.cells:
            return "empty"
        return "right" if all(c.verdict == "right" for c in self.cells) else "wrong"

    @property
    def left_out(self) -> list[str]:
        """The asked cells the hand-in does not fill."""
        filled = {c.path for c in self.cells}
        return [p for p in self.asked if p not in filled]

    def as_json(self) -> dict:
        return {"verdict": self.verdict, "bugs": self.bugs, "filled": len(self.cells), "asked": len(self.asked),
                "left_out": self.left_out, "cells": [c.as_json() for c in self.cells]}


def check(sheet: Sheet, own: dict[str, np.ndarray]) -> Report:
    """Every filled cell judged against the key, then against the student's own earlier cells, then
    against each bug of the library that the sheet covers."""
    half = sheet.tolerance
    tol = half * (1 + 1e-9) + 1e-12
    key = run(sheet)
    local = run(sheet, RIGHT, own)
    graph = cells(sheet)
    bugs = [b for b in BUGS if not_covered(b, sheet) is None]
    # each bug's readings, from the student's own cells and from the sheet's inputs
    variants = {b.id: [(run(sheet, sw, own), run(sheet, sw)) for sw in b.readings] for b in bugs}

    verdicts: list[CellVerdict] = []
    explains: dict[str, set[str]] = {}
    fits = {b.id: 0 for b in bugs}
    fine: dict[str, bool] = {}          # a cell is fine when judged right, or left empty with fine inputs
    for cell in graph:
        inputs_right = all(fine[p] for p in cell.inputs)
        if cell.path not in own:
            fine[cell.path] = inputs_right
            continue
        mine = own[cell.path]
        args = [merge(own.get(p), local[p]) for p in cell.inputs]
        bound = rounding_bound(cell, args, half) if cell.inputs else np.full(mine.shape, tol)
        from_own = agrees(mine, local[cell.path], bound)
        for b in bugs:
            if any(agrees(mine, lv[cell.path], bound).all() or agrees(mine, fv[cell.path], tol).all()
                   for lv, fv in variants[b.id]):
                fits[b.id] += 1
        if agrees(mine, key[cell.path], tol).all() or (inputs_right and from_own.all()):
            verdicts.append(CellVerdict(cell.path, "right"))
            fine[cell.path] = True
            continue
        fine[cell.path] = False
        if from_own.all():
            verdicts.append(CellVerdict(cell.path, "carried"))
        else:
            off = [[int(i), int(j)] for i, j in zip(*np.nonzero(~from_own), strict=True)]
            verdicts.append(CellVerdict(cell.path, "wrong", "slip", off))
            explains[cell.path] = {
                b.id for b in bugs
                if any(agrees(mine, lv[cell.path], bound).all() or agrees(mine, fv[cell.path], tol).all()
                       for lv, fv in variants[b.id])}

    # name as few bugs as explain every wrong cell: the bug explaining most cells first, then the one
    # whose whole computation the student's table follows most often, then the library's order
    order = {b.id: i for i, b in enumerate(bugs)}
    open_cells = {p for p, ids in explains.items() if ids}
    named: dict[str, str] = {}
    while open_cells:
        best = max({i for p in open_cells for i in explains[p]},
                   key=lambda i: (sum(i in explains[p] for p in open_cells), fits[i], -order[i]))
        for p in [p for p in open_cells if best in explains[p]]:
            named[p] = best
            open_cells.discard(p)
    names: list[str] = []
    for v in verdicts:
        if v.path in named:
            v.bug = named[v.path]
            if v.bug not in names:
                names.append(v.bug)
    return Report(verdicts, names, list(sheet.asked))


# ---- the table a student reads -------------------------------------------------------------------

WORDS = {
    "en": {"cell": "cell", "verdict": "verdict", "bug": "mistake", "right": "right", "carried": "carried",
           "wrong": "wrong", "slip": "slip (a single mistake, not a known rule)",
           "carried_note": "follows from your own earlier numbers: the mistake is counted once, where it was made",
           "summary": "{right} right, {carried} carried, {wrong} wrong of {total} cells filled",
           "all_right": "Every filled cell is right.", "empty": "No cell is filled in: an empty hand-in.",
           "left_out": "{n} of the {total} asked cells left out: {cells}",
           "claim": "lesson claim", "source": "seen in public code", "entries": "entries",
           "more": ", … {n} more"},
    "zh": {"cell": "单元", "verdict": "判定", "bug": "错误", "right": "对", "carried": "沿用",
           "wrong": "错", "slip": "笔误（单个错误，不是已知的错误规则）",
           "carried_note": "由你自己前面的数字算得正确：一个错误只在出错处计一次",
           "summary": "已填 {total} 个单元：对 {right}，沿用 {carried}，错 {wrong}",
           "all_right": "所填单元全部正确。", "empty": "没有填写任何单元：交了空白答卷。",
           "left_out": "要求的 {total} 个单元中有 {n} 个没填：{cells}",
           "claim": "课文论断", "source": "公开代码中的同类错误", "entries": "位置",
           "more": "，…另 {n} 个"},
}


def report_text(report: Report, lang: str = "en") -> str:
    w = WORDS[lang]
    if not report.cells:
        return "\n".join([w["empty"]] + ([w["left_out"].format(n=len(report.asked), total=len(report.asked),
                                                                cells=", ".join(report.asked))]
                                         if report.asked else []))
    rows = [(w["cell"], w["verdict"], w["bug"])]
    for c in report.cells:
        mistake = "" if c.verdict != "wrong" else (c.bug if c.bug != "slip" else w["slip"])
        if c.verdict == "wrong" and c.off:
            more = w["more"].format(n=len(c.off) - 6) if len(c.off) > 6 else ""
            mistake += f"  [{w['entries']}: {', '.join(f'({i + 1},{j + 1})' for i, j in c.off[:6])}{more}]"
        rows.append((c.path, w[c.verdict], mistake))
    width = [max(_width(r[k]) for r in rows) for k in range(2)]
    lines = [f"{_pad(a, width[0])}  {_pad(b, width[1])}  {c}".rstrip() for a, b, c in rows]
    lines.insert(1, "-" * max(_width(line) for line in lines))
    counts = {k: sum(c.verdict == k for c in report.cells) for k in ("right", "carried", "wrong")}
    lines += ["", w["summary"].format(total=len(report.cells), **counts)]
    if report.verdict == "right":
        lines.append(w["all_right"])
    if report.left_out:
        lines.append(w["left_out"].format(n=len(report.left_out), total=len(report.asked),
                                          cells=", ".join(report.left_out)))
    if counts["carried"]:
        lines.append(f"{w['carried']}: {w['carried_note']}")
    for bug_id in report.bugs:
        bug = BY_ID[bug_id]
        lines.append(f"{bug_id}: {getattr(bug, lang)} ({w['claim']} {bug.claim})")
        if bug.source:
            lines.append(f"    {w['source']}: {bug.source}")
    return "\n".join(lines)


def _width(text: str) -> int:
    import unicodedata
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))
