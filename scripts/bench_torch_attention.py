#!/usr/bin/env python3
"""PyTorch's attention forward for the rows of `benches/attention.rs`: cuDNN SDPA, the
FlashAttention-2 backend and FlexAttention (Triton, through torch.compile) on bf16
`[B, H, S, D]` tensors, B*S = 16k tokens, H*D = 2048 (the FA3 paper's setting), plus GQA
(Hq 32, Hkv 8, D128). Timed like the Rust benchmark: CUDA events around each call, 5
warm-ups, 20 timed calls, median. TFLOP/s = 4*B*Hq*Sq*Skv*D / time, halved when causal.

Usage: python3 scripts/bench_torch_attention.py DIR   (writes DIR/torch_attention.json,
which `benches/attention.rs` reads from KFUSE_BENCH_OUT to print both side by side)
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import median_ms


def bench(fn):
    return median_ms(fn, 5, 20)

# (name, D, S, causal, Hq, Hkv): the rows of benches/attention.rs
ROWS = [(f"D{d} S{s}" + (" causal" if c else ""), d, s, c, 2048 // d, 2048 // d)
        for d in (128, 64, 256) for s in (4096, 16384) for c in (False, True)]
ROWS += [("GQA Hq32 Hkv8 D128 S4096" + (" causal" if c else ""), 128, 4096, c, 32, 8) for c in (False, True)]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        flex = None
        print("FlexAttention unavailable:", str(e)[:200])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    for name, d, s, causal, hq, hkv in ROWS:
        b = max(1, 16384 // s)
        q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = 4 * b * hq * s * s * d / (2 if causal else 1)
        row = {}
        for backend, label in [(SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "fa2")]:
            try:
                with sdpa_kernel(backend):
                    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv))
                row[label] = flops / ms / 1e9
            except Exception as e:  # noqa: BLE001
                print(f"{name} {label}: {str(e)[:120]}")
        if flex is not None and d <= 128 and s == 4096 and hq == hkv:
            try:
                mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, s, s, device="cuda") if causal else None
                with torch.no_grad():
                    ms = bench(lambda: flex(q, k, v, block_mask=mask))
                row["flex"] = flops / ms / 1e9
            except Exception as e:  # noqa: BLE001
                print(f"{name} flex: {str(e)[:120]}")
        print(name, {k2: round(x, 1) for k2, x in row.items()}, flush=True)
        result["rows"][name] = row
        del q, k, v
    with open(os.path.join(out, "torch_attention.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
