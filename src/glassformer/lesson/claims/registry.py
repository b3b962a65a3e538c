"""The claims' registry: a check is a function that returns a `Reading`; running it gives a `Measurement`.

A reading is data: the named values a check measured, the tolerances it applied, whether the claim
held, and a one-line `detail` template over those values ("{err:Δ}" prints a difference briefly).
`render.py` is the one place that turns measurements into text (for `glassformer verify`) or JSON
(for `verify --json` and the lab).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reading:
    """What one check measured: values by name, tolerances by name, the verdict, a detail template."""

    detail: str
    passed: bool
    values: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=dict)


def reading(detail: str, passed: bool, *, tolerance: dict[str, float] | None = None, **values: Any) -> Reading:
    """A check's result: `detail` is a str.format template over `values` (spec "Δ": a short difference)."""
    return Reading(detail, bool(passed), values, dict(tolerance or {}))


@dataclass(frozen=True)
class Measurement:
    """One verified claim: its ID and title, and the check's reading (or the error that stopped it)."""

    id: str
    title: str
    values: dict[str, Any]
    tolerance: dict[str, float]
    passed: bool
    detail: str


CHECKS: dict[str, tuple[str, Callable[[], Reading]]] = {}


def check(claim_id: str, title: str):
    """Register a check for a claim of the lesson; CHECKS stays in the lesson's order (A1 … G2)."""
    def register(fn: Callable[[], Reading]) -> Callable[[], Reading]:
        CHECKS[claim_id] = (title, fn)
        ordered = sorted(CHECKS.items(), key=lambda item: (item[0][0], int(item[0][1:])))   # A1 … A7, B1 …
        CHECKS.clear()
        CHECKS.update(ordered)
        return fn
    return register


_THREADS_LOCK = threading.Lock()
_THREADS_STATE = {"depth": 0, "saved": 1}


@contextlib.contextmanager
def one_thread():
    """The checks' tensors are tiny: one thread avoids contention overhead (seconds on a busy 2-core machine).

    Nested and concurrent uses share one count: the first entrant saves torch's thread count and
    the last one out restores it.
    """
    import torch
    with _THREADS_LOCK:
        if _THREADS_STATE["depth"] == 0:
            _THREADS_STATE["saved"] = torch.get_num_threads()
            torch.set_num_threads(1)
        _THREADS_STATE["depth"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_STATE["depth"] -= 1
            if _THREADS_STATE["depth"] == 0:
                torch.set_num_threads(_THREADS_STATE["saved"])


def run_check(claim_id: str) -> Measurement:
    """Run one check; an exception inside it is a failed check whose detail names the error."""
    title, fn = CHECKS[claim_id]
    try:
        with one_thread():
            result = fn()
    except Exception as error:  # a broken model must show as FAIL, not crash the report
        result = reading("error: {error}", False, error=f"{type(error).__name__}: {error}")
    return Measurement(claim_id, title, dict(result.values), dict(result.tolerance), result.passed, result.detail)


def run_all() -> list[Measurement]:
    """Every claim, in the lesson's order."""
    return [run_check(claim_id) for claim_id in CHECKS]
