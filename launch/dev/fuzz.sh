#!/usr/bin/env bash
# libFuzzer targets of tests/fuzz (one per parser of outside input), built with clang-14, ASan and
# UBSan into build-fuzz/.
#
#   bash launch/dev/fuzz.sh                 CI form: every regression input once, then each fuzzer 5 s
#   bash launch/dev/fuzz.sh 600 fuzz_config one fuzzer for 600 s (names: tests/fuzz/CMakeLists.txt)
#   FUZZ_BASE_ONLY=1 bash launch/dev/fuzz.sh   the torch-free fuzzers only
#
# Each fuzzer reads the committed seeds (tests/fuzz/corpus/<name>/) and regressions
# (tests/fuzz/regressions/<name>/: every input that once crashed, kept) and grows its own working
# corpus in build-fuzz/corpus/<name>/. A crash, hang (> 10 s per input) or allocation over 1 GiB
# fails the script and leaves the input in build-fuzz/artifacts/. Seconds fuzzed are added up per
# fuzzer in build-fuzz/fuzz_seconds.txt. Shares the machine politely: one job, nice.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_EACH=${1:-5}
[ $# -gt 0 ] && shift
BUILD_DIR=$PWD/build-fuzz  # absolute: fuzz_sweep changes directory
ALL=(fuzz_config fuzz_sweep fuzz_manifest fuzz_shard fuzz_jsonl fuzz_text fuzz_safetensors fuzz_checkpoint)
[ -n "${FUZZ_BASE_ONLY:-}" ] && ALL=(fuzz_config fuzz_sweep fuzz_manifest fuzz_shard fuzz_jsonl fuzz_text)
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=("${ALL[@]}")
launcher=()  # ccache as in launch/dev/build.sh: a clean clone rebuilds the fuzzers from the cache
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime CCACHE_BASEDIR=$PWD
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DLM_FUZZ=ON -DLM_BUILD_TESTS=OFF "${launcher[@]}"
fi
nice ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} "${NAMES[@]}"

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:allocator_may_return_null=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/tests/sanitizers/ubsan.supp"
export TMPDIR=${FUZZ_TMPDIR:-/dev/shm}
mkdir -p "$BUILD_DIR/artifacts"
for name in "${NAMES[@]}"; do
  seeds=$PWD/tests/fuzz/corpus/$name regress=$PWD/tests/fuzz/regressions/$name work=$BUILD_DIR/corpus/$name
  mkdir -p "$work"
  dict=()
  case "$name" in
    fuzz_config|fuzz_sweep) dict=(-dict=$PWD/tests/fuzz/yaml.dict) ;;
    *) dict=(-dict=$PWD/tests/fuzz/json.dict) ;;
  esac
  opts=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -close_fd_mask=1 -print_final_stats=1
        -artifact_prefix="$BUILD_DIR/artifacts/$name-" "${dict[@]}")
  if [ -d "$regress" ] && [ -n "$(ls -A "$regress")" ]; then
    echo "== $name: regressions"
    nice "$BUILD_DIR/bin/$name" "${opts[@]}" -runs=0 "$regress"
  fi
  echo "== $name: ${SECONDS_EACH} s"
  start=$(date +%s)
  set +e
  nice "$BUILD_DIR/bin/$name" "${opts[@]}" -max_total_time="$SECONDS_EACH" "$work" "$seeds" \
    $( [ -d "$regress" ] && echo "$regress" ) 2>&1 | grep -v '^#[0-9]' | tail -n 40
  rc=${PIPESTATUS[0]}
  set -e
  echo "$name $(( $(date +%s) - start ))" >> "$BUILD_DIR/fuzz_seconds.txt"
  [ "$rc" -eq 0 ] || { echo "fuzz: $name failed (exit $rc); the input is in $BUILD_DIR/artifacts/"; exit 1; }
done
awk '{s[$1]+=$2} END {for (n in s) printf "fuzz: %-18s %6d s in total\n", n, s[n]}' "$BUILD_DIR/fuzz_seconds.txt"
