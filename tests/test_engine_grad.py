"""The page engine's backward pass (lab/static/engine/model.js) against PyTorch autograd in float64.

Each ModelConfig variant the engine runs is trained a few dozen Adam steps here (float32, so `model.double()` holds
exactly the bundle's weights), then one sentence's label-smoothed loss (a PAD inside the source, PAD labels at the
end of the target) is differentiated by both: every weight's gradient and the gradients at the two embedding hook
points must agree to 1e-9 relative. Central finite differences check the engine on its own, a source of PAD only
(every attention row empty) gives zero gradients and no NaN, and planted bugs in a copy of the engine (softmax's
backward without its -p p^T term, LayerNorm's without its mean terms, a tied matrix's second gradient overwriting
the first, PAD rows counted in the loss) turn the comparisons red.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import glassformer.model.transformer as transformer
from glassformer.lab.bundle import write_bundle
from glassformer.model import ModelConfig, Transformer
from test_engine import ENGINE, NODE, RTOL, js_array, run_engine, write

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")

SMOOTHING = 0.1
SRC = [5, 6, 7, 0, 9, 10, 11]                       # a PAD inside the source
TGT_IN = [1, 4, 9, 6, 7, 8, 0]                      # BOS first; the last input is PAD
LABELS = [4, 9, 6, 7, 8, 0, 0]                      # the last two rows are PAD: left out of the loss
FLOOR = 1e-6                                        # see worst()

VARIANTS = {
    "post": {},
    "pre": dict(norm_placement="pre"),
    "learned, final norm": dict(final_norm=True, positions="learned"),
    "relative": dict(positions="relative", relative_clip=3),
    "rope, unscaled scores": dict(positions="rope", scale_scores=False, norm_placement="pre"),
    "no positions": dict(positions="none"),
    "silu, untied, no bias": dict(activation="silu", bias=False, head_bias=True, tie_target=False,
                                  scale_embeddings=False),
    "shared, d_k != d_v": dict(share_embeddings=True, tgt_vocab=24, position_layout="halves", d_k=6, d_v=10),
}


def trained_variant(changes: dict, steps: int = 30) -> Transformer:
    """A tiny model of `changes` after `steps` Adam steps on random reversals (float32), as float64."""
    cfg = ModelConfig.tiny(**{"src_vocab": 24, "tgt_vocab": 20, **changes})
    generator = torch.Generator().manual_seed(3)
    torch.manual_seed(1)
    model = Transformer(cfg)
    if cfg.head_bias:
        torch.nn.init.normal_(model.head.bias)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    for _ in range(steps):
        src = torch.randint(4, 20, (8, 6), generator=generator)
        tgt = src.flip(1)
        tgt_in = torch.cat([torch.full((8, 1), cfg.bos_id), tgt[:, :-1]], 1)
        optimizer.zero_grad()
        loss, count = model.loss(src, tgt_in, tgt, SMOOTHING)
        (loss / count).backward()
        optimizer.step()
    return model.double().eval()


def float64_loss(logits, labels, smoothing):
    """transformer._label_smoothed_nll without its float32 cast (the engine computes in float64)."""
    return F.cross_entropy(logits, labels, reduction="sum", label_smoothing=smoothing)


def torch_gradients(model, src, tgt_in, labels=None, row=None, token=None, contrast=None, off=()):
    """(value, {parameter name: grad}, grad at encoder.embedding, grad at decoder.embedding) by autograd."""
    kept = {}

    def keep(value, name):
        value.retain_grad()
        kept[name] = value
        return value

    model.zero_grad()
    fns = {"encoder.embedding": keep, "decoder.embedding": keep}
    fns |= {f"{head}.output": (lambda v, n: torch.zeros_like(v)) for head in off}
    with model.intervene(fns):
        if labels is not None:
            value = model.loss_sum(torch.tensor([src]), torch.tensor([tgt_in]), torch.tensor([labels]), SMOOTHING)
        else:
            logp = torch.log_softmax(model(torch.tensor([src]), torch.tensor([tgt_in]))[0, row], dim=-1)
            value = logp[token] - (logp[contrast] if contrast is not None else 0)
    value.backward()
    grads = {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in model.named_parameters()}
    return float(value.detach()), grads, kept["encoder.embedding"].grad[0], kept["decoder.embedding"].grad[0]


def worst(js: dict, value, grads, src_grad, tgt_grad) -> tuple[str, float]:
    """The worst error over every weight's gradient and the two embedding gradients: max |difference| over the
    tensor's largest entry, or over FLOOR x the largest entry of all when that is larger (the keys' bias has a
    gradient of ~1e-17: the softmax does not see a shift that is the same for every key)."""
    assert set(js["params"]) == set(grads), sorted(set(js["params"]) ^ set(grads))
    pairs = {name: (g.numpy(), np.array(js["params"][name]).reshape(tuple(g.shape))) for name, g in grads.items()}
    pairs["encoder.embedding"] = src_grad.detach().numpy(), js_array(js["src"])
    pairs["decoder.embedding"] = tgt_grad.detach().numpy(), js_array(js["tgt"])
    largest = max(float(np.abs(a).max()) for a, _ in pairs.values())
    errors = {name: float(np.abs(a - b).max()) / max(float(np.abs(a).max()), FLOOR * largest, 1e-300)
              for name, (a, b) in pairs.items()}
    errors["value"] = abs(js["value"] - value) / max(abs(value), 1e-300)
    name = max(errors, key=errors.get)
    return name, errors[name]


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """name -> (float64 model, bundle path) for every variant."""
    folder = tmp_path_factory.mktemp("grad")
    out = {}
    for name, changes in VARIANTS.items():
        model = trained_variant(changes)
        out[name] = model, write(folder, write_bundle(model, {"source": {}, "target": {}}), f"{len(out)}.json")
    return out


@pytest.fixture(autouse=True)
def _float64_loss(monkeypatch):
    monkeypatch.setattr(transformer, "_label_smoothed_nll", float64_loss)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_gradient_equals_pytorch_autograd(variants, tmp_path, variant):
    model, bundle = variants[variant]
    head = ["decoder.1.cross_attention.head.2"]
    cases = [{"kind": "grad", "src": SRC, "tgt": TGT_IN, "labels": LABELS, "smoothing": SMOOTHING},
             {"kind": "grad", "src": SRC, "tgt": TGT_IN, "row": 3, "token": 7, "contrast": 9, "off": head}]
    out = run_engine(tmp_path, bundle, cases)["results"]
    value, grads, src_grad, tgt_grad = torch_gradients(model, SRC, TGT_IN, LABELS)
    assert sum(float(g.abs().sum()) for g in grads.values()) > 0
    name, error = worst(out[0], value, grads, src_grad, tgt_grad)
    assert error < RTOL, (name, error)
    name, error = worst(out[1], *torch_gradients(model, SRC, TGT_IN, row=3, token=7, contrast=9, off=head))
    assert error < RTOL, (name, error)
    # the rows after the objective's row and the PAD-label rows get nothing back through the causal mask
    assert not js_array(out[1]["tgt"])[4:].any()


def test_central_differences_agree_on_random_weights(variants, tmp_path):
    model, bundle = variants["pre"]
    rng = np.random.default_rng(0)
    names = [n for n, p in model.named_parameters()]
    picks = []
    for name in rng.choice(names, 40):
        size = dict(model.named_parameters())[name].numel()
        picks.append([str(name), int(rng.integers(size))])
    out = run_engine(tmp_path, bundle, [{"kind": "fd", "src": SRC, "tgt": TGT_IN, "labels": LABELS,
                                         "smoothing": SMOOTHING, "picks": picks, "h": 1e-5}])["results"][0]
    analytic, numeric = np.array(out["analytic"]), np.array(out["numeric"])
    scale = np.abs(analytic).max()
    assert scale > 1e-3
    assert np.abs(analytic - numeric).max() < 1e-7 * max(scale, 1.0), np.abs(analytic - numeric).max()


def test_a_source_of_pad_only_gives_zero_gradients_and_no_nan(variants, tmp_path):
    """Every encoder self-attention row and every cross-attention row sees no key: the decoder cannot read the
    source, so the source side's gradients are exactly zero, and nothing is NaN."""
    model, bundle = variants["post"]
    src = [0, 0, 0, 0]
    js = run_engine(tmp_path, bundle, [{"kind": "grad", "src": src, "tgt": TGT_IN, "labels": LABELS,
                                        "smoothing": SMOOTHING}])["results"][0]
    value, grads, src_grad, tgt_grad = torch_gradients(model, src, TGT_IN, LABELS)
    name, error = worst(js, value, grads, src_grad, tgt_grad)
    assert error < RTOL, (name, error)
    everything = [v for a in js["params"].values() for v in a] + js["src"]["data"] + js["tgt"]["data"]
    assert all(v is not None and np.isfinite(v) for v in everything)
    assert not any(js["src"]["data"])
    encoder = [v for n, a in js["params"].items() if n.startswith("encoder.") or ".cross_attention.w_k" in n
               or ".cross_attention.w_v" in n for v in a]
    assert len(encoder) > 1000 and not any(encoder)
    assert any(js["tgt"]["data"])


