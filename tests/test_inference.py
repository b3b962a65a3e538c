"""glassformer.inference against the reference model/ path: same tokens, logits equal to float rounding."""

import pytest
import torch
import torch.nn.functional as F

from glassformer.inference import (
    ONEDNN,
    SERIAL_MAX_ROWS,
    PreparedLinear,
    StaticCache,
    StepDecoder,
    decoding_threads,
    training_threads,
    use_threads,
)
from glassformer.model import ModelConfig, Transformer
from glassformer.translation.search import beam_search, greedy

POSITIONS = ["sinusoidal", "learned", "relative", "rope", "none"]


def model(**kw) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.tiny(src_vocab=40, tgt_vocab=50, **kw)).eval()


def source(b=6, s=7):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (b, s), generator=g)
    src[1, 4:] = 0
    src[2, :] = 0                                                          # a source of only PAD
    return src


def stepped(decoder, m, src, tgt):
    with torch.no_grad():
        memory = m.encode(src)
        cache = decoder.new_cache()
        return torch.cat([decoder.decode_step(tgt[:, i:i + 1], memory, src == 0, cache)
                          for i in range(tgt.size(1))], 1)                  # (batch, tgt, vocab)


@pytest.mark.slow
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("onednn", [False, ONEDNN])
@pytest.mark.parametrize("rows", [1, 6])                                   # few rows: W^T; from 4: blocked W
def test_step_logits_equal_the_model_path(positions, norm, onednn, rows):
    m = model(positions=positions, norm_placement=norm, d_k=6, d_v=10)
    src = source()[:rows]
    tgt = torch.randint(4, 50, (rows, 9), generator=torch.Generator().manual_seed(2))
    want = stepped(m, m, src, tgt)
    got = stepped(StepDecoder(m, onednn=onednn), m, src, tgt)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert (want - want.mean()).abs().max() > 1e-2                          # the logits are not trivially equal


@pytest.mark.slow
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_greedy_and_beam_tokens_are_identical(positions, norm):
    m = model(positions=positions, norm_placement=norm)
    src = source()
    decoder = StepDecoder(m)
    assert greedy(decoder, src, max_len=12) == greedy(m, src, max_len=12)
    assert beam_search(decoder, src, beam=3, max_len=12) == beam_search(m, src, beam=3, max_len=12)
    assert greedy(decoder, src[:1], max_len=12) == greedy(m, src[:1], max_len=12)


def test_a_source_of_only_pad_reads_zeros_from_cross_attention():
    m = model()
    src = source()
    decoder = StepDecoder(m)
    calls = []
    with torch.no_grad():
        memory = m.encode(src)
        cache = decoder.new_cache()
        original = decoder._cross_attention
        decoder._cross_attention = lambda *a: calls.append((out := original(*a)).clone()) or out  # summed in place
        decoder.decode_step(torch.ones(6, 1, dtype=torch.long), memory, src == 0, cache)
    bias = m.decoder.layers[0].cross_attention.w_o.bias
    assert torch.allclose(calls[0][2], bias) and not torch.allclose(calls[0][0], bias)


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (16, 16)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("onednn", [False, ONEDNN])
def test_prepared_linear_equals_f_linear(shape, rows, onednn):
    w, b, x = torch.randn(*shape), torch.randn(shape[0]), torch.randn(rows, shape[1])
    for bias in (b, None):
        torch.testing.assert_close(PreparedLinear(w, bias, onednn)(x), F.linear(x, w, bias), atol=1e-5, rtol=1e-5)
    assert (PreparedLinear(w, b, onednn).wt is None) == (shape[0] < shape[1])   # W^T only for wide W


def test_static_cache_reorders_only_the_written_rows():
    cache = StaticCache(n_layers=1, capacity=8)
    like = torch.zeros(1)
    cache.allocate(3, 2, 4, 4, like)
    for step in range(2):
        row = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 2, 1, 4) + 10 * step
        cache.append(0, row, row)
        cache.length += 1
    cache.reorder(torch.tensor([2, 2, 0]))                                  # beams: same batch
    k, _ = cache.append(0, torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4))
    assert k[:, 0, :, 0].tolist() == [[2.0, 12.0, 0.0], [2.0, 12.0, 0.0], [0.0, 10.0, 0.0]]
    cache.reorder(torch.tensor([1]))                                        # a sentence left: new batch
    assert cache.k[0].shape == (1, 2, 8, 4) and cache.k[0][0, 0, :2, 0].tolist() == [2.0, 12.0]


def test_static_cache_grows_past_its_capacity():
    m = model(positions="rope")
    src, tgt = source()[:2], torch.randint(4, 50, (2, 5))
    decoder = StepDecoder(m)
    decoder.new_cache = lambda: StaticCache(len(decoder.layers), 2)         # smaller than the target
    torch.testing.assert_close(stepped(decoder, m, src, tgt), stepped(m, m, src, tgt), atol=2e-5, rtol=1e-5)


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
    assert not re.search(r"mkldnn|set_num_threads", text)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_encoder_on_prepared_weights_equals_the_model_encoder(norm):
    m = model(norm_placement=norm, positions="relative")
    src = source()
    with torch.no_grad():
        torch.testing.assert_close(StepDecoder(m).encode(src), m.encode(src), atol=1e-5, rtol=1e-5)
        assert m.encoder.layers[0].self_attention.w_q.weight.requires_grad   # the model itself is untouched
