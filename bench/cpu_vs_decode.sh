#!/bin/sh
# ringfeed on the CPU against the physical limit of its work, in one run on one machine:
#   dlbench --workers T on the synthetic set (random_resized 224 + flip, batches of 256)
#   bare libjpeg-turbo full decodes of the same JPEGs on T threads, from memory.
#   and, where it was built (scripts/install-deps.sh bench), the resampler against libyuv,
#   stb_image_resize and libswscale on the same JPEGs' crops (bench/resize_compare).
# Usage: bench/cpu_vs_decode.sh [BUILD_DIR] [THREADS] [SAMPLES]; prints a table, writes JSON to $OUT
# (or the build folder). QUALITY=96 SUBSAMPLING=444: the ImageNet-quality set (default 90, 420).
set -eu
build=${1:-build}
threads=${2:-2}
samples=${3:-10000}
out=${OUT:-$build}
dlbench=$build/dlbench
ceiling=$build/bench/decode_ceiling
quality=${QUALITY:-90}
subsampling=${SUBSAMPLING:-420}
src=$($dlbench --synthetic "$samples" --quality "$quality" --subsampling "$subsampling" --make-synthetic)
shards=$(ls "$(dirname "$src")"/*.tar)
num() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }
# First run: warms the page cache (and indexes the shards). Its rate sets how many epochs make the
# measured run last about as long as the bare decodes (8 s): on many cores one epoch of the set
# takes a second, and start-up would weigh on the rate as it does not on theirs.
$dlbench "$src" --workers "$threads" --json > "$out/dlbench-warm.json"
epochs=$(awk -v r="$(num "$out/dlbench-warm.json" steady_samples_per_s)" -v n="$samples" \
  'BEGIN { e = int(8 * r / n + 0.999); print (e < 1 ? 1 : e > 50 ? 50 : e) }')
$dlbench "$src" --workers "$threads" --flip --epochs "$epochs" --json > "$out/dlbench.json"
$ceiling --threads "$threads" --seconds 8 $shards > "$out/decode_ceiling.json"
rf=$(num "$out/dlbench.json" samples_per_s)
bare=$(num "$out/decode_ceiling.json" images_per_s)
first=$(num "$out/dlbench.json" first_batch_ms)
rss=$(num "$out/dlbench.json" peak_rss_mb)
io=$(sed -n 's/.*"io_backend":"\([a-z_]*\)".*/\1/p' "$out/dlbench.json" | head -1)
ratio=$(awk -v a="$rf" -v b="$bare" 'BEGIN { printf "%.3f", a / b }')
echo
echo "| what ($threads threads, $samples synthetic JPEGs, q$quality $subsampling) | images/s |"
echo "|---|---|"
echo "| ringfeed dlbench (random_resized 224 + flip, batch 256, io $io, $epochs epochs with start-up) | $rf |"
echo "| bare libjpeg-turbo full decode, from memory | $bare |"
echo "| ratio | $ratio |"
echo "| first batch | $first ms |"
echo "| peak RSS | $rss MB |"
if [ -x "$build/bench/resize_compare" ]; then
  echo
  $build/bench/resize_compare --images 1000 $shards > "$out/resize_compare.txt"
  grep '^|' "$out/resize_compare.txt"
fi
