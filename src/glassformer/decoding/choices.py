"""Decoding's named choices, light to import: the commands build their options from them before torch loads (so
--workers' helpers start at once: decoding/workers.py)."""

STOP_RULES = ("bound", "full", "top")   # when a sentence's beam search is done (decoding/search.py's docstring)
DEFAULT_STOP = "bound"
AUTO_MIN_SENTENCES = 20_000    # auto builds for jobs that win a build back (~45 s: ~19,000 sentences at beam 4)
AUTO_BATCHES_A_WORKER = 8     # --workers auto: a process for every 8 batches of the job (fewer: a wash, a big
AUTO_MOST_WORKERS = 8         # job: +30 %; docs/performance.md), at most the usable cores and this many
BATCH_SIZE = 64               # sentences a batch: the Translator's default, translate's --batch-size (evaluate uses it)
