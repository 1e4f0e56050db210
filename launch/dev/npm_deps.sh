#!/usr/bin/env bash
# Installs the npm packages the tests need into .deps/node (gitignored): s3rver, the S3-compatible
# server that tests/remote_test.cpp starts on loopback. Idempotent; called from launch/dev/deps.sh.
# Without npm it says so and returns 0: the S3 tests then skip loudly.
set -euo pipefail
cd "$(dirname "$0")/../.."
S3RVER_VERSION=3.7.1
dir=.deps/node
if [ -x "$dir/node_modules/.bin/s3rver" ]; then
  echo "npm deps: s3rver present"
  exit 0
fi
if ! command -v npm >/dev/null; then  # Debian's npm (a node from elsewhere may bring its own)
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends npm ||
    echo "npm deps: npm could not be installed, s3rver neither (the S3 tests will skip)"
  command -v npm >/dev/null || exit 0
fi
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "s3rver@${S3RVER_VERSION}"
echo "npm deps: installed s3rver ${S3RVER_VERSION} into $dir"
