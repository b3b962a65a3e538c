"""Attribution (interpret/attribution.py, integrated.py, why.py) and the logit lens (lens.py) on small seeded
models and a tiny trained one: completeness of integrated gradients and its per-row error, auto steps,
exact zeros where nothing can flow (PAD, future rows), contrast antisymmetry, the lens ending at the
model's own probability, word merging, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

from glassformer import limits
from glassformer.cli import main
from glassformer.errors import UsageError
from glassformer.interpret import integrated
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


@pytest.mark.parametrize("rule", integrated.RULES)
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_integrated_gradients_complete_within_one_percent_at_256_steps(positions, rule):
    model = _model(positions=positions)
    a = _attr(model, "integrated-gradients", steps=256, rule=rule)
    total = a.source.sum(1) + a.prefix.sum(1)
    delta = a.value - a.baseline
    moved = delta.abs() > 0.1                                          # rows where 1 % is a meaningful bound
    assert int(moved.sum()) >= 6
    assert ((total - delta).abs()[moved] <= 0.01 * delta.abs()[moved]).all(), (total, delta)
    assert ((total - delta).abs() <= 0.01 * delta.abs().max()).all()
    # each row's own error: |Σ − Δ| / |Δ|, with an absolute floor of 0.01 nats under a row that barely moves
    assert torch.allclose(a.error, (total - delta).abs() / delta.abs().clamp(min=0.01), rtol=1e-9)
    assert (a.steps == 256).all() and (a.passes == (257 if rule == "trapezoid" else 256)).all()
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
    base = baseline_embeddings(model, src, tgt)
    # Captum's riemann_trapezoid weighs its n points (spaced 1/(n − 1)) by 1/n: (n − 1)/n of the trapezoid rule
    for rule, theirs_method, n_points, scale in [("gauss-legendre", "gausslegendre", 16, 1.0),
                                                 ("trapezoid", "riemann_trapezoid", 17, 17 / 16)]:
        ours = _attr(model, "integrated-gradients", rows=[2], labels=[HIM], contrast=[HER], steps=16, rule=rule)
        theirs = captum.IntegratedGradients(f).attribute(x, baselines=base, n_steps=n_points, method=theirs_method)
        assert torch.allclose(ours.source[0], scale * theirs[0].sum(-1)[0], atol=1e-8)
        assert torch.allclose(ours.prefix[0], scale * theirs[1].sum(-1)[0], atol=1e-8)


def test_the_trapezoid_rule_is_the_mean_of_the_path_gradients():
    """Without Captum: 2 trapezoid steps = ¼ g(0) + ½ g(½) + ¼ g(1), with g from autograd at those points."""
    model = _model()
    src, tgt = torch.tensor([SRC]), torch.tensor([TGT_IN])
    with model.probes("encoder.embedding", "decoder.embedding") as rec:
        model(src, tgt)
    x, y = rec["encoder.embedding"], rec["decoder.embedding"]
    b, c = baseline_embeddings(model, src, tgt)
    total = torch.zeros(len(SRC), dtype=torch.float64)
    for alpha, weight in [(0.0, 0.25), (0.5, 0.5), (1.0, 0.25)]:
        e, t = (b + alpha * (x - b)).requires_grad_(), c + alpha * (y - c)     # both sides on the path
        with model.intervene({"encoder.embedding": lambda v, _, e=e: e, "decoder.embedding": lambda v, _, t=t: t}):
            logp = torch.log_softmax(model(src, tgt)[0, 2], dim=-1)
        (grad,) = torch.autograd.grad(logp[HIM] - logp[HER], e)
        total += weight * ((x - b) * grad).sum(-1)[0]
    ours = _attr(model, "integrated-gradients", rows=[2], labels=[HIM], contrast=[HER], steps=2, rule="trapezoid")
    assert torch.allclose(ours.source[0], total, atol=1e-10)


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
    # a bare ▁ (SentencePiece's space cut off before punctuation) is no word of its own (it was shown as "?")
    assert word_groups(["▁", "F", "ine", "▁", ".", "</s>"]) == [[0, 1, 2], [3, 4], [5]]
    assert word_groups(["▁", "</s>"]) == [[0], [1]]


@pytest.mark.parametrize("command", ["attribute", "align"])
@pytest.mark.parametrize("text", ["</s>", "<s> I gave", "I gave him <pad>"])
def test_a_target_holding_a_special_tokens_text_is_one_line(short_tiny_run, capsys, command, text):
    """The tokenizer reads `</s>` in a target as the token itself: align ended in a traceback, attribute explained
    log p(</s>) or fed a BOS in as a word."""
    assert main([command, "我很好。", "--target", text, "--model", str(short_tiny_run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is one of the vocabulary's special tokens" in err, err


@pytest.fixture(scope="module")
def lab():
    return untrained_model()


def test_why_on_the_untrained_lab_model_has_the_issues_shape(lab):
    out = why(lab.model, lab.source, lab.target, "我／昨天／给／了／他／一／本／书／。", "I gave him a book yesterday.",
              "integrated-gradients", "her", steps=64)
    assert set(out) == {"method", "contrast", "integration", "rows", "details"} and out["contrast"] == "her"
    assert out["integration"]["steps"] == 64 and all(r["steps"] == 64 for r in out["rows"])
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
    (["--steps", "many"], "expected a whole number or 'auto'"),
    (["--tolerance", "1.5"], "tolerance: expected a number between 0 and 1"),
    (["--tolerance", "0"], "tolerance: expected a number between 0 and 1"),
    (["--tolerance", "nan"], "tolerance: expected a number between 0 and 1"),
    (["--rule", "simpson"], "invalid choice"),
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
    assert set(doc) == {"method", "contrast", "integration", "rows"} and doc["contrast"] is None
    assert set(doc["rows"][0]) == {"position", "token", "source", "prefix", "sum", "delta", "error", "steps", "passes",
                                   "source_share"}
    assert all(0 <= r["source_share"] <= 1 for r in doc["rows"])
    assert doc["rows"][0]["delta"] is None and all(v >= 0 for _, v in doc["rows"][2]["source"])
    assert doc["integration"] is None and doc["rows"][0]["error"] is None
    assert main(["attribute", "我／昨天／给／了／他／一／本／书／。", "--target", "I gave him a book yesterday.",
                 "--model", str(tmp_path), "--lens", "--contrast", "her", "--json"]) == 0
    lens = json.loads(capsys.readouterr().out)
    assert lens["row"] == 2 and lens["token"] == "him" and len(lens["steps"]) == 3 * lab.model.cfg.decoder_layers


# ---- completeness on a trained model: the error of each row, auto steps --------------------------

LESSON, TARGET = "我昨天给了他一本书。", "I gave him a book yesterday."


@pytest.fixture(scope="module")
def trained(tiny_run):
    """A run of the tiny preset (conftest.py): trained weights make the path integrand kinked."""
    from glassformer.decoding.translator import Translator

    return tiny_run, Translator.load(tiny_run)


def _independent_delta(t, row: int, label: int) -> float:
    """f(input) − f(baseline) for one piece row, from the model's logits (no attribution code but the baseline)."""
    src = torch.tensor([t.source.encode(LESSON)])
    tgt = torch.tensor([[t.model.cfg.bos_id, *t.target.encode(TARGET)]])
    b_src, b_tgt = baseline_embeddings(t.model, src, tgt)
    with torch.no_grad():
        at_x = torch.log_softmax(t.model(src, tgt)[0, row].double(), -1)[label]
        with t.model.intervene({"encoder.embedding": lambda v, _: b_src, "decoder.embedding": lambda v, _: b_tgt}):
            at_b = torch.log_softmax(t.model(src, tgt)[0, row].double(), -1)[label]
    return float(at_x - at_b)


