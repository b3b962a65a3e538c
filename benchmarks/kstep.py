"""Greedy's steps per package call (a block of k steps, decoding/search.py `steps`), measured in one process.

    python -m benchmarks.kstep --run runs/default                       # k in 1, 2, 4, 8; batches of 32 and of 1
    python -m benchmarks.kstep --run runs/default --dtype int8 --ks 1,4,8 --batches 32 --rounds 7
    python -m benchmarks.kstep --tiny                                   # a random d-192 model: no run folder

The same job (the race's sentences: HSK test + Tatoeba held-out; `--tiny`: random sources of 3-20 ids, each
sentence decoded to its limit unless `--eos-bias` raises the EOS logit) decoded by `generate` on compiled
packages, greedy without scores (the Translator's search), once for each k: k = 1 is the one-step package
(`CompiledDecoder` without `steps`), k > 1 the block at every row count. Every package is built or loaded and
every row bucket run before the timed rounds; rounds alternate the k values (load that comes and goes hits each
alike); each job's wall and process CPU seconds are kept, and the report gives medians and every k's outputs
against k = 1's (they must not differ). One thread by default (the `--workers` layout's); `--threads 2` for the
one-process layout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _model_and_sources(args):
    import torch

    if args.tiny:
        from glassformer.model import ModelConfig, Transformer
        torch.manual_seed(0)
        model = Transformer(ModelConfig(src_vocab=8000, tgt_vocab=4000, d_model=192, heads=4, d_ff=768,
                                        encoder_layers=2, decoder_layers=2, max_len=128, dropout=0.0,
                                        head_bias=True)).eval()
        with torch.no_grad():
            model.head.bias[model.cfg.eos_id] = args.eos_bias
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(3, 21, (args.sentences or 1024,), generator=g).tolist()
        return model, [torch.randint(3, 8000, (n,), generator=g).tolist() for n in lengths]
    from glassformer.data.checkpoint import load_translator_parts

    from .race import sentences
    return load_translator_parts(args.run)[0], sentences(args.run, args.sentences, [])[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kstep", description=__doc__.splitlines()[0])
    parser.add_argument("--run", help="a glassformer run folder (its sentences: HSK test + Tatoeba held-out)")
    parser.add_argument("--tiny", action="store_true", help="a random model of the default's shape instead")
    parser.add_argument("--eos-bias", type=float, default=0.0, help="--tiny: a bias on the EOS logit (default 0: "
                        "every sentence runs to its limit, 2 x its length + 10)")
    parser.add_argument("--ks", default="1,2,4,8", help="steps per call to compare (default 1,2,4,8)")
    parser.add_argument("--batches", default="32,1", help="batch sizes (default 32,1)")
    parser.add_argument("--b1-sentences", type=int, default=256, help="sentences of the batch-1 job (default 256)")
    parser.add_argument("--sentences", type=int, default=None, help="the first N sentences only")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "int8"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cache", default=None, help="the packages' folder (default: glassformer's cache folder)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    if not args.tiny and not args.run:
        parser.error("--run RUN_DIR or --tiny")

    import torch

    from glassformer.data.batching import padded
    from glassformer.decoding.search import SENTENCE_BUCKETS, generate, step, steps, strategy
    from glassformer.inference import compiler
    from glassformer.inference.precision import cpu_precision_support, with_precision

    from .race import sorted_batches
    from .stats import median

    torch.set_num_threads(args.threads)
    folder = compiler.use_compile_cache(args.cache)
    model, sources = _model_and_sources(args)
    model = with_precision(model, args.dtype, note=False)
    search, ks = strategy(1, scores=False), [int(k) for k in args.ks.split(",")]
    log = lambda line: print(line, file=sys.stderr, flush=True)                      # noqa: E731
    decoders = {}
    for k in ks:                                                     # k = 1: no blocks; else k at every row count
        decoders[k] = compiler.CompiledDecoder(model, step, folder, log, args.threads, steps=None if k == 1 else steps)
        decoders[k].per_call = {"few": k, "many": k}

    def job(k: int, batch: int) -> tuple[float, float, list]:
        chosen = sources if batch > 1 else sources[: args.b1_sentences]
        out: list = [None] * len(chosen)
        wall, cpu = time.perf_counter(), time.process_time()
        for chunk in sorted_batches([len(s) for s in chosen], batch):
            src = padded([chosen[i] for i in chunk], model.cfg.pad_id)
            for i, hyps in zip(chunk, generate(model, src, search, compiled=decoders[k]), strict=True):
                out[i] = hyps[0].tokens
        return time.perf_counter() - wall, time.process_time() - cpu, out

    machine = {"cpu": torch.backends.cpu.get_cpu_capability(), "flags": sorted(cpu_precision_support().flags),
               "torch": torch.__version__, "threads": args.threads}
    report = {"machine": machine,
              "dtype": args.dtype, "model": "tiny" if args.tiny else args.run, "cases": []}
    for batch in [int(b) for b in args.batches.split(",")]:
        for k in ks:                                                 # every package built or loaded, every bucket run
            for n in [b for b in SENTENCE_BUCKETS if b < batch] + [batch]:
                generate(model, padded([sources[i % len(sources)] for i in range(n)], model.cfg.pad_id), search,
                         max_len=12, compiled=decoders[k])
        times: dict[int, list] = {k: [] for k in ks}
        outputs = {}
        for r in range(args.rounds):
            for k in ks[r % len(ks):] + ks[: r % len(ks)]:           # the order rotates round by round
                wall, cpu, outputs[k] = job(k, batch)
                times[k].append((wall, cpu))
        base = outputs[ks[0]]
        case = {"batch": batch, "sentences": len(base), "tokens": sum(map(len, base)) + len(base)}
        for k in ks:
            walls, cpus = [w for w, _ in times[k]], [c for _, c in times[k]]
            case[f"k{k}"] = {"wall_s": median(walls), "cpu_s": median(cpus), "walls": walls, "cpus": cpus,
                             "differ": sum(a != b for a, b in zip(outputs[k], base, strict=True))}
        report["cases"].append(case)
        log(f"batch {batch}: {len(base)} sentences, {case['tokens']} tokens")
        for k in ks:
            c = case[f"k{k}"]
            log(f"  k={k}: wall {c['wall_s']:.3f} s  cpu {c['cpu_s']:.3f} s  ({case['tokens'] / c['wall_s']:,.0f} "
                f"tokens/s)  differ from k={ks[0]}: {c['differ']}")
    print(json.dumps(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
