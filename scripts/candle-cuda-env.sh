# Sourced before building with kfuse's `candle-cuda` feature: candle's `cuda` feature
# compiles candle's kernels with nvcc at build time. Installs nvcc 13.0 with the NVVM,
# CRT and CCCL of the same release (pinned: a newer NVVM writes PTX that ptxas 13.0 and a
# CUDA 13.0 driver refuse) from pip into ./.cuda-nvcc of the repository, and sets what
# candle's build reads: nvcc on PATH, CUDA_COMPUTE_CAP (the GPU candle's kernels are
# built for: 90, the H100/H200, unless already set). For linking, cudarc (which candle
# makes link the CUDA libraries) searches CUDA_ROOT: ./.cuda-nvcc/link/lib64 holds link
# stubs of libcuda, NVRTC, cuRAND, cuBLAS and cuBLASLt (scripts/cuda_link_stubs.py; the
# programs load the real libraries where they run) and pip's libcudart, which candle's
# kernels link. Idempotent.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc_root="$root/.cuda-nvcc/nvidia/cu13"
if [ ! -x "$nvcc_root/bin/nvcc" ] || [ ! -d "$nvcc_root/include/nv" ]; then
  echo "kfuse: installing nvcc 13.0 into $root/.cuda-nvcc (pip) ..." >&2
  python3 -m pip install --quiet --disable-pip-version-check --target "$root/.cuda-nvcc" --upgrade \
    "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
    "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-runtime==13.0.*" >&2 \
    || { echo "kfuse: pip install of nvcc failed" >&2; return 1 2>/dev/null || exit 1; }
fi
link="$root/.cuda-nvcc/link/lib64"
if [ ! -f "$link/libcublasLt.so" ] || [ ! -e "$link/libcudart.so" ]; then
  cudarc_src=$(cd "$root" && cargo metadata --format-version 1 2>/dev/null | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"] == "cudarc"))') \
    && python3 "$root/scripts/cuda_link_stubs.py" "$cudarc_src" "$link" \
    && ln -sf "$nvcc_root/lib/libcudart.so.13" "$link/libcudart.so" \
    || { echo "kfuse: making the CUDA link stubs failed" >&2; return 1 2>/dev/null || exit 1; }
fi
export CUDA_ROOT="$root/.cuda-nvcc/link"
export PATH="$nvcc_root/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
