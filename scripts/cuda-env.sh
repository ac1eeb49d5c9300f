# Sourced by the other scripts: makes NVRTC and ptxas (CUDA 13.0, from pip) available
# without a GPU or a CUDA install, in ./.cuda of the repository. Idempotent.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cuda="$root/.cuda/nvidia/cu13"
if [ ! -f "$cuda/lib/libnvrtc.so.13" ] || [ ! -x "$cuda/bin/ptxas" ]; then
  echo "kfuse: installing NVRTC and ptxas 13.0 into $root/.cuda (pip) ..." >&2
  python3 -m pip install --quiet --disable-pip-version-check --target "$root/.cuda" --upgrade \
    "nvidia-cuda-nvrtc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-nvcc==13.0.*" >&2 \
    || { echo "kfuse: pip install of NVRTC/ptxas failed" >&2; return 1 2>/dev/null || exit 1; }
fi
export LD_LIBRARY_PATH="$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KFUSE_PTXAS="$cuda/bin/ptxas"
