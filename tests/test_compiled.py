"""The model's own decoding step, eagerly and compiled ahead of time (inference/compiler.py): the model's
tokens and scores for batches whose sentences finish at different steps, each sentence as it decodes alone;
packages named by what they compute (a comment edit finds the same one, a weight change another), built
whole or not at all, a package that fails to build or to load decodes eagerly after one note;
`--compile auto|on|off` and the cache folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassformer.decoding import translator
from glassformer.decoding.search import SENTENCE_BUCKETS, BeamSearch, Greedy, bucket, generate, step, steps
from glassformer.inference import compiler, prepare
from glassformer.inference.compiler import CompiledDecoder, unsupported
from glassformer.inference.precision import with_precision
from glassformer.inference.prepare import MKL, PreparedLinear
from glassformer.model import Transformer
from glassformer.model.cache import GROW
from glassformer.model.config import ModelConfig

HAS_CXX = compiler.cxx_compiler() is not None


def tiny(**changes) -> Transformer:
    torch.manual_seed(0)
    sizes = dict(src_vocab=60, tgt_vocab=50, d_model=32, heads=4, d_ff=64, encoder_layers=2, decoder_layers=2,
                 max_len=40, dropout=0.0)
    return Transformer(ModelConfig(**{**sizes, **changes})).eval()


def eos_likely(**changes) -> Transformer:
    """A head bias that makes EOS likely: sentences end at different steps."""
    model = tiny(head_bias=True, **changes)
    with torch.no_grad():
        model.head.bias[model.cfg.eos_id] = 2.9
    return model


def sources(batch: int = 5, length: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 60, (batch, length), generator=g)
    for row in range(1, batch, 2):                                           # every other row padded
        src[row, length - 2 * row % (length - 1) - 1:] = 0
    return src


def _same(a, b, atol: float = 1e-5) -> None:
    assert [[h.tokens for h in hyps] for hyps in a] == [[h.tokens for h in hyps] for hyps in b]
    for hyps_a, hyps_b in zip(a, b, strict=True):
        for x, y in zip(hyps_a, hyps_b, strict=True):
            assert x.finished == y.finished
            assert x.score == pytest.approx(y.score, abs=atol) or x.score == y.score == -math.inf


def _alone(model, src, search, **kw) -> list:
    return [generate(model, src[i: i + 1], search, **kw)[0] for i in range(src.size(0))]


@pytest.fixture
def eager_packages(monkeypatch, tmp_path):
    """CompiledDecoder whose parts are the traced modules themselves, run eagerly: the marshalling of the
    cache into a package's inputs and back, without a build."""
    def make(model):
        decoder = CompiledDecoder(model, step, tmp_path, threads=2)
        monkeypatch.setattr(decoder, "_found", lambda kind, search: None)
        monkeypatch.setattr(torch.export, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
        return decoder
    return make


@pytest.mark.parametrize("changes", [{}, {"norm_placement": "pre"}, {"positions": "learned"},
                                     {"activation": "silu"}, {"scale_scores": False}])
@pytest.mark.parametrize("search,n_best", [(Greedy(), 1), (BeamSearch(4), 1), (BeamSearch(3), 3)])
def test_each_sentence_of_a_batch_gets_what_it_gets_alone(changes, search, n_best, eager_packages):
    """EOS likely and per-sentence limits: sentences end at different steps, the rows move to the front and
    the bucket shrinks; each sentence's hypotheses are those it gets alone, on the model, its prepared copy
    and the step's package inputs (run eagerly)."""
    model = eos_likely(**changes)
    src = sources(batch=7)
    limits = torch.tensor([3, 12, 5, 1, 9, 7, 20])
    kw = dict(max_len=limits, n_best=n_best, alpha=0.6)
    alone = [generate(model, src[i: i + 1], search, **{**kw, "max_len": limits[i: i + 1]})[0]
             for i in range(src.size(0))]
    batch = generate(model, src, search, **kw)
    assert len({len(h.tokens) for hyps in batch for h in hyps}) >= 2 and any(h[0].finished for h in batch)
    _same(batch, alone)
    _same(generate(prepare(model), src, search, **kw), alone)
    _same(generate(model, src, search, compiled=eager_packages(model), **kw), alone)


def test_greedy_without_scores_chooses_each_sentences_tokens_and_scores_nothing(eager_packages):
    """Greedy(scores=False) (what the Translator runs: it keeps the ids only) skips the log-normaliser: every
    sentence's tokens and where it ends are Greedy()'s, on the model, its prepared copy and the step's package
    inputs (its own package kind, not the scored one's); its hypotheses' scores are NaN, not a number that
    looks like a log-probability."""
    model = eos_likely()
    src = sources(batch=7)
    limits = torch.tensor([3, 12, 5, 1, 9, 7, 20])
    want = generate(model, src, Greedy(), max_len=limits)
    assert len({len(h[0].tokens) for h in want}) >= 3 and any(h[0].finished for h in want)
    decoder = eager_packages(model)
    for got in (generate(model, src, Greedy(scores=False), max_len=limits),
                generate(prepare(model), src, Greedy(scores=False), max_len=limits),
                generate(model, src, Greedy(scores=False), max_len=limits, compiled=decoder)):
        assert [(h[0].tokens, h[0].finished) for h in got] == [(h[0].tokens, h[0].finished) for h in want]
        assert all(math.isnan(h[0].score) and math.isnan(h[0].normalized) for h in got)
    assert "greedy" in decoder.parts and "beam1" not in decoder.parts
    assert Greedy().kind == "beam1" and Greedy(scores=False).kind == "greedy" and BeamSearch(4).kind == "beam4"


def test_a_source_of_only_pad_and_outputs_past_the_first_buffer(eager_packages):
    """A row with no source key reads zero from cross-attention (the model's rule), never NaN; outputs longer
    than the cache's first buffer (GROW positions) decode as the model's."""
    model = tiny()
    src = sources(batch=3)
    src[1] = 0
    for search in (Greedy(), BeamSearch(2)):
        want = generate(model, src, search, max_len=38)
        assert any(len(h[0].tokens) > 16 for h in want)
        _same(generate(model, src, search, max_len=38, compiled=eager_packages(model)), want)


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert bucket(65) == 2 * SENTENCE_BUCKETS[-1] and bucket(200) == 4 * SENTENCE_BUCKETS[-1]


def test_models_the_compiled_step_does_not_run_are_named():
    assert unsupported(tiny()) is None
    assert "rope" in unsupported(tiny(positions="rope"))
    assert "max_len" in unsupported(tiny(max_len=600))
    assert unsupported(with_precision(tiny(), "bfloat16", note=False)) is None              # a bfloat16 copy
    assert "bfloat16" in unsupported(tiny().to(torch.bfloat16))              # its weights cast, no precision copy
    assert unsupported(with_precision(tiny(), "int8", note=False)) is None                  # an int8 copy


def test_compile_mode(monkeypatch):
    asked = []
    monkeypatch.setattr(compiler, "cxx_compiler", lambda: None)
    assert translator.compile_mode("off", 10 ** 6) == ("", None)
    assert translator.compile_mode("auto", 10 ** 6, lambda: asked.append(1)) == ("", None)   # nothing said
    mode, note = translator.compile_mode("on", 1)
    assert not mode and "no C++ compiler" in note and asked == []                # no compiler: nothing hashed
    monkeypatch.setattr(compiler, "cxx_compiler", lambda: "/usr/bin/g++")
    monkeypatch.setattr(translator, "AUTO_MIN_SENTENCES", 100)
    assert translator.compile_mode("auto", 100) == ("", None)                      # a short job, nothing built: eager
    assert translator.compile_mode("auto", 100, lambda: True) == ("load", None)   # built before: those, no build
    assert translator.compile_mode("auto", 101, lambda: pytest.fail("asked")) == ("build", None)   # a long job
    assert translator.compile_mode("on", 1, lambda: pytest.fail("asked")) == ("build", None)


def test_auto_loads_the_packages_built_before_and_decodes_the_other_shapes_eagerly(monkeypatch, tmp_path):
    """--compile auto on a short job ("load", `build` False): a part whose package was built before is loaded; one
    that was not is neither traced nor built but runs eagerly after one note naming it (greedy's block: a step a
    call, without a note); the eager model's ids. `built` finds a step built for a few rows or for a batch."""
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: pytest.fail("traced"))
    monkeypatch.setattr(compiler, "prepacks", lambda *a: True)
    model, src, search = tiny(), sources(batch=3), Greedy(scores=False)
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, tmp_path, notes.append, threads=1, steps=steps)
    decoder.per_call = {"few": 8, "many": 4}                                 # greedy in blocks
    decoder.build, there, loaded = False, {"source-few"}, []                 # as if built before
    monkeypatch.setattr(decoder, "_found", lambda kind, search: tmp_path / f"{kind}.pt2" if kind in there else None)
    source = compiler.Source(decoder.fast)
    monkeypatch.setattr(compiler, "_load", lambda path, packs: loaded.append(path.stem) or (lambda f: source(*f)))
    assert not decoder.built(search)
    got = generate(model, src, search, max_len=12, compiled=decoder)
    assert [h[0].tokens for h in got] == [h[0].tokens for h in generate(model, src, search, max_len=12)]
    assert loaded == ["source-few"] and len(notes) == 1, notes
    assert notes[0].startswith("--compile auto: the step for beam 1 (a few rows) not built") and "eagerly" in notes[0]
    assert decoder.k[("greedy", 4)] == 1                                     # its block not built: a step a call
    fresh = CompiledDecoder(model, step, tmp_path, threads=1, steps=steps)
    fresh.per_call = decoder.per_call
    monkeypatch.setattr(fresh, "_found", lambda kind, search: tmp_path / f"{kind}.pt2" if kind in there else None)
    there.add("greedy-few-k8")
    assert fresh.built(search) and not fresh.built(Greedy()) and not fresh.built(BeamSearch(2))
    there.add("beam2")
    assert fresh.built(BeamSearch(2))


