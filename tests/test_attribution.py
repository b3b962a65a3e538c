"""Attribution (interpret/attribution.py, why.py) and the logit lens (lens.py) on small seeded models:
completeness of integrated gradients, exact zeros where nothing can flow (PAD, future rows), contrast
antisymmetry, the lens ending at the model's own probability, word merging, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from glassformer import limits
from glassformer.cli import main
from glassformer.errors import UsageError
from glassformer.interpret.attribution import GRADIENT_METHODS, METHODS, attribute, baseline_embeddings
from glassformer.interpret.lens import logit_lens
from glassformer.interpret.why import why, word_groups
from glassformer.lab.models import untrained_model
from glassformer.model import ModelConfig, Transformer

# 我 昨天 给 了 他 一 本 书 。 as ids of a 20-unit source vocabulary; BOS I gave him a book yesterday .
SRC = [4, 5, 6, 7, 8, 9, 10, 11, 12]
TGT_IN = [1, 4, 5, 6, 7, 8, 9, 10]
LABELS = [4, 5, 6, 7, 8, 9, 10, 2]
ROWS = list(range(len(TGT_IN)))
HIM, HER = 6, 13


def _model(norm: str = "post", positions: str = "sinusoidal") -> Transformer:
    cfg = ModelConfig.tiny(src_vocab=20, tgt_vocab=16, encoder_layers=2, decoder_layers=2, norm_placement=norm,
                           positions=positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        built = Transformer(cfg)
    return built.double().eval()


@pytest.fixture(scope="module", params=["post", "pre"])
def model(request) -> Transformer:
    return _model(request.param)


def _attr(model, method, src=SRC, rows=ROWS, labels=LABELS, **kw):
    return attribute(model, torch.tensor([src]), torch.tensor([TGT_IN]), rows, labels, method, **kw)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_integrated_gradients_complete_within_one_percent_at_256_steps(positions):
    model = _model(positions=positions)
    a = _attr(model, "integrated-gradients", steps=256)
    total = a.source.sum(1) + a.prefix.sum(1)
    delta = a.value - a.baseline
    moved = delta.abs() > 0.1                                          # rows where 1 % is a meaningful bound
    assert int(moved.sum()) >= 6
    assert ((total - delta).abs()[moved] <= 0.01 * delta.abs()[moved]).all(), (total, delta)
    assert ((total - delta).abs() <= 0.01 * delta.abs().max()).all()
    # the values are the model's own: log p(label) at each row, computed here without the hooks
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([SRC]), torch.tensor([TGT_IN]))[0], dim=-1)
    assert torch.allclose(a.value, logp[ROWS, LABELS], atol=1e-10)


def test_the_position_only_baseline_is_the_sinusoidal_table_without_tokens(model):
    b_src, b_tgt = baseline_embeddings(model, torch.tensor([SRC]), torch.tensor([TGT_IN]))
    with model.probes("encoder.embedding") as rec:
        model(torch.tensor([SRC]), torch.tensor([TGT_IN]))
    x = rec["encoder.embedding"][0]
    token = model.src_embed.token.weight[SRC] * model.cfg.d_model ** 0.5   # token part alone, read off the model
    assert torch.allclose(x - token, b_src[0], atol=1e-9)
    assert b_tgt.shape == (1, len(TGT_IN), model.cfg.d_model)


@pytest.mark.parametrize("method", METHODS)
def test_a_pad_source_position_gets_exactly_zero_and_changes_nothing_else(model, method):
    plain = _attr(model, method)
    padded = _attr(model, method, src=SRC + [0, 0, 0])                 # PAD = 0, flagged by source_padding
    assert padded.source.shape == (len(ROWS), len(SRC) + 3)
    assert (padded.source[:, len(SRC):] == 0).all()
    assert torch.allclose(padded.source[:, : len(SRC)], plain.source, atol=1e-8)
    assert torch.allclose(padded.prefix, plain.prefix, atol=1e-8)


@pytest.mark.parametrize("method", METHODS)
def test_a_future_target_token_gets_exactly_zero(model, method):
    a = _attr(model, method)
    for r in ROWS:
        assert (a.prefix[r, r + 1:] == 0).all()
        assert (a.prefix[r, : r + 1] != 0).any()                       # the visible inputs do count


@pytest.mark.parametrize("method", GRADIENT_METHODS)
def test_contrast_him_her_is_minus_her_him(model, method):
    him_her = _attr(model, method, rows=[2], labels=[HIM], contrast=[HER], steps=32)
    her_him = _attr(model, method, rows=[2], labels=[HER], contrast=[HIM], steps=32)
    plain = _attr(model, method, rows=[2], labels=[HIM], steps=32)
    sign = 1 if method == "saliency" else -1                           # saliency is a magnitude
    assert torch.allclose(him_her.source, sign * her_him.source, atol=1e-10)
    assert torch.allclose(him_her.prefix, sign * her_him.prefix, atol=1e-10)
    assert not torch.allclose(him_her.source, plain.source, atol=1e-4)   # the contrast is not ignored
    assert float(him_her.value[0]) == pytest.approx(-float(her_him.value[0]), abs=1e-12)


def test_input_x_gradient_and_integrated_gradients_match_captum(model):
    captum = pytest.importorskip("captum.attr")
    src, tgt = torch.tensor([SRC]), torch.tensor([TGT_IN])
    with model.probes("encoder.embedding", "decoder.embedding") as rec:
        model(src, tgt)
    x = (rec["encoder.embedding"], rec["decoder.embedding"])

    def f(e_src, e_tgt):                                               # log p(him) − log p(her) at row 2
        n = e_src.size(0)
        with model.intervene({"encoder.embedding": lambda v, _: e_src, "decoder.embedding": lambda v, _: e_tgt}):
            logp = torch.log_softmax(model(src.expand(n, -1), tgt.expand(n, -1))[:, 2], dim=-1)
        return logp[:, HIM] - logp[:, HER]

    ours = _attr(model, "input-x-gradient", rows=[2], labels=[HIM], contrast=[HER])
    theirs = captum.InputXGradient(f).attribute(x)
    assert torch.allclose(ours.source[0], theirs[0].sum(-1)[0], atol=1e-9)
    assert torch.allclose(ours.prefix[0], theirs[1].sum(-1)[0], atol=1e-9)
    ours = _attr(model, "integrated-gradients", rows=[2], labels=[HIM], contrast=[HER], steps=16)
    base = baseline_embeddings(model, src, tgt)
    theirs = captum.IntegratedGradients(f).attribute(x, baselines=base, n_steps=16, method="gausslegendre")
    assert torch.allclose(ours.source[0], theirs[0].sum(-1)[0], atol=1e-8)
    assert torch.allclose(ours.prefix[0], theirs[1].sum(-1)[0], atol=1e-8)


def test_the_lens_ends_at_the_models_own_probability(model):
    src, tgt = torch.tensor([SRC]), torch.tensor([TGT_IN])
    lens = logit_lens(model, src, tgt, 2, HIM, HER)
    with torch.no_grad():
        p = torch.softmax(model(src, tgt)[0, 2], dim=-1)
    assert len(lens["steps"]) == 3 * model.cfg.decoder_layers
    assert [s["name"] for s in lens["steps"][:3]] == ["self-attention", "cross-attention", "ffn"]
    assert abs(lens["steps"][-1]["p"] - float(p[HIM])) < 1e-6
    assert abs(lens["steps"][-1]["p_contrast"] - float(p[HER])) < 1e-6
    assert abs(lens["p_model"] - float(p[HIM])) < 1e-12
    assert max(abs(s["p"] - float(p[HIM])) for s in lens["steps"][:-1]) > 1e-3   # earlier reads differ
    assert ("pre-norm" in lens["reading"]) == (model.cfg.norm_placement == "pre")
    with pytest.raises(UsageError, match="row"):
        logit_lens(model, src, tgt, len(TGT_IN), HIM)


def test_the_pre_norm_lens_needs_the_final_layernorm():
    """Read without the final LayerNorm, the last pre-norm sub-layer is not the model's probability."""
    model = _model("pre")
    src, tgt = torch.tensor([SRC]), torch.tensor([TGT_IN])
    with torch.no_grad(), model.probes("decoder.1.sublayer.2.residual") as rec:
        p = torch.softmax(model(src, tgt)[0, 2], dim=-1)[HIM]
        raw = torch.softmax(model.logits(rec["decoder.1.sublayer.2.residual"][0, 2]), dim=-1)[HIM]
    assert abs(float(raw) - float(p)) > 1e-4
    assert abs(logit_lens(model, src, tgt, 2, HIM)["steps"][-1]["p"] - float(p)) < 1e-6


