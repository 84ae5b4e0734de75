#!/bin/sh
# Installs the build into a fresh prefix and builds examples/minimal.c against it as a downstream
# project would: find_package(ringfeed CONFIG) with the shared and the static target, and
# pkg-config with --libs and --static --libs. Each program then reads a shard.
# Usage: test_consumers.sh BUILD_DIR SOURCE_DIR SHARD
set -eu
build=$1 src=$2 shard=$3
[ -f "$shard" ] || { echo "skipped: no shard $shard (the third-party test data is absent)"; exit 77; }
work=$(mktemp -d /tmp/ringfeed-consumers.XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
run() { # NAME PROGRAM: it must read the shard to the end
  out=$("$2" "$shard" "batch_size=4 image_size=32 crop=resize") || { echo "$1: failed: $out"; exit 1; }
  echo "$out" | grep -q "samples$" || { echo "$1: unexpected output: $out"; exit 1; }
  echo "$1: $(echo "$out" | tail -1)"
}
cmake -S "$src/tests/consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DEXAMPLE="$src/examples/minimal.c" >/dev/null
cmake --build "$work/cmake" >/dev/null
run "find_package, ringfeed::ringfeed" "$work/cmake/with_shared"
run "find_package, ringfeed::ringfeed_static" "$work/cmake/with_static"
ldd "$work/cmake/with_static" | grep -q libringfeed && { echo "the static consumer loads libringfeed.so"; exit 1; }
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
cc=${CC:-cc}
# shellcheck disable=SC2046
$cc -o "$work/pc_shared" "$src/examples/minimal.c" $(pkg-config --cflags --libs ringfeed) \
  -Wl,-rpath,"$work/prefix/lib"
run "pkg-config --libs" "$work/pc_shared"
# The archive by name, and everything else pkg-config --static lists for it.
# shellcheck disable=SC2046
$cc -o "$work/pc_static" "$src/examples/minimal.c" $(pkg-config --cflags ringfeed) "$work/prefix/lib/libringfeed.a" \
  $(pkg-config --static --libs ringfeed | sed 's/-lringfeed//')
run "pkg-config --static --libs" "$work/pc_static"
