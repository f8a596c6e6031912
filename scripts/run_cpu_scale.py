"""Run each lab's instructor notebook top to bottom at cpu scale, one lab at a time, and commit what it printed.

What a student without a GPU runs (``EFFICIENT_AI_SCALE=cpu``), executed by ``scripts/gpu/run_lab.py``'s ``execute``
(the same client and timing as the GPU runs). For each lab it writes into ``--out`` (default ``reports/cpu-2core``):
- ``<lab>-cpu_executed.ipynb``: the executed notebook with its outputs (the source of the student reference's cpu
  section, ``scripts/make_student_reference.py``, and of the quote test's cpu-scale numbers);
- ``<lab>-cpu_run.json``: ``run_lab.py``'s record (wall time per part and per cell, cells that raised) and
  ``machine``: the CPU's model, the cores the run may use (``taskset`` narrows them) and the host's, the load average sampled every 5 s while the lab ran (minimum, mean,
  maximum: other work on a shared machine slows a run), the niceness the run had, and the state of the
  ``torch.compile`` caches: ``cold`` (default: Inductor's and Triton's caches in a fresh empty folder, as on a
  student's first run) or ``warm`` (the caches of the previous run of the same lab, ``--warm``); the commit the
  notebooks came from; ``EFFICIENT_AI_MACHINE``, a description of the machine (e.g. "2 cores of an idle 16-core host").

Usage (from a clean checkout, so that other work in progress is not what runs)::

    git archive HEAD | tar -x -C /tmp/labs-head && cd /tmp/labs-head
    nice -n -5 python scripts/run_cpu_scale.py lab1 lab2 lab3 --out /path/to/repo/reports/cpu-2core

then, in the repository: ``python scripts/make_student_reference.py && python -m course build`` (the students'
``measured_runs.md``), ``python scripts/run_times.py && python -m course build`` (the first cell's run-time line),
``python scripts/performance.py`` (docs/PERFORMANCE.md) and ``python tests/test_quotes.py`` (the quotes of the lab
texts that the new run no longer holds, written to /tmp/quotes_labN.txt).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts" / "gpu"))

CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
CACHE_ROOT = Path(tempfile.gettempdir()) / "efficient-ai-cpu-scale-caches"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class LoadSampler:
    """Samples the 1-minute load average every ``period_s`` seconds in a thread while a lab runs."""

    def __init__(self, period_s: float = 5.0):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.period_s)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"min": round(min(s), 2), "mean": round(sum(s) / len(s), 2), "max": round(max(s), 2),
                "samples": len(s), "period_s": self.period_s}


def use_caches(lab: str, warm: bool) -> str:
    """Point Inductor's and Triton's caches at this lab's folder: emptied first unless ``warm``. Returns the state."""
    folder = CACHE_ROOT / lab
    state = "warm" if warm and folder.is_dir() and any(folder.rglob("*")) else "cold"
    if state == "cold":
        subprocess.run(["rm", "-rf", str(folder)], check=True)
    for name in CACHE_ENV:
        path = folder / name.split("_")[0].lower()
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    return state


def source_commit() -> str:
    """The commit the notebooks came from: ``EFFICIENT_AI_SOURCE_COMMIT`` when set, else git's HEAD with ``-dirty``
    when the tree differs from it (the lent GPU machine's copy carries the working tree over an older HEAD)."""
    if given := os.environ.get("EFFICIENT_AI_SOURCE_COMMIT"):
        return given
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def run(lab: str, out: Path, warm: bool, timeout_s: int) -> dict:
    import torch
    from run_lab import execute

    cache_state = use_caches(lab, warm)
    prefix = f"{lab}-cpu"
    with LoadSampler() as load:
        result = execute(lab, out, timeout_s, None, prefix, "cpu")
    for figure in out.glob(f"{prefix}_fig_*.png"):  # the figures stay inside the executed notebook
        figure.unlink()
    record = {"lab": lab, "gpu_memory_cap_gb": None, "device": "cpu", "torch": torch.__version__,
              "teaching_run": result,
              "machine": {"cpu": cpu_model(), "cpus": len(os.sched_getaffinity(0)), "host_cpus": os.cpu_count(),
                          "threads": torch.get_num_threads(),
                          "load_average_while_running": load.summary(), "nice": os.nice(0),
                          "compile_caches": cache_state, "python": platform.python_version(),
                          "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                          "source_commit": source_commit(),
                          "where": os.environ.get("EFFICIENT_AI_MACHINE", "")}}
    (out / f"{prefix}_run.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("labs", nargs="+")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "cpu-2core")
    parser.add_argument("--warm", action="store_true", help="keep each lab's compile caches from its previous run")
    parser.add_argument("--cell-timeout-s", type=int, default=1800)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for lab in args.labs:
        record = run(lab, args.out, args.warm, args.cell_timeout_s)
        tr, machine = record["teaching_run"], record["machine"]
        load = machine["load_average_while_running"]
        print(f"{lab}: cpu scale {tr['total_s']:.0f} s on {machine['cpus']} x {machine['cpu']}, load average "
              f"{load['min']}-{load['max']} (mean {load['mean']}), {machine['compile_caches']} compile caches, "
              f"nice {machine['nice']}; {len(tr['errors'])} cell(s) raised", flush=True)
        for error in tr["errors"]:
            print(f"  ERROR cell {error['index']} ({error['grade_id']}): {error['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