def test_cache_folder(monkeypatch, tmp_path):
    """The folder given, else the user's TORCHINDUCTOR_CACHE_DIR as it was when glassformer started (not what
    inductor writes into the variable later), else the user cache; choosing one creates nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(compiler, "_USER_FOLDER", None)
    monkeypatch.setenv(compiler.CACHE_ENV, "/tmp/torchinductor_someone")    # inductor's own default
    assert compiler.cache_folder() == tmp_path / "xdg" / "glassformer" / "inductor"
    monkeypatch.setattr(compiler, "_USER_FOLDER", str(tmp_path / "users"))
    assert compiler.cache_folder() == tmp_path / "users"
    assert compiler.cache_folder(tmp_path / "mine") == tmp_path / "mine"
    assert compiler.use_compile_cache(tmp_path / "mine") == tmp_path / "mine"
    assert os.environ[compiler.CACHE_ENV] == str(tmp_path / "mine") and not (tmp_path / "mine").exists()


def test_the_traced_copy_multiplies_by_a_contiguous_w_transposed_everywhere():
    """Every product of the traced copy is x W^T with W^T laid out (in, out): MKL's product without a transposed
    operand (W_2, narrower than it is wide, was the one product on a transposed view: 1.4x slower at 32 rows)."""
    decoder = CompiledDecoder(tiny(), step, Path("/nonexistent"), threads=1)
    linears = [m for m in decoder.fast.modules() if isinstance(m, PreparedLinear)]
    assert {m.w.size(0) < m.w.size(1) for m in linears} == {False, True}        # narrow W_2 and wide ones
    assert all(m.wt is not None and m.wt.is_contiguous() and m.wt.shape == m.w.t().shape for m in linears)


def _traced_name(model) -> str:
    """The package name of `model`'s source side: traced, not built."""
    decoder = CompiledDecoder(model, step, Path("/nonexistent"), threads=1)
    src = sources(batch=2)
    example, dynamic = compiler._shapes((src, src == 0, torch.tensor([0, 1])), 0, model.cfg.max_len)
    with torch.no_grad():
        program = torch.export.export(compiler.Source(decoder.fast), example, dynamic_shapes=dynamic)
    return compiler.package_name(program, {**compiler.FROZEN, "cpp.threads": 1})


