#!/usr/bin/env bash
# compute-sanitizer's memcheck and racecheck over the GPU tests of every op, on the GPU
# host, in under ten minutes: the test binaries of scripts/gpu-build.sh (.gpu/bin), each
# run under each tool with the tests chosen below. Prints one line per (binary, tool):
# the exit code, the seconds, the sanitizer's ERROR SUMMARY / RACECHECK SUMMARY line and
# the test harness's result, then a line of totals; the same lines go to
# LOG_DIR/sanitize-summary.txt and each run's whole output to
# LOG_DIR/sanitize-TOOL-BINARY.log.
#   usage: .gpu/sanitize.sh [LOG_DIR]            (default ./sanitize-logs)
#   KFUSE_SANITIZE_BUDGET=S  seconds for all the runs together (default 540; a run gets
#                            at most what is left, and none starts with less than 15 s)
#   KFUSE_SANITIZE_RUN_CAP=S  seconds for one run at the most (default 300)
#   KFUSE_SANITIZE_TOOLS="memcheck racecheck"  the tools (default both)
# An entry of the plan below runs each tool at most once per binary (the log's name).
# Exit status: 0 when every run that started came back clean (MISSING binaries and runs
# SKIPPED for time are counted in the totals, not failed); 1 otherwise; 2 without
# compute-sanitizer.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${KFUSE_SANITIZE_BIN:-$here/bin}"
logs="${1:-$PWD/sanitize-logs}"
mkdir -p "$logs"
budget="${KFUSE_SANITIZE_BUDGET:-540}"
cap="${KFUSE_SANITIZE_RUN_CAP:-300}"
tools="${KFUSE_SANITIZE_TOOLS:-memcheck racecheck}"
export KFUSE_REQUIRE_GPU=1
export KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}"
# (cuBLAS / cuBLASLt, the baselines some GPU tests load by name, as in gpu-run.sh)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && case ":${LD_LIBRARY_PATH:-}:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
done
cs=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$cs" ] && [ -x "$c" ] && cs="$c"
done
if [ -z "$cs" ]; then
  echo "sanitize: compute-sanitizer not found (PATH, /usr/local/cuda)" | tee "$logs/sanitize-summary.txt"
  exit 2
fi

# What runs: "BINARY|TOOLS|ARGUMENTS|what it covers". TOOLS: `mr` (memcheck and
# racecheck), `m` (memcheck only) or `r` (racecheck only). ARGUMENTS are the test
# harness's (filters, --exact, --skip), always with --test-threads=1. Left out
# everywhere: the tests that only compile or print (snapshots, `*compiles*`,
# `structure`), which launch nothing.
# Left out, with the reason:
# - the float64-reference sweeps over shapes up to 4095x4097x4095 (`*_against_float64`
#   but the batched one, `grouped_products_on_the_gpu`, gpu_gemm's wide-tile, split-K
#   and multicast tests, `user_gemm_at_m4095_n4097_k4096_on_the_tensor_cores`): their kernels are those of the poisoned-output tests that do
#   run, which write every element of odd, edge-cut shapes, at sizes whose sanitized
#   runs (and host references) take minutes;
# - rows' `three_stages` and `deterministic` (2^22- and 2^24-element reductions: the
#   kernels of `whole_tensor_reductions`, which runs), and under racecheck its
#   `long_rows*` tests (clusters of 16 on rows of 2^18: each takes racecheck over 90 s
#   on the H100; the cluster kernels run under racecheck in
#   `rows_in_clusters_of_8_and_16_on_the_gpu`);
# - the binaries that check no op's kernels at a size a sanitizer gets through: errors
#   and refusals (no launch), autotune (timing), interpreter_tiles, the runtime's
#   kfuse_runtime, vendor_fp8, compile_once and memory_pool (gpu_runtime's TMA test
#   runs), and large_tensors (2^31+ elements a launch).
# Measured on the H100 (2026-11-26) with a cold kernel cache: 374 s for all of it but
# the gpu_runtime entry (about 2 s), rows under memcheck 190 s of that; a warm cache
# (after gpu-run.sh's tests) takes less.
plan=(
  "gpu|mr||elementwise ops, copy, transpose"
  "rows|m|--skip three_stages --skip deterministic|softmax, log_softmax, RMSNorm, LayerNorm, sums and other row and whole-tensor reductions, long rows, clusters"
  "rows|r|--skip three_stages --skip deterministic --skip long_rows|the same but the long-row tests"
  "rope|mr|--skip cuda_snapshots --skip structure --skip compiles|RoPE"
  "gpu_gemm|mr|--exact gemm_kernel_runs_on_the_gpu_into_a_poisoned_output user_gemm_with_bias_gelu_epilogue padded_operand_copies_are_never_stale unaligned_views_are_copied_as_they_lie|bf16/f16 GEMM (WGMMA + TMA), fused bias + GELU, unaligned operands on padded copies"
  "gpu_gemm_f32|mr|--exact f32_user_gemm_with_bias_gelu_epilogue f32_gemm_reads_unaligned_strided_operands f32_gemm_ex_and_batched|f32 GEMM, gemm_ex, batched"
  "gpu_gemm_tf32|mr|--exact tf32_kernel_writes_every_element_of_a_poisoned_output tf32_gemm_ex_options_and_batched|tf32 GEMM, gemm_ex, batched"
  "gpu_gemm_fp8|mr|--exact fp8_kernel_writes_every_element_of_a_poisoned_output|fp8 GEMM"
  "gpu_gemm_swiglu|mr|--exact swiglu_kernel_writes_every_element_of_a_poisoned_output three_products_with_two_a_tiles|SwiGLU GEMM"
  "gemm_grouped|mr|--exact direct_grouped_launch_into_poisoned_outputs|grouped GEMM"
  "gpu_gemm_ex|mr|--exact gemm_ex_kernels_run_on_the_gpu_into_poisoned_outputs gemm_ex_with_beta_zero_ignores_c_and_k_zero_gives_beta_c gemm_batched_on_the_gpu_against_float64|gemm_ex (alpha, beta, C, output dtypes), batched"
  "attention|mr|--exact attention_against_float64|flash attention"
  "attention_op|mr|--exact attention_against_float64|kfuse::ops::attention: windows, GQA, both layouts, D 64-256"
  "gathers|mr|--skip compile|gathers and scatters (index tiles as block offsets)"
  "conv2d|mr|--skip compile --skip bad_input|kfuse::ops::conv2d: implicit GEMM, depthwise, pointwise"
  "loops|mr|--skip compiles --skip snapshots --skip refused|loops over chunks, carried tiles, nested loops"
  "masks|mr|--skip compile --skip snapshots|masks, causal softmax"
  "user_kernels|mr|--skip long_rows_use_a_cluster|user #[kfuse] kernels: row softmax, centering, column sums, RMS"
  "gpu_runtime|mr|--exact tma_tensor_map_loads_boxes|TMA tensor maps the runtime builds, through a hand-written kernel"
)

