"""glassformer on one CUDA GPU: the 2017 base model (6+6 layers, d 512, 8 heads, d_ff 2048, 32k ids each side)
with bf16 autocast. Training tokens/s with model FLOPs utilisation against the device's dense bf16 peak,
and greedy-decoding tokens/s. One command, a few minutes:

    python -m benchmarks.gpu [--out results.json]

Without CUDA it says so on one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) by a substring of torch.cuda.get_device_name().
PEAK_BF16 = {
    "H200": 989e12, "H100": 989e12, "H800": 989e12, "GH200": 989e12, "B200": 2250e12,
    "A100": 312e12, "A800": 312e12, "L40S": 362e12, "L40": 181e12, "L4": 121e12, "A10G": 70e12, "A10": 125e12,
    "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12, "T4": 65e12,
}


def device_peak(name: str) -> float | None:
    """The dense bf16 peak for a device name, longest matching key first (so "L40S" wins over "L40")."""
    for key in sorted(PEAK_BF16, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_BF16[key]
    return None


def training_flops(cfg, src_lens: list[int], tgt_lens: list[int]) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward) on the real tokens of a batch.

    Matrix products: 2 FLOPs per weight per token forward (encoder weights on source tokens, decoder
    weights and the vocabulary head on target tokens). Attention: Q K^T and weights . V, 2 x 2 n_q n_k d
    forward per layer (self: S x S and T x T; cross: T x S).
    """
    d, ff = cfg.d_model, cfg.d_ff
    attn_w = 4 * d * d + 4 * d                                 # in_proj (3 d^2) + out_proj (d^2), biases
    ffn_w = 2 * d * ff + d + ff
    enc_w, dec_w = attn_w + ffn_w, 2 * attn_w + ffn_w
    forward = 0.0
    for s, t in zip(src_lens, tgt_lens, strict=True):
        forward += 2 * (cfg.encoder_layers * enc_w * s + (cfg.decoder_layers * dec_w + d * cfg.tgt_vocab) * t)
        forward += 4 * d * (cfg.encoder_layers * s * s + cfg.decoder_layers * (t * t + t * s))
    return 3 * forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128, help="sentence pairs per training step")
    parser.add_argument("--length", type=int, default=64, help="longest sentence (lengths: half of it to it)")
    parser.add_argument("--steps", type=int, default=30, help="timed training steps")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks.gpu: error: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if args.batch < 1 or args.steps < 1 or not 2 <= args.length <= 256:
        print("benchmarks.gpu: error: need --batch >= 1, --steps >= 1, 2 <= --length <= 256", file=sys.stderr)
        return 2

    from glassformer.model import ModelConfig, Transformer

    torch.manual_seed(0)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = device_peak(name)
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = ModelConfig.base(src_vocab=32000, tgt_vocab=32000, max_len=512)
    model = Transformer(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def batch(seed: int):
        g = torch.Generator().manual_seed(seed)
        lo = max(1, args.length // 2)
        src_lens = torch.randint(lo, args.length + 1, (args.batch,), generator=g).tolist()
        tgt_lens = torch.randint(lo, args.length + 1, (args.batch,), generator=g).tolist()
        src = torch.zeros(args.batch, max(src_lens), dtype=torch.long)
        tgt_in = torch.zeros(args.batch, max(tgt_lens), dtype=torch.long)
        labels = torch.zeros(args.batch, max(tgt_lens), dtype=torch.long)
        for r, (s, t) in enumerate(zip(src_lens, tgt_lens, strict=True)):
            src[r, :s] = torch.randint(4, 32000, (s,), generator=g)
            tgt_in[r, :t] = torch.randint(4, 32000, (t,), generator=g)
            labels[r, :t] = torch.randint(4, 32000, (t,), generator=g)
        return src.to(device), tgt_in.to(device), labels.to(device), src_lens, tgt_lens

    batches = [batch(i) for i in range(8)]

    def train_step(b):
        src, tgt_in, labels = b[:3]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            total, n = model.loss(src, tgt_in, labels, label_smoothing=0.1)
        (total / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model.train()
    for i in range(5):                                                       # warm-up: kernels, allocator
        train_step(batches[i % len(batches)])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    tokens, flops = 0, 0.0
    for i in range(args.steps):
        b = batches[i % len(batches)]
        train_step(b)
        tokens += sum(b[4])
        flops += training_flops(cfg, b[3], b[4])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    train = {"tokens_per_s": tokens / seconds, "tflops_per_s": flops / seconds / 1e12,
             "mfu": (flops / seconds / peak) if peak else None, "steps": args.steps, "batch": args.batch,
             "max_length": args.length, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}

    model.eval()
    decode = {}
    for b in (1, 64):
        src = torch.randint(4, 32000, (b, 32), device=device)

        @torch.inference_mode()
        def greedy(src=src, n_new=64):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                src_pad = src == 0
                memory = model.encode(src, src_pad)
                cache = model.new_cache()
                token = torch.ones(src.size(0), 1, dtype=torch.long, device=device)
                for _ in range(n_new):
                    token = model.decode_step(token, memory, src_pad, cache)[:, -1].argmax(-1, keepdim=True)
            return token

        greedy()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            greedy()
        torch.cuda.synchronize()
        decode[f"greedy_b{b}_tokens_per_s"] = 3 * b * 64 / (time.perf_counter() - t0)

    result = {"device": name, "peak_bf16_flops": peak, "torch": torch.__version__, "config": cfg.to_dict(),
              "training": train, "decoding": decode}
    mfu = f"{100 * train['mfu']:.1f}%" if train["mfu"] is not None else "n/a (device not in the peak table)"
    print(f"device: {name}; torch {torch.__version__}; base model, bf16 autocast, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters")
    print("| measure | value |\n|---|---:|")
    print(f"| training tokens/s (real target tokens) | {train['tokens_per_s']:,.0f} |")
    print(f"| model TFLOP/s | {train['tflops_per_s']:.1f} |")
    print(f"| MFU vs dense bf16 peak | {mfu} |")
    print(f"| peak memory | {train['peak_memory_gib']:.1f} GiB |")
    for key, value in decode.items():
        print(f"| {key.replace('_', ' ')} | {value:,.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