def test_a_package_built_with_kernel_profiling_is_named_apart(monkeypatch, tmp_path):
    """TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1 builds kernels that record themselves (an int8 job 1.7 s against
    1.1-1.2 s); inductor reads it from the environment, not from the settings a package is named by, so a profiled
    build once took the plain build's name and every later run loaded it. The recipe and the name now differ."""
    decoder = CompiledDecoder(tiny(), step, tmp_path, threads=1)
    program = torch.export.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),))
    configs = {**compiler.FROZEN, "cpp.threads": 1}
    plain = decoder._note("source", None), compiler.package_name(program, configs)
    monkeypatch.setenv("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "1")
    profiled = decoder._note("source", None), compiler.package_name(program, configs)
    assert plain[0] != profiled[0] and plain[1] != profiled[1]
    monkeypatch.setenv("TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE", "0")
    assert (decoder._note("source", None), compiler.package_name(program, configs)) == plain


def test_a_traced_float32_product_leaves_its_bias_to_the_next_kernel():
    """In the traced source side every float32 product is an `mm` whose bias is added after its view: inductor turns
    an `add` of an `mm`'s own output into an `addmm`, which on the CPU first copies the bias into every output row (a
    batch-32 job's source side: 213 against 202 ms without those copies). The bfloat16 copy keeps b in the product."""
    decoder = CompiledDecoder(tiny(), step, Path("/nonexistent"), threads=1)
    src = sources(batch=2)
    example, dynamic = compiler._shapes((src, src == 0, torch.tensor([0, 1])), 0, decoder.model.cfg.max_len)
    with torch.no_grad():
        graph = torch.export.export(compiler.Source(decoder.fast), example, dynamic_shapes=dynamic).graph
    mms = [n for n in graph.nodes if n.target is torch.ops.aten.mm.default]
    assert len(mms) >= 10 and not [n for n in graph.nodes if n.target is torch.ops.aten.addmm.default]
    assert all(user.target is not torch.ops.aten.add.Tensor for n in mms for user in n.users)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    linear = PreparedLinear(torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16),
                            onednn=False, transposed=True)
    assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.w, linear.b))      # one rounding, as eagerly


