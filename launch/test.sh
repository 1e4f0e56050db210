#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite through ctest.
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/deps.sh
bash launch/build.sh
(cd build && ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@")
# Hardening (README "What survives what"): the torch-free suites under ASan+UBSan, then every
# fuzzer's regression inputs and a few seconds of fuzzing each. LM_SKIP_HARDENING=1 skips both.
if [ -z "${LM_SKIP_HARDENING:-}" ]; then
  bash launch/sanitize.sh
  bash launch/fuzz.sh "${FUZZ_SECONDS:-5}"
fi
