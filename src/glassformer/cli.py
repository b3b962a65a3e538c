"""The `glassformer` command: thin — it parses arguments and calls the wing that does the work.

Each sub-command lives in its wing as a pair `add_<name>_arguments(parser)` / `<name>_command(args) -> int`.
Only the module of the sub-command named on the command line is imported, to build its arguments and run
it (so `glassformer trace` never loads the translator; `glassformer --help` loads none).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys

from . import limits
from .errors import run_command

# name -> (module, help). The module defines add_<name>_arguments(parser) and <name>_command(args).
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("glassformer.lesson.commands", "run a trace-spec v1 JSON file in float64, print the JSON trace"),
    "lesson": ("glassformer.lesson.commands", "the lesson's worked examples, computed by the model code"),
    "verify": ("glassformer.lesson.commands", "check every claim of the lesson (A1...G2), one row each"),
    "exercise": ("glassformer.lesson.exercises.commands", "per-student sheets of the lesson's arithmetic, "
                 "checked cell by cell with the mistake named"),
    "train": ("glassformer.training.commands", "train the Chinese->English translator"),
    "translate": ("glassformer.decoding.commands", "translate Chinese sentences (arguments or stdin)"),
    "evaluate": ("glassformer.interpret.evaluation", "sacreBLEU BLEU and chrF of a model on a split (--source-share)"),
    "explain": ("glassformer.interpret.explain", "the lesson's walk in numbers for one sentence"),
    "patch": ("glassformer.interpret.patching", "activation patching: which heads and positions carry 他 to `him`"),
    "attribute": ("glassformer.interpret.why", "why him: attribution to source and target prefix, the logit lens"),
    "hallucination": ("glassformer.interpret.hallucination", "the hallucination signal: source share of right vs "
                      "wrong targets (ROC AUC)"),
    "align": ("glassformer.interpret.align", "word alignments source unit ↔ target word; AER against gold links"),
    "lab": ("glassformer.lab.commands", "the browser lab: follow one token through the Transformer"),
    "import": ("glassformer.interop.importer", "a Hugging Face Marian folder (OPUS-MT) as a run folder"),
    "export": ("glassformer.interop.export", "a run folder as a transformers or CTranslate2 model folder"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (which argument, why) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, the arguments of that one sub-command alone (the others are listed by
    name and help, their modules left unimported)."""
    parser = OneLineParser(prog="glassformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        adder = getattr(mod, f"add_{name}_arguments", None)
        if adder is not None:
            adder(p)
        p.add_argument("--no-limits", action="store_true",
                       help="lift the work limits (docs/limits.md) for trusted local input")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=argv[0] if argv and argv[0] in COMMANDS else "")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module, _ = COMMANDS[args.command]
    command = getattr(importlib.import_module(module), f"{args.command}_command")
    with contextlib.nullcontext() if not args.no_limits else limits.lifted():
        return run_command(args.command, lambda: int(command(args) or 0))


def _flushed(code: int) -> int:
    """The exit status once stdout is written out: a reader that left (`| head`) is no error, an output that cannot
    be written (a full disk) one line and status 1. Either way what is left unwritten goes to os.devnull, so the
    interpreter's own flush at the exit finds nothing to fail on."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as error:
        print(f"glassformer: error: cannot write the output: {error.strerror or error}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = code or 1
    sys.stderr.flush()
    return code


# commands whose work is done once their output is written and their exit handlers have run (helpers closed, the
# packages let go: decoding/commands.py): the process then leaves without the interpreter's teardown
QUICK_EXIT = ("translate", "evaluate")


def run() -> None:
    """The `glassformer` console script (and `python -m glassformer.cli`): `main`, then the exit. After a QUICK_EXIT
    command, once stdout and stderr are flushed and the exit handlers have run, the process leaves at once
    (`os._exit`): the interpreter's teardown freed torch's objects one by one, ~0.2 s of every `translate`. The
    process is the command's own: the decoding commands may freeze its objects out of the collector."""
    from .decoding import commands

    commands.OWN_PROCESS = True
    code = _flushed(main())
    if len(sys.argv) > 1 and sys.argv[1] in QUICK_EXIT:
        atexit._run_exitfuncs()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
