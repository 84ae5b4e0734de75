#!/bin/sh
# JPEG decoding on the GPU: its checks and figures in one run on a GPU machine, over binaries built
# elsewhere (`make device`) and the shards tests/make_shards.sh made. The one thing compiled here is
# the check of ringfeed's nvJPEG declarations against this machine's nvjpeg.h. Every step has its own
# time limit and adds its output to $OUT/run.log and its row to $OUT/table.md as it finishes (so a
# run cut short still tells where it was); the table is printed last.
# Usage: bench/gpu_decode_run.sh [BUILD_DIR] [SHARDS_DIR] [PARTS]
#   PARTS: any of abi tests start cpu ceiling bench idle trace check firstrun autostart train sanitize
#   (default: all but idle, trace, check, firstrun and autostart; check needs BASE=DIR, a dlbench built
#   from the version before, which firstrun and autostart also run where given); N=images per
#   synthetic set; SKIP=torch leaves out the PyTorch contenders; RF_WORKERS=N ringfeed's workers
#   (default: workers=auto); IDLE_VARIANTS: what the idle part runs side by side, each an environment
#   assignment, bin=DIR (a dlbench built otherwise) or opt=K=V (a loader option: --option K=V)
#   (e.g. "DL_LOG_LEVEL=1 DL_LOG_LEVEL=4"; default:
#   one run as is); IDLE_SHARES: its splits (default: auto 0.75 0.875); IDLE_STEP_MS_q90 and
#   IDLE_STEP_MS_q96: its steps (default: 1.2x the first variant's batch time); CEILING_ARGS: the ceiling
#   part's nvjpeg_ceiling runs, separated by '|' (default: the list below); TESTS: the tests part's
#   tests; TEST_RUNS=N runs each N times (the first one's lines in the table, the others' exits);
#   NVJPEG_START_ARGS: the start part's nvjpeg_start runs, separated by '|'; START_SETS and
#   START_MODES: the sets (default q90, and q96 where FIRST_SETS makes it) and decode modes of its first
#   batches; START_WORKERS: their workers (default: nproc; auto: the loader's choice); BENCH_SETS:
#   the bench part's sets (default: q90 q96)
set -u
build=${1:-build-device}
shards=${2:-$build/tests/shards}
parts=${3:-abi tests start cpu ceiling sanitize bench train}
n=${N:-10000}
dest=${OUT:-out}
out=$(mktemp -d /tmp/ringfeed-gpu-decode.XXXXXX)
mkdir -p "$dest"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/ringfeed-cache}
export DL_LOG_LEVEL=${DL_LOG_LEVEL:-1}
workers=$(nproc)
table="$dest/table.md"
: > "$table"
: > "$dest/run.log"
row() { echo "| $1 | $2 |" >> "$table"; }
# Appends a step's log to run.log, under its name.
keep() { for f in "$@"; do printf '\n===== %s\n' "$(basename "$f")" >> "$dest/run.log"; tail -c 20000 "$f" >> "$dest/run.log"; done; }
num() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" | head -1; }
# The GPU's idle gaps under --step-ms: how many over 1 ms, their time, the largest and the step after it.
gaps() { echo "$(num "$1" gpu_idle_gaps_over_1ms) gaps over 1 ms ($(num "$1" gpu_idle_over_1ms_ms) ms), the largest $(sed -n 's/.*"gpu_idle_largest":\[{"step":\([0-9]*\),"ms":\([0-9.]*\).*/\2 ms before step \1/p' "$1")"; }
# A list of numbers, rounded: "1 2 3".
nums() { sed -n "s/.*\"$2\": *\[\([^]]*\)\].*/\1/p" "$1" | head -1 | tr ',' '\n' | awk '{ printf "%s%.0f", (NR > 1 ? " " : ""), $1 }'; }
str() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1" | head -1; }
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "-" }'; }
# guarded LIMIT STDOUT STDERR CMD...: runs CMD for at most LIMIT seconds; one still running then is
# stuck: where each of its threads is goes to STDERR.stuck.txt (and run.log), and it is killed.
guarded() {
  limit=$1 o=$2 e=$3
  shift 3
  # One file for both is opened once: two opens would each write at their own offset, over the other's lines.
  if [ "$o" = "$e" ]; then "$@" > "$o" 2>&1 & else "$@" > "$o" 2> "$e" & fi
  pid=$!
  waited=0
  while kill -0 $pid 2> /dev/null && [ $waited -lt "$limit" ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $pid 2> /dev/null; then
    cuda-gdb -p $pid -batch -ex "thread apply all bt" > "$e.stuck.txt" 2>&1
    kill -9 $pid
    keep "$e.stuck.txt"
  fi
  wait $pid
}

row "GPU" "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"

# 1. ringfeed's own nvJPEG declarations against the header, and where nvJPEG is.
if has abi; then
  hdr=$(ls /usr/local/cuda/include/nvjpeg.h /usr/local/cuda/targets/*/include/nvjpeg.h 2> /dev/null | head -1)
  if [ -n "$hdr" ]; then
    nvcc -std=c++17 -DDL_WITH_CUDA -Ilib -I"$(dirname "$hdr")" bench/nvjpeg_abi_check.cpp -o "$out/abi_check" \
      > "$out/abi.log" 2>&1 && "$out/abi_check" >> "$out/abi.log" 2>&1
    row "nvJPEG declarations vs $hdr" "exit $? ($(tail -1 "$out/abi.log"))"
    keep "$out/abi.log"
  else
    row "nvJPEG declarations" "no nvjpeg.h on this machine"
  fi
  ls -l /usr/local/cuda/lib64/libnvjpeg* > "$out/nvjpeg-files.txt" 2>&1
  ldd /usr/local/cuda/lib64/libnvjpeg.so.* >> "$out/nvjpeg-files.txt" 2>&1
  keep "$out/nvjpeg-files.txt"
fi

# 2. The tests: GPU decode against the CPU path, the GPU stage with both decoders.
if has tests; then
  for t in ${TESTS:-test_gpu_decode test_cuda}; do
    DL_TEST_SHARDS="$shards" guarded 300 "$out/$t.log" "$out/$t.log" "$build/tests/$t"
    row "$t" "exit $? ($(grep -vE '^ringfeed|^$|^slow consumer' "$out/$t.log" | tail -1))"
    keep "$out/$t.log"
    # Runs after the first (TEST_RUNS), for what fails only now and then: their exit statuses in
    # one row, the log of each that failed in run.log.
    r=2 exits=""
    while [ $r -le "${TEST_RUNS:-1}" ]; do
      DL_TEST_SHARDS="$shards" guarded 300 "$out/$t.run$r.log" "$out/$t.run$r.log" "$build/tests/$t"
      code=$?
      exits="$exits $code"
      [ $code -eq 0 ] || keep "$out/$t.run$r.log"
      r=$((r + 1))
    done
    [ -z "$exits" ] || row "$t, runs 2 to $TEST_RUNS" "exit$exits"
  done
  logs=""
  for t in ${TESTS:-test_gpu_decode test_cuda}; do logs="$logs $out/$t.log"; done
  # -H: every line starts with its file's name, which sed takes off, whether one test ran or several.
  grep -HE "third-party|scans cut|scans read|synthetic|on_error|workers|relative|leaks|slow consumer|compared|resumed" \
    $logs | grep -v "handed out and released" | sed 's/^[^:]*: *//' > "$out/test_lines.txt"
  while read -r line; do row "&nbsp;" "$line"; done < "$out/test_lines.txt"
  if python3 -c "import torch; assert torch.cuda.is_available()" 2> /dev/null; then
    RINGFEED_LIBRARY="$PWD/$build/libringfeed.so" timeout 120 python3 -m pytest -q \
      bindings/python/tests/test_cuda_binding.py > "$out/pytest.log" 2>&1
    row "pytest test_cuda_binding.py" "$(tail -1 "$out/pytest.log")"
    keep "$out/pytest.log"
  fi
fi

# The synthetic sets, made once.
if has ceiling || has bench || has start || has idle || has trace || has check || has firstrun || has autostart; then
  q90=$("$build/dlbench" --synthetic "$n" --make-synthetic 2> "$out/make-q90.log")
  case " ${FIRST_SETS:-q96} " in *" q96 "*)
    q96=$("$build/dlbench" --synthetic "$n" --quality 96 --subsampling 444 --make-synthetic 2> "$out/make-q96.log") ;;
  esac
  # q90s: the q90 set with every component coded with one set of Huffman tables, where FIRST_SETS
  # names it (the device reads such scans in spans that settle their bits alone)
  case " ${FIRST_SETS:-} " in *" q90s "*)
    q90s=$("$build/dlbench" --synthetic "$n" --shared-tables --make-synthetic 2> "$out/make-q90s.log") ;;
  esac
