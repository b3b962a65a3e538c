"""The translator's sub-commands: train, translate, evaluate, explain (argument parsers and runners).

`train`'s flags and runner live in train_cli.py (generated from the settings schema); decoding, data and
evaluation modules are imported inside the runners.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .. import limits
from ..errors import UsageError
from ..paths import DEFAULT_MODEL, MODEL_ENV, default_model_dir
from .train_cli import add_train_arguments, train_command  # noqa: F401  (the `train` sub-command)
from .train_cli import at_least as _at_least


def _model_dir(args) -> Path:
    folder = Path(args.model) if args.model else default_model_dir()
    if not folder.exists():
        where = "--model" if args.model else (f"${MODEL_ENV}" if os.environ.get(MODEL_ENV) else "default")
        raise UsageError(f"no trained model at {folder} ({where}); train one with `make demo` "
                         "or `glassformer train --out DIR`")
    return folder


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR",
                        help=f"trained model folder (default ${MODEL_ENV} or {DEFAULT_MODEL})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")


def _add_decoding(parser: argparse.ArgumentParser, beam: int = 1) -> None:
    """The model folder and how to decode with it (translate: greedy; evaluate: beam 4, as scores are reported)."""
    _add_model(parser)
    parser.add_argument("--beam", type=_positive, default=beam,
                        help=f"beam size (default {beam}{' = greedy' if beam == 1 else '; 1 = greedy'})")
    parser.add_argument("--alpha", type=float, help="beam length penalty: score / len^alpha")
    parser.add_argument("--max-length", type=_positive, metavar="N",
                        help="most tokens generated per sentence, EOS included (default 2 x source length + 10; "
                             "at most the model's max_len)")
    from ..inference.precision import add_dtype_argument

    add_dtype_argument(parser)                                               # --dtype float32|bfloat16|int8


def _translator(args):
    """The Translator of --model and the length penalty; the beam and --max-length within their limits first."""
    from ..inference.precision import with_precision
    from .search import DEFAULT_ALPHA
    from .translator import Translator

    limits.check("--beam", args.beam, "MAX_BEAM")
    if args.max_length is not None:
        limits.check("--max-length", args.max_length, "MAX_SENTENCE_TOKENS")
    translator = Translator.load(_model_dir(args), _device(args.device))
    translator.check_max_length(args.max_length)
    translator.model = with_precision(translator.model, args.dtype)          # float32: the model itself
    return translator, DEFAULT_ALPHA if args.alpha is None else args.alpha


def _device(name: str) -> str:
    from .runtime import pick_device

    return str(pick_device(name))


_positive = _at_least(1, "a positive integer")
_non_negative = _at_least(0, "an integer >= 0")


# ---- translate -----------------------------------------------------------------------------
def add_translate_arguments(parser: argparse.ArgumentParser) -> None:
    _add_decoding(parser)
    parser.add_argument("--verbose", action="store_true", help="show units and unknown units on stderr")
    parser.add_argument("--truncate", action="store_true", help="cut input over the model's length limit")
    parser.add_argument("--batch-size", type=_positive, default=64, help="sentences per batch (default 64)")
    parser.add_argument("text", nargs="*", help="Chinese sentences (default: one per line on stdin)")


def translate_command(args) -> int:
    translator, alpha = _translator(args)
    translator.batch_size = args.batch_size
    lines = list(args.text) if args.text else [line.rstrip("\r\n") for line in sys.stdin]
    if args.verbose:
        for n, enc in enumerate(translator.analyse(lines), start=1):
            unknown = f"  unknown: {' '.join(enc.unknown)}" if enc.unknown else ""
            print(f"[{n}] {'／'.join(enc.units)}{unknown}", file=sys.stderr)
    for line in translator.translate(lines, args.beam, alpha, truncate=args.truncate, max_length=args.max_length):
        print(line)
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
    parser.add_argument("--show", type=int, default=0, metavar="N", help="also print N example translations")


def evaluate_command(args) -> int:
    from .datasets import load_split
    from .evaluate import evaluate_pairs

    if args.input == "gold" and args.split not in ("dev", "test"):
        raise UsageError(f"--input gold needs the corpus segmentation: only --split dev/test have it, not {args.split}")
    translator, alpha = _translator(args)
    folder = _model_dir(args)
    pairs = load_split(args.split)
    result = evaluate_pairs(translator, pairs, args.input, args.beam, alpha, args.max_length)
    if args.json:
        print(json.dumps({"model": str(folder), "split": args.split, "input": args.input, "beam": args.beam,
                          "alpha": alpha, "max_length": args.max_length,
                          **result.to_dict(with_hypotheses=args.hypotheses)}, ensure_ascii=False))
    else:
        print(f"{args.split} ({result.sentences} sentences, input {args.input}, beam {args.beam}): "
              f"BLEU {result.bleu:.2f}  chrF {result.chrf:.2f}")
        print(f"  {result.bleu_signature}")
        print(f"  {result.chrf_signature}")
    for pair, hyp in list(zip(pairs, result.hypotheses, strict=True))[: max(args.show, 0)]:
        print(f"  {pair.zh}\n    ref: {pair.en}\n    out: {hyp}")
    return 0


# ---- explain -------------------------------------------------------------------------------
def add_explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sentence", help="one Chinese sentence")
    parser.add_argument("--target", help="English to teacher-force (default: the model's own greedy output)")
    _add_model(parser)
    parser.add_argument("--all-layers", action="store_true", help="cross-attention of every decoder layer")
    parser.add_argument("--top", type=_positive, default=5, help="next-token candidates per row (default 5)")
    parser.add_argument("--json", action="store_true", help="print the walk as JSON")


def explain_command(args) -> int:
    from .explain import explain, render
    from .translator import Translator

    limits.check("--top", args.top, "MAX_TOP_K")
    translator = Translator.load(_model_dir(args), _device(args.device))
    units = len(translator.source.analyse(args.sentence).ids)
    if units > translator.max_source_len:                   # explain walks the whole sentence: no cutting
        raise UsageError(f"sentence: {units} units, over the model's limit of {translator.max_source_len} "
                         "source units (shorten it)")
    walk = explain(translator, args.sentence, target=args.target, all_layers=args.all_layers, top=args.top)
    from .checkpoint import origin_summary

    walk["model"] = origin_summary(_model_dir(args))
    print(json.dumps(walk, ensure_ascii=False, indent=1) if args.json else f"model: {walk['model']}\n{render(walk)}")
    return 0
