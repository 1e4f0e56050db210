#!/usr/bin/env bash
# Configures and builds into build/ (executables in build/bin/). Incremental. With arguments, only
# those targets (launch/kjv.sh builds just what the main job runs); without, everything.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
# Configured once; again for a whole build when the tree was configured without GoogleTest
# (by the main job) and the tests are wanted now.
# With ccache installed (the test command's packages), compiles go through it: a clean clone then
# rebuilds from the cache. The precompiled header is rebuilt by each clean build: the sloppiness
# lets ccache use it when its content is the same.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime CCACHE_BASEDIR=$PWD
fi
if [ ! -f "$BUILD_DIR/build.ninja" ] || { [ $# -eq 0 ] && [ ! -f "$BUILD_DIR/CTestTestfile.cmake" ]; }; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
fi
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "$@"
