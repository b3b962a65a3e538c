"""Attribution throughput: glassformer's integrated gradients and input × gradient beside inseq's, same run.

    python -m benchmarks.attribution --run RUN_DIR [--sentences N] [--steps S] [--rounds R] [--threads T]
                                     [--out FILE.json]

The first N pairs of the HSK test split, teacher-forced on their references (rows BOS, y_1 … y_n predict
y_1 … y_n, EOS), every row of every sentence attributed to its source units and its target inputs, one sentence
per call. glassformer: `glassformer.interpret.attribution.attribute` on the run itself, Gauss–Legendre with
S fixed steps (captum's default rule, which inseq uses). inseq: the run exported with `glassformer export --to
transformers` (written to a temporary folder), loaded by `MarianMTModel.from_pretrained` and wrapped by
`inseq.load_model`, attributed_fn "probability" with logprob=True (f = log p(y_t)), fed ids and embeddings
directly (`inseq_batch`: the position-only baseline, the target's own embedding matrix) — the settings under
which tests/test_inseq.py shows both give the same scores (docs/inseq.md says why each is needed).

Method: one warm-up pass per system and method, then R rounds; in each round every method runs on both
systems back to back (the order of the systems alternates from round to round), so load that comes and goes
hits both alike. Reported: sentences per second, median / min / max over rounds, and the round-by-round ratio
glassformer / inseq. The JSON (--out) also holds the machine (CPU model, flags, torch's CPU capability,
threads, versions, load average) and a check: the largest score difference between the two on the first
sentence (integrated gradients).

This module also holds the inseq adapter that tests/test_inseq.py uses (`pair_tokenizer`, `load_inseq`,
`inseq_batch`, `inseq_scores`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # as the other benchmarks (benchmarks/README.md)

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from importlib import metadata  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from .stats import speedup, summary  # noqa: E402

# glassformer's method name → inseq's
METHODS = {"integrated-gradients": "integrated_gradients", "input-x-gradient": "input_x_gradient"}
SYSTEMS = ("glassformer", "inseq")
RULE = "gauss-legendre"          # captum's IntegratedGradients default ("gausslegendre"), the same nodes
FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
         "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


# ---- the inseq side ----------------------------------------------------------------------------------------

@functools.cache
def _pair_tokenizer_class():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    class PairTokenizer(PreTrainedTokenizerFast):
        """The source tokenizer, switched to the target one for `text_target=` (as MarianTokenizer does)."""

        def __init__(self, source_file: str, target_file: str, **kwargs):
            super().__init__(tokenizer_file=source_file, **kwargs)
            self._source_backend = self._tokenizer
            self._target_backend = Tokenizer.from_file(target_file)

        def _switch_to_target_mode(self):
            self._tokenizer = self._target_backend

        def _switch_to_input_mode(self):
            self._tokenizer = getattr(self, "_source_backend", self._tokenizer)

    return PairTokenizer


def pair_tokenizer(folder: str | Path):
    """A transformers tokenizer for a glassformer export: source_tokenizer.json, target_tokenizer.json for targets.

    inseq needs one (its wrapper reads the pad / unk / special tokens from it and encodes text with it); the
    scores below never go through it: `inseq_batch` feeds glassformer's ids. Token *names* that inseq prints
    for target ids come from the source vocabulary (it has one `convert_ids_to_tokens` for both sides)."""
    folder = Path(folder)
    source, target = folder / "source_tokenizer.json", folder / "target_tokenizer.json"
    if not source.is_file() or not target.is_file():
        raise SystemExit(f"{folder}: no source_tokenizer.json / target_tokenizer.json (a run with glassformer's own "
                         "tokenizers exports them; an imported SentencePiece run does not)")
    return _pair_tokenizer_class()(str(source), str(target), pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


def load_inseq(hf, method: str, tokenizer):
    """inseq's wrapper of the MarianMTModel `hf` with `method`, and `hf`'s decoder told not to rescale embeddings.

    inseq feeds decoder_inputs_embeds = embed_tokens(ids) × embed_scale; transformers 5's Marian decoder
    multiplies decoder_inputs_embeds by embed_scale again (its encoder does not), so without this the decoder
    sees its token vectors × d_model (√d twice). inseq checks at load that both sides have one scale: the
    decoder's is restored for the load and set to 1 after it. `hf.generate` is then wrong; nothing here uses it."""
    import inseq

    decoder, encoder = hf.model.decoder, hf.model.encoder
    decoder.embed_scale = encoder.embed_scale
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = inseq.load_model(hf, method, tokenizer=tokenizer)
    decoder.embed_scale = 1.0
    return wrapped


