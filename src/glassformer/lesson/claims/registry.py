"""The claims' registry: a check is a function that returns a `Reading`; running it gives a `Measurement`.

A reading is data: the named values a check measured, the tolerances it applied, whether the claim
held, and a one-line `detail` template over those values ("{err:Δ}" prints a difference briefly).
`render.py` is the one place that turns measurements into text (for `glassformer verify`) or JSON
(for `verify --json` and the lab).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import nn

from ...model.hooks import HookFn, hook_names, intervene

M = TypeVar("M", bound=nn.Module)


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


# interventions a caller asked for (a bug injected through the hooks, to watch a check catch it), and the
# stack that holds them attached to every model the running check builds
_INJECTED: ContextVar[tuple[dict[str, HookFn], ExitStack] | None] = ContextVar("injected", default=None)


def injected(module: M) -> M:
    """Attach the running check's interventions to a module it built (see `run_check`); returns the module."""
    current = _INJECTED.get()
    if current is not None:
        fns, stack = current
        names = hook_names(module)
        mine = {p: fn for p, fn in fns.items() if any(fnmatch.fnmatchcase(n, p) for n in names)}
        if mine:
            stack.enter_context(intervene(module, mine))
    return module


def run_check(claim_id: str, interventions: Mapping[str, HookFn] | None = None) -> Measurement:
    """Run one check; an exception inside it is a failed check whose detail names the error.

    `interventions` (probe pattern -> fn(value, name), as for `model.intervene`) are attached, for the
    duration of the check, to every model and layer the check builds with the chapters' factories
    (`seeded_model`, `layer`): a plausible bug written as a hook, to show that the check catches it.
    """
    title, fn = CHECKS[claim_id]
    with ExitStack() as stack:
        token = _INJECTED.set((dict(interventions), stack) if interventions else None)
        try:
            result = fn()
        except Exception as error:  # a broken model must show as FAIL, not crash the report
            result = reading("error: {error}", False, error=f"{type(error).__name__}: {error}")
        finally:
            _INJECTED.reset(token)
    return Measurement(claim_id, title, dict(result.values), dict(result.tolerance), result.passed, result.detail)


def run_all() -> list[Measurement]:
    """Every claim, in the lesson's order."""
    return [run_check(claim_id) for claim_id in CHECKS]
