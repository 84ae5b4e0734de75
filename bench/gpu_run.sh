#!/bin/sh
# Every GPU check and benchmark, in one run on the GPU machine, over binaries built elsewhere
# (`make device`; this script builds nothing). Writes logs and JSON to $OUT (or out/) and prints
# a short table last. Usage: bench/gpu_run.sh [BUILD_DIR]
#   PARTS: any of tests copy bench python torch wheel (default: all of them)
set -u
build=${1:-build-device}
dest=${OUT:-out}
out=$(mktemp -d /tmp/ringfeed-gpu-run.XXXXXX)
mkdir -p "$dest"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/ringfeed-cache}
export DL_LOG_LEVEL=${DL_LOG_LEVEL:-1}
workers=$(nproc)
parts=${PARTS:-tests copy bench python torch wheel}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
table="$out/table.md"
: > "$table"
row() { echo "| $1 | $2 |" >> "$table"; }
num() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
row "GPU" "$(cat "$out/gpu.txt")"

# 1. GPU tests, plain and under compute-sanitizer.
# (ctest files name this machine's build paths, so the test programs run directly.)
for t in $(has tests && echo ${GPU_TESTS:-test_cuda test_options test_sampler test_loader test_rfs}); do
  DL_DLSHARD="$build/dlshard" timeout 300 "$build/tests/$t" > "$out/$t.log" 2>&1
  row "$t" "exit $? ($(tail -1 "$out/$t.log"))"
done
if has tests && [ "${SKIP_SANITIZER:-}" != 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    RINGFEED_UNDER_SANITIZER=1 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/test_cuda" > "$out/sanitizer-$tool.log" 2>&1
    row "compute-sanitizer $tool test_cuda" "exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.log" | tail -1))"
  done
fi

# 2. The card's copy rate against the loader's copy stage.
if has copy || has bench; then
"$build/bench/h2d_baseline" 256 0 "$workers" 64 > "$out/h2d_baseline.json"
pinned=$(num "$out/h2d_baseline.json" pinned_gb_s)
memory=$(num "$out/h2d_baseline.json" filled_from_memory_gb_s)
row "plain cudaMemcpyAsync, pinned, 256x224x224x3 uint8" "$pinned GB/s (pageable $(num "$out/h2d_baseline.json" pageable_gb_s))"
row "a ring of 4 pinned 64 MiB slots to the device" "$(num "$out/h2d_baseline.json" ring_pinned_gb_s) GB/s alone; $memory GB/s while $workers threads fill it with 1 MiB copies from memory (the raw records' ceiling at the host's memory speed)"
fi

# 3. dlbench: CPU and GPU delivery, then a GPU consumer at 1.2x the loader's batch time.
if has bench; then
bench="$build/dlbench --workers $workers --batch 256 --size 224 --flip"
$bench --epochs 1 --json > "$out/warm.json" 2> "$out/warm.err"
$bench --device cpu --epochs 2 --json > "$out/cpu.json" 2> "$out/cpu.err"
$bench --device cuda:0 --epochs 2 --json > "$out/cuda.json" 2> "$out/cuda.err"
cpu=$(num "$out/cpu.json" samples_per_s)
gpu=$(num "$out/cuda.json" samples_per_s)
h2d=$(num "$out/cuda.json" h2d_gb_s)
row "dlbench --device cpu --workers $workers" "$cpu images/s ($(num "$out/cpu.json" steady_samples_per_s) after the first batch)"
row "dlbench --device cuda:0 --workers $workers" "$gpu images/s ($(num "$out/cuda.json" steady_samples_per_s) after the first batch, first batch $(num "$out/cuda.json" first_batch_ms) ms)"
row "ringfeed copy stage (event-timed copies of its batches)" "$h2d GB/s = $(awk -v a="$h2d" -v b="$pinned" 'BEGIN{printf "%.3f", a/b}') of plain pinned"
# The step consumer beside the CPU path at 1.2x its steady batch time (decode=auto would spend its
# first second on the CPU while nvJPEG starts: gpu_decode_run.sh measures the GPU decode modes).
$bench --device cuda:0 --decode cpu --epochs 2 --json > "$out/cuda-cpu.json" 2> "$out/cuda-cpu.err"
batch_ms=$(awk -v s="$(num "$out/cuda-cpu.json" steady_samples_per_s)" 'BEGIN{printf "%.3f", 256 / s * 1000}')
step=$(awk -v b="$batch_ms" 'BEGIN{printf "%.3f", 1.2 * b}')
$bench --device cuda:0 --decode cpu --epochs 3 --step-ms "$step" --json > "$out/step.json" 2> "$out/step.err"
row "dlbench --decode cpu --step-ms $step (1.2 x its steady $batch_ms ms)" "gpu_idle_frac $(num "$out/step.json" gpu_idle_frac), $(num "$out/step.json" samples_per_s) images/s"
$bench --device cuda:0 --epochs 1 --dtype bfloat16 --option layout=NCHW --json > "$out/bf16.json" 2> "$out/bf16.err"
row "dlbench --device cuda:0 --dtype bfloat16 NCHW" "$(num "$out/bf16.json" samples_per_s) images/s"

