"""Whole-model properties the lesson states: equivariance, no leak, padding, per-row LN/FFN, caches."""

import math

import pytest
import torch

from glassformer.model import (
    DecoderOnlyModel,
    EncoderOnlyModel,
    FeedForward,
    ModelConfig,
    ResidualNorm,
    Transformer,
    build_model,
    sinusoidal_positions,
)
from glassformer.model.positions import RelativePositionBias, RotaryEmbedding

POSITIONS = ["sinusoidal", "learned", "relative", "rope", "none"]


def model(**kw) -> Transformer:
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=50, **kw)
    return Transformer(cfg).eval()


def batch(b=3, s=7, t=6):
    src = torch.randint(4, 40, (b, s))
    tgt = torch.randint(4, 50, (b, t))
    return src, tgt


@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_teacher_forced_equals_step_by_step_with_and_without_cache(positions, norm):
    m = model(positions=positions, norm_placement=norm)
    src, tgt = batch()
    src[1, 5:] = 0
    with torch.no_grad():
        forced = m(src, tgt)                                           # (batch, tgt, vocab)
        memory = m.encode(src)
        cache = m.new_cache()
        cached = torch.cat([m.decode_step(tgt[:, i:i + 1], memory, src == 0, cache) for i in range(6)], 1)
        recomputed = torch.stack([m(src, tgt[:, :i + 1])[:, i] for i in range(6)], 1)
    assert torch.allclose(cached, forced, atol=1e-5)
    assert torch.allclose(recomputed, forced, atol=1e-5)


@pytest.mark.parametrize("positions", POSITIONS)
def test_no_leak_through_the_causal_mask(positions):
    m = model(positions=positions)
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 3:] = torch.randint(4, 50, (3, 3))
    with torch.no_grad():
        a, b = m(src, tgt), m(src, changed)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-6)               # rows 0..2 never see 3..5
    assert not torch.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


def test_cross_attention_has_no_triangle():
    """Changing the LAST source token changes the FIRST target row: every target row reads the whole source."""
    m = model()
    src, tgt = batch()
    changed = src.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 36 + 4
    with torch.no_grad():
        a, b = m(src, tgt), m(changed, tgt)
    assert not torch.allclose(a[:, 0], b[:, 0], atol=1e-4)


@pytest.mark.parametrize("positions", POSITIONS)
def test_padding_changes_nothing_real(positions):
    m = model(positions=positions)
    src, tgt = batch(1, 5, 4)
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    with torch.no_grad():
        a = m(src, tgt)
        b = m(padded_src, tgt)
        labels = torch.randint(4, 50, (1, 4))
        padded_tgt = torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], 1)
        padded_labels = torch.cat([labels, torch.zeros(1, 2, dtype=torch.long)], 1)
        loss_a, n_a = m.loss(src, tgt, labels)
        loss_b, n_b = m.loss(padded_src, padded_tgt, padded_labels)
    assert torch.allclose(a, b, atol=1e-5)
    assert n_a == n_b == 4 and torch.allclose(loss_a, loss_b, atol=1e-5)


def test_sentence_output_independent_of_batch_mates():
    m = model()
    src, tgt = batch(3, 7, 6)
    src[0, 4:] = 0
    with torch.no_grad():
        alone = m(src[:1, :4], tgt[:1])
        together = m(src, tgt)[:1]
    assert torch.allclose(alone, together, atol=1e-5)


def test_permutation_equivariance_without_positions_and_broken_with_them():
    """Y' = P Y for a position-free encoder; with sinusoidal positions swapping tokens is not a permutation."""
    for positions, equivariant in (("none", True), ("sinusoidal", False)):
        m = model(positions=positions).double()
        src = torch.randint(4, 40, (1, 6))
        perm = torch.tensor([3, 1, 5, 0, 2, 4])
        with torch.no_grad():
            with m.probes("encoder.0.self_attention.head.0.scores") as trace_a:
                y = m.encode(src)
            with m.probes("encoder.0.self_attention.head.0.scores") as trace_b:
                y_perm = m.encode(src[:, perm])
        same = torch.allclose(y_perm, y[:, perm], atol=1e-10)
        assert same is equivariant
        s, s_perm = trace_a["encoder.0.self_attention.head.0.scores"], trace_b[
            "encoder.0.self_attention.head.0.scores"]
        assert torch.allclose(s_perm[0], s[0][perm][:, perm], atol=1e-10) is equivariant   # P S P^T


