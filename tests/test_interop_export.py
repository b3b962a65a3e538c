"""`glassformer export`: a small trained run, run by transformers and CTranslate2 fed only by the exported
tokenizer files, gives glassformer's greedy translations; import ∘ export gives back the same logits; the
`tokenizers` form of the source segmenter cuts the corpora as glassformer does."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow   # trains a small run in the test

from tests.marian_files import marian_tokenizer_files  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from torch.nn.utils.rnn import pad_sequence  # noqa: E402

from glassformer.cli import main  # noqa: E402
from glassformer.data.checkpoint import load_translator_parts, save_run_files, save_weights  # noqa: E402
from glassformer.data.tokenize import BOS, EOS, PAD, SourceTokenizer, TargetTokenizer  # noqa: E402
from glassformer.decoding.translator import Translator  # noqa: E402
from glassformer.interop import marian, segmenter  # noqa: E402
from glassformer.interop.export import export  # noqa: E402
from glassformer.interop.importer import import_marian  # noqa: E402
from glassformer.model import ModelConfig, Transformer  # noqa: E402
from glassformer.training.prepare_data import with_characters  # noqa: E402

NOT_IN_CORPUS = ["我昨天给了她三本书。", "你们明天去北京吗？", "他不喜欢喝咖啡！", "ABC 和 123", "我很高兴认识你。"]


@pytest.fixture(scope="module")
def corpus():
    from glassformer.data.corpus import load_corpus

    return load_corpus()


@pytest.fixture(scope="module")
def run_dir(corpus, tmp_path_factory) -> Path:
    """A tiny model trained for a few steps on 96 HSK pairs, saved as an ordinary run folder."""
    pairs = corpus.train[:96]
    every = corpus.train + corpus.dev + corpus.test                          # as the default recipe: every character
    source = with_characters(SourceTokenizer.train([p.zh_units for p in pairs]),   # a unit (CC-CEDICT's there)
                             [list(p.zh) for p in every] + [list(t) for t in NOT_IN_CORPUS])
    target = TargetTokenizer.train([p.en for p in pairs], 300)
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size, activation="silu",
                           head_bias=True)
    torch.manual_seed(0)
    model = Transformer(cfg)
    src = pad_sequence([torch.tensor(source.vocab.encode(p.zh_units)) for p in pairs], batch_first=True,
                       padding_value=PAD)
    tgt = pad_sequence([torch.tensor([BOS, *target.encode(p.en), EOS]) for p in pairs], batch_first=True,
                       padding_value=PAD)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        optimizer.zero_grad()
        loss, n = model.loss(src, tgt[:, :-1], tgt[:, 1:])
        (loss / n).backward()
        optimizer.step()
    with torch.no_grad():
        model.head.bias.normal_(std=0.2)                                     # a head bias that is not zero
    out = tmp_path_factory.mktemp("runs") / "tiny"
    save_run_files(out, cfg, {}, source, target)
    save_weights(model.eval(), out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def sentences(corpus) -> list[str]:
    return [p.zh for p in corpus.dev[:24]] + NOT_IN_CORPUS


@pytest.fixture(scope="module")
def ours(run_dir, sentences) -> list[str]:
    translator = Translator.load(run_dir)
    out = translator.translate(sentences)
    assert len(set(out)) > 3                                                # a model that says different things
    return out


def _limit(n_source: int) -> int:
    return min(2 * n_source + 10, 64)                                        # decode.output_limits, max_len 64


def test_transformers_export_translates_like_glassformer(run_dir, sentences, ours, tmp_path):
    out = tmp_path / "hf"
    assert main(["export", "--model", str(run_dir), "--to", "transformers", "--out", str(out)]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.MarianMTModel.from_pretrained(out).eval()
    src_tok = Tokenizer.from_file(str(out / "source_tokenizer.json"))       # no glassformer from here on
    tgt_tok = Tokenizer.from_file(str(out / "target_tokenizer.json"))
    model, source, _, _ = load_translator_parts(run_dir)
    for text, expected in zip(sentences, ours, strict=True):
        ids = src_tok.encode(text).ids
        assert ids == source.encode(text)
        generated = hf.generate(torch.tensor([ids]), max_new_tokens=_limit(len(ids)))[0].tolist()
        assert tgt_tok.decode(generated, skip_special_tokens=True) == expected, text
    ids = torch.tensor([source.encode(sentences[0])])
    tgt = torch.tensor([[BOS, 5, 9, 11]])
    with torch.no_grad():                                                    # the permuted channels: same logits
        assert torch.allclose(hf(input_ids=ids, decoder_input_ids=tgt).logits, model(ids, tgt), atol=1e-5)


def test_ctranslate2_export_translates_like_glassformer(run_dir, sentences, ours, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert main(["export", "--model", str(run_dir), "--to", "ctranslate2", "--out", str(out)]) == 0
    translator = ctranslate2.Translator(str(out), device="cpu", inter_threads=1, intra_threads=1)
    src_tok = Tokenizer.from_file(str(out / "source_tokenizer.json"))
    tgt_tok = Tokenizer.from_file(str(out / "target_tokenizer.json"))
    for text, expected in zip(sentences, ours, strict=True):
        tokens = src_tok.encode(text).tokens
        result = translator.translate_batch([tokens], beam_size=1, max_decoding_length=_limit(len(tokens)))[0]
        ids = [tgt_tok.token_to_id(t) for t in result.hypotheses[0]]
        assert tgt_tok.decode(ids, skip_special_tokens=True) == expected, text


def test_ctranslate2_quantization_passes_through(run_dir, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path / "int8"
    export(run_dir, "ctranslate2", out, quantization="int8")
    assert ctranslate2.Translator(str(out), device="cpu", compute_type="int8").translate_batch([["我"]])
    assert json.loads((out / "config.json").read_text())["eos_token"] == "</s>"


def test_import_of_export_gives_the_same_logits(run_dir, tmp_path):
    """Marian's layout and back: the permutation is exact, so only float rounding remains."""
    export(run_dir, "transformers", tmp_path / "hf")
    model, source, target, _ = load_translator_parts(run_dir)
    hf_dir = tmp_path / "hf"
    marian_tokenizer_files(hf_dir, source, target)
    import_marian(hf_dir, tmp_path / "back")
    back = load_translator_parts(tmp_path / "back")[0]
    assert model.cfg.position_layout == "interleaved" and back.cfg.position_layout == "halves"
    src = torch.tensor([source.encode(NOT_IN_CORPUS[0])])
    tgt = torch.tensor([[BOS, *target.encode("I gave her three books.")]])
    with torch.no_grad():
        a, b = model(src, tgt), back(src, tgt)
    assert float((a - b).abs().max()) < 1e-6 * max(1.0, float(a.abs().max()))
    perm = marian.halves_permutation(8)
    assert perm.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


