"""One validation layer: typed schemas (pydantic v2) checked strictly, every failure one line.

Everything a user or a file hands to glassformer (a trace spec, a lab request body, a model
folder's config.json, training settings) goes through `validate(schema, data, source)`. A schema is
a pydantic model (see `Schema`: unknown keys refused, no coercion: "128" is not 128, true is not
1) or any type pydantic understands (a dataclass, `Literal[...]`, `list[float]`). A failure becomes
a `UsageError` whose message names the source, the field path and the problem, on one line:

    spec.json: self_attention.heads[0].w_q[1][2]: expected a number, got a string ('x')

and whose `.field` is the path alone (`self_attention.heads[0].w_q[1][2]`), so the lab can answer
{"error": ..., "field": ...} and the CLI can print the line and exit 2 without parsing messages.

`load_json(raw, source)` reads JSON the same way: not UTF-8 (or UTF-16), invalid, nested too
deep, an integer too long, a lone surrogate, a key named twice in one object or NaN each become one line,
never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, TypeAdapter, ValidationError

from .errors import UsageError
from .limits import MAX_JSON_DEPTH

T = TypeVar("T")

MAX_JSON_INT_BITS = 63              # integers beyond a signed 64-bit value are refused, not rounded
_SHOW = 40                          # characters of an offending value quoted in a message


# A dataclass validated by `validate` sets `__pydantic_config__ = DATACLASS_CONFIG`: its fields are then
# checked strictly (no coercion), like a Schema's, whether it is given as a dict or as an instance.
DATACLASS_CONFIG = ConfigDict(strict=True, revalidate_instances="always", allow_inf_nan=False)


class Schema(BaseModel):
    """Base of every schema: unknown keys are errors, nothing is coerced, NaN/inf are not numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True,
                              hide_input_in_errors=False)


def _valid_unicode(text: str) -> str:
    if _has_surrogate(text):
        raise ValueError("text contains a lone surrogate (not valid Unicode)")
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]     # a string that can be encoded as UTF-8


# ---- turning a pydantic error into one line ------------------------------------------------------

def field_path(loc: Sequence[str | int]) -> str:
    """('layers', 0, 'w_q', 1) -> 'layers[0].w_q[1]'. Union branch tags (written `§name`) are left out; a key with
    a character that does not print (a line break, a tab, a control) is shown as a JSON string: ["a\\nb"], so that
    a message naming it stays one line."""
    out = ""
    for part in loc:
        if isinstance(part, str) and part.startswith("§"):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).isprintable():
            out += f"[{json.dumps(str(part))}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def type_name(value: Any) -> str:
    """How a JSON value's type is said in a message."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    names = {dict: "an object", list: "a list", tuple: "a list", str: "a string", int: "an integer",
             float: "a number"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """A short rendering of an offending value (only scalars; containers by their type)."""
    if isinstance(value, (dict, list, tuple)) or value is None:
        return type_name(value)
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and len(text) > _SHOW:
        return f"an integer of {len(text)} digits"
    if len(text) > _SHOW:
        text = text[:_SHOW] + "…"
    return f"{type_name(value)} ({text})"


_TYPE_WORDS = {
    "float_type": "a number", "int_type": "an integer", "bool_type": "true/false", "string_type": "a string",
    "list_type": "a list", "dict_type": "an object", "model_type": "an object", "dataclass_type": "an object",
    "model_attributes_type": "an object", "dataclass_exact_type": "an object", "tuple_type": "a list",
}


def problem(error: dict) -> str:
    """The problem part of one pydantic error, in the project's words."""
    kind, value = error["type"], error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "missing required key"
    if kind in ("extra_forbidden", "unexpected_keyword_argument"):
        return "unknown key"
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {_shown(value)}"
    if kind == "finite_number":
        return f"non-finite number {value!r} (expected a finite number)"
    if kind in ("too_long", "too_short"):
        actual = ctx.get("actual_length")
        bound = ctx.get("max_length") if kind == "too_long" else ctx.get("min_length")
        if kind == "too_short" and actual == 0:
            return f"empty (expected at least {bound} item{'s' if bound != 1 else ''})"
        word = "at most" if kind == "too_long" else "at least"
        return f"expected {word} {bound} items, got {actual if actual is not None else 'more'}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    message = error["msg"]
    if message.startswith("Input should be "):
        message = "expected " + message[len("Input should be "):]
    elif message:
        message = message[0].lower() + message[1:]
    return f"{message}, got {_shown(value)}"


def usage_error(error: ValidationError, source: str | None = None, *, error_type: type[UsageError] = UsageError,
                prefix: Sequence[str | int] = ()) -> UsageError:
    """The first error of a ValidationError as one UsageError (source: field: problem)."""
    errors = error.errors(include_url=False)
    # the shallowest problem first: a missing or unknown top-level key before a detail deep inside
    first = min(errors, key=lambda e: len([p for p in e["loc"] if not (isinstance(p, str) and p.startswith("§"))]))
    field = field_path([*prefix, *first["loc"]]) or None
    parts = [p for p in (source, field, problem(first)) if p]
    message = ": ".join(parts)
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return error_type(message, field)


