#!/usr/bin/env bash
# First half of the GPU round trip, on a machine without a GPU: builds the GPU test
# binaries, the benchmarks (memory, rows, gemm, gemm_criterion), the quickstart
# example and the GEMM examples (user_gemm_unaligned: a user GEMM at M4095 N4097 K4096
# beside ops::gemm) in release mode, strips them and collects them with the host script
# in .gpu/ (git-ignored; carry it to the GPU host). Built with `--cfg kfuse_gpu`: the GPU-only
# tests, ignored in an ordinary build (CI counts them as skipped), run in these binaries
# and fail where no GPU is found. With KFUSE_CANDLE=1 also the candle interop's test and
# example (feature `candle-cuda`: nvcc and link stubs from scripts/candle-cuda-env.sh);
# run them there with `KFUSE_CANDLE=1 .gpu/gpu-run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg kfuse_gpu"
rm -rf .gpu && mkdir -p .gpu/bin
collect() { # cargo JSON on stdin → "name path" lines for executables; a bench named like
  # a test (benches/rows.rs beside tests/rows.rs) is collected as NAME_bench
  python3 -c '
import json, sys
arts = []
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        arts.append((m["target"]["name"], m["target"]["kind"], m["executable"]))
tests = {n for n, k, _ in arts if "bench" not in k}
for n, k, path in arts:
    print(n + "_bench" if "bench" in k and n in tests else n, path)'
}
{
  cargo test --release --no-run --message-format=json --test gpu --test errors --test user_kernels --test rope --test rows --test gpu_gemm --test gpu_gemm_f32 --test gpu_gemm_tf32 --test gpu_gemm_swiglu --test gpu_gemm_fp8 --test gpu_gemm_ex --test gemm_grouped --test autotune --test loops --test masks --test attention --test attention_op --test gathers --test conv2d --test interpreter_tiles --test large_tensors --test launch_index --test six_dim_operands
  cargo test --release --no-run --message-format=json -p kfuse-runtime --lib --test gpu_runtime --test vendor_fp8 --test compile_once --test memory_pool
  cargo bench --no-run --message-format=json --bench memory --bench rows --bench gemm --bench gemm_grouped --bench gemm_criterion --bench epilogue --bench attention --bench conv2d
  cargo build --release --message-format=json --example quickstart --example gemm_sustained --example launch_host --example cold_start --example user_gemm_unaligned
  if [ -n "${KFUSE_CANDLE:-}" ]; then
    source scripts/candle-cuda-env.sh >&2
    cargo test --release --no-run --message-format=json --features candle-cuda --test candle
    cargo build --release --message-format=json --features candle-cuda --example candle_custom_op
  fi
} 2>/dev/null | collect | while read -r name path; do
  cp "$path" ".gpu/bin/$name"
done
strip .gpu/bin/* 2>/dev/null || true
cp scripts/gpu-run.sh scripts/sanitize.sh scripts/gemm-sass.sh scripts/bench_torch.py scripts/bench_torch_memory.py scripts/bench_torch_gelu.py scripts/bench_torch_attention.py scripts/bench_torch_conv.py scripts/torch_timing.py scripts/compare_rows.py .gpu/
ls -la .gpu/bin
du -sh .gpu
