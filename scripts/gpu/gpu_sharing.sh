#!/usr/bin/env bash
# One device command: what sharing the GPU costs concurrent grading kernels, without and then with a CUDA MPS daemon.
#   1. scripts/gpu/gpu_sharing.py with 1 and 8 processes, no MPS, then with an MPS daemon started here (and stopped).
#   2. With BENCH=1 (default 0): Lab 1's throughput benchmark, kernels unsandboxed (the sandbox does not show an MPS
#      daemon's pipe folder to its kernels), one worker and eight without MPS, then eight with MPS
#      (reports grading-throughput-h100-no-mps / -mps).
# Starting MPS changes no setting of the card: the daemon is a process, ended with `quit` at the end.
# Writes under $OUT (the device's result folder). Prepare here first: bash scripts/gpu/gather_wheels.sh (carry .whl).
# Committed as reports/gpu-sharing-h100-LABEL.json, reports/gpu-sharing-h100.md (gpu_sharing.py --render) and
# reports/grading-throughput-h100-no-mps / -mps (bench_grading_throughput.py --render for the .md).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to the result folder}
bash scripts/gpu/run_reports.sh none > "$OUT/install.log" 2>&1 || { echo "install failed"; exit 1; }
export PYTHONPATH="$PWD" MPLBACKEND=Agg PYTHONUNBUFFERED=1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/efficient-ai-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/efficient-ai-mps/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
mps() {  # start|stop
  if [ "$1" = start ]; then nvidia-cuda-mps-control -d && sleep 1; else echo quit | nvidia-cuda-mps-control; sleep 1; fi
}
bench() {  # TAG SUBMISSIONS... -- WORKERS...: one class size per worker count
  local tag=$1 sizes=() workers=(); shift
  while [ "$1" != -- ]; do sizes+=("$1"); shift; done; shift; workers=("$@")
  EFFICIENT_AI_SANDBOX=off timeout 200 python3 scripts/bench_grading_throughput.py --lab lab1 \
    --submissions "${sizes[@]}" --workers "${workers[@]}" --tag "$tag" --out "$OUT" > "$OUT/bench-$tag.log" 2>&1
}
python3 scripts/gpu/gpu_sharing.py --processes 1 8 --label no-mps --out "$OUT" 2>&1 | tee "$OUT/sharing.log"
if ! command -v nvidia-cuda-mps-control > /dev/null; then
  echo "no nvidia-cuda-mps-control on this machine" | tee -a "$OUT/sharing.log"; exit 0
fi
mps start
python3 scripts/gpu/gpu_sharing.py --processes 1 8 --label mps --out "$OUT" 2>&1 | tee -a "$OUT/sharing.log"
mps stop
[ "${BENCH:-0}" = 1 ] || exit 0
EFFICIENT_AI_SANDBOX=off python3 scripts/bench_grading_throughput.py --lab lab1 --submissions 1 --workers 1 \
  --out /tmp/warm > "$OUT/warm.log" 2>&1
bench h100-no-mps 8 64 -- 1 8
mps start
bench h100-mps 64 -- 8
mps stop
cp "$CUDA_MPS_LOG_DIRECTORY"/* "$OUT/" 2>/dev/null
exit 0
