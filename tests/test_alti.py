"""ALTI+ (interpret/alti.py) on small seeded float64 models, post- and pre-norm: every attention block's
decomposition reconstructs its recorded output, rows are non-negative and sum to 1 with nothing from the
future, a second implementation written here with loops agrees, and two planted properties hold (no value
path in cross-attention: no source share; a self-attention that sees only BOS: only BOS and the row's own
token in the prefix). Then the source share in why(), the CLI and its one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from glassformer.cli import main
from glassformer.errors import UsageError
from glassformer.interpret.alti import alti_contributions, decompose
from glassformer.interpret.attribution import alti_attribution, attribute, source_share, source_shares
from glassformer.model import ModelConfig, Transformer, build_model

SRC = [4, 5, 6, 7, 8, 9, 10, 11, 12]                 # 我 昨天 给 了 他 一 本 书 。
TGT_IN = [1, 4, 5, 6, 7, 8, 9, 10]                   # <s> I gave him a book yesterday .
LABELS = [4, 5, 6, 7, 8, 9, 10, 2]
S, T = len(SRC), len(TGT_IN)


def _model(norm: str = "post", positions: str = "sinusoidal", **changes) -> Transformer:
    """Seeded, float64; every bias and LayerNorm γ, β moved off its initial value so each bias term counts."""
    cfg = ModelConfig.tiny(src_vocab=20, tgt_vocab=16, norm_placement=norm, positions=positions, **changes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        built = Transformer(cfg)
        with torch.no_grad():
            for p in built.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
    return built.double().eval()


def _ids():
    return torch.tensor([SRC]), torch.tensor([TGT_IN])


@pytest.fixture(scope="module", params=["post", "pre"])
def model(request) -> Transformer:
    return _model(request.param)


# ---- the decomposition -------------------------------------------------------------------------

@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "rope"])
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_every_attention_block_reconstructs_its_recorded_output(norm, positions):
    model = _model(norm, positions)
    src, tgt = _ids()
    blocks = decompose(model, src, tgt)
    with torch.no_grad(), model.probes("*.sublayer.*.normed", "*.sublayer.*.residual") as rec:
        model(src, tgt)
    assert [b.name for b in blocks] == ["encoder.0.self_attention", "encoder.1.self_attention",
                                        "decoder.0.self_attention", "decoder.0.cross_attention",
                                        "decoder.1.self_attention", "decoder.1.cross_attention"]
    for b in blocks:
        stack, layer, kind = b.name.split(".")
        sub = f"{stack}.{layer}.sublayer.{1 if kind == 'cross_attention' else 0}"
        y = rec[f"{sub}.normed" if norm == "post" else f"{sub}.residual"][0]     # what the block outputs
        terms = b.terms()
        assert terms.shape == (y.size(0), (1 + S) if b.cross else y.size(0), model.cfg.d_model)
        assert torch.allclose(terms.sum(1) + b.bias, y, atol=1e-10, rtol=0), b.name
        assert b.bias.abs().max() > 1e-3                                      # the bias is really there
        if b.name.startswith("decoder.") and not b.cross:
            future = torch.ones(T, T, dtype=torch.bool).triu(1)
            assert (terms[future] == 0).all()                                 # a row gets nothing from later rows


def test_a_pad_source_row_gets_exactly_zero(model):
    src, tgt = torch.tensor([SRC + [0, 0]]), torch.tensor([TGT_IN])
    m = alti_contributions(model, src, tgt)
    plain = alti_contributions(model, *_ids())
    assert (m[:, S: S + 2] == 0).all()
    assert torch.allclose(m[:, :S], plain[:, :S], atol=1e-12) and torch.allclose(m[:, S + 2:], plain[:, S:], atol=1e-12)


def test_rows_are_non_negative_sum_to_one_and_never_see_the_future(model):
    src, tgt = _ids()
    m = alti_contributions(model, src, tgt)                                   # (T, S + T)
    assert m.shape == (T, S + T) and m.dtype == torch.float64
    assert (m >= 0).all()
    assert torch.allclose(m.sum(1), torch.ones(T, dtype=torch.float64), atol=1e-12)
    prefix = m[:, S:]
    for r in range(T):
        assert (prefix[r, r + 1:] == 0).all()                                 # exact zeros after the row
        assert prefix[r, r] > 0 and m[r, :S].sum() > 0
    a = alti_attribution(model, src, tgt, [5, 2])
    assert torch.equal(a.source, m[[5, 2], :S]) and torch.equal(a.prefix, m[[5, 2], S:])
    assert a.value.isnan().all() and a.baseline is None
    assert torch.equal(attribute(model, src, tgt, [5, 2], [9, 6], "alti").source, a.source)


# ---- a second implementation, with loops ----------------------------------------------------------

def _naive_alti(model) -> np.ndarray:
    """ALTI+ again, deliberately plainly: per row, token and head, in numpy float64, from the weights and what
    one recorded pass gives (attention weights, sub-layer inputs, pre-norm sums, outputs, the encoder output)."""
    cfg, (src, tgt) = model.cfg, _ids()
    with torch.no_grad(), model.probes("*.head.*.weights", "*.sublayer.*", "encoder.output") as rec:
        model(src, tgt)

    def got(name):
        return rec[name][0].numpy().astype(np.float64)

    def np_(t):
        return t.detach().numpy().astype(np.float64)

    post, heads, dv = cfg.norm_placement == "post", cfg.heads, cfg.d_v

    def block(prefix, attn, sub, ln, values, cross):
        w_v, w_o, gamma = np_(attn.w_v.weight), np_(attn.w_o.weight), np_(ln.weight)   # biases: no token's
        x, s_sum = got(f"{sub}.input"), got(f"{sub}.residual")
        y = got(f"{sub}.normed") if post else s_sum
        a = [got(f"{prefix}.head.{h}.weights") for h in range(heads)]
        if not cross and not post:                                            # the values see LN(x_j) − β
            values = np.stack([gamma * (v - v.mean()) / np.sqrt(v.var() + ln.eps) for v in x])
        n, m = a[0].shape
        c = np.zeros((n, m + cross))
        for i in range(n):
            for j in range(m + cross):
                z = np.zeros(cfg.d_model)
                if (cross and j == 0) or (not cross and j == i):
                    z += x[i]                                                 # the residual
                if not (cross and j == 0):
                    k = j - 1 if cross else j
                    for h in range(heads):
                        wv_h = w_v[h * dv:(h + 1) * dv, :]                    # (d_v, d): nn.Linear is (out, in)
                        wo_h = w_o[:, h * dv:(h + 1) * dv]                    # (d, d_v)
                        z += a[h][i, k] * (wo_h @ (wv_h @ values[k]))
                if post:
                    z = gamma * (z - z.mean()) / np.sqrt(s_sum[i].var() + ln.eps)
                c[i, j] = max(0.0, np.abs(y[i]).sum() - np.abs(y[i] - z).sum())
            assert c[i].sum() > 0
            c[i] /= c[i].sum()
        return c

    enc = np.eye(S)
    for i, layer in enumerate(model.encoder.layers):
        c = block(f"encoder.{i}.self_attention", layer.self_attention, f"encoder.{i}.sublayer.0",
                  layer.sublayer[0].layer_norm, got(f"encoder.{i}.sublayer.0.input"), False)
        new = np.zeros((S, S))
        for a_ in range(S):
            for b_ in range(S):
                new[a_, b_] = sum(c[a_, j] * enc[j, b_] for j in range(S))
        enc = new
    memory = got("encoder.output")
    m = np.zeros((T, S + T))
    for r in range(T):
        m[r, S + r] = 1.0
    for i, layer in enumerate(model.decoder.layers):
        c = block(f"decoder.{i}.self_attention", layer.self_attention, f"decoder.{i}.sublayer.0",
                  layer.sublayer[0].layer_norm, got(f"decoder.{i}.sublayer.0.input"), False)
        m = np.array([[sum(c[r, j] * m[j, k] for j in range(T)) for k in range(S + T)] for r in range(T)])
        c = block(f"decoder.{i}.cross_attention", layer.cross_attention, f"decoder.{i}.sublayer.1",
                  layer.sublayer[1].layer_norm, memory, True)
        for r in range(T):
            row = c[r, 0] * m[r]
            for j in range(S):
                row[:S] += c[r, 1 + j] * enc[j]
            m[r] = row
    return m


def test_a_naive_implementation_with_loops_agrees(model):
    ours = alti_contributions(model, *_ids()).numpy()
    theirs = _naive_alti(model)
    assert np.allclose(ours, theirs, atol=1e-12, rtol=0), np.abs(ours - theirs).max()


# ---- planted properties ----------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["post", "pre"])
def test_cross_attention_without_a_value_path_gives_no_source_share(norm):
    """W^V = 0 in every cross-attention (b^V kept, and nonzero): nothing of the source reaches the decoder
    through a token, so every T_i(e_j) is 0, c_ij = max(0, ‖y‖₁ − ‖y‖₁) is exactly 0 and so is the share.
    A decomposition that gave the value bias to the tokens would make it positive."""
    model = _model(norm)
    src, tgt = _ids()
    assert min(source_shares(model, src, tgt, LABELS, "alti")) > 0.01        # the plain model does use the source
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.cross_attention.w_v.weight.zero_()
            layer.cross_attention.w_v.bias.normal_()
    shares = source_shares(model, src, tgt, LABELS, "alti")
    assert shares == [0.0] * T
    m = alti_contributions(model, src, tgt)
    assert (m[:, :S] == 0).all() and torch.allclose(m.sum(1), torch.ones(T, dtype=torch.float64), atol=1e-12)


def _bos_only(value, name):
    out = torch.zeros_like(value)                                             # (batch, query, key)
    out[..., 0] = 1.0
    return out


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_a_self_attention_that_sees_only_bos_leaves_only_bos_and_the_row_itself(norm):
    """Every decoder self-attention head's weights replaced by a one-hot on BOS: row t mixes BOS and its own
    residual only, in every layer, so its prefix is BOS and y_t, both positive, and exactly 0 elsewhere.
    A transposed Ĉ in the composition, or a term without the residual, breaks it."""
    model = _model(norm)
    src, tgt = _ids()
    with model.intervene({"decoder.*.self_attention.head.*.weights": _bos_only}):
        m = alti_contributions(model, src, tgt)
    prefix = m[:, S:]
    for r in range(T):
        others = [k for k in range(T) if k not in (0, r)]
        assert (prefix[r, others] == 0).all(), r
        assert prefix[r, 0] > 0 and prefix[r, r] > 0, r
    assert torch.allclose(m.sum(1), torch.ones(T, dtype=torch.float64), atol=1e-12)


# ---- what alti does not explain, and the source share -------------------------------------------

@pytest.mark.parametrize("family", ["encoder-only", "decoder-only"])
def test_other_families_are_one_line_usage_errors(family):
    cfg = ModelConfig.tiny(src_vocab=20, tgt_vocab=20, family=family)
    with pytest.raises(UsageError, match=f"alti: explains encoder-decoder models.*{family}") as caught:
        alti_contributions(build_model(cfg), *_ids())
    assert "\n" not in str(caught.value)


def test_alti_with_a_contrast_or_a_bad_row_is_a_usage_error(model):
    src, tgt = _ids()
    with pytest.raises(UsageError, match="use a gradient method") as caught:
        attribute(model, src, tgt, [2], [6], "alti", contrast=[13])
    assert caught.value.field == "contrast"
    with pytest.raises(UsageError, match="row: outside"):
        alti_attribution(model, src, tgt, [T])
    with pytest.raises(UsageError, match="attention has no source share"):
        source_shares(model, src, tgt, LABELS, "attention")


def test_source_shares_is_one_pass_for_alti_and_the_absolute_share_for_gradients(model):
    src, tgt = _ids()
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        shares = source_shares(model, src, tgt, LABELS, "alti")
    finally:
        handle.remove()
    assert len(calls) == 1                                                    # one recording pass, every row
    m = alti_contributions(model, src, tgt)
    assert shares == pytest.approx(m[:, :S].sum(1).tolist(), abs=1e-15)
    g = source_shares(model, src, tgt, LABELS, "input-x-gradient")
    a = attribute(model, src, tgt, list(range(T)), LABELS, "input-x-gradient")
    s, p = a.source.abs().sum(1), a.prefix.abs().sum(1)
    assert g == pytest.approx((s / (s + p)).tolist(), abs=1e-12) and all(0 <= v <= 1 for v in g)
    assert source_share(torch.zeros(3), torch.zeros(2), "saliency") is None
    assert source_share(torch.ones(3), torch.ones(2), "attention") is None


@pytest.fixture(scope="module")
def lab():
    from glassformer.lab.models import untrained_model

    return untrained_model()


LESSON, TARGET = "我／昨天／给／了／他／一／本／书／。", "I gave him a book yesterday."


@pytest.mark.parametrize("method", ["alti", "saliency", "attention"])
def test_why_rows_carry_their_source_share(lab, method):
    from glassformer.interpret.why import render, why

    out = why(lab.model, lab.source, lab.target, LESSON, TARGET, method, lens=False)
    assert [r["token"] for r in out["rows"]] == ["I", "gave", "him", "a", "book", "yesterday", ".", "</s>"]
    for row in out["rows"]:
        share = row["source_share"]
        if method == "attention":
            assert share is None
            continue
        assert 0 <= share <= 1
        src = sum(v for _, v in row["source"])
        if method == "alti":
            assert row["sum"] == pytest.approx(1, abs=1e-9) and share == pytest.approx(src, abs=1e-12)
            assert all(v >= 0 for _, v in row["source"] + row["prefix"])
        else:
            total = src + sum(abs(v) for _, v in row["prefix"])
            assert share == pytest.approx(src / total, abs=1e-12)
    text = render(out)
    assert ("source share" in text) == (method != "attention")


def test_sub_word_rows_of_alti_are_the_mean_of_their_pieces(tmp_path):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
    from glassformer.decoding.translator import Translator
    from glassformer.interpret.why import why

    target = TargetTokenizer.train(["I gave him a book yesterday.", "He gave me a book.", "I gave her a book."],
                                   vocab_size=120)
    pieces = target.tokens("yesterday")
    assert len(pieces) > 1
    source = SourceTokenizer.train([["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]])
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    save_run_files(tmp_path, cfg, {}, source, target)
    torch.manual_seed(0)
    save_weights(Transformer(cfg), tmp_path / MODEL)
    t = Translator.load(tmp_path)
    out = why(t.model, t.source, t.target, LESSON, TARGET, "alti", lens=False)
    ids = t.target.encode(TARGET)
    first = len(t.target.encode("I gave him a book"))
    m = alti_contributions(t.model, torch.tensor([t.source.encode(LESSON)]), torch.tensor([[1, *ids]]))
    row = out["rows"][5]
    assert row["token"] == "yesterday" and row["position"] == first
    mean = m[first: first + len(pieces), :S].mean(0)
    assert [v for _, v in row["source"]] == pytest.approx(mean.tolist(), abs=1e-9)
    assert row["sum"] == pytest.approx(1, abs=1e-9) and row["source_share"] == pytest.approx(float(mean.sum()))


def test_attribute_alti_json_text_and_its_errors(tmp_path, capsys, lab):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights

    save_run_files(tmp_path, lab.model.cfg, {}, lab.source, lab.target)
    save_weights(lab.model, tmp_path / MODEL)
    argv = ["attribute", LESSON, "--target", TARGET, "--model", str(tmp_path), "--method", "alti"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["method"] == "alti" and doc["integration"] is None
    assert all(0 <= r["source_share"] <= 1 and r["sum"] == pytest.approx(1, abs=1e-6) for r in doc["rows"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "method: alti" in text and text.count("source share") == len(doc["rows"])
    assert main([*argv, "--contrast", "her"]) == 2
    err = capsys.readouterr().err
    assert "contrast:" in err and err.count("\n") == 1 and "Traceback" not in err