def inseq_batch(hf, ids: list[int], side: str, baseline_ids: list[int] | None = None, tokens: list[str] | None = None):
    """An inseq Batch for one sentence: e = the side's own embedding matrix[ids] × √d (Marian adds positions).

    The baseline is e' = 0 (then the model sees the position vectors alone: glassformer's position-only baseline),
    or the embeddings of `baseline_ids` (inseq's own choice for text input: `inseq_default_baseline`)."""
    from inseq.data import Batch, BatchEmbedding, BatchEncoding

    stack = hf.model.encoder if side == "source" else hf.model.decoder
    scale = math.sqrt(hf.config.d_model) if hf.config.scale_embedding else 1.0
    x = torch.tensor([ids])
    with torch.no_grad():
        e = stack.embed_tokens(x) * scale
        b = torch.zeros_like(e) if baseline_ids is None else stack.embed_tokens(torch.tensor([baseline_ids])) * scale
    names = tokens if tokens is not None else [str(i) for i in ids]
    return Batch(BatchEncoding(x, torch.ones_like(x), [names], torch.tensor([baseline_ids or [0] * len(ids)])),
                 BatchEmbedding(e, b))


def inseq_default_baseline(ids: list[int], unk: int, eos: int, bos: int | None = None) -> list[int]:
    """The baseline ids inseq builds for text input (HuggingfaceModel.encode): UNK everywhere but EOS; a target
    keeps its leading BOS (decoder start)."""
    out = [eos if i == eos else unk for i in ids]
    if bos is not None:
        out[0] = bos
    return out


def inseq_scores(wrapped, hf, src_ids: list[int], target: list[int], *, steps: int | None = None,
                 source_baseline: list[int] | None = None, target_baseline: list[int] | None = None,
                 **attribution_args):
    """inseq's per-row scores, Σ over the embedding axis: (rows, src), (rows, tgt_in), and its output object.

    target = [BOS, y_1 … y_n, EOS]; inseq's step t (prefix target[:t], predicting target[t]) is glassformer's
    row t − 1. f = log p (attributed_fn "probability", logprob=True); step score "probability" = p(y_t)."""
    args = dict(attribution_args)
    if steps is not None:
        args["n_steps"] = steps
    out = wrapped.attribution_method.prepare_and_attribute(
        inseq_batch(hf, src_ids, "source", source_baseline), inseq_batch(hf, target, "target", target_baseline),
        attribute_target=True, show_progress=False, pretty_progress=False, attributed_fn="probability",
        attributed_fn_args={"logprob": True}, step_scores=["probability"], attribution_args=args)
    out = out[0] if isinstance(out, list) else out
    seq = out.sequence_attributions[0]
    source = seq.source_attributions.double().sum(-1).T                            # (rows, src)
    prefix = torch.nan_to_num(seq.target_attributions.double().sum(-1).T)[:, : len(target) - 1]   # NaN: unseen
    return source, prefix, seq


# ---- the glassformer side ----------------------------------------------------------------------------------

def glassformer_scores(model, src_ids: list[int], target: list[int], method: str, steps: int | None = None,
                       rule: str = RULE):
    """glassformer's Attribution for every row of one teacher-forced sentence (target = [BOS, …, EOS])."""
    from glassformer import limits
    from glassformer.interpret.attribution import attribute

    rows = list(range(len(target) - 1))
    with limits.lifted():                                  # any --steps; the benchmark is trusted input
        return attribute(model, torch.tensor([src_ids]), torch.tensor([target[:-1]]), rows, target[1:], method,
                         steps=steps if steps is not None else "auto", rule=rule)


# ---- the benchmark -----------------------------------------------------------------------------------------

def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info(threads: int, argv: list[str]) -> dict:
    cpu, named, flags = platform.processor() or "?", False, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not named:
                    cpu, named = line.split(":", 1)[1].strip(), True
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"cpu": cpu, "cpu_flags": [f for f in FLAGS if f in flags], "cores": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "python": platform.python_version(),
            **{p: _version(p) for p in ("torch", "transformers", "inseq", "captum")},
            "platform": platform.platform(), "command": " ".join(["python -m benchmarks.attribution", *argv]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "load_average_start": list(os.getloadavg())}


def sentences(model, source, target, n: int) -> list[tuple[list[int], list[int]]]:
    """(source ids, [BOS, target ids, EOS]) of the first n HSK test pairs, teacher-forced on the reference."""
    from glassformer.data.datasets import load_split

    cfg = model.cfg
    out = []
    for pair in load_split("test")[:n]:
        src = source.encode(pair.zh)[: cfg.max_len]
        tgt = [cfg.bos_id, *target.encode(pair.en)][: cfg.max_len] + [cfg.eos_id]
        out.append((src, tgt))
    return out


