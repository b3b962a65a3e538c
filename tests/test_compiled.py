"""The static decoding step (inference/static.py) against the model's own `decode_step`: logits to 1e-5,
tokens identical for greedy and beam search (sentences finishing at different steps, buckets shrinking),
eagerly and compiled ahead of time (a package built once, then loaded; a failed build decodes eagerly);
`--compile auto|on|off` and `--compile-cache`."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from glassformer.decoding.search import BeamSearch, Greedy, generate
from glassformer.inference import compiler, prepare
from glassformer.inference.static import SENTENCE_BUCKETS, StaticDecoder, StepGraph, bucket, step_name, unsupported
from glassformer.model import Transformer
from glassformer.model.config import ModelConfig


def tiny(**changes) -> Transformer:
    torch.manual_seed(0)
    sizes = dict(src_vocab=60, tgt_vocab=50, d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                 max_len=40, dropout=0.0)
    cfg = ModelConfig(**{**sizes, **changes})
    return Transformer(cfg).eval()


def sources(batch: int = 5, length: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 60, (batch, length), generator=g)
    for row in range(1, batch, 2):                                           # every other row padded
        src[row, length - 2 * row % (length - 1) - 1:] = 0
    return src


@pytest.mark.parametrize("changes", [{}, {"norm_placement": "pre"}, {"positions": "learned"},
                                     {"activation": "silu", "head_bias": True}, {"scale_scores": False}])
def test_step_logits_equal_the_models_decode_step(changes):
    model = tiny(**changes)
    step = StaticDecoder(model)
    src = sources()
    pad = src == 0
    with torch.no_grad():
        memory = model.encode(src, pad)
        cache = model.new_cache()
        run = step.start(src, pad, Greedy())
        w = step.weights
        tokens = torch.full((src.size(0), 1), model.cfg.bos_id)
        for position in range(6):
            expected = model.decode_step(tokens, memory, pad, cache)[:, -1]  # (batch, vocab)
            ids = torch.zeros(run.self_k[0].size(0), dtype=torch.long)
            ids[: src.size(0)] = tokens[:, 0]
            got = w.logits(ids, torch.tensor(position), run.self_k, run.self_v, run.cross_k, run.cross_v,
                           run.source)[: src.size(0)]
            assert torch.allclose(got, expected, atol=1e-5, rtol=0), (position, (got - expected).abs().max())
            tokens = expected.argmax(-1, keepdim=True)


def _same(a, b) -> None:
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    for hyps_a, hyps_b in zip(a, b, strict=True):
        for x, y in zip(hyps_a, hyps_b, strict=True):
            assert x.finished == y.finished
            assert x.score == pytest.approx(y.score, abs=1e-4) or x.score == y.score == -math.inf


@pytest.mark.parametrize("search,n_best", [(Greedy(), 1), (BeamSearch(4), 1), (BeamSearch(3), 3)])
def test_tokens_identical_with_sentences_finishing_at_different_steps(search, n_best):
    """Per-sentence limits end sentences one by one: the rows move to the front and the bucket shrinks."""
    model = tiny()
    src = sources(batch=7)
    limits = torch.tensor([3, 12, 5, 1, 9, 7, 2])
    reference = generate(model, src, search, max_len=limits, n_best=n_best, alpha=0.6)
    _same(generate(StaticDecoder(model), src, search, max_len=limits, n_best=n_best, alpha=0.6), reference)
    alone = [generate(model, src[i: i + 1], search, max_len=limits[i: i + 1], n_best=n_best, alpha=0.6)[0]
             for i in range(src.size(0))]
    _same(generate(StaticDecoder(model), src, search, max_len=limits, n_best=n_best, alpha=0.6), alone)


def test_sentences_ending_with_eos_at_different_steps():
    """EOS made likely (a head bias): sentences end at different steps; the others decode as before."""
    model = tiny(head_bias=True)
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = 2.9
    src = sources(batch=7)
    for search in (Greedy(), BeamSearch(4)):
        reference = generate(prepare(model), src, search, max_len=20)
        assert len({len(h[0].tokens) for h in reference}) >= 2 and any(h[0].finished for h in reference)
        _same(generate(StaticDecoder(model), src, search, max_len=20), reference)


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket(65) == 2 * SENTENCE_BUCKETS[-1] and bucket(200) == 4 * SENTENCE_BUCKETS[-1]


def test_models_the_step_cannot_run_are_named():
    assert unsupported(tiny()) is None
    assert "rope" in unsupported(tiny(positions="rope"))
    with pytest.raises(ValueError, match="relative"):
        StaticDecoder(tiny(positions="relative"))


def test_compile_mode_without_a_compiler(monkeypatch):
    monkeypatch.setattr(compiler, "cxx_compiler", lambda: None)
    assert compiler.compile_mode("off", 100) == (False, None)
    assert compiler.compile_mode("auto", 100) == (False, None)               # auto: eager, nothing said
    on, note = compiler.compile_mode("on", 1)
    assert not on and "no C++ compiler" in note


def test_compile_mode_with_a_compiler(monkeypatch):
    monkeypatch.setattr(compiler, "cxx_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(compiler, "AUTO_MIN_SENTENCES", 100)              # the tests' session raises it
    assert compiler.compile_mode("auto", compiler.AUTO_MIN_SENTENCES)[0] is False   # a few sentences: eager
    assert compiler.compile_mode("auto", compiler.AUTO_MIN_SENTENCES + 1)[0] is True
    assert compiler.compile_mode("auto", 1, cached=True)[0] is True         # built before: loading it is cheap
    assert compiler.compile_mode("on", 1)[0] is True


def test_a_package_is_named_by_the_weights_the_beam_and_the_sizes(monkeypatch, tmp_path):
    """Another model, another beam or another size never loads a package built for something else."""
    monkeypatch.setattr(compiler, "_folder", tmp_path)
    a, b = tiny(), tiny()
    with torch.no_grad():
        b.head.weight[0, 0] += 1e-3                                          # the step's weights differ
        b.encoder.layers[0].ffn.w_1.bias[0] += 1e-3                          # and the source side's
    source, step = StaticDecoder(a).packages(Greedy())
    assert source.parent == step.parent == tmp_path / compiler.PACKAGES and source != step
    others = [*StaticDecoder(b).packages(Greedy()), StaticDecoder(a).packages(BeamSearch(2))[1],
              *StaticDecoder(tiny(d_ff=96)).packages(Greedy())]
    assert len({source, step, *others}) == 7                                 # a, b, d_ff 96: 2 each; beam 2: 1
    assert StaticDecoder(a).packages(BeamSearch(2))[0] == source             # one source side for every beam
    assert StaticDecoder(tiny()).packages(Greedy()) == [source, step]        # the same weights: the same packages


def test_compile_cache_folder(monkeypatch, tmp_path):
    """--compile-cache, else the user's TORCHINDUCTOR_CACHE_DIR as it was when glassformer started (not what
    inductor writes into the variable later), else the user cache."""
    monkeypatch.setattr(compiler, "_folder", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(compiler, "_USER_FOLDER", None)
    monkeypatch.setenv(compiler.CACHE_ENV, "/tmp/torchinductor_someone")    # inductor's own default, set by torch
    assert compiler.default_cache_dir() == tmp_path / "xdg" / "glassformer" / "inductor"
    assert compiler.use_compile_cache() == compiler.default_cache_dir()
    assert os.environ[compiler.CACHE_ENV] == str(compiler.default_cache_dir())   # inductor's kernels go there too
    monkeypatch.setattr(compiler, "_USER_FOLDER", str(tmp_path / "users"))
    assert compiler.use_compile_cache() == tmp_path / "users"
    assert compiler.use_compile_cache(tmp_path / "mine") == tmp_path / "mine"
    assert (tmp_path / "mine").is_dir()
    step = StepGraph(StaticDecoder(tiny()).weights, Greedy())
    assert compiler.package_path(step, {"kind": "step"}).parent == tmp_path / "mine" / compiler.PACKAGES


@pytest.fixture(scope="module")
def package_folder(tmp_path_factory):
    """One cache folder for this module's packages (each build costs tens of seconds on 2 cores)."""
    saved = compiler._folder, os.environ.get(compiler.CACHE_ENV)
    folder = compiler.use_compile_cache(tmp_path_factory.mktemp("packages"))
    yield folder
    compiler._folder = saved[0]
    if saved[1] is not None:
        os.environ[compiler.CACHE_ENV] = saved[1]


