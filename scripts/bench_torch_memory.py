#!/usr/bin/env python3
"""PyTorch's copy_ and add beside kfuse's copy and add at 16, 64 and 512 MiB a tensor.

Reads OUT_DIR/memory_mid.json (written by `.gpu/bin/memory --table-only` with
KFUSE_BENCH_OUT=OUT_DIR), times `y.copy_(x)` and `torch.add(a, b, out=c)` on bf16 tensors
of the same sizes the same way as the Rust benchmark (CUDA events around each call, the
L2 evicted before each by reading a 256 MiB buffer outside the timed interval, 10
warm-ups, 50 timed calls, median), and writes OUT_DIR/memory_compare.md: each kfuse
kernel's GB/s beside PyTorch's copy_ of the same bytes (a copy of a tensor half the
bytes of an add's three, so that both move as many bytes), and the ratio.

Usage: python3 scripts/bench_torch_memory.py OUT_DIR
"""
import json
import os
import sys

import torch

from bench_torch import bench  # the same timing and L2 eviction as the row table


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KFUSE_BENCH_OUT", ".")
    kf = json.load(open(os.path.join(out_dir, "memory_mid.json")))
    torch.manual_seed(0)
    copy_gbs = {}  # bytes moved -> PyTorch copy_ GB/s
    lines = [
        f"device: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}; kfuse: {kf['device']}",
        "",
        "| kernel | MiB a tensor | bytes moved | kfuse GB/s | PyTorch copy_ of the same bytes, GB/s | kfuse / copy_ | PyTorch same op, GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in kf["rows"]:
        if r["kernel"].startswith("device copy"):
            continue
        nbytes = int(r["bytes"])
        if nbytes not in copy_gbs:
            x = torch.rand(nbytes // 4, device="cuda").to(torch.bfloat16) * 2 - 1
            y = torch.empty_like(x)
            copy_gbs[nbytes] = nbytes / bench(lambda: y.copy_(x)) / 1e6
            del x, y
        n = r["mib"] << 19
        a = torch.rand(n, device="cuda").to(torch.bfloat16) * 2 - 1
        if r["kernel"] == "kfuse add":
            b = torch.rand(n, device="cuda").to(torch.bfloat16) * 2 - 1
            c = torch.empty_like(a)
            same = nbytes / bench(lambda: torch.add(a, b, out=c)) / 1e6
            del b, c
        else:
            c = torch.empty_like(a)
            same = nbytes / bench(lambda: c.copy_(a)) / 1e6
            del c
        del a
        gbs = nbytes / r["ms"] / 1e6
        lines.append(
            f"| {r['kernel']} | {r['mib']} | {nbytes >> 20} MiB | {gbs:.0f} | {copy_gbs[nbytes]:.0f} | {gbs / copy_gbs[nbytes]:.3f} | {same:.0f} |"
        )
    text = "\n".join(lines) + "\n"
    open(os.path.join(out_dir, "memory_compare.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
