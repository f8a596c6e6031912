"""What one grading process pays to start, alone and with neighbours: import CPU and the first CUDA calls.

Usage: ``python scripts/gpu/start_costs.py [--lab lab1] [--processes 1 8] [--cpus-each 2] --out DIR``.

1. **Imports of a kernel started ahead.** ``python -I -X importtime`` imports what ``course/kernel_pool.py``'s
   ``--preload`` makes a pre-started kernel of the lab import (after ipykernel), with the instructor's ``utils.py``
   first on ``sys.path``. Reports the CPU seconds (user + system) and wall seconds of the whole import, and the
   modules with the largest cumulative import time.
2. **The first CUDA calls**, in N fresh processes started together (each pinned to its own ``--cpus-each`` CPUs, as
   ``course grade``'s workers are): ``import torch``, the CUDA context (``torch.empty(1, device="cuda")``), the first
   matrix product (cuBLAS) and the first ``scaled_dot_product_attention``, each timed to its synchronisation.
   Medians and maxima over the processes, for each N.

Writes ``DIR/start-costs.json`` and ``DIR/start-costs.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

CUDA_PROBE = r"""
import json, time
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
torch.empty(1, device="cuda"); torch.cuda.synchronize(); t2 = time.perf_counter()
a = torch.randn(256, 256, device="cuda"); (a @ a).sum().item(); t3 = time.perf_counter()
q = torch.randn(1, 4, 128, 64, device="cuda", dtype=torch.bfloat16)
torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().item(); t4 = time.perf_counter()
print(json.dumps({"import_torch_s": t1 - t0, "context_s": t2 - t1, "first_matmul_s": t3 - t2, "first_sdpa_s": t4 - t3}))
"""


def import_costs(lab: str) -> dict:
    """CPU and wall seconds of a pre-started kernel's imports, and the 15 slowest modules (cumulative)."""
    from course.kernel_pool import preload_modules

    modules = ["ipykernel.kernelapp", *preload_modules(REPO / "source" / lab)]
    code = ("import resource, sys, time; sys.path.insert(0, sys.argv[1]); t = time.perf_counter()\n"
            f"for name in {modules!r}: __import__(name)\n"
            "r = resource.getrusage(resource.RUSAGE_SELF)\n"
            "print(r.ru_utime + r.ru_stime, time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-I", "-X", "importtime", "-c", code, str(REPO / "source" / lab)],
                          capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"}, check=True)
    cpu_s, wall_s = (float(x) for x in done.stdout.split())
    rows = []
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if match and len(match.group(3)) <= 3:  # top-level imports only (one space of nesting or none)
            rows.append((int(match.group(2)) / 1e6, match.group(4)))
    rows.sort(reverse=True)
    return {"modules": modules, "cpu_s": cpu_s, "wall_s": wall_s,
            "slowest": [{"module": name, "cumulative_s": seconds} for seconds, name in rows[:15]]}


def cuda_costs(processes: int, cpus_each: int) -> list[dict]:
    """Run ``CUDA_PROBE`` in ``processes`` processes at once, process i pinned to CPUs [i*cpus_each, ...)."""
    count = os.cpu_count() or 1
    started = []
    for i in range(processes):
        cpus = {(i * cpus_each + j) % count for j in range(cpus_each)}
        started.append(subprocess.Popen(
            [sys.executable, "-c", CUDA_PROBE], stdout=subprocess.PIPE, text=True,
            preexec_fn=lambda cpus=cpus: os.sched_setaffinity(0, cpus)))
    return [json.loads(process.communicate()[0]) for process in started]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--cpus-each", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "lab": args.lab, "imports": import_costs(args.lab), "cuda": {}}
    imports = result["imports"]
    lines = [f"# What a grading process pays to start ({args.lab})", "",
             f"Measured by `python scripts/gpu/start_costs.py --lab {args.lab} --processes "
             f"{' '.join(map(str, args.processes))} --cpus-each {args.cpus_each}` on {result['machine']}.", "",
             f"## Imports of a kernel started ahead: {imports['cpu_s']:.2f} CPU s, {imports['wall_s']:.2f} s wall", "",
             "| module (top level, cumulative) | s |", "| --- | --- |",
             *[f"| {row['module']} | {row['cumulative_s']:.2f} |" for row in imports["slowest"]], ""]
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        lines += ["## First CUDA calls, processes started together", "",
                  "| processes | step | median (s) | max (s) |", "| --- | --- | --- | --- |"]
        for n in args.processes:
            runs = cuda_costs(n, args.cpus_each)
            result["cuda"][str(n)] = runs
            for step in runs[0]:
                values = [run[step] for run in runs]
                lines.append(f"| {n} | {step} | {statistics.median(values):.2f} | {max(values):.2f} |")
    (args.out / "start-costs.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "start-costs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
