"""Attribution patching against activation patching, one corrupted sentence at a time.

    python -m benchmarks.patching --run RUN_DIR [--sentences 50] [--seed 0] [--min-gap 0.05] [--threads 1]
                                  [--out FILE.json]

Attribution patching (Nanda 2023, `glassformer.interpret.attribution_patching.approximate_scan`) estimates every
cell of an activation-patching scan (`glassformer.interpret.patching.patch_scan`) from one backward pass. How
well, is the Pearson correlation of the two scans' restored fractions over every cross-attention head and
every encoder position of every encoder layer (`attribution_patching.correlation`, what `glassformer patch
--approximate --compare` prints). Measured on

- the lesson: 我昨天给了他一本书。 against each of the lesson's corruptions (她 for 他; 他 and 我 swapped),
  teacher-forced "I gave him a book yesterday.", p(him) at the gave row (`lesson_patching`, the defaults of
  `glassformer patch`);
- the first N HSK test pairs (`load_split("test")`, in order) that can be corrupted: each corrupted by code.
  The source's units are visited in a seeded random order (Han units only: punctuation is left alone); the
  unit at the visited position is replaced by a unit of the same frequency class, floor(log2(count)) of its
  training count in the source vocabulary (a seeded choice among the Han units of that class; the same
  number of units, so positions align). The quantity is p(y_t) of the teacher-forced reference at the row
  where the corruption moves it most; a position whose best row moves p by less than --min-gap is passed over
  for the next one, and a sentence where no position does is skipped (counted), as is one with a unit the
  model does not know or too long for the model.

Reported: the lesson's correlations, and the distribution (median, quartiles, min, max) over the HSK sentences,
with the |p_clean − p_corrupt| gaps. No timings (a correlation does not depend on the machine); --out writes
every sentence's corruption, row, gap and correlation as JSON.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")    # as the other benchmarks (benchmarks/README.md)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

MIN_GAP = 0.05                  # |p_clean − p_corrupt| a corruption must move p by at its row


def plain(value):
    """A scan with its Patched cells as {"p", "fraction"} (the JSON form `correlation` reads)."""
    from glassformer.interpret.patch_sites import Patched

    if isinstance(value, Patched):
        return value.to_json()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def frequency_classes(vocab) -> dict[int, list[int]]:
    """floor(log2(training count)) -> the ids of the source vocabulary's Han units of that class, ascending."""
    from glassformer.data.tokenize import SPECIAL_TOKENS, is_han

    classes: dict[int, list[int]] = {}
    for i, unit in enumerate(vocab.tokens):
        if i >= len(SPECIAL_TOKENS) and all(is_han(ch) for ch in unit):
            classes.setdefault(int(math.log2(max(1, vocab.counts.get(unit, 1)))), []).append(i)
    return classes


@torch.no_grad()
def _probabilities(model, src, tgt_in, labels):
    """p(labels[r]) at every row r: (tgt,) float64."""
    p = torch.softmax(model(src, tgt_in)[0].double(), dim=-1)              # (tgt, vocab)
    return p[torch.arange(len(labels)), torch.tensor(labels)]


def corrupt(model, source, units, ids, tgt_in, labels, classes, rng, min_gap):
    """The first position (seeded order) whose same-class replacement moves some row's p by ≥ min_gap:
    (position, new id, row, gap), or None."""
    from glassformer.data.tokenize import is_han

    vocab = source.vocab
    clean = _probabilities(model, torch.tensor([ids]), tgt_in, labels)
    positions = [j for j, u in enumerate(units) if all(is_han(ch) for ch in u)]
    rng.shuffle(positions)
    for j in positions:
        same = [i for i in classes.get(int(math.log2(max(1, vocab.counts.get(units[j], 1)))), []) if i != ids[j]]
        if not same:
            continue
        new = rng.choice(same)
        bad = [*ids[:j], new, *ids[j + 1:]]
        gap = clean - _probabilities(model, torch.tensor([bad]), tgt_in, labels)   # (tgt,)
        row = int(gap.abs().argmax())
        if abs(float(gap[row])) >= min_gap:
            return j, new, row, float(gap[row])
    return None


def parts(approximate: dict, exact: dict) -> dict[str, float | None]:
    """The same correlation over the head cells alone and over the position cells alone."""
    from glassformer.interpret.attribution_patching import correlation

    def heads(scan):
        return {**scan, "positions": None}

    def positions(scan):
        return {**scan, "heads": []}

    return {"heads_only": correlation(heads(approximate), heads(exact)),
            "positions_only": correlation(positions(approximate), positions(exact))}


def lesson(translator) -> list[dict]:
    """`glassformer patch --approximate --compare` on the lesson's defaults: one correlation per corruption."""
    from glassformer.interpret.attribution_patching import correlation
    from glassformer.interpret.patching import lesson_patching

    scan = (translator.model, translator.source, translator.target)
    approximate = lesson_patching(*scan, method="attribution")
    exact = lesson_patching(*scan, method="activation")
    return [{"corrupt": a["corrupt"], "p_clean": e["p_clean"], "p_corrupt": e["p_corrupt"],
             "correlation": correlation(a, e), **parts(a, e)}
            for a, e in zip(approximate["runs"], exact["runs"], strict=True)]


