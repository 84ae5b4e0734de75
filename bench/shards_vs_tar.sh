#!/bin/sh
# Ringfeed shards against the tar shards they were made from, in one run on this machine:
#   dlshard create: images/s converting the synthetic set;
#   dlbench over the .rfs shards and over the tars (same options, same digest);
#   zstd tensor fields: decompressed bytes/s of one worker against `zstd -b` on the same payloads.
# Usage: bench/shards_vs_tar.sh [BUILD_DIR] [THREADS]
set -eu
build=${1:-build}
threads=${2:-2}
work=${TMPDIR:-/tmp}/ringfeed-bench-shards
rm -rf "$work"
mkdir -p "$work"
src=$("$build/dlbench" --make-synthetic)
"$build/dlbench" "$src" --workers "$threads" > /dev/null 2>&1 # page cache
create=$("$build/dlshard" create "$work/syn" "$src" --samples-per-shard 1000 --threads "$threads")
rfs="$work/syn-{000000..000009}.rfs"
num() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }
"$build/dlbench" "$src" --workers "$threads" --json --digest > "$work/tar.txt"
"$build/dlbench" "$rfs" --workers "$threads" --json --digest > "$work/rfs.txt"
"$build/dlbench" "$rfs" --workers "$threads" --json --option direct=1 > "$work/rfs-direct.txt"
digest() { sed -n 's/.*"digest":"\([0-9a-f]*\)".*/\1/p' "$1"; }
same=$([ -n "$(digest "$work/tar.txt")" ] && [ "$(digest "$work/tar.txt")" = "$(digest "$work/rfs.txt")" ] && echo yes || echo no)
# zstd fields: 256 records of 256 KiB, one worker.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
zsrc=$(RINGFEED_LIBRARY="$build/libringfeed.so" "$py" bench/make_records.py "$work/z" 256 262144 zstd)
"$build/dlbench" "$zsrc" --workers 1 --batch 16 --epochs 4 --json > "$work/zstd.json"
RINGFEED_LIBRARY="$build/libringfeed.so" "$py" - "$work/payload.npy" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
walk = np.cumsum(rng.integers(-2, 3, 262144 * 16), dtype=np.int64)
np.save(sys.argv[1], (walk % 256).astype(np.uint8))
PY
zstd -b3 -e3 -i3 "$work/payload.npy" > "$work/zstd-b.txt" 2>&1 || true
zb=$(tr '\r' '\n' < "$work/zstd-b.txt" | grep 'MB/s,' | tail -1 | sed 's/.*, *\([0-9.]* MB\/s\) *$/\1/')
echo
echo "| what ($threads threads) | figure |"
echo "|---|---|"
echo "| dlshard create, 10,000 synthetic JPEGs, tar -> rfs | $create |"
echo "| dlbench over the tars | $(num "$work/tar.txt" samples_per_s) images/s |"
echo "| dlbench over the .rfs shards | $(num "$work/rfs.txt" samples_per_s) images/s (same digest: $same) |"
echo "| dlbench over the .rfs shards, direct=1 | $(num "$work/rfs-direct.txt" samples_per_s) images/s |"
echo "| zstd tensor fields, 1 worker, decompressed and delivered | $(awk -v b="$(num "$work/zstd.json" bytes_per_s)" 'BEGIN{printf "%.1f MB/s", b/1e6}') |"
echo "| zstd -b3 decompression of the same kind of payload | $zb |"