def test_word_groups_merge_sub_words_and_split_punctuation():
    assert word_groups(["▁I", "▁ga", "ve", "▁him", "▁yester", "day", ".", "</s>"]) == [
        [0], [1, 2], [3], [4, 5], [6], [7]]


@pytest.fixture(scope="module")
def lab():
    return untrained_model()


def test_why_on_the_untrained_lab_model_has_the_issues_shape(lab):
    out = why(lab.model, lab.source, lab.target, "我／昨天／给／了／他／一／本／书／。", "I gave him a book yesterday.",
              "integrated-gradients", "her", steps=64)
    assert set(out) == {"method", "contrast", "rows", "details"} and out["contrast"] == "her"
    assert [r["token"] for r in out["rows"]] == ["I", "gave", "him", "a", "book", "yesterday", ".", "</s>"]
    him = out["rows"][2]
    assert him["position"] == 2
    assert [u for u, _ in him["source"]] == ["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]
    assert [t for t, _ in him["prefix"]] == ["<s>", "I", "gave"]
    assert him["sum"] == pytest.approx(sum(v for _, v in him["source"]) + sum(v for _, v in him["prefix"]))
    assert abs(him["sum"] - him["delta"]) <= 0.05 * abs(him["delta"])
    lens = out["details"]["lens"]
    assert lens["row"] == 2 and lens["token"] == "him" and lens["sees"] == ["<s>", "I", "gave"]


def test_sub_word_pieces_are_summed_into_their_word(tmp_path):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
    from glassformer.decoding.translator import Translator

    target = TargetTokenizer.train(["I gave him a book yesterday.", "He gave me a book.", "I gave her a book."],
                                   vocab_size=120)
    pieces = target.tokens("yesterday")
    assert len(pieces) > 1                                              # the word is several pieces here
    source = SourceTokenizer.train([["我", "昨天", "给", "了", "他", "一", "本", "书", "。"]])
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size, encoder_layers=1,
                           decoder_layers=1)
    save_run_files(tmp_path, cfg, {}, source, target)
    torch.manual_seed(0)
    save_weights(Transformer(cfg), tmp_path / MODEL)
    t = Translator.load(tmp_path)
    out = why(t.model, t.source, t.target, "我／昨天／给／了／他／一／本／书／。", "I gave him a book yesterday.",
              "input-x-gradient", lens=False)
    words = [r["token"] for r in out["rows"]]
    assert words == ["I", "gave", "him", "a", "book", "yesterday", ".", "</s>"]
    ids = t.target.encode("I gave him a book yesterday.")
    first = len(t.target.encode("I gave him a book"))
    src = torch.tensor([t.source.encode("我／昨天／给／了／他／一／本／书／。")])
    a = attribute(t.model, src, torch.tensor([[1, *ids]]), list(range(first, first + len(pieces))),
                  ids[first: first + len(pieces)], "input-x-gradient")
    row = out["rows"][5]
    assert row["position"] == first
    assert [v for _, v in row["source"]] == pytest.approx(a.source.sum(0).tolist(), abs=1e-6)
    assert [w for w, _ in out["rows"][6]["prefix"]][-1] == "yesterday"   # one column for the whole word


