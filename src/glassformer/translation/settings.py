"""Typed, validated settings of `glassformer train`.

`TrainSettings` is what decides a run and is saved in config.json's "train" (a preset's recipe with
every command-line override applied); `RunOptions` is how this invocation runs it (folder, resume,
checkpoints to keep, device, threads). Both are dataclasses with literal choices, checked by the one
validation layer (glassformer.validation): a bad value is one line naming the option, exit 2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from ..errors import UsageError
from ..limits import MAX_VOCAB
from ..model import ModelConfig
from ..validation import DATACLASS_CONFIG, validate
from .recipes import RECIPES

Positive = Annotated[int, Field(gt=0)]
NonNegative = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
VocabSize = Annotated[int, Field(gt=0, le=MAX_VOCAB)]     # --bpe-vocab, --source-pieces: at most limits.MAX_VOCAB
Preset = Literal["default", "large", "hsk", "anchor", "tiny"]   # the names of translation.recipes.RECIPES

# command-line option -> ModelConfig fields it sets
MODEL_OPTIONS = {"d_model": ("d_model",), "d_ff": ("d_ff",), "heads": ("heads",),
                 "layers": ("encoder_layers", "decoder_layers"), "norm": ("norm_placement",)}


@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides a training run: the recipe's knobs after overrides, the seed, the data."""

    __pydantic_config__ = DATACLASS_CONFIG

    preset: Preset
    model: dict[str, Any]                           # ModelConfig fields (without the vocabulary sizes)
    epochs: Positive
    max_tokens: Positive                            # padded tokens per batch per rank
    lr_factor: PositiveFloat
    warmup: Positive
    label_smoothing: Fraction
    bpe_vocab: VocabSize
    glosses: bool
    source_units: Literal["raw", "gold"]
    average: Positive
    char_fallback: bool
    dropout: Fraction
    tatoeba: bool = False                           # Tatoeba training pairs join the HSK ones
    hsk_repeat: Positive = 1                        # each HSK training pair this many times per epoch
    source_pieces: Annotated[int, Field(ge=0, le=MAX_VOCAB)] = 0   # 0: corpus words; N: SentencePiece pieces
    hsk_finish: NonNegative = 0                     # the last N epochs on the HSK examples only
    max_steps: Positive | None = None
    seed: int = 1
    limit: Positive | None = None                   # only the first N training pairs
    accumulate: Positive = 1
    eval: bool = True                               # dev BLEU after each epoch (kept on resume)
    log_every: Positive = 10                        # steps between metrics.jsonl lines (kept on resume)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainSettings:
        return check_settings({**self.to_dict(), **changes})

    @staticmethod
    def from_saved(data: Any, source: str) -> TrainSettings:
        """config.json's "train" of an earlier run (settings it lacks take their defaults)."""
        return check_settings(data, source)


@dataclass(frozen=True)
class RunOptions:
    """How this invocation runs: not part of the run, so not saved."""

    __pydantic_config__ = DATACLASS_CONFIG

    out: Path
    resume: bool = False
    keep: NonNegative | None = None                 # step checkpoints kept (default 3, at least --average)
    device: str = "auto"
    threads: Positive | None = None
    quiet: bool = False


def _option(field_name: str | None) -> str:
    return f"--{field_name.split('.')[0].split('[')[0].replace('_', '-')}" if field_name else "train settings"


def check_settings(data: Any, source: str | None = None) -> TrainSettings:
    """`data` (a dict) as TrainSettings, or one UsageError naming the option (or `source` and the key)."""
    try:
        settings = validate(TrainSettings, data)
    except UsageError as error:
        text = str(error)
        where = f"{source}: {error.field}" if source else _option(error.field)
        raise UsageError(f"{where}: {text.split(': ', 1)[1] if ': ' in text else text}", error.field) from None
    try:
        ModelConfig.from_dict(settings.model, "model settings")
    except UsageError as error:
        raise UsageError(f"{source + ': ' if source else ''}{error}", error.field) from None
    return settings


def resolve_settings(args: Any) -> TrainSettings:
    """A preset's recipe, overridden by every option given on the command line, checked."""


    if args.preset not in RECIPES:
        raise UsageError(f"--preset must be one of {', '.join(RECIPES)}, got {args.preset!r}")
    recipe = RECIPES[args.preset].to_dict()
    recipe.pop("note", None)
    model = dict(recipe.pop("model"))
    if getattr(args, "dropout", None) is not None:
        model["dropout"] = args.dropout
    for option, fields in MODEL_OPTIONS.items():
        if getattr(args, option, None) is not None:
            model.update({f: getattr(args, option) for f in fields})
    known = {f.name for f in dataclasses.fields(TrainSettings)}
    values = {k: v for k, v in recipe.items() if k in known}
    for key in (*values, "max_steps", "seed", "limit", "accumulate", "log_every"):
        if getattr(args, key, None) is not None:
            values[key] = getattr(args, key)
    if getattr(args, "eval", None) is not None:
        values["eval"] = args.eval
    values.update(preset=args.preset, model=model, dropout=model.get("dropout", 0.1))
    return check_settings(values)


def run_options(args: Any) -> RunOptions:
    """This invocation's folder and switches; `--out` must be a folder (or not exist yet)."""
    out = Path(args.out or f"runs/{args.preset}")
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            what = "is a file, not a folder" if parent == out else f"lies under {parent}, which is a file"
            raise UsageError(f"--out {out} {what}; choose a folder for the run")
    try:
        return validate(RunOptions, {"out": out, "resume": bool(args.resume), "keep": args.keep,
                                     "device": args.device or "auto", "threads": args.threads,
                                     "quiet": bool(getattr(args, "quiet", False))})
    except UsageError as error:
        raise UsageError(f"{_option(error.field)}: {str(error).split(': ', 1)[-1]}", error.field) from None


def resumed_settings(saved: dict[str, Any], args: Any, source: str) -> TrainSettings:
    """The saved settings of a run, with the options this invocation may change on resume."""
    settings = TrainSettings.from_saved(saved, source)
    changes = {key: getattr(args, key) for key in ("epochs", "max_steps", "average", "log_every")
               if getattr(args, key, None) is not None}
    if getattr(args, "eval", None) is not None:
        changes["eval"] = args.eval
    return settings.replace(**changes) if changes else settings
