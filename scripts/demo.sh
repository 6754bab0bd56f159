#!/usr/bin/env bash
# The demo: analyse every sample photo (annotated PNGs) and fuse sample pairs both
# ways (outputs, JSON reports and contact sheets at degrees 0/50/100 and at 100 without
# relighting and occluder masks, for before/after), all under ./out/.
set -euo pipefail
FF=.venv/bin/facefuse
S="$FACEFUSE_HOME/samples"
mkdir -p out
for img in "$S"/*; do
  name=$(basename "${img%.*}")
  $FF analyse "$img" --attributes --annotate "out/${name}_faces.png"
done
fuse_pair() {  # source target
  local a=$1 b=$2
  $FF fuse "$S/$a" "$S/$b" -o "out/${a%.*}_into_${b%.*}.jpg" \
    --report "out/${a%.*}_into_${b%.*}.json" --contact-sheet "out/${a%.*}_into_${b%.*}_sheet.png"
}
for pair in "obama.jpg biden.jpg" "biden.jpg astronaut.png" "astronaut.png obama2.jpg"; do
  set -- $pair
  fuse_pair "$1" "$2"
  fuse_pair "$2" "$1"
done
echo "annotated photos, fused outputs, reports and contact sheets are in ./out/"