# ringfeed shards made from the same set, read with O_DIRECT.
syn=$("$build/dlbench" --make-synthetic)
"$build/dlshard" create /tmp/ringfeed-rfs/syn "$syn" --samples-per-shard 1000 > "$out/dlshard.log" 2>&1
row "dlshard create (10 tar shards -> rfs)" "$(tail -1 "$out/dlshard.log")"
$bench --device cuda:0 --epochs 2 --option direct=1 --json "/tmp/ringfeed-rfs/syn-{000000..000009}.rfs" > "$out/rfs.json" 2> "$out/rfs.err"
row "dlbench --device cuda:0 over .rfs shards, direct=1" "$(num "$out/rfs.json" samples_per_s) images/s ($(num "$out/rfs.json" steady_samples_per_s) after the first batch)"

# Raw uint8 records of 1 MiB (tensor fields, no decode) delivered to the GPU.
rsrc=$(RINGFEED_LIBRARY="$PWD/$build/libringfeed.so" python3 bench/make_records.py /tmp/ringfeed-raw/r 4096 1048576 raw 512)
"$build/dlbench" "$rsrc" > /dev/null 2>&1 # page cache
for io in auto pread mmap; do
  "$build/dlbench" "$rsrc" --device cuda:0 --workers "$workers" --batch 64 --epochs 12 --option io=$io --json \
    > "$out/raw-$io.json" 2> "$out/raw-$io.err"
  steady=$(awk -v s="$(num "$out/raw-$io.json" steady_samples_per_s)" 'BEGIN{printf "%.2f", s * 1048576 / 1e9}')
  row "raw 1 MiB records to cuda:0, io=$io, $workers workers, batch 64" "$(awk -v b="$steady" -v p="$pinned" 'BEGIN{printf "%.2f GB/s after the first batch = %.3f of plain pinned", b, b/p}'), $(awk -v b="$steady" -v m="$memory" 'BEGIN{printf "%.3f", b/m}') of the filled ring ($(awk -v b="$(num "$out/raw-$io.json" bytes_per_s)" 'BEGIN{printf "%.2f", b/1e9}') GB/s with start-up)"
done

fi

# 4. The Python binding with PyTorch on the GPU.
if has python && python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
  RINGFEED_LIBRARY="$PWD/$build/libringfeed.so" python3 -m pytest -q bindings/python/tests > "$out/pytest.log" 2>&1
  row "pytest bindings/python/tests (torch $(python3 -c 'import torch; print(torch.__version__)'))" "$(tail -1 "$out/pytest.log")"
fi

# 5. Side by side with the PyTorch DataLoader, and the training example for a few hundred steps
#    (SKIP=torch leaves them out when device time is short).
if has torch && [ "${SKIP:-}" != torch ] && python3 -c "import torch, torchvision; assert torch.cuda.is_available()" 2> /dev/null; then
  python3 bench/compare_torch.py --dlbench "$build/dlbench" --workers "$workers" --batch 256 --epochs 2 \
    --device cuda:0 --json "$out/compare_torch.json" > "$out/compare_torch.log" 2>&1
  grep -E '^\| (ringfeed|torch)' "$out/compare_torch.log" | sed 's/^/compare_torch /' | while read -r line; do
    echo "$line" >> "$table"
  done
  src=$("$build/dlbench" --make-synthetic)
  timeout 400 python3 examples/train_imagenet.py --data "$src" --steps 300 --epochs 0 \
    > "$out/train.log" 2>&1
  row "examples/train_imagenet.py, ResNet-50 bf16, 300 steps" "exit $? $(tail -1 "$out/train.log")"
fi

# 6. The wheel made with `pip wheel .` on the build machine (WHEEL_DIR, default dist/), installed
# with this machine's pip into a folder of its own (this machine's Python and torch, which may
# live in a virtual environment a new venv would not see) and used from elsewhere.
wheel=$(ls "${WHEEL_DIR:-dist}"/ringfeed-*.whl 2> /dev/null | head -1)
if has wheel && [ -n "$wheel" ]; then
  rm -rf /tmp/ringfeed-wheel-site
  python3 -m pip install --no-index --no-deps --target /tmp/ringfeed-wheel-site "$wheel" > "$out/wheel.log" 2>&1
  src=$("$build/dlbench" --make-synthetic)
  (cd /tmp && env -u RINGFEED_LIBRARY PYTHONPATH=/tmp/ringfeed-wheel-site python3 -c "
import sys, ringfeed, torch
assert ringfeed.__file__.startswith('/tmp/ringfeed-wheel-site/')
n = 0
with ringfeed.Loader('$src', batch_size=64, device='cuda:0', epochs=1) as loader:
    for b in loader:
        assert b['image'].is_cuda
        n += b['image'].shape[0]
print('python', sys.version.split()[0], 'torch', torch.__version__, n, 'images on cuda:0')
") >> "$out/wheel.log" 2>&1
  row "$(basename "$wheel") installed by pip --target, imported from elsewhere" "exit $? ($(tail -1 "$out/wheel.log"))"
fi

# Only a few files come back from the machine: the table, and the logs and JSON in one archive.
cp "$table" "$dest/table.md"
tar -czf "$dest/all.tar.gz" -C "$out" .
echo
cat "$table"