@lru_cache(maxsize=None)
def _adapter(schema: Any) -> TypeAdapter:
    return TypeAdapter(schema)


def validate(schema: type[T] | Any, data: Any, source: str | None = None, *,
             error_type: type[UsageError] = UsageError, strict: bool = True) -> T:
    """`data` checked against `schema` (a pydantic model, dataclass or type); bad data is one UsageError.

    `source` (a file name, "request body", "--settings") starts the message; `error_type` lets a
    caller raise its own UsageError subclass (SpecError, ConfigError).
    """
    if dataclasses.is_dataclass(schema) and isinstance(data, dict):
        data = _dataclass_from_dict(schema, data, source, error_type)
    try:
        return _adapter(schema).validate_python(data, strict=strict)
    except ValidationError as error:
        raise usage_error(error, source, error_type=error_type) from None
    except RecursionError:
        raise error_type(": ".join(p for p in (source, "nested too deeply") if p)) from None


def _dataclass_from_dict(schema: Any, data: dict, source: str | None, error_type: type[UsageError]) -> Any:
    """A dataclass instance from a dict (unknown and missing keys named), for strict revalidation."""
    fields = [f for f in dataclasses.fields(schema) if f.init]
    names = {f.name for f in fields}
    for key in data:
        if key not in names:
            raise error_type(": ".join(p for p in (source, str(key), "unknown key") if p), str(key))
    for f in fields:
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise error_type(": ".join(p for p in (source, f.name, "missing required key") if p), f.name)
    return schema(**data)


# ---- reading JSON safely -------------------------------------------------------------------------

def decode_text(raw: bytes, source: str, *, error_type: type[UsageError] = UsageError) -> str:
    """UTF-8 bytes (an optional BOM is dropped) as text; UTF-16/32 or invalid bytes are one line."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")) or (len(raw) >= 2 and (raw[0] == 0 or raw[1] == 0)):
        raise error_type(f"{source}: the file is UTF-16 or UTF-32 encoded; save it as UTF-8")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise error_type(f"{source}: not UTF-8 text (invalid byte 0x{raw[error.start]:02x} at offset "
                         f"{error.start})") from None


def check_json_tree(value: Any, source: str, *, max_depth: int = MAX_JSON_DEPTH,
                    error_type: type[UsageError] = UsageError) -> None:
    """Refuse nesting beyond `max_depth`, integers beyond 64 bits and strings with lone surrogates.

    Iterative (a hostile document cannot exhaust the stack); the message names the field path.
    """
    stack: list[tuple[Any, tuple, int]] = [(value, (), 0)]
    while stack:
        item, loc, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= max_depth:
                raise error_type(f"{source}: {field_path(loc) or 'document'}: nested deeper than {max_depth} "
                                 "levels (limit MAX_JSON_DEPTH)", field_path(loc) or None)
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str) and _has_surrogate(key):
                    raise error_type(f"{source}: {field_path(loc) or 'document'}: a key contains a lone "
                                     "surrogate (not valid Unicode)", field_path(loc) or None)
                stack.append((child, (*loc, key), depth + 1))
        elif isinstance(item, str):
            if _has_surrogate(item):
                where = field_path(loc) or "document"
                raise error_type(f"{source}: {where}: text contains a lone surrogate (not valid Unicode)",
                                 field_path(loc) or None)
        elif isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > MAX_JSON_INT_BITS:
            where = field_path(loc) or "document"
            raise error_type(f"{source}: {where}: integer too large ({len(str(item))} digits; at most 64-bit "
                             "values)", field_path(loc) or None)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _DuplicateKey(Exception):
    """A JSON object that names one key twice (Python's reader would keep the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise _DuplicateKey(next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1))
    return value


def load_json(raw: bytes | str, source: str, *, max_depth: int = MAX_JSON_DEPTH,
              error_type: type[UsageError] = UsageError) -> Any:
    """Parse JSON from bytes or text into plain Python values; anything wrong is one `error_type` line.

    Encoding (UTF-8 only), syntax (line and column), nesting deeper than `max_depth`, integers of more
    than 64 bits, lone surrogates and a key named twice in one object are all refused with the source named.
    NaN and Infinity are read as floats so that the schema refuses them naming the field (every Schema refuses
    non-finite numbers).
    """
    text = decode_text(raw, source, error_type=error_type) if isinstance(raw, (bytes, bytearray)) else raw
    if not text.strip():
        raise error_type(f"{source}: empty; expected a JSON document")
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as error:
        raise error_type(f"{source}: key {error.args[0]!r} appears twice in one object (which to take is "
                         "ambiguous)", str(error.args[0])) from None
    except json.JSONDecodeError as error:
        raise error_type(f"{source}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise error_type(f"{source}: nested deeper than {max_depth} levels (limit MAX_JSON_DEPTH)") from None
    except ValueError as error:          # an integer of over 4,300 digits
        text = str(error)
        if "integer string conversion" in text:
            text = "an integer has more than 4,300 digits"
        raise error_type(f"{source}: {text}") from None
    check_json_tree(value, source, max_depth=max_depth, error_type=error_type)
    return value
