"""The settings of `glassformer train`, each declared once: type, range, default and help text.

`TrainSettings` decides a run and is saved in config.json's "train"; its `model` part holds the model's
sizes (`ModelSettings`). `RunOptions` is how this invocation runs it (folder, resume, checkpoints to keep,
device, threads) and is not saved. The schema defaults are a plain run on the HSK pairs; the presets
(presets.PRESETS) are partial values of the same schema. The command-line flags are generated from
these fields (train_cli.py), and a bad value, from a flag or a saved file, is one line naming it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ..errors import UsageError
from ..limits import MAX_VOCAB
from ..model import ModelConfig
from ..threads import usable_cores
from ..validation import Schema, validate
from .presets import PRESETS

Preset = Literal["default", "large", "hsk", "anchor", "tiny"]   # the names of presets.PRESETS


def knob(default: Any, help: str, *, flag: str | None = "", resume: bool = False, **bounds: Any) -> Any:
    """A field of the schema: its default, its help text, its bounds (gt, ge, lt, le).

    `flag`: the command-line flag ("" = --field-name, None = none); `resume`: may change on --resume.
    """
    return Field(default, description=help, json_schema_extra={"flag": flag, "resume": resume}, **bounds)


class ModelSettings(Schema):
    """The model's sizes a recipe chooses (glassformer.model.ModelConfig fields; the vocabularies come
    from the data)."""

    d_model: int = knob(128, "model width d", gt=0)
    heads: int = knob(4, "attention heads", gt=0)
    d_ff: int = knob(512, "FeedForward inner width", gt=0)
    encoder_layers: int = knob(2, "encoder and decoder layers each", flag="--layers", gt=0)
    decoder_layers: int = knob(2, "encoder and decoder layers each", flag="--layers", gt=0)
    dropout: float = knob(0.1, "dropout", ge=0, lt=1)
    attention_dropout: float = knob(0.0, "dropout on the attention weights (not in the 2017 paper)", ge=0, lt=1)
    max_len: int = knob(128, "longest sequence the model accepts", flag=None, gt=0)
    norm_placement: Literal["post", "pre"] = knob("post", "LayerNorm placement", flag="--norm")


class TrainSettings(Schema):
    """Everything that decides a training run: the model, the data, the schedule, the seed."""

    preset: Preset = knob("default", "the recipe to start from (presets.PRESETS; its note is printed at the start)")
    model: ModelSettings = Field(default_factory=ModelSettings)
    epochs: int = knob(10, "epochs", resume=True, gt=0)
    max_tokens: int = knob(1024, "padded tokens per batch per rank", gt=0)
    lr_factor: float = knob(0.7, "Noam schedule factor", gt=0)
    warmup: int = knob(800, "Noam warm-up steps", gt=0)
    label_smoothing: float = knob(0.1, "label smoothing", ge=0, lt=1)
    cooldown: float = knob(0.0, "the last fraction of the run's steps, in which the learning rate falls linearly "
                                "to zero (0: the Noam schedule to the end)", ge=0, lt=1)
    word_dropout: float = knob(0.0, "each source unit of a training batch becomes <unk> with this probability",
                               ge=0, lt=1)
    bpe_dropout: float = knob(0.0, "BPE-dropout: each merge of a training target's words skipped with this "
                                   "probability, so words are sometimes cut into smaller pieces", ge=0, lt=1)
    bpe_vocab: int = knob(4000, "target BPE vocabulary size", gt=0, le=MAX_VOCAB)
    glosses: bool = knob(False, "add CC-CEDICT glosses of the source words as word-level pairs")
    source_units: Literal["raw", "gold"] = knob("raw", "train on the raw-text segmentation or the corpus's")
    average: int = knob(1, "average the last K epoch checkpoints into best/ at the end (1: best/ holds the best "
                           "dev epoch, or with --cooldown the last one)", resume=True, gt=0)
    char_fallback: bool = knob(False, "characters as source units too: unknown words read as characters")
    tatoeba: bool = knob(False, "add the Tatoeba training pairs")
    hsk_repeat: int = knob(1, "each HSK training pair this many times per epoch", gt=0)
    source_pieces: int = knob(0, "0: source words from the HSK corpus; N: a SentencePiece unigram of N pieces",
                              ge=0, le=MAX_VOCAB)
    hsk_finish: int = knob(0, "the last N epochs train on the HSK examples only", ge=0)
    max_steps: int | None = knob(None, "stop after this many optimizer steps in total", resume=True, gt=0)
    seed: int = knob(1, "random seed")
    limit: int | None = knob(None, "use only the first N training pairs (tests)", gt=0)
    accumulate: int = knob(1, "batches per optimizer step per rank", gt=0)
    eval: bool = knob(True, "the dev BLEU after each epoch", resume=True)
    log_every: int = knob(10, "steps between metrics.jsonl lines", resume=True, gt=0)
    dtype: Literal["float32", "bfloat16"] = knob(
        "float32", "training precision: bfloat16 = autocast around forward and loss, fp32 weights and Adam state")

    @model_validator(mode="before")
    @classmethod
    def _earlier_files(cls, data: Any) -> Any:
        """Runs saved before this schema also wrote the model's dropout at the top level: the same value."""
        if isinstance(data, dict) and "dropout" in data and isinstance(data.get("model"), dict):
            data = {k: v for k, v in data.items() if k != "dropout"}
        return data

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    def replace(self, **changes: Any) -> TrainSettings:
        return check_settings({**self.to_dict(), **changes})

    @staticmethod
    def from_saved(data: Any, source: str) -> TrainSettings:
        """config.json's "train" of an earlier run (settings it lacks take their defaults)."""
        return check_settings(data, source)


