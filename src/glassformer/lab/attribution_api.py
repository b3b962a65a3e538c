"""POST /api/attribute: the lab's "Why him" view — attribution rows, the contrast, the logit lens.

The body is checked by a pydantic schema (glassformer.validation); the work of one request is bounded
before it runs: the sentence lengths (MAX_SOURCE_CHARS, MAX_TARGET_CHARS, MAX_SENTENCE_TOKENS, the
model's max_len), the integrated-gradients steps (MAX_IG_STEPS) and rows × steps (MAX_ATTRIBUTION_PASSES).
Bad input is a UsageError, status 400 (413 over a limit), naming the field. Gradients are needed, so the model runs
under the API's lock with autograd on (no inference_mode); no parameter's .grad is touched.
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field

from .. import limits
from ..errors import UsageError
from ..interpret.attribution import DEFAULT_METHOD, DEFAULT_STEPS
from ..interpret.why import why
from ..lesson import examples
from ..validation import Schema, Text
from .bodies import DEFAULT_SOURCE, checked_body, finite_json, lesson_text

DEFAULT_CONTRAST = "her"
DIGITS = 6                          # decimals of the scores sent to the page

Method = Literal["saliency", "input-x-gradient", "integrated-gradients", "attention"]


class AttributeBody(Schema):
    """POST /api/attribute: the sentence, an optional target (else greedy), the method, a contrast word."""

    source: Text | None = None                                  # the lesson's sentence, as lesson_text writes it
    target: Text | None = examples.LESSON_TARGET
    method: Method = DEFAULT_METHOD
    contrast: Text | None = DEFAULT_CONTRAST
    steps: Annotated[int, Field(ge=1)] = DEFAULT_STEPS
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
    limits.check("steps: integrated-gradients steps", request.steps, "MAX_IG_STEPS", "steps")
    contrast = request.contrast if request.contrast is not None and request.contrast.strip() else None
    if request.method == "attention":
        contrast = None                                     # weights do not depend on the predicted token
    try:
        with api.lock, torch.enable_grad():
            result = why(lab.model, lab.source, lab.target, source, target, request.method, contrast,
                         request.steps, request.row)
    except UsageError as error:
        field = "source" if error.field == "sentence" else error.field
        raise UsageError(str(error).replace("sentence:", "source:", 1), field, status=error.status) from None
    return {"model": api.describe(lab), **finite_json(_rounded(result))}
