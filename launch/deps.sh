#!/usr/bin/env bash
# Installs every Debian package the project needs; does nothing when all are present.
# Idempotent: safe to run before every build. Needs root (or sudo) only when something is missing.
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libopenblas0-pthread libgloo-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libsentencepiece-dev nlohmann-json3-dev
  libcli11-dev libxxhash-dev googletest libgtest-dev libgmock-dev
  libprotobuf-dev protobuf-compiler libisal-dev
  bible-kjv python3-torch
  libzstd-dev zstd  # raw .zst text sources (data/text/)
  libcurl4-openssl-dev nginx-light curl  # remote datasets and their tests (nginx; s3rver: npm_deps.sh)
  clang-14 libclang-rt-14-dev  # fuzzers (launch/fuzz.sh)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#PKGS[@]} packages present"
  bash "$(dirname "$0")/npm_deps.sh"
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
bash "$(dirname "$0")/npm_deps.sh"
