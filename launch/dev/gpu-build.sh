#!/usr/bin/env bash
# Run ON the GPU machine (no network): builds the project against the pip LibTorch 2.x with CUDA.
# Unpacks the Debian packages carried in .deps/gpu/ (launch/dev/gpu-deps.sh) into a prefix, points CMake at
# python's torch, at the prefix and at the nccl.h of the NCCL torch was built with, and builds with
# ninja into build-gpu/. Debian's fmt 9 (for spdlog) goes ahead of torch's fmt 12 for the project's
# own targets (LM_DEPS_INCLUDE).
# Environment: DEBS (the packages, .deps/gpu), DEPS (prefix, /opt/deps), BUILD_DIR (build-gpu), TARGETS (ninja targets; all when
# empty), LM_BUILD_TESTS (ON|OFF, ON), NINJA_JOBS.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=${DEPS:-/opt/deps}
BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$DEPS"
DEBS=${DEBS:-.deps/gpu}
compgen -G "$DEBS/*.deb" >/dev/null || { echo "no packages in $DEBS: run launch/dev/gpu-deps.sh here first and carry $DEBS" >&2; exit 1; }
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$DEPS"; done
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# pip's nvidia-nccl wheel keeps nccl.h in site-packages/nvidia/nccl/include (a namespace package:
# no __file__), where torch's CMake config does not look.
NCCL_INCLUDE=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "include"))' \
               2>/dev/null || true)
if [ -n "$NCCL_INCLUDE" ] && [ -f "$NCCL_INCLUDE/nccl.h" ]; then
  echo "nccl.h from $NCCL_INCLUDE"
else
  echo "warning: python's nvidia.nccl has no nccl.h; CMake will use whatever nccl.h the compiler finds" >&2
  NCCL_INCLUDE=""
fi
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"  # also libpkgconf
export PATH="$DEPS/usr/bin:$PATH"  # protoc, and pkg-config (pkgconf) where the machine has none
export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$DEPS"  # .pc files say /usr
PKG_CONFIG=$(command -v pkg-config || command -v pkgconf || true)
[ -n "$PKG_CONFIG" ] || { echo "no pkg-config: add pkgconf to .deps (launch/dev/gpu-deps.sh)" >&2; exit 1; }
# Every header the build needs, named before CMake runs (one line per missing one).
missing=0
for h in yaml-cpp/yaml.h spdlog/spdlog.h fmt/format.h gtest/gtest.h gloo/config.h sentencepiece_processor.h \
         nlohmann/json.hpp CLI/CLI.hpp xxhash.h google/protobuf/message.h isa-l/crc.h zstd.h; do
  [ -f "$DEPS/usr/include/$h" ] || [ -f "/usr/include/$h" ] ||
    { echo "missing header $h: add its -dev package to launch/dev/gpu-deps.sh" >&2; missing=1; }
done
[ $missing = 0 ] || exit 1
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLM_REMOTE=OFF -DLM_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake" \
  -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG" -DLM_DEPS_INCLUDE="$DEPS/usr/include" \
  -DLM_NCCL_INCLUDE="$NCCL_INCLUDE" -DLM_BUILD_TESTS="${LM_BUILD_TESTS:-ON}"
# shellcheck disable=SC2086  # TARGETS is a list
ninja -C "$BUILD_DIR" -k 0 ${NINJA_JOBS:+-j "$NINJA_JOBS"} ${TARGETS:-}  # -k 0: every failing file
