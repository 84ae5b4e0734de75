#!/bin/sh
# Installs the Debian packages ringfeed needs to build and test, when any is missing.
# Usage: scripts/install-deps.sh [build|test|bench] (bench: also the resamplers bench/resize_compare
# measures ringfeed's against)
set -eu
want="build-essential cmake pkg-config libjpeg62-turbo-dev libpng-dev zlib1g-dev libbz2-dev liburing-dev libzstd-dev libwebp-dev libcurl4-openssl-dev
      libxxhash-dev libdlpack-dev libssl-dev tar"
if [ "${1:-build}" = bench ]; then
  want="$want libyuv-dev libstb-dev libswscale-dev"
fi
if [ "${1:-build}" = test ]; then
  want="$want clang libclang-rt-dev zstd python3 python3-numpy python3-pytest python3-pil python3-torch python3-torchvision
        python3-venv python3-pip python3-setuptools python3-wheel git nginx openssl python3-botocore python3-xxhash"
  # Node.js for the S3 tests' server, from Debian unless another Node.js with npm is there.
  command -v npm >/dev/null || want="$want nodejs npm"
fi
# The S3 tests' server: s3rver from npm, into build-npm (once; without network they are skipped).
npm_deps() {
  [ "${1:-build}" = test ] || return 0
  root=$(cd "$(dirname "$0")/.." && pwd)
  [ -x "$root/build-npm/node_modules/.bin/s3rver" ] && return 0
  command -v npm >/dev/null || return 0
  npm install --prefix "$root/build-npm" --no-audit --no-fund --silent s3rver@3.7.1 >/dev/null 2>&1 ||
    echo "install-deps: npm could not install s3rver; the S3 tests will be skipped"
}
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
  npm_deps "${1:-build}"
  exit 0
fi
echo "install-deps: installing$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
npm_deps "${1:-build}"
