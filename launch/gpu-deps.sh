#!/usr/bin/env bash
# Run HERE (the Debian machine): downloads the Debian packages the GPU build needs into .deps/
# (ignored by git, carried to the GPU machine with the run's `carry`). launch/gpu-build.sh unpacks
# them there into a prefix; nothing can be downloaded on the GPU machine itself. libcurl is not
# among them (bookworm's needs libraries the GPU machine lacks): the GPU build has LM_REMOTE=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev googletest
      libgloo-dev libsentencepiece-dev libsentencepiece0 nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0
      libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32 libisal-dev libisal2 libzstd-dev libzstd1
      pkgconf pkgconf-bin libpkgconf3)  # pkg-config may be missing there (CMake's pkg_check_modules)
mkdir -p .deps
bible -f "Gen1:1-Rev22:21" > .deps/kjv.txt  # the corpus (bible's data paths are fixed at /usr/share)
cd .deps
apt-get download "${PKGS[@]}"
ls -1 *.deb | wc -l