class RunOptions(Schema):
    """How this invocation runs: not part of the run, so not saved."""

    out: Path | None = knob(None, "run folder (default runs/PRESET)")
    resume: bool = knob(False, "continue the run in --out where it stopped")
    keep: int = knob(3, "step checkpoints to keep (0 = none; at least --average)", ge=0)
    device: Literal["auto", "cpu", "cuda"] = knob("auto", "auto: CUDA if present")
    threads: int | None = knob(None, "CPU threads per process", gt=0)
    quiet: bool = knob(False, "no progress bar")
    compile: bool = knob(False, "compile the training step (forward, loss, backward) with torch.compile "
                                "(needs a C++ compiler; docs/performance.md)")

    @field_validator("threads")
    @classmethod
    def _within_the_cores(cls, threads: int | None) -> int | None:
        """At most the cores this process may use, as --workers (decoding/workers.py): each thread is an OS thread
        of OpenMP's pool (--threads 9999 made 20,001)."""
        cores = usable_cores()
        if threads is not None and threads > cores:
            raise ValueError(f"{threads}, outside 1..{cores} (the cores this process may use)")
        return threads


SCHEMAS = {"model": ModelSettings, "train": TrainSettings, "run": RunOptions}


def flag_of(schema: type[Schema], name: str) -> str | None:
    """The command-line flag of a field (None: it has none)."""
    flag = (schema.model_fields[name].json_schema_extra or {"flag": None})["flag"]
    return f"--{name.replace('_', '-')}" if flag == "" else flag


@cache
def flags() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every flag's dest -> (schema key in SCHEMAS, the fields it sets), in declaration order."""
    table: dict[str, tuple[str, tuple[str, ...]]] = {}
    for part in ("train", "model", "run"):
        for name in SCHEMAS[part].model_fields:
            if name == "model" and part == "train":
                continue
            flag = flag_of(SCHEMAS[part], name)
            if flag is not None:
                dest = flag[2:].replace("-", "_")
                table[dest] = (part, table[dest][1] + (name,) if dest in table else (name,))
    return table


