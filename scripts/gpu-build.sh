#!/usr/bin/env bash
# First half of the GPU round trip, on a machine without a GPU: builds the GPU test
# binaries, the benchmark and the quickstart example in release mode, strips them and
# collects them with the host script in .gpu/ (git-ignored; carry it to the GPU host).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
rm -rf .gpu && mkdir -p .gpu/bin
collect() { # cargo JSON on stdin → "name path" lines for executables
  python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])'
}
{
  cargo test --release --no-run --message-format=json --test gpu --test errors --test user_kernels --test rope
  cargo test --release --no-run --message-format=json -p kfuse-runtime --lib --test gpu_runtime
  cargo bench --no-run --message-format=json --bench memory
  cargo build --release --message-format=json --example quickstart
} 2>/dev/null | collect | while read -r name path; do
  cp "$path" ".gpu/bin/$name"
done
strip .gpu/bin/* 2>/dev/null || true
cp scripts/gpu-run.sh .gpu/
ls -la .gpu/bin
du -sh .gpu
