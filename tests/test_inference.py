"""glassformer.inference.prepare against the model itself: same tokens, logits equal to float rounding."""

import pytest
import torch
import torch.nn.functional as F

from glassformer.inference import (
    ONEDNN,
    SERIAL_MAX_ROWS,
    PreparedLinear,
    decoding_threads,
    prepare,
    training_threads,
    use_threads,
)
from glassformer.model import KVCache, ModelConfig, Transformer, probes
from glassformer.model.cache import GROW

POSITIONS = ["sinusoidal", "learned", "relative", "rope", "none"]
EOS = 2


def model(**kw) -> Transformer:
    """A tiny model whose LayerNorms each have their own random gain and bias (fresh ones are all 1 and 0,
    so a copy that mixed up its sub-layers' norms would still agree with the model)."""
    torch.manual_seed(0)
    m = Transformer(ModelConfig.tiny(src_vocab=40, tgt_vocab=50, **kw)).eval()
    with torch.no_grad():
        for norm in (n for n in m.modules() if isinstance(n, torch.nn.LayerNorm)):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(std=0.3)
    return m


def source(b=6, s=7):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (b, s), generator=g)
    src[1, 4:] = 0
    src[2, :] = 0                                                          # a source of only PAD
    return src


def stepped(decoder, src, tgt, cache=None):
    """Teacher-forced, one decode_step per target row: (batch, tgt, vocab)."""
    with torch.no_grad():
        memory = decoder.encode(src)
        cache = decoder.new_cache() if cache is None else cache
        return torch.cat([decoder.decode_step(tgt[:, i:i + 1], memory, src == 0, cache)
                          for i in range(tgt.size(1))], 1)


def argmax_walk(decoder, src, steps, eos=EOS):
    """Greedy by hand: every row starts from BOS; a row that emits `eos` leaves the batch (cache.reorder
    with a shorter index). Returns each row's tokens, EOS included."""
    out = [[] for _ in range(src.size(0))]
    alive = torch.arange(src.size(0))
    with torch.no_grad():
        memory, src_pad = decoder.encode(src), src == 0
        cache = decoder.new_cache()
        tokens = torch.full((src.size(0), 1), 1)
        for _ in range(steps):
            nxt = decoder.decode_step(tokens, memory, src_pad, cache)[:, -1].argmax(-1)   # (alive,)
            for row, t in zip(alive.tolist(), nxt.tolist(), strict=True):
                out[row].append(t)
            keep = (nxt != eos).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if keep.numel() < alive.numel():
                cache.reorder(keep)
                alive, memory, src_pad, nxt = alive[keep], memory[keep], src_pad[keep], nxt[keep]
            tokens = nxt[:, None]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("onednn", [False, ONEDNN])
@pytest.mark.parametrize("rows", [1, 6])                                   # few rows: W^T; from 4: blocked W
def test_prepared_logits_equal_the_model(positions, norm, onednn, rows):
    m = model(positions=positions, norm_placement=norm, d_k=6, d_v=10)
    src = source()[:rows]
    tgt = torch.randint(4, 50, (rows, 9), generator=torch.Generator().manual_seed(2))
    want = stepped(m, src, tgt)
    got = stepped(prepare(m, onednn=onednn), src, tgt)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert (want - want.mean()).abs().max() > 1e-2                          # the logits are not trivially equal
    with torch.no_grad():                                                   # teacher forcing, too
        torch.testing.assert_close(prepare(m, onednn=onednn)(src, tgt), m(src, tgt), atol=2e-5, rtol=1e-5)


# an EOS bias under which greedy rows of `source()` finish at different steps (checked below)
EOS_BIAS = {("sinusoidal", "post"): 2.5, ("sinusoidal", "pre"): 3.0, ("relative", "post"): 3.0,
            ("relative", "pre"): 2.0}


@pytest.mark.parametrize("positions,norm", sorted(EOS_BIAS))
def test_greedy_tokens_are_identical_with_rows_leaving(positions, norm):
    m = model(positions=positions, norm_placement=norm, tie_target=False, head_bias=True)
    with torch.no_grad():
        m.head.bias[EOS] = EOS_BIAS[positions, norm]
    src = source()
    want = argmax_walk(m, src, 12)
    assert want == argmax_walk(prepare(m), src, 12)
    assert want == argmax_walk(prepare(m, onednn=False), src, 12)
    ends = {len(row) for row in want if row[-1] == EOS}
    assert len(ends) >= 2                                                   # rows finished at different steps
    for i in range(src.size(0)):                                            # and each as it decodes alone
        assert argmax_walk(prepare(m), src[i:i + 1], 12)[0] == want[i]


