#!/usr/bin/env bash
# Runs INSIDE the environment that launch/dev/torch2.sh keeps (the repository at /src); LM_TORCH_ENV says
# which: trixie (LibTorch 2.6, the default; builds in build-torch2/) or sid (LibTorch 2.14, build-torch214/).
#   torch2-inside.sh cpu [CTEST ARGS...]   configure + build every target against the LibTorch (CPU),
#                                          then the whole ctest
#   torch2-inside.sh cuda                  (trixie) configure + build the programs and every source with
#                                          CUDA-only code against LibTorch 2.6 + CUDA (the pieces
#                                          unpacked at /opt/cuda), LM_CUDA=ON
#   torch2-inside.sh build [TARGETS...]    the CPU build alone (BUILD_DIR, default the suite's)
# Both builds treat every compiler warning as an error (LM_WERROR) and use ccache.
set -euo pipefail
cd /src
MODE=$1; shift
JOBS=${NINJA_JOBS:-$(nproc)}
case "${LM_TORCH_ENV:-trixie}" in
  sid) NAME=torch214 ;;
  *)   NAME=torch2 ;;
esac
CPU_DIR=build-$NAME
export CCACHE_BASEDIR=/src
ccache_stats() { ccache --print-stats 2>/dev/null | awk -F'\t' '$1=="direct_cache_hit"||$1=="preprocessed_cache_hit"{h+=$2} $1=="cache_miss"{m=$2} END{printf "ccache: %d hits, %d misses\n", h, m}'; }
configure_cpu() {
  local dir=$1
  [ -f "$dir/build.ninja" ] && [ -f "$dir/CTestTestfile.cmake" ] && return 0
  # LM_BUILD_BENCH=OFF: the benchmarks' programs are compiled by the LibTorch 1.13 build (no test runs them)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DLM_WERROR=ON \
        -DLM_BUILD_BENCH=OFF
}
case "$MODE" in
  build)
    dir=${BUILD_DIR:-$CPU_DIR}
    configure_cpu "$dir"
    ninja -C "$dir" -k 0 -j "$JOBS" "$@"
    ;;
  cpu)
    dir=$CPU_DIR
    configure_cpu "$dir"
    t0=$(date +%s)
    ccache -z >/dev/null
    ninja -C "$dir" -k 0 -j "$JOBS"
    echo "$NAME: LibTorch $(dpkg-query -W -f='${Version}' libtorch-dev) CPU build: $(( $(date +%s) - t0 )) s, $(ccache_stats)"
    cd "$dir"
    t0=$(date +%s)
    rc=0
    ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@" || rc=$?
    echo "$NAME: ctest: $(( $(date +%s) - t0 )) s"
    exit "$rc"
    ;;
  cuda)
    [ "$NAME" = torch2 ] || { echo "torch2-inside.sh: the cuda build is trixie's (LibTorch 2.6 + CUDA)" >&2; exit 2; }
    dir=build-cuda
    P=/opt/cuda
    [ -f "$P/.lmtrain-packages" ] || { echo "torch2: the CUDA pieces are not unpacked at $P" >&2; exit 1; }
    # nvcc 12.4 looks for its own files at fixed places (/usr/lib/nvidia-cuda-toolkit, /usr/lib/cuda,
    # /etc/nvcc.profile): in this environment, and only here, they point into the unpacked prefix.
    for l in /usr/lib/nvidia-cuda-toolkit /usr/lib/cuda; do
      if [ -e "$P$l" ] && [ ! -L "$l" ]; then rm -rf "$l"; ln -s "$P$l" "$l"; fi
    done
    rm -f /etc/nvcc.profile
    cat > /etc/nvcc.profile <<EOF
# launch/dev/torch2-inside.sh: Debian's profile, with the unpacked prefix's headers and libraries.
NVVMIR_LIBRARY_DIR = /usr/lib/nvidia-cuda-toolkit/libdevice
PATH += /usr/lib/nvidia-cuda-toolkit/bin:
INCLUDES += -I$P/usr/include
LIBRARIES =+ \$(_SPACE_) -L$P/usr/lib/x86_64-linux-gnu/stubs -L$P/usr/lib/x86_64-linux-gnu
EOF
    export PATH="$P/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu"
    # --allow-shlib-undefined: cuDNN is absent (see torch2.sh); PRE_TEST: the test binaries are listed
    # by ctest, not run at build time (they cannot run here); LM_REMOTE=OFF as the GPU machine builds.
    # Debian's TorchConfig.cmake itself warns (no kineto, no nvrtc hash, an nvtx3 package name):
    # those are its lines, not the project's; -Wno-dev drops the last, which is meant for its authors.
    if [ ! -f "$dir/build.ninja" ]; then
      mkdir -p "$dir"
      cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DLM_WERROR=ON \
        -DLM_CUDA=ON -DCMAKE_PREFIX_PATH="$P/usr;$P/usr/lib/x86_64-linux-gnu/cmake" \
        -DCMAKE_LIBRARY_PATH="$P/usr/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$P/usr/include" \
        -DCUDAToolkit_ROOT="$P/usr" -DCMAKE_CUDA_COMPILER="$P/usr/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER=g++-13 \
        -DCUDA_TOOLKIT_ROOT_DIR="$P/usr/lib/nvidia-cuda-toolkit" -DTORCH_CUDA_ARCH_LIST=9.0 \
        -DLM_LINK_ALLOW_SHLIB_UNDEFINED=ON -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
        -DLM_REMOTE=OFF -DLM_BUILD_BENCH=OFF -Wno-dev 2>&1 | tee "$dir/configure.log"
      [ "${PIPESTATUS[0]}" = 0 ] || exit 1
    fi
    # What only this build can check: every translation unit with CUDA-only code (the libraries'
    # device.cpp and process_group.cpp, the one test source: cuda_test_objects) compiled, and every
    # program linked against libtorch_cuda and NCCL. The suites and the benchmarks, whose sources
    # have no CUDA-only line, are compiled by the CPU builds (and by the GPU machine's own build).
    t0=$(date +%s)
    ccache -z >/dev/null
    ninja -C "$dir" -k 0 -j "$JOBS" programs cuda_test_objects
    grep -m1 -- '-- LM_CUDA: ' "$dir/configure.log" || true
    echo "torch2: CUDA build of the programs and the CUDA test source: $(( $(date +%s) - t0 )) s, $(ccache_stats)"
    ;;
  *) echo "torch2-inside.sh: unknown mode '$MODE'" >&2; exit 2 ;;
esac