@pytest.mark.slow                                                            # several torch.export traces
def test_a_comment_edit_or_a_moved_file_keeps_the_name_and_a_weight_change_does_not():
    """The name hashes the traced graph and the weights: the encoder's FeedForward.forward redefined from its
    source with comments, blank lines and another file name gives the same name; one weight moved does not."""
    import inspect
    import textwrap

    from glassformer.model.layers import FeedForward

    model = tiny()
    name = _traced_name(model)
    source = textwrap.dedent(inspect.getsource(FeedForward.forward))
    edited = "# a comment above\n\n\n" + source.replace("):\n", "):  # a comment\n    # and another\n", 1)
    space: dict = {}
    exec(compile(edited, "/somewhere/else/layers.py", "exec"), vars(__import__("glassformer.model.layers",
                                                                              fromlist=["x"])) | space, space)
    for layer in model.encoder.layers:
        layer.ffn.forward = space["forward"].__get__(layer.ffn)
    assert _traced_name(model) == name
    space = {}
    exec(compile(source.replace("self.activation(", "torch.sigmoid("), "layers.py", "exec"),
         vars(__import__("glassformer.model.layers", fromlist=["x"])) | {"torch": torch}, space)
    model.encoder.layers[0].ffn.forward = space["forward"].__get__(model.encoder.layers[0].ffn)
    assert _traced_name(model) != name                                       # another computation
    model.encoder.layers[0].ffn.forward = model.encoder.layers[1].ffn.forward.__func__.__get__(
        model.encoder.layers[0].ffn)
    assert _traced_name(model) == name
    with torch.no_grad():
        model.encoder.layers[0].ffn.w_1.bias[0] += 1e-3
    assert _traced_name(model) != name


@pytest.mark.xdist_group("eos_likely_packages")
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
def test_compiled_packages_give_the_models_tokens_and_a_second_decoder_builds_nothing(shared_packages):
    """Packages of the source side, greedy and a beam-2 step built for two threads (in the session's folder, or found
    there): the model's tokens and scores for a batch whose sentences end at different steps, each as alone, and a
    batch of one; a second decoder of the same model finds them without a trace and builds nothing."""
    model, package_folder = eos_likely(), shared_packages
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, package_folder, notes.append, threads=2)
    for search in (Greedy(), BeamSearch(2)):
        src = sources(batch=7)
        got = generate(model, src, search, max_len=20, n_best=search.beam, compiled=decoder)
        _same(got, generate(model, src, search, max_len=20, n_best=search.beam))
        _same(got, _alone(model, src, search, max_len=20, n_best=search.beam))
        assert len({len(h[0].tokens) for h in got}) >= 2
        one = sources(batch=1)
        _same(generate(model, one, search, max_len=20, compiled=decoder), generate(model, one, search, max_len=20))
    # the source side for many sentences and for a few (the batch of one), greedy's step for many rows and for a
    # few (its batch shrinks to 4, 2, 1 live), beam 2's: each a whole package and its recipe's note
    names = [p for p in decoder.parts if isinstance(p, str)]
    assert len(names) == 5 and {"source", "source-few", "beam1-few", "beam2"} <= set(names), names
    assert not any("failed" in n for n in notes) and sum("building" in n for n in notes) <= 5, notes
    searches = {"source": None, "beam1": Greedy(), "beam2": BeamSearch(2)}
    assert all(decoder._found(name, searches[name.split("-")[0]]) for name in names)   # each named by its note
    assert not list(package_folder.glob("packages/.*"))                      # no partial file left
    again: list[str] = []
    second = CompiledDecoder(model, step, package_folder, again.append, threads=2)
    assert second.built(Greedy()) and second.built(BeamSearch(2)) and not second.built(BeamSearch(3))
    for search in (Greedy(), BeamSearch(2)):                                 # built for 2 threads, not for 1
        assert not CompiledDecoder(model, step, package_folder, threads=1).built(search)
    export = torch.export.export
    try:
        torch.export.export = None                                           # found without a trace
        src = sources(batch=5)
        _same(generate(model, src, BeamSearch(2), max_len=20, compiled=second),
              generate(model, src, BeamSearch(2), max_len=20))
    finally:
        torch.export.export = export
    assert again == [] and "fast" not in second.__dict__                  # and no prepared copy: nothing to trace


