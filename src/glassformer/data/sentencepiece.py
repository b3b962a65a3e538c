"""SentencePiece tokenizers as a run folder's source and target side, with MarianTokenizer's ids.

A Marian model (OPUS-MT) cuts text with two SentencePiece models (source.spm, target.spm) and maps the
pieces to ids through its own vocabulary (vocab.json, joint, or target_vocab.json for the target): the
SentencePiece ids are not the model's ids. The source ends with `</s>`; a piece missing from the
vocabulary is `<unk>`. Decoding drops `</s>`, `<unk>` and `<pad>`, joins the pieces with SentencePiece
and turns the remaining `▁` into spaces, as MarianTokenizer.decode(..., skip_special_tokens=True) does
(which, for a joint vocabulary, joins with the source model: kept here for the same text).

vocab.json of such a run folder holds, per side, {"type": "SentencePiece", "model": "source.spm",
"vocab": {piece: id}, ...}; the .spm files lie beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece

from .. import limits
from ..errors import UsageError
from .tokenize import SourceEncoding

TYPE = "SentencePiece"
EOS_TOKEN, UNK_TOKEN, PAD_TOKEN = "</s>", "<unk>", "<pad>"


def load_processor(path: Path) -> tuple[sentencepiece.SentencePieceProcessor, bytes]:
    """A SentencePiece model file (size within MAX_VOCAB_BYTES), and its bytes; a broken file is one UsageError."""
    limits.check(f"{path}: size in bytes", path.stat().st_size, "MAX_VOCAB_BYTES")
    data = path.read_bytes()
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(data)
    except Exception as error:  # sentencepiece raises RuntimeError/OSError for a malformed model
        raise UsageError(f"{path}: not a SentencePiece model ({type(error).__name__})") from None
    return processor, data


class PieceVocab:
    """piece <-> id of the model's vocabulary (not SentencePiece's own ids)."""

    def __init__(self, vocab: dict[str, int], unk: str = UNK_TOKEN) -> None:
        size = len(vocab)
        if unk not in vocab:
            raise ValueError(f"the vocabulary has no {unk!r}")
        if sorted(vocab.values()) != list(range(size)):
            raise ValueError(f"the vocabulary's ids are not 0..{size - 1}, each once")
        self._stoi = dict(vocab)
        self._itos = [""] * size
        for piece, index in vocab.items():
            self._itos[index] = piece
        self.unk_id = vocab[unk]

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, piece: object) -> bool:
        return piece in self._stoi

    @property
    def tokens(self) -> list[str]:
        return list(self._itos)

    def token_to_id(self, piece: str) -> int:
        return self._stoi.get(piece, self.unk_id)

    def id_to_token(self, index: int) -> str:
        return self._itos[index]

    def encode(self, pieces: Sequence[str]) -> list[int]:
        return [self.token_to_id(p) for p in pieces]

    def to_dict(self) -> dict[str, int]:
        return dict(self._stoi)


class _SentencePieceSide:
    """What both sides share: the SentencePiece model, the vocabulary and the special ids."""

    def __init__(self, processor: sentencepiece.SentencePieceProcessor, vocab: PieceVocab, model_file: str,
                 *, joiner: sentencepiece.SentencePieceProcessor | None = None) -> None:
        self.processor, self.vocab, self.model_file = processor, vocab, model_file
        self.joiner = joiner or processor                       # the model whose decode_pieces joins the output
        for token in (EOS_TOKEN, PAD_TOKEN):
            if token not in vocab:
                raise ValueError(f"the vocabulary has no {token!r}")
        self.eos_id, self.pad_id, self.unk_id = vocab.token_to_id(EOS_TOKEN), vocab.token_to_id(PAD_TOKEN), vocab.unk_id

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def pieces(self, text: str) -> list[str]:
        """SentencePiece's pieces of `text` (no end marker)."""
        return list(self.processor.encode(text, out_type=str))

    def id_to_token(self, index: int) -> str | None:
        return self.vocab.id_to_token(index) if 0 <= index < len(self.vocab) else None

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.token_to_id(token) if token in self.vocab else None

    def to_dict(self) -> dict[str, Any]:
        return {"type": TYPE, "version": 1, "model": self.model_file, "vocab": self.vocab.to_dict()}


