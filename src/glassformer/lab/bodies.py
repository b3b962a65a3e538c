"""What every lab endpoint shares: the lesson's default sentence, a request body checked against its schema,
and strict JSON out (no NaN or infinity)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import UsageError
from ..lesson import examples
from ..validation import Schema, type_name, validate

DEFAULT_SOURCE = examples.in_units(examples.NINE_UNITS)          # 我／昨天／给／了／他／一／本／书／。
DEFAULT_TARGET = examples.LESSON_TARGET


def lesson_text(text: str, source) -> str:
    """A lesson sentence for `source`: written in units (我／昨天／…) for glassformer's segmenter, which keeps
    typed boundaries; without the unit marks for a model that cuts its own pieces (SentencePiece: an
    imported Marian model, which would read ／ as a character)."""
    return text.replace(examples.UNIT_SEPARATOR, "") if getattr(source, "mode", "") == "sentencepiece" else text


def checked_body(schema: type[Schema], body: Any) -> Any:
    """`body` checked against `schema`; anything wrong is a UsageError naming the field ("body" when whole)."""
    if not isinstance(body, dict):
        raise UsageError(f"body must be a JSON object, got {type_name(body)}", "body")
    try:
        return validate(schema, body, "body")
    except UsageError as error:
        raise UsageError(str(error), error.field or "body") from None


def finite_json(value: Any) -> Any:
    """Replace NaN/inf anywhere in a JSON-able value by None (strict JSON has no such numbers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
