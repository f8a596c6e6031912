#!/usr/bin/env bash
# One device command: install the carried wheels, then run the GPU steps named on the command line and pack
# what they wrote into $OUT/results.tar.gz (the device returns at most 8 files). Steps:
#   utils      scripts/gpu/check_utils_gpu.py   (benchmark_latency vs do_bench, measure_roofline, kernel counts)
#   measure    scripts/gpu/lab1_measure.py      (Lab 1's measurements beside theory, and the report's sanity checks)
#   labN       scripts/gpu/run_lab.py labN      (teaching-scale run of the reference notebook + autograde timing)
#   autograde  scripts/gpu/run_lab.py LAB --skip-execute for every lab (one reference submission graded as TAs grade)
#   cudafaults scripts/gpu/check_cuda_faults.py (a device-side assert and a CUDA OOM in a submission, graded on the GPU)
#   grading_ab scripts/grading_ab.py on 2 pinned cores, GPU hidden, kernels in bubblewrap when .bwrap is carried
#              (reports/grading-time-cpu-2core.md: each speed piece of course grade, A/B); AB_ROUNDS, AB_ARGS (more
#              options, e.g. "--student demo-reference --pieces fork_server"), AB_COMMIT (the device's copy has no history)
#   capped     scripts/gpu/run_lab.py LAB --skip-autograde for every lab at once, each kernel's CUDA memory capped at
#              $EFFICIENT_AI_GPU_MEMORY_GB (space-separated caps run one after another); report:
#              scripts/gpu/make_memory_report.py. The labs share the GPU, so these runs' times are not benchmarks.
# EFFICIENT_AI_GPU_MEMORY_GB=GB (decimal GB) also caps the labN steps (scripts/gpu/memory_cap.py).
# Prepare here first: bash scripts/gpu/gather_wheels.sh   (carry: [".whl"])
# Example device command: bash scripts/gpu/run_reports.sh utils measure lab1
# Several instances can run side by side (one per GPU of a multi-GPU machine): give each its own RESULTS folder and
# OUT, e.g. CUDA_VISIBLE_DEVICES=1 RESULTS=/tmp/r1 OUT=$OUT/lab1 bash scripts/gpu/run_reports.sh lab1 &
#   or: EFFICIENT_AI_GPU_MEMORY_GB=15 bash scripts/gpu/run_reports.sh capped
set -u
cd "$(dirname "$0")/../.."
# The carried wheels are installed into the image's own Python environment (where torch, transformers and triton
# are): grading kernels start with `python -I`, which ignores PYTHONPATH, so what they import must be installed.
python3 -I -c "import nbgrader" 2>/dev/null \
  || python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl 2>/dev/null \
  || python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages .whl/*.whl || exit 1
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
python3 -I -c "import torch, nbgrader, ipykernel, matplotlib; print('python -I imports torch, nbgrader, ipykernel and matplotlib')" || exit 1
echo "python: $(command -v python3); bwrap: $(command -v bwrap || { [ -x .bwrap/bwrap ] && echo 'carried in .bwrap (the grading_ab step uses it)'; } || echo 'not installed: grading kernels start isolated, unsandboxed')"
RESULTS=${RESULTS:-/tmp/results}
mkdir -p "$RESULTS"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$RESULTS/gpu.csv" 2>&1
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee "$RESULTS/versions.txt"
for step in "$@"; do
  start=$(date +%s)
  case "$step" in
    utils)   python3 scripts/gpu/check_utils_gpu.py --out "$RESULTS" 2>&1 | tee "$RESULTS/utils_check.log" ;;
    measure) python3 scripts/gpu/lab1_measure.py --out "$RESULTS" 2>&1 | tee "$RESULTS/lab1_measure.log" ;;
    cudafaults) python3 scripts/gpu/check_cuda_faults.py --out "$RESULTS" 2>&1 | tee "$RESULTS/cuda_faults.log" ;;
    grading_ab) cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
             PATH="$PWD/.bwrap:$PATH" CUDA_VISIBLE_DEVICES= taskset -c 2,3 python3 scripts/grading_ab.py --lab lab1 \
               --rounds "${AB_ROUNDS:-3}" --commit "${AB_COMMIT:-}" ${AB_ARGS:-} --report "$RESULTS/grading-time-cpu-2core.md" \
               --machine "2 cores (taskset -c 2,3) of an otherwise idle $(nproc --all)-core $cpu host (a lent GPU machine, GPU hidden)" \
               2>&1 | tee "$RESULTS/grading_ab.log" ;;
    autograde) for lab in $(cd labs && ls -d lab*/ | tr -d /); do python3 scripts/gpu/run_lab.py "$lab" --skip-execute --out "$RESULTS"; done 2>&1 | tee "$RESULTS/autograde.log" ;;
    capped)  for cap in ${EFFICIENT_AI_GPU_MEMORY_GB:?capped needs EFFICIENT_AI_GPU_MEMORY_GB, e.g. 15}; do
               for lab in $(cd labs && ls -d lab*/ | tr -d /); do
                 EFFICIENT_AI_GPU_MEMORY_GB=$cap python3 scripts/gpu/run_lab.py "$lab" --skip-autograde --out "$RESULTS" \
                   > "$RESULTS/${lab}-cap${cap}gb.log" 2>&1 &
               done
               wait
               tail -n 30 "$RESULTS"/*-cap"${cap}"gb.log
             done ;;
    lab*)    python3 scripts/gpu/run_lab.py "$step" --out "$RESULTS" 2>&1 | tee "$RESULTS/${step}_run.log" ;;
    *)       echo "unknown step $step" ;;
  esac
  echo "step $step took $(( $(date +%s) - start )) s" | tee -a "$RESULTS/steps.txt"
  # Pack after every step, so a run stopped at the device's time limit still returns the finished steps.
  tar czf "${OUT:-/tmp}/results.tar.gz" -C "$RESULTS" .
  cp "$RESULTS/steps.txt" "${OUT:-/tmp}/steps.txt"
done
