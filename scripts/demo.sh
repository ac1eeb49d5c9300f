#!/usr/bin/env bash
# The main job: writes a kernel with #[kfuse], compiles and runs it — on the GPU when
# there is one, else on the CPU interpreter, saying which — and checks the result.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
cargo run --release --example quickstart
