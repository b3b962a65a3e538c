"""The earlier import path of `greedy` and `output_limits`; decoding lives in search.py, the Translator
in translator.py. Kept while the lab still imports from here."""

from .search import greedy, output_limits

__all__ = ["greedy", "output_limits"]
