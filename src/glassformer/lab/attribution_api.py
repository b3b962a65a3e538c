"""POST /api/attribute: the lab's "Why him" view — attribution rows, the contrast, the logit lens.

The body is checked by a pydantic schema (glassformer.validation); the work of one request is bounded
before it runs: the sentence lengths (MAX_SOURCE_CHARS, MAX_TARGET_CHARS, MAX_SENTENCE_TOKENS, the
model's max_len), the integrated-gradients steps (an integer up to MAX_IG_STEPS, or "auto": doubled until
every row is complete within `tolerance`, in (0, 1), up to MAX_IG_AUTO_STEPS) and the passes of all rows
(MAX_ATTRIBUTION_PASSES, and times the sentence's positions MAX_ATTRIBUTION_POSITIONS; auto stops before
them). Rows over the tolerance come back in `integration.unconverged`.
The method is one of interpret.attribution.METHODS; attention and alti do not depend on the predicted token, so
the contrast is dropped for them. Every row carries its `source_share`. Bad input is a UsageError, status 400
(413 over a limit), naming the field. Gradients are needed, so the model runs under the API's lock with autograd
on (no inference_mode); no parameter's .grad is touched.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from .. import limits
from ..errors import UsageError
from ..interpret.attribution import DEFAULT_METHOD, DEFAULT_STEPS, METHODS, check_steps
from ..interpret.integrated import DEFAULT_RULE, DEFAULT_TOLERANCE
from ..interpret.why import why
from ..lesson import examples
from ..validation import Schema, Text
from .bodies import DEFAULT_SOURCE, checked_body, finite_json, lesson_text

DEFAULT_CONTRAST = "her"
DIGITS = 6                          # decimals of the scores sent to the page

Method = Literal[METHODS]                                        # the methods interpret/attribution.py offers
Rule = Literal["trapezoid", "gauss-legendre"]


class AttributeBody(Schema):
    """POST /api/attribute: the sentence, an optional target (else greedy), the method, a contrast word."""

    source: Text | None = None                                  # the lesson's sentence, as lesson_text writes it
    target: Text | None = examples.LESSON_TARGET
    method: Method = DEFAULT_METHOD
    contrast: Text | None = DEFAULT_CONTRAST
    steps: Any = DEFAULT_STEPS                                 # an integer or "auto": check_steps says which
    tolerance: Annotated[float, Field(gt=0, lt=1)] = DEFAULT_TOLERANCE
    rule: Rule = DEFAULT_RULE
    row: Annotated[int, Field(ge=0)] | None = None


def _rounded(value):
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def attribute_endpoint(api, body) -> dict:
    """The handler behind LabAPI.attribute (api: the LabAPI, for its model, lock and error helpers)."""
    request = checked_body(AttributeBody, body)
    lab = api.lab_model
    source = lesson_text(DEFAULT_SOURCE, lab.source) if request.source is None else request.source
    limits.check("source: characters", len(source), "MAX_SOURCE_CHARS", "source")
    target = request.target if request.target is not None and request.target.strip() else None
    if target is not None:
        limits.check("target: characters", len(target), "MAX_TARGET_CHARS", "target")
    check_steps(request.steps)
    contrast = request.contrast if request.contrast is not None and request.contrast.strip() else None
    if request.method in ("attention", "alti"):
        contrast = None                                     # neither depends on the predicted token
    try:
        with api.lock, torch.enable_grad():
            result = why(lab.model, lab.source, lab.target, source, target, request.method, contrast,
                         request.steps, request.row, tolerance=request.tolerance, rule=request.rule)
    except UsageError as error:
        field = "source" if error.field == "sentence" else error.field
        raise UsageError(str(error).replace("sentence:", "source:", 1), field, status=error.status) from None
    return {"model": api.describe(lab), **finite_json(_rounded(result))}
