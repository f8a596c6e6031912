#!/usr/bin/env bash
# Gather the wheels a lent GPU machine needs to execute and autograde the labs: nbgrader, jupytext and the
# headless Jupyter stack, for CPython 3.12 on x86-64 Linux. The GPU image already has torch, transformers,
# triton, numpy, pandas and matplotlib, so those are left out, and so are the UI packages a headless
# autograde never imports. Output: .whl/ (ignored by git), carried to the device with `carry: [".whl"]`.
#
# Usage: bash scripts/gpu/gather_wheels.sh [DEST]   (default DEST: .whl)
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${1:-.whl}"
PY="${PYTHON:-python3}"
rm -rf "$DEST" && mkdir -p "$DEST"

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 linux_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$DEST" "nbgrader==0.9.6" "jupytext>=1.16,<2" "tqdm>=4.66" "ipywidgets>=8.1"

# ipywidgets (and its two front-end packages) is kept: utils.progress draws tqdm's notebook bar with it.
# Present on the GPU image, or never imported by a headless build/autograde (checked by scripts/gpu/run_reports.sh,
# which runs both there).
exclude='^(numpy|pandas|matplotlib|contourpy|cycler|fonttools|kiwisolver|pillow|pyparsing|torch|triton|transformers|jupyterlab|jupyterlab_server|notebook|babel|debugpy|jupyter_lsp|notebook_shim|async_lru|json5)-'
for wheel in "$DEST"/*.whl; do
  name=$(basename "$wheel" | tr 'A-Z' 'a-z')
  if [[ "$name" =~ $exclude ]]; then rm "$wheel"; fi
done
count=$(ls "$DEST"/*.whl | wc -l)
size=$(du -sm "$DEST" | cut -f1)
echo "gathered $count wheels, $size MB in $DEST"
