"""Attribution patching (interpret/attribution_patching.py): each cell is the first-order estimate
(a_clean − a_corrupt) · ∂p/∂a, checked against a finite difference taken through the model's own hooks, and
laid out as activation patching's scan."""

from __future__ import annotations

import pytest
import torch

# the same toy pair and seeded model as tests/test_patching.py: 他 → 她 at position 4; row `gave` predicts `him`
from tests.test_patching import CLEAN, HIM, ROW, SHE, TGT_IN, toy_model

from glassformer.errors import UsageError
from glassformer.interpret.attribution_patching import approximate_scan, correlation
from glassformer.interpret.patching import lesson_patching, patch_scan


@pytest.fixture(scope="module")
def model():
    return toy_model()


def _t(ids):
    return torch.tensor([ids])


def _directional(model, site: str, position: int | None, eps: float = 1e-6) -> float:
    """(p(a_corrupt + eps (a_clean − a_corrupt)) − p_corrupt) / eps at one site, by two forward passes with the
    value replaced through model.intervene: the derivative the estimate claims, without autograd."""
    with torch.no_grad(), model.probes(site) as rec:
        model(_t(CLEAN), _t(TGT_IN))
    clean = rec[site]

    def moved(value, name):
        out = value.clone()
        if position is None:
            out = value + eps * (clean - value)
        else:
            out[:, position] = value[:, position] + eps * (clean[:, position] - value[:, position])
        return out

    def p(fns):
        with torch.no_grad(), model.probes("decoder.*.cross_attention.head.*.output"), model.intervene(fns):
            logits = model(_t(SHE), _t(TGT_IN))
        return float(torch.softmax(logits[0, ROW], dim=-1)[HIM])

    return (p({site: moved}) - p({})) / eps


def test_each_cell_is_the_directional_derivative_of_p(model):
    scan = approximate_scan(model, _t(CLEAN), _t(SHE), _t(TGT_IN), ROW, HIM)
    p_corrupt = scan["p_corrupt"]
    for layer, head in ((0, 0), (1, 1)):
        want = _directional(model, f"decoder.{layer}.cross_attention.head.{head}.output", None)
        assert scan["heads"][layer][head].p - p_corrupt == pytest.approx(want, rel=1e-4, abs=1e-9)
    for layer, name in ((0, "encoder.embedding"), (2, "encoder.1.output")):
        want = _directional(model, name, 4)
        assert scan["positions"][layer][4].p - p_corrupt == pytest.approx(want, rel=1e-4, abs=1e-9)
    assert abs(scan["positions"][0][4].p - p_corrupt) > 1e-6              # the estimate is not trivially zero


def test_layout_and_endpoints_match_activation_patching(model):
    approx = approximate_scan(model, _t(CLEAN), _t(SHE), _t(TGT_IN), ROW, HIM)
    exact = patch_scan(model, _t(CLEAN), _t(SHE), _t(TGT_IN), ROW, HIM)
    assert approx["p_clean"] == pytest.approx(exact["p_clean"], abs=1e-12)
    assert approx["p_corrupt"] == pytest.approx(exact["p_corrupt"], abs=1e-12)
    assert len(approx["heads"]) == 2 and all(len(layer) == model.cfg.heads for layer in approx["heads"])
    assert [len(layer) for layer in approx["positions"]] == [len(CLEAN)] * 3
    embedding = [c.fraction for c in approx["positions"][0]]
    assert all(f == 0.0 for j, f in enumerate(embedding) if j != 4)         # clean = corrupt there: no change
    gap = approx["p_clean"] - approx["p_corrupt"]
    total = sum(c.p - approx["p_corrupt"] for layer in approx["heads"] for c in layer)
    assert approx["all_heads"].fraction == pytest.approx(total / gap, rel=1e-12)   # first order: the sum
    assert approx["nothing"].fraction == 0.0


def test_frozen_weights_give_the_same_estimates(model):
    before = approximate_scan(model, _t(CLEAN), _t(SHE), _t(TGT_IN), ROW, HIM)
    model.requires_grad_(False)
    try:
        after = approximate_scan(model, _t(CLEAN), _t(SHE), _t(TGT_IN), ROW, HIM)
    finally:
        model.requires_grad_(True)
    cells = lambda s: [c.p for layer in s["heads"] + s["positions"] for c in layer]   # noqa: E731
    assert cells(after) == pytest.approx(cells(before), abs=1e-14)
    assert all(p.grad is None for p in model.parameters())                   # the weights' .grad untouched


def test_correlation_of_scans():
    def scan(values):
        return {"heads": [[{"fraction": v} for v in values[:2]]], "positions": [[{"fraction": v} for v in values[2:]]]}

    a = scan([0.1, 0.5, 0.9, None, 0.3])
    assert correlation(a, a) == pytest.approx(1.0)
    assert correlation(a, scan([-0.1, -0.5, -0.9, 0.2, -0.3])) == pytest.approx(-1.0)   # the None cell left out
    assert correlation(a, scan([0.2, 0.2, 0.2, 0.2, 0.2])) is None                      # no spread


def test_an_unknown_method_is_one_line():
    with pytest.raises(UsageError, match="method: expected one of activation, attribution"):
        lesson_patching(None, None, None, method="gradient")
