"""Training in the page engine (lab/static/engine/train.js) against PyTorch, and the toy learning.

The same initial weights (a PyTorch model's, float32 so that `model.double()` holds exactly the bundle's), the same
batches (padded for PyTorch, one sentence at a time in the engine), the same label smoothing, gradient clipping,
Adam (betas (0.9, 0.98), eps 1e-9, as training/loop.py) and warm-up schedule: after N steps every weight and every
step's loss agree to 1e-9. A toy trained from its seed in the engine goes from chance to a held-out accuracy
above a threshold within a step budget, and its held-out and validation sequences are never drawn for training.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

import glassformer.model.transformer as transformer
from glassformer.lab.bundle import write_bundle
from glassformer.model import ModelConfig, Transformer
from test_engine import ENGINE, NODE, run_engine, write

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js (node) on PATH")


def float64_loss(logits, labels, smoothing):
    """transformer._label_smoothed_nll without its float32 cast (the engine computes in float64)."""
    return F.cross_entropy(logits, labels, reduction="sum", label_smoothing=smoothing)


def factor(opts: dict, t: int) -> float:
    """The documented schedule at step t (from 1): t / warmup during the warm-up, then 1 or sqrt(warmup / t)."""
    if t < opts["warmup"]:
        return t / opts["warmup"]
    return math.sqrt(opts["warmup"] / t) if opts["schedule"] == "inverse-sqrt" else 1.0


def random_batches(n_steps: int, size: int, vocab: int, seed: int) -> list[list[dict]]:
    """Batches of (src, tgt_in, labels) id lists of mixed lengths (the engine's pairs)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_steps):
        pairs = []
        for _ in range(size):
            src = rng.integers(4, vocab, int(rng.integers(3, 9))).tolist()
            tgt = rng.integers(4, vocab, int(rng.integers(2, 8))).tolist()
            pairs.append({"src": src, "tgtIn": [1, *tgt], "labels": [*tgt, 2]})
        batches.append(pairs)
    return batches


def torch_steps(model, batches, opts) -> list[float]:
    """training/loop.py's step on padded batches: loss_sum / real labels, backward, clip, Adam, the schedule."""
    optimizer = torch.optim.Adam(model.parameters(), lr=opts["lr"], betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda taken: factor(opts, taken + 1))
    losses = []
    pad = lambda rows: pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=0)  # noqa: E731
    for pairs in batches:
        src, tgt_in, labels = (pad([p[k] for p in pairs]) for k in ("src", "tgtIn", "labels"))
        optimizer.zero_grad()
        loss = model.loss_sum(src, tgt_in, labels, opts["label_smoothing"]) / int((labels != 0).sum())
        loss.backward()
        if opts["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts["clip"])
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("changes, opts", [
    (dict(encoder_layers=1, decoder_layers=1), dict(lr=0.003, warmup=3, schedule="constant", label_smoothing=0.0,
                                                    clip=1.0)),
    (dict(norm_placement="pre", positions="relative", relative_clip=4, tie_target=False),
     dict(lr=0.01, warmup=2, schedule="inverse-sqrt", label_smoothing=0.1, clip=0.05)),
    (dict(positions="learned", d_k=6, d_v=10), dict(lr=0.002, warmup=4, schedule="constant", label_smoothing=0.2,
                                                    clip=0.0)),
])
def test_training_steps_equal_pytorch(tmp_path, monkeypatch, changes, opts):
    monkeypatch.setattr(transformer, "_label_smoothed_nll", float64_loss)
    cfg = ModelConfig.tiny(**{"src_vocab": 16, "tgt_vocab": 14, "d_model": 16, "heads": 2, "d_ff": 32, **changes})
    torch.manual_seed(4)
    model = Transformer(cfg)
    bundle = write(tmp_path, write_bundle(model, {"source": {}, "target": {}}))
    model = model.double()
    batches = random_batches(6, 5, 14, seed=2)
    js = run_engine(tmp_path, bundle, [{"kind": "train_steps", "batches": batches, "opts": opts}])["results"][0]
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = torch_steps(model, batches, opts)
    assert np.allclose(js["losses"], losses, rtol=1e-9, atol=0), (js["losses"], losses)
    assert set(js["tensors"]) == {name for name, _ in model.named_parameters()}
    moved, scale = 0.0, max(float(p.detach().abs().max()) for p in model.parameters())
    for name, p in model.named_parameters():
        ours = np.array(js["tensors"][name]).reshape(tuple(p.shape))
        theirs = p.detach().numpy()
        # the keys' bias has a zero gradient (a shift shared by every key leaves the softmax as it is): its
        # round-off, which Adam's normalisation turns into steps of ~1e-11, is measured on the weights' scale
        own = scale if name.endswith("w_k.bias") else np.abs(theirs).max()
        assert np.abs(ours - theirs).max() <= 1e-9 * own, name
        moved = max(moved, float((p.detach() - start[name]).abs().max()))
    assert moved > opts["lr"]                                              # the steps changed the weights


PLANTS = {
    "the loss summed instead of divided by the batch's tokens": ("1 / count);", "1);"),
    "Adam without its bias correction": ("const stepSize = lr / (1 - b1 ** t), root2 = Math.sqrt(1 - b2 ** t);",
                                         "const stepSize = lr, root2 = 1;"),
    "the warm-up counted from 0": ("learningRate(o, optimizer.t + 1)", "learningRate(o, optimizer.t)"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_bug_turns_the_training_check_red(tmp_path, monkeypatch, plant):
    monkeypatch.setattr(transformer, "_label_smoothed_nll", float64_loss)
    engine = tmp_path / "engine"
    shutil.copytree(ENGINE, engine)
    old, new = PLANTS[plant]
    text = (engine / "train.js").read_text()
    assert text.count(old) == 1, old
    (engine / "train.js").write_text(text.replace(old, new))
    cfg = ModelConfig.tiny(src_vocab=16, tgt_vocab=14, d_model=16, heads=2, d_ff=32, encoder_layers=1,
                           decoder_layers=1)
    torch.manual_seed(4)
    model = Transformer(cfg)
    bundle = write(tmp_path, write_bundle(model, {"source": {}, "target": {}}))
    opts = dict(lr=0.003, warmup=3, schedule="constant", label_smoothing=0.1, clip=0.0)
    batches = random_batches(3, 4, 14, seed=5)
    js = run_engine(tmp_path, bundle, [{"kind": "train_steps", "batches": batches, "opts": opts}],
                    engine=engine)["results"][0]
    model = model.double()
    torch_steps(model, batches, opts)
    worst = max(float(np.abs(np.array(js["tensors"][n]).reshape(tuple(p.shape)) - p.detach().numpy()).max())
                for n, p in model.named_parameters())
    assert worst > 1e-6


def test_the_toy_learns_and_never_trains_on_its_held_out_sequences(tmp_path):
    """Copying 4-6 of 8 symbols, d 16: from chance to a held-out exact match of at least 0.7 within 300 steps."""
    opts = dict(task="copy", seed=3, d_model=16, heads=2, d_ff=32, symbols=8, min_length=4, max_length=6, batch=16,
                lr=0.01, warmup=20, steps=300, seconds=120, held_out=60, validation=40, eval_every=50)
    out = run_engine(tmp_path, None, [{"kind": "learn", "opts": opts}])["results"][0]
    assert out["before"] < 0.05
    assert out["accuracy"] >= 0.7, out["accuracy"]
    assert out["steps"] <= 300 and len(out["loss"]) == out["steps"] and out["loss"][-1] < out["loss"][0] / 4
    held = {" ".join(s) for s, _ in out["heldOut"]}
    valid = {" ".join(s) for s, _ in out["validation"]}
    assert len(held) == 60 and len(valid) == 40 and not held & valid
    assert not {" ".join(s) for s, _ in out["drawn"]} & (held | valid)
    assert all(s == t for s, t in out["heldOut"])                           # the task is copying
