"""The decoding sub-commands: translate and evaluate (argument parsers and runners).

Decoding, data and evaluation modules are imported inside the runners, so `--help` stays light.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing
import re
import sys
import warnings

from .. import limits
from ..errors import UsageError
from ..options import add_model_arguments, device_name, model_dir, non_negative, positive
from .choices import AUTO_BATCHES_A_WORKER, AUTO_MIN_SENTENCES, AUTO_MOST_WORKERS, BATCH_SIZE, DEFAULT_STOP, STOP_RULES

OWN_PROCESS = False     # cli.run sets it: the command owns its process, whose objects may be frozen (gc)


def _add_decoding(parser: argparse.ArgumentParser, beam: int = 1) -> None:
    """The model folder and how to decode with it (translate: greedy; evaluate: beam 4, as scores are reported)."""
    add_model_arguments(parser)
    parser.add_argument("--beam", type=positive, default=beam,
                        help=f"beam size (default {beam}{' = greedy' if beam == 1 else '; 1 = greedy'})")
    parser.add_argument("--alpha", type=_alpha_option,
                        help=f"beam length penalty: score / len^alpha, a number from 0 to {limits.MAX_ALPHA} "
                             "(default 1.0)")
    parser.add_argument("--stop", choices=STOP_RULES, default=DEFAULT_STOP,
                        help="when a sentence's beam search ends: bound (default) = when no live beam can still "
                             "beat the best finished one; full = also once K hypotheses have finished (fairseq's, "
                             "and CTranslate2's with a length penalty); top = also once a step's best candidate "
                             "has finished (OpenNMT-py's): fewer steps, sometimes a worse translation")
    parser.add_argument("--max-length", type=positive, metavar="N",
                        help="most tokens generated per sentence, EOS included (default 2 x source length + 10; "
                             "at most the model's max_len)")
    add_dtype_argument(parser)                                               # --dtype float32|bfloat16|int8
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="run the decoding step compiled ahead of time (needs a C++ compiler; built once per "
                             "model, beam size and batch shape, about a minute each, then loaded from the cache): "
                             "auto (default) = the packages built before, the shapes without one eagerly (jobs over "
                             f"{AUTO_MIN_SENTENCES} sentences build them); on = build what the job needs; off = "
                             "eager; the same tokens")
    parser.add_argument("--workers", type=_workers_option, default="auto", metavar="N|auto",
                        help="decode a job's batches in N processes at once, this one and N - 1 helpers, one thread "
                             "each (at most the usable cores): faster for jobs of thousands of sentences; the helpers "
                             f"start while this process loads the model. auto (default): a process for every "
                             f"{AUTO_BATCHES_A_WORKER} batches of the job, at most the usable cores and "
                             f"{AUTO_MOST_WORKERS}, on the CPU (else 1)")
    parser.add_argument("--compile-cache", metavar="DIR",
                        help="where compiled decoding steps are kept (default $TORCHINDUCTOR_CACHE_DIR, else "
                             "~/.cache/glassformer/inductor)")


def _workers_option(text: str) -> str | int:
    """--workers: "auto" or a positive count."""
    if text == "auto":
        return text
    try:
        return positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected auto or a positive integer, got {text!r}") from None


def _alpha_option(text: str) -> float:
    """--alpha: a finite number from 0 to MAX_ALPHA (limits.py), else one line naming the range. Beyond it len^alpha
    overflows a float (--alpha 1000 was an OverflowError traceback from the search); nan, inf and a negative
    exponent are no length penalty (docs/translator.md tests 0..2). A range of values, not a work limit: --no-limits
    does not lift it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= limits.MAX_ALPHA:                                  # false for nan too
        raise argparse.ArgumentTypeError(f"expected a number from 0 to {limits.MAX_ALPHA} (MAX_ALPHA), got {text!r}")
    return value


