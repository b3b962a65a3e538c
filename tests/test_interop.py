"""`glassformer import`: a small OPUS-MT-shaped MarianMTModel (swish, tied, non-zero final_logits_bias) with
SentencePiece models built here, against transformers itself (the reference): ids, logits, greedy, beam 4,
the hooks, and hostile folders refused in one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow   # builds and trains a small Marian model in the test
spm = pytest.importorskip("sentencepiece")

from glassformer.cli import main  # noqa: E402
from glassformer.data.checkpoint import load_translator_parts  # noqa: E402
from glassformer.decoding.search import beam_search, greedy  # noqa: E402
from glassformer.interop.importer import import_marian  # noqa: E402

ZH = ["我昨天给了他一本书。", "他昨天给了我一本书。", "你明天去学校吗？", "我喜欢喝茶。", "她很高兴。",
      "我们在北京学习中文。", "这本书很好看。", "今天天气很好。"]
EN = ["I gave him a book yesterday.", "He gave me a book yesterday.", "Are you going to school tomorrow?",
      "I like drinking tea.", "She is very happy.", "We study Chinese in Beijing.", "This book is very good.",
      "The weather is nice today."]
UNSEEN = ["我给了她一本书。", "你喜欢北京吗？", "今天我很高兴。", "abc 你好！"]


def _spm(folder: Path, name: str, lines: list[str], size: int) -> None:
    (folder / f"{name}.txt").write_text("\n".join(lines * 5) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(folder / f"{name}.txt"), model_prefix=str(folder / name),
                                   vocab_size=size, character_coverage=1.0, model_type="unigram", bos_id=-1,
                                   eos_id=1, unk_id=0, pad_id=-1, minloglevel=2, hard_vocab_limit=False)
    (folder / f"{name}.model").rename(folder / f"{name}.spm")


def build_marian(folder: Path, steps: int = 150, layers: int = 2, tie: bool = True) -> Path:
    """A Marian folder as save_pretrained + MarianTokenizer.save_pretrained write it; trained a little on the pairs
    (`layers` encoder and as many decoder layers; `tie`: tie_word_embeddings)."""
    folder.mkdir(parents=True)
    _spm(folder, "source", ZH, 60)
    _spm(folder, "target", EN, 80)
    vocab = {"</s>": 0, "<unk>": 1}                      # Marian: </s> = 0, then the joined pieces, <pad> last
    for name in ("source", "target"):
        proc = spm.SentencePieceProcessor(model_file=str(folder / f"{name}.spm"))
        for i in range(proc.get_piece_size()):
            vocab.setdefault(proc.id_to_piece(i), len(vocab))
    vocab["<pad>"] = pad = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    cfg = transformers.MarianConfig(
        vocab_size=pad + 1, decoder_vocab_size=pad + 1, d_model=32, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        activation_function="swish", max_position_embeddings=64, scale_embedding=True, pad_token_id=pad,
        eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=tie, dropout=0.0)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                                           str(folder / "vocab.json"))
    batch = tok(ZH, text_target=EN, padding=True, return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == pad, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
        optimizer.step()
    with torch.no_grad():                                # a bias that is not zero, pad's entry 0 as Marian's
        model.final_logits_bias.normal_(std=0.3)
        model.final_logits_bias[0, pad] = 0.0
    model.eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory) -> Path:
    return build_marian(tmp_path_factory.mktemp("marian") / "opus-mt-tiny")


@pytest.fixture(scope="module")
def reference(marian_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.MarianMTModel.from_pretrained(marian_dir).eval()
        tok = transformers.AutoTokenizer.from_pretrained(marian_dir)
    return model, tok


@pytest.fixture(scope="module")
def run_dir(marian_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "imported"
    import_marian(marian_dir, out)
    return out


@pytest.fixture(scope="module")
def imported(run_dir):
    return load_translator_parts(run_dir)


def _marian_table(n: int, d: int) -> torch.Tensor:
    """MarianSinusoidalPositionalEmbedding.create_weight's numbers without its cast to float32."""
    import numpy as np

    angle = np.array([[p / np.power(10000, 2 * (j // 2) / d) for j in range(d)] for p in range(n)])
    return torch.from_numpy(np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1))


def test_config_and_origin(imported, marian_dir):
    model, source, target, meta = imported
    cfg = model.cfg
    assert (cfg.activation, cfg.position_layout, cfg.head_bias, cfg.share_embeddings, cfg.tie_target) == \
        ("silu", "halves", True, True, True)
    assert (cfg.eos_id, cfg.pad_id, cfg.bos_id) == (0, cfg.tgt_vocab - 1, cfg.tgt_vocab - 1)
    assert not cfg.use_final_norm and cfg.norm_placement == "post"
    hf = transformers.MarianMTModel.from_pretrained(marian_dir)
    tables = 2 * hf.config.max_position_embeddings * hf.config.d_model    # HF's fixed position tables are parameters,
    bias = hf.config.vocab_size                                           # its final_logits_bias a buffer
    assert meta["origin"]["parameters"] == sum(p.numel() for p in hf.parameters()) - tables + bias
    assert str(marian_dir.resolve()) in meta["origin"]["summary"]


def test_source_ids_and_text_are_mariantokenizers(imported, reference):
    _, source, target, _ = imported
    _, tok = reference
    for text in ZH + UNSEEN + ["", "  他  ", "Beijing 北京 2024"]:
        assert source.encode(text) == tok(text).input_ids, text
        assert source.encode(text)[-1] == 0                                  # ends with </s>
    for text in EN + ["Zebra crossing, 42!"]:
        ids = tok(text_target=text).input_ids
        assert target.encode(text) + [target.eos_id] == ids
        assert target.decode([target.pad_id, *ids]) == tok.decode(ids, skip_special_tokens=True)


def test_logits_equal_transformers(imported, reference):
    model, source, _, _ = imported
    hf, _ = reference
    cfg = model.cfg
    assert bool(hf.final_logits_bias.abs().max() > 0.1)
    for zh, en in zip(ZH[:3] + UNSEEN, EN[:3] + EN[:4], strict=True):
        src = torch.tensor([source.encode(zh)])
        tgt = torch.tensor([[cfg.bos_id, *imported[2].encode(en)]])
        with torch.no_grad():
            theirs = hf(input_ids=src, decoder_input_ids=tgt).logits
            ours = model(src, tgt)
        assert ours.shape == theirs.shape
        scale = max(1.0, float(theirs.abs().max()))                          # fp32: 1e-5 of the logits' size
        assert float((ours - theirs).abs().max()) <= 1e-5 * scale, float((ours - theirs).abs().max())
        with torch.no_grad():                                                # float64: the same function
            hf.double()
            for table in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions):
                table.weight.copy_(_marian_table(*table.weight.shape))       # HF's formula, kept in float64
            theirs64 = hf(input_ids=src, decoder_input_ids=tgt).logits
            ours64 = model.double()(src, tgt)
            hf.float(), model.float()
            for table in (hf.model.encoder.embed_positions, hf.model.decoder.embed_positions):
                table.weight.copy_(table.create_weight())
        assert float((ours64 - theirs64).abs().max()) < 1e-10


def test_shared_but_untied_embeddings_are_read_as_transformers_runs_them(tmp_path):
    """share_encoder_decoder_embeddings with tie_word_embeddings false: transformers 5 gives the encoder, the
    decoder and the output layer a matrix each (model.shared then unused), so the import reads each side's own
    and does not share them; the logits are transformers'."""
    folder = build_marian(tmp_path / "untied", steps=0, tie=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.MarianMTModel.from_pretrained(folder).eval()
    import_marian(folder, tmp_path / "run")
    model, source, target, _ = load_translator_parts(tmp_path / "run")
    embeddings = (hf.model.encoder.embed_tokens.weight, hf.model.decoder.embed_tokens.weight, hf.lm_head.weight)
    if torch.equal(embeddings[0], embeddings[1]):                           # one matrix here: nothing to tell apart
        assert model.cfg.share_embeddings
    else:
        assert not model.cfg.share_embeddings and not model.cfg.tie_target
        assert torch.equal(model.tgt_embed.token.weight, embeddings[1])
    src = torch.tensor([source.encode(ZH[0])])
    tgt = torch.tensor([[model.cfg.bos_id, *target.encode(EN[0])]])
    with torch.no_grad():
        theirs, ours = hf(input_ids=src, decoder_input_ids=tgt).logits, model(src, tgt)
    scale = max(1.0, float(theirs.abs().max()))
    assert float((ours - theirs).abs().max()) <= 1e-5 * scale, float((ours - theirs).abs().max())


def test_greedy_equals_generate(imported, reference):
    model, source, target, _ = imported
    hf, tok = reference
    texts = []
    for zh in ZH + UNSEEN:
        ids = source.encode(zh)
        theirs = hf.generate(torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=30,
                             bad_words_ids=[[model.cfg.pad_id]], forced_eos_token_id=None)[0].tolist()
        assert theirs[0] == model.cfg.bos_id
        theirs = [t for t in theirs[1:] if t != model.cfg.eos_id]
        ours = greedy(model, torch.tensor([ids]), max_len=30)[0]            # the ids of model.cfg
        assert ours == theirs, zh
        texts.append(target.decode(ours))
        assert texts[-1] == tok.decode(theirs, skip_special_tokens=True)
    assert texts[:len(EN)].count(EN[0]) <= 2 and len(set(texts)) > 3       # a trained model, not one output


def test_beam4_equals_transformers_beam_search(imported, reference):
    """glassformer's beam search (score / length^alpha, length with EOS, stop when no live beam can still win)
    is transformers' with length_penalty=alpha and early_stopping="never"; no forced EOS at the limit."""
    model, source, _, _ = imported
    hf, _ = reference
    for zh in ZH + UNSEEN:
        ids = source.encode(zh)
        limit = 2 * len(ids) + 10
        theirs = hf.generate(torch.tensor([ids]), num_beams=4, do_sample=False, max_new_tokens=limit,
                             length_penalty=1.0, early_stopping="never", bad_words_ids=[[model.cfg.pad_id]],
                             forced_eos_token_id=None)[0].tolist()
        theirs = [t for t in theirs[1:] if t not in (model.cfg.eos_id, model.cfg.pad_id)]
        src = torch.tensor([ids])
        ours = beam_search(model, src, src == model.cfg.pad_id, beam=4, alpha=1.0, max_len=limit)[0]
        assert ours == theirs, zh


def test_translate_command_on_the_imported_folder(run_dir, imported, reference, capsys):
    """`glassformer translate` on the run folder prints transformers' greedy text (start at pad, end at </s>)."""
    hf, tok = reference
    _, source, _, _ = imported
    assert main(["translate", "--model", str(run_dir), *UNSEEN]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    for zh, line in zip(UNSEEN, printed[-len(UNSEEN):], strict=True):
        theirs = hf.generate(torch.tensor([source.encode(zh)]), num_beams=1, do_sample=False,
                             max_new_tokens=2 * len(source.encode(zh)) + 10, bad_words_ids=[[imported[0].cfg.pad_id]],
                             forced_eos_token_id=None)[0].tolist()
        assert line.strip().endswith(tok.decode(theirs, skip_special_tokens=True).strip()), (zh, line)


def test_probes_exist_and_patch_runs(run_dir, imported, capsys):
    model, source, _, _ = imported
    src = torch.tensor([source.encode(ZH[0])])
    tgt = torch.tensor([[model.cfg.bos_id, 5, 6]])
    names = ["encoder.embedding", "encoder.0.output", "decoder.1.cross_attention.head.3.weights",
             "decoder.0.ffn.hidden", "logits"]
    with model.probes(*names) as rec:
        model(src, tgt)
    assert rec["decoder.1.cross_attention.head.3.weights"].shape[-1] == src.size(1)
    assert rec["decoder.0.ffn.hidden"].shape[-1] == model.cfg.d_ff
    code = main(["patch", "--model", str(run_dir), ZH[0], "--corrupt", ZH[1], "--heads-only",
                 "--target", EN[0], "--predict", "him", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(out["runs"][0]["heads"]) == 2 and len(out["runs"][0]["heads"][0]) == 4
    assert out["inputs"][0] == "<s>" and "first piece" in out["note"]


def test_explain_names_the_origin(run_dir, capsys):
    assert main(["explain", "--model", str(run_dir), ZH[0]]) == 0
    assert "imported from" in capsys.readouterr().out


# ---- hostile folders: one line, exit 2 -----------------------------------------------------------
def _copy(marian_dir: Path, tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(marian_dir, folder)
    return folder


def _refused(folder: Path, tmp_path: Path, capsys, *expected: str) -> None:
    code = main(["import", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    for part in expected:
        assert part in err, err
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("field, value, expected", [
    ("vocab_size", 10 ** 9, "MAX_VOCAB"), ("d_model", 10 ** 6, "MAX_D_MODEL"),
    ("encoder_layers", 10 ** 4, "MAX_LAYERS"),
    ("d_model", "512", "d_model"), ("activation_function", "gelu", "activation_function"),
    ("normalize_before", True, "normalize_before"), ("model_type", "bart", "model_type"),
    ("max_position_embeddings", 10 ** 9, "max_position_embeddings is 1,000,000,000; the limit is"),  # not max_len
    ("decoder_start_token_id", 10 ** 6, "decoder_start_token_id must be a token id in [0, vocab_size=")])
def test_hostile_config(marian_dir, tmp_path, capsys, field, value, expected):
    folder = _copy(marian_dir, tmp_path)
    data = json.loads((folder / "config.json").read_text())
    data[field] = value
    (folder / "config.json").write_text(json.dumps(data))
    _refused(folder, tmp_path, capsys, expected)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "source.spm", "vocab.json"])
def test_missing_file(marian_dir, tmp_path, capsys, name):
    folder = _copy(marian_dir, tmp_path)
    (folder / name).unlink()
    _refused(folder, tmp_path, capsys, name if name != "model.safetensors" else "pytorch_model.bin")


def test_pickle_that_is_not_weights_only(marian_dir, tmp_path, capsys):
    folder = _copy(marian_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    torch.save({"model.shared.weight": torch.zeros(2, 2), "evil": Path("/")}, folder / "pytorch_model.bin")
    _refused(folder, tmp_path, capsys, "pytorch_model.bin", "weights-only")


def test_weights_only_bin_is_read(marian_dir, tmp_path, reference):
    from safetensors.torch import load_file

    folder = _copy(marian_dir, tmp_path)
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    import_marian(folder, tmp_path / "out")
    model, source, _, _ = load_translator_parts(tmp_path / "out")
    src = torch.tensor([source.encode(ZH[0])])
    tgt = torch.tensor([[model.cfg.bos_id, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), reference[0](input_ids=src, decoder_input_ids=tgt).logits, atol=1e-5)


def test_wrong_tensor_shape(marian_dir, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = _copy(marian_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.encoder.layers.0.fc1.weight"] = torch.zeros(3, 3)
    save_file(tensors, folder / "model.safetensors")
    _refused(folder, tmp_path, capsys, "fc1.weight", "[3, 3]")


# ---- an imported model sent back out --------------------------------------------------------------
def test_imported_model_exports_to_transformers_and_ctranslate2(run_dir, imported, reference, tmp_path):
    model, source, _, _ = imported
    hf_ref, _ = reference
    from glassformer.interop.export import export

    export(run_dir, "transformers", tmp_path / "hf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
        tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok(ZH[0]).input_ids
    assert ids == source.encode(ZH[0])
    tgt = torch.tensor([[model.cfg.bos_id, 4, 8]])
    with torch.no_grad():
        assert torch.allclose(hf(input_ids=torch.tensor([ids]), decoder_input_ids=tgt).logits,
                              hf_ref(input_ids=torch.tensor([ids]), decoder_input_ids=tgt).logits, atol=1e-6)
    ctranslate2 = pytest.importorskip("ctranslate2")
    export(run_dir, "ctranslate2", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", inter_threads=1, intra_threads=1)
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "ct2" / "source.spm"))
    for zh in ZH + UNSEEN:
        tokens = [*processor.encode(zh, out_type=str), "</s>"]                # as MarianTokenizer cuts it
        result = translator.translate_batch([tokens], beam_size=1, max_decoding_length=30,
                                            suppress_sequences=[["<pad>"]])[0].hypotheses[0]
        ours = greedy(model, torch.tensor([source.encode(zh)]), max_len=30)[0]
        assert [source.vocab.token_to_id(t) for t in result] == ours, zh


def test_the_lab_names_the_import_and_the_models_own_special_tokens(run_dir, imported):
    from glassformer.lab.models import load_model

    lab = load_model(run_dir, required=True)
    cfg = lab.model.cfg
    assert "imported from" in lab.origin
    assert lab.piece(cfg.eos_id) == "</s>" and lab.piece(cfg.pad_id) == "<pad>"     # Marian: </s> 0, <pad> last
    word = next(i for i in range(cfg.tgt_vocab) if i not in (cfg.eos_id, cfg.pad_id) and lab.piece(i).isalpha())
    assert lab.piece(word) == imported[2].decode([word]).strip()