fi

# The first batch on cuda:0 (CUDA already started, as in a training script), on both sets (it is to
# come within 100 ms on q96 4:4:4 too), and where dl_open's time goes. Three runs of each, the index
# cached by the first.
if has start; then
  python3 -c "import time, torch; t = time.time(); torch.zeros(1, device='cuda'); print('torch starts CUDA in %.0f ms' % ((time.time() - t) * 1e3))" \
    > "$out/cuda-start.txt" 2>&1 && row "CUDA start (torch.zeros on cuda, a fresh process)" "$(tail -1 "$out/cuda-start.txt")"
  # START_WORKERS=auto: the loader's own choice (one CPU fewer beside the GPU's decoder), not nproc
  start_workers=${START_WORKERS:-$workers}
  [ "$start_workers" = auto ] && start_workers=""
  for set in ${START_SETS:-q90${q96:+ q96}}; do
    eval src=\$$set
    for mode in ${START_MODES:-cpu gpu auto}; do
      for i in 1 2 3; do
        j="$out/start-$set-$mode-$i.json" e="$out/start-$set-$mode-$i.err"
        guarded 60 "$j" "$e" env DL_LOG_LEVEL=4 "$build/dlbench" "$src" ${start_workers:+--workers $start_workers} \
          --flip --device cuda:0 --decode $mode --stop-after 3 --json
        keep "$j" "$e"
        row "$set first batch, decode=$mode, run $i" "$(num "$j" first_batch_ms) ms (filled by the workers at $(num "$j" first_filled_ms), its slot of $(num "$j" host_batch_bytes) bytes pinned at $(num "$j" first_pinned_ms), its copy queued at $(num "$j" first_queued_ms) with $(num "$j" first_copy_pinned_slots) slot(s) pinned); dl_open $(num "$j" open_ms) ms: index $(num "$j" open_index_ms), devices $(num "$j" open_cuda_ms), GPU JPEG decoders $(num "$j" open_gpu_decode_ms), slots $(num "$j" open_slots_ms), workers $(num "$j" open_workers_ms) ($(grep -o 'workers started in.*' "$e" | head -1)); in the background: $(num "$j" pinned_mb) MB pinned in $(num "$j" pin_ms) ms, nvJPEG started in $(num "$j" gpu_decoders_start_ms) ms; after 3 batches JPEGs decoded by $(str "$j" decode_backend)"
      done
    done
  done
  # nvJPEG's start alone, piece by piece, each variant in a fresh process (bench/nvjpeg_start.c):
  # the engines counted between their handle and their state or after the state, and beside what
  # decode=auto's start has beside it; --sample says where each thread waits. Not run by default:
  # --register (pinning beside the start took it from 0.65 s to 31-36 s on an H100).
  default="--info before|--info after --sample|--info after --busy|--info after --spin 15|--info after --copies"
  default="$default|--info after --delay 1000|--info after --twice|--info after --beside cuda"
  old_ifs=$IFS
  IFS='|'
  set -f
  # shellcheck disable=SC2086
  set -- ${NVJPEG_START_ARGS:-$default}
  IFS=$old_ifs
  set +f
  for args in "$@"; do
    name=$(echo "$args" | tr -d '-' | tr ' ' '_')
    for i in 1 2; do
      j="$out/nvjpeg-start-$name-$i.json"
      # shellcheck disable=SC2086
      guarded 60 "$j" "$out/nvjpeg-start-$name-$i.err" "$build/bench/nvjpeg_start" $args
      keep "$j" "$out/nvjpeg-start-$name-$i.err"
      row "nvJPEG's start, $args${CUDA_MODULE_LOADING:+, CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING}, run $i" "CUDA $(num "$j" cuda_ms) ms, then the $(str "$j" backend) backend's handle $(num "$j" hw_handle_ms) ms, its state $(num "$j" hw_state_ms), counting them $(num "$j" hw_info_ms) ($(num "$j" engines)): $(num "$j" hw_ms) ms in all; the handle on the CPU $(num "$j" hw_handle_cpu_ms) ms, $(num "$j" hw_handle_waits) waits, $(num "$j" hw_handle_faults) page faults, the state $(num "$j" hw_state_cpu_ms) ms, $(num "$j" hw_state_waits), $(num "$j" hw_state_faults) (the process: $(num "$j" hw_state_all_cpu_ms) ms, $(num "$j" hw_state_all_faults) faults)$(grep -q futex_waits "$j" && echo "; the starting thread's futex waits, ms: handle $(sed -n 's/.*"hw_handle_futex_waits_ms":\[\([^]]*\)\].*/\1/p' "$j"), state $(sed -n 's/.*"hw_state_futex_waits_ms":\[\([^]]*\)\].*/\1/p' "$j"); each wait as first seen: handle $(sed -n 's/.*"hw_handle_futexes":\(\[.*\]\),"hw_state_places".*/\1/p' "$j"), state $(sed -n 's/.*"hw_state_futexes":\(\[.*\]\),"dev_calls".*/\1/p' "$j")")$(grep -q again_ "$j" && echo "; again: handle $(num "$j" again_handle_ms), state $(num "$j" again_state_ms)")$(grep -q beside_ "$j" && echo "; beside it, $([ "$(str "$j" beside)" = hw ] && echo "a second engines' start" || echo "the CUDA decoder's"): handle $(num "$j" beside_handle_ms), state $(num "$j" beside_state_ms)")"
    done
  done
