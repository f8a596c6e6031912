"""What sharing one GPU between concurrent processes costs each of them, as grading workers share it.

Usage: ``python scripts/gpu/gpu_sharing.py --processes 1 8 --label no-mps --out DIR``; then
``python scripts/gpu/gpu_sharing.py --render DIR/gpu-sharing-no-mps.json DIR/gpu-sharing-mps.json --out reports
--tag h100`` writes ``reports/gpu-sharing-h100.md`` from such runs (``scripts/gpu/gpu_sharing.sh`` makes both).

Each of ``P`` processes (started with ``spawn``, pinned to its own ``16 / P`` CPUs as ``course grade`` pins a worker's
kernels) creates its CUDA context, then, all together after a barrier:

- ``sync_us``: launches one tiny kernel and waits for it (``torch.cuda.synchronize``), many times: the round trip a
  latency measurement or a ``.item()`` pays;
- ``chain_us``: launches 50 tiny kernels, then waits once: a short eager decode step.

What a process's first matrix product and attention cost, alone and beside others, is ``scripts/gpu/start_costs.py``'s
to measure. (The runs in ``reports/gpu-sharing-h100-*.json`` were made when this script timed those too: their
``first_*_ms`` fields.)

The CPU time each process used for the timed loops (``cpu_share``: CPU seconds over wall seconds) says whether it
waited by spinning (about 1) or sleeping. Writes ``gpu-sharing-LABEL.json`` under ``--out``; a CUDA MPS daemon, when
one runs, is used by every process (the label says which).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

SYNC_ROUNDS = 2000
CHAIN_ROUNDS = 200
CHAIN_KERNELS = 50


def _worker(index: int, cpus: list[int], barrier, results) -> None:
    os.sched_setaffinity(0, cpus)
    import torch
    torch.set_num_threads(len(cpus))
    start = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    row = {"process": index, "context_ms": (time.perf_counter() - start) * 1e3}
    x = torch.zeros(16, device="cuda")
    for _ in range(50):
        x.add_(1)
    torch.cuda.synchronize()
    barrier.wait()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    rounds = []
    for _ in range(SYNC_ROUNDS):
        t = time.perf_counter()
        x.add_(1)
        torch.cuda.synchronize()
        rounds.append(time.perf_counter() - t)
    chains = []
    for _ in range(CHAIN_ROUNDS):
        t = time.perf_counter()
        for _ in range(CHAIN_KERNELS):
            x.add_(1)
        torch.cuda.synchronize()
        chains.append(time.perf_counter() - t)
    wall = time.perf_counter() - wall0
    row.update(sync_us=statistics.median(rounds) * 1e6, sync_p90_us=sorted(rounds)[int(0.9 * len(rounds))] * 1e6,
               chain_us=statistics.median(chains) * 1e6, loops_s=wall, cpu_share=(time.process_time() - cpu0) / wall)
    results.put(row)


def run(processes: int) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // processes)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(i, cores[i * share:(i + 1) * share] or cores, barrier, results))
             for i in range(processes)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    keys = [k for k in rows[0] if k != "process"]
    return {"processes": processes, "cpus_each": share,
            "median": {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}, "rows": rows}


COLUMNS = {  # JSON key: report column
    "sync_us": "launch one kernel and wait (µs)", "sync_p90_us": "the same, 90th percentile (µs)",
    "chain_us": f"launch {CHAIN_KERNELS} kernels and wait (µs)", "cpu_share": "CPU share while waiting",
    "context_ms": "CUDA context (ms)"}


def write_report(results: list[dict], out: Path, tag: str, commands: list[str]) -> Path:
    """``out/gpu-sharing-TAG.md``: one row per label and process count, the medians over the processes."""
    lines = [f"# What sharing one GPU costs each of its processes ({tag})", "",
             "Measured by " + " and ".join(f"`{c}`" for c in commands) + " (scripts/gpu/gpu_sharing.sh): every "
             "process pinned to its own CPUs, all timing together; medians over the processes. `mps`: with a CUDA "
             "MPS daemon running, which every process used; `no-mps`: without, as grading runs.", "",
             "| run | processes | " + " | ".join(COLUMNS.values()) + " |",
             "| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |"]
    for result in results:
        for run_ in result["runs"]:
            median = run_["median"]
            lines.append(f"| {result['label']} | {run_['processes']} | "
                         + " | ".join(f"{median[key]:.2f}" if key == "cpu_share" else f"{median[key]:.0f}"
                                      for key in COLUMNS) + " |")
    lines += ["", "CPU share: the CPU seconds a process used over the wall seconds of its timed loops (1: it spun "
              "while it waited for the GPU)."]
    path = out / f"gpu-sharing-{tag}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--label", help="what this run is (no-mps, mps)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--render", type=Path, nargs="+", metavar="RUN.json",
                        help="measure nothing: write --out/gpu-sharing-TAG.md from these runs' files")
    parser.add_argument("--tag", default="h100", help="with --render: names the report")
    options = parser.parse_args()
    if options.render:
        results = [json.loads(path.read_text()) for path in options.render]
        commands = [f"python scripts/gpu/gpu_sharing.py --processes "
                    f"{' '.join(str(r['processes']) for r in result['runs'])} --label {result['label']}"
                    for result in results]
        print(f"wrote {write_report(results, options.out, options.tag, commands)}")
        return 0
    if not options.label:
        parser.error("--label is required unless --render")
    runs = [run(n) for n in options.processes]
    for r in runs:
        print(options.label, r["processes"], json.dumps(r["median"]), flush=True)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / f"gpu-sharing-{options.label}.json").write_text(json.dumps({"label": options.label, "runs": runs},
                                                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