def auto_workers(sentences: int, batch_size: int, cores: int) -> int:
    """--workers auto: a process for every AUTO_BATCHES_A_WORKER batches of a job of `sentences`, at most `cores`
    and AUTO_MOST_WORKERS, at least one (a short job: this process alone, on every core)."""
    batches = -(-sentences // batch_size)
    return max(1, min(cores, AUTO_MOST_WORKERS, batches // AUTO_BATCHES_A_WORKER))


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """The `--dtype` option of translate / evaluate (the Translator's `precision`)."""
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "int8"), default="float32",
                        help="precision of the decoding products: float32 (default, the reference), bfloat16 "
                             "(bf16 products, fp32 LayerNorm/softmax) or int8 (int8 weights per output channel, "
                             "dynamically quantised activations); fast only where the CPU has AVX-512-BF16/AMX "
                             "or VNNI (docs/precision.md)")


def _translator(args, sentences: int):
    """The Translator of --model and the length penalty; the beam and --max-length within their limits first. With
    --workers N and a job of more than one batch of `sentences`, its N - 1 helpers are started first (`_helpers`),
    each loading the model itself while this process does (decoding/workers.py), and this process decodes on one
    thread. In a process of its own (`cli.run`: OWN_PROCESS), once the model is loaded the objects made so far are
    frozen (`gc.freeze`): the interpreter's full collections, which a long job's allocations set off (two in a
    5,120-sentence job, one at exit), walked every object of torch and the model, ~0.1 s each (docs/performance.md);
    a caller's process (a test calling `main`) keeps its collector as it was."""
    limits.check("--beam", args.beam, "MAX_BEAM")
    if args.max_length is not None:
        limits.check("--max-length", args.max_length, "MAX_SENTENCE_TOKENS")
    workers, compile = _workers(args, sentences), getattr(args, "compile", "off")
    if compile != "off":
        warnings.filterwarnings("ignore", category=FutureWarning)            # torch's own, while tracing
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)   # inductor's, while tuning
    helpers = _helpers(args, workers, sentences, compile)

    from .search import DEFAULT_ALPHA
    from .translator import Translator

    _decoding_threads(args, sentences, helpers is not None)     # before the load: beside a helper, one thread (two
    translator = Translator.load(model_dir(args), device_name(args.device))   # loaded 0.07 s slower, contending)
    if OWN_PROCESS:
        gc.freeze()                 # torch's and the model's objects out of the collector's full passes (~0.1 s each)
    translator.check_max_length(args.max_length)
    translator.precision = args.dtype
    translator.decoding_model()                                              # its copy now: a bad dtype, exit 2
    translator.compile, translator.notes = compile, _stderr_note
    if compile != "off":
        translator.compile_cache = _compile_cache(getattr(args, "compile_cache", None))
    translator.stop = getattr(args, "stop", translator.stop)
    translator.workers = workers
    if helpers is not None:
        translator.threads = 1                                               # its packages: the helpers' own
        translator.use_workers(helpers)
    return translator, DEFAULT_ALPHA if args.alpha is None else args.alpha


def _workers(args, sentences: int) -> int:
    """The processes a job of `sentences` decodes in: --workers N (within the usable cores), or auto's count
    (`auto_workers`) where its helpers can start cheaply: a CPU job in a command that can fork them before torch has
    run (else 1: a caller that imported torch, as a test does, keeps its process to itself)."""
    from ..threads import usable_cores
    from .workers import check_workers

    requested = getattr(args, "workers", 1)
    if requested != "auto":
        return check_workers(requested)
    forks = "torch" not in sys.modules and "fork" in multiprocessing.get_all_start_methods()
    if not forks or args.device != "cpu":                            # (another device: asked without torch)
        return 1
    return auto_workers(sentences, getattr(args, "batch_size", BATCH_SIZE), usable_cores())


def _helpers(args, workers: int, sentences: int, compile: str):
    """The helper processes of --workers, for a CPU job of more than one batch (else None), started before this
    process loads the model: forked once torch is imported (where the platform forks and torch has not run here:
    the command's own start), else spawned now, before torch loads here."""
    import functools

    from .workers import Workers

    if workers < 2 or sentences <= getattr(args, "batch_size", BATCH_SIZE) or device_name(args.device) != "cpu":
        return None
    recipe = functools.partial(helper_translator, str(model_dir(args)), "cpu", args.dtype, compile,
                               getattr(args, "compile_cache", None),
                               (args.beam, getattr(args, "batch_size", BATCH_SIZE), sentences))
    if "torch" in sys.modules or "fork" not in multiprocessing.get_all_start_methods():   # torch may have run here
        return Workers(recipe, workers)                                  # a fresh interpreter each, started now
    import torch  # noqa: F401  (imported once, then forked: a helper skips its own import, no start contends with it)

    if OWN_PROCESS:
        gc.freeze()                 # what both share, never walked again by a full collection (nor copied on write)
    return Workers(recipe, workers, method="fork")


def helper_translator(folder: str, device: str, precision: str, compile: str, compile_cache: str | None,
                      job: tuple[int, int, int] | None = None):
    """A helper's Translator, made in the helper: the model loaded from its run folder, at `precision`, its packages
    kept under `compile_cache` (--compile-cache; None: the default folder); `job`: the (beam, batch size, sentences)
    of the command's job, which the helper gets ready for while it waits for it (`Translator.warm`)."""
    from ..inference.compiler import cache_folder
    from .translator import Translator

    translator = Translator.load(folder, device)
    translator.precision, translator.compile = precision, compile
    translator.compile_cache = str(cache_folder(compile_cache)) if compile != "off" else None
    translator.decoding_model()                                      # its copy at `precision`, while still starting
    translator.expected = job
    return translator


def _stderr_note(line: str) -> None:
    print(f"glassformer: {line}", file=sys.stderr)


def _compile_cache(folder: str | None) -> str:
    """--compile-cache, else the default (inference.compiler.cache_folder): refused in one line when a file
    stands in its way; made only when a package is built. Inductor's own kernel cache goes there too
    (TORCHINDUCTOR_CACHE_DIR, set here, at the command's start)."""
    from ..inference.compiler import cache_folder, use_compile_cache

    path = cache_folder(folder)
    blocked = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise UsageError(f"--compile-cache: cannot use {path}: {blocked} is not a folder", "compile_cache")
    return str(use_compile_cache(path))


