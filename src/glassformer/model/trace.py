"""Named probes and the Trace record they fill.

Probe names are dotted and shaped like the model, e.g. `encoder.0.self_attention.head.1.weights`.
A Trace keeps only the probes that match its patterns (fnmatch globs: `*` spans dots), so
tracing one block does not store the whole model's activations.
"""

from __future__ import annotations

import fnmatch
import re

from torch import Tensor

_WILDCARD = re.compile(r"[*?\[]")


class Trace:
    """Records intermediates whose probe names match any of `patterns` (default: everything)."""

    def __init__(self, patterns: str | list[str] | tuple[str, ...] = "*") -> None:
        self.patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        self.records: dict[str, Tensor] = {}
        self._literal = [_WILDCARD.split(p, 1)[0] for p in self.patterns]
        self._cache: dict[str, bool] = {}

    def wants(self, name: str) -> bool:
        """True if the probe `name` is to be recorded."""
        hit = self._cache.get(name)
        if hit is None:
            hit = any(fnmatch.fnmatchcase(name, p) for p in self.patterns)
            self._cache[name] = hit
        return hit

    def wants_under(self, prefix: str) -> bool:
        """True if some probe below `prefix` (a module's name) might be recorded."""
        dotted = prefix + "."
        return any(lit.startswith(dotted) or dotted.startswith(lit) or lit == prefix
                   for lit in self._literal)

    def record(self, name: str, value: Tensor) -> None:
        if self.wants(name):
            self.records[name] = value.detach().clone()

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.records[name]
        except KeyError:
            raise KeyError(f"probe {name!r} was not recorded; recorded: {len(self.records)} probes") from None

    def __contains__(self, name: str) -> bool:
        return name in self.records

    def names(self) -> list[str]:
        return list(self.records)


def child(trace: Trace | None, prefix: str) -> Trace | None:
    """The trace to hand to a sub-module named `prefix`, or None if nothing below it is wanted."""
    return trace if trace is not None and trace.wants_under(prefix) else None


def join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
