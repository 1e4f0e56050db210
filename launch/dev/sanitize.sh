#!/usr/bin/env bash
# Sanitizer builds of the project and their test runs (see docs/guarantees.md).
#
#   bash launch/dev/sanitize.sh            ASan+UBSan -> build-asan/: the torch-free suites (common_tests,
#                                      data_tests: shards, loader, prep; config_tests;
#                                      tensorboard_tests; report_tests) and the tools they run (prep,
#                                      report). CI runs it.
#   bash launch/dev/sanitize.sh thread     TSan -> build-tsan/: the threads (loader workers, text source,
#                                      mixture, remote store, metrics sink, async checkpoint writer,
#                                      launcher) through their suites.
#
# Extra arguments go to ctest (e.g. -R Loader). LibTorch, OpenBLAS, yaml-cpp and the other Debian
# libraries are not instrumented: tests/sanitizers/*.supp hold the suppressions that this needs,
# each with the reason it exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-address}
[ $# -gt 0 ] && shift
SUPP=$PWD/tests/sanitizers
case "$MODE" in
  address)
    BUILD_DIR=build-asan SAN=address,undefined
    TARGETS=(common_tests data_tests config_tests tensorboard_tests report_tests prep report)
    ;;
  thread)
    BUILD_DIR=build-tsan SAN=thread
    # TSAN_TARGETS="data_tests remote_tests": the loader, text source, mixture and remote store alone
    # (torch-free, a short build). remote_tests exists where libcurl does (LM_REMOTE, the default).
    read -r -a TARGETS <<< "${TSAN_TARGETS:-common_tests data_tests remote_tests config_tests models_tests trainer_tests launch_tests}"
    ;;
  *) echo "usage: launch/dev/sanitize.sh [address|thread] [ctest args...]" >&2; exit 2 ;;
esac
launcher=()  # ccache as in launch/dev/build.sh: a clean clone rebuilds the sanitizer build from the cache
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime CCACHE_BASEDIR=$PWD
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLM_SANITIZE="$SAN" \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" "${launcher[@]}"
fi
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "${TARGETS[@]}"

# halt_on_error/abort: a finding fails the test that triggered it (exit code != the expected one).
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$SUPP/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp"
cd "$BUILD_DIR"
if [ "$MODE" = address ]; then
  # config_doc reads build/bin/trainer's --keys, which this build leaves out (tests/CMakeLists.txt)
  ctest --output-on-failure -j "${CTEST_JOBS:-2}" -E '_NOT_BUILT|^layering$|^fault_matrix$|^config_doc$' -LE kernels "$@"
else
  # Only the tests that start threads: loader workers (Loader, Workers), the text source's chunk
  # builder (TextSource), the mixture (MixTest), the remote store's read-ahead and cache (RemoteTest,
  # CacheDirTest), metrics sink, async checkpoint, launcher.
  # Resume.CheckpointOfAnotherArchitecture runs `generate`, whose tokenizer plugin needs
  # RTLD_DEEPBIND, which sanitizer runtimes refuse (and it starts no thread of ours).
  ctest --output-on-failure -j "${CTEST_JOBS:-2}" -E '_NOT_BUILT|^layering$|^fault_matrix$|CheckpointOfAnotherArchitecture' -LE kernels \
        -R "${TSAN_TESTS:-Loader|Workers|TextSource|MixTest|RemoteTest|CacheDirTest|Metrics|Telemetry|Async|Checkpoint|Launch}" "$@"
fi
