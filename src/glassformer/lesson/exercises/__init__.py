"""Exercises that know the mistake: per-student sheets of the lesson's arithmetic, checked cell by cell, and
the student's own code (attention, LayerNorm, a block...) run apart and checked with the mistake named.

    from glassformer.lesson.exercises import check_function
    check_function(attention, task="attention")      # a table in Jupyter: right, or the misconception

`check_function`, `check_code` and `check_source` come from judge.py, imported when first used (the
checker needs NumPy alone: no torch, no pydantic).
"""

_JUDGE = ("check_function", "check_code", "check_source")


def __getattr__(name: str):
    if name in _JUDGE:
        from . import judge
        return getattr(judge, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
