#!/bin/sh
# The layout docs/ARCHITECTURE.md promises, checked: a file of lib/ includes the headers of its own
# stage and of earlier ones only (the stages in order below; stages of one rank do not include each
# other), no header of lib/ passes 400 lines, and the tools see the library through ringfeed.h and
# tools.h alone.
# Usage: check_layers.sh [SOURCE_ROOT]
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 1

# The stage of a file or header of lib/, by where it lies: its rank and its name.
stage() {
  case $1 in
    lib/internal.h | lib/options.h) echo "0 shared" ;;
    lib/util/*) echo "1 util" ;;
    lib/decode/*) echo "2 decode" ;;
    lib/remote/*) echo "2 remote" ;;
    lib/io/*) echo "3 io" ;;
    lib/source/*) echo "4 source" ;;
    lib/tools.h | lib/tools/*) echo "5 tools" ;;
    lib/gpu/*) echo "6 gpu" ;;
    lib/*) echo "5 core" ;;
  esac
}

status=0
for f in $(find lib -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort); do
  set -- $(stage "$f")
  rank=$1 name=$2
  for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
    [ "$inc" = ringfeed.h ] && continue
    header=lib/$inc
    [ -f "$header" ] || header=$(dirname "$f")/$inc
    [ -f "$header" ] || continue
    set -- $(stage "$header")
    if [ "$2" != "$name" ] && { [ "$1" -gt "$rank" ] || [ "$1" -eq "$rank" ]; }; then
      echo "$f ($name) includes $inc ($2): a later stage's header, or a peer's"
      status=1
    fi
  done
done

for h in $(find lib -name '*.h' | sort); do
  n=$(wc -l <"$h")
  if [ "$n" -ge 400 ]; then
    echo "$h: $n lines; a header stays under 400 (split it by what its readers need)"
    status=1
  fi
done

for f in tools/*.c tools/*.h; do
  for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
    case $inc in
      ringfeed.h | tools.h) ;;
      *) [ -f "lib/$inc" ] && { echo "$f includes lib/$inc: the tools use ringfeed.h and tools.h"; status=1; } ;;
    esac
  done
done

[ $status -eq 0 ] && echo "layers: every include of lib/ points to its own or an earlier stage; headers under 400 lines"
exit $status