@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "rope"])
def test_beam_like_reordering_keeps_the_parents_rows(positions):
    """Each step keeps rows `parents` (repeats, swaps, fewer rows): logits equal a fresh teacher-forced run
    of each kept row's own history."""
    m = model(positions=positions)
    src = source()[[0, 0, 1, 1]]
    g = torch.Generator().manual_seed(3)
    for decoder in (m, prepare(m)):
        history = torch.full((4, 1), 1)
        with torch.no_grad():
            memory, src_pad = decoder.encode(src), src == 0
            cache, rows = decoder.new_cache(), torch.arange(4)
            for step in range(5):
                logits = decoder.decode_step(history[:, -1:], memory, src_pad, cache)[:, -1]
                want = m(src[rows], history)[:, -1]
                torch.testing.assert_close(logits, want, atol=2e-5, rtol=1e-5)
                parents = torch.randint(0, len(rows), (len(rows) - (step == 2),), generator=g)
                cache.reorder(parents)
                rows, memory, src_pad = rows[parents], memory[parents], src_pad[parents]
                history = torch.cat([history[parents], logits[parents].argmax(-1, keepdim=True)], 1)


def test_kv_cache_reorder_keeps_the_right_rows_and_drops_the_others():
    mha = torch.nn.Module()                                                 # any module names its buffers
    cache = KVCache(capacity=8)
    for step in range(2):
        row = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 1, 4) + 10 * step
        cache.update(mha, row, row)
        cache.advance(1)
    cache.reorder(torch.tensor([2, 2, 0]))                                  # beams: same batch
    k, _, visible = cache.update(mha, torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4))
    assert k.shape == (3, 2, 8, 4)                                          # the whole static buffer
    assert k[:, 0, :3, 0].tolist() == [[2.0, 12.0, 0.0], [2.0, 12.0, 0.0], [0.0, 10.0, 0.0]]
    assert visible.tolist() == [[True] * 3 + [False] * 5]                   # the new row sees positions 0..2
    cache.advance(1)
    cache.reorder(torch.tensor([2]))                                        # two sentences left the batch
    assert cache.k[mha].shape == (1, 2, 8, 4) and cache.k[mha][0, 0, :3, 0].tolist() == [0.0, 10.0, 0.0]


def test_kv_cache_reorder_with_the_same_source_moves_self_rows_and_keeps_cross_rows():
    mha, cross = torch.nn.Module(), torch.nn.Module()
    cache = KVCache(capacity=4)
    row = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 1, 1, 2)
    cache.update(mha, row, row)
    cache.advance(1)
    kv = (torch.arange(4.0).view(4, 1, 1, 1).expand(4, 1, 3, 2),) * 2
    cache.cross[cross] = kv
    cache.reorder(torch.tensor([1, 1, 3, 2]), same_source=True)              # beams within their sentences
    assert cache.k[mha][:, 0, 0, 0].tolist() == [1.0, 1.0, 3.0, 2.0]
    assert cache.cross[cross] is kv                                          # untouched, not copied
    cache.reorder(torch.tensor([3, 2]))                                      # a sentence left: cross follows
    assert cache.cross[cross][0][:, 0, 0, 0].tolist() == [3.0, 2.0]
    assert cache.k[mha][:, 0, 0, 0].tolist() == [2.0, 3.0]


def test_kv_cache_grows_past_its_capacity():
    m = model(positions="rope")
    src, tgt = source()[:2], torch.randint(4, 50, (2, 5))
    want = stepped(m, src, tgt)
    cache = m.new_cache(capacity=2)                                         # smaller than the target
    torch.testing.assert_close(stepped(prepare(m), src, tgt, cache=cache), want, atol=2e-5, rtol=1e-5)
    assert cache.length == 5 and all(t.size(2) == 2 + GROW for t in cache.k.values())   # grown once, by GROW


def test_a_source_of_only_pad_reads_zeros_from_cross_attention():
    fast = prepare(model())
    seen = []

    class Recorder(torch.nn.Module):                                       # the copy fires no module hooks
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            seen.append(x.clone())
            return self.inner(x)

    attention = fast.decoder.layers[0].cross_attention
    attention.w_o = Recorder(attention.w_o)
    src = source()
    with torch.no_grad():
        fast.decode_step(torch.ones(6, 1, dtype=torch.long), fast.encode(src), src == 0, fast.new_cache())
    concat = seen[0][:, 0]                                                  # (batch, H*d_v) before W^O
    assert torch.all(concat[2] == 0) and concat[0].abs().max() > 0


