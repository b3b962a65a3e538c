"""The glass box: the lesson's data and numbers, trace spec v1, a float64 reference, and one check per claim.

examples   the lesson's own data (the BLOCK, the 2×3 exercise, its sentences and batch)
reference  the block in float64 NumPy from the formulas (no torch): the independent check
spec       trace spec v1: validate_spec, run_spec (the model's layers in float64)
views      the lesson's derived views, built once: the two-sentence batch and its masks, the per-row walk
claims/    one check per claim A1 … G2, one module per chapter: run_all() -> list[Measurement]
commands   `glassformer trace`, `lesson`, `verify`

Imports stay lazy so that `reference` and `examples` load without torch.
"""
