#!/usr/bin/env bash
# On the GPU host, after a run that compiled GEMM kernels into the module cache
# ($KFUSE_CACHE_DIR): assembles each cached kernel that issues wgmma and counts the
# matrix instructions in its SASS (HGMMA for f16/bf16, QGMMA for fp8 tensor cores). Prints one line
# per kernel.   usage: scripts/gemm-sass.sh [CACHE_DIR]
set -uo pipefail
dir="${1:-${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}}"
export PATH=/usr/local/cuda/bin:$PATH
tmp=$(mktemp -d)
for f in "$dir"/*.ptx; do
  grep -q "wgmma.mma_async" "$f" || continue
  # the cache header ends at the first empty line
  awk 'body{print} /^$/{body=1}' "$f" > "$tmp/k.ptx"
  entry=$(grep -m1 -oE '\.entry [A-Za-z0-9_]+' "$tmp/k.ptx" | cut -d' ' -f2)
  ptxas -arch=sm_90a "$tmp/k.ptx" -o "$tmp/k.cubin" 2> "$tmp/log" || { echo "$entry: ptxas failed: $(head -1 "$tmp/log")"; continue; }
  sass=$(cuobjdump --dump-sass "$tmp/k.cubin")
  echo "$entry: HGMMA=$(grep -c HGMMA <<<"$sass") QGMMA=$(grep -c QGMMA <<<"$sass") UTMALDG=$(grep -c UTMALDG <<<"$sass") UTMASTG=$(grep -c UTMASTG <<<"$sass") HMMA=$(grep -c ' HMMA' <<<"$sass") LDL/STL=$(grep -cE 'LDL|STL' <<<"$sass")"
done
rm -rf "$tmp"