@pytest.mark.slow
@pytest.mark.skipif(compiler.cxx_compiler() is None, reason="needs a C++ compiler")
def test_compiled_step_gives_the_eager_tokens_and_a_second_run_builds_nothing(package_folder):
    """Ahead-of-time packages (greedy, beam 2): the model's tokens for a batch whose sentences end at different
    steps and a batch of one; a second decoder of the same model loads them and builds nothing."""
    model = tiny(head_bias=True)
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = 2.9                              # sentences end at different steps
    notes: list[str] = []
    step = StaticDecoder(model, compiled=True, notes=notes.append)
    for search in (Greedy(), BeamSearch(2)):
        for src in (sources(batch=7), sources(batch=1)):
            _same(generate(step, src, search, max_len=20, n_best=search.beam),
                  generate(model, src, search, max_len=20, n_best=search.beam))
    assert sorted(step.compile_seconds) == sorted(["beam 1", step_name(BeamSearch(2)), "source"]), step.compile_seconds
    assert sum("building" in n for n in notes) == 3, notes
    assert not any("failed" in n for n in notes), notes
    again: list[str] = []
    second = StaticDecoder(model, compiled=True, notes=again.append)
    assert second.built(Greedy()) and second.built(BeamSearch(2)) and not second.built(BeamSearch(3))
    src = sources(batch=5)
    _same(generate(second, src, BeamSearch(2), max_len=20), generate(model, src, BeamSearch(2), max_len=20))
    assert again == []                                                       # loaded, not built


