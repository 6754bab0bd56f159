#!/usr/bin/env bash
# Analyse every sample photo and write annotated PNGs under ./out/.
set -euo pipefail
FF=.venv/bin/facefuse
mkdir -p out
for img in "$FACEFUSE_HOME"/samples/*; do
  name=$(basename "${img%.*}")
  $FF analyse "$img" --attributes --annotate "out/${name}_faces.png"
done
echo "annotated photos in ./out/"
