#!/bin/sh
# A real model fed by ringfeed against the same model on one batch kept on the GPU (its own rate),
# side by side in one run, with the ratio: examples/train_imagenet.py --held, --held --beside (the
# loader running beside the model, its batches dropped: what its work costs the model without its
# batches in the step) and fed with the default options and with decode=cpu. With TRACE=DIR (a
# folder holding libgpu_timeline.so) the held and fed runs are traced again, and
# bench/train_timeline.py says where the fed step's extra time goes.
# Usage: bench/train_fed_vs_held.sh DATA [OUT_DIR]   (needs RINGFEED_LIBRARY, torch with CUDA)
#   MODELS: "resnet50 vit_tiny" by default; STEPS (300); BATCH_resnet50 (256), BATCH_vit_tiny (128);
#   VARIANTS: loader options (KEY=VALUE ..., KEY=VALUE+KEY=VALUE for several in one run), each also
#   run fed and beside (fed only with VARIANTS_FED_ONLY=1); TRACE_FED_FLAGS: the
#   traced fed run's flags (such as "--decode cpu"), TRACE_STEPS its steps (80); TRACE_ONLY=1: the
#   traces alone; REPEAT=R: R pairs of held and fed runs, the ratio of each, their median and where
#   each fed run's split ended;
#   ALTERNATE=N: one more run (ALTERNATE_STEPS long, STEPS by default) of N-step blocks held and fed
#   in turn in one process (each fed block follows a pause of the loader's consumer), ALTERNATE_RUNS
#   such runs (1), and with ALTERNATE_ONLY=1 these alone; each says how far its held blocks moved,
#   and several give the median of their ratios, over all and over those whose held blocks moved
#   QUIET at most (0.03: a host whose own rate moves more cannot show 1%); ORDER=R: R
#   pairs of fed runs (ORDER_STEPS, 60), the loader opened before the model is built
#   (--loader-first) and after it (the example's order), for the start-up and rate each gives
set -u
data=$1
out=${2:-out}
mkdir -p "$out"
steps=${STEPS:-300}
if [ -n "${ALTERNATE_ONLY:-}" ] && [ -z "${ALTERNATE:-}" ]; then
  echo "train_fed_vs_held: ALTERNATE_ONLY=1 needs ALTERNATE=N, the steps of a block" >&2
  exit 2
fi
# counts given wrong would end the loops at once with a shell message and no run: said here instead
for v in ALTERNATE ALTERNATE_RUNS REPEAT ORDER; do
  eval val=\${$v:-1}
  least=1
  [ $v = ORDER ] && least=0  # (no start-up pairs, its default)
  case $val in *[!0-9]* | 0?* | "") bad=1 ;; *) bad=$((val < least)) ;; esac
  if [ $bad = 1 ]; then
    echo "train_fed_vs_held: $v=$val: give a whole number of $least or more" >&2
    exit 2
  fi
