#!/usr/bin/env bash
# Configures and builds into build/ (executables in build/bin/). Incremental. With arguments, only
# those targets (launch/kjv.sh builds just what the main job runs); without, everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
# Configured once; again for a whole build when the tree was configured without GoogleTest
# (by the main job) and the tests are wanted now.
if [ ! -f "$BUILD_DIR/build.ninja" ] || { [ $# -eq 0 ] && [ ! -f "$BUILD_DIR/CTestTestfile.cmake" ]; }; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "$@"
