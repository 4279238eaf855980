#!/usr/bin/env bash
# Installs what building and testing tilesched needs on a fresh machine, idempotently:
#  - NVRTC of CUDA 13.0 (PyPI wheel nvidia-cuda-nvrtc==13.0.88) and nvdisasm (wheel
#    nvidia-cuda-nvdisasm) into the cache directory, so that sm_90 kernels compile and
#    disassemble without a GPU or a CUDA toolkit. Skipped where a CUDA 13 toolkit's
#    libnvrtc.so.13 is already present (the GPU machine).
#  - cmake and libclang (apt), which the xgboost-rs crate needs to build XGBoost 1.6.2.
#  - redis-server (apt): the tests of the measurement queue start a real server.
#  - fonts-dejavu-core (apt): DejaVu Sans, read at run time for the text of the
#    benchmark plots (benchmarks/src/plot.rs).
# The cache is $TILESCHED_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/tilesched.
set -euo pipefail

cache="${TILESCHED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tilesched}"
wheels="$cache/wheels"
nvrtc_version="13.0.88"
stamp="$wheels/.installed-nvrtc-$nvrtc_version"

have_toolkit_nvrtc() {
  [ -n "${TILESCHED_NVRTC:-}" ] && [ -f "$TILESCHED_NVRTC" ] && return 0
  [ -f "${CUDA_HOME:-/usr/local/cuda}/lib64/libnvrtc.so.13" ]
}

if ! command -v cmake >/dev/null || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  echo "setup: installing cmake and libclang-dev (for xgboost-rs)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq cmake libclang-dev >/dev/null
fi

if ! command -v redis-server >/dev/null; then
  # The queue tests start their own server on a loopback port; the package's service
  # is not needed (and not started where the system forbids it).
  echo "setup: installing redis-server (for the measurement queue's tests)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi

if ! [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  echo "setup: installing fonts-dejavu-core (the font of the benchmark plots)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq fonts-dejavu-core >/dev/null
fi

if [ -f "$stamp" ]; then
  echo "setup: NVRTC $nvrtc_version and nvdisasm already in $wheels"
elif have_toolkit_nvrtc; then
  echo "setup: using the CUDA toolkit's NVRTC"
else
  echo "setup: installing NVRTC $nvrtc_version and nvdisasm into $wheels"
  mkdir -p "$wheels"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
    --target "$wheels" "nvidia-cuda-nvrtc==$nvrtc_version" nvidia-cuda-nvdisasm
  test -f "$wheels/nvidia/cu13/lib/libnvrtc.so.13"
  touch "$stamp"
fi