def test_prepare_fires_no_hooks_and_leaves_the_model_alone():
    m = model(attention_path="glass")
    src, tgt = source(), torch.randint(4, 50, (6, 4))
    with probes(m, "*") as rec:                                             # attached while preparing
        fast = prepare(m)
        with torch.no_grad():
            fast(src, tgt)
    assert len(rec) == 0 and fast.hook_names() == []
    with pytest.raises(KeyError, match="head.0.weights"):
        with fast.intervene({"decoder.0.self_attention.head.0.weights": lambda v, n: v}):
            pass
    assert m.encoder.layers[0].self_attention.w_q.weight.requires_grad     # the model itself is untouched
    assert m.encoder.layers[0].self_attention.path == "glass" and m.hook_names()
    assert not any(p.requires_grad for p in fast.parameters())


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (16, 16)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("onednn", [False, ONEDNN])
def test_prepared_linear_equals_f_linear(shape, rows, onednn):
    w, b, x = torch.randn(*shape), torch.randn(shape[0]), torch.randn(rows, shape[1])
    for bias in (b, None):
        torch.testing.assert_close(PreparedLinear(w, bias, onednn)(x), F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    assert (PreparedLinear(w, b, onednn).wt is None) == (shape[0] < shape[1])   # W^T only for wide W
    transposed = PreparedLinear(w, b, onednn, transposed=True)                 # W^T for every W
    assert transposed.wt.shape == shape[::-1] and transposed.wt.is_contiguous()
    torch.testing.assert_close(transposed(x), F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_thread_policy():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert decoding_threads(1) == 1 and decoding_threads(SERIAL_MAX_ROWS) == 1
        assert decoding_threads(SERIAL_MAX_ROWS + 1) == 2                  # never above the entry point's count
        assert training_threads(world=1, requested=3) == 3
        assert training_threads(world=10 ** 6) == 1
        with use_threads(1):
            assert torch.get_num_threads() == 1
            with pytest.raises(RuntimeError):
                with use_threads(2):
                    raise RuntimeError("inside")
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_model_package_holds_no_speed_tricks():
    import pathlib
    import re

    import glassformer.model as package
    text = "\n".join(p.read_text() for p in pathlib.Path(package.__file__).parent.glob("*.py"))
    assert not re.search(r"mkldnn|set_num_threads|PreparedLinear", text)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_on_prepared_weights_equals_the_model_encoder(norm):
    m = model(norm_placement=norm, positions="relative")
    src = source()
    with torch.no_grad():
        torch.testing.assert_close(prepare(m).encode(src), m.encode(src), atol=1e-5, rtol=1e-5)


def test_one_decoder_the_models_own():
    """Nothing outside model/ computes attention, LayerNorm, softmax, the FFN or the residual; one KV cache
    class; no thread count, warnings filter or environment write in the decoding and speed layers (the
    command's start sets them: decoding/commands.py; inductor's folder: compiler.use_compile_cache)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "src" / "glassformer"
    files = {p: p.read_text() for folder in ("inference", "decoding") for p in (root / folder).glob("*.py")}
    model_ops = re.compile(r"softmax\(|layer_norm\(|LayerNorm\(|scaled_dot_product_attention\(|\.relu\(|silu\(|"
                           r"sqrt\(|masked_fill\(|def _residual|def _attend|@ *k\.transpose")
    assert {p.name: model_ops.findall(t) for p, t in files.items() if model_ops.search(t)} == {}
    caches = [m for t in [*files.values(), *(p.read_text() for p in (root / "model").glob("*.py"))]
              for m in re.findall(r"class (\w*Cache\w*)", t)]
    assert caches == ["KVCache"]
    switches = re.compile(r"set_num_threads\(|warnings\.(filterwarnings|simplefilter|catch_warnings)|os\.environ\[")
    found = {p.name for p, t in files.items() if switches.search(t.replace('os.environ["CXX"]', ""))}
    assert found == {"commands.py", "compiler.py", "workers.py"}  # entry points' helpers (glassformer/threads.py)
    assert [line.strip() for line in files[root / "decoding" / "workers.py"].splitlines()   # a worker's start
            if switches.search(line)] == ["torch.set_num_threads(1)"]
    assert [line.strip() for line in files[root / "inference" / "compiler.py"].splitlines()
            if switches.search(line) and "CXX" not in line] == ["os.environ[CACHE_ENV] = str(path)"]
    assert sum(len(t.splitlines()) for p, t in files.items() if p.parent.name == "inference") <= 700