def hsk(translator, n: int, seed: int, min_gap: float) -> tuple[list[dict], dict[str, int]]:
    """The first n HSK test pairs that can be corrupted (module docstring), each with its correlation."""
    from glassformer.data.datasets import load_split
    from glassformer.data.tokenize import UNK
    from glassformer.interpret.attribution_patching import approximate_scan, correlation
    from glassformer.interpret.patching import patch_scan

    model, source, target = translator.model, translator.source, translator.target
    model.eval()
    cfg = model.cfg
    classes = frequency_classes(source.vocab)
    rng = random.Random(seed)
    done: list[dict] = []
    skipped = {"unknown_unit": 0, "too_long": 0, "no_corruption": 0}
    for pair in load_split("test"):
        if len(done) == n:
            break
        enc = source.analyse(pair.zh)
        ids = target.encode(pair.en)
        if enc.unknown or UNK in enc.ids:
            skipped["unknown_unit"] += 1
            continue
        if len(enc.ids) > cfg.max_len or len(ids) + 1 > cfg.max_len:
            skipped["too_long"] += 1
            continue
        tgt_in, labels = torch.tensor([[cfg.bos_id, *ids]]), [*ids, cfg.eos_id]
        found = corrupt(model, source, enc.units, enc.ids, tgt_in, labels, classes, rng, min_gap)
        if found is None:
            skipped["no_corruption"] += 1
            continue
        j, new, row, gap = found
        clean = torch.tensor([enc.ids])
        bad = clean.clone()
        bad[0, j] = new
        exact = plain(patch_scan(model, clean, bad, tgt_in, row, labels[row]))
        approximate = plain(approximate_scan(model, clean, bad, tgt_in, row, labels[row]))
        piece = target.id_to_token(labels[row]) if labels[row] != cfg.eos_id else "</s>"
        done.append({"id": pair.id, "zh": pair.zh, "en": pair.en, "position": j, "unit": enc.units[j],
                     "replacement": source.vocab.tokens[new], "row": row, "token": piece, "gap": gap,
                     "cells": sum(len(layer) for layer in exact["heads"]) + sum(len(layer) for layer in
                                                                               exact["positions"]),
                     "correlation": correlation(approximate, exact), **parts(approximate, exact)})
    return done, skipped


def quartiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "median": None, "q1": None, "q3": None, "min": None, "max": None}
    t = torch.tensor(values, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)).tolist()
    return {"count": len(values), "median": q[1], "q1": q[0], "q3": q[2], "min": float(t.min()),
            "max": float(t.max())}


NAMES = (("r", "correlation"), ("heads only", "heads_only"), ("positions only", "positions_only"))


def _r(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.patching", description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a trained run folder (runs/default)")
    parser.add_argument("--sentences", type=int, default=50, help="HSK test sentences (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corruptions (default 0)")
    parser.add_argument("--min-gap", type=float, default=MIN_GAP,
                        help=f"least |p_clean − p_corrupt| at the measured row (default {MIN_GAP})")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.threads < 1 or not 0 < args.min_gap < 1:
        parser.error("--sentences and --threads take a positive integer, --min-gap a number in (0, 1)")
    if not (Path(args.run) / "config.json").is_file():
        parser.error(f"--run: no run folder at {args.run}")
    torch.set_num_threads(args.threads)
    from glassformer.decoding.translator import Translator

    translator = Translator.load(args.run)
    lessons = lesson(translator)
    sentences, skipped = hsk(translator, args.sentences, args.seed, args.min_gap)
    known = [s["correlation"] for s in sentences if s["correlation"] is not None]
    summary = {"correlation": quartiles(known), "no_spread": len(sentences) - len(known),
               **{part: quartiles([s[part] for s in sentences if s[part] is not None])
                  for part in ("heads_only", "positions_only")},
               "gap": quartiles([abs(s["gap"]) for s in sentences]), "skipped": skipped}
    print("attribution patching against activation patching: Pearson r over every head and encoder position")
    for run in lessons:
        r = "  ".join(f"{name} {_r(run[key])}" for name, key in NAMES)
        print(f"  lesson, corrupted {run['corrupt']} (p(him) {run['p_clean']:.3f} → {run['p_corrupt']:.3f}): {r}")
    print(f"  HSK test, {len(sentences)} sentences, one unit replaced by a unit of its frequency class (skipped: "
          f"{', '.join(f'{k} {v}' for k, v in skipped.items())}; |gap| median {_r(summary['gap']['median'])})")
    for name, key in NAMES:
        c = summary[key]
        if c["count"]:
            print(f"    {name:<15} median {c['median']:.3f}, quartiles {c['q1']:.3f} / {c['q3']:.3f}, "
                  f"min {c['min']:.3f}, max {c['max']:.3f} ({c['count']} sentences)")
    if args.out:
        record = {"command": " ".join(["python -m benchmarks.patching", *(argv if argv is not None else sys.argv[1:])]),
                  "run": args.run, "seed": args.seed, "min_gap": args.min_gap, "torch": torch.__version__,
                  "lesson": lessons, "summary": summary, "sentences": sentences}
        Path(args.out).write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