def _pass(system: str, method: str, work, glass_model, wrapped, hf, steps: int) -> float:
    """Seconds for one pass over `work`, every row of every sentence."""
    ig = method == "integrated-gradients"
    start = time.perf_counter()
    for src, tgt in work:
        if system == "glassformer":
            glassformer_scores(glass_model, src, tgt, method, steps if ig else None)
        else:
            inseq_scores(wrapped[method], hf, src, tgt, steps=steps if ig else None)
    return time.perf_counter() - start


def _check(work, glass_model, wrapped, hf, steps: int) -> dict:
    src, tgt = work[0]
    ours = glassformer_scores(glass_model, src, tgt, "integrated-gradients", steps)
    source, prefix, _ = inseq_scores(wrapped["integrated-gradients"], hf, src, tgt, steps=steps)
    scale = max(float(ours.source.abs().max()), float(ours.prefix.abs().max()))
    diff = max(float((ours.source - source).abs().max()), float((ours.prefix - prefix).abs().max()))
    return {"method": "integrated-gradients", "steps": steps, "rule": RULE, "max_abs_difference": diff,
            "largest_score": scale, "rows": len(tgt) - 1}


def _fmt(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def table(results: dict, steps: int) -> str:
    lines = ["| method | steps | glassformer sentences/s | inseq sentences/s | glassformer / inseq |",
             "|---|---|---|---|---|"]
    for method, r in results.items():
        lines.append(f"| {method} | {steps if method == 'integrated-gradients' else '—'} | "
                     f"{_fmt(r['glassformer'])} | {_fmt(r['inseq'])} | {_fmt(r['speedup'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attribution", description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, metavar="RUN_DIR", help="a glassformer run folder")
    parser.add_argument("--sentences", type=int, default=16, metavar="N", help="first N HSK test pairs (16)")
    parser.add_argument("--steps", type=int, default=16, metavar="S",
                        help="integrated-gradients steps, both systems, Gauss-Legendre (16)")
    parser.add_argument("--rounds", type=int, default=5, metavar="R", help="timed rounds (5)")
    parser.add_argument("--threads", type=int, default=2, metavar="T", help="torch intra-op threads (2)")
    parser.add_argument("--out", metavar="FILE.json", help="write the results here")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.steps < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--sentences, --steps, --rounds and --threads must be at least 1")
    try:
        import inseq  # noqa: F401
        import transformers
    except ImportError as missing:
        raise SystemExit(f"benchmarks.attribution needs inseq and transformers: pip install -e '.[inseq]' "
                         f"({missing})") from None

    from glassformer.data.checkpoint import load_translator_parts
    from glassformer.interop.export import export

    warnings.filterwarnings("ignore", message=".*did not already require gradients")   # captum, every call
    torch.set_num_threads(args.threads)
    machine = machine_info(args.threads, argv)
    glass_model, source, target, _ = load_translator_parts(args.run)
    glass_model.eval()
    work = sentences(glass_model, source, target, args.sentences)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "hf"
        export(args.run, "transformers", folder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = transformers.MarianMTModel.from_pretrained(folder).eval()
        tokenizer = pair_tokenizer(folder)
    wrapped = {m: load_inseq(hf, name, tokenizer) for m, name in METHODS.items()}
    check = _check(work, glass_model, wrapped, hf, args.steps)
    for method in METHODS:                                                  # warm-up
        for system in SYSTEMS:
            _pass(system, method, work[:2], glass_model, wrapped, hf, args.steps)
    rates: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SYSTEMS} for m in METHODS}
    for r in range(args.rounds):
        order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
        for method in METHODS:
            for system in order:
                seconds = _pass(system, method, work, glass_model, wrapped, hf, args.steps)
                rates[method][system].append(len(work) / seconds)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    machine["load_average_end"] = list(os.getloadavg())
    results = {m: {"glassformer": summary(v["glassformer"]), "inseq": summary(v["inseq"]),
                   "speedup": speedup(v["glassformer"], v["inseq"]), "samples": v} for m, v in rates.items()}
    settings = {"run": str(args.run), "split": "test", "sentences": len(work),
                "rows": sum(len(t) - 1 for _, t in work), "steps": args.steps, "rule": RULE,
                "rounds": args.rounds, "dtype": str(next(glass_model.parameters()).dtype).replace("torch.", "")}
    doc = {"machine": machine, "settings": settings, "check": check, "results": results}
    print(table(results, args.steps))
    print(f"\n{machine['cpu']} ({machine['cpu_capability']}; {' '.join(machine['cpu_flags'])}), "
          f"{args.threads} threads, torch {machine['torch']}, transformers {machine['transformers']}, "
          f"inseq {machine['inseq']}; {settings['sentences']} sentences, {settings['rows']} rows; "
          f"check: largest |glassformer − inseq| {check['max_abs_difference']:.2e} "
          f"(largest score {check['largest_score']:.3g}); load average {machine['load_average_start'][0]:.2f} → "
          f"{machine['load_average_end'][0]:.2f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