@pytest.mark.parametrize("rule", integrated.RULES)
def test_auto_steps_make_every_row_of_a_trained_model_complete(trained, rule):
    _, t = trained
    few = why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", steps=integrated.START_STEPS,
              rule=rule, lens=False)
    assert max(r["error"] for r in few["rows"]) > 0.01                 # the first count alone is not enough here
    out = why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", steps="auto", rule=rule, lens=False)
    ids = [*t.target.encode(TARGET), t.model.cfg.eos_id]
    assert out["integration"]["unconverged"] == []
    for r, pieces in zip(out["rows"], word_groups([t.target.id_to_token(i) or "<s>" for i in ids]), strict=True):
        delta = sum(_independent_delta(t, k, ids[k]) for k in pieces)
        total = sum(v for _, v in r["source"]) + sum(v for _, v in r["prefix"])
        assert abs(total - delta) <= 0.01 * max(abs(delta), integrated.DELTA_FLOOR), (r["token"], total, delta)
        assert r["error"] == pytest.approx(abs(total - delta) / max(abs(delta), 0.01), abs=1e-6)
        assert integrated.START_STEPS <= r["steps"] <= limits.MAX_IG_AUTO_STEPS
    assert max(r["steps"] for r in out["rows"]) > integrated.START_STEPS   # some row needed doubling
    if rule == "trapezoid":                                            # nested: a row runs each node once
        assert all(r["passes"] == (r["steps"] + 1) * len(p) for r, p in
                   zip(out["rows"], word_groups([t.target.id_to_token(i) or "<s>" for i in ids]), strict=True))


