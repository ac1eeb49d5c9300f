#!/usr/bin/env bash
# Second half of the GPU round trip, on the GPU host (no Rust there): runs the GPU
# tests (required to find a GPU), the quickstart and the benchmarks (memory-bound kernels;
# row kernels beside PyTorch, joined by compare_rows.py; GEMM beside cuBLAS/cuBLASLt);
# full logs go to the folder given as $1 (default ./gpu-logs); a short table is printed
# last.
#   usage: .gpu/gpu-run.sh [LOG_DIR] [--no-bench] [--sanitize] [--gemm]
#   --sanitize: also .gpu/sanitize.sh (compute-sanitizer memcheck and racecheck, < 10 min)
#   --gemm: only the GEMM benchmark and the unaligned user GEMM (no tests, no other benchmark)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
logs="${1:-$PWD/gpu-logs}"; shift || true
mkdir -p "$logs"
bench=1; sanitize=0; gemm_only=0
for a in "$@"; do
  case "$a" in --no-bench) bench=0 ;; --sanitize) sanitize=1 ;; --gemm) gemm_only=1 ;; esac
done
export KFUSE_REQUIRE_GPU=1
export KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}"
# cuBLAS / cuBLASLt (the GEMM baselines and their test) are loaded by name: make the
# toolkit's libcublas.so.13 visible even where the loader's cache lacks it
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# after them, PyTorch's pip copies (cuBLAS, cuRAND, NVRTC, the runtime), for programs that
# link them (the candle interop's)
pip_cuda=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null || true)
[ -n "$pip_cuda" ] && [ -d "$pip_cuda" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$pip_cuda"
rows=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$logs/device.txt" 2>&1 || true
gemm_bench() { # the GEMM benchmark beside cuBLAS; one summary row
  local bin="$here/bin/gemm_bench"; [ -x "$bin" ] || bin="$here/bin/gemm"
  if [ ! -x "$bin" ]; then rows+=("bench gemm: MISSING"); return; fi
  KFUSE_BENCH_OUT="$logs" "$bin" --table-only > "$logs/bench-gemm.log" 2>&1
  local rc=$?
  rows+=("bench gemm: rc=$rc $(grep -m1 '^gemm summary:' "$logs/bench-gemm.log" | sed 's/^gemm summary: //')")
}
user_gemm_unaligned() { # a user GEMM at M4095 N4097 K4096 (padded operand copy) beside ops::gemm
  local bin="$here/bin/user_gemm_unaligned"
  if [ ! -x "$bin" ]; then rows+=("user gemm unaligned: MISSING"); return; fi
  "$bin" > "$logs/user-gemm-unaligned.log" 2>&1
  local rc=$?
  rows+=("user gemm unaligned: rc=$rc $(grep -m1 '^user_gemm_unaligned summary:' "$logs/user-gemm-unaligned.log" | sed 's/^user_gemm_unaligned summary: //')")
}
if [ "$gemm_only" = 1 ]; then
  gemm_bench
  user_gemm_unaligned
  echo "=== device: $(cat "$logs/device.txt")"
  [ -f "$logs/gemm.md" ] && cat "$logs/gemm.md"
  printf '%s\n' "${rows[@]}"
  exit 0
fi
for t in ${KFUSE_TESTS:-gpu errors user_kernels rope rows gpu_gemm gpu_gemm_f32 gpu_gemm_tf32 gpu_gemm_swiglu gpu_gemm_fp8 gpu_gemm_ex gemm_grouped autotune loops masks attention attention_op gathers conv2d interpreter_tiles kfuse_runtime gpu_runtime vendor_fp8 compile_once memory_pool large_tensors launch_index six_dim_operands ${KFUSE_CANDLE:+candle}}; do
  bin="$here/bin/$t"
  [ -x "$bin" ] || { rows+=("test $t: MISSING"); continue; }
  # snapshot tests compare against files of the build machine's checkout: skipped here
  "$bin" --test-threads=1 --show-output --skip snapshot > "$logs/test-$t.log" 2>&1
  rc=$?
  sum=$(grep -E "^test result:" "$logs/test-$t.log" | tail -1)
  # a GPU-only test left ignored: the binary was not built by gpu-build.sh (--cfg kfuse_gpu)
  unbuilt=$(grep -c "ignored, needs a GPU" "$logs/test-$t.log")
  [ "$unbuilt" -gt 0 ] && sum="$sum (WARNING: $unbuilt GPU-only tests ignored: not built with --cfg kfuse_gpu)"
  rows+=("test $t: rc=$rc ${sum:-no summary}")
done
if [ "$sanitize" = 1 ]; then
  # memcheck and racecheck over every op's GPU tests (sanitize.sh says which and why)
  "$here/sanitize.sh" "$logs" > "$logs/sanitize.log" 2>&1
  rows+=("compute-sanitizer: rc=$? $(tail -1 "$logs/sanitize-summary.txt" 2>/dev/null) (per run: $logs/sanitize-summary.txt)")
fi
"$here/bin/quickstart" > "$logs/quickstart.log" 2>&1
rows+=("quickstart: rc=$? $(grep -m1 'ran ' "$logs/quickstart.log")")
# candle interop (built by `KFUSE_CANDLE=1 gpu-build.sh`): cudarc links the CUDA libraries
# there, which the loader finds in the toolkit's folders above
if [ -x "$here/bin/candle_custom_op" ]; then
  "$here/bin/candle_custom_op" > "$logs/candle-custom-op.log" 2>&1
  rows+=("candle custom op: rc=$? $(grep -m1 'max |' "$logs/candle-custom-op.log")")
fi
if [ "$bench" = 1 ]; then
  KFUSE_BENCH_OUT="$logs" "$here/bin/memory" --table-only > "$logs/bench.log" 2>&1
  rows+=("bench: rc=$?")
  # copy and add at 16, 64 and 512 MiB beside PyTorch's copy_ of the same bytes
  python3 "$here/bench_torch_memory.py" "$logs" > "$logs/bench-torch-memory.log" 2>&1
  rows+=("bench torch memory: rc=$?")
  # PyTorch on the row ops (softmax, RMSNorm, LayerNorm, sum), then kfuse on the same
  # shapes (its chart, rows.svg, puts PyTorch's torch_rows.json beside it), joined
  python3 "$here/bench_torch.py" "$logs" > "$logs/bench-torch.log" 2>&1
  rows+=("bench torch: rc=$?")
  KFUSE_BENCH_OUT="$logs" "$here/bin/rows_bench" --table-only > "$logs/bench-rows.log" 2>&1
  rows+=("bench rows: rc=$?")
  python3 "$here/compare_rows.py" "$logs" > "$logs/compare-rows.log" 2>&1
  rows+=("compare rows: rc=$?")
  gemm_bench
  user_gemm_unaligned
  # attention: PyTorch's cuDNN, FA2 and FlexAttention, then kfuse beside them
  python3 "$here/bench_torch_attention.py" "$logs" > "$logs/bench-torch-attention.log" 2>&1
  rows+=("bench torch attention: rc=$?")
  KFUSE_BENCH_OUT="$logs" "$here/bin/attention_bench" > "$logs/bench-attention.log" 2>&1
  rows+=("bench attention: rc=$?")
  # convolution: cuDNN through PyTorch, then kfuse beside it
  python3 "$here/bench_torch_conv.py" "$logs" > "$logs/bench-torch-conv.log" 2>&1
  rows+=("bench torch conv: rc=$?")
  KFUSE_BENCH_OUT="$logs" "$here/bin/conv2d_bench" > "$logs/bench-conv2d.log" 2>&1
  rows+=("bench conv2d: rc=$?")
fi
echo "=== device: $(cat "$logs/device.txt")"
[ -f "$logs/bench.md" ] && cat "$logs/bench.md"
[ -f "$logs/memory_compare.md" ] && { echo; cat "$logs/memory_compare.md"; }
[ -f "$logs/rows_compare.md" ] && { echo; cat "$logs/rows_compare.md"; }
[ -f "$logs/gemm.md" ] && { echo; cat "$logs/gemm.md"; }
[ -f "$logs/attention.md" ] && { echo; cat "$logs/attention.md"; }
[ -f "$logs/conv2d.md" ] && { echo; cat "$logs/conv2d.md"; }
printf '%s\n' "${rows[@]}"