fi

# The CPU path against bare libjpeg-turbo full decodes of the same JPEGs on as many threads, on both
# sets (bench/cpu_vs_decode.sh).
if has cpu; then
  for coding in 90:420 96:444; do
    q=${coding%:*} sub=${coding#*:}
    mkdir -p "$out/cpu-q$q"
    QUALITY=$q SUBSAMPLING=$sub OUT="$out/cpu-q$q" timeout 300 sh bench/cpu_vs_decode.sh "$build" "$workers" "$n" \
      > "$out/cpu-q$q.txt" 2>&1
    keep "$out/cpu-q$q.txt"
    row "q$q $sub: dlbench --workers $workers / bare libjpeg-turbo on $workers threads" \
      "$(sed -n 's/^| ringfeed dlbench[^|]*| \([0-9.]*\) |/\1/p' "$out/cpu-q$q.txt") / $(sed -n 's/^| bare[^|]*| \([0-9.]*\) |/\1/p' "$out/cpu-q$q.txt") images/s, ratio $(sed -n 's/^| ratio | \([0-9.]*\) |/\1/p' "$out/cpu-q$q.txt")"
  done
fi

# 3. nvJPEG alone (bench/nvjpeg_ceiling): the engines' rate on whole images, and what each choice
#    of the loader costs: its flags, decoding the crop's region only, more host threads.
if has ceiling; then
  for set in q90 q96; do
    eval src=\$$set
    # (more than two host threads of hardware decode hung in nvJPEG 13.0 on an H200; two beside a
    # busy GPU ran at a third of one thread's rate, so that is not run here). --busy: beside kernels holding every SM, as training does.
    # --pipelined: nvJPEG's own engine pipeline, which the loader turns off; beside the busy kernels
    # it stayed inside nvjpegDecodeBatched (in cuMemFree, called from libnvcuvid) until killed, in
    # every run on H200 hosts with driver 580.159.04: not run here. The shorter limit stays for
    # --busy runs all the same.
    # --band top|bottom: whether a region's place in the image costs the engine, as it costs a CPU
    # decode (decode_ceiling --band, run after these)
    default="--flags none|--flags strict||--pipelined|--roi|--roi --flags strict|--roi --threads 2|--backend cuda"
    default="$default|--prealloc 600x450|--busy|--roi --busy|--band top|--band bottom|--band top --busy|--band bottom --busy"
    old_ifs=$IFS
    IFS='|'
    set -f
    # shellcheck disable=SC2086
    set -- ${CEILING_ARGS:-$default}
    IFS=$old_ifs
    set +f
    for args in "$@"; do
      name=$(echo "$set $args" | tr -d '-' | tr ' ' '_')
      limit=60
      case "$args" in *--busy*) limit=25 ;; esac
      guarded $limit "$out/ceiling-$name.json" "$out/ceiling-$name.err" "$build/bench/nvjpeg_ceiling" $args \
        "$(dirname "$src")"/*.tar
      keep "$out/ceiling-$name.json" "$out/ceiling-$name.err"
      row "$set nvJPEG alone ${args:-(the flags of the loader)}" "$(num "$out/ceiling-$name.json" images_per_s) images/s, $(num "$out/ceiling-$name.json" host_ms_per_call) ms host per call"
    done
    for band in "" top bottom; do
      j="$out/decode-ceiling-$set-$band.json"
      timeout 30 "$build/bench/decode_ceiling" --threads "$workers" --seconds 3 ${band:+--band $band} \
        "$(dirname "$src")"/*.tar > "$j" 2>&1
      row "$set libjpeg-turbo alone, $workers threads, ${band:-whole images}${band:+ halves of the rows}" "$(num "$j" images_per_s) images/s"
    done
    # gpu_check's walk of an image against its decode, one thread (what the check costs a worker)
    j="$out/walk-$set.json"
    [ -x "$build/bench/walk_vs_decode" ] && timeout 120 "$build/bench/walk_vs_decode" "$(dirname "$src")"/*.tar > "$j" 2>&1 &&
      row "$set gpu_check's walk / libjpeg-turbo's decode, one thread" "$(num "$j" walk_ms) / $(num "$j" decode_ms) ms an image: $(num "$j" walk_frac)"
  done
fi

# 4. Side by side on two sets: decode=cpu, gpu, hybrid; nvJPEG alone through torchvision; the
#    PyTorch DataLoader with torchvision.io. RandomResizedCrop(224) + flip, uint8 to cuda:0.
if has bench; then
  for set in ${BENCH_SETS:-q90 q96}; do
    eval src=\$$set
    cat "$(dirname "$src")"/*.tar > /dev/null # into the page cache, for every contender alike
    # ringfeed's workers: workers=auto (a CPU left to nvJPEG's feeding thread where the GPU decodes)
    # unless RF_WORKERS says; the DataLoader has one worker per CPU.
    bench="$build/dlbench $src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json"
    for mode in cpu gpu hybrid auto; do
      guarded 120 "$out/$set-$mode.json" "$out/$set-$mode.err" $bench --epochs 5 --decode $mode
      keep "$out/$set-$mode.json" "$out/$set-$mode.err"
    done
    # hybrid at fixed splits: where the adaptive one should land
    for share in ${SHARES-0.5 0.6 0.7 0.8 0.9}; do
      j="$out/$set-share-$share.json"
      guarded 120 "$j" "$out/$set-share-$share.err" $bench --epochs 5 --decode hybrid --option gpu_share=$share
      keep "$j" "$out/$set-share-$share.err"
      row "$set hybrid gpu_share=$share" "$(num "$j" steady_samples_per_s) images/s steady; GPU decode $(num "$j" gpu_decode_ms) ms/batch"
    done
    # auto decodes on the CPU while nvJPEG starts (about half a second, a quarter of a 5-epoch run):
    # its rate once the start is a small part of the run
    j="$out/$set-auto-long.json"
    guarded 120 "$j" "$out/$set-auto-long.err" $bench --epochs 25 --decode auto
    keep "$j" "$out/$set-auto-long.err"
    row "$set decode=auto, 25 epochs" "$(num "$j" steady_samples_per_s) images/s steady, share $(num "$j" gpu_share)"
    [ "${SKIP:-}" = torch ] || timeout 120 python3 bench/nvjpeg_alone.py --shards "$src" --batch 256 --epochs 2 > "$out/$set-tv-alone.json" \
      2> "$out/$set-tv-alone.err"
    keep "$out/$set-tv-alone.json" "$out/$set-tv-alone.err"
    [ "${SKIP:-}" = torch ] || timeout 150 python3 bench/compare_torch.py --only torch-tvio --shards "$src" --workers "$workers" --batch 256 \
      --epochs 2 --device cuda:0 > "$out/$set-dataloader.json" 2> "$out/$set-dataloader.err"
    keep "$out/$set-dataloader.json" "$out/$set-dataloader.err"
    cpu=$(num "$out/$set-cpu.json" steady_samples_per_s)
    dl=$(num "$out/$set-dataloader.json" images_per_s)
    for mode in cpu gpu hybrid auto; do
      j="$out/$set-$mode.json"
      row "$set decode=$mode" "$(num "$j" workers) workers ($(num "$j" workers_active) at work at the end): $(num "$j" steady_samples_per_s) images/s steady ($(num "$j" samples_per_s) with start-up), x$(ratio "$(num "$j" steady_samples_per_s)" "$cpu") of cpu, x$(ratio "$(num "$j" steady_samples_per_s)" "$dl") of DataLoader; first batch $(num "$j" first_batch_ms) ms; gpu $(num "$j" gpu_decoded) / cpu $(num "$j" cpu_decoded) images, fallbacks $(num "$j" gpu_fallbacks), share $(num "$j" gpu_share); GPU decode $(num "$j" gpu_decode_ms) ms/batch (copy thread $(num "$j" gpu_decode_host_ms) ms in it, $(num "$j" gpu_decode_host_cpu_ms) on a CPU, taken off it $(num "$j" gpu_decode_preempted) times), copies $(num "$j" h2d_gpu_ms) ms total at $(num "$j" h2d_gb_s) GB/s; bottleneck $(str "$j" bottleneck), the side of the split that limits it: $(str "$j" split_limit); pinned $(num "$j" pinned_mb) MB, device $(num "$j" device_mb) MB ours, $(num "$j" device_mem_open_mb) MB at open / $(num "$j" device_mem_end_mb) MB at the end in all, RSS $(num "$j" peak_rss_mb) MB; CPU $(num "$j" cpu_s) s in all"
    done
    row "$set nvJPEG alone (torchvision decode_jpeg device=cuda, batch 256, whole images)" "$(num "$out/$set-tv-alone.json" images_per_s) images/s, $(num "$out/$set-tv-alone.json" mean_jpeg_kb) KB per JPEG"
    row "$set PyTorch DataLoader, torchvision.io, $workers workers" "$dl images/s steady"
    hyb=$(num "$out/$set-hybrid.json" steady_samples_per_s)
    row "$set hybrid / cpu, / DataLoader, / nvJPEG alone" "$(ratio "$hyb" "$cpu"), $(ratio "$hyb" "$dl"), $(ratio "$hyb" "$(num "$out/$set-tv-alone.json" images_per_s)")"
    step=$(awk -v s="$hyb" 'BEGIN{ if (s > 0) printf "%.3f", 1.2 * 256 / s * 1000; else print 100 }')
    for mode in $(for r in $(seq ${STEP_REPEATS:-1}); do echo gpu hybrid; done); do
      guarded 90 "$out/$set-$mode-step.json" "$out/$set-$mode-step.err" $bench --epochs 3 --decode $mode --step-ms "$step"
      keep "$out/$set-$mode-step.json" "$out/$set-$mode-step.err"
      row "$set $mode, GPU consumer --step-ms $step (1.2 x hybrid's batch time)" "gpu_idle_frac $(num "$out/$set-$mode-step.json" gpu_idle_frac) in $(gaps "$out/$set-$mode-step.json"), $(num "$out/$set-$mode-step.json" samples_per_s) images/s, share $(num "$out/$set-$mode-step.json" gpu_share), GPU decode $(num "$out/$set-$mode-step.json" gpu_decode_ms) ms/batch"
    done
    # The same over 10 epochs: how much of the idle time is the start (the split settling under the
    # consumer's load, the ring filling) and how much is steady
    j="$out/$set-hybrid-step-long.json"
    guarded 90 "$j" "$out/$set-hybrid-step-long.err" $bench --epochs 10 --decode hybrid --step-ms "$step"
    keep "$j" "$out/$set-hybrid-step-long.err"
    row "$set hybrid, GPU consumer --step-ms $step, 10 epochs" "gpu_idle_frac $(num "$j" gpu_idle_frac) in $(gaps "$j"), $(num "$j" samples_per_s) images/s, share $(num "$j" gpu_share), GPU decode $(num "$j" gpu_decode_ms) ms/batch"
    # The same consumer in kernels of 0.1 ms (a model's are mostly shorter: bench/model_kernels.py):
    # whether the loader's GPU work waits for the 1 ms kernels to finish
    j="$out/$set-hybrid-step-short.json"
    guarded 90 "$j" "$out/$set-hybrid-step-short.err" $bench --epochs 3 --decode hybrid --step-ms "$step" --step-kernel-ms 0.1
    keep "$j" "$out/$set-hybrid-step-short.err"
    row "$set hybrid, GPU consumer --step-ms $step in kernels of 0.1 ms" "gpu_idle_frac $(num "$j" gpu_idle_frac) in $(gaps "$j"), $(num "$j" samples_per_s) images/s, share $(num "$j" gpu_share)"
    # The CPU path under a consumer slower than it (workers=auto sets the workers it does not need aside)
    cstep=$(awk -v s="$cpu" 'BEGIN{ if (s > 0) printf "%.3f", 1.2 * 256 / s * 1000; else print 100 }')
    j="$out/$set-cpu-step.json"
    guarded 90 "$j" "$out/$set-cpu-step.err" $bench --epochs 3 --decode cpu --step-ms "$cstep"
    keep "$j" "$out/$set-cpu-step.err"
    row "$set cpu, GPU consumer --step-ms $cstep (1.2 x cpu's batch time)" "gpu_idle_frac $(num "$j" gpu_idle_frac) in $(gaps "$j"), $(num "$j" samples_per_s) images/s, $(num "$j" workers_active) of $(num "$j" workers) workers at work at the end, $(num "$j" parked_s) s set aside"
  done
fi

# 4b. Where hybrid's GPU idle under a consumer at 1.2x its batch time comes from: the copy thread's
#    time per batch by what it waited for (the workers' batch, the consumer's slot, the kernels
#    still reading the decode pool) and spent in nvJPEG, adaptive and at fixed splits, over 10
#    epochs. The step is hybrid's own batch time (no consumer) x 1.2, measured under the first variant.
if has idle; then
  for set in q90 q96; do
    eval src=\$$set
    cat "$(dirname "$src")"/*.tar > /dev/null
    args="$src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json"
    eval step=\${IDLE_STEP_MS_$set:-}
    # One epoch first, so that the GPU check's verdicts are kept and no run below pays for them
    # (a first run on a fresh machine reads every scan: its rate would set too slow a step).
    "$build/dlbench" $args --epochs 1 --decode hybrid > /dev/null 2>&1
    # The variants take turns at each split, so that a host's drift falls on all of them alike.
    for share in ${IDLE_SHARES:-auto 0.75 0.875}; do
      for variant in ${IDLE_VARIANTS:-DL_LOG_LEVEL=$DL_LOG_LEVEL}; do
        tag=$(echo "$variant" | tr -c 'A-Za-z0-9\n' '_')
        bin=$build setting=$variant option=
        case "$variant" in
        bin=*) bin=${variant#bin=} setting=DL_LOG_LEVEL=$DL_LOG_LEVEL ;;
        opt=*) option="--option ${variant#opt=}" setting=DL_LOG_LEVEL=$DL_LOG_LEVEL ;;
        esac
        # Each variant's rate with no consumer, at the first split; the first variant's sets the step.
        j="$out/$set-idle-free-$tag.json"
        if [ ! -f "$j" ]; then
          guarded 120 "$j" "$out/$set-idle-free-$tag.err" env "$setting" "$bin/dlbench" $args $option --epochs 5 --decode hybrid
          keep "$j"
          [ -n "$step" ] || step=$(awk -v s="$(num "$j" steady_samples_per_s)" 'BEGIN{ if (s > 0) printf "%.3f", 1.2 * 256 / s * 1000; else print 100 }')
          row "$set hybrid, no consumer ($variant)" "$(num "$j" steady_samples_per_s) images/s steady, share $(num "$j" gpu_share) (balanced $(num "$j" gpu_share_balanced)), GPU decode $(num "$j" gpu_decode_ms) ms/batch, $(num "$j" split_cpu_ms_per_image) ms an image on a worker (and $(num "$j" split_walk_ms_per_image) for each of the GPU's), $(num "$j" cuda_queues) CUDA queues, the side that limits: $(str "$j" split_limit): step $step ms"
        fi
        j="$out/$set-idle-$share-$tag.json"
        guarded 90 "$j" "$out/$set-idle-$share-$tag.err" env "$setting" "$bin/dlbench" $args $option --epochs 10 --decode hybrid \
          --option gpu_share=$share --step-ms "$step"
        keep "$j" "$out/$set-idle-$share-$tag.err"
        row "$set hybrid gpu_share=$share, --step-ms $step, 10 epochs ($variant)" "gpu_idle_frac $(num "$j" gpu_idle_frac) in $(gaps "$j"), $(num "$j" cuda_queues) CUDA queues; the loader saw its stream wait $(num "$j" consumer_stream_wait_s) s; $(num "$j" samples_per_s) images/s, share $(num "$j" gpu_share) (balanced $(num "$j" gpu_share_balanced) from $(num "$j" split_gpu_ms_per_image) ms an image on the GPU and $(num "$j" split_cpu_ms_per_image) on a worker; $(num "$j" gpu_share_moves) moves, $(num "$j" gpu_share_holds) drifts held back); per batch: GPU decode $(num "$j" gpu_decode_ms) ms, the copy thread $(num "$j" gpu_decode_host_ms) ms in it ($(num "$j" gpu_decode_pool_wait_ms) waiting for the pool), $(num "$j" gpu_stage_wait_workers_ms) waiting for the workers, $(num "$j" gpu_stage_wait_consumer_ms) for the consumer; workers $(num "$j" workers_active) of $(num "$j" workers), $(num "$j" parked_s) s set aside, decoding $(num "$j" worker_decode_frac), waiting for slots $(num "$j" worker_slot_wait_frac)"
      done
    done
  done
fi

# 4b'. The same consumer on a GPU timeline (bench/gpu_timeline.c, CUPTI): every gap in the
#    consumer's stream, put down to a host that queued the step late or to the GPU holding it, and
#    what ran on the other streams meanwhile (bench/timeline_gaps.py). Runs without the trace
#    beside them say what tracing itself costs. decode=cpu is the reference that idles 0.0001.
if has trace && [ -f "$build/bench/libgpu_timeline.so" ]; then
  for set in q90 q96; do
    eval src=\$$set
    cat "$(dirname "$src")"/*.tar > /dev/null
    eval step=\${IDLE_STEP_MS_$set:-20}
    "$build/dlbench" $src --batch 256 --size 224 --flip --device cuda:0 --epochs 1 --decode hybrid > /dev/null 2>&1
    for mode in ${TRACE_MODES:-hybrid cpu}; do
      args="$src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json --epochs ${TRACE_EPOCHS:-3} --decode $mode --step-ms $step"
      j="$out/$set-trace-$mode-plain.json"
      guarded 90 "$j" "$out/$set-trace-$mode-plain.err" "$build/dlbench" $args
      keep "$j" "$out/$set-trace-$mode-plain.err"
      j="$out/$set-trace-$mode.json"
      guarded 180 "$j" "$out/$set-trace-$mode.err" env CUDA_INJECTION64_PATH="$PWD/$build/bench/libgpu_timeline.so" \
        GPU_TIMELINE_OUT="$out/$set-trace-$mode.tsv" "$build/dlbench" $args
      keep "$j" "$out/$set-trace-$mode.err"
      timeout 120 python3 bench/timeline_gaps.py "$out/$set-trace-$mode.tsv" > "$out/$set-trace-$mode.txt" 2>&1
      keep "$out/$set-trace-$mode.txt"
      gzip -c "$out/$set-trace-$mode.tsv" > "$dest/$set-trace-$mode.tsv.gz"
      row "$set $mode, --step-ms $step, traced" "gpu_idle_frac $(num "$out/$set-trace-$mode-plain.json" gpu_idle_frac) untraced, $(num "$j" gpu_idle_frac) traced; $(head -1 "$out/$set-trace-$mode.txt"); $(sed -n 2,4p "$out/$set-trace-$mode.txt" | tr '\n' ';')"
    done
  done
fi

# 4c. The GPU check's verdicts kept across runs, and hybrid's split by what a crop costs a worker,
#    against BASE (a dlbench of the version before, built otherwise): hybrid with no consumer (5
#    epochs with the verdicts not yet kept, then kept; 8 epochs for a worker's time per image) and
#    beside a consumer stepping at 1.2x the kept run's batch time, 3 and 10 epochs.
if has check && [ -x "${BASE:-}/dlbench" ]; then
  forget() { rm -f "$XDG_CACHE_HOME"/ringfeed/*.rfcheck; } # the verdicts earlier runs kept
  for set in q90 q96; do
    eval src=\$$set
    cat "$(dirname "$src")"/*.tar > /dev/null
    args="$src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json --decode hybrid"
    forget
    for run in cold kept base; do
      bin=$build
      [ $run = base ] && bin=$BASE
      j="$out/$set-check-$run.json"
      guarded 120 "$j" "$out/$set-check-$run.err" "$bin/dlbench" $args --epochs 5
      keep "$j" "$out/$set-check-$run.err"
      row "$set hybrid 5 epochs, $run" "$(num "$j" steady_samples_per_s) images/s steady ($(num "$j" samples_per_s) with start-up), share $(num "$j" gpu_share); scans read $(num "$j" gpu_check_read), verdicts kept from before $(num "$j" gpu_check_kept)"
    done
    step=$(awk -v s="$(num "$out/$set-check-kept.json" steady_samples_per_s)" 'BEGIN{ if (s > 0) printf "%.3f", 1.2 * 256 / s * 1000; else print 100 }')
    for round in 1 2; do
      for run in base kept; do
        bin=$build
        [ $run = base ] && bin=$BASE
        j="$out/$set-split-$run-$round.json"
        guarded 120 "$j" "$out/$set-split-$run-$round.err" "$bin/dlbench" $args --epochs 8
        keep "$j"
        row "$set hybrid 8 epochs, $run, round $round" "$(num "$j" steady_samples_per_s) images/s steady, share $(num "$j" gpu_share) (balanced $(num "$j" gpu_share_balanced)), $(num "$j" split_cpu_ms_per_image) ms an image on a worker, $(num "$j" split_gpu_ms_per_image) on the GPU"
      done
    done
    for epochs in 3 10; do
      for run in base cold kept; do
        bin=$build
        [ $run = base ] && bin=$BASE
        [ $run = cold ] && [ $epochs = 10 ] && continue
        [ $run = cold ] && forget
        j="$out/$set-check-step-$run-$epochs.json"
        guarded 120 "$j" "$out/$set-check-step-$run-$epochs.err" "$bin/dlbench" $args --epochs $epochs --step-ms "$step"
        keep "$j" "$out/$set-check-step-$run-$epochs.err"
        row "$set hybrid, --step-ms $step, $epochs epochs, $run" "gpu_idle_frac $(num "$j" gpu_idle_frac) in $(gaps "$j"); $(num "$j" samples_per_s) images/s, share $(num "$j" gpu_share), scans read $(num "$j" gpu_check_read), kept $(num "$j" gpu_check_kept)"
      done
    done
  done
fi

# 4d. A dataset's first run, when gpu_check reads every scan the GPU takes (no verdicts kept from an
#    earlier run): hybrid 5 epochs against gpu_check=0, and with BASE=DIR against the version before,
#    in turn, FIRST_ROUNDS rounds (default 2), over FIRST_SETS (default "q90 q96"; "q90" alone makes
#    no q96 set, for the other parts either; "q90s" adds the q90 set coded with one set of tables);
#    FIRST_RFS=1 converts each set to ringfeed shards first (dlshard create), whose writer gave the
#    verdicts. What the check costs is 1 - first / unchecked.
if has firstrun; then
  forget() { rm -f "$XDG_CACHE_HOME"/ringfeed/*.rfcheck; }
  runs="first unchecked"
  [ -x "${BASE:-}/dlbench" ] && runs="base $runs"
  for set in ${FIRST_SETS:-q90 q96}; do
    eval src=\$$set
    cat "$(dirname "$src")"/*.tar > /dev/null
    if [ -n "${FIRST_RFS:-}" ]; then # the same images as ringfeed shards, whose writer read every scan
      mkdir -p "$out/$set-rfs"
      "$build/dlshard" create "$out/$set-rfs/s" "$src" --threads "$workers" > "$out/$set-rfs.log" 2>&1
      src="$out/$set-rfs/s-*.rfs"
    fi
    args="$src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json --decode hybrid --epochs 5"
    round=1
    while [ $round -le "${FIRST_ROUNDS:-2}" ]; do
      for run in $runs; do
        bin=$build check=1
        [ $run = base ] && bin=$BASE
        [ $run = unchecked ] && check=0
        forget
        j="$out/$set-first-$run-$round.json"
        guarded 120 "$j" "$out/$set-first-$run-$round.err" "$bin/dlbench" $args --option gpu_check=$check
        keep "$j" "$out/$set-first-$run-$round.err"
        row "$set hybrid 5 epochs, first run, $run, round $round" "$(num "$j" steady_samples_per_s) images/s steady ($(num "$j" samples_per_s) with start-up; by epoch $(nums "$j" epochs_samples_per_s)), share $(num "$j" gpu_share) (balanced $(num "$j" gpu_share_balanced)), $(num "$j" split_cpu_ms_per_image) ms an image on a worker and $(num "$j" split_walk_ms_per_image) for each of the GPU's, $(num "$j" split_gpu_ms_per_image) on the GPU; scans read $(num "$j" gpu_check_read) ($(num "$j" gpu_walks) on the GPU, the copy thread waiting $(num "$j" gpu_walk_wait_ms) ms a batch for them), verdicts from the shards $(num "$j" gpu_check_from_shards); the side that limits: $(str "$j" split_limit)"
      done
      round=$((round + 1))
    done
  done
fi

# 4e. decode=auto (the default) against hybrid over 5 epochs, each in a fresh process as a training
#    script starts one: steady (from the first batch) and with start-up (from dl_open, which for
#    hybrid waits for nvJPEG's start while auto decodes on the CPU meanwhile); with BASE=DIR, the
#    version before in turn. AUTO_SETS (default "q90 q96"), AUTO_ROUNDS (default 2); AUTO_FIRST_AFTER=MS
#    takes each run's first batch MS ms after dl_open, as a training script that opens its loader
#    before building its model (nvJPEG then starts while the model is made; BASE's dlbench must
#    know --first-after, 5bf1252 or later); AUTO_SECOND=1 measures each run's second loader
#    (dlbench --second-loader), as a training loop's later epochs find their process.
if has autostart; then
  runs="new"
  [ -x "${BASE:-}/dlbench" ] && runs="base new"
  for set in ${AUTO_SETS:-q90 q96}; do
    eval src=\${$set:-} # q96 is made only where FIRST_SETS names it (or is unset)
    [ -n "$src" ] || continue
    args="$src ${RF_WORKERS:+--workers $RF_WORKERS} --batch 256 --size 224 --flip --device cuda:0 --json --epochs 5"
    late=${AUTO_FIRST_AFTER:+, first batch taken ${AUTO_FIRST_AFTER} ms after dl_open}${AUTO_SECOND:+, the second loader of each process (--second-loader)}
    "$build/dlbench" $args --decode hybrid > /dev/null 2>&1 # the index cached, the scans' verdicts kept
    round=1
    while [ $round -le "${AUTO_ROUNDS:-2}" ]; do
      for run in $runs; do
        bin=$build
        [ $run = base ] && bin=$BASE
        for mode in hybrid auto; do
          j="$out/$set-start-$mode-$run-$round.json"
          guarded 120 "$j" "$out/$set-start-$mode-$run-$round.err" env DL_LOG_LEVEL=4 "$bin/dlbench" $args --decode $mode \
            ${AUTO_FIRST_AFTER:+--first-after $AUTO_FIRST_AFTER} ${AUTO_SECOND:+--second-loader}
          keep "$j"
        done
        h="$out/$set-start-hybrid-$run-$round.json" a="$out/$set-start-auto-$run-$round.json"
        row "$set auto / hybrid, 5 epochs$late, $run, round $round" "steady $(ratio "$(num "$a" steady_samples_per_s)" "$(num "$h" steady_samples_per_s)") ($(num "$a" steady_samples_per_s) / $(num "$h" steady_samples_per_s)), with start-up $(ratio "$(num "$a" samples_per_s)" "$(num "$h" samples_per_s)") ($(num "$a" samples_per_s) / $(num "$h" samples_per_s)); hybrid's dl_open $(num "$h" open_ms) ms ($(grep -o 'nvJPEG on cuda:0 started in [0-9]* ms' "$out/$set-start-hybrid-$run-$round.err" | head -1)); auto's first batch $(num "$a" first_batch_ms) ms, nvJPEG ready $(num "$a" gpu_decoders_start_ms) ms after the starter began, $(num "$a" gpu_decoded) of $(num "$a" samples) images on the GPU; the GPU's part hybrid / auto $(num "$h" split_gpu_ms_per_image) / $(num "$a" split_gpu_ms_per_image) ms an image, the copy thread taken off its CPU $(num "$h" gpu_decode_preempted) / $(num "$a" gpu_decode_preempted) times a batch"
      done
      round=$((round + 1))
    done
  done
fi

# 5. Training: a real model fed by ringfeed against the same model on one batch kept on the GPU
#    (bench/train_fed_vs_held.sh: ResNet-50 and a host-bound ViT, the ratios, and with TRACE=1
#    timelines of a held and a fed run that say where a fed step's extra time goes).
if has train && python3 -c "import torch, torchvision; assert torch.cuda.is_available()" 2> /dev/null; then
  # What a model's step is made of (for the consumer that stands for one under --step-ms)
  timeout 120 python3 bench/model_kernels.py > "$out/model-kernels.json" 2> "$out/model-kernels.err"
  keep "$out/model-kernels.json" "$out/model-kernels.err"
  row "ResNet-50 training step's kernels (bf16, batch 256)" "$(cat "$out/model-kernels.json")"
  src=$("$build/dlbench" --synthetic "$n" --make-synthetic 2> /dev/null)
  RINGFEED_LIBRARY="$PWD/$build/libringfeed.so" TRACE=${TRACE:+$build/bench} \
    bench/train_fed_vs_held.sh "$src" "$out/train" > "$out/train-table.md" 2> "$out/train.err"
  cat "$out/train-table.md" >> "$table"
  keep "$out/train.err" "$out"/train/*.log
  if [ -n "${TRACE:-}" ]; then
    keep "$out"/train/*.txt
    cp "$out"/train/*.txt "$dest"/
  fi
fi

# 6. Memory and race checks of the GPU tests (last: the slowest).
if has sanitize && command -v compute-sanitizer > /dev/null; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    for t in ${SANITIZE_TESTS:-test_cuda test_gpu_decode}; do
      DL_TEST_SHARDS="$shards" RINGFEED_UNDER_SANITIZER=1 timeout ${SANITIZE_LIMIT:-240} compute-sanitizer --tool $tool \
        --error-exitcode 9 "$build/tests/$t" > "$out/sanitizer-$tool-$t.log" 2>&1
      row "compute-sanitizer $tool $t" "exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' \
        "$out/sanitizer-$tool-$t.log" | tail -1))"
      keep "$out/sanitizer-$tool-$t.log"
    done
  done
fi

tar -czf "$dest/all.tar.gz" -C "$out" .
echo
cat "$table"
