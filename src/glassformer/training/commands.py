"""`glassformer train`'s flags, generated from the settings schema (settings.py): one flag per field, its
type, choices, help text and default taken from the field; the bounds beyond a lower one are checked by
the schema after parsing (one line naming the flag, exit 2)."""

from __future__ import annotations

import argparse
import sys
import types
import typing
from typing import Any, Literal

from pydantic.fields import FieldInfo

from ..options import at_least  # noqa: F401  (the integer flags' type)
from ..threads import usable_cores
from .presets import PRESETS
from .settings import SCHEMAS, flags, preset_settings


def _plain(annotation: Any) -> Any:
    """`int | None` -> int; other annotations as they are."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def _lowest(field: FieldInfo) -> int | None:
    """The smallest integer a field accepts (from its gt / ge bound), None if unbounded below."""
    for bound in field.metadata:
        if getattr(bound, "gt", None) is not None:
            return int(bound.gt) + 1
        if getattr(bound, "ge", None) is not None:
            return int(bound.ge)
    return None


def _kind(field: FieldInfo, switch: bool) -> dict[str, Any]:
    """argparse keywords for a field's type: choices, an integer type with its lower bound, a float."""
    annotation = _plain(field.annotation)
    if annotation is bool:
        return {"action": "store_true" if switch else argparse.BooleanOptionalAction}
    if typing.get_origin(annotation) is Literal:
        return {"choices": typing.get_args(annotation)}
    if annotation is int:
        low = _lowest(field)
        words = {None: "an integer", 0: "an integer >= 0", 1: "a positive integer"}.get(low, f"an integer >= {low}")
        return {"type": int if low is None else at_least(low, words)}
    if annotation is float:
        return {"type": float}
    return {"metavar": "DIR"}


def _shown(value: Any) -> str:
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else str(value)


def _default_text(part: str, name: str, field: FieldInfo) -> str:
    """How the help shows a default: the value `glassformer train` uses (the `default` preset's), then the
    presets that set another value."""
    if name == "threads":
        return f"the {usable_cores()} usable cores here, shared by the DDP ranks"
    if part == "run" or name == "preset":
        return "" if field.default is None or name == "out" else _shown(field.default)
    values = {p: preset_settings(p) for p in PRESETS}
    values = {p: getattr(s.model if part == "model" else s, name) for p, s in values.items()}
    others = [f"{p} {_shown(v)}" for p, v in values.items() if v != values["default"]]
    return "" if values["default"] is None else _shown(values["default"]) + "".join(f"; {o}" for o in others)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `glassformer train` (and `python -m glassformer.train`), from the settings schema."""
    for dest, (part, names) in flags().items():
        field = SCHEMAS[part].model_fields[names[0]]
        # the run's switches (--resume, --quiet) are plain switches; a setting's switch can turn a preset's off
        keywords = _kind(field, switch=part == "run")
        default = _default_text(part, names[0], field)
        help_text = f"{field.description} (default {default})" if default else field.description
        parser.add_argument(f"--{dest.replace('_', '-')}", dest=dest, default=None, help=help_text, **keywords)


def train_command(args) -> int:
    from .loop import train

    return train(args)


def main(argv: list[str] | None = None) -> None:
    """`python -m glassformer.train ...` (the torchrun entry point): same options as `glassformer train`."""
    from .loop import train

    parser = argparse.ArgumentParser(prog="python -m glassformer.train",
                                     description="train the Chinese->English translator")
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    from ..errors import run_command
    sys.exit(run_command("train", lambda: train(args)))
