"""Named limits on the work a user or a file can ask for, checked before anything is allocated.

Every size that comes from outside (a trace spec, a lab request, a model folder) is compared with
one of these constants first; going over one is a `LimitError` (a UsageError: exit 2 in the CLI,
HTTP 413 in the lab) whose message names the constant. They are documented in docs/limits.md.
For trusted local input the CLI's `--no-limits` lifts them (`lifted()`); the lab never does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from .errors import UsageError

# ---- any JSON document (trace spec, request body, config.json, vocab.json) ----------------------
MAX_JSON_DEPTH = 64                  # nesting of arrays and objects
MAX_SPEC_FILE_BYTES = 4 << 20        # a trace-spec file read by `glassformer trace` (4 MiB)

# ---- trace spec (`glassformer trace`, POST /api/trace) ----------------------------------------
MAX_SPEC_ROWS = 256                  # rows of q, k, v, x, memory (n and m)
MAX_SPEC_WIDTH = 512                 # columns: d, d_k, d_v, d_ff
MAX_SPEC_HEADS = 32                  # heads of one attention sub-layer
MAX_MATRIX_ELEMENTS = 65_536         # numbers in any one matrix, given or computed (n·m scores, n·d_ff hidden)
MAX_SPEC_MAGNITUDE = 1e12            # |any number| of a matrix or vector: every intermediate stays finite in float64
MAX_OUTPUT_ELEMENTS = 1_000_000      # numbers in a whole trace answer (about 20 MB of JSON)
MAX_JSON_INDENT = 16                 # `trace --indent`: spaces per nesting level of the printed JSON

# ---- exercise sheets (`exercise new`, `exercise check`) ---------------------------------------
MAX_SHEET_FILE_BYTES = 256 << 10     # an exercise.json, sheet.json or answers file (256 KiB)
MAX_SHEET_ROWS = 8                   # rows of q, k, v or x on a sheet (it is computed by hand)
MAX_SHEET_WIDTH = 8                  # columns of q, k, v, x and d_ff on a sheet
MAX_SHEET_HEADS = 4                  # heads of a block sheet
MAX_SHEET_DECIMALS = 8               # decimals a sheet asks for
MAX_SHEET_COUNT = 500                # sheets one `exercise new --count` writes (a class set)

# ---- a student's code (`exercise check-code`, check_function): the file, and the process that runs it --
MAX_CODE_FILE_BYTES = 256 << 10      # a student's .py file (256 KiB)
MAX_CODE_SEEDS = 100                 # seeds one check runs (each its own probes, all in one process)
MAX_CODE_LOAD_SECONDS = 10           # wall clock: the process starts and runs the file's top level (its imports)
MAX_CODE_CALL_SECONDS = 5            # wall clock: one call of the student's function on one probe
MAX_CODE_TOTAL_SECONDS = 20          # wall clock: the whole run, every call together
MAX_CODE_CPU_SECONDS = 20            # CPU time of the process (RLIMIT_CPU)
MAX_CODE_MEMORY_BYTES = 1 << 30      # address space the process may grow by once started (RLIMIT_AS, 1 GiB)
MAX_CODE_WRITE_BYTES = 16 << 20      # any one file the process writes, its printed output included (RLIMIT_FSIZE)
MAX_CODE_OPEN_FILES = 64             # file descriptors of the process (RLIMIT_NOFILE)
MAX_CODE_OUTPUT_BYTES = 64 << 10     # printed output kept of stdout and of stderr each (the rest is counted)
MAX_CODE_ANSWER_BYTES = 8 << 20      # what the process answers (every probe's returned arrays)
MAX_CODE_ANSWER_ELEMENTS = 100_000   # numbers read back of one returned array (a larger one: its shape only)

# ---- one sentence (`translate`, `explain`, POST /api/sentence) --------------------------------
MAX_SOURCE_CHARS = 400               # characters of one source sentence in the lab
MAX_TARGET_CHARS = 800               # characters of one target sentence in the lab
MAX_SENTENCE_TOKENS = 512            # units / tokens of one sentence on either side
MAX_TOP_K = 20                       # candidates listed per target row
MAX_BEAM = 32                        # beam size of `translate` / `evaluate`
MAX_ALPHA = 10                       # --alpha, the length penalty: 0..MAX_ALPHA (score / len^alpha stays finite)
MAX_LINE_CHARS = 100_000             # characters of one input line of `translate`, checked before it is segmented

# ---- attribution (`attribute`, POST /api/attribute) ------------------------------------------
MAX_IG_STEPS = 256                   # integrated-gradients steps (Gauss–Legendre nodes) per row
MAX_ATTRIBUTION_PASSES = 8192        # sentence copies one request runs forward and backward (rows × steps)
MAX_ATTRIBUTION_POSITIONS = 1 << 20  # passes × (source + target positions): a long sentence, fewer passes
MAX_IG_AUTO_STEPS = 1024             # steps `--steps auto` may double a row to (within MAX_ATTRIBUTION_PASSES)

# ---- word alignment (`align --gold`) ----------------------------------------------------------
MAX_ALIGN_PAIRS = 1000               # gold pairs one `align --gold` run aligns (every method, every pair)

# ---- the hallucination signal (`hallucination`) -----------------------------------------------
MAX_HALLUCINATION_SENTENCES = 2000   # pairs one `hallucination` run scores (three targets each, every method)

# ---- model folders (config.json, model.safetensors, vocab.json) ------------------------------
MAX_D_MODEL = 4096
MAX_LAYERS = 48                      # encoder or decoder layers
MAX_HEADS = 64
MAX_D_FF = 16384                     # also bounds d_k and d_v
MAX_LEN = 8192                       # max_len: positions a model handles
MAX_VOCAB = 262_144                  # src_vocab, tgt_vocab, and the entries of vocab.json
MAX_PARAMETERS = 400_000_000         # parameters of a whole translator (1.6 GB in float32)
MAX_CONFIG_BYTES = 64 << 10          # config.json
MAX_STATE_BYTES = 8 << 20            # a run's state.json (a random state of ~40 KB for each training process)
MAX_VOCAB_BYTES = 32 << 20           # vocab.json / target tokenizer file / a SentencePiece model
MAX_WEIGHTS_BYTES = 2 << 30          # a weights file read by `glassformer import` (2 GiB)

_ENFORCED: ContextVar[bool] = ContextVar("glassformer_limits_enforced", default=True)


class LimitError(UsageError):
    """A size over one of the named limits; HTTP status 413."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message, field, status=413)


def enforced() -> bool:
    """Whether the limits apply here (they do unless inside `lifted()`)."""
    return _ENFORCED.get()


@contextlib.contextmanager
def lifted() -> Iterator[None]:
    """Run a block without the work limits (the CLI's --no-limits, for trusted local input)."""
    token = _ENFORCED.set(False)
    try:
        yield
    finally:
        _ENFORCED.reset(token)


def check(what: str, value: int, limit: str, field: str | None = None) -> None:
    """Raise LimitError when `value` exceeds the constant named `limit` (e.g. "MAX_SPEC_ROWS").

    `what` says what was counted ("q: rows"); the message names the limit so a user can look it up.
    """
    bound = globals()[limit]
    if value > bound and enforced():
        raise LimitError(f"{what} is {value:,}; the limit is {bound:,} ({limit})", field)
