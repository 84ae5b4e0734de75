#!/bin/sh
# Installs the Debian packages ringfeed needs to build and test, when any is missing.
# Usage: scripts/install-deps.sh [build|test]
set -eu
want="build-essential cmake pkg-config libjpeg62-turbo-dev libpng-dev zlib1g-dev liburing-dev libzstd-dev libwebp-dev libcurl4-openssl-dev
      libxxhash-dev libdlpack-dev tar"
if [ "${1:-build}" = test ]; then
  want="$want clang libclang-rt-dev zstd python3 python3-numpy python3-pytest python3-pil python3-torch
        python3-venv python3-pip python3-setuptools python3-wheel git nginx openssl"
fi
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "install-deps: installing$missing"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
