"""Exercises that know the mistake: per-student sheets of the lesson's arithmetic, checked cell by cell."""
