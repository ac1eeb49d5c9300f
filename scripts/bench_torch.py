#!/usr/bin/env python3
"""PyTorch on the ops and shapes of `benches/rows.rs`, for the comparison table.

torch.softmax, F.rms_norm (with weight), F.layer_norm (weight and bias), x.sum(-1) and a
copy of x (reference) on bf16 M x N = 32768x1024, 8192x4096, 4096x16384, 1024x131072,
256x262144; timed as in the Rust benchmark: CUDA events around each call, the L2 evicted
before each by reading a 256 MiB buffer (outside the timed interval), 10 warm-ups, 50
timed calls, median (triton's do_bench flushes with a memset instead, which leaves dirty
lines the timed kernel then writes back); GB/s counted as in the Rust benchmark (each
input read once, each output written once; PyTorch's forward writes no statistics); the
fraction of a device-to-device copy of 2^28 bf16 measured in this process.

Usage: python3 scripts/bench_torch.py [OUT_DIR]   (default: $KFUSE_BENCH_OUT, else .)
Writes OUT_DIR/torch_rows.json and prints a table.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

SHAPES = [(32768, 1024), (8192, 4096), (4096, 16384), (1024, 131072), (256, 262144)]
EPS = 1e-5


_FLUSH = None


def bench(fn, warmup=10, iters=50):
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.randn(32768, 4096, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(warmup + iters):
        _FLUSH.sum(-1)  # read 256 MiB: the L2 now holds clean lines of another buffer
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        if i >= warmup:
            times.append((start, end))
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times)
    return ms[len(ms) // 2]


def rms_norm(x, w):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps=EPS)
    xf = x.float()  # PyTorch < 2.4: the same math, unfused
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KFUSE_BENCH_OUT", ".")
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    torch.manual_seed(0)

    a = torch.randn(1 << 28, device=dev, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    copy_ms = bench(lambda: b.copy_(a))
    copy_gbps = 2 * a.numel() * 2 / copy_ms / 1e6
    del a, b

    rows = []
    print(f"{props.name}, torch {torch.__version__}, copy {copy_gbps:.0f} GB/s")
    for m, n in SHAPES:
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        xb, vb = m * n * 2, n * 2
        cases = [
            ("softmax", lambda: torch.softmax(x, -1), 2 * xb),
            ("rms_norm", lambda: rms_norm(x, w), 2 * xb + vb),
            ("layer_norm", lambda: F.layer_norm(x, (n,), w, bias, eps=EPS), 2 * xb + 2 * vb),
            ("sum", lambda: x.sum(-1), xb + m * 2),
            ("copy", lambda: y.copy_(x), 2 * xb),
        ]
        for op, fn, nbytes in cases:
            try:
                ms = bench(fn)
                gbps = nbytes / ms / 1e6
                rows.append({"op": op, "M": m, "N": n, "status": "ok", "ms": ms, "gbps": gbps, "fraction_of_copy": gbps / copy_gbps})
                print(f"{op:12s} {m}x{n:<8d} {ms:8.4f} ms {gbps:7.0f} GB/s {100 * gbps / copy_gbps:6.1f}%", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                rows.append({"op": op, "M": m, "N": n, "status": "failed", "note": str(e)[:200]})
                print(f"{op:12s} {m}x{n:<8d} failed: {str(e)[:200]}", flush=True)
        del x, w, bias, y
        torch.cuda.empty_cache()

    out = {"device": props.name, "torch": torch.__version__, "copy_ms": copy_ms, "copy_gbps": copy_gbps, "rows": rows}
    with open(os.path.join(out_dir, "torch_rows.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
