#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite through ctest, then the
# hardening runs and the LibTorch 2.6 checks. .ci/run calls exactly this.
#
#   LibTorch 1.13 (Debian bookworm, this machine): build + ctest            (extra arguments: ctest's)
#   hardening: the torch-free suites under ASan+UBSan, every fuzzer's regression inputs and a few
#     seconds of fuzzing each, the torch ones (safetensors, checkpoint) included: their clang build of
#     the LibTorch code goes through ccache (the whole fuzz pass: 3 min with the cache warm, 21 min
#     for the torch fuzzers' cold build on a loaded 2-core machine; FUZZ_BASE_ONLY=1 leaves them
#     out)                                                                   LM_SKIP_HARDENING=1 skips
#   LibTorch 2.6 (Debian trixie, launch/torch2.sh): every target built and the whole ctest run on
#     the CPU build, then every target compiled and linked against the CUDA build  LM_SKIP_TORCH2=1 skips
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
times=()
phase() { times+=("$(printf '%-28s %5d s' "$1" $(( $(date +%s) - t0 )))"); t0=$(date +%s); }
bash launch/deps.sh
# The LibTorch 2.6 environment (debootstrap, packages, the CUDA pieces: downloads and unpacking,
# little CPU) is made while LibTorch 1.13 builds and tests; a no-op when it is already there.
prep_pid=
if [ -z "${LM_SKIP_TORCH2:-}" ]; then
  mkdir -p build
  bash launch/torch2.sh prepare > build/torch2-prepare.log 2>&1 &
  prep_pid=$!
fi
bash launch/build.sh
phase "build (LibTorch 1.13)"
(cd build && ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@")
phase "ctest (LibTorch 1.13)"
if [ -z "${LM_SKIP_HARDENING:-}" ]; then
  bash launch/sanitize.sh
  bash launch/fuzz.sh "${FUZZ_SECONDS:-5}"
  phase "hardening"
fi
if [ -n "$prep_pid" ]; then
  wait "$prep_pid" || { tail -20 build/torch2-prepare.log >&2; echo "test: making the LibTorch 2.6 environment failed (log: build/torch2-prepare.log)" >&2; exit 1; }
  phase "LibTorch 2.6 env (waited)"
  bash launch/torch2.sh cpu
  phase "LibTorch 2.6 CPU: build+ctest"
  bash launch/torch2.sh cuda
  phase "LibTorch 2.6 CUDA: build"
fi
echo "== test command, time per phase"
printf '%s\n' "${times[@]}"
