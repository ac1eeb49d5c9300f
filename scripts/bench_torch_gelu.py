#!/usr/bin/env python3
"""PyTorch's bias + GELU (erf) after a GEMM, for the fused-epilogue comparison of
`benches/epilogue.rs` and the gemm bench's fused table: `F.gelu(x + bias)` eagerly (two
kernels), the same under `torch.compile` (one generated kernel) when it is available, and
`torch.matmul` + the eager pair, on bf16 [N, N] for N = 4096 and 8192. Timed like the Rust
benchmarks: CUDA events around each call, 10 warm-ups, 50 timed calls, median, no L2
eviction (the GEMM output the kernel reads is as warm as it is in the two-kernel pipeline).

Usage: python3 scripts/bench_torch_gelu.py
"""
import torch
import torch.nn.functional as F

from torch_timing import median_ms


def bench(fn):
    return median_ms(fn, 10, 50) * 1e3  # µs


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| N | F.gelu(x + bias) eager | torch.compile | cuBLAS (torch.matmul) | matmul + eager pair |")
    print("|---|---|---|---|---|")
    for n in (4096, 8192):
        a = torch.rand(n, n, device="cuda", generator=g, dtype=torch.float32).sub_(0.5).to(torch.bfloat16)
        b = torch.rand(n, n, device="cuda", generator=g, dtype=torch.float32).sub_(0.5).to(torch.bfloat16)
        x = torch.rand(n, n, device="cuda", generator=g, dtype=torch.float32).sub_(0.5).to(torch.bfloat16)
        bias = torch.rand(n, device="cuda", generator=g, dtype=torch.float32).sub_(0.5).to(torch.bfloat16)
        eager = bench(lambda: F.gelu(x + bias))
        try:
            f = torch.compile(lambda t, c: F.gelu(t + c))
            f(x, bias)
            comp = f"{bench(lambda: f(x, bias)):.1f} µs"
        except Exception as err:  # no triton / compiler on this machine
            comp = f"unavailable ({type(err).__name__})"
        mm = bench(lambda: torch.matmul(a, b))
        pair = bench(lambda: F.gelu(torch.matmul(a, b) + bias))
        print(f"| {n} | {eager:.1f} µs | {comp} | {mm:.1f} µs | {pair:.1f} µs |")


if __name__ == "__main__":
    main()