def _where(field: str | None, source: str | None) -> str:
    """Where a bad value came from: `source` and the key (a saved file), else the flag that sets the field."""
    if source:
        return f"{source}: {field}" if field else source
    if not field:
        return "train settings"
    parts = field.split(".")
    if parts[0] == "model" and len(parts) > 1 and parts[1] in ModelSettings.model_fields:
        return flag_of(ModelSettings, parts[1]) or field
    name = parts[0].split("[")[0]
    schema = TrainSettings if name in TrainSettings.model_fields else RunOptions
    return (flag_of(schema, name) if name in schema.model_fields else None) or name


def _checked(schema: type[Schema], data: Any, source: str | None = None) -> Any:
    try:
        return validate(schema, data)
    except UsageError as error:
        text = str(error)
        problem = text.split(": ", 1)[1] if error.field and ": " in text else text
        raise UsageError(f"{_where(error.field, source)}: {problem}", error.field) from None


def check_settings(data: Any, source: str | None = None) -> TrainSettings:
    """`data` (a dict) as TrainSettings, or one UsageError naming the flag (or `source` and the key)."""
    settings = _checked(TrainSettings, data, source)
    try:
        ModelConfig.from_dict(settings.model.model_dump(), "model")
    except UsageError as error:                             # a size over its limit (limits.py), checked before any
        field = error.field if error.field in ModelSettings.model_fields else None       # tensor is made
        where = f"{source}: model" if source else (flag_of(ModelSettings, field) if field else None) or "model"
        raise UsageError(f"{where}: {str(error).removeprefix('model: ')}", error.field) from None
    return settings


def given(args: Any) -> dict[str, dict[str, Any]]:
    """The flags given on the command line, by schema part: {"train": {...}, "model": {...}, "run": {...}}."""
    out: dict[str, dict[str, Any]] = {"train": {}, "model": {}, "run": {}}
    for dest, (part, names) in flags().items():
        value = getattr(args, dest, None)
        if value is not None:
            out[part].update(dict.fromkeys(names, value))
    return out


def preset_settings(name: str, train: dict[str, Any] | None = None, model: dict[str, Any] | None = None
                    ) -> TrainSettings:
    """A preset's values over the schema defaults, then `train` and `model` changes over those, checked."""
    values = {k: v for k, v in PRESETS[name].items() if k != "note"}
    sizes = {**values.pop("model", {}), **(model or {})}
    return check_settings({**values, **(train or {}), "preset": name, "model": sizes})


def resolve_settings(args: Any) -> TrainSettings:
    """The preset's values, overridden by every flag given on the command line, checked."""
    changes = given(args)
    return preset_settings(changes["train"].get("preset", "default"), changes["train"], changes["model"])


def run_options(args: Any) -> RunOptions:
    """This invocation's folder and switches; `--out` must be a folder (or not exist yet)."""
    values = given(args)["run"]
    out = Path(values.get("out") or f"runs/{getattr(args, 'preset', None) or 'default'}")
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            what = "is a file, not a folder" if parent == out else f"lies under {parent}, which is a file"
            raise UsageError(f"--out {out} {what}; choose a folder for the run")
    return _checked(RunOptions, {**values, "out": out})


def _resumable(schema: type[Schema], name: str) -> bool:
    return bool((schema.model_fields[name].json_schema_extra or {}).get("resume"))


def resumed_settings(saved: dict[str, Any], args: Any, source: str) -> TrainSettings:
    """The saved settings of a run, with the flags that may change on resume; any other flag given must
    agree with the run (its data, model and schedule are fixed when it starts)."""
    settings = TrainSettings.from_saved(saved, source)
    changes = given(args)
    for part, now in (("train", settings), ("model", settings.model)):
        for name, value in changes[part].items():
            if not _resumable(SCHEMAS[part], name) and value != getattr(now, name):
                allowed = ", ".join(flag_of(TrainSettings, n) for n in TrainSettings.model_fields
                                    if _resumable(TrainSettings, n))
                raise UsageError(f"{flag_of(SCHEMAS[part], name)}: the run has {getattr(now, name)!r} "
                                 f"({source}); --resume keeps it (only {allowed} may change)", name)
    resumed = {k: v for k, v in changes["train"].items() if _resumable(TrainSettings, k)}
    return settings.replace(**resumed) if resumed else settings