done
traces=$(mktemp -d /tmp/ringfeed-train-trace.XXXXXX)  # large: left on the machine
steady() { sed -n 's/.*"steady_images_per_s_per_gpu": *\([0-9.]*\).*/\1/p' "$1" | tail -1; }
field() { sed -n "s/.*\"$2\": *\([^,}]*\).*/\1/p" "$1" | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0 && a > 0) printf "%.4f", a / b; else print "-" }'; }  # A / B
median() {  # of the arguments; "-" for none
  [ $# -gt 0 ] || { echo -; return; }
  printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { printf "%.4f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
for model in ${MODELS:-resnet50 vit_tiny}; do
  eval batch=\${BATCH_$model:-}
  [ -n "$batch" ] || { [ $model = vit_tiny ] && batch=128 || batch=256; }
  run() {  # NAME FLAGS...
    name=$1
    shift
    timeout ${TRAIN_LIMIT:-300} python3 examples/train_imagenet.py --data "$data" --model $model \
      --batch-size $batch --steps $steps --epochs 0 "$@" > "$out/train-$model-$name.log" 2>&1
    echo "$?"
  }
  # ALTERNATE_RUNS runs of held and fed blocks in turn, a row each, and with several the median of
  # their ratios: over all, and over the runs whose held blocks moved QUIET at most
  alternate_runs() {
    ratios= quiet=
    r=1
    while [ $r -le "${ALTERNATE_RUNS:-1}" ]; do
      name=alternate
      [ $r = 1 ] || name=alternate-$r
      log="$out/train-$model-$name.log"
      rc_alt=$(run $name --alternate "$ALTERNATE" --steps "${ALTERNATE_STEPS:-$steps}")
      pair=$(field "$log" median_pair_ratio) moved=$(field "$log" held_moved)
      printf '| %s fed / held in %s-step blocks of one process, run %s (exit %s) | median step held / fed %s; blocks: median of the pairs %s, ratio of the medians %s; pairs %s; the held blocks moved %s |\n' \
        $model "$ALTERNATE" $r "$rc_alt" "$(field "$log" ratio_of_median_steps)" "$pair" "$(field "$log" ratio_of_medians)" \
        "$(sed -n 's/.*"pair_ratios": *\(\[[0-9., ]*\]\).*/\1/p' "$log" | tail -1)" "$moved"
      case $pair in [0-9]*)
        ratios="$ratios $pair"
        awk -v m="$moved" -v q="${QUIET:-0.03}" 'BEGIN { exit !(m ~ /^[0-9.]+$/ && m + 0 <= q + 0) }' && quiet="$quiet $pair" ;;
      esac
      r=$((r + 1))
    done
    [ "${ALTERNATE_RUNS:-1}" -gt 1 ] && printf '| %s fed / held in blocks, %s runs | median %s of%s; over the %s runs whose held blocks moved %s at most: %s |\n' \
      $model "$ALTERNATE_RUNS" "$(median $ratios)" "$ratios" "$(echo $quiet | wc -w)" "${QUIET:-0.03}" "$(median $quiet)"
  }
  if [ -n "${ALTERNATE_ONLY:-}" ]; then
    alternate_runs
  elif [ -z "${TRACE_ONLY:-}" ]; then
    rc_held=$(run held --held)
    rc_beside=$(run beside --held --beside)
    rc_fed=$(run fed)
    rc_cpu=$(run fed-cpu --decode cpu)
    # VARIANTS: loader options (KEY=VALUE, space-separated), each run fed and beside
    for v in ${VARIANTS:-}; do
      opts=$(echo "$v" | tr '+' ' ' | sed 's/\([^ ]*\)/--option \1/g')
      # shellcheck disable=SC2086
      run "fed-$v" $opts > /dev/null
      # shellcheck disable=SC2086
      [ -n "${VARIANTS_FED_ONLY:-}" ] || run "beside-$v" --held --beside $opts > /dev/null
    done
    # REPEAT=R: R-1 more pairs of held and fed, one after the other, for the spread of the ratio
    # from run to run (a host-bound model's rate moves by several percent between runs)
    pairs=$(ratio "$(steady "$out/train-$model-fed.log")" "$(steady "$out/train-$model-held.log")")
    splits="$(field "$out/train-$model-fed.log" gpu_share)"  # where each fed run's split ended
    r=2
    while [ $r -le "${REPEAT:-1}" ]; do
      run held-$r --held > /dev/null
      run fed-$r > /dev/null
      pairs="$pairs $(ratio "$(steady "$out/train-$model-fed-$r.log")" "$(steady "$out/train-$model-held-$r.log")")"
      splits="$splits $(field "$out/train-$model-fed-$r.log" gpu_share)"
      r=$((r + 1))
    done
    [ "${REPEAT:-1}" -gt 1 ] && printf '| %s fed / held, pair by pair (held then fed) | %s; median %s; the fed runs'"'"' split at the end %s |\n' \
      $model "$pairs" \
      "$(median $pairs)" \
      "$splits"
    [ -z "${ALTERNATE:-}" ] || alternate_runs
    # ORDER=R: each pair in turn loader-first then model-first, and the other way, so that neither
    # order always meets a warmer page cache or GPU
    r=1
    while [ $r -le "${ORDER:-0}" ]; do
      for o in $([ $((r % 2)) = 1 ] && echo "loader model" || echo "model loader"); do
        if [ $o = loader ]; then
          rc_loader=$(run order-loader-$r --steps "${ORDER_STEPS:-60}" --loader-first)
        else
          rc_model=$(run order-model-$r --steps "${ORDER_STEPS:-60}")
        fi
      done
      l="$out/train-$model-order-loader-$r.log" m="$out/train-$model-order-model-$r.log"
      printf '| %s start-up, loader opened first / model built first, pair %s (exit %s / %s) | first step %s / %s s after the arguments; the loader'"'"'s first batch %s / %s ms after its open, nvJPEG ready %s / %s ms; %s / %s images decoded on the GPU, %s / %s on the CPU; steady %s / %s images/s |\n' \
        $model $r $rc_loader $rc_model "$(field "$l" first_step_s)" "$(field "$m" first_step_s)" \
        "$(field "$l" first_batch_ms)" "$(field "$m" first_batch_ms)" "$(field "$l" gpu_decoders_start_ms)" \
        "$(field "$m" gpu_decoders_start_ms)" "$(field "$l" gpu_decoded)" "$(field "$m" gpu_decoded)" \
        "$(field "$l" cpu_decoded)" "$(field "$m" cpu_decoded)" "$(steady "$l")" "$(steady "$m")"
      r=$((r + 1))
    done
    held=$(steady "$out/train-$model-held.log")
    printf '| %s batch %s, steady images/s (exit) | held %s (%s) | beside %s (%s) | fed %s (%s) | fed decode=cpu %s (%s) |\n' \
      $model $batch "$held" $rc_held "$(steady "$out/train-$model-beside.log")" $rc_beside \
      "$(steady "$out/train-$model-fed.log")" $rc_fed "$(steady "$out/train-$model-fed-cpu.log")" $rc_cpu
    names="held beside fed fed-cpu"
    for v in ${VARIANTS:-}; do
      names="$names fed-$v"
      [ -n "${VARIANTS_FED_ONLY:-}" ] || names="$names beside-$v"
    done
    for name in $names; do
      log="$out/train-$model-$name.log"
      printf '| %s %s / held | %s | step %s ms: the training thread on a CPU %s ms, off it %s times waiting and %s times taken off; next() %s ms a step (waiting for the loader %s), copy thread per batch: waits for the consumer %s ms, queues nvJPEG %s ms; bottleneck %s; the split'"'"'s GPU share at the end %s, images on the GPU %s, on the CPU %s |\n' $model $name \
        "$(ratio "$(steady "$log")" "$held")" \
        "$(field "$log" step_ms)" "$(field "$log" thread_cpu_ms_per_step)" "$(field "$log" thread_waits_per_step)" \
        "$(field "$log" thread_preempted_per_step)" "$(field "$log" next_ms_per_step)" "$(field "$log" loader_wait_ms_per_step)" \
        "$(field "$log" gpu_stage_wait_consumer_ms)" "$(field "$log" gpu_decode_host_ms)" "$(field "$log" bottleneck)" \
        "$(field "$log" gpu_share)" "$(field "$log" gpu_decoded)" "$(field "$log" cpu_decoded)"
      printf '| %s %s, slowest steps [step, ms]; Python collector | %s; %s ms a step in %s runs (gen 0, 1, 2) |\n' $model $name \
        "$(sed -n 's/.*"slowest_steps": *\(\[[^a-z]*\]\),.*/\1/p' "$log" | tail -1)" "$(field "$log" gc_ms_per_step)" \
        "$(sed -n 's/.*"gc_runs": *\(\[[0-9, ]*\]\).*/\1/p' "$log" | tail -1)"
    done
  fi
  if [ -n "${TRACE:-}" ] && [ -f "$TRACE/libgpu_timeline.so" ]; then
    for name in held fed; do
      flags=
      [ $name = held ] && flags=--held
      [ $name = fed ] && flags=${TRACE_FED_FLAGS:-}
      CUDA_INJECTION64_PATH="$TRACE/libgpu_timeline.so" GPU_TIMELINE_OUT="$traces/trace-$model-$name.tsv" \
        timeout ${TRAIN_LIMIT:-300} python3 examples/train_imagenet.py --data "$data" --model $model \
        --batch-size $batch --steps ${TRACE_STEPS:-80} --epochs 0 $flags > "$out/trace-$model-$name.log" 2>&1
    done
    python3 bench/train_timeline.py "$traces/trace-$model-held.tsv" "$traces/trace-$model-fed.tsv" \
      > "$out/trace-$model.txt" 2>&1
  fi
done
