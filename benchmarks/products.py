"""A decoding step's products, one at a time: oneDNN's packed product against MKL's, per shape (docs/performance.md).

    python -m benchmarks.products --run runs/default --rows 32 8 1 --threads 2

For every product one greedy step runs (per decoder layer: W^Q|W^K|W^V, W^O, cross-attention's W^Q and W^O, W_1,
W_2; then the head), in us a call, best of `--repeats` runs: `mkldnn._linear_pointwise` over a weight packed once
(what an AOTInductor package calls for a frozen float32 weight), `torch.addmm` over W^T (MKL), and MKL's own packed
product `mkl._mkl_linear` where this torch build has MKL. The sizes are the run's model's, the weights random.
Alone, a weight stays in cache from call to call; inside a step it does not, so these figures bound what a product
costs, they do not add up to a step.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections import Counter

import torch

from glassformer.inference.compiler import MAX_ROWS
from glassformer.options import positive


def step_products(model) -> Counter:
    """(in, out) -> how many of that product one decoding step of `model` runs, read off its own layers:
    W^Q|W^K|W^V (one product), W^O, cross-attention's W^Q and W^O, W_1, W_2 per decoder layer, then the head
    (cross-attention's W^K, W^V belong to the source side)."""
    def shape(*linears) -> tuple[int, int]:
        return linears[0].in_features, sum(m.out_features for m in linears)
    found = Counter()
    for layer in model.decoder.layers:
        a, c, f = layer.self_attention, layer.cross_attention, layer.ffn
        found.update([shape(a.w_q, a.w_k, a.w_v), shape(a.w_o), shape(c.w_q), shape(c.w_o), shape(f.w_1), shape(f.w_2)])
    found[shape(model.head)] += 1
    return found


def timed(fn, calls: int, repeats: int) -> float:
    """Best us a call over `repeats` runs of `calls` calls, after a warm-up."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - began) / calls)
    return best * 1e6


def product(rows: int, n_in: int, n_out: int, repeats: int) -> tuple[str, str, str]:
    """us a call of x (rows, n_in) W^T + b on oneDNN's packed copy, MKL's addmm and MKL's packed copy ("-": none)."""
    w, b, x = torch.randn(n_out, n_in), torch.randn(n_out), torch.randn(rows, n_in)
    wt, packed = w.t().contiguous(), torch.ops.mkldnn._reorder_linear_weight(w, rows)
    calls = max(50, 400_000 // (rows * n_in * n_out // 1000 + 1))
    onednn = timed(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""), calls, repeats)
    blas = timed(lambda: torch.addmm(b, x, wt), calls, repeats)
    if not torch.backends.mkl.is_available():
        return f"{onednn:.1f}", f"{blas:.1f}", "-"
    own = torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
    mkl_packed = timed(lambda: torch.ops.mkl._mkl_linear(x, own, w, b, rows), calls, repeats)
    return f"{onednn:.1f}", f"{blas:.1f}", f"{mkl_packed:.1f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/default", help="a run folder: its model's sizes")
    parser.add_argument("--rows", type=positive, nargs="+", default=[32, 8, 1])
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--repeats", type=positive, default=7)
    args = parser.parse_args(argv)
    if max(args.rows) > MAX_ROWS:                                            # checked before anything is allocated
        parser.error(f"--rows: at most {MAX_ROWS} (the most rows a compiled step takes), got {max(args.rows)}")
    torch.set_num_threads(args.threads)
    from glassformer.data.checkpoint import load_translator_parts
    from glassformer.errors import UsageError
    try:
        model = load_translator_parts(args.run)[0]
    except UsageError as error:
        parser.error(str(error))                                             # one line, exit status 2
    print(f"# {platform.processor() or platform.machine()}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"torch {torch.__version__}, {args.threads} threads")
    print("rows x (in -> out) x per step | oneDNN packed | MKL addmm | MKL packed (us a call)")
    for rows in args.rows:
        for (n_in, n_out), count in step_products(model).items():
            onednn, blas, mkl_packed = product(rows, n_in, n_out, args.repeats)
            print(f"{rows} x ({n_in} -> {n_out}) x {count} | {onednn} | {blas} | {mkl_packed}", flush=True)


if __name__ == "__main__":
    main()
