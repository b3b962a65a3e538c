"""The benchmarks compare like with like, their arithmetic is right, and the speed-ups keep the numbers."""


import pytest
import torch
from benchmarks import run, stats
from benchmarks.systems import Glassformer, Marian, TorchTransformer, make_system
from benchmarks.work import (
    BOS,
    EOS,
    PAD,
    SPEC,
    Spec,
    bucketed_batches,
    fixed_size_batches,
    random_pairs,
    training_batches,
)

from glassformer.model import ModelConfig, Transformer

TINY = Spec(vocab=60, d_model=16, heads=2, d_ff=32, layers=2, dropout=0.0, max_len=64)


# ---- the same work for every system ------------------------------------------------------------------------
def trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_parameter_counts_match():
    pytest.importorskip("transformers")
    ours, marian = trainable(Glassformer.build(SPEC)), trainable(Marian.build(SPEC))
    theirs = trainable(TorchTransformer.build(SPEC))
    d, v = SPEC.d_model, SPEC.vocab
    # 2 embeddings (the target one tied to the output layer) + 3 encoder and 3 decoder layers, by hand:
    attention, ffn, norm = 4 * (d * d + d), 2 * d * SPEC.d_ff + SPEC.d_ff + d, 2 * d
    expected = 2 * v * d + 3 * (attention + ffn + 2 * norm) + 3 * (2 * attention + ffn + 3 * norm)
    assert ours == marian == expected == 9_625_600
    assert theirs - ours == 2 * norm                       # nn.Transformer's final LayerNorm on each stack


def test_identical_padded_batches_lengths_4_to_14():
    a, b = training_batches(3), training_batches(3)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.src, y.src) and torch.equal(x.labels, y.labels)
    for batch in a:
        assert batch.src.shape[0] == batch.tgt_in.shape[0] == 64 and batch.tgt_in.shape == batch.labels.shape
        src_len = (batch.src != PAD).sum(1)
        tgt_len = (batch.labels != PAD).sum(1) - 1                       # labels = target + EOS
        assert int(src_len.min()) >= 4 and int(src_len.max()) <= 14
        assert int(tgt_len.min()) >= 4 and int(tgt_len.max()) <= 14
        assert torch.all(batch.tgt_in[:, 0] == BOS)
        assert torch.all(batch.labels.gather(1, tgt_len[:, None]) == EOS)
        inner = batch.labels[:, :-1] != PAD                              # teacher forcing: shifted by one
        assert torch.equal(batch.tgt_in[:, 1:][inner & (batch.labels[:, :-1] != EOS)],
                           batch.labels[:, :-1][inner & (batch.labels[:, :-1] != EOS)])


@pytest.mark.slow
def test_every_system_counts_the_same_target_tokens():
    pytest.importorskip("transformers")
    batch = training_batches(1)[0]
    prepared = Marian.prepare(None, batch)
    assert int((prepared["labels"] != -100).sum()) == batch.n_tokens
    assert torch.equal(prepared["attention_mask"].bool(), batch.src != PAD)
    model = Transformer(ModelConfig.tiny(src_vocab=SPEC.vocab, tgt_vocab=SPEC.vocab))
    assert model.loss(batch.src, batch.tgt_in, batch.labels)[1] == batch.n_tokens


def test_corpus_batchings_hold_each_pair_once():
    pairs = random_pairs(300, seed=3, lengths=(1, 30))
    fixed = fixed_size_batches(pairs, 64, seed=0)
    bucketed = bucketed_batches(pairs, max_tokens=64 * 16, seed=0)

    def rows(batches):
        return sorted(tuple(int(i) for i in row[row != PAD]) for b in batches for row in b.src)

    expected = sorted(tuple(s) for s, _ in pairs)
    assert rows(fixed) == expected and rows(bucketed) == expected
    assert sum(b.n_tokens for b in fixed) == sum(b.n_tokens for b in bucketed)
    padded = [sum(b.src.numel() + b.tgt_in.numel() for b in x) for x in (fixed, bucketed)]
    assert padded[1] < 0.8 * padded[0]                                   # buckets waste less on PAD


@pytest.mark.slow
@pytest.mark.parametrize("name", ["glassformer", "torch"])
def test_greedy_tokens_are_the_argmax_of_a_full_recomputation(name):
    system = make_system(name, TINY, seed=1)
    src = torch.randint(4, TINY.vocab, (3, 5))
    src[2, 3:] = PAD
    out = system.greedy(src, 6)                                          # (3, 6)
    model = system.fresh
    ys = torch.cat([torch.full((3, 1), BOS), out], dim=1)[:, :-1]      # the prefixes the steps saw
    with torch.no_grad():                                                # all rows at once, no cache
        hidden = model.decode(ys, model.encode(src, src == PAD), src == PAD)
        logits = model.logits(hidden) if name == "glassformer" else model.generator(hidden)
    assert torch.equal(logits.argmax(-1), out)


