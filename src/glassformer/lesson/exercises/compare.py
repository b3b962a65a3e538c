"""The lesson's outputs and every bug's on a task's probes, and how a call of the student's function compares.

`prepared(task, seed)` draws the probes and computes the lesson's outputs (the bug library's default
switches); `variant_outputs` computes each bug's (each reading of its switches) and each pair of two bugs'
on the same probes, once per (task, seed). A variant whose computation cannot take a probe's shapes (K Qᵀ
masked by an (n, m) table when n ≠ m) gives SHAPE there: a function failing on those shapes follows it.
A call's outputs are equal to a variant's within the tolerance of the dtype the function returned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from . import sandbox
from .bugs import BY_ID, RIGHT, Switches
from .tasks import ONE_SITE, TASKS, Probe, Task, compute, probes

SHAPE = "shape"          # what a bug's computation gives on a probe whose shapes it cannot take (K Qᵀ, n ≠ m)


def _merge(a: Switches, b: Switches) -> Switches | None:
    """Both bugs' switches at once; None when they set the same switch two ways."""
    changes = {}
    for f in fields(Switches):
        va, vb, right = getattr(a, f.name), getattr(b, f.name), getattr(RIGHT, f.name)
        if va != right and vb != right and va != vb:
            return None
        if va != right or vb != right:
            changes[f.name] = va if va != right else vb
    return replace(RIGHT, **changes)


def variants(task: Task) -> list[tuple[tuple[str, ...], Switches]]:
    """(bug ids, switches): each reading of each bug of the task (and in a block, of a bug made in one sub-layer
    alone: "no-scale@cross_attention"), then each pair of two bugs' readings everywhere (pairs that set one
    switch two ways, or that give a single bug's switches, are left out)."""
    order = {b: i for i, b in enumerate(BY_ID)}
    readings = [(bug_id, sw) for bug_id in sorted(task.bugs, key=order.get) for sw in BY_ID[bug_id].readings]
    singles = [((bug_id,), sw) for bug_id, sw in readings]
    for bug_id, sw in readings:                              # in one sub-layer of a block alone: "id@sub-layer"
        sites = [s for s in task.sublayers if ONE_SITE.get(bug_id) == "sublayer" or
                 (ONE_SITE.get(bug_id) == "attention" and s.endswith("attention"))]
        if len(sites) > 1:
            singles += [((f"{bug_id}@{site}",), replace(sw, scope=site)) for site in sites]
    seen = {sw for _, sw in singles}
    pairs = []
    for i, (a, sa) in enumerate(readings):
        for b, sb in readings[i + 1:]:
            merged = _merge(sa, sb) if a != b else None
            if merged is not None and merged not in seen:
                seen.add(merged)
                pairs.append(((a, b), merged))
    return singles + pairs


def _outputs(task: Task, probe: Probe, sw: Switches):
    with np.errstate(all="ignore"):
        try:
            return compute(task, probe.inputs, sw)
        except (ValueError, IndexError):
            return SHAPE


@lru_cache(maxsize=256)
def prepared(task_name: str, seed: int):
    """The probes and properties of (task, seed) and the lesson's outputs on each probe."""
    task = TASKS[task_name]
    found, props = probes(task, seed)
    return found, props, [compute(task, p.inputs) for p in found]


@lru_cache(maxsize=512)
def _variant_outputs(task_name: str, seed: int, size: int) -> list[tuple[tuple[str, ...], list]]:
    task = TASKS[task_name]
    found, _, _ = prepared(task_name, seed)
    return [(ids, [_outputs(task, p, sw) for p in found]) for ids, sw in variants(task) if len(ids) == size]


def variant_outputs(task_name: str, seed: int, sizes=(1, 2)) -> list[tuple[tuple[str, ...], list]]:
    """Each variant's outputs on every probe of (task, seed): [(bug ids, [outputs or SHAPE per probe])], the
    single bugs (size 1) before the pairs (size 2); each size computed once, when first asked for."""
    return [v for size in sizes for v in _variant_outputs(task_name, seed, size)]


# ---- what a call gave --------------------------------------------------------------------------------