@pytest.mark.xdist_group("eos_likely_packages")
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX or not MKL, reason="needs a C++ compiler and torch with MKL")
def test_greedys_many_row_steps_take_mkl_packs_handed_in_at_load_one_package_per_row_count(monkeypatch,
                                                                                         shared_packages):
    """Where MKL is the products' route, greedy's steps of 16 and of 8 rows each get a package traced for that row
    count, its products on MKL's packs, and a batch's rows stay on the 8-row one (`fewest`) to its end: the model's
    tokens, each sentence's as alone; the packages hold stand-ins (a pack holds its own address), a second decoder's
    own packs run them without a build, and a load without them is refused (a stand-in would not run)."""
    monkeypatch.setattr(compiler, "prepacks", lambda *a: False)
    model, search, src, package_folder = eos_likely(), Greedy(scores=False), sources(batch=9), shared_packages
    expected = [h[0].tokens for h in generate(model, src, search, max_len=20)]
    assert len(set(map(len, expected))) >= 3 and expected == [h[0].tokens for h in _alone(model, src, search,
                                                                                          max_len=20)]
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, package_folder, notes.append, threads=2)
    assert [h[0].tokens for h in generate(model, src, search, max_len=20, compiled=decoder)] == expected
    assert {"greedy-16", "greedy-8"} <= set(decoder.parts) and "greedy" not in decoder.parts, notes
    assert decoder.fewest == {search.kind: 8} and "greedy-few" not in decoder.parts   # stays on the 8-row package
    for rows in (16, 8):
        path = next(package_folder.glob(f"packages/greedy-{rows}-[!k]*.pt2"))   # one step a call
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        packed = [n for n in loader.get_constant_fqns() if n.endswith(".mkl")]
        assert len(packed) == 6 * model.cfg.decoder_layers + 1                 # 6 products a layer, the head
        with pytest.raises(RuntimeError, match="MKL packs"):
            compiler._load(path, dict)
    again: list[str] = []
    second = CompiledDecoder(model, step, package_folder, again.append, threads=2)
    assert [h[0].tokens for h in generate(model, src, search, max_len=20, compiled=second)] == expected
    assert again == [] and "fast" in second.__dict__                     # the prepared copy made for its packs
    few = src[:3]                                                  # a few sentences: their source side on MKL
    assert [h[0].tokens for h in generate(model, few, search, max_len=20, compiled=second)] == expected[:3] \
        and {"source-few", "greedy-few"} <= set(second.parts) and not any("failed" in n for n in again), again


