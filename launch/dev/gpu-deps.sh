#!/usr/bin/env bash
# Run HERE (the Debian machine), before the device run: downloads the Debian packages the GPU build
# needs and writes the corpus into .deps/gpu/ (ignored by git; the device run names it in `carry`:
# docs/gpu.md). launch/dev/gpu-build.sh unpacks the packages there into a prefix; nothing can be
# downloaded on the GPU machine itself. libcurl is not among them (bookworm's needs libraries the GPU
# machine lacks): the GPU build has LM_REMOTE=OFF. About 11 MB in all (6.9 MB of packages, the
# 4.4 MB Bible), well inside the 64 MiB a device run carries. Idempotent: a package already there is
# not downloaded again.
set -euo pipefail
cd "$(dirname "$0")/../.."
PKGS=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libgtest-dev googletest
      libgloo-dev libsentencepiece-dev libsentencepiece0 nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0
      libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32 libisal-dev libisal2 libzstd-dev libzstd1
      pkgconf pkgconf-bin libpkgconf3)  # pkg-config may be missing there (CMake's pkg_check_modules)
DIR=.deps/gpu
command -v bible >/dev/null || { echo "gpu-deps.sh: no bible (Debian package bible-kjv: bash launch/dev/deps.sh job)" >&2; exit 2; }
mkdir -p "$DIR"
bible -f "Gen1:1-Rev22:21" > "$DIR/kjv.txt.tmp" && mv -f "$DIR/kjv.txt.tmp" "$DIR/kjv.txt"  # the corpus
cd "$DIR"
want=()
for p in "${PKGS[@]}"; do compgen -G "${p}_*.deb" >/dev/null || want+=("$p"); done
[ ${#want[@]} -eq 0 ] || apt-get download "${want[@]}"
n=$(ls -1 ./*.deb | wc -l)
[ "$n" -ge ${#PKGS[@]} ] || { echo "gpu-deps.sh: $n packages in $DIR, ${#PKGS[@]} wanted" >&2; exit 1; }
echo "gpu-deps.sh: $n packages and kjv.txt in $DIR, $(du -sh . | cut -f1) (carry: [\"$DIR\"])"
