#!/usr/bin/env bash
# The project against newer LibTorch versions, on this Debian bookworm machine, without a GPU. One
# script, two Debian environments (debootstrap, each made once and reused), chosen by LM_TORCH_ENV:
#   trixie (default)  Debian 13 ships LibTorch 2.6 twice, a CPU build (`libtorch-dev`) and a CUDA 12.4 +
#                     cuDNN + NCCL build (`libtorch-cuda-dev`, contrib), with nvcc 12.4 and NCCL in non-free
#   sid               Debian unstable: LibTorch 2.14 (CPU, gloo included; C++20), python3-torch 2.14 on
#                     Python 3.14, g++ 16; no CUDA build (contrib's is still 2.6), so no `cuda` mode
#
#   bash launch/dev/torch2.sh [cpu] [CTEST ARGS...]   build every target against the suite's LibTorch (CPU), run
#                                                 the whole ctest there (extra arguments go to ctest)
#   bash launch/dev/torch2.sh cuda                    (trixie) build every target against LibTorch 2.6 + CUDA 12.4
#                                                 + NCCL (LM_CUDA=ON, compiled and linked; nothing to run here)
#   bash launch/dev/torch2.sh peer [ARGS...]          bench/cpu_vs_peer.sh in the environment: the trainer against
#                                                 the suite's python3-torch eager and torch.compile
#   bash launch/dev/torch2.sh shell [COMMAND...]      a shell (or COMMAND) in the environment, at the repository
#   bash launch/dev/torch2.sh prepare                 only make (or check) the environment (and for trixie the CUDA
#                                                 pieces): downloads and unpacking, little CPU (the test command
#                                                 runs it alongside the LibTorch 1.13 build)
#   LM_TORCH_ENV=sid bash launch/dev/torch2.sh prepare|cpu|peer|shell   the same against LibTorch 2.14
#
# Where things live (one directory per suite):
#   trixie: LM_TORCH2_DIR, default /var/cache/lmtrain/torch2 (about 11 GB with the CUDA pieces);
#           builds go to build-torch2/ and build-cuda/ in the repository (gitignored)
#   sid:    LM_TORCH214_DIR, default /var/cache/lmtrain/sid (about 4 GB); the build goes to build-torch214/
# and in it:
#   root/        the Debian environment: LibTorch (CPU) and everything the build and tests need
#   cuda-debs/   (trixie) the CUDA packages, downloaded once (apt-get download inside root/)
#   cuda/        (trixie) those packages unpacked with dpkg-deb -x (never installed: libtorch-cuda-2.6
#                depends on nvidia-cudnn, whose installer downloads from the vendor)
#   ccache/      the compiler cache the suite's builds share, so that a clean clone rebuilds in minutes
# The repository is bind-mounted at /src inside the environment (in a private mount namespace that
# ends with the script).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
MODE=${1:-cpu}
case "$MODE" in cpu|cuda|peer|shell|prepare) [ $# -eq 0 ] || shift ;; *) MODE=cpu ;; esac
ENV_NAME=${LM_TORCH_ENV:-trixie}
case "$ENV_NAME" in
  trixie) SUITE=trixie; TOP=${LM_TORCH2_DIR:-/var/cache/lmtrain/torch2}; NAME=torch2 ;;
  sid)    SUITE=sid;    TOP=${LM_TORCH214_DIR:-/var/cache/lmtrain/sid};  NAME=torch214 ;;
  *) echo "torch2: LM_TORCH_ENV must be trixie or sid, not '$ENV_NAME'" >&2; exit 2 ;;
esac
ROOT=$TOP/root
say() { echo "$NAME: $*"; }
die() { echo "$NAME: $*" >&2; exit 1; }
[ "$SUITE" = trixie ] || [ "$MODE" != cuda ] || die "no cuda mode for $SUITE (LibTorch's CUDA build there is still 2.6: use trixie)"
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and bind mounts)"

# What the environment holds. The same list as launch/dev/deps.sh, with trixie's names (clang and its
# runtime are left out: the fuzzers run in the bookworm suite), plus ccache, g++-13 (nvcc 12.4's
# newest host compiler), nodejs (s3rver, installed by npm into .deps/node by the bookworm suite), and
# python3-setuptools + python3-dev (torch.compile's inductor builds C++ against Python.h: the peer).
PKGS=(build-essential cmake ninja-build pkg-config git ccache g++-13
      libtorch-dev libopenblas0-pthread libgloo-dev libyaml-cpp-dev libspdlog-dev libfmt-dev
      libsentencepiece-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libprotobuf-dev protobuf-compiler
      libisal-dev libzstd-dev libcurl4-openssl-dev bible-kjv
      googletest libgtest-dev libgmock-dev python3-torch python3-numpy python3-setuptools python3-dev zstd nginx curl nodejs
      mount util-linux bsdutils procps jq
      libjemalloc2 libtcmalloc-minimal4)  # the peer's tuned allocators (bench/cpu_vs_peer.sh)