def test_layernorm_is_per_token_and_ffn_per_row():
    norm = ResidualNorm(6, 1e-5, "post", 0.0)
    ffn = FeedForward(6, 10)
    x = torch.randn(2, 5, 6)
    y = x.clone()
    y[1] = torch.randn(5, 6) * 10                                     # another sentence changes
    y[0, 3] = torch.randn(6) * 10                                     # another row changes
    keep = [0, 1, 2, 4]
    with torch.no_grad():
        for f in (lambda h: norm(h, ffn), ffn):
            assert torch.allclose(f(x)[0, keep], f(y)[0, keep], atol=1e-6)
        out = norm.layer_norm(x)
    assert torch.allclose(out.mean(-1), torch.zeros(2, 5), atol=1e-6)    # over the d features of one row
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-3)


def test_sinusoidal_table_is_the_formula():
    table = sinusoidal_positions(50, 16, dtype=torch.float64)
    for p in (0, 1, 7, 49):
        for r in range(8):
            angle = p / 10000 ** (2 * r / 16)
            assert table[p, 2 * r].item() == pytest.approx(math.sin(angle), abs=1e-12)
            assert table[p, 2 * r + 1].item() == pytest.approx(math.cos(angle), abs=1e-12)


def test_embeddings_scaled_by_sqrt_d_before_positions():
    m = model()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        x = m.src_embed(ids)
    expected = m.src_embed.token.weight[ids] * math.sqrt(32) + sinusoidal_positions(3, 32)
    assert torch.allclose(x, expected, atol=1e-6)


def test_rope_scores_depend_on_offset_only():
    rope = RotaryEmbedding(8).double()
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(i, j):
        return (rope(q, torch.tensor([i])) * rope(k, torch.tensor([j]))).sum().item()

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-10)
    assert score(0, 5) == pytest.approx(score(20, 25), abs=1e-10)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-6)
    assert torch.allclose(rope(q, torch.tensor([0])), q)                     # position 0 is no rotation


def test_relative_bias_depends_on_offset_only_and_clips():
    rel = RelativePositionBias(2, clip=3)
    b = rel(torch.arange(6), torch.arange(6))                                 # (heads, query, key)
    assert torch.equal(b[:, 4, 2], b[:, 3, 1]) and torch.equal(b[:, 1, 4], b[:, 0, 3])
    assert torch.equal(b[:, 5, 0], b[:, 4, 0])                                # offsets 5 and 4 clip to 3
    assert not torch.equal(b[:, 2, 1], b[:, 1, 2])


def test_rope_is_applied_inside_attention_not_to_embeddings():
    m = model(positions="rope")
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        x = m.src_embed(ids)
    assert torch.allclose(x, m.src_embed.token.weight[ids] * math.sqrt(32))
    assert all(layer.self_attention.rope is not None for layer in m.encoder.layers)
    assert all(layer.self_attention.rope is not None for layer in m.decoder.layers)
    assert all(not hasattr(layer.cross_attention, "rope") for layer in m.decoder.layers)   # no positions on H


def test_loss_counts_only_real_labels_and_matches_full_cross_entropy():
    m = model()
    src, tgt = batch(2, 5, 4)
    labels = torch.randint(4, 50, (2, 4))
    labels[1, 2:] = 0
    with torch.no_grad():
        total, n = m.loss(src, tgt, labels, label_smoothing=0.1)
        logits = m(src, tgt)
    keep = labels != 0
    expected = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="sum", label_smoothing=0.1)
    assert n == 6
    assert torch.allclose(total, expected, atol=1e-4)


def test_tied_target_embedding_and_output_layer():
    m = model()
    assert m.head.weight is m.tgt_embed.token.weight
    untied = model(tie_target=False)
    assert untied.head.weight is not untied.tgt_embed.token.weight


def test_base_preset_sizes():
    cfg = ModelConfig.base(src_vocab=100, tgt_vocab=100)
    assert (cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, cfg.heads, cfg.d_k, cfg.d_v, cfg.d_ff) == (
        6, 6, 512, 8, 64, 64, 2048)


def test_families_share_layers_and_differ_in_visibility():
    cfg = ModelConfig.tiny(src_vocab=30, tgt_vocab=30)
    enc = build_model(cfg.replace(family="encoder-only")).eval()
    dec = build_model(cfg.replace(family="decoder-only")).eval()
    assert isinstance(enc, EncoderOnlyModel) and isinstance(dec, DecoderOnlyModel)
    assert all(layer.cross_attention is None and len(layer.sublayer) == 2 for layer in dec.decoder.layers)
    ids = torch.randint(4, 30, (1, 6))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 26 + 4
    with torch.no_grad():
        assert not torch.allclose(enc(ids)[0, 0], enc(changed)[0, 0])       # bidirectional
        assert torch.allclose(dec(ids)[0, :-1], dec(changed)[0, :-1])       # causal
        cache = dec.new_cache()
        steps = torch.cat([dec(ids[:, i:i + 1], cache=cache) for i in range(6)], 1)
    assert torch.allclose(steps, dec(ids), atol=1e-5)


