#!/usr/bin/env bash
# The test command: installs NVRTC and ptxas if missing (so the compile checks never
# drop out), then runs every test of the workspace. No GPU needed; GPU tests pass
# trivially without one unless KFUSE_REQUIRE_GPU=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
export KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/target/kfuse-cache}"
cargo test --workspace "$@"