class SentencePieceSource(_SentencePieceSide):
    """Source text -> pieces -> ids, `</s>` last (MarianTokenizer's input ids)."""

    mode = "sentencepiece"

    def segment(self, text: str) -> list[str]:
        """The units the encoder reads: the pieces and the end marker."""
        return [*self.pieces(text), EOS_TOKEN]

    def analyse(self, text: str, add_bos_eos: bool = False) -> SourceEncoding:
        """Pieces and ids (`</s>` included: it is part of every Marian source); `add_bos_eos` adds nothing more."""
        units = self.segment(text)
        ids = self.vocab.encode(units)
        unknown = [u for u, i in zip(units, ids, strict=True) if i == self.unk_id and u != UNK_TOKEN]
        return SourceEncoding(units, ids, unknown, False)

    def encode(self, text: str, add_bos_eos: bool = False) -> list[int]:
        return self.analyse(text).ids

    def unknown_units(self, text: str) -> list[str]:
        return self.analyse(text).unknown

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab.id_to_token(i) for i in ids if i not in (self.pad_id, self.eos_id)]


class SentencePieceTarget(_SentencePieceSide):
    """Target ids <-> English text through the target SentencePiece model."""

    def encode(self, text: str, add_bos_eos: bool = False) -> list[int]:
        """Ids of the target pieces of `text` (no end marker: teacher forcing and patching add what they need)."""
        ids = self.vocab.encode(self.pieces(text))
        return [*ids, self.eos_id] if add_bos_eos else ids

    def tokens(self, text: str) -> list[str]:
        return self.pieces(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`: up to the first `</s>`, without `<pad>` and `<unk>`, `▁` as spaces."""
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        pieces = [self.vocab.id_to_token(i) for i in ids if i not in (self.pad_id, self.unk_id)]
        return str(self.joiner.decode_pieces(pieces)).replace("▁", " ").strip()

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "joint": self.joiner is not self.processor}

    @property
    def tokenizer(self) -> SentencePieceTarget:
        """Itself: callers that decode single ids through `.tokenizer.decode([id])` work on both kinds."""
        return self


def is_sentencepiece(entry: dict) -> bool:
    """Whether a vocab.json side describes SentencePiece tokenizers (else glassformer's own)."""
    return isinstance(entry, dict) and entry.get("type") == TYPE


def _model_path(root: Path, entry: dict, side: str) -> Path:
    name = entry.get("model")
    if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
        raise UsageError(f"{root / 'vocab.json'}: {side}.model must be a file name beside vocab.json, got {name!r}")
    path = root / name
    if not path.is_file():
        raise UsageError(f"{path}: missing (vocab.json's {side} side names it)")
    return path


def load_pair(root: Path, source: dict, target: dict) -> tuple[SentencePieceSource, SentencePieceTarget]:
    """Both sides from a run folder's vocab.json entries and the .spm files beside it; one UsageError per problem."""
    built = []
    processors = {}
    for side, entry in (("source", source), ("target", target)):
        if not is_sentencepiece(entry):
            raise UsageError(f"{root / 'vocab.json'}: {side}: expected a SentencePiece side like the other one")
        vocab = entry.get("vocab")
        if not isinstance(vocab, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                  for v in vocab.values()):
            raise UsageError(f"{root / 'vocab.json'}: {side}.vocab must map pieces to integer ids")
        limits.check(f"{root / 'vocab.json'}: {side} vocabulary entries", len(vocab), "MAX_VOCAB")
        processors[side] = load_processor(_model_path(root, entry, side))[0]
        try:
            built.append(PieceVocab(vocab))
        except ValueError as error:
            raise UsageError(f"{root / 'vocab.json'}: {side}: {error}") from None
    joint = target.get("joint", False) is True
    try:
        src = SentencePieceSource(processors["source"], built[0], source["model"])
        tgt = SentencePieceTarget(processors["target"], built[1], target["model"],
                                  joiner=processors["source"] if joint else None)
    except ValueError as error:
        raise UsageError(f"{root / 'vocab.json'}: {error}") from None
    return src, tgt