@pytest.mark.slow                                                            # several torch.export traces
def test_a_few_sentences_source_side_follows_the_products_route(monkeypatch, tmp_path):
    """Where MKL is the products' route a few sentences' source side multiplies on W^T, unfrozen, not autotuned
    (MKL's products beat FEW's GEMMs there), as the many-row one does; on oneDNN's both keep their settings (FEW's,
    frozen). The route is asked at a build: a recipe's note (`_configs` alone) does not time the products."""
    built = {}

    def building(program, package_path, inductor_configs):
        built[Path(package_path).name.lstrip(".").split("-")[1]] = inductor_configs   # "few" / the many-row's hash
        Path(package_path).write_bytes(b"not a package")                  # then it fails to load: eager

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", building)
    model = eos_likely()
    for onednn in (False, True):
        monkeypatch.setattr(compiler, "prepacks", lambda *a, route=onednn: route)
        built.clear()
        decoder = CompiledDecoder(model, step, tmp_path / str(onednn), threads=1)
        for n in (2, 5):                                                   # a few sentences, then many
            decoder.source(model.new_cache(), sources(n), sources(n) == model.cfg.pad_id, torch.arange(n))
        few, many = built.pop("few"), built.popitem()[1]
        assert few["freezing"] is onednn and bool(few.get("max_autotune")) is onednn and many["freezing"] is onednn
    monkeypatch.setattr(compiler, "prepacks", lambda *a: pytest.fail("a note timed the products' route"))
    assert decoder._configs("source-few")["max_autotune"] and decoder._configs("greedy-few")["max_autotune"]
    assert decoder._found("source", None).name.startswith("source-")        # its note read, nothing timed


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_a_bfloat16_or_int8_copy_compiles_and_decodes_as_it_does_eagerly(tmp_path, dtype, timed_gemms_on_amx):
    """precision.py's bfloat16 / int8 copy, compiled (every product on inductor's GEMMs, FEW's settings): the copy's
    own tokens and, to its rounding, scores for a batch whose sentences end at different steps (the float32
    model's are not these: its scores differ by ~0.07 here, so a step built from the float32 weights fails)."""
    model = eos_likely()
    copy = with_precision(model, dtype, note=False)
    notes: list[str] = []
    decoder = CompiledDecoder(copy, step, tmp_path, notes.append, threads=1)
    assert decoder.narrow and all(decoder._configs(k)["max_autotune"] for k in ("source", "beam1", "beam1-few"))
    src = sources(batch=7)
    want = generate(copy, src, Greedy(), max_len=20)
    got = generate(copy, src, Greedy(), max_len=20, compiled=decoder)
    assert sum("built in" in n for n in notes) == 3 and not any("failed" in n for n in notes), notes
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want] and len({len(h[0].tokens) for h in got}) >= 2
    assert max(abs(a[0].score - b[0].score) for a, b in zip(got, want, strict=True)) < 1e-2
    float32 = generate(model, src, Greedy(), max_len=20)
    assert max(abs(a[0].score - b[0].score) for a, b in zip(got, float32, strict=True)) > 1e-2
    # a fresh process that only loads them (as a --workers process does): no build, so AMX kernels need the
    # process's AMX state asked for at the load; without it such a process dies of SIGILL (FEW as this session
    # has it: the same recipe names the same packages)
    code = ("import json, sys, torch; sys.path.insert(0, sys.argv[1]); from test_compiled import *; "
            f"compiler.FEW.update({dict(compiler.FEW)!r}); "
            f"copy = with_precision(eos_likely(), {dtype!r}, note=False); "
            "d = CompiledDecoder(copy, step, Path(sys.argv[2]), print, threads=1); "
            "print(json.dumps([h[0].tokens for h in generate(copy, sources(batch=7), Greedy(), max_len=20, "
            "compiled=d)]))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [h[0].tokens for h in got]
    assert "--compile" not in done.stdout                                    # loaded: nothing built, no failure


@pytest.mark.slow                                                            # several torch.export traces
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
def test_a_build_that_fails_or_is_interrupted_leaves_nothing_and_decodes_eagerly(monkeypatch, tmp_path):
    def broken(program, package_path, **kw):
        Path(package_path).write_bytes(b"half a package")
        raise RuntimeError("the C++ compiler exited with status 1\nmore detail")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", broken)
    model, src, search = tiny(d_ff=80), sources(), Greedy(scores=False)
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, tmp_path, notes.append, steps=steps)
    decoder.per_call = {"few": 2, "many": 2}                                 # greedy's block: 2 steps a call
    out = generate(model, src, search, max_len=9, compiled=decoder)
    assert [h[0].tokens for h in out] == [h[0].tokens for h in generate(model, src, search, max_len=9)]
    failed = [n for n in notes if "failed" in n]                             # the source side, the block, the step
    assert len(failed) == 3 and all("status 1" in n and "more detail" not in n for n in failed), notes
    assert "2 steps for beam 1" in failed[1] and failed[1].endswith("; one step a call")   # then the step's
    assert failed[2].startswith("compiling the step for beam 1") and failed[2].endswith("; decoding eagerly")
    assert set(decoder.k.values()) == {1}
    measured = list(tmp_path.rglob("products-*.json"))                   # a fact about the CPU, not a build's
    assert [p for p in tmp_path.rglob("*.*") if p not in measured] == []

    def interrupted(program, package_path, **kw):
        Path(package_path).write_bytes(b"half a package")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", interrupted)
    with pytest.raises(KeyboardInterrupt):
        generate(model, src, Greedy(), max_len=9, compiled=CompiledDecoder(model, step, tmp_path))
    assert [p for p in tmp_path.rglob("*.*") if p not in measured] == []