start=$(date +%s)
lines=()
n_ok=0; n_found=0; n_failed=0; n_timeout=0; n_missing=0; n_skipped=0; n_empty=0
say() { lines+=("$1"); echo "$1"; }
for entry in "${plan[@]}"; do
  IFS='|' read -r name which args what <<< "$entry"
  for tool in $tools; do
    case "$tool" in
      memcheck) [[ "$which" == *m* ]] || continue ;;
      racecheck) [[ "$which" == *r* ]] || continue ;;
      *) say "$tool $name: unknown tool"; n_failed=$((n_failed + 1)); continue ;;
    esac
    tag=$(printf '%-9s %-16s' "$tool" "$name")
    if [ ! -x "$bin/$name" ]; then
      say "$tag MISSING ($bin/$name)"; n_missing=$((n_missing + 1)); continue
    fi
    left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt 15 ]; then
      say "$tag SKIPPED (time budget of ${budget} s spent)"; n_skipped=$((n_skipped + 1)); continue
    fi
    log="$logs/sanitize-$tool-$name.log"
    [ "$left" -gt "$cap" ] && left=$cap
    t0=$(date +%s)
    echo "# $tool over $name ($what): $bin/$name --test-threads=1 $args" > "$log"
    # shellcheck disable=SC2086 # ARGUMENTS are words
    timeout -k 10 "$left" "$cs" --tool "$tool" --error-exitcode 9 --print-limit 20 \
      "$bin/$name" --test-threads=1 $args >> "$log" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
    result=$(grep -E '^test result:' "$log" | tail -1 | sed 's/; 0 measured.*//')
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      verdict="TIMEOUT after ${left} s"; n_timeout=$((n_timeout + 1))
    elif grep -qE '^running 0 tests' "$log"; then
      verdict="NO TESTS (the filter matched none)"; n_empty=$((n_empty + 1))
    elif grep -q 'ignored, needs a GPU' "$log"; then
      verdict="FAILED (GPU tests ignored: not built by gpu-build.sh, --cfg kfuse_gpu)"; n_failed=$((n_failed + 1))
    elif [ "$rc" = 9 ]; then
      verdict="FOUND"; n_found=$((n_found + 1))
    elif [ "$rc" != 0 ] || [ -z "$summary" ] || [ -z "$result" ]; then
      verdict="FAILED"; n_failed=$((n_failed + 1))
    else
      verdict="ok"; n_ok=$((n_ok + 1))
    fi
    say "$tag $verdict rc=$rc ${secs}s | ${summary:-no sanitizer summary} | ${result:-no test result}"
  done
done
total=$(($(date +%s) - start))
say "sanitize: $((n_ok + n_found + n_failed + n_timeout + n_empty)) runs in ${total} s (budget ${budget} s): $n_ok clean, $n_found with sanitizer findings, $n_failed failed, $n_timeout timed out, $n_empty ran no test; $n_missing missing, $n_skipped skipped for time"
printf '%s\n' "${lines[@]}" > "$logs/sanitize-summary.txt"
[ $((n_found + n_failed + n_timeout + n_empty)) -eq 0 ]
