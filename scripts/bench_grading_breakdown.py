"""Where the time of grading one submission goes, step by step, on this machine at quick scale.

Usage: ``python scripts/bench_grading_breakdown.py [--lab lab1] [--repeat 3] [--tag cpu-2core]``.

Grades the lab's reference solution with ``nbgrader autograde`` as ``course grade`` runs it
(``course.nbgrader_run.run_nbgrader``; the course's settings, guard and sandbox on)
in a fresh SQLite course folder, ``--repeat`` times, and splits each run's wall time by the timestamps nbclient
records on every cell (``metadata.execution``; the benchmark keeps them by turning ClearMetadataPreprocessor off):

- ``start-up``: from launching ``nbgrader autograde`` to the first cell starting: Python and nbgrader start-up, the
  course settings (sandbox probe), nbgrader's copying and checks, the kernel's start and the guard's installation;
- ``cells: <part>``: the cells of each part of the notebook (the setup part holds the imports), as the kernel ran them;
- ``between cells``: the grader's own requests around cells (guard checks, liveness requests);
- ``after the last cell``: scoring, gradebook writes and writing the autograded notebook, until nbgrader exits.

With ``--kernel-ahead S``, each run's kernel is started S seconds before ``nbgrader autograde`` by a
``course.kernel_pool.KernelPool``, which nbgrader adopts: the steady state of ``course grade``, where each worker
starts its next kernel while the current submission grades (S should be shorter than one submission's grading).

With ``--fork``, ``nbgrader autograde`` is forked from a ready ``course.fork_server`` (nbgrader and the grader's
libraries already imported), as ``course grade`` runs it.

Separately, ``kernel start`` and ``imports`` are measured in a kernel started alone with the same kernelspec (time to
the kernel's first reply, then ``import torch`` and ``from utils import *`` timed inside it), and ``nbgrader start-up``
as ``nbgrader autograde`` of a lab with no submission to grade. The report ends with the slowest cells (and stretches
of test cells) of the notebook. Writes ``reports/grading-breakdown-<tag>.md``/``.json``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course.grade import prepare_gradebook  # noqa: E402
from course.kernel_pool import KernelPool  # noqa: E402
from course.nbgrader_ext import GRADING_REPORT  # noqa: E402
from course.nbgrader_run import make_course_dir, nbgrader_env, run_nbgrader, start_fork_server  # noqa: E402
from course.notebooks import make_submission, read_notebook, write_notebook  # noqa: E402

sys.path.insert(0, str(REPO / "scripts"))
from bench_grading_throughput import _without_out, machine_description  # noqa: E402

STUDENT = "bench"
SLOWEST_CELLS = 15  # rows of the report's slowest-cells table


def _stamp_s(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _part_of(cell, current: str) -> str:
    """The part a cell belongs to: the last level-2 heading (``## Part 2 ...``) seen, else ``current``."""
    if cell.cell_type == "markdown":
        for line in cell.source.splitlines():
            if line.startswith("## "):
                return line[3:].strip()[:60]
    return current


def _cell_label(cell, index: int) -> str:
    """``#index grade_id`` of a cell, or ``#index`` and the start of its first line."""
    grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    first_line = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    return f"#{index} {grade_id}" if grade_id else f"#{index} `{first_line[:40].replace('|', '/')}`"


def split_run(notebook: Path, started_s: float, ended_s: float) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of one autograde run by step, from the executed notebook's cell timestamps; and the seconds of every
    executed cell (``#index label``) and of every stretch between two of them that held test cells
    (``tests #index grade_id, ...``: the grader ran them meanwhile).
    """
    nb = read_notebook(notebook)
    steps: dict[str, float] = {}
    part, first_start, previous_end, between = "before the first part", None, None, 0.0
    tests_since: list[str] = []
    cells: dict[str, float] = {}
    for index, cell in enumerate(nb.cells):
        part = _part_of(cell, part)
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in timing or "shell.execute_reply" not in timing:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade") and cell.cell_type == "code":
                tests_since.append(_cell_label(cell, index))
            continue
        start, end = _stamp_s(timing["iopub.execute_input"]), _stamp_s(timing["shell.execute_reply"])
        first_start = start if first_start is None else first_start
        if previous_end is not None:
            between += max(0.0, start - previous_end)
            if tests_since:
                cells["tests " + ", ".join(tests_since)] = max(0.0, start - previous_end)
        tests_since = []
        steps[f"cells: {part}"] = steps.get(f"cells: {part}", 0.0) + (end - start)
        cells[_cell_label(cell, index)] = end - start
        previous_end = end
    if first_start is None:
        raise RuntimeError(f"{notebook}: no cell carries execution timestamps (was ClearMetadataPreprocessor on?)")
    steps = {"start-up (nbgrader, settings, kernel start, guard)": first_start - started_s, **steps,
             "between cells (guard checks, grader requests)": between, "after the last cell (scoring, gradebook)":
             ended_s - previous_end, "total": ended_s - started_s}
    return steps, cells


def autograde_run(course: Path, lab: str, kernel_ahead_s: float | None = None,
                  fork: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """One autograde of the course's submission: its seconds by step and by cell (``split_run``)."""
    shutil.rmtree(course / "autograded", ignore_errors=True)
    with contextlib.ExitStack() as stack:
        env = {}
        if kernel_ahead_s is not None:
            claimed = []
            pool = stack.enter_context(KernelPool(course, lab, more_to_grade=lambda: not claimed))
            time.sleep(kernel_ahead_s)
            claimed.append(True)  # no other kernel is started ahead once nbgrader runs
            env = pool.env
        started = time.time()
        result = run_nbgrader(course, ["autograde", lab, "--student", STUDENT, "--force",
                                       "--ClearMetadataPreprocessor.enabled=False"], env=env, fork=fork)
        ended = time.time()
    if not result.ok:
        raise RuntimeError(f"nbgrader autograde failed:\n{result.tail(40)}")
    notebook = course / "autograded" / STUDENT / lab / f"{lab}.ipynb"
    if kernel_ahead_s is not None and not json.loads((notebook.parent / GRADING_REPORT).read_text()).get(
            "kernel_started_ahead"):
        raise RuntimeError("nbgrader did not adopt the kernel started ahead")
    return split_run(notebook, started, ended)


def startup_run(course: Path, lab: str) -> float:
    """Seconds of ``nbgrader autograde`` with nothing to grade: Python, nbgrader and the course settings."""
    started = time.perf_counter()
    run_nbgrader(course, ["autograde", lab, "--student", "nobody-submitted-this"])
    return time.perf_counter() - started


KERNEL_PROBE = r'''
import json, os, sys, time
from course.nbgrader_run import nbgrader_env
os.environ.update(nbgrader_env())
os.chdir(sys.argv[1])
from traitlets.config import Config
from course.sandbox import configure_sandbox
c = Config()
c.CourseDirectory.root = sys.argv[2]  # the course: the kernel's instructor files come from its source/<lab>/
configure_sandbox(c)
from jupyter_client.manager import KernelManager
kernel_name = c.Execute.get("kernel_name", "python3")
started = time.perf_counter()
km = KernelManager(kernel_name=kernel_name, config=c)
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=600)
ready = time.perf_counter()
times = {"kernel start (to its first reply)": ready - started}
for label, code in (("imports: import torch", "import torch"), ("imports: from utils import *", "from utils import *")):
    t = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=600)
    times[label] = time.perf_counter() - t
    if reply["content"]["status"] != "ok":
        error = f'{reply["content"].get("ename", "")}: {reply["content"].get("evalue", "")}'[:120]
        times[f"{label} (FAILED: {error})"] = times.pop(label)
kc.stop_channels(); km.shutdown_kernel(now=True)
print("RESULT " + json.dumps({"kernel_name": kernel_name, "times": times}))
'''


def kernel_run(course: Path, lab: str) -> dict:
    """Kernel start and imports, in a kernel started with the course's kernelspec from ``source/<lab>``'s files."""
    work = course / "kernel-probe" / lab  # the kernel finds the lab's instructor files by its folder's name
    shutil.rmtree(work.parent, ignore_errors=True)
    shutil.copytree(course / "source" / lab, work, ignore=shutil.ignore_patterns("*.ipynb"))
    result = subprocess.run([sys.executable, "-c", KERNEL_PROBE, str(work), str(course)], cwd=work, env=nbgrader_env(),
                            capture_output=True, text=True, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"kernel probe failed:\n{result.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tag", default="cpu", help="names the report: reports/grading-breakdown-<tag>.md")
    parser.add_argument("--out", type=Path, default=REPO / "reports")
    parser.add_argument("--kernel-ahead", type=float, default=None, metavar="S",
                        help="start the kernel S seconds ahead, as course grade's pool does (default: nbgrader starts it)")
    parser.add_argument("--fork", action="store_true", help="fork nbgrader from course grade's fork server")
    args = parser.parse_args()
    if args.fork and not (start_fork_server() and start_fork_server().wait_ready()):
        raise SystemExit("the fork server did not start (EFFICIENT_AI_FORK_SERVER=off?)")
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as tmp:
        course = make_course_dir(Path(tmp) / "course", [args.lab], REPO)
        nb = make_submission(read_notebook(REPO / "release" / args.lab / f"{args.lab}.ipynb"),
                             read_notebook(REPO / "source" / args.lab / f"{args.lab}.ipynb"))
        write_notebook(nb, course / "submitted" / STUDENT / args.lab / f"{args.lab}.ipynb")
        prepare_gradebook(course, args.lab)
        runs, cell_runs = [], []
        for index in range(args.repeat):
            run, cells = autograde_run(course, args.lab, args.kernel_ahead, args.fork)
            cell_runs.append(cells)
            run["nbgrader start-up alone (no submission)"] = startup_run(course, args.lab)
            probe = kernel_run(course, args.lab)
            run.update(probe["times"])
            runs.append(run)
            print(f"run {index + 1}: total {run['total']:.1f} s ({probe['kernel_name']})", flush=True)
    steps = list(dict.fromkeys(key for run in runs for key in run))
    medians = {step: statistics.median(run.get(step, 0.0) for run in runs) for step in steps}
    cell_medians = {label: statistics.median(cells.get(label, 0.0) for cells in cell_runs)
                    for label in dict.fromkeys(label for cells in cell_runs for label in cells)}
    machine = machine_description()
    lines = [
        f"# Where one {args.lab} autograde spends its time ({args.tag})", "",
        f"Measured by `{' '.join(['python scripts/bench_grading_breakdown.py', *_without_out(sys.argv[1:])])}` "
        f"on {machine}: plain `nbgrader autograde` of the reference solution at quick scale, guard and sandbox as "
        "configured, split by the cell timestamps nbclient records. Medians of the runs, in seconds."
        + ("" if args.kernel_ahead is None else f" The kernel was started {args.kernel_ahead:g} s ahead and adopted "
           "by nbgrader (`course/kernel_pool.py`), as in `course grade`'s steady state.")
        + (" nbgrader was forked from `course/fork_server.py`, as `course grade` runs it." if args.fork else ""), "",
        "| step | median (s) | share of total |", "| --- | --- | --- |",
    ]
    total = medians["total"]
    for step in steps:
        share = f"{100 * medians[step] / total:.0f} %" if step in runs[0] and step != "total" and not step.startswith(
            ("kernel start", "imports", "nbgrader start-up alone")) else ""
        lines.append(f"| {step} | {medians[step]:.2f} | {share} |")
    lines += ["", "Rows without a share are measured separately (a kernel started alone; nbgrader with nothing to "
              "grade) and are contained in the start-up and setup rows above.", "",
              f"The {SLOWEST_CELLS} slowest cells (medians; `tests ...`: the test cells the grader ran between two "
              "cells of the kernel, with the guard's requests around them):", "",
              "| cell | median (s) |", "| --- | --- |"]
    for label, seconds in sorted(cell_medians.items(), key=lambda item: -item[1])[:SLOWEST_CELLS]:
        lines.append(f"| {label} | {seconds:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"grading-breakdown-{args.tag}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    runs_with_cells = [{**run, "cells": cells} for run, cells in zip(runs, cell_runs)]
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "lab": args.lab, "runs": runs_with_cells,
                                                     "medians_s": medians}, indent=1))
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
