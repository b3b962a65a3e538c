"""glassformer: a complete 2017 Transformer you can train, run and watch."""

__version__ = "0.1.0"