# ---- planted bugs turn the comparisons red -------------------------------------------------------------

PLANTS = {
    "softmax without its -p p^T term": (
        "dz[i * m + j] += p[i * m + j] * (dp[i * m + j] - dot);", "dz[i * m + j] += p[i * m + j] * dp[i * m + j];"),
    "LayerNorm without its mean terms": (
        "dx[at + k] += rstd[i] * (dxhat - meanD - xhat[at + k] * meanDX);", "dx[at + k] += rstd[i] * dxhat;"),
    "a tied matrix's second gradient overwrites the first": (
        "    let g = this.weightGrads.get(t);\n    if (!g) {", "    let g = null;\n    {"),
    "PAD rows counted in the loss": ("    if (y === padId) continue;", ""),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_turns_the_gradient_checks_red(variants, tmp_path, plant):
    model, bundle = variants["post"]
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    old, new = PLANTS[plant]
    text = (engine / "model.js").read_text()
    assert text.count(old) == 1, old                                        # the code the bug goes into is there
    (engine / "model.js").write_text(text.replace(old, new))
    js = run_engine(tmp_path, bundle, [{"kind": "grad", "src": SRC, "tgt": TGT_IN, "labels": LABELS,
                                        "smoothing": SMOOTHING}], engine=engine)["results"][0]
    name, error = worst(js, *torch_gradients(model, SRC, TGT_IN, LABELS))
    assert error > 1e-3, (name, error)
