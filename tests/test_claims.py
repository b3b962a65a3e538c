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
from glassformer.lesson.claims import CHECKS, Claim, run_all, run_check
from glassformer.model.attention import CrossAttention
from glassformer.model.transformer import Transformer

CLAIM_IDS = ([f"A{i}" for i in range(1, 8)] + [f"B{i}" for i in range(1, 9)] + [f"C{i}" for i in range(1, 7)]
             + [f"D{i}" for i in range(1, 8)] + [f"E{i}" for i in range(1, 5)] + ["F1", "G1", "G2"])


def test_one_check_per_claim_in_order():
    assert list(CHECKS) == CLAIM_IDS


@pytest.mark.parametrize("claim_id", CLAIM_IDS)
def test_claim_holds(claim_id):
    claim = run_check(claim_id)
    assert claim.passed, f"{claim_id}: {claim.measured}"
    assert claim.measured and claim.title and any(ch.isdigit() for ch in claim.measured)


def test_run_all_runs_every_registered_check_in_order(monkeypatch):
    calls = []
    fake = {i: (f"claim {i}", lambda i=i: (calls.append(i) or f"measured {i}", i != "B2")) for i in ("A1", "B2", "C3")}
    monkeypatch.setattr(claims, "CHECKS", fake)
    result = run_all()
    assert calls == ["A1", "B2", "C3"] and all(isinstance(c, Claim) for c in result)
    assert [(c.id, c.passed, c.measured) for c in result] == [
        ("A1", True, "measured A1"), ("B2", False, "measured B2"), ("C3", True, "measured C3")]


def test_a_crashing_check_is_a_failure(monkeypatch):
    def broken():
        raise RuntimeError("shape mismatch")
    monkeypatch.setitem(CHECKS, "A1", ("rows stay rows", broken))
    claim = run_check("A1")
    assert not claim.passed and "RuntimeError: shape mismatch" in claim.measured


# ---- plausible bugs, patched into the model code; the guarding checks must fail -----------------

def _buggy_attend(bug: str):
    """The math backend with one mistake; it still passes every value through the head hook points."""
    def attend_math(q, k, v, mask=None, bias=None, *, scale=True, dropout=0.0, heads=None):
        def hook(part, x):
            return x if heads is None else attention_module._per_head(heads, part, x)
        q, k, v = hook("q", q), hook("k", k), hook("v", v)
        scores = hook("scores", q @ k.transpose(-2, -1))                     # (batch, heads, query, key)
        root = math.sqrt(q.size(-1)) if scale else 1.0
        scaled = scores if bug == "scale_after_softmax" else scores / root
        if bias is not None:
            scaled = scaled + bias
        if mask is not None:
            scaled = scaled.masked_fill(~mask, float("-inf"))
        scaled = hook("scaled_scores", scaled)
        if bug == "scale_after_softmax":
            weights = torch.softmax(scaled, dim=-1) / root                   # probabilities divided afterwards
        else:                                                                # softmax along the query axis
            weights = torch.nan_to_num(torch.softmax(scaled, dim=-2))
        weights = hook("weights", weights)
        return hook("output", weights @ v)
    return attend_math


def test_scale_after_softmax_is_caught(monkeypatch):
    monkeypatch.setattr(attention_module, "attend_math", _buggy_attend("scale_after_softmax"))
    for claim_id in ("A4", "B3", "A3"):
        assert not run_check(claim_id).passed, claim_id


def test_softmax_over_queries_is_caught(monkeypatch):
    monkeypatch.setattr(attention_module, "attend_math", _buggy_attend("query_axis"))
    for claim_id in ("A2", "A3", "B3"):
        assert not run_check(claim_id).passed, claim_id


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


def test_triangle_on_cross_attention_is_caught(monkeypatch):
    attend = CrossAttention.attend

    def with_triangle(self, q, k, v, mask, bias, causal_offset=None):
        return attend(self, q, k, v, mask, bias, 0)                         # queries see keys j <= i only
    monkeypatch.setattr(CrossAttention, "attend", with_triangle)
    for claim_id in ("D2", "D4"):
        assert not run_check(claim_id).passed, claim_id


def test_pad_labels_in_the_loss_are_caught(monkeypatch):
    def loss_with_pad(self, src, tgt_in, labels, label_smoothing=0.0, src_pad=None):
        logits = self(src, tgt_in, src_pad)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"), labels.numel()
    monkeypatch.setattr(Transformer, "loss", loss_with_pad)
    assert not run_check("E3").passed


def test_pad_keys_left_visible_are_caught(monkeypatch):
    monkeypatch.setattr("glassformer.model.transformer.padding_mask",
                        lambda pad: torch.ones_like(pad)[:, None, None, :].bool())
    for claim_id in ("E1", "E4", "D2"):
        assert not run_check(claim_id).passed, claim_id


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


def test_lesson_package_does_not_import_translation():
    code = ("import sys, glassformer.lesson.claims, glassformer.lesson.commands; "
            "sys.exit(1 if any(m.startswith('glassformer.translation') for m in sys.modules) else 0)")
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