def _decoding_threads(args, sentences: int, helpers: bool = False) -> None:
    """The command's thread count (threads.py): one for steps of a few rows or beside --workers' helpers (each
    process a core), else every core it may use."""
    import torch

    from ..threads import decoding_threads

    rows = min(sentences, getattr(args, "batch_size", BATCH_SIZE)) * args.beam
    torch.set_num_threads(1 if helpers else decoding_threads(rows))


# ---- translate -----------------------------------------------------------------------------
def add_translate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_decoding(parser)
    parser.add_argument("--verbose", action="store_true", help="show units and unknown units on stderr")
    parser.add_argument("--truncate", action="store_true",
                        help=f"cut input over the model's length limit (a line over MAX_LINE_CHARS = "
                             f"{limits.MAX_LINE_CHARS:,} characters to that many before it is segmented)")
    parser.add_argument("--batch-size", type=positive, default=BATCH_SIZE,
                        help=f"sentences per batch (default {BATCH_SIZE})")
    parser.add_argument("text", nargs="*", help="Chinese sentences (default: one per line on stdin)")


NOT_UTF8 = re.compile("[\udc80-\udcff]")    # a byte that is not UTF-8, as Python keeps it (stdin, the arguments)


def utf8_lines(lines: list[str]) -> list[str]:
    """`lines`, or a UsageError naming the first line that is not UTF-8 text and its byte."""
    if NOT_UTF8.search("".join(lines)):
        n, line = next((n, line) for n, line in enumerate(lines, start=1) if NOT_UTF8.search(line))
        byte = ord(NOT_UTF8.search(line).group()) - 0xDC00
        raise UsageError(f"input line {n} is not UTF-8 text (byte 0x{byte:02x})")
    return lines


def translate_command(args) -> int:
    lines = utf8_lines(list(args.text) if args.text else [line.rstrip("\r\n") for line in sys.stdin])
    translator, alpha = _translator(args, sum(1 for line in lines if line.strip()))
    try:
        translator.batch_size, translator.final = args.batch_size, True          # one job: its helpers end with it
        if args.verbose:
            for n, enc in enumerate(translator.analyse(lines, args.truncate), start=1):
                unknown = f"  unknown: {' '.join(enc.unknown)}" if enc.unknown else ""
                print(f"[{n}] {'／'.join(enc.units)}{unknown}", file=sys.stderr)
        translated = translator.translate(lines, args.beam, alpha, truncate=args.truncate, max_length=args.max_length)
    finally:
        translator.close()                       # its helpers and packages let go now (cli.run: a quick exit)
    sys.stdout.write("".join(f"{line}\n" for line in translated))
    return 0


# ---- evaluate ------------------------------------------------------------------------------
EVALUATE_BEAM = 4   # scores are reported with beam 4 (the common setting); --beam 1 gives greedy's
def add_evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_decoding(parser, beam=EVALUATE_BEAM)
    parser.add_argument("--split", choices=("dev", "test", "tatoeba", "everyday"), default="test",
                        help="dev / test: HSK; tatoeba: held-out Tatoeba slice; everyday: 20 own sentences "
                             "(default test)")
    parser.add_argument("--input", choices=("raw", "gold"), default="raw",
                        help="raw: segment the Chinese like user input (default); gold: corpus segmentation")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--hypotheses", action="store_true", help="with --json: every translation too, in order")
    parser.add_argument("--show", type=non_negative, default=0, metavar="N", help="also print N example translations")


def evaluate_command(args) -> int:
    # no torch before `_translator`: its helpers fork first (evaluate_pairs imports it, after)
    from ..data.datasets import load_split

    if args.input == "gold" and args.split not in ("dev", "test"):
        raise UsageError(f"--input gold needs the corpus segmentation: only --split dev/test have it, not {args.split}")
    folder = model_dir(args)
    pairs = load_split(args.split)
    translator, alpha = _translator(args, len(pairs))
    from .evaluate import evaluate_pairs

    translator.final = True                                                  # one job: its helpers end with it
    try:
        result = evaluate_pairs(translator, pairs, args.input, args.beam, alpha, args.max_length)
    finally:
        translator.close()                       # its helpers and packages let go now (cli.run: a quick exit)
    if args.json:
        print(json.dumps({"model": str(folder), "split": args.split, "input": args.input, "beam": args.beam,
                          "alpha": alpha, "stop": translator.stop, "max_length": args.max_length,
                          **result.to_dict(with_hypotheses=args.hypotheses)}, ensure_ascii=False))
    else:
        print(f"{args.split} ({result.sentences} sentences, input {args.input}, beam {args.beam}): "
              f"BLEU {result.bleu:.2f}  chrF {result.chrf:.2f}")
        print(f"  {result.bleu_signature}")
        print(f"  {result.chrf_signature}")
    for pair, hyp in list(zip(pairs, result.hypotheses, strict=True))[: max(args.show, 0)]:
        print(f"  {pair.zh}\n    ref: {pair.en}\n    out: {hyp}")
    return 0
