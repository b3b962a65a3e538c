"""The model the lab's Sentence and Patching views run: a trained translator from a run folder (`--model`,
else $GLASSFORMER_MODEL, else runs/default), or, without one, a seeded untrained tiny Transformer over the
lesson's own units and words."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from ..data.tokenize import SPECIAL_TOKENS, SourceTokenizer, TargetTokenizer, Vocab
from ..errors import UsageError
from ..lesson import examples
from ..model import ModelConfig, Transformer
from ..paths import default_model_dir

UNTRAINED_SEED = 0


@dataclass
class LabModel:
    """A translator and its tokenizers, plus the same weights with positions switched off (claim C1)."""

    model: Transformer
    no_positions: Transformer
    source: SourceTokenizer
    target: TargetTokenizer
    trained: bool
    origin: str

    @classmethod
    def build(cls, model: Transformer, source: SourceTokenizer, target: TargetTokenizer, *,
              trained: bool, origin: str) -> LabModel:
        """Wrap `model` and copy its weights into a twin whose config has positions "none"."""
        model.eval()
        with torch.random.fork_rng(devices=[]):        # its random init is overwritten; leave the RNG alone
            twin = Transformer(model.cfg.replace(positions="none"))
        # A learned position table has no place in the twin; every other tensor is shared by name.
        state = {k: v for k, v in model.state_dict().items() if k in twin.state_dict()}
        twin.load_state_dict(state, strict=False)
        twin.eval()
        return cls(model, twin, source, target, trained, origin)

    def piece(self, token_id: int) -> str:
        """A target id as readable text: sub-word marks removed, specials by name (never raw bytes).

        The special ids are the model's own (glassformer: <pad> 0, <s> 1, </s> 2; Marian: </s> 0, <pad> last)."""
        token = self.target.id_to_token(token_id)
        if token is None:
            return f"<{token_id}>"
        cfg = self.model.cfg
        if token in SPECIAL_TOKENS or token_id in (cfg.pad_id, cfg.bos_id, cfg.eos_id):
            return token
        text = self.target.decode([token_id]).strip()
        return text or token.replace("▁", " ").strip() or token


def _word_target_tokenizer(texts: list[str]) -> TargetTokenizer:
    """A word-level TargetTokenizer over `texts` (same pre-tokenizer and decoder as the trained BPE)."""
    pre = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(behavior="isolated")])
    words: list[str] = list(SPECIAL_TOKENS)
    for text in texts:
        words += [w for w, _ in pre.pre_tokenize_str(text) if w not in words]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=SPECIAL_TOKENS[3]))
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return TargetTokenizer(tokenizer)


def untrained_model(seed: int = UNTRAINED_SEED, why: str | None = None) -> LabModel:
    """A seeded, untrained tiny Transformer over the lesson's own units and words (for when no run exists).

    `why` (e.g. "runs/default does not exist") is appended to the model's origin shown on the page.
    """
    source_units = [u for u in examples.SOURCE_VOCAB if u not in (examples.PAD, examples.BOS, examples.EOS)]
    source = SourceTokenizer(Vocab(source_units))
    target = _word_target_tokenizer([examples.LESSON_TARGET, "He gave me a book yesterday.", "I gave her a book.",
                                     "She smiled.", "she smiled."])
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    origin = f"untrained tiny model, torch seed {seed}" + (f"; {why}" if why else "")
    return LabModel.build(model, source, target, trained=False, origin=origin)


def load_model(model_dir: str | Path | None, *, required: bool = False) -> LabModel:
    """The trained translator in `model_dir` (None: glassformer.paths.default_model_dir(), as the CLI);
    without one, the seeded untrained model.

    `required`: the user named the folder, so a folder that cannot be loaded is a UsageError.
    """
    if model_dir is None:
        model_dir, required = default_model_dir(), False
    folder = Path(model_dir)
    if not folder.exists() and not required:
        return untrained_model(why=f"no trained model in {folder}")
    try:
        from ..data.checkpoint import load_translator_parts, origin_summary
        model, source, target, _ = load_translator_parts(folder)
        origin = f"{folder}: {origin_summary(folder)}"
    except UsageError as error:
        if required:
            raise
        return untrained_model(why=str(error).split(";")[0])
    except (ValueError, KeyError, OSError) as error:
        if required:
            raise UsageError(f"--model {folder}: cannot load the translator: {error}") from None
        return untrained_model(why=f"{folder} could not be loaded")
    return LabModel.build(model, source, target, trained=True, origin=origin)