@pytest.mark.parametrize("argv, words", [
    (["--contrast", "zebra"], "contrast: 'zebra' is not one token"),
    (["--lens", "--row", "99"], "row: 99 is outside the target rows"),
    (["--steps", str(limits.MAX_IG_STEPS + 1)], "MAX_IG_STEPS"),
    (["--steps", "0"], "at least 1 step"),
    (["--method", "attention", "--contrast", "her"], "use a gradient method"),
    (["--row", "1"], "only with --lens"),
    (["--method", "shap"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, lab, argv, words):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights

    save_run_files(tmp_path, lab.model.cfg, {}, lab.source, lab.target)
    save_weights(lab.model, tmp_path / MODEL)
    try:
        code = main(["attribute", "我／昨天／给／了／他／一／本／书／。", "--target", "I gave him a book yesterday.",
                     "--model", str(tmp_path), *argv])
    except SystemExit as stop:                                          # argparse's own one-line errors
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err


def test_attribute_json_is_the_documented_shape(tmp_path, capsys, lab):
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights

    save_run_files(tmp_path, lab.model.cfg, {}, lab.source, lab.target)
    save_weights(lab.model, tmp_path / MODEL)
    assert main(["attribute", "我／昨天／给／了／他／一／本／书／。", "--target", "I gave him a book yesterday.",
                 "--model", str(tmp_path), "--method", "saliency", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"method", "contrast", "rows"} and doc["contrast"] is None
    assert set(doc["rows"][0]) == {"position", "token", "source", "prefix", "sum", "delta"}
    assert doc["rows"][0]["delta"] is None and all(v >= 0 for _, v in doc["rows"][2]["source"])
    assert main(["attribute", "我／昨天／给／了／他／一／本／书／。", "--target", "I gave him a book yesterday.",
                 "--model", str(tmp_path), "--lens", "--contrast", "her", "--json"]) == 0
    lens = json.loads(capsys.readouterr().out)
    assert lens["row"] == 2 and lens["token"] == "him" and len(lens["steps"]) == 3 * lab.model.cfg.decoder_layers