def test_the_nested_trapezoid_equals_a_fresh_one_at_its_final_steps(trained):
    _, t = trained
    src = torch.tensor([t.source.encode(LESSON)])
    ids = t.target.encode(TARGET)
    tgt = torch.tensor([[t.model.cfg.bos_id, *ids]])
    rows, labels = list(range(len(ids) + 1)), [*ids, t.model.cfg.eos_id]
    auto = attribute(t.model, src, tgt, rows, labels, "integrated-gradients", steps="auto", tolerance=0.002)
    for n in sorted(set(auto.steps.tolist())):
        picked = [r for r in rows if auto.steps[r] == n]
        with limits.lifted():                                          # auto may pass MAX_IG_STEPS
            fresh = attribute(t.model, src, tgt, picked, [labels[r] for r in picked], "integrated-gradients", steps=n)
        assert torch.allclose(auto.source[picked], fresh.source, atol=1e-9)
        assert torch.allclose(auto.prefix[picked], fresh.prefix, atol=1e-9)


def test_rows_over_the_tolerance_are_reported_on_stderr_and_in_json(trained, capsys):
    out, t = trained
    argv = ["attribute", LESSON, "--target", TARGET, "--model", str(out), "--json"]
    assert main([*argv, "--steps", "2"]) == 0                           # far too few steps: reported, not hidden
    captured = capsys.readouterr()
    doc, err = json.loads(captured.out), captured.err
    over = [r for r in doc["rows"] if r["error"] > 0.01]
    assert over and doc["integration"]["unconverged"] == [r["token"] for r in over]
    assert err.count("\n") == 1 and "not complete within 1 %" in err
    assert all(f"row {r['position']} {r['token']} {100 * r['error']:.2f} %" in err for r in over)
    assert main([*argv, "--tolerance", "1e-9"]) == 0                   # auto cannot get there: stops at a limit
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert all(256 <= r["steps"] <= limits.MAX_IG_AUTO_STEPS for r in doc["rows"])
    assert sum(r["passes"] for r in doc["rows"]) <= limits.MAX_ATTRIBUTION_PASSES
    assert "MAX_IG_AUTO_STEPS" in captured.err and "MAX_ATTRIBUTION_PASSES" in captured.err
    assert len(doc["integration"]["unconverged"]) == len(doc["rows"])
    assert main([*argv[:-1], "--steps", "2"]) == 0                     # the table has the error column
    captured = capsys.readouterr()
    assert "error" in captured.out and captured.out.count(" over") == len(over)


def test_auto_stays_within_the_pass_budget(trained, monkeypatch):
    _, t = trained
    rows = len(t.target.encode(TARGET)) + 1
    budget = rows * (integrated.START_STEPS + 1) + 40                  # the first count and a little more
    monkeypatch.setattr(limits, "MAX_ATTRIBUTION_PASSES", budget)
    out = why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", steps="auto", tolerance=1e-6,
              lens=False)
    assert sum(r["passes"] for r in out["rows"]) <= budget
    assert out["integration"]["unconverged"]                           # reported, not silently short
    monkeypatch.setattr(limits, "MAX_ATTRIBUTION_PASSES", rows * integrated.START_STEPS)
    with pytest.raises(limits.LimitError, match="MAX_ATTRIBUTION_PASSES"):
        why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", lens=False)


def test_a_long_sentence_gets_fewer_passes_by_its_positions(trained, monkeypatch):
    """A pass's time grows with the sentence (a 127-piece pair once ran 8,192 passes, ~100 s): auto's budget is
    MAX_ATTRIBUTION_POSITIONS / (source + target positions) passes when that is below MAX_ATTRIBUTION_PASSES, and a
    request whose first count is over it is refused before anything runs."""
    _, t = trained
    rows = len(t.target.encode(TARGET)) + 1
    first = why(t.model, t.source, t.target, LESSON, TARGET, "saliency", lens=False)
    positions = len(first["rows"][0]["source"]) + len(first["details"]["inputs"])     # source + target inputs
    budget = rows * (integrated.START_STEPS + 1) + 40                  # passes: the first count and a little more
    monkeypatch.setattr(limits, "MAX_ATTRIBUTION_POSITIONS", budget * positions)
    out = why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", steps="auto", tolerance=1e-6,
              lens=False)
    assert rows * (integrated.START_STEPS + 1) <= sum(r["passes"] for r in out["rows"]) <= budget
    assert out["integration"]["unconverged"]
    monkeypatch.setattr(limits, "MAX_ATTRIBUTION_POSITIONS", rows * (integrated.START_STEPS + 1) * positions - 1)
    with pytest.raises(limits.LimitError, match="MAX_ATTRIBUTION_POSITIONS") as info:
        why(t.model, t.source, t.target, LESSON, TARGET, "integrated-gradients", lens=False)
    assert info.value.field == "steps" and f"× {positions} positions" in str(info.value)
