#!/usr/bin/env bash
# One device command: the GPU report of `course measure` (scripts/gpu/measure_class.py) with sandboxed kernels.
# Prepare here first: bash scripts/gpu/gather_wheels.sh && bash scripts/gpu/gather_bwrap.sh  (carry: [".whl", ".bwrap"])
# Device command: bash scripts/gpu/run_measure.sh [labs...]   (writes $OUT/results.tar.gz and $OUT/measure-report.md)
set -u
cd "$(dirname "$0")/../.."
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>/dev/null \
  || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages .whl/*.whl || exit 1
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 MPLBACKEND=Agg PATH="$PWD/.bwrap:$PATH"
python3 -c "from course.grader.sandbox import unavailable_reason as r; print('sandbox:', r() or 'bubblewrap works')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
RESULTS=/tmp/measure-results
rm -rf "$RESULTS" && mkdir -p "$RESULTS"
python3 scripts/gpu/measure_class.py --out "$RESULTS" "$@" 2>&1 | tee "$RESULTS/run.log"
tar czf "${OUT:-/tmp}/results.tar.gz" -C "$RESULTS" .
cp "$RESULTS/measure-report.md" "${OUT:-/tmp}/" 2>/dev/null
cp "$RESULTS"/lab2-roofline-*.png "${OUT:-/tmp}/" 2>/dev/null
exit 0
