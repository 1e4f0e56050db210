#!/usr/bin/env bash
# Configures and builds into build/ (executables in build/bin/). Incremental. With arguments, only
# those targets (launch/kjv.sh builds just what the main job runs); without, everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "$@"
