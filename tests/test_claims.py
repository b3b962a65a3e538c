"""Every claim check passes on the model, and the important ones fail under the bug they guard against."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import glassformer.model.attention as attention_module
from glassformer.lesson import claims
from glassformer.lesson.claims import CHECKS, Measurement, detail, reading, run_all, run_check
from glassformer.model.transformer import Transformer

CLAIM_IDS = ([f"A{i}" for i in range(1, 8)] + [f"B{i}" for i in range(1, 9)] + [f"C{i}" for i in range(1, 7)]
             + [f"D{i}" for i in range(1, 8)] + [f"E{i}" for i in range(1, 5)] + ["F1", "G1", "G2"])


def test_one_check_per_claim_in_order():
    assert list(CHECKS) == CLAIM_IDS


@pytest.mark.parametrize("claim_id", CLAIM_IDS)
def test_claim_holds(claim_id):
    claim = run_check(claim_id)
    assert claim.passed, f"{claim_id}: {detail(claim)}"
    assert claim.title and claim.values and any(ch.isdigit() for ch in detail(claim))
    assert "{" not in detail(claim), detail(claim)                          # every template field was filled


def test_run_all_runs_every_registered_check_in_order(monkeypatch):
    calls = []
    fake = {i: (f"claim {i}", lambda i=i: calls.append(i) or reading("measured {x:Δ}", i != "B2", x=0.25))
            for i in ("A1", "B2", "C3")}
    monkeypatch.setattr(claims.registry, "CHECKS", fake)
    result = run_all()
    assert calls == ["A1", "B2", "C3"] and all(isinstance(c, Measurement) for c in result)
    assert [(c.id, c.passed, detail(c)) for c in result] == [
        ("A1", True, "measured 2.5e-01"), ("B2", False, "measured 2.5e-01"), ("C3", True, "measured 2.5e-01")]


def test_renderer_prints_rows_and_gives_json_with_values():
    rows = [Measurement("A1", "one", {"err": 0.0, "n": 3}, {"exact": 1e-10}, True, "|Δ| = {err:Δ} over {n}"),
            Measurement("B2", "two", {"err": float("inf")}, {}, False, "|Δ| = {err:Δ}")]
    text = claims.as_text(rows).splitlines()
    assert text == ["A1  PASS  one | |Δ| = 0 over 3", "B2  FAIL  two | |Δ| = inf", "2 claims: 1 PASS, 1 FAIL (B2)"]
    table = claims.as_json(rows)
    assert table["passed"] == 1 and table["total"] == 2 and table["failed"] == ["B2"]
    assert table["claims"][0] == {"id": "A1", "title": "one", "measured": "|Δ| = 0 over 3", "passed": True,
                                  "values": {"err": 0.0, "n": 3}, "tolerance": {"exact": 1e-10}}
    assert table["claims"][1]["values"] == {"err": None}                   # strict JSON: no Infinity


def test_a_crashing_check_is_a_failure(monkeypatch):
    def broken():
        raise RuntimeError("shape mismatch")
    monkeypatch.setitem(CHECKS, "A1", ("rows stay rows", broken))
    claim = run_check("A1")
    assert not claim.passed and "RuntimeError: shape mismatch" in detail(claim)


# ---- plausible bugs; the guarding checks must fail ------------------------------------------------
# Most are written as hooks: run_check(id, interventions) attaches them (model.intervene) to every model
# and layer the check builds, the lesson's BLOCK (trace spec v1) included. LayerNorm and the causal mask,
# which have no hook point of their own, are replaced as functions.

def _scale_after_softmax(scaled, d_k):                                      # softmax(QKᵀ) / √d_k
    return torch.nan_to_num(torch.softmax(scaled * math.sqrt(d_k), dim=-1)) / math.sqrt(d_k)


def _softmax_over_queries(scaled, d_k):
    return torch.nan_to_num(torch.softmax(scaled, dim=-2))


def test_scale_after_softmax_is_caught():
    for claim_id in ("A4", "B3", "A3"):
        assert _caught(claim_id, _rewrite_weights(_scale_after_softmax)), claim_id


def test_softmax_over_queries_is_caught():
    for claim_id in ("A2", "A3", "B3", "D3"):
        assert _caught(claim_id, _rewrite_weights(_softmax_over_queries)), claim_id


def test_the_right_formula_written_as_the_same_hooks_passes():
    right = _rewrite_weights(lambda scaled, d_k: torch.nan_to_num(torch.softmax(scaled, dim=-1)))
    for claim_id in ("A2", "A3", "A4", "B3"):
        assert run_check(claim_id, right).passed, claim_id


def test_layer_norm_across_positions_is_caught(monkeypatch):
    def across_positions(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        mu = x.mean(dim=-2, keepdim=True)                                    # over the sequence axis
        var = x.var(dim=-2, unbiased=False, keepdim=True)
        y = (x - mu) / torch.sqrt(var + eps)
        return y * weight + bias if weight is not None else y
    monkeypatch.setattr(F, "layer_norm", across_positions)
    for claim_id in ("B5", "B3", "B4"):
        assert not run_check(claim_id).passed, claim_id


def test_layer_norm_across_the_batch_is_caught(monkeypatch):
    def across_batch(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        dims = tuple(range(x.dim() - 2)) + (-1,) if x.dim() > 2 else (-1,)
        mu = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, unbiased=False, keepdim=True)
        y = (x - mu) / torch.sqrt(var + eps)
        return y * weight + bias if weight is not None else y
    monkeypatch.setattr(F, "layer_norm", across_batch)
    assert not run_check("B5").passed


@pytest.mark.parametrize("shift", ["sees_future", "misses_itself"])
def test_causal_mask_off_by_one_is_caught(monkeypatch, shift):
    def off_by_one(n_query, n_key=None, offset=0, device=None):
        n_key = n_query + offset if n_key is None else n_key
        q = torch.arange(n_query, device=device).unsqueeze(1) + offset
        k = torch.arange(n_key, device=device).unsqueeze(0)
        return k <= q + 1 if shift == "sees_future" else k < q
    monkeypatch.setattr(attention_module, "causal_mask", off_by_one)
    for claim_id in ("D3", "D4"):
        assert not run_check(claim_id).passed, claim_id


def test_triangle_on_cross_attention_is_caught():
    # cross-attention's visibility (the `mask` hook point) gets a causal triangle: target row i sees source j <= i
    def triangle(mask, name):                                                # (batch, query, key)
        return mask & torch.ones_like(mask).tril()
    assert _caught("D2", {"decoder.*.cross_attention.mask": triangle})
    assert run_check("D2", {"decoder.*.cross_attention.mask": lambda mask, name: mask}).passed   # identity: holds


def test_pad_labels_in_the_loss_are_caught(monkeypatch):
    def loss_with_pad(self, src, tgt_in, labels, label_smoothing=0.0, src_pad=None):
        logits = self(src, tgt_in, src_pad)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"), labels.numel()
    monkeypatch.setattr(Transformer, "loss", loss_with_pad)
    assert not run_check("E3").passed


def test_pad_keys_left_visible_are_caught():
    # the source padding is dropped from the visibility of encoder self-attention and cross-attention
    every_key = {"encoder.*.self_attention.mask": lambda mask, name: torch.ones_like(mask),
                 "decoder.*.cross_attention.mask": lambda mask, name: torch.ones_like(mask)}
    for claim_id in ("E1", "E4", "D2"):
        assert _caught(claim_id, every_key), claim_id


def _caught(claim_id: str, interventions: dict) -> bool:
    """The check fails on a model with the bug, by its measurement (not by crashing on the hooks)."""
    m = run_check(claim_id, interventions)
    return not m.passed and "error" not in m.values


def _rewrite_weights(bug):
    """Interventions on every head: remember its q and scaled scores, then replace its weights by bug(scaled, d_k)."""
    seen = {}

    def keep(value, name):
        seen[name] = value
        return value

    def rewrite(value, name):
        head = name.rsplit(".", 1)[0]
        return bug(seen[f"{head}.scaled_scores"], seen[f"{head}.q"].size(-1))
    return {"*.head.*.q": keep, "*.head.*.scaled_scores": keep, "*.head.*.weights": rewrite}


def test_causal_mask_off_by_one_written_as_a_hook_is_caught():
    def sees_next(mask, name):                                              # row i also sees key i + 1
        return mask | torch.ones_like(mask).tril(1).triu(1)
    for claim_id in ("D3", "D4"):
        assert _caught(claim_id, {"decoder.*.self_attention.mask": sees_next}), claim_id


def test_switched_off_head_ignored_is_caught(monkeypatch):
    """The head switch is a hook that replaces the head's output; a hook whose value is dropped is caught."""
    from glassformer.model.hooks import HookPoint

    def replacement_ignored(self, x):
        for name, fn in self.fns:
            fn(x, name)                                                      # called, its result thrown away
        return x
    monkeypatch.setattr(HookPoint, "forward", replacement_ignored)
    for claim_id in ("B8", "G1"):
        assert not run_check(claim_id).passed, claim_id


@pytest.mark.slow
def test_lesson_package_does_not_import_the_wings_above_it():
    code = ("import sys, glassformer.lesson.claims, glassformer.lesson.commands; "
            "sys.exit(1 if any(m.split('.')[:2][-1] in ('data', 'decoding', 'training', 'interpret', 'interop', 'lab') "
            "for m in sys.modules if m.startswith('glassformer.')) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_seeded_model_is_reproducible_and_leaves_the_global_seed_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = claims.seeded_model(3)
    after = torch.rand(1)
    b = claims.seeded_model(3)
    assert torch.equal(before, after)
    assert torch.equal(a.src_embed.token.weight, b.src_embed.token.weight)