@pytest.mark.skipif(compiler.cxx_compiler() is None, reason="needs a C++ compiler")
def test_a_build_that_fails_decodes_eagerly_after_one_note(monkeypatch, package_folder):
    def broken(*args, **kwargs):
        raise RuntimeError("the C++ compiler exited with status 1\nmore detail")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", broken)
    model = tiny(d_ff=80)                                                    # a model no other test built
    notes: list[str] = []
    src = sources()
    out = generate(StaticDecoder(model, compiled=True, notes=notes.append), src, Greedy(), max_len=9)
    _same(out, generate(model, src, Greedy(), max_len=9))
    failed = [n for n in notes if "failed" in n]
    assert len(failed) == 1 and "status 1" in failed[0] and "more detail" not in failed[0]


def test_a_source_of_only_pad_decodes_as_in_the_model():
    """A row with no source key reads zero from cross-attention (the model's rule), never NaN."""
    model = tiny()
    src = sources(batch=3)
    src[1] = 0
    for search in (Greedy(), BeamSearch(2)):
        _same(generate(StaticDecoder(model), src, search, max_len=8), generate(model, src, search, max_len=8))


def test_buffers_grow_past_their_first_size():
    """Outputs longer than the first self-attention buffer (SELF_STEP positions) decode as the model's."""
    from glassformer.inference import static

    model = tiny()
    src = sources(batch=2)
    limit = min(model.cfg.max_len, 2 * static.SELF_STEP + 5)
    _same(generate(StaticDecoder(model), src, Greedy(), max_len=limit), generate(model, src, Greedy(), max_len=limit))


def test_a_beam_package_is_built_for_the_threads_decoding_runs_on_and_greedy_for_one():
    """Beams: one package per thread count (its loops are generated for them), named apart; greedy: one
    package whatever the thread count."""
    from glassformer.inference.threads import use_threads

    decoder = StaticDecoder(tiny())
    with use_threads(1):
        one = [decoder.packages(s)[1] for s in (Greedy(), BeamSearch(2))]
        assert step_name(BeamSearch(2)) == "beam 2"
    with use_threads(2):
        two = [decoder.packages(s)[1] for s in (Greedy(), BeamSearch(2))]
        assert step_name(BeamSearch(2)) == "beam 2 on 2 threads" and step_name(Greedy()) == "beam 1"
    assert one[0] == two[0] and one[1] != two[1]
    code = decoder._facts("step", BeamSearch(2))["code"]                    # what the step traces is hashed
    assert {Path(c).name for c in code} == {"search.py", "candidates.py"}
