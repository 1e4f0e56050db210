#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite through ctest.
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/deps.sh
bash launch/build.sh
(cd build && ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@")
# Hardening (README "What survives what"): the torch-free suites under ASan+UBSan, then every
# torch-free fuzzer's regression inputs and a few seconds of fuzzing each (the torch ones,
# safetensors and checkpoint, need a clang build of LibTorch code: FUZZ_BASE_ONLY= to add them).
# LM_SKIP_HARDENING=1 skips both.
if [ -z "${LM_SKIP_HARDENING:-}" ]; then
  bash launch/sanitize.sh
  FUZZ_BASE_ONLY=${FUZZ_BASE_ONLY-1} bash launch/fuzz.sh "${FUZZ_SECONDS:-5}"
fi