def test_refuses_what_marian_cannot_express(run_dir, tmp_path, capsys):
    model, source, target, _ = load_translator_parts(run_dir)
    pre = tmp_path / "pre"
    save_run_files(pre, model.cfg.replace(norm_placement="pre"), {}, source, target)
    save_weights(Transformer(model.cfg.replace(norm_placement="pre")), pre / "model.safetensors")
    for to in ("transformers", "ctranslate2"):
        code = main(["export", "--model", str(pre), "--to", to, "--out", str(tmp_path / to)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "pre" in err, err
        assert not (tmp_path / to).exists()


def test_source_tokenizer_json_cuts_like_glassformer(corpus):
    """On every HSK sentence, and where the two cuts are known to part (documented in docs/interop.md)."""
    every = corpus.train + corpus.dev + corpus.test
    source = with_characters(SourceTokenizer.train([p.zh_units for p in corpus.train]), [list(p.zh) for p in every])
    tokenizer = Tokenizer.from_str(segmenter.source_tokenizer(source).to_str())
    texts = [p.zh for p in every]
    assert segmenter.differences(source, texts, tokenizer) == []
    assert segmenter.differences(source, ["我/昨天 给了。", "你好, 世界!"], tokenizer) == []
    unknown_pair = "龘龘"                                    # two unknown characters: one <unk> each, or one for both
    assert source.encode(unknown_pair) == [3, 3] and tokenizer.encode(unknown_pair).ids == [3]