@pytest.mark.slow
def test_beam_loop_of_width_one_is_greedy():
    system = make_system("torch", TINY, seed=2)
    src = torch.randint(4, TINY.vocab, (2, 5))
    greedy = system.greedy(src, 5)
    greedy_no_eos = system.beam(src, 5, 1)
    if not (greedy == EOS).any():                                        # the beam loop forbids EOS
        assert torch.equal(greedy, greedy_no_eos)


# ---- the harness's arithmetic ------------------------------------------------------------------------------
def test_median_and_summary():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert stats.summary([2.0, 8.0, 5.0]) == {"median": 5.0, "min": 2.0, "max": 8.0, "n": 3}
    with pytest.raises(ValueError):
        stats.median([])


def test_ratios_are_taken_round_by_round():
    ours, theirs = [10.0, 20.0, 30.0], [5.0, 20.0, 10.0]                  # rates: higher is better
    assert stats.paired_ratios(ours, theirs) == [2.0, 1.0, 3.0]
    assert stats.speedup(ours, theirs)["median"] == 2.0                  # not median(ours) / median(theirs)
    times_ours, times_theirs = [1.0, 2.0], [4.0, 3.0]                    # ms/step: lower is better
    assert stats.speedup(times_ours, times_theirs, higher_is_better=False) == {
        "median": 2.75, "min": 1.5, "max": 4.0, "n": 2}
    with pytest.raises(ValueError, match="rounds"):
        stats.paired_ratios([1.0], [1.0, 2.0])


def test_table_reports_speedups_per_case():
    case = run.Case("train", "t", "tok/s", [], [("glassformer", "marian")], 2, 0,
                    samples={"glassformer": [300.0, 200.0], "marian": [100.0, 100.0]})
    step = run.Case("step-16", "s", "ms/step", [], [("glassformer (cache)", "marian (cache)")], 2, 0,
                    samples={"glassformer (cache)": [1.0, 1.0], "marian (cache)": [3.0, 5.0]})
    machine = {"cpu": "x", "cores": 2, "threads": 2, "torch": "t", "transformers": "h", "python": "p",
               "command": "c", "date": "d", "load_average_start": [0.0], "load_average_end": [0.0]}
    text = run.markdown([case, step], [], machine, {"glassformer": 1})
    assert "| train | glassformer vs marian | 2.50x | 2.00x | 3.00x | 2 |" in text
    assert "| step-16 | glassformer (cache) vs marian (cache) | 4.00x | 3.00x | 5.00x | 2 |" in text


def test_bad_arguments_exit_2(capsys):
    assert run.main(["--systems", "glassformer,nope"]) == 2
    assert run.main(["--systems", "glassformer,torch", "--rounds", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "nope" in err[0] and "--rounds" in err[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_script_refuses_without_cuda(capsys):
    from benchmarks import gpu

    assert gpu.main([]) == 2
    assert "CUDA" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_flops_count_is_six_per_weight_per_token_plus_attention():
    from benchmarks.gpu import device_peak, training_flops

    cfg = ModelConfig.base(src_vocab=32000, tgt_vocab=32000)
    d = cfg.d_model
    weights = sum(p.numel() for n, p in Transformer(cfg).named_parameters()
                  if "norm" not in n and "embed" not in n) + d * 32000   # layers + the tied head
    attention = 3 * 4 * d * 6 * (10 * 10 + 10 * 10 + 10 * 10)
    assert training_flops(cfg, [10], [10]) == pytest.approx(6 * weights * 10 + attention, rel=1e-3)
    assert device_peak("NVIDIA H200") == 989e12 and device_peak("NVIDIA L40S") == 362e12
    assert device_peak("Some Future GPU") is None


# ---- the speed-ups keep the numbers ------------------------------------------------------------------------
def test_loss_on_the_glass_path_equals_the_fast_path():
    model = Transformer(ModelConfig.tiny(src_vocab=30, tgt_vocab=30)).double()
    src, tgt = torch.randint(4, 30, (3, 5)), torch.randint(4, 30, (3, 4))
    src[0, 3:], tgt[1, 2:] = PAD, PAD
    fast = model.loss(src, tgt, tgt)[0]
    for module in model.modules():
        if hasattr(module, "path"):
            module.path = "glass"
    assert torch.allclose(model.loss(src, tgt, tgt)[0], fast, atol=1e-12)


def test_the_products_bench_counts_the_products_one_greedy_step_runs():
    from benchmarks.products import step_products
    model = Transformer(ModelConfig(src_vocab=300, tgt_vocab=500, d_model=64, heads=2, d_k=16, d_v=24, d_ff=256,
                                    encoder_layers=1, decoder_layers=3))
    # per layer: W^Q|W^K|W^V 64 -> 2*(16+16+24) = 112; W^O and cross W^O 48 -> 64; cross W^Q 64 -> 32; W_1, W_2;
    # cross-attention's W^K, W^V (64 -> 32, 64 -> 48) are the source side's, not a step's; one head 64 -> 500
    assert step_products(model) == {(64, 112): 3, (48, 64): 6, (64, 32): 3, (64, 256): 3, (256, 64): 3, (64, 500): 1}
