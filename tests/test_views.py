"""The lesson's views, built once: the two-sentence batch's masks and the per-row next-token walk."""

from __future__ import annotations

import pytest
import torch

from glassformer.lesson import examples as ex
from glassformer.lesson.views import lesson_batch, next_token_walk


def test_the_batch_masks_match_the_lesson_tables():
    b = lesson_batch()
    assert b.source_padding[1].tolist() == [False, False, True, True, True, True]
    assert b.loss_terms == [6, 3]
    assert int(b.causal.sum()) == 21 and bool(b.causal[2, 2]) and not bool(b.causal[2, 3])
    # sample B's target input is BOS she smiled EOS PAD PAD: row 3 (EOS) sees 0..3, never the PADs
    assert b.decoder_self[1, 3].tolist() == [True, True, True, True, False, False]
    assert b.decoder_self[1, 5].tolist() == [True, True, True, True, False, False]
    assert b.cross.shape == (2, 6, 6) and b.cross[1, :, 2:].sum() == 0 and bool(b.cross[0].all())
    assert b.encoder_self[1, :, 2:].sum() == 0
    doc = b.to_json()
    assert doc["source"][1][:2] == ["她", "笑了"] and doc["labels"][1][:3] == ["she", "smiled", ex.EOS]


def _logits(rows: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float64))


def test_walk_reads_the_next_input_then_eos():
    # 3 rows over a 4-token vocabulary (EOS = 2); inputs BOS(1), 3, 0
    logits = _logits([[0.1, 0.1, 0.2, 0.6], [0.7, 0.1, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]])
    walk = next_token_walk(logits, [1, 3, 0], eos=2, top=2)
    assert [r.next_id for r in walk] == [3, 0, 2]
    assert [round(r.p_next, 6) for r in walk] == [0.6, 0.7, 0.3]
    assert [r.rank for r in walk] == [1, 1, 2]
    assert [t for t, _ in walk[2].top] == [3, 2] and [r.input_id for r in walk] == [1, 3, 0]


def test_walk_of_an_output_cut_at_the_limit_ends_with_the_models_choice_not_eos():
    logits = _logits([[0.1, 0.1, 0.2, 0.6], [0.1, 0.6, 0.2, 0.1]])
    cut = next_token_walk(logits, [1, 3], eos=2, finished=False)
    assert cut[-1].next_id == 1 and cut[-1].rank == 1 and round(cut[-1].p_next, 6) == 0.6
    assert next_token_walk(logits, [1, 3], eos=2)[-1].next_id == 2


def test_walk_refuses_logits_that_do_not_match_the_inputs():
    with pytest.raises(ValueError, match="expected \\(3, vocab\\)"):
        next_token_walk(torch.zeros(2, 4), [1, 2, 3], eos=2)


def test_walk_inputs_of_an_output_cut_at_the_models_limit_fit_the_model():
    from glassformer.lesson.views import walk_inputs

    assert walk_inputs([5, 6], bos=1, max_len=8) == [1, 5, 6]
    assert walk_inputs([5] * 8, bos=1, max_len=8, finished=False) == [1] + [5] * 7    # 8 positions, not 9
    assert walk_inputs([5] * 3, bos=1, max_len=8, finished=False) == [1, 5, 5, 5]     # cut earlier: all kept


@pytest.mark.slow
def test_the_labs_sentence_view_reads_a_greedy_output_cut_at_the_models_limit(monkeypatch):
    import glassformer.interpret.explain as explain_module
    from glassformer.decoding.search import Hypothesis
    from glassformer.lab.api import LabAPI, untrained_model

    lab = untrained_model()
    limit = lab.model.cfg.max_len
    cut = Hypothesis([7] * limit, 0.0, 0.0, finished=False)                 # never chose EOS
    monkeypatch.setattr(explain_module, "generate", lambda model, src, *a, **k: [[cut]])
    out = LabAPI(lab).sentence({"source": "／".join(["我"] * limit)})
    assert out["finished"] is False and len(out["target_ids"]) == limit
    last = out["next_tokens"][-1]
    assert len(out["next_tokens"]) == limit and last["next_rank"] == 1          # the model's own choice
