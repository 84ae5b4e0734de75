#!/bin/sh
# A host's ranks opening the same tar shards at once, as torchrun starts them, before any shard has
# its index: each rank's index time in `dl_open` (open_index_ms) and the time until every rank has
# its first batch, for each dlbench given (e.g. the version before's, then this one), in turn.
# Each rank is a dlbench process with LOCAL_WORLD_SIZE and LOCAL_RANK set and decodes on the CPU.
# Usage: bench/ranks_first_open.sh DIR RANKS DLBENCH...
#   DIR: a folder of .tar shards (e.g. `dlbench --synthetic 10000 --make-synthetic`); their index
#   files beside them are removed before each run. ROUNDS=N rounds (3); EVICT=1 drops the shards
#   from the page cache before each run (else they are read once first, so that they are cached).
set -eu
dir=$1
ranks=$2
shift 2
py=/usr/bin/python3
[ -x "$py" ] || py=python3
out=$(mktemp -d "${TMPDIR:-/tmp}/ringfeed-ranks.XXXXXX")
trap 'rm -rf "$out"' EXIT
ms() { "$py" -c 'import time; print(int(time.monotonic() * 1000))'; }
echo "| dlbench | ranks | round | shards | all first batches | open_index_ms of each rank (sorted) |"
echo "|---|---|---|---|---|---|"
for round in $(seq "${ROUNDS:-3}"); do
  for bin in "$@"; do
    rm -f "$dir"/*.tar.rfidx
    if [ "${EVICT:-0}" = 1 ]; then
      "$py" -c 'import glob, os, sys
for f in glob.glob(sys.argv[1] + "/*.tar"):
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$dir"
      cached=evicted
    else
      cat "$dir"/*.tar > /dev/null
      cached=cached
    fi
    t0=$(ms)
    r=0
    while [ "$r" -lt "$ranks" ]; do
      LOCAL_WORLD_SIZE=$ranks LOCAL_RANK=$r "$bin" "$dir/*.tar" --batch 64 --size 64 --epochs 1 --stop-after 1 \
        --workers 1 --json > "$out/rank-$r.json" 2> "$out/rank-$r.err" &
      r=$((r + 1))
    done
    wait
    t1=$(ms)
    index=$(sed -n 's/.*"open_index_ms": *\([0-9.]*\).*/\1/p' "$out"/rank-*.json | sort -n | tr '\n' ' ')
    echo "| $bin | $ranks | $round | $cached | $((t1 - t0)) ms | $index|"
  done
done
