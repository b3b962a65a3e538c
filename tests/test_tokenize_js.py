"""The page's tokenizers (lab/static/engine/tokenize.js) against the Python ones, through Node.

Every HSK test sentence and every Tatoeba held-out sentence: the source units, ids and unknown units, the
target BPE ids of the English side, and the detokenized text of those ids (and of ids cut at an EOS, with
specials inside) must be the same as glassformer.data.tokenize gives, for a trained tiny run's vocab.json
and for the tokenizers a default-preset run builds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from glassformer.data.tokenize import BOS, EOS, PAD, UNK, SourceTokenizer, TargetTokenizer

ROOT = Path(__file__).resolve().parent.parent
TOKENIZE_JS = ROOT / "src" / "glassformer" / "lab" / "static" / "engine" / "tokenize.js"
DRIVER = """
import { readFileSync } from "node:fs";
const { loadTokenizers } = await import(process.argv[2]);
const job = JSON.parse(readFileSync(process.argv[3], "utf-8"));
const { source, target } = loadTokenizers(job.vocab);
const out = {
  source: job.sources.map((s) => source.analyse(s)),
  target: job.targets.map((s) => target.encode(s)),
  decoded: job.decode.map((ids) => target.decode(ids)),
  pieces: job.pieces.map((id) => target.piece(id)),
  vocab_size: [source.vocabSize, target.vocabSize],
};
process.stdout.write(JSON.stringify(out));
"""
# hand-made cases: separators, ASCII punctuation, emoji, unknown and Latin runs, specials in the English
EXTRA_SOURCES = ["我／昨天／给／了／他／一／本／书／。", "我 昨天 给了 他 一本书.", "你好,世界!  (测试)?",
                 "  他说:\u3000\"好\"; 走.", "龘龘是什么?", "iPhone 15 很贵。", "😀👍🏽 好的\u200d。", "我/他/她",
                 "／", "", "a.b 3.5 我.", "我\ufe0f们"]
EXTRA_TARGETS = ["I gave him a book yesterday.", "  two  spaces ", "Don't! (really?) \"yes\" - no...", "<s>a</s> <unk>",
                 "café naïve 中文", "", "x", "tab\there", "e.g. U.S.A. $5,000 50% a+b=c"]


def _need_node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    return node


def _sentences() -> tuple[list[str], list[str]]:
    from glassformer.data.corpus import load_corpus
    from glassformer.data.datasets import load_tatoeba_splits

    hsk = load_corpus().test
    tatoeba = load_tatoeba_splits().heldout
    assert len(hsk) > 100 and len(tatoeba) > 100
    pairs = list(hsk) + list(tatoeba)
    return [p.zh for p in pairs] + EXTRA_SOURCES, [p.en for p in pairs] + EXTRA_TARGETS


def _run_node(tmp_path: Path, vocab: dict, sources: list[str], targets: list[str], decode: list[list[int]],
              pieces: list[int]) -> dict:
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER, encoding="utf-8")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vocab": vocab, "sources": sources, "targets": targets, "decode": decode,
                               "pieces": pieces}, ensure_ascii=False), encoding="utf-8")
    done = subprocess.run([_need_node(), str(driver), TOKENIZE_JS.as_uri(), str(job)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _check(tmp_path: Path, vocab: dict) -> None:
    from glassformer.lab.models import LabModel

    source = SourceTokenizer.from_dict(vocab["source"])
    target = TargetTokenizer.from_dict(vocab["target"])
    sources, targets = _sentences()
    target_ids = [target.encode(t) for t in targets]
    size = target.vocab_size
    decode = [*target_ids, *[[BOS, *ids, EOS, *ids] for ids in target_ids[:50]],      # cut at the EOS
              [UNK, *target_ids[0], PAD], list(range(size)), [size + 5, 4, 5]]       # every id; one unknown id
    pieces = list(range(size))
    got = _run_node(tmp_path, vocab, sources, targets, decode, pieces)
    assert got["vocab_size"] == [source.vocab_size, size]
    mismatched = []
    for text, js in zip(sources, got["source"], strict=True):
        py = source.analyse(text)
        if (js["units"], js["ids"], js["unknown"], js["presegmented"]) != (py.units, py.ids, py.unknown,
                                                                          py.presegmented):
            mismatched.append((text, py.units, js["units"]))
    assert not mismatched, f"{len(mismatched)} source sentences differ, first: {mismatched[:3]}"
    bad = [(t, ids, js) for t, ids, js in zip(targets, target_ids, got["target"], strict=True) if ids != js]
    assert not bad, f"{len(bad)} target sentences differ, first: {bad[:3]}"
    bad = [(ids, target.decode(ids), js) for ids, js in zip(decode, got["decoded"], strict=True)
           if target.decode(ids) != js]
    assert not bad, f"{len(bad)} decodings differ, first: {bad[:3]}"

    class _Cfg:                                   # LabModel.piece reads only the model's special ids
        pad_id, bos_id, eos_id = PAD, BOS, EOS

    class _Model:
        cfg = _Cfg()

    lab = LabModel(_Model(), None, source, target, True, "test")      # type: ignore[arg-type]
    bad = [(i, lab.piece(i), js) for i, js in zip(pieces, got["pieces"], strict=True) if lab.piece(i) != js]
    assert not bad, f"{len(bad)} pieces differ, first: {bad[:3]}"
    # the comparison is not empty: unknown units and Tatoeba-only words occur
    assert any(js["unknown"] for js in got["source"])
    assert sum(len(js["units"]) for js in got["source"]) > 2 * len(sources)


def test_a_trained_tiny_runs_tokenizers_match_python(tiny_run, tmp_path):
    vocab = json.loads((tiny_run / "vocab.json").read_text(encoding="utf-8"))
    _check(tmp_path, vocab)


@pytest.mark.slow
def test_the_default_presets_tokenizers_match_python(tmp_path):
    from glassformer.training.prepare_data import prepare_data
    from glassformer.training.settings import preset_settings

    data = prepare_data(preset_settings("default"))                 # what `glassformer train` builds (~10 s)
    _check(tmp_path, {"source": data.source.to_dict(), "target": data.target.to_dict()})


def test_the_untrained_lab_models_word_level_tokenizer_matches_python(tmp_path):
    from glassformer.lab.models import untrained_model

    lab = untrained_model()
    _check(tmp_path, {"source": lab.source.to_dict(), "target": lab.target.to_dict()})


def test_a_planted_segmenter_change_is_caught(tmp_path):
    """Ties going to the shorter last word (a plausible slip: > for >=) change some splits: the check sees it."""
    text = TOKENIZE_JS.read_text(encoding="utf-8")
    assert "if (score >= best[end][0])" in text
    planted = tmp_path / "engine"
    planted.mkdir()
    (planted / "tokenize.js").write_text(text.replace("if (score >= best[end][0])", "if (score > best[end][0])"),
                                         encoding="utf-8")
    # p(一本) = 1/8 = p(一) p(本) = 1/2 · 1/4: both splits equally probable, the tie decides
    source = SourceTokenizer.train([["一", "本"], ["一", "本"], ["一"], ["一"], ["一本"], ["书"]])
    vocab = {"source": source.to_dict(), "target": TargetTokenizer.train(["a book"], 40).to_dict()}
    driver = tmp_path / "driver.mjs"
    driver.write_text(DRIVER, encoding="utf-8")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"vocab": vocab, "sources": ["一本书"], "targets": [], "decode": [], "pieces": []},
                              ensure_ascii=False), encoding="utf-8")
    done = subprocess.run([_need_node(), str(driver), (planted / "tokenize.js").as_uri(), str(job)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert source.segment("一本书") == ["一本", "书"]
    assert json.loads(done.stdout)["source"][0]["units"] != source.segment("一本书")
