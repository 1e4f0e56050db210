#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite through ctest.
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/deps.sh
bash launch/build.sh
cd build
ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
