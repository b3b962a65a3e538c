"""The lab page's budgets in headless Chromium, from the exported file opened offline (nothing asserted: printed).

    python -m benchmarks.lab_budgets [--model runs/default | --default-shape] [--skip-training]

- the file's size (budget 25 MB) and the time until window.glassformer.ready;
- saliency of a one-sentence translation (budget 0.5 s) and integrated gradients at 32 steps (budget 10 s) of
  他每天早上喝一杯茶。 teacher-forced with its ten-token translation, computed in the page's worker (the first call
  also starts the worker and copies the model into it);
- attribution patching (one backward pass) of the lesson's sentence;
- train({task: "reverse"}), the default reversal toy: steps, seconds and held-out accuracy (budget: 99 % within
  60 s);
- while each runs, how late the page's own thread answers a 50 ms timer (the tab stays responsive: a few ms).
Chromium as the tests drive it (/usr/bin/chromium through Playwright). The machine's cores and load are printed
with the numbers: on a shared machine they are noisy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

SENTENCE = "他每天早上喝一杯茶。"
TARGET = "He drinks a cup of tea every morning."      # teacher-forced: ten rows whatever the model (a seeded model's
                                                      # greedy output runs to its length limit)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

# runs `work` (a function of window.glassformer returning a Promise) and meanwhile a 50 ms timer on the page's
# thread: {value, seconds, late_ms (the largest lateness of the timer)}
TIMED = """async (work) => {
  const run = new Function("g", "return " + work);
  let done = false; const late = [];
  const start = performance.now();
  const job = run(window.glassformer).then((v) => { done = true; return v; }, (e) => { done = true; throw e; });
  let last = performance.now();
  while (!done) {
    await new Promise((r) => setTimeout(r, 50));
    const t = performance.now(); late.push(t - last - 50); last = t;
  }
  const value = await job;
  return { value, seconds: (performance.now() - start) / 1000, late_ms: Math.max(0, ...late) };
}"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a run folder (default: runs/default, as the CLI)")
    parser.add_argument("--default-shape", action="store_true", help="a seeded model of the default preset's shape")
    parser.add_argument("--skip-training", action="store_true", help="leave out the reversal toy (a minute)")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    from benchmarks.lab_float16 import default_shaped_lab
    from glassformer.lab.api import LabAPI, load_model
    from glassformer.lab.export import write_export
    from glassformer.lesson import claims

    lab = default_shaped_lab() if args.default_shape else load_model(args.model, required=args.model is not None)
    api = LabAPI(lab, run_claims=lambda: [claims.run_check(c) for c in ("A1", "B3", "C1")])
    load = os.getloadavg()
    print(f"model: {lab.origin} ({sum(p.numel() for p in lab.model.parameters()):,} parameters); "
          f"{os.cpu_count()} cores, load average {load[0]:.1f} (noisy when others share the machine)")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        out = Path(tmp) / "lab.html"
        size = write_export(api, out)
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_context().new_page()
        outside: list[str] = []
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                   else (outside.append(r.request.url), r.abort()))
        start = time.perf_counter()
        page.goto(out.as_uri() + "#block")
        page.wait_for_function("() => window.glassformer !== undefined", timeout=60000)
        page.evaluate("() => window.glassformer.ready")
        ready = time.perf_counter() - start
        print(f"file {size / 1e6:.1f} MB (budget 25 MB); ready {ready:.2f} s")
        saliency = f"g.attribute('{SENTENCE}', '{TARGET}', {{method: 'saliency'}})"
        patching = ("window.LAB_LIVE.patch({clean: '我昨天给了他一本书。', corrupt: '我昨天给了她一本书。', "
                    "target: 'I gave him a book yesterday.', predict: 'him', method: 'attribution'})")
        cases = [
            ("saliency, first call (starts the worker)", saliency, 0.5),
            ("saliency", saliency, 0.5),
            ("input x gradient", f"g.attribute('{SENTENCE}', '{TARGET}', {{method: 'input-x-gradient'}})", None),
            ("integrated gradients, 32 steps", f"g.attribute('{SENTENCE}', '{TARGET}', {{steps: 32}})", 10.0),
            ("attribution patching", patching, None),
        ]
        if not args.skip_training:
            cases.append(("train({task: 'reverse'})", "g.train({task: 'reverse'}).then((r) => ({steps: r.steps, "
                          "seconds: r.seconds, accuracy: r.accuracy}))", 60.0))
        for name, work, budget in cases:
            r = page.evaluate(TIMED, work)
            extra = ""
            if isinstance(r["value"], dict) and "accuracy" in r["value"]:
                v = r["value"]
                extra = f"; {v['steps']} steps, held-out accuracy {100 * v['accuracy']:.1f} % (budget 99 %)"
            shown = f" (budget {budget:g} s)" if budget else ""
            print(f"{name}: {r['seconds']:.2f} s{shown}{extra}; the page's thread at most {r['late_ms']:.0f} ms late")
        print(f"requests that left the file: {len(outside)}")
        browser.close()


if __name__ == "__main__":
    main()
