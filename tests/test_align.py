"""`glassformer align` (interpret/align.py): one argmax link per target word for every method, --layer/--head
reading exactly that head, a planted head giving exactly its links and AER 0 (and a swapped gold pair the AER
worked out by hand), the --gold table equal to gold.score of the links the single-sentence path returns, and
one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from glassformer import limits
from glassformer.cli import main
from glassformer.decoding.translator import Translator
from glassformer.interpret.align import align, encode_pair, evaluate_gold
from glassformer.interpret.attribution import METHODS
from glassformer.interpret.gold import (
    GoldPair,
    format_links,
    project_links,
    project_units,
    score,
    source_tokens,
    target_tokens,
)
from glassformer.interpret.why import word_groups

SENTENCE, TARGET = "我昨天给了他一本书。", "I gave him a book yesterday."
KEYS = {"method", "layer", "head", "rows", "source", "target", "links", "scores", "unknown"}
FAST = ["--steps", "8"]                                                 # integrated gradients: a few steps suffice


@pytest.fixture(scope="module")
def run(short_tiny_run) -> tuple[Path, Translator]:
    """The tiny preset on 120 pairs (conftest.py)."""
    return short_tiny_run, Translator.load(short_tiny_run)


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _word_rows(t: Translator, text: str) -> list[list[int]]:
    """The label positions of each target word, specials left out, worked out here from the tokenizer."""
    labels = [*t.target.encode(text), t.model.cfg.eos_id]
    pieces = [t.target.id_to_token(i) if i != t.model.cfg.eos_id else "</s>" for i in labels]
    return [g for g in word_groups(pieces) if labels[g[0]] != t.model.cfg.eos_id]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_links_each_target_word_to_one_source_unit(run, capsys, method):
    out, t = run
    argv = ["align", SENTENCE, "--target", TARGET, "--model", str(out), "--method", method]
    argv += FAST if method == "integrated-gradients" else []
    doc = _json(capsys, [*argv, "--json"])
    assert set(doc) == KEYS and doc["method"] == method and doc["layer"] is None and doc["rows"] == "predict"
    words, units = doc["target"], doc["source"]
    assert len(words) == len(_word_rows(t, TARGET)) and not any(w.startswith("<") for w in words)
    assert [j for _, j in doc["links"]] == list(range(len(words)))        # one link per word, in order
    assert all(0 <= i < len(units) for i, _ in doc["links"])
    scores = torch.tensor(doc["scores"])                                   # (words, units)
    assert scores.shape == (len(words), len(units)) and (scores >= 0).all()
    assert [i for i, _ in doc["links"]] == scores.argmax(1).tolist()
    shifted = _json(capsys, [*argv, "--shift", "--json"])
    assert shifted["rows"] == "shift" and len(shifted["links"]) == len(words)
    assert main(argv) == 0                                                 # text: one line per link
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{units[i]} ↔ {words[j]}" for i, j in doc["links"]]


@pytest.mark.parametrize("shift", [False, True])
def test_layer_and_head_read_exactly_that_heads_weights(run, capsys, shift):
    out, t = run
    src = torch.tensor([t.source.encode(SENTENCE)])
    tgt_in = torch.tensor([[t.model.cfg.bos_id, *t.target.encode(TARGET)]])
    with torch.no_grad(), t.model.probes("decoder.*.cross_attention.head.*.weights") as rec:
        t.model(src, tgt_in)
    groups = [[k + shift for k in g] for g in _word_rows(t, TARGET)]
    argv = ["align", SENTENCE, "--target", TARGET, "--model", str(out), "--json", *(["--shift"] if shift else [])]
    for layer, head in [(0, 0), (1, 3), (1, 1)]:
        weights = rec[f"decoder.{layer}.cross_attention.head.{head}.weights"][0].double()    # (T, S)
        expected = torch.stack([weights[g].mean(0) for g in groups])                        # (words, S)
        doc = _json(capsys, [*argv, "--layer", str(layer), "--head", str(head)])
        assert (doc["layer"], doc["head"]) == (layer, head)
        assert torch.allclose(torch.tensor(doc["scores"], dtype=torch.float64), expected, atol=1e-6)
        assert [i for i, _ in doc["links"]] == expected.argmax(1).tolist()
    every = torch.stack([rec[n][0].double() for n in rec]).mean(0)       # the mean over layers and heads
    doc = _json(capsys, argv)
    assert torch.allclose(torch.tensor(doc["scores"], dtype=torch.float64),
                          torch.stack([every[g].mean(0) for g in groups]), atol=1e-6)


# ---- a planted head ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def planted_parts(tmp_path_factory):
    """An untrained model whose source units are single characters and whose target words are gold tokens."""
    from glassformer.data.checkpoint import MODEL, save_run_files, save_weights
    from glassformer.data.tokenize import SourceTokenizer, TargetTokenizer
    from glassformer.model import ModelConfig, Transformer

    folder = tmp_path_factory.mktemp("planted")
    target = TargetTokenizer.train(["I gave him a book yesterday.", "He gave me a book.", "I gave her a book."],
                                   vocab_size=120)
    source = SourceTokenizer.train([list(SENTENCE)])
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    save_run_files(folder, cfg, {}, source, target)
    torch.manual_seed(0)
    save_weights(Transformer(cfg), folder / MODEL)
    t = Translator.load(folder)
    enc = encode_pair(t.model, t.source, t.target, SENTENCE, TARGET)
    assert enc.units == source_tokens(SENTENCE) and enc.words == target_tokens(TARGET)   # units are gold tokens
    return t, enc


WANT = [0, 2, 4, 7, 5, 1, 8]            # the source unit planted for each target word: I gave him a book yesterday .


def _plant(enc, shift: bool):
    """Head (1, 2) of the decoder attends only to WANT[j] at every row standing for word j (row 0: unit 3)."""
    where = [3] * enc.tgt_in.size(1)
    for j, g in enumerate(enc.groups):
        for k in g:
            where[k + shift] = WANT[j]
    one_hot = torch.nn.functional.one_hot(torch.tensor(where), len(enc.units))               # (T, S)
    return {"decoder.1.cross_attention.head.2.weights": lambda v, _: one_hot[None].to(v.dtype).expand_as(v)}


def _pair(links) -> GoldPair:
    links = frozenset(links)
    return GoldPair("planted", "test", SENTENCE, TARGET, tuple(source_tokens(SENTENCE)), tuple(target_tokens(TARGET)),
                    links, links)


@pytest.mark.parametrize("shift", [False, True])
def test_a_planted_head_gives_exactly_its_links_and_aer_0(planted_parts, shift):
    t, enc = planted_parts
    with t.model.intervene(_plant(enc, shift)):
        got = align(t.model, t.source, t.target, SENTENCE, TARGET, "attention", 1, 2, shift)
        perfect = evaluate_gold(t.model, t.source, t.target, [_pair((i, j) for j, i in enumerate(WANT))],
                                ["attention"], heads=True)
        swapped = [WANT[1], WANT[0], *WANT[2:]]                           # gold says word 0 ↔ unit 2, word 1 ↔ unit 0
        off = evaluate_gold(t.model, t.source, t.target, [_pair((i, j) for j, i in enumerate(swapped))],
                            ["attention"], heads=True)
    assert got["links"] == [[i, j] for j, i in enumerate(WANT)]
    rows = "shift" if shift else "predict"
    head = next(s for s in perfect["heads"] if (s["layer"], s["head"], s["rows"]) == (1, 2, rows))
    assert (head["aer"], head["precision"], head["recall"]) == (0.0, 1.0, 1.0)
    head = next(s for s in off["heads"] if (s["layer"], s["head"], s["rows"]) == (1, 2, rows))
    n = len(WANT)                     # |A| = |S| = |P| = 7, 5 of the links hit: AER = 1 − (5 + 5) / (7 + 7)
    assert head["aer"] == pytest.approx(2 / n) and head["precision"] == pytest.approx((n - 2) / n)
    assert head["recall"] == pytest.approx((n - 2) / n) and head["sure_hits"] == n - 2


# ---- --gold ------------------------------------------------------------------------------------

GOLD = [("g1", SENTENCE, TARGET), ("g2", "我很好。", "I am fine."), ("g3", "你叫什么名字？", "What is your name?")]


def _gold_file(folder: Path, pairs=GOLD) -> Path:
    lines = []
    for pid, zh, en in pairs:
        src, tgt = source_tokens(zh), target_tokens(en)
        sure = {(min(j, len(src) - 1), j) for j in range(len(tgt))}
        possible = sure | {(min(j + 1, len(src) - 1), j) for j in range(len(tgt))}
        lines.append(json.dumps({"id": pid, "split": "test", "zh": zh, "en": en, "src": src, "tgt": tgt,
                                 "sure": format_links(sure), "possible": format_links(possible)}, ensure_ascii=False))
    path = folder / "gold.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _expected(t, pairs, **kw):
    """gold.score of the links that the single-sentence `align` returns, projected onto the gold tokens here."""
    predicted = []
    for pair in pairs:
        r = align(t.model, t.source, t.target, pair.zh, pair.en, **kw)
        src_map, tgt_map = project_units(pair.zh, r["source"], pair.src), project_units(pair.en, r["target"], pair.tgt)
        predicted.append(project_links([tuple(link) for link in r["links"]], src_map, tgt_map))
    return score(predicted, pairs)


def test_gold_table_equals_gold_score_of_the_single_sentence_links(run, capsys, tmp_path):
    from glassformer.interpret.gold import load_gold

    out, t = run
    path = _gold_file(tmp_path)
    pairs = load_gold(path)
    argv = ["align", "--gold", str(path), "--model", str(out), *FAST]
    doc = _json(capsys, [*argv, "--heads", "--json"])
    assert doc["pairs"] == 3 and doc["steps"] == 8
    assert {(s["method"], s["rows"]) for s in doc["methods"]} == {(m, r) for m in METHODS for r in ("predict", "shift")}
    for s in doc["methods"]:
        steps = {"steps": 8} if s["method"] == "integrated-gradients" else {}
        want = _expected(t, pairs, method=s["method"], shift=s["rows"] == "shift", **steps)
        assert {k: s[k] for k in want.__dataclass_fields__} == want.__dict__, s
    cfg = t.model.cfg
    assert len(doc["heads"]) == cfg.decoder_layers * cfg.heads * 2
    for s in doc["heads"]:
        want = _expected(t, pairs, method="attention", layer=s["layer"], head=s["head"], shift=s["rows"] == "shift")
        assert {k: s[k] for k in want.__dataclass_fields__} == want.__dict__, s
    assert main([*argv[:-2], "--heads", "--methods", "attention", "saliency"]) == 0  # the text table, same numbers
    text = capsys.readouterr().out.splitlines()
    for s in doc["methods"] + doc["heads"]:
        if s.get("method") in (None, "attention", "saliency"):
            label = s["method"].split() if "method" in s else ["layer", str(s["layer"]), "head", str(s["head"])]
            row = [*label, s["rows"], f"{s['aer']:.3f}", f"{s['precision']:.3f}", f"{s['recall']:.3f}",
                   str(s["predicted"])]
            assert row in [line.split() for line in text], row
    assert any(line.startswith("best heads (lowest AER): ") for line in text)


# ---- bad input ---------------------------------------------------------------------------------

S, T = ["align", SENTENCE], ["--target", TARGET]


@pytest.mark.parametrize("argv, words", [
    (["align", "", *T], "sentence: expected a non-empty Chinese sentence"),
    ([*S, "--target", "   "], "target: expected a non-empty English sentence"),
    (S, "--target: required"),
    (["align"], "sentence: expected a Chinese sentence (or --gold)"),
    ([*S, *T, "--layer", "9", "--head", "0"], "--layer: 9 is outside the decoder layers 0..1"),
    ([*S, *T, "--layer", "0", "--head", "9"], "--head: 9 is outside the heads 0..3"),
    ([*S, *T, "--layer", "0"], "give both"),
    ([*S, *T, "--head", "1"], "give both"),
    ([*S, *T, "--layer", "-1", "--head", "0"], "expected an integer >= 0"),
    ([*S, *T, "--method", "saliency", "--layer", "0", "--head", "0"], "only with --method attention"),
    ([*S, *T, "--steps", "8"], "--steps: only with --method integrated-gradients"),
    ([*S, *T, "--method", "alti", "--steps", "8"], "--steps: only with --method integrated-gradients"),
    ([*S, *T, "--method", "integrated-gradients", "--steps", str(limits.MAX_IG_STEPS + 1)], "MAX_IG_STEPS"),
    ([*S, *T, "--method", "shap"], "invalid choice"),
    ([*S, *T, "--heads"], "--heads: only with --gold"),
    ([*S, *T, "--methods", "attention"], "--methods: only with --gold"),
    ([*S, "--gold"], "SENTENCE: not with --gold"),
    (["align", "--gold", *T], "--target: not with --gold"),
    (["align", "--gold", "--shift"], "--shift: not with --gold"),
    (["align", "--gold", "--method", "alti"], "--method: not with --gold"),
    (["align", "--gold", "--methods", "alti", "--steps", "8"], "--steps: only with integrated-gradients"),
    (["align", "--gold", "--methods", "lime"], "invalid choice"),
    (["align", "我" * (limits.MAX_SOURCE_CHARS + 1), *T], "MAX_SOURCE_CHARS"),
    ([*S, "--target", "yes " * (limits.MAX_TARGET_CHARS // 4 + 1)], "MAX_TARGET_CHARS"),
    (["align", "我" * 70, *T], "sentence: 70 units; the model takes at most 64"),
    ([*S, "--target", "yes " * 70], "the model takes at most 63"),
])
def test_bad_input_is_one_line_and_exit_2(run, capsys, argv, words):
    _fails(capsys, [*argv, "--model", str(run[0])], words)


def _fails(capsys, argv, words):
    try:
        code = main(argv)
    except SystemExit as stop:                                          # argparse's own one-line errors
        code = stop.code
    captured = capsys.readouterr()
    assert code == 2 and words in captured.err, captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and captured.out == ""


def test_bad_gold_files_and_work_limits_are_one_line(run, capsys, tmp_path, monkeypatch):
    model = ["--model", str(run[0])]
    _fails(capsys, ["align", "--gold", str(tmp_path / "missing.jsonl"), *model], "cannot read the gold file")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n', encoding="utf-8")
    _fails(capsys, ["align", "--gold", str(bad), *model], "line 1: field 'split': missing")
    bad.write_text("[1, 2]\n", encoding="utf-8")
    _fails(capsys, ["align", "--gold", str(bad), *model], "not a JSON object")
    long = _gold_file(tmp_path, [("long-one", "我很好。", "yes " * 70)])
    _fails(capsys, ["align", "--gold", str(long), *model], "gold pair long-one: target: ")
    path = _gold_file(tmp_path)
    monkeypatch.setattr(limits, "MAX_ALIGN_PAIRS", 2)
    _fails(capsys, ["align", "--gold", str(path), *model], "gold: pairs is 3; the limit is 2 (MAX_ALIGN_PAIRS)")
    monkeypatch.setattr(limits, "MAX_SENTENCE_TOKENS", 3)
    _fails(capsys, [*S, *T, *model], "MAX_SENTENCE_TOKENS")
    monkeypatch.setattr(limits, "MAX_SENTENCE_TOKENS", 512)
    monkeypatch.setattr(limits, "MAX_ATTRIBUTION_PASSES", 20)
    _fails(capsys, [*S, *T, *model, "--method", "integrated-gradients", *FAST], "MAX_ATTRIBUTION_PASSES")
    assert main([*S, *T, *model, "--method", "integrated-gradients", *FAST, "--no-limits"]) == 0
