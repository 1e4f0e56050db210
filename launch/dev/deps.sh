#!/usr/bin/env bash
# Installs every Debian package the project needs; does nothing when all are present.
# Idempotent: safe to run before every build. Needs root (or sudo) only when something is missing.
# usage: deps.sh [job]   (job: only what the main job needs; default: everything the tests need too)
set -euo pipefail
# What the main job needs to build and run (launch/kjv.sh: `deps.sh job`).
PKGS=(
  build-essential cmake ninja-build pkg-config git  # git: the commit recorded in every run
  libtorch-dev libopenblas0-pthread libgloo-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libsentencepiece-dev nlohmann-json3-dev
  libcli11-dev libxxhash-dev libprotobuf-dev protobuf-compiler libisal-dev
  libzstd-dev libcurl4-openssl-dev
  bible-kjv
  python3  # launch/kjv_cloze.py: the main job's held-out cloze task
)
# What only the tests and benchmarks need (the default): GoogleTest, the Python peer, servers, fuzzers.
if [ "${1:-}" != job ]; then
  PKGS+=(
    googletest libgtest-dev libgmock-dev python3-torch
    zstd  # raw .zst text sources in tests (data/text/)
    nginx-light curl  # remote dataset tests (nginx; s3rver: npm_deps.sh)
    clang-14 libclang-rt-14-dev  # fuzzers (launch/dev/fuzz.sh)
    ccache debootstrap  # the compiler cache of the test builds; the LibTorch 2.14 and 2.6 environments (launch/dev/torch2.sh)
    libjemalloc2 libtcmalloc-minimal4  # the peer's tuned allocators (bench/cpu_vs_peer.sh: the strongest peer)
    time  # /usr/bin/time: the peak RSS that bench/zero.sh and bench/act_ckpt.sh report
  )
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  [ "${1:-}" = job ] || bash "$(dirname "$0")/npm_deps.sh"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = job ] || bash "$(dirname "$0")/npm_deps.sh"
