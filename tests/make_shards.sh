#!/bin/sh
# Builds the test shards from the third-party files in TESTDATA, with GNU tar and with Python's
# tarfile, into OUT; with DLSHARD, also ringfeed shards (seeds for the shard reader's fuzz replay).
# Usage: make_shards.sh TESTDATA OUT [DLSHARD]
set -eu
td=$1
out=$2
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if [ ! -f "$td/MANIFEST.tsv" ]; then
  echo "skipped: make_shards: no test data at $td (the third-party test data is absent)" >&2
  exit 77
fi
rm -rf "$out"
mkdir -p "$out/stage" "$out/pixels/gnu" "$out/pixels/py"

# Writes OUT_TAR from the files of folder DIR with Python's tarfile (format: pax or gnu).
pytar() {
  "$py" - "$1" "$2" "$3" <<'PY'
import os, sys, tarfile
out, folder, fmt = sys.argv[1:]
form = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT, "ustar": tarfile.USTAR_FORMAT}[fmt]
with tarfile.open(out, "w", format=form) as t:
    for name in sorted(os.listdir(folder)):
        t.add(os.path.join(folder, name), arcname=name)
PY
}

# --- reference pixels: one shard per image, each as "<id>.jpg" with a .cls label ---
: > "$out/pixels.tsv"
n=0
add_ref() { # kind image reference
  n=$((n + 1))
  id=$(printf 'ref%04d' "$n")
  d="$out/stage/$id"
  mkdir -p "$d"
  cp "$2" "$d/$id.jpg"
  echo "$n" > "$d/$id.cls"
  tar --format=gnu --sort=name -C "$d" -cf "$out/pixels/gnu/$id.tar" .
  pytar "$out/pixels/py/$id.tar" "$d" pax
  printf '%s\t%s\t%s\t%s\n' "$id" "$1" "$3" "$2" >> "$out/pixels.tsv"
}
lt=$td/libjpeg-turbo
add_ref close "$lt/testimages/testorig.jpg" "$lt/testimages/testorig.ppm"
add_ref close "$lt/testimages/testimgint.jpg" "$lt/testimages/testorig.ppm"
# The same coefficients coded arithmetically and progressively: identical pixels to ref0002.
add_ref same "$lt/testimages/testimgari.jpg" ref0002
add_ref same "$lt/testimages-historical/testimgp.jpg" ref0002
add_ref unsupported "$lt/testimages/monkey12.jpg" -
add_ref unsupported "$lt/testimages-historical/testorig12.jpg" -
rt=$td/jpeg-decoder/tests/reftest/images
for img in "$rt"/*.jpg "$rt"/mozilla/*.jpg; do
  rel=${img#"$rt"/}
  grep -qx "$rel" "$rt/disabled.list" && continue
  ref=${img%.jpg}.png
  kind=close
  # Files whose data ends early: another decoder shows what it has; here that is an error.
  case "$rel" in partial_progressive.jpg) kind=corrupt ;; esac
  [ -f "$ref" ] && add_ref $kind "$img" "$ref"
done
for img in "$rt"/lossless/*/*.jpg; do
  [ -f "$img" ] && add_ref unsupported "$img" -
done

# --- a Motion-JPEG frame (no Huffman tables of its own) right after an ordinary JPEG ---
st="$out/stage/stale"
mkdir -p "$st"
cp "$lt/testimages-historical/testimgp.jpg" "$st/a.jpg"  # progressive: its own optimised tables
cp "$td/jpeg-decoder/tests/reftest/images/mjpeg.jpg" "$st/b.jpg"
tar --format=gnu -C "$st" -cf "$out/stale-tables.tar" a.jpg b.jpg
tar --format=gnu -C "$st" -cf "$out/mjpeg-alone.tar" b.jpg

# --- every third-party file as a member of one shard, by its manifest row ---
s="$out/stage/sweep"
mkdir -p "$s"
: > "$out/sweep.tsv"
i=0
tail -n +2 "$td/MANIFEST.tsv" | while IFS="$(printf '\t')" read -r path bytes sha kind attrs check; do
  i=$((i + 1))
  key=$(printf '%06d' "$i")
  ext=jpg
  [ "$kind" = png ] && ext=png
  cp "$td/$path" "$s/$key.$ext"
  echo "$i" > "$s/$key.cls"
  printf '%s\t%s\t%s\t%s\t%s\n' "$key.$ext" "$path" "$kind" "$attrs" "$check" >> "$out/sweep.tsv"
done
tar --format=gnu --sort=name -C "$s" -cf "$out/sweep-gnu.tar" .
pytar "$out/sweep-py.tar" "$s" pax

# --- the JPEGs of the sweep alone: small enough to travel to a GPU machine for test_cuda ---
js="$out/stage/jpegs"
mkdir -p "$js"
: > "$out/jpeg-sweep.tsv"
while IFS="$(printf '\t')" read -r member path kind attrs check; do
  [ "$kind" = jpeg ] || continue
  cp "$s/$member" "$s/${member%.*}.cls" "$js/"
  printf '%s\t%s\t%s\t%s\t%s\n' "$member" "$path" "$kind" "$attrs" "$check" >> "$out/jpeg-sweep.tsv"
done < "$out/sweep.tsv"
tar --format=gnu --sort=name -C "$js" -cf "$out/jpeg-sweep.tar" .

# --- tar dialects: long names through GNU 'L' headers, pax 'path' records and the ustar prefix ---
f="$out/stage/formats"
mkdir -p "$f"
long=$(printf 'a%.0s' $(seq 1 120))
cp "$lt/testimages/testorig.jpg" "$f/${long}.jpg"
echo 7 > "$f/${long}.cls"
cp "$lt/testimages/testimgint.jpg" "$f/short.jpg"
echo 8 > "$f/short.cls"
for fmt in gnu pax ustar; do
  if [ "$fmt" = ustar ]; then
    # ustar cannot hold a 124-byte base name: nested folders fill its prefix field instead.
    u="$out/stage/ustar/$(printf 'd%.0s' $(seq 1 60))/$(printf 'e%.0s' $(seq 1 60))"
    mkdir -p "$u"
    cp "$lt/testimages/testorig.jpg" "$u/x.jpg"
    echo 7 > "$u/x.cls"
    tar --format=ustar --sort=name -C "$out/stage/ustar" -cf "$out/format-tar-ustar.tar" .
    continue
  fi
  tar --format=$fmt --sort=name -C "$f" -cf "$out/format-tar-$fmt.tar" .
  pytar "$out/format-py-$fmt.tar" "$f" $fmt
done

# --- an ImageFolder tree and the same images as a shard ---
for c in cat dog; do mkdir -p "$out/folder/$c"; done
cp "$lt/testimages/testorig.jpg" "$out/folder/cat/b.jpg"
cp "$lt/testimages/testimgint.jpg" "$out/folder/cat/a.JPG"
cp "$td/pngsuite/basn2c08.png" "$out/folder/dog/z.png"
echo "not an image" > "$out/folder/dog/notes.txt"
if [ -n "${3:-}" ]; then
  mkdir -p "$out/rfs"
  "$3" create "$out/rfs/formats" "$out/format-tar-gnu.tar" --samples-per-shard 1 > /dev/null
  "$3" create "$out/rfs/packed" "$out/sweep-gnu.tar" --samples-per-shard 200 --align 1 > /dev/null
  "$3" create "$out/rfs/folder" "$out/folder" > /dev/null
fi
rm -rf "$out/stage"
echo "make_shards: $(wc -l < "$out/pixels.tsv") reference images, $(wc -l < "$out/sweep.tsv") files swept"
