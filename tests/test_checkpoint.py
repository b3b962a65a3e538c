"""Checkpoints: atomic writes, weight/optimizer/RNG round trips, tied weights, keep-K, never unpickled."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
import torch

from glassformer.data import checkpoint as ck
from glassformer.model import ModelConfig, Transformer


def _tiny() -> Transformer:
    return Transformer(ModelConfig.tiny(src_vocab=50, tgt_vocab=40, dropout=0.1))


def _is_safetensors(path) -> bool:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8: 8 + n])
    return isinstance(header, dict) and 8 + n <= len(raw)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    target = tmp_path / "state.json"
    ck.write_json(target, {"step": 1})
    with pytest.raises(RuntimeError):
        with ck.atomic_path(target) as tmp:
            tmp.write_text("{half a file")
            raise RuntimeError("interrupted mid-write")
    assert json.loads(target.read_text()) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]   # no temp file left behind
    ck.write_json(target, {"step": 2})
    assert json.loads(target.read_text()) == {"step": 2}


def test_weights_round_trip_with_tied_embedding(tmp_path):
    a, b = _tiny(), _tiny()
    assert not torch.equal(a.head.weight, b.head.weight)
    ck.save_weights(a, tmp_path / ck.MODEL)
    assert _is_safetensors(tmp_path / ck.MODEL)
    ck.load_weights(b, tmp_path / ck.MODEL)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert b.head.weight.data_ptr() == b.tgt_embed.token.weight.data_ptr()   # still tied
    wrong = Transformer(ModelConfig.tiny(src_vocab=51, tgt_vocab=40))
    with pytest.raises((ValueError, RuntimeError)):
        ck.load_weights(wrong, tmp_path / ck.MODEL)


def _adam_steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        src = torch.randint(4, 50, (3, 5), generator=g)
        tgt = torch.randint(4, 40, (3, 4), generator=g)
        loss, count = model.loss(src, tgt, tgt)
        opt.zero_grad()
        (loss / count).backward()
        opt.step()


def test_optimizer_round_trip_continues_identically(tmp_path):
    torch.manual_seed(0)
    model = _tiny().eval()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    _adam_steps(model, opt, 3, seed=1)
    ck.save_weights(model, tmp_path / ck.MODEL)
    ck.save_optimizer(opt, tmp_path / ck.OPTIMIZER)
    assert _is_safetensors(tmp_path / ck.OPTIMIZER)

    clone = _tiny().eval()
    ck.load_weights(clone, tmp_path / ck.MODEL)
    opt2 = torch.optim.Adam(clone.parameters(), lr=5.0)                   # wrong lr: must be restored
    ck.load_optimizer(opt2, tmp_path / ck.OPTIMIZER)
    assert opt2.param_groups[0]["lr"] == 1e-3 and opt2.param_groups[0]["betas"] == (0.9, 0.98)
    _adam_steps(model, opt, 2, seed=2)
    _adam_steps(clone, opt2, 2, seed=2)
    for x, y in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(x, y)


def test_rng_states_round_trip_through_json():
    state = json.loads(json.dumps(ck.rng_state()))
    first = (torch.rand(3).tolist(), random.random(), np.random.rand())
    ck.set_rng_state(state)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == first


def test_checkpoint_layout_keep_k_and_best(tmp_path):
    model = _tiny()
    opt = torch.optim.Adam(model.parameters())
    state = {"step": 0, "checkpoints": []}
    for step in (10, 20, 30, 40):
        state = {**state, "step": step}
        ck.save_checkpoint(tmp_path, model, opt, state, keep=2)
        state = ck.read_json(tmp_path / ck.STATE)
    assert state["checkpoints"] == ["step-30", "step-40"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-30", "step-40"]
    for name in (ck.MODEL, ck.OPTIMIZER):
        assert _is_safetensors(tmp_path / "checkpoints" / "step-40" / name)
    ck.save_best(tmp_path, model, {"step": 20})
    assert ck.weights_path(tmp_path) == tmp_path / "best" / ck.MODEL


def test_loading_never_unpickles(tmp_path, monkeypatch):
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer

    src = SourceTokenizer.train([["我", "好"], ["你", "好"]])
    tgt = TargetTokenizer.train(["I am well", "you are well"], vocab_size=120)
    model = Transformer(ModelConfig.tiny(src_vocab=src.vocab_size, tgt_vocab=tgt.vocab_size))
    cfg = model.cfg
    ck.save_run_files(tmp_path, cfg, {"seed": 1}, src, tgt)
    ck.save_checkpoint(tmp_path, model, torch.optim.Adam(model.parameters()), {"step": 1}, keep=1)
    for name in (ck.CONFIG, ck.VOCAB, ck.STATE):
        json.loads((tmp_path / name).read_text())
    import pickle

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint was unpickled")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    loaded, s, t, config = ck.load_translator_parts(tmp_path)
    assert config["train"] == {"seed": 1}
    assert torch.equal(loaded.src_embed.token.weight, model.src_embed.token.weight)
    opt = torch.optim.Adam(loaded.parameters())
    ck.load_optimizer(opt, tmp_path / ck.OPTIMIZER)


def test_average_into_is_the_elementwise_mean(tmp_path):
    a, b, avg = _tiny(), _tiny(), _tiny()
    ck.save_weights(a, tmp_path / "a.safetensors")
    ck.save_weights(b, tmp_path / "b.safetensors")
    ck.average_into(avg, [tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    torch.testing.assert_close(avg.encoder.layers[0].ffn.w_1.weight,
                               (a.encoder.layers[0].ffn.w_1.weight + b.encoder.layers[0].ffn.w_1.weight) / 2)
    torch.testing.assert_close(avg.head.weight, (a.head.weight + b.head.weight) / 2)


def test_a_folder_of_the_earlier_layout_is_one_line_saying_to_retrain():
    from glassformer.errors import UsageError
    from glassformer.model import ModelConfig

    earlier = {**ModelConfig.tiny().to_dict(), "norm": "post"}
    del earlier["norm_placement"]
    with pytest.raises(UsageError, match="earlier glassformer layout.*glassformer train") as info:
        ModelConfig.from_dict(earlier)
    assert "\n" not in str(info.value)


def test_config_rejects_unknown_fields():
    from glassformer.model import ModelConfig

    with pytest.raises(ValueError, match="unknown field 'activations'"):
        ModelConfig.from_dict({**ModelConfig.tiny().to_dict(), "activations": "relu"})
