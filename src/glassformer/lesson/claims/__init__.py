"""One check per claim of the lesson (A1 … G2), computed with the model's own code, one module per chapter.

attention   A  attention arithmetic            masks      E  batches and masks
blocks      B  multi-head attention, the block families   F  model families
positions   C  order and positions             lab        G  diagnosis
translator  D  the whole encoder–decoder

Each check runs the project's layers (glassformer.model, or trace spec v1 on top of them) and compares
the result with the number the lesson prints, with an independent formula (reference.py, or a few
lines of NumPy written out), or with a structural property; none asserts the lesson's numbers against
themselves. A check returns a `Reading` (values, tolerances, verdict, a detail template); `run_check`
makes it a `Measurement`; `render` prints the table for `glassformer verify` and the JSON for the lab.
"""

from __future__ import annotations

from . import attention, blocks, families, lab, masks, positions, translator  # noqa: F401  (registers, A … G)
from .common import seeded_model, source_ids, target_ids
from .registry import CHECKS, Measurement, Reading, check, injected, reading, run_all, run_check
from .render import as_dict, as_json, as_text, detail

__all__ = ["CHECKS", "Measurement", "Reading", "as_dict", "as_json", "as_text", "check", "detail", "injected",
           "reading", "run_all", "run_check", "seeded_model", "source_ids", "target_ids"]
