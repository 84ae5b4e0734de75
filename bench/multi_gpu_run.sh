#!/bin/sh
# The several-GPU checks on one host, over binaries built elsewhere (`make device`): torchrun with
# G ranks training on the synthetic set (equal batch counts, disjoint keys covering each epoch,
# per-GPU rate against one GPU), one process feeding G GPUs against G processes, and a resume at
# half the ranks. Writes a table last; logs go to $OUT/multi.tar.gz. Usage: multi_gpu_run.sh [BUILD]
#   PARTS: any of train oneproc resume (default: all); DECODES: the decode modes of oneproc (auto);
#   EPOCHS: of the synthetic set in oneproc (4; nvJPEG's start, about a second, is inside the rates);
#   QUALITY=96 SUBSAMPLING=444: the ImageNet-quality set instead of the q90 4:2:0 one
set -u
build=${1:-build-device}
dest=${OUT:-out}
out=$(mktemp -d /tmp/ringfeed-multi.XXXXXX)
mkdir -p "$dest"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/ringfeed-cache}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RINGFEED_LIBRARY="$PWD/$build/libringfeed.so" DL_LOG_LEVEL=1
G=$(nvidia-smi -L | wc -l)
W=$(( $(nproc) / G ))
table="$out/table.md"
row() { echo "| $1 | $2 |" >> "$table"; }
echo "| check | result |" > "$table"
row "GPUs, workers per GPU" "$G, $W"
src=$("$build/dlbench" --make-synthetic --synthetic 10000 --quality "${QUALITY:-90}" --subsampling "${SUBSAMPLING:-420}")
parts=${PARTS:-train oneproc resume}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
num() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }

# 1. torchrun: G ranks against 1, same workers per GPU.
if has train; then
python3 -m torch.distributed.run --nproc_per_node=1 examples/train_imagenet.py --data "$src" --workers "$W" --epochs 0 --steps 150 \
  > "$out/train1.log" 2>&1
one=$(sed -n 's/.*"images_per_s_per_gpu": \([0-9.]*\).*/\1/p' "$out/train1.log" | head -1)
row "1 GPU: train images/s" "$one"
python3 -m torch.distributed.run --nproc_per_node="$G" examples/train_imagenet.py --data "$src" --workers "$W" --epochs 0 --steps 150 \
  --keys-out "$out/keys-%RANK%" > "$out/trainG.log" 2>&1
row "$G GPUs: train exit" "$? $(grep -c '"rank"' "$out/trainG.log") ranks reported"
rates=$(sed -n 's/.*"images_per_s_per_gpu": \([0-9.]*\).*/\1/p' "$out/trainG.log" | tr '\n' ' ')
steps=$(sed -n 's/.*"steps": \([0-9]*\).*/\1/p' "$out/trainG.log" | sort -u | tr '\n' ' ')
row "$G GPUs: per-GPU images/s" "$rates (1 GPU: $one)"
row "$G GPUs: steps per rank (equal?)" "$steps"
python3 - "$out" "$G" <<'PY' >> "$table"
import glob, sys
out, g = sys.argv[1], int(sys.argv[2])
files = sorted(glob.glob(f"{out}/keys-*"))
per_rank = [open(f).read().split() for f in files]
n = 10000 // g
epoch0 = [k for ks in per_rank for k in ks[:n]]
print(f"| {g} GPUs: epoch-0 keys over all ranks | {len(epoch0)} keys, {len(set(epoch0))} distinct, of 10000 |")
PY
fi

# 2. One process feeding G GPUs against G processes, the same workers in all (steady rates: after
#    each one's first batch).
for decode in $(has oneproc && echo ${DECODES:-auto}); do
  cat "$(dirname "$src")"/*.tar > /dev/null
  python3 bench/one_process_gpus.py "$src" "$G" "$(nproc)" "${EPOCHS:-4}" $decode > "$out/oneproc-$decode.json" 2> "$out/oneproc-$decode.err"
  one=$(num "$out/oneproc-$decode.json" steady_images_per_s)
  row "1 process, device=cuda:0..$((G-1)), decode=$decode" "$one images/s steady ($(cat "$out/oneproc-$decode.json"))"
  i=0
  while [ $i -lt "$G" ]; do
    "$build/dlbench" "$src" --device "cuda:$i" --rank $i --world-size "$G" --workers "$W" --epochs "${EPOCHS:-4}" --decode $decode --json \
      > "$out/proc-$decode-$i.json" 2> "$out/proc-$decode-$i.err" &
    i=$((i + 1))
  done
  wait
  total=$(cat "$out"/proc-$decode-*.json | sed -n 's/.*"steady_samples_per_s":\([0-9.]*\).*/\1/p' | awk '{s += $1} END {printf "%.0f", s}')
  starts=$(for f in "$out"/proc-$decode-*.json; do num "$f" gpu_decoders_start_ms; done | tr '\n' ' ')
  row "$G processes (dlbench, one GPU each, $W workers), decode=$decode" "$total images/s steady in total; 1 process / $G: $(awk -v a="$one" -v b="$total" 'BEGIN{ if (b > 0) printf "%.3f", a / b }'); nvJPEG started in $starts ms"
done

# 3. Save at G ranks, resume at G/2 (or 1): nothing lost or repeated in the epoch.
if has resume; then
half=$(( G / 2 > 0 ? G / 2 : 1 ))
python3 -m torch.distributed.run --nproc_per_node="$G" examples/train_imagenet.py --data "$src" --workers "$W" --epochs 1 --steps 5 \
  --keys-out "$out/first-%RANK%" --save-state "$out/state.json" > "$out/resume1.log" 2>&1
python3 -m torch.distributed.run --nproc_per_node="$half" examples/train_imagenet.py --data "$src" --workers "$W" --epochs 1 \
  --resume "$out/state.json" --keys-out "$out/rest-%RANK%" > "$out/resume2.log" 2>&1
python3 - "$out" <<'PY' >> "$table"
import glob, sys
out = sys.argv[1]
keys = [k for f in glob.glob(f"{out}/first-*") + glob.glob(f"{out}/rest-*") for k in open(f).read().split()]
print(f"| resume at fewer ranks | {len(keys)} keys, {len(set(keys))} distinct, of 10000 |")
PY
fi
cp "$table" "$dest/multi_table.md"
tar -czf "$dest/multi.tar.gz" -C "$out" .
echo
cat "$table"
