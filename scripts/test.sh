#!/usr/bin/env bash
# The test command: installs NVRTC and ptxas if missing (so the compile checks never
# drop out), then runs every test of the workspace (doc tests included) and builds the
# documentation with warnings as errors. No GPU needed: the GPU-only tests
# are ignored (cargo counts them as ignored, .ci/run as skipped) unless the tests are
# built with --cfg kfuse_gpu, as scripts/gpu-build.sh does for the GPU host.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
export KFUSE_CACHE_DIR="${KFUSE_CACHE_DIR:-$PWD/target/kfuse-cache}"
# the `kfuse` command (cargo feature `cli`) and the candle interop (`candle`: candle's CPU
# tensors) build with the rest, so that their tests (tests/cli.rs, tests/candle.rs) run and
# no dependency is compiled twice
cargo test --workspace --features kfuse/cli,kfuse/candle "$@"
# the source hook (KFUSE_SOURCE_HOOK) is compiled in only with kfuse-runtime's
# `dev-hooks` feature, off in the build above: its unit test, with the feature
cargo test -p kfuse-runtime --lib --features dev-hooks source_hook
# the candle interop's CUDA path (`candle-cuda`: candle builds its kernels with nvcc, and
# cudarc links the CUDA libraries, which this machine need not have): type-checked
source scripts/candle-cuda-env.sh
cargo check --features kfuse/candle-cuda --test candle --example candle_custom_op
# the API documentation, with the feature-gated modules: any rustdoc warning (a broken
# or private link, an undocumented public item: the library crates deny missing_docs)
# fails the run. Its examples ran above, as the doc tests of `cargo test --workspace`.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features kfuse/vendor-baselines,kfuse/dev-hooks,kfuse/candle
