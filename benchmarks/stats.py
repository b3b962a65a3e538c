"""Medians, spreads and ratios taken round by round (the systems ran back to back in each round)."""

from __future__ import annotations

from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The middle value; the mean of the two middle values for an even count."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summary(values: Sequence[float]) -> dict[str, float]:
    """{"median", "min", "max", "n"} of the samples."""
    return {"median": median(values), "min": min(values), "max": max(values), "n": len(values)}


def paired_ratios(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Round-by-round ratios ours[r] / theirs[r]: each pair ran within one round, under the same load."""
    if len(ours) != len(theirs):
        raise ValueError(f"paired ratios need as many rounds on both sides: {len(ours)} vs {len(theirs)}")
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def speedup(ours: Sequence[float], theirs: Sequence[float],
            higher_is_better: bool = True) -> dict[str, float]:
    """How many times faster `ours` is, round by round: rate ratio, or time ratio inverted; summarised."""
    ratios = paired_ratios(ours, theirs) if higher_is_better else paired_ratios(theirs, ours)
    return summary(ratios)
