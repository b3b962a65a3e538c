"""Activation patching (interpret/patching.py): everything patched restores the clean run, nothing
patched restores nothing, and at the embedding only the position where the sentences differ matters."""

from __future__ import annotations

import pytest
import torch

from glassformer.errors import UsageError
from glassformer.interpret.patching import focus_row, patch_scan
from glassformer.model import ModelConfig, Transformer

# 我 昨天 给 了 他/她 一 本 书 。 as ids of a 20-unit source vocabulary; BOS I gave him a book yesterday .
CLEAN = [4, 5, 6, 7, 8, 9, 10, 11, 12]
SHE = [4, 5, 6, 7, 13, 9, 10, 11, 12]          # 他 → 她 at position 4
SWAP = [8, 5, 6, 7, 4, 9, 10, 11, 12]          # 我 and 他 swapped: positions 0 and 4 differ
TGT_IN = [1, 4, 5, 6, 7, 8, 9, 10]
ROW, HIM = 2, 6


def toy_model() -> Transformer:
    """A seeded float64 tiny model over the toy vocabularies (also tests/test_attribution_patching.py's)."""
    cfg = ModelConfig.tiny(src_vocab=20, tgt_vocab=16, encoder_layers=2, decoder_layers=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        built = Transformer(cfg)
    return built.double().eval()


@pytest.fixture(scope="module")
def model() -> Transformer:
    return toy_model()


def _scan(model, corrupt, **kw):
    return patch_scan(model, torch.tensor([CLEAN]), torch.tensor([corrupt]), torch.tensor([TGT_IN]), ROW, HIM, **kw)


@pytest.mark.slow
def test_probabilities_are_the_models_own(model):
    scan = _scan(model, SHE)
    with torch.no_grad():
        for ids, key in ((CLEAN, "p_clean"), (SHE, "p_corrupt")):
            p = torch.softmax(model(torch.tensor([ids]), torch.tensor([TGT_IN]))[0, ROW], dim=-1)[HIM]
            assert abs(float(p) - scan[key]) < 1e-9
    assert abs(scan["p_clean"] - scan["p_corrupt"]) > 1e-4       # the corruption moves p(him)


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", [SHE, SWAP])
def test_everything_patched_restores_exactly_nothing_patched_restores_nothing(model, corrupt):
    scan = _scan(model, corrupt)
    assert scan["nothing"].fraction == 0.0 and scan["nothing"].p == scan["p_corrupt"]
    assert abs(scan["all_heads"].fraction - 1.0) < 1e-9
    assert abs(scan["all_heads"].p - scan["p_clean"]) < 1e-12
    for layer in scan["all_positions"]:                                 # every position of any one encoder layer
        assert abs(layer.fraction - 1.0) < 1e-9


@pytest.mark.slow
def test_at_the_embedding_only_the_differing_position_matters(model):
    scan = _scan(model, SHE)
    embedding = [p.fraction for p in scan["positions"][0]]
    assert abs(embedding[4] - 1.0) < 1e-9                              # 他 itself: the whole difference
    assert all(f == pytest.approx(0.0, abs=1e-12) for j, f in enumerate(embedding) if j != 4)
    # deeper, the difference has spread over positions by self-attention: another position carries some of it
    assert any(abs(p.fraction) > 1e-6 for j, p in enumerate(scan["positions"][-1]) if j != 4)


@pytest.mark.slow
def test_one_head_restores_part_and_heads_differ(model):
    scan = _scan(model, SHE)
    fractions = [p.fraction for layer in scan["heads"] for p in layer]
    assert len(fractions) == model.cfg.decoder_layers * model.cfg.heads
    assert len({round(f, 9) for f in fractions}) > 1                    # each head patched on its own
    assert all(abs(f - 1.0) > 1e-6 for f in fractions)                   # no single head is everything here


def test_positions_need_the_same_unit_count(model):
    with pytest.raises(UsageError, match="same count"):
        patch_scan(model, torch.tensor([CLEAN]), torch.tensor([CLEAN[:-1]]), torch.tensor([TGT_IN]), ROW, HIM)
    heads_only = patch_scan(model, torch.tensor([CLEAN]), torch.tensor([CLEAN[:-1]]), torch.tensor([TGT_IN]), ROW,
                            HIM, positions=False)
    assert heads_only["positions"] is None and abs(heads_only["all_heads"].fraction - 1.0) < 1e-9


class _WordTarget:
    """A word-level target tokenizer: one id per word, punctuation split off."""

    words = ["<pad>", "<s>", "</s>", "<unk>", "I", "gave", "him", "a", "book", "yesterday", "."]

    def encode(self, text: str) -> list[int]:
        return [self.words.index(w) for w in text.replace(".", " .").split()]


def test_the_focus_row_is_the_row_before_the_word():
    row, token, ids = focus_row(_WordTarget(), "I gave him a book yesterday.", "him")
    assert (row, token) == (2, 6) and ids == [4, 5, 6, 7, 8, 9, 10]     # BOS I gave → predicts him
    with pytest.raises(UsageError, match="not a word of the target"):
        focus_row(_WordTarget(), "I gave him a book yesterday.", "her")
