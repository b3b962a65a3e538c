"""Quality at each decoding precision, on one trained run folder: what `--dtype` costs in translation.

    python -m benchmarks.quality --run runs/default          # HSK test greedy + beam 4, p(him), probes

For float32, bfloat16 and int8 (glassformer.inference.precision.with_precision): sacreBLEU BLEU and chrF on
the HSK test split (raw input, greedy and beam 4), p(him | BOS I gave) for the lesson sentence, and the
greedy translations of the probe sentences (datasets.PROBE_SENTENCES), each with whether it equals
float32's. Targets (the precision issue): BLEU within 0.3 of float32, p(him) within 0.02.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

BLEU_TOLERANCE, P_HIM_TOLERANCE = 0.3, 0.02


def p_next(translator, source: str, target: str, word: str) -> float:
    """p(word | BOS and the target before it) for `source`: the row and token that patching measures
    (translation.patching.focus_row), through the translator's (possibly bf16/int8) model."""
    import torch

    from glassformer.interpret.patching import focus_row

    row, token, ids = focus_row(translator.target, target, word)
    model = translator.model
    src = torch.tensor([translator.source.encode(source)])
    tgt = torch.tensor([[model.cfg.bos_id, *ids[:row]]])                    # (1, row + 1): BOS I gave
    with torch.inference_mode():
        logits = model.decode_step(tgt, model.encode(src), src == model.cfg.pad_id, model.new_cache())
    return float(torch.softmax(logits[0, -1].float(), dim=-1)[token])


def measure(run: str, dtypes: tuple[str, ...]) -> dict:
    import torch

    from glassformer.data.datasets import PROBE_SENTENCES, load_split
    from glassformer.decoding.evaluate import evaluate_pairs
    from glassformer.decoding.translator import Translator
    from glassformer.inference.precision import cpu_precision_support, with_precision
    from glassformer.lesson.examples import LESSON_PREDICT, LESSON_SENTENCES, LESSON_TARGET

    base = Translator.load(run)
    float32 = base.model
    test = load_split("test")
    rows, reference = [], {}
    for dtype in dtypes:
        base.model = with_precision(float32, dtype, note=False)
        row = {"dtype": dtype}
        for beam in (1, 4):
            start = time.perf_counter()
            s = evaluate_pairs(base, test, beam=beam)
            row[f"beam{beam}"] = {"bleu": round(s.bleu, 2), "chrf": round(s.chrf, 2),
                                  "seconds": round(time.perf_counter() - start, 1)}
        row["p_him"] = round(p_next(base, LESSON_SENTENCES[0], LESSON_TARGET, LESSON_PREDICT), 4)
        row["probes"] = base.translate(list(PROBE_SENTENCES))
        rows.append(row)
        reference = reference or row
    for row in rows:
        row["bleu_delta"] = {b: round(row[b]["bleu"] - reference[b]["bleu"], 2) for b in ("beam1", "beam4")}
        row["p_him_delta"] = round(row["p_him"] - reference["p_him"], 4)
        row["probes_equal"] = [a == b for a, b in zip(row["probes"], reference["probes"], strict=True)]
        row["holds"] = (all(abs(d) <= BLEU_TOLERANCE for d in row["bleu_delta"].values())
                        and abs(row["p_him_delta"]) <= P_HIM_TOLERANCE)
    return {"run": run, "cpu": cpu_precision_support().as_dict(), "torch": torch.__version__,
            "probe_sentences": list(PROBE_SENTENCES), "rows": rows}


def markdown(report: dict) -> str:
    lines = ["| dtype | HSK test BLEU / chrF, greedy | beam 4 | ΔBLEU greedy / beam 4 | p(him) | probes = float32 |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['dtype']} | {r['beam1']['bleu']:.2f} / {r['beam1']['chrf']:.2f} | "
                     f"{r['beam4']['bleu']:.2f} / {r['beam4']['chrf']:.2f} | "
                     f"{r['bleu_delta']['beam1']:+.2f} / {r['bleu_delta']['beam4']:+.2f} | {r['p_him']:.4f} | "
                     f"{sum(r['probes_equal'])} of {len(r['probes_equal'])} |")
    lines.append("")
    for sentence, *outs in zip(report["probe_sentences"], *[r["probes"] for r in report["rows"]], strict=True):
        lines.append(f"- {sentence} " + " · ".join(f"{r['dtype']}: {o}" for r, o in zip(report["rows"], outs,
                                                                                          strict=True)))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a glassformer run folder")
    p.add_argument("--dtypes", default="float32,bfloat16,int8", help="comma-separated, float32 first")
    p.add_argument("--out", help="JSON report (and .md beside it)")
    args = p.parse_args(argv)
    if not (Path(args.run) / "config.json").is_file():
        print(f"--run: {args.run} holds no run (no config.json)", file=sys.stderr)
        return 2
    from glassformer.errors import UsageError
    from glassformer.inference.precision import DTYPES

    dtypes = tuple(args.dtypes.split(","))
    if dtypes[0] != "float32" or not set(dtypes) <= set(DTYPES):
        print(f"--dtypes: float32 first, then any of {', '.join(DTYPES)}; got {args.dtypes!r}", file=sys.stderr)
        return 2
    try:
        report = measure(args.run, dtypes)
    except UsageError as error:                                             # e.g. int8 on a GPU
        print(error, file=sys.stderr)
        return 2
    text = markdown(report)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False))
        Path(args.out).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
