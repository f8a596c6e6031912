"""Whether a kernel forked from the zygote runs a lab as fast as one started the usual way.

Usage: ``python scripts/gpu/kernel_speed.py [--lab lab1] [--rounds 2] --out DIR``.

For each round and each way (``EFFICIENT_AI_KERNEL_ZYGOTE`` off, then on), a ``course.kernel_pool.KernelPool`` of the
repository's ``source/<lab>/`` starts one kernel ahead (sandboxed where bubblewrap works), as ``course grade``'s one
worker does; the script claims it (for the zygote, the first kernel it forked), lets the pool go idle, and runs every
code cell of the lab's reference notebook in it one after another, timing each and recording each cell that raised
(the reference raises in none: a cell failing one way only is a difference between the ways, not a speed-up). It
also records what the kernel's process looks like (threads, torch's thread count, nice value, CPUs, frozen objects,
tempfile's folder, whether CUDA is initialised, mappings, environment size). No nbgrader and no other kernel runs meanwhile, so the
difference between the ways is the kernel's own. Writes ``DIR/kernel-speed.json`` and ``DIR/kernel-speed.md``.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from course import kernel_pool, kernel_zygote  # noqa: E402
from course.notebooks import read_notebook  # noqa: E402
from course.processes import parent_pid, start_time  # noqa: E402
from course.sandbox import sandbox_works  # noqa: E402

PROBE = ("import gc, os, sys, tempfile\n_torch = sys.modules.get('torch')\n"
         "_out = dict(threads=len(os.listdir('/proc/self/task')),\n"
         "  torch_threads=_torch.get_num_threads() if _torch else None,\n"
         "  omp=os.environ.get('OMP_NUM_THREADS'), nice=os.getpriority(os.PRIO_PROCESS, 0),\n"
         "  cpus=len(os.sched_getaffinity(0)), frozen=gc.get_freeze_count(), tmp=tempfile.gettempdir(),\n"
         "  cuda=_torch.cuda.is_initialized() if _torch else None,\n"
         "  maps=sum(1 for _ in open('/proc/self/maps')), env=len(os.environ))")


def claim(pool: kernel_pool.KernelPool, forked: bool, timeout_s: float = 300.0) -> dict:
    """A started kernel of ``pool``: for ``forked``, the first one the zygote forked (earlier ones are let go)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = kernel_pool.claim(str(pool.folder))
        if record is None:
            time.sleep(0.05)
            continue
        if not forked or (pool._zygote is not None and parent_pid(record["pid"]) == pool._zygote._process.pid):
            return record
        pool.release()
    raise SystemExit(f"no {'forked' if forked else 'started'} kernel within {timeout_s} s")


def run_cells(record: dict, cells: list[str]) -> tuple[list[float], list[str], dict]:
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=record["connection_file"])
    client.load_connection_file()
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=120)
        probe = client.execute_interactive(PROBE, user_expressions={"out": "_out"}, timeout=60,
                                           output_hook=lambda m: None)["content"]["user_expressions"]["out"]
        seconds, errors = [], []
        for index, source in enumerate(cells):
            began = time.perf_counter()
            reply = client.execute_interactive(source, timeout=900, output_hook=lambda m: None)["content"]
            seconds.append(time.perf_counter() - began)
            if reply["status"] != "ok":
                errors.append(f"cell {index}: {reply.get('ename')}: {reply.get('evalue')}")
        return seconds, errors, ast.literal_eval(probe["data"]["text/plain"])
    finally:
        client.stop_channels()


def measure(lab: str, forked: bool, cells: list[str]) -> dict:
    os.environ[kernel_zygote.MODE_ENV] = "on" if forked else "off"
    more = [True]
    with kernel_pool.KernelPool(REPO, lab, more_to_grade=lambda: more[0]) as pool:
        record = claim(pool, forked)
        more[0] = False
        time.sleep(10)  # the pool starts nothing more: the machine is idle but for this kernel
        assert start_time(record["pid"]) is not None, "the claimed kernel died"
        seconds, errors, probe = run_cells(record, cells)
    return {"forked": forked, "seconds": seconds, "total_s": sum(seconds), "errors": errors, "kernel": probe}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cells = [cell.source for cell in read_notebook(REPO / "source" / args.lab / f"{args.lab}.ipynb").cells
             if cell.cell_type == "code"]
    runs = []
    for _ in range(args.rounds):
        for forked in (False, True):
            runs.append(measure(args.lab, forked, cells))
            print(f"forked={forked}: {runs[-1]['total_s']:.2f} s, kernel {runs[-1]['kernel']}, "
                  f"errors {runs[-1]['errors']}", flush=True)
    started = [r for r in runs if not r["forked"]]
    forked_runs = [r for r in runs if r["forked"]]
    lines = [f"# Kernel speed: {args.lab}, forked from the zygote or started", "",
             f"Measured by `python scripts/gpu/kernel_speed.py --lab {args.lab} --rounds {args.rounds}`; kernels "
             f"{'sandboxed' if sandbox_works() else 'unsandboxed'}. Every code cell of the reference notebook, in a "
             "kernel started ahead and claimed, with nothing else running.", "",
             "| kernel | runs (s) | cells that failed | kernel process (first run) |", "| --- | --- | --- | --- |"]
    for name, group in (("started", started), ("forked", forked_runs)):
        totals = ", ".join(f"{r['total_s']:.2f}" for r in group)
        failed = "; ".join(sorted({error for r in group for error in r["errors"]})).replace("|", "\\|") or "none"
        process = ", ".join(f"{key} {value}" for key, value in group[0]["kernel"].items())
        lines.append(f"| {name} | {totals} | {failed} | {process} |")
    difference = [statistics.mean(f["seconds"][i] for f in forked_runs)
                  - statistics.mean(s["seconds"][i] for s in started) for i in range(len(cells))]
    slowest = sorted(range(len(cells)), key=lambda i: -abs(difference[i]))[:8]
    lines += ["", "Cells whose time differs most (forked minus started, mean of the runs):", "",
              "| cell | difference (s) | first line |", "| --- | --- | --- |"]
    for i in slowest:
        first = (cells[i].strip().splitlines() or [""])[0][:70].replace("|", "\\|")
        lines.append(f"| {i} | {difference[i]:+.2f} | `{first}` |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel-speed.md").write_text("\n".join(lines) + "\n")
    (args.out / "kernel-speed.json").write_text(json.dumps({"lab": args.lab, "runs": runs}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