_SHAPE_WORDS = re.compile(r"shape|broadcast|dimension|align|mismatch|size of tensor|out of bounds|must match|"
                          r"cannot be multiplied|did not match|size of axis", re.IGNORECASE)


@dataclass
class Outcome:
    kind: str                                  # arrays | other | raised | not run
    arrays: list[np.ndarray | None] = field(default_factory=list)   # float64 values (None: too many to read)
    shapes: list[tuple] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    other: str = ""
    error: dict | None = None

    @property
    def shape_like(self) -> bool:
        """An exception that is a shape mismatch: numpy's broadcasting or matmul, torch's sizes, any IndexError
        (a row or column the arrays do not have)."""
        e = self.error or {}
        return e.get("type") == "IndexError" or (e.get("type") in ("ValueError", "RuntimeError") and bool(
            _SHAPE_WORDS.search(e.get("message", ""))))


def outcome_of(call: sandbox.Call | None) -> Outcome:
    if call is None:
        return Outcome("not run")
    if call.status == "raised":
        return Outcome("raised", error=call.error or {})
    result = call.result if isinstance(call.result, dict) else {}
    if "arrays" not in result:
        return Outcome("other", other=str(result.get("other", "?"))[:300])
    out = Outcome("arrays")
    try:                                         # the child's answer, read without trusting its structure
        for entry in result["arrays"]:
            shape = tuple(int(n) for n in entry.get("shape", ()))
            values = entry.get("values")
            a = None
            if values is not None:
                a = np.asarray(values, dtype=np.float64)
                if a.shape != shape:
                    a = None
            out.arrays.append(a)
            out.shapes.append(shape)
            out.dtypes.append(str(entry.get("dtype", "")))
    except (TypeError, ValueError, AttributeError, OverflowError):
        return Outcome("other", other="an answer the checker could not read")
    return out


def _tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for arrays of this dtype: float64 nearly exact, float32 and halves what they can hold."""
    if "16" in dtype:
        return 2e-2, 2e-2
    if "32" in dtype:
        return 1e-4, 1e-5
    if dtype.startswith(("int", "uint", "bool")):
        return 0.0, 1e-9
    return 1e-6, 1e-9


def close(got: np.ndarray, expected: np.ndarray, dtype: str) -> bool:
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return False
    nan_got, nan_expected = np.isnan(got), np.isnan(expected)
    if (nan_got != nan_expected).any():
        return False
    rtol, atol = _tolerance(dtype)
    g, e = got[~nan_got], expected[~nan_expected]
    with np.errstate(invalid="ignore"):
        return bool(np.all((g == e) | (np.abs(g - e) <= atol + rtol * np.abs(e))))


def shaped(outcome: Outcome, expected: tuple) -> bool:
    """The call returned the task's arrays with the lesson's shapes."""
    return outcome.kind == "arrays" and outcome.shapes == [tuple(e.shape) for e in expected]


def status_of(outcome: Outcome, expected: tuple) -> str:
    """right | wrong | shape | error | memory | not run — a call against the lesson's outputs."""
    if outcome.kind == "raised":
        return "memory" if outcome.error.get("type") == "MemoryError" else "error"
    if outcome.kind == "not run":
        return "not run"
    if not shaped(outcome, expected):
        return "shape"
    if any(a is None for a in outcome.arrays):
        return "wrong"
    ok = all(close(a, e, d) for a, e, d in zip(outcome.arrays, expected, outcome.dtypes, strict=True))
    return "right" if ok else "wrong"


def agrees(outcome: Outcome, expected, right: tuple) -> bool:
    """The call gave what a variant gives: its arrays, or a shape failure where the variant has one."""
    if isinstance(expected, str):                                         # SHAPE
        return (outcome.kind == "raised" and outcome.shape_like) or outcome.kind == "other" or (
            outcome.kind == "arrays" and not shaped(outcome, right))
    if outcome.kind != "arrays" or len(outcome.arrays) != len(expected):
        return False
    return all(a is not None and close(a, e, d)
               for a, e, d in zip(outcome.arrays, expected, outcome.dtypes, strict=True))
