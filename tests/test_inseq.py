"""glassformer's attribution scores against inseq's (docs/inseq.md), on a small trained run exported to transformers.

Same sentence, same teacher-forced target, same function f = log p(y_t) (inseq's "probability" with
logprob=True), same embeddings e = token × √d at both stacks' inputs, same baseline (e' = 0 on Marian's
inputs_embeds = glassformer's position-only baseline) and the same Gauss–Legendre nodes: saliency and
integrated gradients agree score by score; input × gradient differs by exactly Σ_d position · ∂f/∂e (inseq's
inputs_embeds hold no position vector); a wrong setting (steps, inseq's own baseline, its text input) does not
agree. The inseq adapter is benchmarks/attribution.py's, the one the throughput benchmark runs.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

inseq = pytest.importorskip("inseq")
transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow,   # trains a small run in the test
              pytest.mark.filterwarnings("ignore:.*did not already require gradients")]   # captum, every call

from benchmarks.attribution import (  # noqa: E402
    glassformer_scores,
    inseq_default_baseline,
    inseq_scores,
    load_inseq,
    pair_tokenizer,
)
from torch.nn.utils.rnn import pad_sequence  # noqa: E402

from glassformer.data.checkpoint import load_translator_parts, save_run_files, save_weights  # noqa: E402
from glassformer.data.tokenize import BOS, EOS, PAD, SourceTokenizer, TargetTokenizer  # noqa: E402
from glassformer.interop.export import export  # noqa: E402
from glassformer.interpret import integrated  # noqa: E402
from glassformer.model import ModelConfig, Transformer  # noqa: E402
from glassformer.training.prepare_data import with_characters  # noqa: E402

LESSON, TARGET = "我昨天给了他一本书。", "I gave him a book yesterday."

# Agreement: every score within RTOL of itself plus ATOL of its row's largest score (docs/inseq.md). Both sides
# are float32 models; inseq returns float32 scores. Measured: at most ~1e-6 of the row's largest score.
RTOL, ATOL = 1e-4, 1e-5
BROKEN = 100                    # a wrong setting must miss the tolerance by at least this factor somewhere


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A tiny model trained for 60 steps on 96 HSK pairs (a few seconds), saved as a run folder."""
    from glassformer.data.corpus import load_corpus

    corpus = load_corpus()
    pairs = corpus.train[:96]
    every = corpus.train + corpus.dev + corpus.test
    source = with_characters(SourceTokenizer.train([p.zh_units for p in pairs]), [list(p.zh) for p in every])
    target = TargetTokenizer.train([p.en for p in pairs], 300)
    cfg = ModelConfig.tiny(src_vocab=source.vocab_size, tgt_vocab=target.vocab_size)
    with torch.random.fork_rng(devices=[]):
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
    out = tmp_path_factory.mktemp("runs") / "tiny"
    save_run_files(out, cfg, {}, source, target)
    save_weights(model.eval(), out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def setup(run_dir, tmp_path_factory):
    model, source, target, _ = load_translator_parts(run_dir)
    folder = tmp_path_factory.mktemp("export") / "hf"
    export(run_dir, "transformers", folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.MarianMTModel.from_pretrained(folder).eval()
    tokenizer = pair_tokenizer(folder)
    wrapped = {m: load_inseq(hf, m, tokenizer) for m in ("saliency", "input_x_gradient", "integrated_gradients")}
    from glassformer.data.corpus import load_corpus

    dev = load_corpus().dev[0]
    sentences = [(source.encode(zh), [BOS, *target.encode(en), EOS]) for zh, en in [(LESSON, TARGET), (dev.zh, dev.en)]]
    return SimpleNamespace(model=model.eval(), source=source, target=target, hf=hf, tokenizer=tokenizer,
                           wrapped=wrapped, sentences=sentences)


def excess(ours_source, ours_prefix, source, prefix) -> float:
    """max |ours − theirs| / (RTOL·|theirs| + ATOL·the row's largest |theirs|): ≤ 1 is agreement."""
    a, b = torch.cat([ours_source, ours_prefix], 1), torch.cat([source, prefix], 1)
    scale = b.abs().amax(1, keepdim=True)
    return float(((a - b).abs() / (RTOL * b.abs() + ATOL * scale)).max().detach())


def _ig(s, src, tgt, steps, **kw):
    return inseq_scores(s.wrapped["integrated_gradients"], s.hf, src, tgt, steps=steps, **kw)


# ---- the same inputs and the same function ----------------------------------------------------------------

def test_the_pair_tokenizer_encodes_both_sides_as_glassformer(setup):
    s = setup
    assert s.tokenizer(text=LESSON)["input_ids"] == s.source.encode(LESSON)
    assert s.tokenizer(text_target=TARGET)["input_ids"] == s.target.encode(TARGET)
    assert s.tokenizer(text=LESSON)["input_ids"] == s.source.encode(LESSON)            # back in source mode
    encoded = s.wrapped["saliency"].encode(TARGET, as_targets=True).input_ids[0].tolist()
    assert encoded == [BOS, *s.target.encode(TARGET)]                                 # decoder start, no EOS


@pytest.mark.parametrize("k", [0, 1])
def test_inseq_attributes_log_p_of_glassformers_own_model(setup, k):
    s = setup
    src, tgt = s.sentences[k]
    ours = glassformer_scores(s.model, src, tgt, "saliency")
    *_, seq = inseq_scores(s.wrapped["saliency"], s.hf, src, tgt)
    theirs = seq.step_scores["probability"].double().log()                           # step t = our row t − 1
    assert theirs.shape == ours.value.shape
    assert float((theirs - ours.value).abs().max()) < 1e-5
    with torch.no_grad():
        logp = torch.log_softmax(s.model(torch.tensor([src]), torch.tensor([tgt[:-1]]))[0].double(), -1)
    assert torch.allclose(ours.value, logp[torch.arange(len(tgt) - 1), tgt[1:]], atol=1e-10)


def test_inseq_fed_text_attributes_another_function(setup):
    """Why inseq_batch and load_inseq exist: inseq's own path computes another log p on this export."""
    s = setup
    src, tgt = s.sentences[0]
    ours = glassformer_scores(s.model, src, tgt, "saliency").value
    decoder, encoder = s.hf.model.decoder, s.hf.model.encoder
    decoder.embed_scale = encoder.embed_scale                       # transformers 5 scales decoder_inputs_embeds
    try:
        *_, seq = inseq_scores(s.wrapped["saliency"], s.hf, src, tgt)
    finally:
        decoder.embed_scale = 1.0
    assert float((seq.step_scores["probability"].double().log() - ours).abs().max()) > 0.1
    out = s.wrapped["saliency"].attribute(LESSON, TARGET, attribute_target=True, show_progress=False,
                                          pretty_progress=False, attributed_fn="probability",
                                          attributed_fn_args={"logprob": True}, step_scores=["probability"])
    text = out.sequence_attributions[0].step_scores["probability"].double().log()
    assert len(text) == len(tgt) - 2                                # no EOS row: the target text has no EOS
    assert float((text - ours[: len(text)]).abs().max()) > 0.1      # the target embedded with the source matrix


# ---- the scores ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1])
def test_saliency_agrees(setup, k):
    s = setup
    src, tgt = s.sentences[k]
    ours = glassformer_scores(s.model, src, tgt, "saliency")
    source, prefix, _ = inseq_scores(s.wrapped["saliency"], s.hf, src, tgt)
    assert excess(ours.source, ours.prefix, source, prefix) <= 1


@pytest.mark.parametrize("k", [0, 1])
def test_input_x_gradient_differs_by_the_position_term_exactly(setup, k):
    """glassformer: Σ_d (token·√d + position)·∂f/∂e; inseq: Σ_d (token·√d)·∂f/∂e, its inputs_embeds hold no position."""
    s = setup
    src, tgt = s.sentences[k]
    ours = glassformer_scores(s.model, src, tgt, "input-x-gradient")
    source, prefix, _ = inseq_scores(s.wrapped["input_x_gradient"], s.hf, src, tgt)
    assert excess(ours.source, ours.prefix, source, prefix) > BROKEN               # not the same quantity
    *_, grad = inseq_scores(s.wrapped["saliency"], s.hf, src, tgt, abs=False)      # raw ∂f/∂e per dimension
    pos_src = s.hf.model.encoder.embed_positions.weight[: len(src)].double()       # Marian's own table (halves)
    pos_tgt = s.hf.model.decoder.embed_positions.weight[: len(tgt) - 1].double()
    g_src = grad.source_attributions.double()                                      # (src, rows, d)
    g_tgt = torch.nan_to_num(grad.target_attributions.double())[: len(tgt) - 1]    # (tgt_in, rows, d)
    assert (g_src < 0).any()                                                       # signed: not |∂f/∂e|
    source = source + (g_src * pos_src[:, None]).sum(-1).T
    prefix = prefix + (g_tgt * pos_tgt[:, None]).sum(-1).T
    assert excess(ours.source, ours.prefix, source, prefix) <= 1


@pytest.mark.parametrize("steps", [8, 16])
@pytest.mark.parametrize("k", [0, 1])
def test_integrated_gradients_agree_at_the_same_gauss_legendre_nodes(setup, k, steps):
    s = setup
    src, tgt = s.sentences[k]
    ours = glassformer_scores(s.model, src, tgt, "integrated-gradients", steps, "gauss-legendre")
    source, prefix, _ = _ig(s, src, tgt, steps)
    assert excess(ours.source, ours.prefix, source, prefix) <= 1


def test_the_trapezoid_is_captums_riemann_trapezoid_rescaled(setup):
    """Our trapezoid at n steps = riemann_trapezoid at n + 1 points × (n + 1)/n (captum weighs them 1/(n + 1))."""
    s = setup
    src, tgt = s.sentences[0]
    ours = glassformer_scores(s.model, src, tgt, "integrated-gradients", 8, "trapezoid")
    source, prefix, _ = _ig(s, src, tgt, 9, method="riemann_trapezoid")
    assert excess(ours.source, ours.prefix, 9 / 8 * source, 9 / 8 * prefix) <= 1
    assert excess(ours.source, ours.prefix, source, prefix) > BROKEN


# ---- a wrong setting breaks the agreement -------------------------------------------------------------------

def test_other_steps_or_inseqs_own_baseline_do_not_agree(setup):
    s = setup
    src, tgt = s.sentences[0]
    ours = glassformer_scores(s.model, src, tgt, "integrated-gradients", 8, "gauss-legendre")
    source, prefix, _ = _ig(s, src, tgt, 9)                                       # one node more
    assert excess(ours.source, ours.prefix, source, prefix) > BROKEN
    unk = s.tokenizer.unk_token_id
    b_src, b_tgt = inseq_default_baseline(src, unk, EOS), inseq_default_baseline(tgt, unk, EOS, BOS)
    source, prefix, _ = _ig(s, src, tgt, 8, source_baseline=b_src, target_baseline=b_tgt)
    assert excess(ours.source, ours.prefix, source, prefix) > BROKEN
    # ... and that baseline is understood: glassformer's path integral from the same UNK / BOS embeddings agrees
    model, x_src, x_tgt = s.model, torch.tensor([src]), torch.tensor([tgt[:-1]])
    pad = model.source_padding(x_src)
    with torch.no_grad(), model.probes("encoder.embedding", "decoder.embedding") as at_x:
        model(x_src, x_tgt, pad)
    with torch.no_grad(), model.probes("encoder.embedding", "decoder.embedding") as at_b:
        model(torch.tensor([b_src]), torch.tensor([b_tgt[:-1]]), pad)
    rows = torch.arange(len(tgt) - 1)
    path = integrated.Path(model, x_src, x_tgt, pad, (at_x["encoder.embedding"], at_x["decoder.embedding"]),
                           (at_b["encoder.embedding"], at_b["decoder.embedding"]), rows, torch.tensor(tgt[1:]), None)
    from_unk = integrated.fixed(path, 8, "gauss-legendre")
    assert excess(from_unk.source, from_unk.prefix, source, prefix) <= 1
