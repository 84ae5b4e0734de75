#!/bin/sh
# Every shell script of the project parses with the shell its first line names: the bench scripts
# run only on a GPU machine, where a quoting slip would cost a whole run before anyone saw it.
# Usage: check_scripts.sh [SOURCE_ROOT]
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 1
bad=0 n=0
for f in $(find bench scripts tests tools examples .ci -type f \( -name '*.sh' -o -path .ci/run \) | sort); do
  case $(head -1 "$f") in *bash*) shell=bash ;; *) shell=sh ;; esac
  n=$((n + 1))
  $shell -n "$f" || { echo "check_scripts: $f does not parse with $shell" >&2; bad=1; }
done
[ $n -gt 0 ] || { echo "check_scripts: no scripts found under $PWD" >&2; exit 1; }
[ $bad = 0 ] && echo "check_scripts: all $n scripts parse"
exit $bad
