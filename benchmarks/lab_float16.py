"""The offline lab's weights in float16: does the page still translate as `glassformer translate`, and give p(next)
as the model's own hooks?

    python -m benchmarks.lab_float16 [--model runs/default] [--split test] [--beams 1,4] [--limit N]
    python -m benchmarks.lab_float16 --default-shape        # a seeded model of the default preset's shape

For each weight encoding (float32, float16) the model's bundle goes through the page's engine in Node
(benchmarks/lab_engine.mjs: the page's own loadBundle, tokenizers and search), and is compared with
- the translations of the HSK split (`glassformer.decoding.Translator`, as `glassformer translate`; greedy and beam 4),
- p(next) at every row of each sentence teacher-forced with its reference translation: the model in float32 (the
  weights the run folder holds) through its forward, softmax in float64, as tests/test_lab_browser.py reads the hooks.
- the attribution rows of `glassformer attribute --json` (saliency, input x gradient, integrated gradients at 16
  steps) for the first sentences, teacher-forced: the largest |page - CLI| of a row over its largest |score|.
The rule for the offline file (docs/lab.md): translations equal on >= 99 % of the sentences, p(next) within 1e-4,
and attribute() within 1e-4 of each row's largest score. Printed with the exported file's size for each encoding
(the offline file packs float32 losslessly: lab/bundle.py pack_weights); nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

AGREEMENT = 0.99                     # share of sentences whose page translation equals the CLI's
P_TOLERANCE = 1e-4                   # largest |p_page - p_model| over every row and token
ROW_TOLERANCE = 1e-4                 # largest |page - CLI| of an attribution row over the row's largest |score|
ATTRIBUTION_METHODS = (("saliency", "auto"), ("input-x-gradient", "auto"), ("integrated-gradients", 16))
RUNNER = Path(__file__).with_name("lab_engine.mjs")
ENGINE = Path(__file__).resolve().parents[1] / "src" / "glassformer" / "lab" / "static" / "engine"


def default_shaped_lab(seed: int = 0):
    """A LabModel of the default preset's shape and vocabularies, seeded weights (as tests/test_lab_browser.py)."""
    from glassformer.lab.api import LabModel
    from glassformer.model import ModelConfig, Transformer
    from glassformer.training.prepare_data import prepare_data
    from glassformer.training.settings import preset_settings

    recipe = preset_settings("default")
    data = prepare_data(recipe)
    cfg = ModelConfig(**recipe.model.model_dump(), src_vocab=data.source.vocab_size, tgt_vocab=data.target.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Transformer(cfg)
    return LabModel.build(model, data.source, data.target, trained=True, origin="default preset's shape, seeded")


def _page_run(bundle: dict, sentences: list[str], beams: list[int], forced: list[dict], folder: Path,
              attribute: list[dict]) -> dict:
    node = shutil.which("node")
    if node is None:
        raise SystemExit("needs Node.js (node) on PATH: the page's engine runs there")
    (folder / "bundle.json").write_text(json.dumps(bundle))
    job = {"bundle": str(folder / "bundle.json"), "probs": str(folder / "probs.bin"), "forced": forced,
           "translate": [{"text": s, "beam": b} for b in beams for s in sentences], "attribute": attribute}
    (folder / "job.json").write_text(json.dumps(job))
    done = subprocess.run([node, str(RUNNER), str(ENGINE), str(folder / "job.json"), str(folder / "out.json")],
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    out = json.loads((folder / "out.json").read_text())
    out["probs"] = np.fromfile(folder / "probs.bin", dtype="<f8")
    return out


def _row_deviation(got: dict, want: dict) -> float:
    """The largest |page - CLI| of any row over that row's largest |score| (inf when the rows differ)."""
    if [(r["position"], r["token"]) for r in got["rows"]] != [(r["position"], r["token"]) for r in want["rows"]]:
        return float("inf")
    worst = 0.0
    for g, w in zip(got["rows"], want["rows"], strict=True):
        values = [v for _, v in w["source"] + w["prefix"]]
        scale = max(map(abs, values)) or 1.0
        mine = [v for _, v in g["source"] + g["prefix"]]
        worst = max(worst, max(abs(a - b) for a, b in zip(mine, values, strict=True)) / scale)
    return worst


def measure(lab, sentences: list[str], references: list[str], beams: list[int] = (1, 4),
            dtypes: tuple[str, ...] = ("float32", "float16"), file_size: bool = True, attributed: int = 8) -> dict:
    """{dtype: {file_mb, agreement: {beam: share}, differing: {beam: [(source, cli, page)]}, max_dp, rows,
    attribution: {method: worst row deviation}}}."""
    from glassformer.decoding.translator import Translator
    from glassformer.interpret.why import why
    from glassformer.lab.bundle import write_bundle

    model, source, target = lab.model.eval(), lab.source, lab.target
    translator = Translator(model, source, target)
    cli = {b: translator.translate(sentences, b) for b in beams}
    cfg = model.cfg
    forced, want = [], []
    for text, english in zip(sentences, references, strict=True):
        src = source.encode(text)[: cfg.max_len]
        if not src:
            continue
        tgt = [cfg.bos_id, *target.encode(english)][: cfg.max_len]
        forced.append({"src": src, "tgt": tgt})
        with torch.inference_mode():
            p = torch.softmax(model(torch.tensor([src]), torch.tensor([tgt]))[0].double(), dim=-1)   # (tgt, V)
        want.append(p.numpy())
    want = np.concatenate(want)
    known = [(s, r) for s, r in zip(sentences, references, strict=True) if not source.analyse(s).unknown]
    chosen = known[:attributed]
    jobs, cli_rows = [], []
    for method, steps in ATTRIBUTION_METHODS:
        for text, english in chosen:
            jobs.append({"text": text, "target": english, "method": method, "steps": steps})
            with torch.enable_grad():
                cli_rows.append(why(model, source, target, text, english, method, None, steps, lens=False))
    results = {}
    for dtype in dtypes:
        bundle = write_bundle(model, (source, target), dtype)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            page = _page_run(bundle, sentences, list(beams), forced, Path(tmp), jobs)
            seconds = time.perf_counter() - started
        got = page["probs"].reshape(want.shape)
        translations = page["translations"]
        agreement, differing = {}, {}
        for k, b in enumerate(beams):
            mine = translations[k * len(sentences):(k + 1) * len(sentences)]
            pairs = [(s, c, m) for s, c, m in zip(sentences, cli[b], mine, strict=True) if c != m]
            agreement[b] = 1 - len(pairs) / len(sentences)
            differing[b] = pairs
        deviation = {}
        for job, mine, theirs in zip(jobs, page["attributions"], cli_rows, strict=True):
            deviation[job["method"]] = max(deviation.get(job["method"], 0.0), _row_deviation(mine, theirs))
        row = {"agreement": agreement, "differing": differing, "max_dp": float(np.abs(got - want).max()),
               "rows": int(want.shape[0]), "node_seconds": seconds, "attribution": deviation,
               "attributed": len(chosen)}
        if file_size:
            row["file_mb"] = export_size(lab, dtype) / 1e6
        results[dtype] = row
    return results


def export_size(lab, dtype: str) -> int:
    from glassformer.lab.api import LabAPI
    from glassformer.lab.export import write_export
    from glassformer.lesson import claims

    api = LabAPI(lab, run_claims=lambda: [claims.run_check(c) for c in ("A1", "B3", "C1")])
    with tempfile.TemporaryDirectory() as tmp:
        return write_export(api, Path(tmp) / "lab.html", dtype=dtype)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a run folder (default: runs/default, as the CLI)")
    parser.add_argument("--default-shape", action="store_true", help="a seeded model of the default preset's shape")
    parser.add_argument("--split", default="test", help="HSK split whose sentences are translated (default test)")
    parser.add_argument("--beams", default="1,4", help="beam sizes compared (default 1,4)")
    parser.add_argument("--limit", type=int, help="the first N sentences only")
    args = parser.parse_args(argv)
    from glassformer.data.datasets import load_split
    from glassformer.lab.api import load_model

    lab = default_shaped_lab() if args.default_shape else load_model(args.model, required=args.model is not None)
    pairs = load_split(args.split)[: args.limit]
    sentences, references = [p.zh for p in pairs], [p.en for p in pairs]
    beams = [int(b) for b in args.beams.split(",")]
    torch.set_num_threads(1)
    print(f"model: {lab.origin} ({sum(p.numel() for p in lab.model.parameters()):,} parameters); "
          f"{len(sentences)} sentences of HSK {args.split}; beams {beams}")
    results = measure(lab, sentences, references, beams)
    for dtype, r in results.items():
        ok = (all(a >= AGREEMENT for a in r["agreement"].values()) and r["max_dp"] <= P_TOLERANCE
              and all(d <= ROW_TOLERANCE for d in r["attribution"].values()))
        shares = ", ".join(f"beam {b}: {100 * a:.1f} %" for b, a in r["agreement"].items())
        rows = ", ".join(f"{m} {d:.1e}" for m, d in r["attribution"].items())
        print(f"{dtype}: file {r['file_mb']:.1f} MB; translations equal to the CLI's {shares}; "
              f"max |p_page - p_model| {r['max_dp']:.2e} over {r['rows']} rows; attribution rows of "
              f"{r['attributed']} sentences, largest |page - CLI| / row scale: {rows}; "
              f"{'meets' if ok else 'FAILS'} the rule (>= {100 * AGREEMENT:g} %, <= {P_TOLERANCE:g}, "
              f"<= {ROW_TOLERANCE:g})")
        for b, pairs in r["differing"].items():
            for s, c, m in pairs[:5]:
                print(f"  beam {b} differs: {s} | CLI: {c} | page: {m}")


if __name__ == "__main__":
    main()