def test_the_products_route_is_timed_once_per_cpu_and_thread_count_and_read_back(monkeypatch, tmp_path):
    """`prepacks`: oneDNN's blocked weights or MKL, whichever ran the model's own decode_step faster, timed once and
    kept; the file decides afterwards (a route fixed in the code, or timings not read back, would fail here)."""
    model, threads = tiny(), torch.get_num_threads()
    assert compiler.prepacks(model, threads + 1, tmp_path) == compiler.ONEDNN   # not this process's count: no timing
    assert list(tmp_path.rglob("*")) == []
    if not compiler.ONEDNN:
        return
    rng = torch.random.get_rng_state()
    first = compiler.prepacks(model, threads, tmp_path)
    assert torch.equal(torch.random.get_rng_state(), rng)                  # the caller's random numbers untouched
    [path] = tmp_path.rglob("products-*.json")
    timings = json.loads(path.read_text())
    assert first == (timings["onednn_s"] <= timings["mkl_s"]) and 0 < timings["mkl_s"] < 10
    for onednn, mkl in ((1.0, 2.0), (2.0, 1.0)):                         # read back, not timed again
        path.write_text(json.dumps({"onednn_s": onednn, "mkl_s": mkl}))
        assert compiler.prepacks(model, threads, tmp_path) is (onednn <= mkl)
    path.write_text('{"onednn_s": "fast"')                                 # damaged: timed again, replaced
    assert compiler.prepacks(model, threads, tmp_path) in (True, False)
    assert json.loads(path.read_text())["mkl_s"] > 0
    assert compiler.prepacks(tiny(d_ff=80), threads, tmp_path) in (True, False)   # another model: its own timing
    assert len(list(tmp_path.rglob("products-*.json"))) == 2


@pytest.mark.slow                                                            # several torch.export traces
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
def test_a_package_that_fails_to_load_decodes_eagerly_after_one_note(monkeypatch, tmp_path):
    """A package file that is not one (a damaged cache): one note per part, then the eager step's tokens."""
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda program, package_path, **kw: Path(package_path).write_bytes(b"not a package"))
    model, src = tiny(d_ff=72), sources()
    notes: list[str] = []
    out = generate(model, src, BeamSearch(2), max_len=9,
                   compiled=CompiledDecoder(model, step, tmp_path, notes.append, threads=2))
    _same(out, generate(model, src, BeamSearch(2), max_len=9))
    failed = [n for n in notes if "failed" in n]
    assert len(failed) == 2 and all("decoding eagerly" in n and "\n" not in n for n in failed), notes


@pytest.mark.slow                                                            # several torch.export traces
@pytest.mark.skipif(not HAS_CXX, reason="needs a C++ compiler")
def test_a_step_over_three_decoder_layers_and_one_encoder_layer_takes_its_buffers_in_order(monkeypatch, tmp_path):
    """A step's inputs are flat (self K, self V, cross K, cross V, a decoder layer each): traced and exported for 3
    decoder layers over 1 encoder layer, then run as the traced module (the package made unloadable), it gives the
    eager model's tokens and scores through two growths of the buffers (20 tokens, GROW 8)."""
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package",
                        lambda program, package_path, **kw: Path(package_path).write_bytes(b"not a package"))
    model, src = tiny(encoder_layers=1, decoder_layers=3), sources()
    notes: list[str] = []
    decoder = CompiledDecoder(model, step, tmp_path, notes.append, threads=1)
    for search in (Greedy(), BeamSearch(2)):
        out = generate(model, src, search, max_len=20, compiled=decoder)
        _same(out, generate(model, src, search, max_len=20))
        assert max(len(h[0].tokens) for h in out) > 2 * GROW
    failed = [n for n in notes if "failed" in n]                             # loading each part, not its export
    assert len(failed) == 3 and all("failed (BadZipFile" in n for n in failed), notes     # (its shared object)