@pytest.mark.parametrize("field,value", [("d_model", 0), ("heads", -1), ("norm_placement", "middle"),
                                         ("activation", "gelu"), ("position_layout", "zigzag"), ("eos_id", 1000),
                                         ("positions", "fourier"), ("dropout", 1.5), ("family", "rnn"),
                                         ("eps", 0.0)])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig.tiny(**{field: value})


def test_config_json_round_trip_and_unknown_field():
    cfg = ModelConfig.tiny(positions="rope", norm_placement="pre")
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="colour"):
        ModelConfig.from_dict({**cfg.to_dict(), "colour": 1})


def test_too_long_and_out_of_range_inputs_raise_clearly():
    m = model()
    with pytest.raises(ValueError, match="max_len 64"):
        m.encode(torch.ones(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="out of range"):
        m.encode(torch.tensor([[1, 99]]))


def _decode_both_ways(m, src, tgt, switched_off=()):
    """Logits of every target row: teacher-forced `decode`, and one `decode_step` per row (the step path),
    with the heads named in `switched_off` zeroed by hooks."""
    off = {name: lambda value, name: torch.zeros_like(value) for name in switched_off}
    with torch.no_grad(), m.intervene(off):
        memory = m.encode(src)
        forced = m.logits(m.decode(tgt, memory, src == 0))                  # (batch, tgt, vocab)
        cache = m.new_cache()
        stepped = torch.cat([m.decode_step(tgt[:, i:i + 1], memory, src == 0, cache)
                             for i in range(tgt.size(1))], 1)
    return forced, stepped


@pytest.mark.slow
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("path", ["fast", "glass"])
def test_one_row_steps_equal_teacher_forcing_with_an_all_pad_source_and_a_head_off(positions, norm, path):
    """The one-query step path: PAD keys hidden, a source of only PAD reads zeros, a switched-off head adds
    nothing, d_k != d_v, RoPE/relative positions of the newest row, both norm placements and both paths."""
    torch.manual_seed(0)
    m = model(positions=positions, norm_placement=norm, attention_path=path, d_k=6, d_v=10)
    src, tgt = batch(b=4)
    src[1, 4:] = 0
    src[2, :] = 0                                                          # nothing to read at all
    off = ("decoder.0.cross_attention.head.1.output", "decoder.1.self_attention.head.0.output")
    forced, stepped = _decode_both_ways(m, src, tgt, off)
    assert torch.isfinite(stepped).all()
    torch.testing.assert_close(stepped, forced, atol=1e-5, rtol=1e-5)
    _, on = _decode_both_ways(m, src, tgt)
    assert not torch.allclose(on, stepped, atol=1e-4)                      # the switch did act on the steps


def test_one_row_steps_see_every_cached_row_and_only_those():
    """Changing an earlier target token changes later steps; changing a later one cannot reach earlier ones."""
    torch.manual_seed(0)
    m = model()
    src, tgt = batch()
    changed = tgt.clone()
    changed[:, 2] = (tgt[:, 2] + 1 - 4) % 46 + 4
    _, a = _decode_both_ways(m, src, tgt)
    _, b = _decode_both_ways(m, src, changed)
    torch.testing.assert_close(a[:, :2], b[:, :2], atol=0, rtol=0)
    assert (a[:, 2:] - b[:, 2:]).abs().amax(dim=-1).min() > 1e-4           # every later row moved


def test_a_step_without_the_encoder_output_is_refused_not_read_as_self_attention():
    m = model()
    src, tgt = batch()
    with torch.no_grad():
        cache = m.new_cache()
        with pytest.raises(ValueError, match="encoder output"):
            m.decode_step(tgt[:, :1], None, src == 0, cache)


def test_probe_names_are_the_documented_ones_in_forward_order():
    m = model(norm_placement="pre")
    names = m.hook_names()
    assert names[0] == "encoder.embedding" and names[-3:] == ["decoder.1.output", "decoder.output", "logits"]
    for name in ("encoder.0.self_attention.head.3.scaled_scores", "encoder.1.sublayer.1.normed",
                 "decoder.1.cross_attention.head.0.weights", "decoder.0.ffn.hidden", "decoder.1.sublayer.2.residual",
                 "decoder.0.cross_attention.concat", "decoder.1.self_attention.mask"):
        assert name in names, name
    assert not any(".layers." in n or n.startswith("layers.") for n in names)
    assert len(names) == len(set(names))
    assert names.index("decoder.0.sublayer.0.input") < names.index("decoder.0.sublayer.1.input")


def test_a_decoding_step_fires_the_same_probes_with_one_query_row():
    torch.manual_seed(0)
    m = model()
    src, tgt = batch()
    pattern = "decoder.1.cross_attention.head.2.weights"
    with torch.no_grad():
        with m.probes(pattern) as full:
            m(src, tgt)
        memory = m.encode(src)
        cache = m.new_cache()
        with m.probes(pattern, "logits") as steps:
            for i in range(tgt.size(1)):
                m.decode_step(tgt[:, i:i + 1], memory, src == 0, cache)
    rows = steps.all(pattern)
    assert len(rows) == tgt.size(1) and rows[0].shape == (3, 1, 7)
    torch.testing.assert_close(torch.cat(rows, 1), full[pattern], atol=1e-5, rtol=1e-5)
    assert len(steps.all("logits")) == tgt.size(1) and list(steps) == [pattern, "logits"]


def test_activation_patching_restores_the_clean_run_exactly():
    """Patching every value a layer's output depends on from the clean run gives the clean logits."""
    torch.manual_seed(0)
    m = model().double()
    src, tgt = batch()
    corrupt = src.clone()
    corrupt[:, 1] = (src[:, 1] + 1 - 4) % 36 + 4
    with torch.no_grad():
        with m.probes("encoder.output") as clean:
            want = m(src, tgt)
        moved = m(corrupt, tgt)
        with m.intervene({"encoder.output": lambda value, name: clean[name]}):
            patched = m(corrupt, tgt)
    assert (moved - want).abs().max() > 1e-3
    torch.testing.assert_close(patched, want, atol=1e-12, rtol=0)


def test_sinusoidal_halves_layout_is_sines_then_cosines():
    """Marian's table: channel r < d/2 is sin(p / 10000^(2r/d)), channel d/2 + r the cosine of the same angle."""
    from glassformer.model.positions import sinusoidal_positions

    n, d = 7, 10
    table = sinusoidal_positions(n, d, torch.float64, layout="halves")
    for p in range(n):
        for r in range(d // 2):
            angle = p / 10000 ** (2 * r / d)
            assert abs(table[p, r] - math.sin(angle)) < 1e-12 and abs(table[p, d // 2 + r] - math.cos(angle)) < 1e-12
    interleaved = sinusoidal_positions(n, d, torch.float64)
    assert torch.equal(interleaved[:, 0::2], table[:, : d // 2])
    assert torch.equal(interleaved[:, 1::2], table[:, d // 2:])


def test_silu_head_bias_and_shared_embeddings_switches():
    cfg = ModelConfig.tiny(src_vocab=40, tgt_vocab=40, activation="silu", head_bias=True, share_embeddings=True)
    m = Transformer(cfg)
    assert m.src_embed.token.weight is m.tgt_embed.token.weight is m.head.weight
    with torch.no_grad():
        m.head.bias.copy_(torch.arange(40.0))
        x = torch.randn(2, 3, cfg.d_model)
        ffn = m.encoder.layers[0].ffn
        want = ffn.w_2(torch.sigmoid(ffn.w_1(x)) * ffn.w_1(x))                 # SiLU written out
        assert torch.allclose(ffn(x), want, atol=1e-6)
        assert torch.allclose(m.logits(x), x @ m.head.weight.T + torch.arange(40.0), atol=1e-5)
    assert sum(p.numel() for p in m.parameters()) == parameter_count_of(cfg)


def parameter_count_of(cfg: ModelConfig) -> int:
    from glassformer.model.config import parameter_count

    return parameter_count(cfg)


@pytest.mark.parametrize("family", ["encoder-decoder", "encoder-only", "decoder-only"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "relative", "rope"])
@pytest.mark.parametrize("switches", [
    dict(),
    dict(norm_placement="pre", bias=False),
    dict(final_norm=True, head_bias=True, tie_target=False),
    dict(share_embeddings=True, tie_target=False, final_norm=False),
])
def test_parameter_count_from_the_sizes_matches_the_built_model(family, positions, switches):
    """ModelConfig's MAX_PARAMETERS check counts from the sizes alone; the built model must have exactly that
    many (uneven d_k / d_v and two stack depths, so a swapped width or layer count shows)."""
    cfg = ModelConfig(src_vocab=37, tgt_vocab=37, d_model=16, heads=2, d_k=6, d_v=3, d_ff=24, encoder_layers=2,
                      decoder_layers=3, max_len=20, relative_clip=4, family=family, positions=positions,
                      **switches)
    assert parameter_count_of(cfg) == sum(p.numel() for p in build_model(cfg).parameters())
