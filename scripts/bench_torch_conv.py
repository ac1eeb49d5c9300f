#!/usr/bin/env python3
"""cuDNN's convolution forward (through PyTorch, `cudnn.benchmark = True`) for the rows of
`benches/conv2d.rs`: N64, channels_last, bf16 ResNet layers, depthwise 3x3 layers, the
first layer with bias + ReLU as PyTorch runs it (`relu(conv2d(x, w, b))`: the convolution,
then a ReLU kernel), and the 3x3 stride-1 layers in f32 with a bias (TF32 off). Timed
like the Rust benchmark: CUDA events around each call, warm-ups for about 300 ms, timed
calls for about 100 ms, median. TFLOP/s = 2*N*K*P*Q*C*R*S / time; depthwise GB/s = the
input and output bytes / time.

Usage: python3 scripts/bench_torch_conv.py DIR   (writes DIR/torch_conv.json, which
`benches/conv2d.rs` reads from KFUSE_BENCH_OUT to print both side by side)
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

from torch_timing import median_ms_for as bench

# (name, C, K, H, R, stride): the dense rows of benches/conv2d.rs (padding R // 2)
DENSE = [("C64 K64 3x3 56", 64, 64, 56, 3, 1), ("C256 K64 1x1 56", 256, 64, 56, 1, 1),
         ("C128 K128 3x3 28", 128, 128, 28, 3, 1), ("C256 K256 3x3 14", 256, 256, 14, 3, 1),
         ("C512 K512 3x3 7", 512, 512, 7, 3, 1), ("C256 K512 1x1 s2 56", 256, 512, 56, 1, 2),
         ("C128 K128 3x3 s2 56", 128, 128, 56, 3, 2)]
DEPTHWISE = [("dw C256 56", 256, 56), ("dw C512 28", 512, 28), ("dw C1024 14", 1024, 14)]
N = 64


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    torch.backends.cudnn.benchmark = True
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", flush=True)
    rows = {}
    for name, c, k, h, r, st in DENSE:
        x = torch.randn(N, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        p = (h + 2 * (r // 2) - r) // st + 1
        flops = 2 * N * k * p * p * c * r * r
        ms = bench(lambda: F.conv2d(x, w, padding=r // 2, stride=st))
        rows[name] = {"cudnn": flops / ms / 1e9}
        if name == DENSE[0][0]:
            b = torch.randn(k, device="cuda", dtype=torch.bfloat16)
            ms = bench(lambda: torch.relu(F.conv2d(x, w, b, padding=r // 2, stride=st)))
            rows[name + " bias relu"] = {"cudnn": flops / ms / 1e9}
        print(name, {k2: round(v, 1) for k2, v in rows[name].items()}, flush=True)
    # f32 with TF32 off (exact products, as kfuse's f32): the 3x3 stride-1 rows, `NAME f32`
    torch.backends.cudnn.allow_tf32 = False
    for name, c, k, h, r, st in DENSE:
        if r != 3 or st != 1:
            continue
        x = torch.randn(N, c, h, h, device="cuda", dtype=torch.float32).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.float32).to(memory_format=torch.channels_last)
        b = torch.randn(k, device="cuda", dtype=torch.float32)
        ms = bench(lambda: F.conv2d(x, w, b, padding=1))
        rows[name + " f32"] = {"cudnn": 2 * N * k * h * h * c * 9 / ms / 1e9}
        print(name + " f32", {k2: round(v, 1) for k2, v in rows[name + " f32"].items()}, flush=True)
    torch.backends.cudnn.allow_tf32 = True
    for name, c, h in DEPTHWISE:
        x = torch.randn(N, c, h, h, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.randn(c, 1, 3, 3, device="cuda", dtype=torch.bfloat16)
        ms = bench(lambda: F.conv2d(x, w, padding=1, groups=c))
        rows[name] = {"cudnn": 2 * x.numel() * 2 / ms / 1e6}
        print(name, {k2: round(v, 1) for k2, v in rows[name].items()}, flush=True)
    with open(os.path.join(out, "torch_conv.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
