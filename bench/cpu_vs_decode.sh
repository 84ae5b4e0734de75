#!/bin/sh
# ringfeed on the CPU against the physical limit of its work, in one run on one machine:
#   dlbench --workers T on the synthetic set (random_resized 224 + flip, batches of 256)
#   bare libjpeg-turbo full decodes of the same JPEGs on T threads, from memory.
#   and, where it was built (scripts/install-deps.sh bench), the resampler against libyuv,
#   stb_image_resize and libswscale on the same JPEGs' crops (bench/resize_compare).
# Usage: bench/cpu_vs_decode.sh [BUILD_DIR] [THREADS] [SAMPLES]; prints a table, writes JSON to $OUT
# (or the build folder). QUALITY=96 SUBSAMPLING=444: the ImageNet-quality set (default 90, 420);
# ROUNDS=3 alternating runs of each, ROUND_S=4 seconds of bare decoding in each.
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
# First run: warms the page cache (and indexes the shards). Its rate sets how many epochs make each
# measured run last about as long as a bare-decode run (ROUND_S, 4 s): on many cores one epoch of
# the set takes a second, and start-up would weigh on the rate as it does not on theirs.
# ROUNDS (3) alternate the two, so that a host whose speed drifts (a shared VM, a clock that moves)
# weighs on both alike; the figures are the medians, and the ratio the median of each round's.
rounds=${ROUNDS:-3}
round_s=${ROUND_S:-4}
$dlbench "$src" --workers "$threads" --json > "$out/dlbench-warm.json"
epochs=$(awk -v r="$(num "$out/dlbench-warm.json" steady_samples_per_s)" -v n="$samples" -v s="$round_s" \
  'BEGIN { e = int(s * r / n + 0.999); print (e < 1 ? 1 : e > 50 ? 50 : e) }')
: > "$out/rounds.txt"
i=1
while [ "$i" -le "$rounds" ]; do
  $dlbench "$src" --workers "$threads" --flip --epochs "$epochs" --json > "$out/dlbench-$i.json"
  $ceiling --threads "$threads" --seconds "$round_s" $shards > "$out/decode_ceiling-$i.json"
  a=$(num "$out/dlbench-$i.json" samples_per_s) b=$(num "$out/decode_ceiling-$i.json" images_per_s)
  echo "$a $b $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')" >> "$out/rounds.txt"
  i=$((i + 1))
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
rf=$(cut -d' ' -f1 "$out/rounds.txt" | median)
bare=$(cut -d' ' -f2 "$out/rounds.txt" | median)
ratio=$(cut -d' ' -f3 "$out/rounds.txt" | median)
each=$(awk '{ printf "%s%s", (NR > 1 ? ", " : ""), $3 }' "$out/rounds.txt")
first=$(num "$out/dlbench-1.json" first_batch_ms)
rss=$(num "$out/dlbench-1.json" peak_rss_mb)
io=$(sed -n 's/.*"io_backend":"\([a-z_]*\)".*/\1/p' "$out/dlbench-1.json" | head -1)
echo
echo "| what ($threads threads, $samples synthetic JPEGs, q$quality $subsampling) | images/s |"
echo "|---|---|"
echo "| ringfeed dlbench (random_resized 224 + flip, batch 256, io $io, $epochs epochs with start-up; median of $rounds) | $rf |"
echo "| bare libjpeg-turbo full decode, from memory ($round_s s; median of $rounds) | $bare |"
echo "| ratio | $ratio |"
echo "| each round's ratio, alternating | $each |"
echo "| first batch | $first ms |"
echo "| peak RSS | $rss MB |"
if [ -x "$build/bench/resize_compare" ]; then
  echo
  $build/bench/resize_compare --images 1000 $shards > "$out/resize_compare.txt"
  grep '^|' "$out/resize_compare.txt"
fi
