"""The one renderer of measurements: a text row for `glassformer verify`, a JSON row for `--json` and the lab."""

from __future__ import annotations

import math
import string
from typing import Any

from .registry import Measurement


class _DetailFormatter(string.Formatter):
    """str.format, plus the spec "Δ": a measured difference, short ("0", "3.1e-17", "inf")."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "Δ":
            return "0" if value == 0 else f"{float(value):.1e}"
        return super().format_field(value, format_spec)


_FORMATTER = _DetailFormatter()


def detail(m: Measurement) -> str:
    """The measurement's detail line, its template filled with its values."""
    try:
        return _FORMATTER.format(m.detail, **m.values)
    except (KeyError, IndexError, ValueError, TypeError) as error:   # a template mistake must not hide the verdict
        return f"{m.detail} (values {m.values!r}; {type(error).__name__})"


def _plain(value: Any) -> Any:
    """A value as strict JSON: numbers stay numbers (non-finite become null), tuples become lists."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):                        # a NumPy or torch scalar
        return _plain(value.item())
    return str(value)


def as_dict(m: Measurement) -> dict:
    """One claim as JSON: id, title, measured (the detail line), passed, values, tolerance."""
    return {"id": m.id, "title": m.title, "measured": detail(m), "passed": m.passed,
            "values": _plain(m.values), "tolerance": _plain(m.tolerance)}


def as_json(measurements: list[Measurement]) -> dict:
    """The claims table: every row, how many passed, which failed."""
    rows = [as_dict(m) for m in measurements]
    failed = [m.id for m in measurements if not m.passed]
    return {"claims": rows, "passed": len(rows) - len(failed), "total": len(rows), "failed": failed}


def as_text(measurements: list[Measurement]) -> str:
    """`glassformer verify`'s table: one row per claim, then the count."""
    lines = [f"{m.id:<3} {'PASS' if m.passed else 'FAIL'}  {m.title} | {detail(m)}" for m in measurements]
    failed = [m.id for m in measurements if not m.passed]
    lines.append(f"{len(measurements)} claims: {len(measurements) - len(failed)} PASS, {len(failed)} FAIL"
                 + (f" ({', '.join(failed)})" if failed else ""))
    return "\n".join(lines)
