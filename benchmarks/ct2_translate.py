"""CTranslate2 on a glassformer export as its users serve it (docs/interop.md): Chinese lines on stdin, one English
line each on stdout, the export's own tokenizers (source_tokenizer.json, target_tokenizer.json) on either side.

    python -m benchmarks.ct2_translate --model runs/default-exports/ctranslate2 < zh.txt > en.txt
    python -m benchmarks.ct2_translate --model CT2 --compute-type int8 --inter --threads 2 --batch-size 32

`--inter`: `inter_threads=N, intra_threads=1` (batches in parallel, a thread each: CTranslate2's advice for
throughput), else one translator on N intra-op threads. The whole input in one `translate_batch` call (CTranslate2
sorts it by length and cuts batches of `--batch-size` sentences), greedy by default, glassformer's length rule
(2 x the longest source + 10 tokens, at most the model's positions less one) and length penalty (alpha 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ct2_translate", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a CTranslate2 export (glassformer export --to ctranslate2)")
    p.add_argument("--compute-type", default="float32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--inter", action="store_true", help="inter_threads=THREADS, intra_threads=1")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--max-positions", type=int, default=128, help="the model's max_len (default 128)")
    args = p.parse_args(argv)

    import ctranslate2
    from tokenizers import Tokenizer

    source = Tokenizer.from_file(str(Path(args.model) / "source_tokenizer.json"))
    target = Tokenizer.from_file(str(Path(args.model) / "target_tokenizer.json"))
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                       inter_threads=args.threads if args.inter else 1,
                                       intra_threads=1 if args.inter else args.threads)
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    tokens = [e.tokens for e in source.encode_batch(lines)]
    longest = max((len(t) for t in tokens), default=0)
    results = translator.translate_batch(tokens, max_batch_size=args.batch_size, batch_type="examples",
                                         beam_size=args.beam, length_penalty=1.0, min_decoding_length=0,
                                         max_decoding_length=min(args.max_positions - 1, 2 * longest + 10))
    unknown = target.token_to_id("<unk>") or 0
    out = [target.decode([target.token_to_id(t) or unknown for t in r.hypotheses[0]]) if line.strip() else ""
           for line, r in zip(lines, results, strict=True)]
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