# sid: the same without g++-13 (the CUDA host compiler, trixie only), plus libabsl-dev (sid's
# sentencepiece headers include absl's). python3-torch is 2.14 there (Python 3.14).
[ "$SUITE" = trixie ] || PKGS=(libabsl-dev $(printf '%s\n' "${PKGS[@]}" | grep -vx 'g++-13'))
# The CUDA build's pieces (unpacked, not installed). cuDNN is not among them: it is linked from
# libtorch_cuda.so only, so the project links with --allow-shlib-undefined.
CUDA_PKGS=(libtorch-cuda-dev libtorch-cuda-2.6 nvidia-cuda-dev nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc
           libnccl-dev libnccl2 libcudart12 libcu++-dev libcub-dev libthrust-dev libgloo-cuda-0 libgloo-cuda-dev
           libtensorpipe-cuda-0 libnvtoolsext1 libcublas12 libcublaslt12 libcusparse12 libcufft11 libcurand10
           libcusolver11 libnvrtc12 libnvjitlink12 libcupti12 libnvidia-ml-dev)

# The mirror this machine's apt uses (its sources name it), so that trixie comes from the same place.
mirror() {
  local m
  m=$(grep -hoE '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
      awk '{print $2}' | grep -v -- '-security' | head -1)
  [ -n "$m" ] || die "no Debian mirror found in /etc/apt/sources.list{,.d}"
  echo "$m"
}

# Runs a command inside the environment: /proc, /sys, /dev and the repository bind-mounted, in a
# mount namespace of its own, so nothing stays mounted after it (even when it is killed).
inside() {
  unshare --mount --propagation private -- /bin/bash -c '
    set -e
    R=$1; shift; SRC=$1; shift
    mount --bind "$R" "$R"  # the root a mount point: unshare -m inside (the disk-full tests) needs it
    mount -t proc proc "$R/proc"
    mount --rbind /sys "$R/sys"
    mount --rbind /dev "$R/dev"
    mkdir -p "$R/src" && mount --bind "$SRC" "$R/src"
    [ -d "$R/../cuda" ] && mkdir -p "$R/opt/cuda" && mount --bind "$R/../cuda" "$R/opt/cuda"
    [ -d "$R/../ccache" ] && mkdir -p "$R/var/cache/ccache" && mount --bind "$R/../ccache" "$R/var/cache/ccache"
    cp /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
    exec chroot "$R" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin CI="${CI:-}" \
      CCACHE_DIR=/var/cache/ccache LM_TORCH_ENV="$LM_TORCH_ENV" NINJA_JOBS="${NINJA_JOBS:-}" \
      CTEST_JOBS="${CTEST_JOBS:-}" "$@"' _ "$ROOT" "$REPO" "$@"
}

make_root() {
  if [ ! -f "$ROOT/.lmtrain-bootstrapped" ]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
    local m; m=$(mirror)
    say "debootstrap $SUITE into $ROOT (about 90 s, 215 MB)"
    rm -rf "$ROOT.tmp"; mkdir -p "$TOP"
    debootstrap --variant=minbase "$SUITE" "$ROOT.tmp" "$m" > "$TOP/debootstrap.log" 2>&1 ||
      { tail -5 "$TOP/debootstrap.log" >&2; die "debootstrap failed (log: $TOP/debootstrap.log)"; }
    rm -rf "$ROOT"; mv "$ROOT.tmp" "$ROOT"
    touch "$ROOT/.lmtrain-bootstrapped"
    say "debootstrap took $(( $(date +%s) - t0 )) s"
  fi
  # sid's Release file on the mirror can be weeks old (Valid-Until passed): apt then refuses it.
  if [ "$SUITE" = sid ] && [ ! -f "$ROOT/etc/apt/apt.conf.d/99lmtrain" ]; then
    echo 'Acquire::Check-Valid-Until "false";' > "$ROOT/etc/apt/apt.conf.d/99lmtrain"
  fi
  if [ ! -f "$ROOT/etc/apt/sources.list.d/lmtrain.sources" ]; then
    rm -f "$ROOT/etc/apt/sources.list"
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main contrib non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$(mirror)" "$SUITE" > "$ROOT/etc/apt/sources.list.d/lmtrain.sources"
    # Keep downloaded packages out of the environment's own cache only when asked to (disk).
    inside apt-get update -q
  fi
  local want; want="${PKGS[*]}"
  if [ "$(cat "$ROOT/.lmtrain-packages" 2>/dev/null)" != "$want" ]; then
    say "installing ${#PKGS[@]} packages into the $SUITE environment (LibTorch and the build's dependencies)"
    inside /bin/bash -c 'export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q --no-install-recommends "$@" >/var/log/lmtrain-install.log 2>&1 ||
        { apt-get update -q && apt-get install -y -q --no-install-recommends "$@"; }
      apt-get clean' _ "${PKGS[@]}" || die "installing into the environment failed (log: $ROOT/var/log/lmtrain-install.log)"
    echo "$want" > "$ROOT/.lmtrain-packages"
    say "environment ready after $(( $(date +%s) - t0 )) s"
  fi
  mkdir -p "$TOP/ccache"
  [ -f "$TOP/ccache/ccache.conf" ] || cat > "$TOP/ccache/ccache.conf" <<'EOF'
# The project's precompiled header (cmake_pch.hxx.gch) is rebuilt by every clean build: ccache may
# use it when its content is the same (sloppiness), and hashes the sources, not their paths' times.
sloppiness = pch_defines,time_macros,include_file_mtime,include_file_ctime
max_size = 6G
compression = true
EOF
}

