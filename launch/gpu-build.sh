#!/usr/bin/env bash
# Run ON the GPU machine (no network): builds the project against the pip LibTorch 2.x with CUDA.
# Unpacks the Debian packages carried in .deps/ (launch/gpu-deps.sh) into a prefix, points CMake at
# python's torch and at the prefix, and builds with ninja into build-gpu/. See shared/GPU.md:
# Debian's fmt 9 (for spdlog) goes ahead of torch's fmt 12 for the project's own targets.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${DEPS:-/opt/deps}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$DEPS"
for f in .deps/*.deb; do dpkg -x "$f" "$DEPS"; done
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH="$DEPS/usr/bin:$PATH"                                   # protoc
export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$DEPS"                               # .pc files say /usr
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake" \
  -DLM_DEPS_INCLUDE="$DEPS/usr/include"
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"}
