"""The page engine's gradient budgets in Node: attribution on the default translator's shape, and the Train view's
default reversal toy.

    python -m benchmarks.engine_js [--model runs/default] [--sentences N] [--ig-steps 32] [--seeds 1,2,3,4,5]
                                   [--skip-attribution] [--skip-train] [--out FILE.json]

Attribution: a model of the default preset's shape (d 192, 2+2 layers, 5.8 M parameters; seeded weights unless
--model names a run folder), the lesson's sentence and the first HSK test sentences, teacher-forced on their
references (every row, EOS included). Printed per sentence: one forward pass, one backward pass (one row's
objective, the inputs' gradients only), saliency of every row (docs/lab.md's budget: 0.5 s) and integrated
gradients with --ig-steps fixed trapezoid steps (budget: 10 s), best of 3 except integrated gradients (once).
Training: `runTraining` with the default options (task reverse) for each seed: steps and seconds until the
validation set is solved, ms per step, held-out exact-match accuracy (budget: 99 % within 60 s in Chromium, 40 s in
Node) and the share of the held-out example's target rows whose cross-attention peaks on the mirrored source
position (budget: 80 %). Nothing is asserted; the machine's load average is printed beside the numbers, and each
time comes with the CPU time the process spent (close to what an idle core takes when other jobs share the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

RUNNER = Path(__file__).with_name("engine_js.mjs")
ENGINE = Path(__file__).resolve().parents[1] / "src" / "glassformer" / "lab" / "static" / "engine"


def _model_and_tokenizers(run: str | None):
    """(model, source tokenizer, target tokenizer): a run folder's, or the default preset's shape with seeded
    weights and the preset's tokenizers."""
    import torch

    if run:
        from glassformer.data.checkpoint import load_translator_parts

        model, source, target, _ = load_translator_parts(Path(run))
        return model.eval(), source, target
    from glassformer.model import ModelConfig, Transformer
    from glassformer.training.prepare_data import prepare_data
    from glassformer.training.settings import preset_settings

    recipe = preset_settings("default")
    data = prepare_data(recipe)
    cfg = ModelConfig(**recipe.model.model_dump(), src_vocab=data.source.vocab_size, tgt_vocab=data.target.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Transformer(cfg)
    return model.eval(), data.source, data.target


def _sentences(source, target, n: int) -> list[dict]:
    from glassformer.data.datasets import load_split
    from glassformer.lesson import examples

    pairs = [(examples.LESSON_SENTENCE, examples.LESSON_TARGET)]
    pairs += [(p.zh, p.en) for p in load_split("test")][: max(0, n - 1)]
    out = []
    for zh, en in pairs:
        enc = source.analyse(zh)
        if enc.ids:
            out.append({"src": enc.ids, "out": target.encode(en), "units": enc.units, "text": zh})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a run folder (default: the default preset's shape, seeded weights)")
    parser.add_argument("--sentences", type=int, default=3)
    parser.add_argument("--ig-steps", type=int, default=32)
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--skip-attribution", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--out", help="write the numbers as JSON")
    args = parser.parse_args(argv)
    node = shutil.which("node")
    if node is None:
        raise SystemExit("needs Node.js (node) on PATH")
    with tempfile.TemporaryDirectory() as folder:
        job: dict = {"bundle": None, "sentences": [], "ig_steps": args.ig_steps,
                     "train": [] if args.skip_train else [{"seed": int(s)} for s in args.seeds.split(",")]}
        if not args.skip_attribution:
            from glassformer.lab.bundle import write_bundle

            model, source, target = _model_and_tokenizers(args.model)
            bundle = Path(folder) / "bundle.json"
            bundle.write_text(json.dumps(write_bundle(model, (source, target))))
            job["bundle"], job["sentences"] = str(bundle), _sentences(source, target, args.sentences)
            print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters, d {model.cfg.d_model}, "
                  f"{model.cfg.encoder_layers}+{model.cfg.decoder_layers} layers, {model.cfg.tgt_vocab} target tokens")
        (Path(folder) / "job.json").write_text(json.dumps(job))
        done = subprocess.run([node, str(RUNNER), str(ENGINE), str(Path(folder) / "job.json"),
                               str(Path(folder) / "out.json")], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        out = json.loads((Path(folder) / "out.json").read_text())
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores "
          f"(node {subprocess.run([node, '--version'], capture_output=True, text=True).stdout.strip()})")
    for s, t in zip(job["sentences"], out.get("sentences", []), strict=True):
        wall_cpu = {k: f"{t[k][0] / 1000:.2f} / {t[k][1] / 1000:.2f} s" for k in
                    ("forward_ms", "backward_ms", "saliency_ms", "ig_ms")}
        print(f"{s['text']}: {t['source']} units, {t['rows']} rows (wall / CPU): forward {wall_cpu['forward_ms']}, "
              f"backward {wall_cpu['backward_ms']}, saliency {wall_cpu['saliency_ms']} (budget 0.5 s), "
              f"integrated gradients {args.ig_steps} steps {wall_cpu['ig_ms']} (budget 10 s)")
    for run in out["train"]:
        print(f"reverse, seed {run['seed']}: {run['steps']} steps in {run['seconds']:.1f} s "
              f"(CPU {run['cpu_seconds']:.1f} s, {run['ms_per_step']:.1f} ms a step), held-out accuracy "
              f"{100 * run['accuracy']:.1f} % (budget 99 % in 40 s), cross-attention on the mirrored position in "
              f"{100 * run['mirrored']:.0f} % of rows (budget 80 %)")
    if args.out:
        Path(args.out).write_text(json.dumps({"load_average": os.getloadavg(), **out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
