#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole suite through ctest, then the
# hardening runs, the whole suite again against the newest LibTorch, and the CUDA compile.
# .ci/run calls exactly this. Every phase runs even after a failing one; the command ends with the
# time and result of each phase and exits 1 naming the failed phases (0 when all passed).
#
#   phase                     what                                                    skip with
#   deps                      launch/dev/deps.sh: Debian packages + s3rver (npm)
#   build (LibTorch 1.13)     every target against Debian bookworm's LibTorch 1.13
#   ctest (LibTorch 1.13)     the whole suite on the machine's own kernels (extra arguments of this
#                             script go to ctest; the `kernels` label is the next phase's)
#   kernels (LibTorch 1.13)   the numeric suites again under the kernels a CPU without AVX-512 and one
#                             without AVX2 run (ctest -L kernels: oneDNN off, ATEN_CPU_CAPABILITY avx2
#                             and default; tests/CMakeLists.txt), whatever this CPU has
#   hardening                 ASan+UBSan over the torch-free suites (launch/dev/sanitize.sh), every
#                             fuzzer's regression inputs + a few seconds of fuzzing each
#                             (launch/dev/fuzz.sh; FUZZ_SECONDS, default 5)        LM_SKIP_HARDENING=1
#   LibTorch 2.14 CPU         Debian sid's LibTorch 2.14 (launch/dev/torch2.sh, LM_TORCH_ENV=sid):
#                             every target but the benchmarks built with -Werror, the whole ctest
#                             (the kernels runs included)                       LM_SKIP_TORCH2=1
#   LibTorch 2.6 CUDA         Debian trixie's LibTorch 2.6 + CUDA 12.4 + NCCL: every program and every
#                             source with CUDA-only code compiled and linked (nothing runs: no GPU
#                             here)                                             LM_SKIP_TORCH2=1
# The budget: 45 minutes on the slowest 2-core machine known (a first-generation AMD EPYC), from a
# fresh machine with cold compiler caches; the command's last line says how much it took of it.
# The environments of the last two phases (debootstrap, packages, the CUDA pieces: downloads and
# unpacking, little CPU) are made in the background while LibTorch 1.13 builds and tests; a no-op
# when they are already there.
#
# A busy machine: LM_TEST_BUSY=N starts N busy processes (shell loops at normal priority) for the
# whole command, as a neighbour's job or other ranks would be. Every test passes with
# LM_TEST_BUSY=2 beside ctest -j2 (docs/testing.md); what only holds on an idle machine is a
# benchmark in bench/, not a test.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
results=() failed=()
# run_phase NAME COMMAND...: runs COMMAND, records its time and result, never stops the script.
run_phase() {
  local name=$1; shift
  local t0 rc
  t0=$(date +%s)
  echo "== test: phase '$name'"
  "$@"; rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then
    results+=("$(printf '%-26s %5d s  ok' "$name" "$dt")")
  else
    results+=("$(printf '%-26s %5d s  FAILED (exit %d)' "$name" "$dt" "$rc")")
    failed+=("$name")
  fi
  return 0
}

busy_pids=()
stop_busy() { [ ${#busy_pids[@]} -eq 0 ] || kill "${busy_pids[@]}" 2>/dev/null; busy_pids=(); }
trap stop_busy EXIT
for _ in $(seq 1 "${LM_TEST_BUSY:-0}"); do
  sh -c 'while :; do :; done' & busy_pids+=($!)
done
[ ${#busy_pids[@]} -eq 0 ] || echo "test: ${#busy_pids[@]} busy processes beside the tests (LM_TEST_BUSY)"

run_phase "deps" bash launch/dev/deps.sh

# The environments of the LibTorch 2.x phases, made while 1.13 builds and tests.
prep_sid= prep_trixie=
if [ -z "${LM_SKIP_TORCH2:-}" ]; then
  mkdir -p build
  LM_TORCH_ENV=sid bash launch/dev/torch2.sh prepare > build/torch214-prepare.log 2>&1 & prep_sid=$!
  LM_TORCH_ENV=trixie bash launch/dev/torch2.sh prepare > build/torch2-prepare.log 2>&1 & prep_trixie=$!
fi

run_phase "build (LibTorch 1.13)" bash launch/dev/build.sh
ctest_113() { (cd build && ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@"); }
run_phase "ctest (LibTorch 1.13)" ctest_113 -LE kernels "$@"
run_phase "kernels (LibTorch 1.13)" ctest_113 -L kernels

if [ -z "${LM_SKIP_HARDENING:-}" ]; then
  hardening() { bash launch/dev/sanitize.sh && bash launch/dev/fuzz.sh "${FUZZ_SECONDS:-5}"; }
  run_phase "hardening" hardening
fi

if [ -n "$prep_sid" ]; then
  # wait_env PID LOG WHAT: the background preparation's result, its log's tail when it failed.
  wait_env() {
    wait "$1" && return 0
    tail -20 "$2" >&2; echo "test: making the $3 environment failed (log: $2)" >&2; return 1
  }
  torch214() { wait_env "$prep_sid" build/torch214-prepare.log "LibTorch 2.14 (sid)" &&
               LM_TORCH_ENV=sid bash launch/dev/torch2.sh cpu; }
  run_phase "LibTorch 2.14 CPU" torch214
  cuda26() { wait_env "$prep_trixie" build/torch2-prepare.log "LibTorch 2.6 (trixie)" &&
             LM_TORCH_ENV=trixie bash launch/dev/torch2.sh cuda; }
  run_phase "LibTorch 2.6 CUDA build" cuda26
fi
stop_busy

total=$(( $(date +%s) - start ))
echo "== test command: time and result per phase (whole command $total s)"
printf '%s\n' "${results[@]}"
# The budget (docs/benchmarks.md has the per-phase times measured against it): 45 min on the slowest
# 2-core machine the project knows (a first-generation AMD EPYC), from a fresh machine and cold caches.
echo "test: $total s of the 2700 s (45 min) budget ($(( total * 100 / 2700 ))%): $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test: FAILED phases: $(IFS=,; echo "${failed[*]}")"
  exit 1
fi
echo "test: every phase passed"
