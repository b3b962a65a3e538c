"""`glassformer export --model RUN_DIR --to transformers|ctranslate2 --out DIR`: a run folder for other engines.

transformers: config.json, generation_config.json and model.safetensors that `MarianMTModel.from_pretrained`
loads; weights in Marian's position layout (marian.py), separate vocabularies unless the model shares one
matrix, the special ids ours, no forced EOS at the length limit (glassformer cuts there). ctranslate2: a
model built with CTranslate2's own specification API (`TransformerSpec`), our position table given as it is,
`--quantization` passed through. Both write source_tokenizer.json and target_tokenizer.json in the
`tokenizers` library's format (segmenter.py), so the exported model runs without glassformer; a model
imported from Marian carries MarianTokenizer's files instead (source.spm, target.spm, vocab.json).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from ..data.checkpoint import FOLDER_MODE, find_run_root, load_translator_parts, write_json
from ..data.sentencepiece import SentencePieceSource
from ..errors import UsageError
from ..model import ModelConfig
from ..model.positions import sinusoidal_positions
from . import marian, segmenter

FORMATS = ("transformers", "ctranslate2")
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.float32).cpu() for k, v in model.state_dict().items()}


def write_transformers(model, out: Path) -> None:
    """config.json, generation_config.json, model.safetensors of a MarianMTModel computing the same function."""
    cfg: ModelConfig = model.cfg
    why = marian.refusal(cfg)
    if why is not None:
        raise UsageError(f"--to transformers: MarianMTModel cannot express {why}")
    config = {k: v for k, v in marian.hf_config(cfg).items() if k != "forced_eos_token_id"}
    generation = {k: v for k, v in marian.generation_config(cfg).items() if k != "forced_eos_token_id"}
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", generation)
    save_file(marian.to_marian(_state(model), cfg), str(out / "model.safetensors"), metadata={"format": "pt"})


def write_ctranslate2(model, source_tokens: list[str], target_tokens: list[str], out: Path,
                      quantization: str | None) -> None:
    """A CTranslate2 Transformer model directory from our weights (the `ctranslate2` extra)."""
    cfg: ModelConfig = model.cfg
    why = marian.refusal(cfg)
    if why is not None:
        raise UsageError(f"--to ctranslate2: glassformer exports only the 2017 post-norm layout, not {why}")
    try:
        from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise UsageError("--to ctranslate2 needs CTranslate2: pip install 'glassformer[ctranslate2]'") from None
    state = {k: v.numpy() for k, v in _state(model).items()}
    activation = common_spec.Activation.SWISH if cfg.activation == "silu" else common_spec.Activation.RELU
    spec = transformer_spec.TransformerSpec.from_config((cfg.encoder_layers, cfg.decoder_layers), cfg.heads,
                                                        pre_norm=False, activation=activation)
    table = sinusoidal_positions(cfg.max_len, cfg.d_model, torch.float32, cfg.position_layout).numpy()
    scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0

    def linear(target, *names: str) -> None:
        target.weight = np.concatenate([state[f"{n}.weight"] for n in names])
        target.bias = np.concatenate([state[f"{n}.bias"] for n in names])

    def norm(target, name: str) -> None:
        target.gamma, target.beta = state[f"{name}.weight"], state[f"{name}.bias"]

    for stack, stack_spec in (("encoder", spec.encoder), ("decoder", spec.decoder)):
        stack_spec.scale_embeddings = scale
        stack_spec.position_encodings.encodings = table
        for i, layer in enumerate(stack_spec.layer):
            at = f"{stack}.layers.{i}"
            linear(layer.self_attention.linear[0], *(f"{at}.self_attention.{w}" for w in ("w_q", "w_k", "w_v")))
            linear(layer.self_attention.linear[1], f"{at}.self_attention.w_o")
            norm(layer.self_attention.layer_norm, f"{at}.sublayer.0.layer_norm")
            if stack == "decoder":
                linear(layer.attention.linear[0], f"{at}.cross_attention.w_q")
                linear(layer.attention.linear[1], f"{at}.cross_attention.w_k", f"{at}.cross_attention.w_v")
                linear(layer.attention.linear[2], f"{at}.cross_attention.w_o")
                norm(layer.attention.layer_norm, f"{at}.sublayer.1.layer_norm")
            linear(layer.ffn.linear_0, f"{at}.ffn.w_1")
            linear(layer.ffn.linear_1, f"{at}.ffn.w_2")
            norm(layer.ffn.layer_norm, f"{at}.sublayer.{2 if stack == 'decoder' else 1}.layer_norm")
    spec.encoder.embeddings[0].weight = state["src_embed.token.weight"]
    spec.decoder.embeddings.weight = state["tgt_embed.token.weight"]
    spec.decoder.projection.weight = state["head.weight"]
    if cfg.head_bias:
        spec.decoder.projection.bias = state["head.bias"]
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    spec.config.unk_token = target_tokens[_unk(target_tokens)]
    spec.config.bos_token = spec.config.decoder_start_token = target_tokens[cfg.bos_id]
    spec.config.eos_token = target_tokens[cfg.eos_id]
    spec.config.layer_norm_epsilon = cfg.eps
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(out))


def _unk(tokens: list[str]) -> int:
    return tokens.index("<unk>") if "<unk>" in tokens else 0


def _vocabularies(source, target) -> tuple[list[str], list[str]]:
    """Token strings in id order for both sides (CTranslate2 feeds and returns tokens, not ids)."""
    if isinstance(source, SentencePieceSource):
        return source.vocab.tokens, target.vocab.tokens
    return segmenter.spellings(source), [target.id_to_token(i) for i in range(target.vocab_size)]


def write_tokenizers(root: Path, source, target, out: Path) -> list[str]:
    """source_tokenizer.json / target_tokenizer.json (glassformer's own tokenizers), or MarianTokenizer's files."""
    if isinstance(source, SentencePieceSource):
        names = [source.model_file, target.model_file]
        for name in names:
            shutil.copyfile(root / name, out / name)
        vocabs = {"vocab.json": source.vocab.to_dict(), "target_vocab.json": target.vocab.to_dict()}
        if vocabs["vocab.json"] == vocabs["target_vocab.json"]:               # one vocabulary, as Marian's default
            del vocabs["target_vocab.json"]
        else:                                                    # MarianTokenizer reads the target's apart
            vocabs["tokenizer_config.json"] = {"separate_vocabs": True}
        for name, data in vocabs.items():
            (out / name).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        return [*names, *vocabs]
    segmenter.source_tokenizer(source).save(str(out / "source_tokenizer.json"))
    segmenter.target_tokenizer(target).save(str(out / "target_tokenizer.json"))
    return ["source_tokenizer.json", "target_tokenizer.json"]


@contextlib.contextmanager
def staged_folder(out: Path, what: str) -> Iterator[Path]:
    """Yield an empty staging folder beside `out` (`.NAME.XXXX.partial`, a name of this run's own: a folder already
    there, a user's or another run's, is never touched) to write `what` into; when the block ends without an
    error, put it in place of `out` (new, or an empty folder). On any failure the staging folder is removed and
    `out` is left as it was ("never lost work"): a half-written folder is never left behind.
    An OSError while writing (a full disk, a file-size limit, a folder that cannot be made) and a
    SafetensorError (safetensors' own I/O errors are not OSErrors) are one UsageError naming `--out`; an
    OSError that names a file outside the output alone (a source file that cannot be read) goes on as it is."""
    out = Path(out)
    whole = Path(os.path.realpath(out))        # "." and "a/.." have a name once made absolute; a link, its folder
    try:
        whole.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{whole.name}.", suffix=".partial", dir=whole.parent))
        os.chmod(staging, FOLDER_MODE)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot create the folder ({error.strerror or error})") from None
    try:
        yield staging
        if whole.exists():
            whole.rmdir()
        staging.rename(whole)
    except SafetensorError as error:
        detail = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise UsageError(f"--out {out}: cannot write {what} ({detail}); the partial output was removed") from None
    except OSError as error:
        if _names_only_other_files(error, (staging, whole)):
            raise
        raise UsageError(f"--out {out}: cannot write {what} ({error.strerror or error}); the partial "
                         "output was removed") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _names_only_other_files(error: OSError, ours: tuple[Path, ...]) -> bool:
    """Whether `error` is about files outside the output (then its own message names the file): it names a
    file, and neither it nor its second file (shutil.copyfile's destination) is or lies in one of `ours`."""
    names = [Path(os.path.abspath(n)) for n in (error.filename, error.filename2) if isinstance(n, (str, Path))]
    return bool(names) and not any(n == p or p in n.parents for n in names for p in ours)


def export(model_dir: str | Path, to: str, out: str | Path, quantization: str | None = None) -> list[str]:
    """Write the export of the run folder `model_dir` into `out` (new or empty); returns the files written."""
    if to not in FORMATS:
        raise UsageError(f"--to must be one of {FORMATS}, got {to!r}")
    if quantization is not None and to != "ctranslate2":
        raise UsageError("--quantization applies to --to ctranslate2 only")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder")
    model, source, target, _ = load_translator_parts(model_dir)
    where = Path(os.path.abspath(out))                  # `--out .`: the folder is replaced, the name stays
    with staged_folder(out, f"the {to} export") as staging:
        if to == "transformers":
            write_transformers(model, staging)
        else:
            write_ctranslate2(model, *_vocabularies(source, target), staging, quantization)
        write_tokenizers(find_run_root(model_dir), source, target, staging)
    return sorted(p.name for p in where.iterdir())


# ---- glassformer export ------------------------------------------------------------------------
def add_export_arguments(parser) -> None:
    from ..options import add_model_arguments, folder_path

    add_model_arguments(parser)
    parser.add_argument("--to", required=True, choices=FORMATS, help="the engine to export for")
    parser.add_argument("--out", required=True, metavar="DIR", type=folder_path,
                        help="the folder to write (new or empty)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS,
                        help="CTranslate2's weight type (passed to its converter; default: float32 as saved)")


def export_command(args) -> int:
    from ..options import model_dir

    files = export(model_dir(args), args.to, args.out, args.quantization)
    print(f"{args.out}: {args.to} model ({', '.join(files)})")
    return 0