make_cuda() {
  local want; want="${CUDA_PKGS[*]}"
  [ "$(cat "$TOP/cuda/.lmtrain-packages" 2>/dev/null)" = "$want" ] && return 0
  say "downloading the CUDA packages into $TOP/cuda-debs (about 1.7 GB) and unpacking them into $TOP/cuda"
  mkdir -p "$TOP/cuda-debs"
  mkdir -p "$ROOT/var/tmp/cuda-debs"
  # apt-get download (no install): inside the environment, so that trixie's versions come.
  inside /bin/bash -c 'cd /var/tmp/cuda-debs && apt-get download -q "$@" >/dev/null' _ "${CUDA_PKGS[@]}" ||
    die "apt-get download of the CUDA packages failed"
  mv "$ROOT"/var/tmp/cuda-debs/*.deb "$TOP/cuda-debs/"
  rm -rf "$TOP/cuda.tmp"; mkdir -p "$TOP/cuda.tmp"
  local n=0 f
  for p in "${CUDA_PKGS[@]}"; do
    f=$(ls -t "$TOP/cuda-debs/${p}_"*.deb 2>/dev/null | head -1)
    [ -n "$f" ] || die "CUDA package $p was not downloaded"
    dpkg-deb -x "$f" "$TOP/cuda.tmp"; n=$((n + 1))
  done
  # nvcc 12.4's device declarations of sinpi/cospi(f) lack the noexcept that glibc 2.41 (trixie)
  # gives them ("exception specification is incompatible"): the fix NVIDIA shipped in CUDA 12.9.
  sed -i -E 's/^(extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ (double|float) +(sinpi|sinpif|cospi|cospif)\((double|float) x\));/\1 noexcept (true);/' \
    "$TOP/cuda.tmp/usr/include/crt/math_functions.h"
  [ "$(grep -c 'noexcept (true);' "$TOP/cuda.tmp/usr/include/crt/math_functions.h")" -ge 4 ] ||
    die "could not patch nvcc's crt/math_functions.h for glibc 2.41"
  echo "$want" > "$TOP/cuda.tmp/.lmtrain-packages"
  rm -rf "$TOP/cuda"; mv "$TOP/cuda.tmp" "$TOP/cuda"
  say "unpacked $n CUDA packages"
}

mkdir -p "$TOP"
exec 9>"$TOP/.lock"
flock 9  # one user of the environment at a time (two CI runs on one machine wait for each other)
t0=$(date +%s)
make_root
export LM_TORCH_ENV=$ENV_NAME
case "$MODE" in
  prepare)
    [ "$SUITE" != trixie ] || make_cuda ;;
  cpu)
    inside /bin/bash /src/launch/dev/torch2-inside.sh cpu "$@" ;;
  cuda)
    make_cuda
    inside /bin/bash /src/launch/dev/torch2-inside.sh cuda "$@" ;;
  peer)
    inside /bin/bash -c 'cd /src && B=build-$0 && BUILD_DIR=$B bash launch/dev/torch2-inside.sh build trainer prep &&
                         BUILD_DIR=$B PYTHON=/usr/bin/python3 bash bench/cpu_vs_peer.sh "$@"' "$NAME" "$@" ;;
  shell)
    if [ $# -eq 0 ]; then inside /bin/bash -c 'cd /src && exec bash -i'
    else inside /bin/bash -c 'cd /src && "$@"' _ "$@"; fi ;;
esac
say "$MODE done in $(( $(date +%s) - t0 )) s"
