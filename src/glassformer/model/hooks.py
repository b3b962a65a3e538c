"""Hook points: a named identity at every intermediate, to record it or to replace it.

A `HookPoint` is an identity module placed where the lesson names a value (`head.1.weights`,
`ffn.hidden`, `sublayer.0.normed`, ...). Its probe name comes from the module tree, with the
`layers.` of a stack dropped: `encoder.layers.0.self_attention.head.1.weights` is the probe
`encoder.0.self_attention.head.1.weights` (docs/probes.md lists them all).

    with probes(model, "decoder.*.cross_attention.head.*.weights", "logits") as rec:
        model(src, tgt_in)
    rec["decoder.1.cross_attention.head.0.weights"]            # (batch, tgt, src), the last firing

    with intervene(model, {"encoder.0.self_attention.head.1.output": lambda v, n: torch.zeros_like(v)}):
        model(src, tgt_in)                                      # head 1 of layer 0 switched off

Patterns are fnmatch globs where `*` spans dots. Functions attached to one hook point run in the
order they were attached; a recorder attached before an intervention sees the value it replaces.
With nothing attached a hook point returns its input and costs one attribute test.
Hooks are attached to the modules themselves, not to a thread: a model shared between threads
runs one hooked pass at a time (the lab holds a lock around each use).
"""

from __future__ import annotations

import fnmatch
import re
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping

from torch import Tensor, nn

HookFn = Callable[[Tensor, str], Tensor]      # (value, probe name) -> value of the same shape

_STACK = re.compile(r"(^|\.)layers\.")


class HookPoint(nn.Module):
    """Identity at a named intermediate; attached functions may record the value or return a replacement."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name                                # replaces the attribute name in the probe name
        self.fns: list[tuple[str, HookFn]] = []        # (probe name relative to the attaching root, fn)

    def __call__(self, x: Tensor) -> Tensor:           # no nn.Module dispatch on the hot path
        return self.forward(x) if self.fns else x

    def forward(self, x: Tensor) -> Tensor:
        for name, fn in self.fns:
            out = fn(x, name)
            if out is not None:
                if out.shape != x.shape:
                    raise ValueError(f"hook on {name!r} returned shape {tuple(out.shape)}, "
                                     f"expected {tuple(x.shape)}")
                x = out
        return x

    @property
    def active(self) -> bool:
        return bool(self.fns)


def probe_name(module_path: str) -> str:
    """The probe name of a module path: the `layers.` of each stack is dropped."""
    return _STACK.sub(r"\1", module_path)


def hook_points(module: nn.Module) -> Iterator[tuple[str, HookPoint]]:
    """(probe name, hook point) of every hook point below `module`, in module order: stack by stack,
    layer by layer, each sub-module's hook points together (within a layer this is not the exact firing
    order; a Recording lists names in the order they fired)."""
    for path, sub in module.named_modules():
        if isinstance(sub, HookPoint):
            if sub.name is not None:
                path = path.rsplit(".", 1)[0] + "." + sub.name if "." in path else sub.name
            yield probe_name(path), sub


def hook_names(module: nn.Module) -> list[str]:
    """Every probe name `module` can record (names relative to `module`)."""
    return [name for name, _ in hook_points(module)]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _notify(module: nn.Module) -> None:
    """Let modules that pick a backend by what is attached (attention) look again."""
    for sub in module.modules():
        changed = getattr(sub, "hooks_changed", None)
        if callable(changed):
            changed()


@contextmanager
def _attached(module: nn.Module, pairs: list[tuple[HookPoint, str, HookFn]]) -> Iterator[None]:
    for point, name, fn in pairs:
        point.fns.append((name, fn))
    _notify(module)
    try:
        yield
    finally:
        for point, name, fn in pairs:
            for i in range(len(point.fns) - 1, -1, -1):
                if point.fns[i][1] is fn and point.fns[i][0] == name:
                    del point.fns[i]
                    break
        _notify(module)


class Recording:
    """Values recorded by `probes`: detached copies, by probe name, in the order they fired."""

    def __init__(self) -> None:
        self._values: dict[str, list[Tensor]] = {}

    def _record(self, value: Tensor, name: str) -> None:
        self._values.setdefault(name, []).append(value.detach().clone())

    def __getitem__(self, name: str) -> Tensor:
        """The last recorded value of `name` (a decoding step fires once per step)."""
        try:
            return self._values[name][-1]
        except KeyError:
            raise KeyError(f"probe {name!r} was not recorded; recorded: {len(self._values)} probes") from None

    def all(self, name: str) -> list[Tensor]:
        """Every recorded value of `name`, in firing order."""
        if name not in self._values:
            raise KeyError(f"probe {name!r} was not recorded; recorded: {len(self._values)} probes")
        return list(self._values[name])

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def names(self) -> list[str]:
        return list(self._values)

    @property
    def records(self) -> dict[str, Tensor]:
        """{name: last value}, in recording order."""
        return {name: values[-1] for name, values in self._values.items()}

    def items(self) -> Iterator[tuple[str, Tensor]]:
        """(name, last value) pairs in recording order."""
        return ((name, values[-1]) for name, values in list(self._values.items()))


@contextmanager
def probes(module: nn.Module, *patterns: str) -> Iterator[Recording]:
    """Record every hook point of `module` whose probe name matches a pattern (default: all of them).

    Names are relative to `module`. Only matching hook points are attached, so recording one block
    does not keep the whole model's activations.
    """
    flat: tuple[str, ...] = ()
    for p in patterns or ("*",):
        flat += (p,) if isinstance(p, str) else tuple(p)
    rec = Recording()
    pairs = [(point, name, rec._record) for name, point in hook_points(module) if _matches(name, flat)]
    with _attached(module, pairs):
        yield rec


@contextmanager
def intervene(module: nn.Module, fns: Mapping[str, HookFn]) -> Iterator[None]:
    """Replace values: `fns` maps a probe name or pattern to fn(value, name) -> replacement (same shape).

    A pattern that matches no hook point of `module` is a KeyError naming it (a typo would otherwise
    change nothing silently).
    """
    points = list(hook_points(module))
    pairs = []
    for pattern, fn in fns.items():
        hit = [(point, name, fn) for name, point in points if fnmatch.fnmatchcase(name, pattern)]
        if not hit:
            raise KeyError(f"no hook point matches {pattern!r}")
        pairs += hit
    with _attached(module, pairs):
        yield


class Hooked:
    """Mixin for models: `model.probes(...)`, `model.intervene(...)`, `model.hook_names()`."""

    def probes(self, *patterns: str):
        return probes(self, *patterns)

    def intervene(self, fns: Mapping[str, HookFn]):
        return intervene(self, fns)

    def hook_names(self) -> list[str]:
        return hook_names(self)