@pytest.mark.slow                                                            # several torch.export traces
def test_a_many_row_step_is_made_for_a_batchs_sizes_and_named_by_them(monkeypatch, tmp_path):
    """inductor decides from the example's sizes which loops its threads share: a step of many rows is traced at a
    batch's (TYPICAL: 32 sentences, 32 x beam rows), the source side and greedy's few-row step at 2-3; a package's
    name hashes the sizes it was made for. Every step and the few-row source side are built for the decoder's threads,
    the many-row source side for one."""
    built, export = [], torch.export.export

    def recording(module, example, **kw):
        built.append((type(module).__name__, getattr(getattr(module, "search", None), "beam", 0),
                      example[0].size(0), example[0].dtype))
        return export(module, example, **kw)

    threads = []

    def building(program, package_path, inductor_configs):
        threads.append(inductor_configs["cpp.threads"])
        Path(package_path).write_bytes(b"not a package")

    monkeypatch.setattr(torch.export, "export", recording)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", building)
    model = eos_likely(d_ff=88)
    decoder = CompiledDecoder(model, step, tmp_path, threads=2)
    for search, src in ((Greedy(), sources(batch=7)), (Greedy(), sources(batch=1)), (BeamSearch(2), sources(batch=7))):
        _same(generate(model, src, search, max_len=20, compiled=decoder), generate(model, src, search, max_len=20))
    slots = compiler.TYPICAL["slots"]
    # each export, then its build: the source side of 7 sentences for one thread, that of one sentence (few rows) and
    # every step for the decoder's two
    assert sorted((*b[:3], n) for b, n in zip(built, threads, strict=True)) == [
        ("Source", 0, 2, 1), ("Source", 0, 2, 2), ("Step", 1, 2, 2), ("Step", 1, slots, 2), ("Step", 2, 2 * slots, 2)]
    configs, names = {**compiler.FROZEN, "cpp.threads": 1}, []
    for inputs in [(sources(2), sources(2) == 0, torch.tensor([0, 1]))] * 2 + [(sources(5), sources(5) == 0,
                                                                                  torch.arange(5))]:
        example, dynamic = compiler._shapes(inputs, 0, model.cfg.max_len)
        if inputs[0].size(0) == 5:                                          # the same graph from a larger example
            example = (example[0].repeat(3, 1), example[1].repeat(3, 1), torch.arange(7) % 6)
        program = export(compiler.Source(decoder.fast), example, dynamic_shapes=dynamic)
        names.append(compiler.package_name(program, configs))
    assert names[0] == names[1] != names[2]


def test_a_packages_shared_object_is_taken_out_once_and_a_rewritten_package_gets_its_own(tmp_path, monkeypatch):
    """`unpacked`: the member is written whole beside the archive once (a later use, as another process's, reads it
    there and writes nothing), byte for byte the archive's; an archive rewritten under the same name gets a file of
    its own; where the folder cannot be written (a read-only cache), a private copy, gone after the block."""
    import os
    import zipfile

    from glassformer import paths

    archive, body = tmp_path / "packages" / "greedy-abc.pt2", b"\x7fELF" + bytes(range(256)) * 64
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("x/data/model/a.wrapper.cpp", "code")
        z.writestr("x/data/model/a.wrapper.so", body)
    with paths.unpacked(archive, ".so") as first:
        assert first.parent == archive.parent / "unpacked" and first.read_bytes() == body
    writes = []
    monkeypatch.setattr(paths, "write_whole", lambda *a, **k: writes.append(a))
    with paths.unpacked(archive, ".so") as again:
        assert again == first and writes == []                                   # there: read, not written
    monkeypatch.undo()
    with zipfile.ZipFile(archive, "w") as z:                                     # rebuilt under its name
        z.writestr("x/data/model/b.wrapper.so", b"\x7fELF two")
    os.utime(archive, ns=(1, 1))
    with paths.unpacked(archive, ".so") as second:
        assert second != first and second.read_bytes() == b"\x7fELF two" and first.read_bytes() == body
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, second.name])

    def read_only(path, write):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(paths, "write_whole", read_only)
    os.utime(archive, ns=(2, 2))
    with paths.unpacked(archive, ".so") as private:
        assert private.parent != first.parent and private.read_bytes() == b"\x7fELF two"
    assert not private.exists() and not private.parent.exists() and len(list(first.parent.iterdir())) == 2


def test_write_whole_lets_one_process_write_and_the_one_that_waited_finds_it(tmp_path):
    import subprocess
    import sys

    from glassformer.paths import write_whole

    pytest.importorskip("fcntl")
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError: sys.exit(3)")
    other = lambda: subprocess.run([sys.executable, "-c", probe, str(tmp_path / "pk")]).returncode   # noqa: E731
    target, seen = tmp_path / "pk" / "a.pt2", []

    def write(partial):
        seen.append(other())                                 # another process, while this one writes: locked out
        partial.write_text("one")
    assert write_whole(target, write) is True and seen == [3] and target.read_text() == "one"
    assert other() == 0                                      # released after
    assert write_whole(target, lambda partial: seen.append("again")) is False and seen == [3]   # there: left
    assert write_whole(target, lambda partial: partial.write_text("two"), replace=True) is True
    assert target.read_text() == "two" and sorted(p.name for p in target.parent.iterdir()) == ["a.pt2"]
