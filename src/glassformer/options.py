"""Options several commands share: the model folder (--model), the device (--device), integer flags.

The floor under every wing's commands: it imports only errors and paths, so `decoding`, `training`,
`interpret` and `interop` take their common flags from here rather than from each other.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .errors import UsageError
from .paths import DEFAULT_MODEL, MODEL_ENV, default_model_dir


def at_least(low: int, what: str):
    """An argparse type: an integer >= `low`, else one line saying what was expected."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


positive = at_least(1, "a positive integer")
non_negative = at_least(0, "an integer >= 0")


def folder_path(text: str) -> str:
    """An argparse type for a folder to write (--out): an empty path is refused (pathlib reads it as ".", the
    current folder, which a command would then name and write)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


def utf8_text(text: str) -> str:
    """An argparse type for free text (a sentence, --target, --contrast): refused in one line when it is not UTF-8.
    Python keeps a byte of the command line that is not UTF-8 as a lone surrogate (U+DC80..U+DCFF), which no output
    can encode: it was segmented as an unknown unit, or ended in a traceback, or in JSON that is not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        char = text[error.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else f"U+{ord(char):04X}"
        raise argparse.ArgumentTypeError(f"not UTF-8 text ({what})") from None
    return text


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model DIR and --device: which trained model, and where it runs."""
    parser.add_argument("--model", metavar="DIR",
                        help=f"trained model folder (default ${MODEL_ENV} or {DEFAULT_MODEL})")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")


def model_dir(args) -> Path:
    """The folder of --model (else $GLASSFORMER_MODEL, else runs/default); one line if it does not exist."""
    if args.model is not None and not args.model.strip():
        raise UsageError("--model: an empty folder name; give a run folder (or leave --model out for the default)")
    folder = Path(args.model) if args.model else default_model_dir()
    if not folder.exists():
        where = "--model" if args.model else (f"${MODEL_ENV}" if os.environ.get(MODEL_ENV) else "default")
        raise UsageError(f"no trained model at {folder} ({where}); train one with `make demo` "
                         "or `glassformer train --out DIR`")
    return folder


def pick_device(name: str, local_rank: int = 0):
    """auto | cpu | cuda as a torch.device (cuda: this rank's GPU); one line if it is not available."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
        return torch.device("cuda", local_rank)
    if name != "cpu":
        raise UsageError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device("cpu")


def device_name(name: str) -> str:
    """--device as the string torch takes ("cpu", "cuda:0"); "cpu" without importing torch."""
    if name == "cpu":
        return name
    return str(pick_device(name))
