#!/usr/bin/env bash
# On the GPU host, after a run that compiled GEMM kernels into the module cache
# ($KFUSE_CACHE_DIR): for each cached kernel that issues wgmma, counts the matrix
# instructions in its SASS (HGMMA for f16/bf16, QGMMA for fp8 tensor cores), the TMA
# loads and stores, mma.sync's HMMA and the local-memory accesses (spills). Prints one
# line per kernel. With ENTRY (a substring of the CUDA entry name, `kf_gemm_bias_relu`),
# every cached kernel whose entry matches is printed, wgmma or not (a kernel that fell
# back to FMAs shows HGMMA=0 FFMA=…).
#   usage: scripts/gemm-sass.sh [CACHE_DIR] [ENTRY]
# Reads the cache's `<key>.module` files (a header, then the PTX and the cubin:
# kfuse-runtime/src/cache.rs) and, from caches of older builds, `*.ptx` files; a module
# without a cubin is assembled for sm_90a with ptxas first.
set -uo pipefail
dir="${1:-${KFUSE_CACHE_DIR:-/tmp/kfuse-cache}}"
want="${2:-}"
export PATH=/usr/local/cuda/bin:$PATH
tmp=$(mktemp -d)
for f in "$dir"/*.module "$dir"/*.ptx; do
  [ -f "$f" ] || continue
  rm -f "$tmp/k.ptx" "$tmp/k.cubin"
  case "$f" in
    *.module)
      python3 - "$f" "$tmp/k.ptx" "$tmp/k.cubin" <<'EOF' || continue
import sys
data = open(sys.argv[1], "rb").read()
head, sep, body = data.partition(b"\n\n")
fields = dict(l.split(" ", 1) for l in head.decode().splitlines()[1:] if " " in l)
ptx, cubin = int(fields["ptx"]), int(fields["cubin"])
open(sys.argv[2], "wb").write(body[:ptx])
open(sys.argv[3], "wb").write(body[ptx:ptx + cubin])
EOF
      ;;
    *.ptx) awk 'body{print} /^$/{body=1}' "$f" > "$tmp/k.ptx" ;; # the old header ends at the first empty line
  esac
  entry=$(grep -m1 -oE '\.entry [A-Za-z0-9_]+' "$tmp/k.ptx" | cut -d' ' -f2)
  if [ -n "$want" ]; then
    [[ "$entry" == *"$want"* ]] || continue
  else
    grep -q "wgmma.mma_async" "$tmp/k.ptx" || continue
  fi
  if [ ! -s "$tmp/k.cubin" ]; then
    ptxas -arch=sm_90a "$tmp/k.ptx" -o "$tmp/k.cubin" 2> "$tmp/log" || { echo "$entry: ptxas failed: $(head -1 "$tmp/log")"; continue; }
  fi
  sass=$(cuobjdump --dump-sass "$tmp/k.cubin")
  echo "$entry ($(basename "$f")): HGMMA=$(grep -c HGMMA <<<"$sass") QGMMA=$(grep -c QGMMA <<<"$sass") UTMALDG=$(grep -c UTMALDG <<<"$sass") UTMASTG=$(grep -c UTMASTG <<<"$sass") HMMA=$(grep -c ' HMMA' <<<"$sass") FFMA=$(grep -c ' FFMA' <<<"$sass") LDL/STL=$(grep -cE 'LDL|STL' <<<"$sass")"
done
rm -rf "$tmp"
