"""Time one autograde of a lab's reference solution on this machine at quick scale: the median of 3 runs.

Usage: ``python scripts/bench_autograde_cpu.py [--lab lab1] [--repeat 3]``. Each run grades one submission into
a fresh SQLite course (``course.grade.grade_lab``); the time of ``nbgrader autograde`` for that submission is
reported (kernel start, the whole notebook at quick scale, hidden tests, gradebook writes), and so is the wall
time of the whole call. Writes ``reports/<lab>-cpu-autograde.md`` and ``.json``. DESIGN target: 5 minutes on
a 2-core CPU machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_grading_throughput import grade_class  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "reports")
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        row = grade_class(args.lab, submissions=1, workers=1)
        row["call_seconds"] = time.perf_counter() - start
        runs.append(row)
        print(f"autograde {args.lab}: {row['autograde_seconds'][0]:.1f} s (whole call {row['call_seconds']:.1f} s), failed={row['failed']}", flush=True)
    autograde_s = [r["autograde_seconds"][0] for r in runs]
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, no GPU"
    median = statistics.median(autograde_s)
    lines = [
        f"# One {args.lab} autograde on CPU, quick scale", "",
        f"Measured by `scripts/bench_autograde_cpu.py` on {machine}: the reference solution graded {args.repeat} "
        f"times, each into a fresh SQLite course.", "",
        "| run | nbgrader autograde (s) | whole call incl. gradebook preparation (s) |", "| --- | --- | --- |",
        *[f"| {i + 1} | {r['autograde_seconds'][0]:.1f} | {r['call_seconds']:.1f} |" for i, r in enumerate(runs)],
        "", f"Median: **{median:.1f} s** per submission (target: at most 300 s on a 2-core CPU machine).",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.lab}-cpu-autograde.md").write_text("\n".join(lines) + "\n")
    (args.out / f"{args.lab}-cpu-autograde.json").write_text(json.dumps({"machine": machine, "runs": runs, "median_s": median}, indent=1))
    print(f"median {median:.1f} s; wrote {args.out / (args.lab + '-cpu-autograde.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
