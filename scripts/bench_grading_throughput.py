"""Grading throughput (submissions per minute) against the number of workers, at quick scale on this machine.

Usage: ``python scripts/bench_grading_throughput.py [--lab lab1] [--submissions 8] [--workers 1 2]
[--kernels-ahead on|off|both] [--pin on|off|both] [--zygote on|off|both] [--cell-times]``, or
``--render REPORT.json``.
Each run grades the same class (copies of the reference solution of the lab) into a fresh SQLite course with
``course.grade.grade_lab`` and times the whole call, gradebook preparation included. ``--kernels-ahead off`` grades
with ``EFFICIENT_AI_KERNEL_POOL_OFF=1`` and ``EFFICIENT_AI_FORK_SERVER=off``: every nbgrader process starts with
``python`` and starts its own kernel, as before ``course/kernel_pool.py`` and ``course/fork_server.py``; ``both`` runs
every worker count both ways, off first. ``--pin off`` lets every worker use every CPU (``EFFICIENT_AI_PIN_CPUS=off``)
instead of its own share. ``--zygote off`` starts every kernel ahead with ``python``
(``EFFICIENT_AI_KERNEL_ZYGOTE=off``) instead of forking it from the worker's zygote (``course/kernel_zygote.py``; a
sandboxed kernel then enters a sandbox made for it). Each row also says how busy the machine's CPUs and GPU were
during the run and how much CPU time each kind of process took (kernels, nbgrader, the grader's own
process), and the run fails unless every copy earns every autograded cell's points with no cell raising. With
``--cell-times``, the graded notebooks keep nbclient's cell timestamps and the report splits a submission's time by
part of the notebook (its cells, the test cells the grader ran, the grader's requests between cells). Writes
``reports/grading-throughput.md`` and ``reports/grading-throughput.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course.fork_server import MODE_ENV as FORK_SERVER_ENV  # noqa: E402
from course.grade import grade_lab  # noqa: E402
from course.kernel_pool import POOL_OFF_ENV  # noqa: E402
from course.kernel_zygote import MODE_ENV as ZYGOTE_ENV  # noqa: E402
from course.nbgrader_run import PIN_ENV, make_course_dir  # noqa: E402
from course.notebooks import make_submission, read_notebook, write_notebook  # noqa: E402
from course.processes import stat_fields  # noqa: E402
from course.sandbox import sandbox_works  # noqa: E402

ON_OFF = {"on": [True], "off": [False], "both": [True, False]}  # a --kernels-ahead, --pin or --zygote choice


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, in clock ticks (``/proc/stat``; zeros elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


class GpuSampler:
    """Mean GPU utilisation (%, as ``nvidia-smi`` reports it every 0.5 s) while the ``with`` block runs; None
    without ``nvidia-smi`` or a GPU."""

    def __enter__(self) -> "GpuSampler":
        self.percent, self._proc = None, None
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        self._proc.terminate()
        output, _ = self._proc.communicate()
        samples = [float(line) for line in output.split() if line.replace(".", "", 1).isdigit()]
        self.percent = sum(samples) / len(samples) if samples else None


class ProcessCpu:
    """CPU time (user + system, seconds) of every process alive while the ``with`` block runs, by kind: sampled from
    ``/proc/PID/stat`` every ``interval_s``, the last sample of each process counted (what a process spends after
    its last sample, at most ``interval_s``, is missed). Kinds, from the command line: ``kernel`` (started or
    forked kernels, the zygotes and their sandboxes' bwrap), ``nbgrader`` (nbgrader processes and the fork server),
    ``grader`` (this process: the workers' threads and the gradebook recorder) and ``other`` (nvidia-smi and the
    rest of the machine). ``kernel_threads``: the kernels' CPU time by thread name (``/proc/PID/task/TID/stat``; digits
    in a name read ``#``, so a pool of threads is one row): what in a kernel uses its CPU, the student's code (the
    main thread) or threads that wait by spinning (OpenMP, CUDA). ``kernel_main_wait_s``: how long the kernels' main
    threads were runnable but waited for a CPU (``/proc/PID/schedstat``), in all."""

    KINDS = ("kernel", "nbgrader", "grader", "other")

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.seconds: dict[str, float] = {}
        self.kernel_threads: dict[str, float] = {}
        self._ticks: dict[tuple[int, str], tuple[str, int]] = {}  # (pid, start time) -> (kind, CPU ticks)
        self._thread_ticks: dict[tuple[int, str, int], tuple[str, int]] = {}  # (pid, start, tid) -> (name, ticks)
        self.kernel_main_wait_s = 0.0  # kernels' main threads: time runnable but waiting for a CPU
        self._main_waits: dict[tuple[int, str], int] = {}  # (pid, start) -> run-queue wait in ns (schedstat)

    def __enter__(self) -> ProcessCpu:
        import threading

        self._start = self._sample()
        self._threads_at_start = dict(self._thread_ticks)
        self._main_waits_at_start = dict(self._main_waits)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        end = self._sample()
        hz = os.sysconf("SC_CLK_TCK")
        self.seconds = {kind: 0.0 for kind in self.KINDS}
        for key, (kind, ticks) in {**self._ticks, **end}.items():
            self.seconds[kind] += (ticks - self._start.get(key, (kind, 0))[1]) / hz
        self.kernel_main_wait_s = sum(wait - self._main_waits_at_start.get(key, 0)
                                      for key, wait in self._main_waits.items()) / 1e9
        self.kernel_threads = {}
        for key, (name, ticks) in self._thread_ticks.items():
            began = self._threads_at_start.get(key, (name, 0))[1]
            self.kernel_threads[name] = self.kernel_threads.get(name, 0.0) + (ticks - began) / hz

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._ticks.update(self._sample())

    def _kind(self, pid: int) -> str:
        if pid == os.getpid():
            return "grader"
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "other"
        if "kernel_boot" in command or "ipykernel" in command or command.startswith("bwrap") or "/bwrap " in command:
            return "kernel"
        if "fork_server" in command or "nbgrader" in command:
            return "nbgrader"
        return "other"

    def _sample(self) -> dict[tuple[int, str], tuple[str, int]]:
        found = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            fields = stat_fields(int(entry.name))
            if not fields:
                continue
            key = (int(entry.name), fields[19])
            kind = self._ticks[key][0] if key in self._ticks else self._kind(key[0])
            found[key] = (kind, int(fields[11]) + int(fields[12]))  # utime + stime
            if kind == "kernel":
                self._sample_threads(*key)
        return found

    def _sample_threads(self, pid: int, started: str) -> None:
        try:  # schedstat: time on a CPU, time runnable and waiting for one (ns), timeslices
            with open(f"/proc/{pid}/schedstat") as handle:
                self._main_waits[(pid, started)] = int(handle.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
        try:
            tids = [int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()]
        except OSError:
            return
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                    text = handle.read()
            except OSError:
                continue
            name = re.sub(r"\d+", "#", text[text.find("(") + 1:text.rfind(")")])
            name = f"main: {name}" if tid == pid else name  # OpenMP's threads take the main thread's name
            fields = text.rsplit(")", 1)[1].split()
            self._thread_ticks[(pid, started, tid)] = (name, int(fields[11]) + int(fields[12]))


class Timeline:
    """When each submission's work started and ended, in seconds from the start of the run: the worker's whole
    turn (``course.grade._execute_isolated``: copying the private course, then the autograde) and the autograde in
    it (``course.grade.autograde_one``), and each recording of finished submissions in a SQLite gradebook
    (``course.grade._import_executed``). Wraps the functions while the run lasts; what they do is unchanged."""

    NAMES = ("_execute_isolated", "autograde_one", "_import_executed", "write_reports")

    def __init__(self):
        import threading

        self.spans: dict[str, list[tuple[float, float]]] = {name: [] for name in self.NAMES}
        self._lock = threading.Lock()
        self._originals = {}
        self.start = 0.0

    def __enter__(self) -> Timeline:
        import course.grade as grade

        self.start = time.perf_counter()
        for name in self.NAMES:
            original = self._originals[name] = getattr(grade, name)
            setattr(grade, name, self._timed(name, original))
        return self

    def __exit__(self, *exc) -> None:
        import course.grade as grade

        for name, original in self._originals.items():
            setattr(grade, name, original)

    def _timed(self, name, original):
        def timed(*args, **kwargs):
            began = time.perf_counter() - self.start
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.spans[name].append((began, time.perf_counter() - self.start))
        return timed

    def summary(self, seconds: float) -> dict:
        """Before the first submission started, after the last ended, and the mean time of a worker's turn outside
        its autograde (seconds)."""
        turns, autogrades = self.spans["_execute_isolated"], self.spans["autograde_one"]
        if not turns:  # one worker, or a shared gradebook: no private copies
            turns = autogrades
        if not turns:
            return {}
        outside = (sum(e - b for b, e in turns) - sum(e - b for b, e in autogrades)) / len(turns)
        recordings, reports = self.spans["_import_executed"], self.spans["write_reports"]
        last = max(e for _, e in turns)
        return {"before_first_s": min(b for b, _ in turns), "after_last_s": seconds - last,
                "turn_outside_autograde_s": outside, "recordings": len(recordings),
                "recording_s": sum(e - b for b, e in recordings),
                # the parts of "after the last": recording what was left, then grades.csv and scores.png
                "recording_after_last_s": max([0.0, *(e - last for _, e in recordings)]),
                "reports_s": sum(e - b for b, e in reports)}


OUTSIDE_CELLS = "before the first cell and after the last (nbgrader, kernel hand-over, guard, scoring)"


def notebook_parts(graded: dict[Path, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per submission of each part of the graded notebooks (``graded``: each notebook and its
    autograde's seconds), from the cell timestamps nbclient recorded (``bench_grading_breakdown.split_run``): each
    part's cells, the grader's requests between cells, the test cells the grader ran (the stretches between two
    kernel cells that held them), and the rest of the autograde (``OUTSIDE_CELLS``); and of each stretch of test
    cells (``tests #index grade_id, ...``, as ``split_run`` labels them)."""
    from bench_grading_breakdown import split_run

    runs, stretch_runs = [], []
    for notebook, autograde_s in graded.items():
        steps, cells = split_run(notebook, 0.0, 0.0)
        stretches = {name: s for name, s in cells.items() if name.startswith("tests ")}
        parts = {name: seconds for name, seconds in steps.items() if name.startswith(("cells:", "between"))}
        parts["test cells (the grader's)"] = sum(stretches.values())
        parts["between cells (guard checks, grader requests)"] -= parts["test cells (the grader's)"]
        parts[OUTSIDE_CELLS] = autograde_s - sum(parts.values())
        runs.append(parts)
        stretch_runs.append(stretches)
    return _medians(runs), _medians(stretch_runs)


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per name, the median over ``runs`` (0 where a run lacks the name), names in the order they first appear."""
    names = dict.fromkeys(name for run in runs for name in run)
    return {name: statistics.median(run.get(name, 0.0) for run in runs) for name in names}


def grade_class(lab: str, submissions: int, workers: int, kernels_ahead: bool = True, pin: bool = True,
                zygote: bool = True, cell_times: bool = False) -> dict:
    os.environ.pop(POOL_OFF_ENV, None)
    os.environ.pop(FORK_SERVER_ENV, None)
    os.environ[PIN_ENV] = "on" if pin else "off"
    os.environ[ZYGOTE_ENV] = "on" if zygote else "off"
    sandboxed = sandbox_works()
    forked = kernels_ahead and zygote
    if not kernels_ahead:
        os.environ.update({POOL_OFF_ENV: "1", FORK_SERVER_ENV: "off"})
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        course = make_course_dir(Path(tmp), [lab], REPO)
        if cell_times:  # nbgrader then keeps the timestamps nbclient records on every cell
            with open(course / "nbgrader_config.py", "a", encoding="utf-8") as config:
                config.write("\nc.ClearMetadataPreprocessor.enabled = False\n")
        nb = make_submission(read_notebook(REPO / "release" / lab / f"{lab}.ipynb"),
                             read_notebook(REPO / "source" / lab / f"{lab}.ipynb"))
        for index in range(submissions):
            write_notebook(nb, course / "submitted" / f"student{index:03d}" / lab / f"{lab}.ipynb")
        busy_before, total_before = cpu_jiffies()
        start = time.perf_counter()
        with GpuSampler() as gpu, Timeline() as timeline, ProcessCpu() as cpu:
            outcomes, scores = grade_lab(course, lab, progress=False, workers=workers)
        seconds = time.perf_counter() - start
        busy_after, total_after = cpu_jiffies()
        # a cell that fails only under some way of grading (a written answer's code, say) costs no autograded point
        errors = {student: failed_cells(course / "autograded" / student / lab / f"{lab}.ipynb") for student in outcomes}
        graded = {course / "autograded" / s / lab / f"{lab}.ipynb": outcome.seconds for s, outcome in outcomes.items()}
        parts, stretches = notebook_parts(graded) if cell_times else ({}, {})
    # the reference solution earns every autograded cell's points, or the run is reported as failed
    failed = [f"{o.student}: {o.status}: {o.reason}" for o in outcomes.values() if o.status != "ok"]
    failed += [f"{student}: {cell.grade_id} earned {cell.score:g} of {cell.max_score:g}"
               for student, sub in scores.items() for cell in sub.autograded_short()]
    failed += [f"{student}: no score" for student in outcomes if student not in scores]
    failed += [f"{student}: {', '.join(cells)}" for student, cells in sorted(errors.items()) if cells]
    os.environ.pop(POOL_OFF_ENV, None)
    os.environ.pop(FORK_SERVER_ENV, None)
    os.environ.pop(PIN_ENV, None)
    os.environ.pop(ZYGOTE_ENV, None)
    cpu_busy = (busy_after - busy_before) / (total_after - total_before) if total_after > total_before else None
    return {"workers": workers, "kernels_ahead": kernels_ahead, "pinned": pin, "nbgrader_pinned": False,
            "forked": forked, "sandboxed": sandboxed,
            "submissions": submissions,
            "seconds": seconds, "cpu_busy_percent": None if cpu_busy is None else 100 * cpu_busy,
            "gpu_busy_percent": gpu.percent, "cpu_s_by_kind": cpu.seconds, "kernel_thread_cpu_s": cpu.kernel_threads,
            "kernel_main_wait_s": cpu.kernel_main_wait_s, "cores": os.cpu_count() or 1,
            "submissions_per_minute": submissions / seconds * 60, "failed": failed,
            "autograde_seconds": [outcomes[s].seconds for s in sorted(outcomes)], **timeline.summary(seconds),
            **({"notebook_parts_s": parts, "test_stretches_s": stretches} if parts else {})}


def failed_cells(notebook: Path) -> list[str]:
    """The code cells of a graded notebook whose output is an error (``cell N: ENAME``); the reference has none."""
    if not notebook.exists():
        return []
    return [f"cell {index}: {output.get('ename', '?')}"
            for index, cell in enumerate(read_notebook(notebook).cells) if cell.cell_type == "code"
            for output in cell.get("outputs", []) if output.get("output_type") == "error"]


def _pinned(row: dict) -> str:
    """How a row's workers were pinned to their CPUs (rows made before ``nbgrader_pinned`` existed pinned both)."""
    if row["workers"] <= 1:
        return "-"
    if not row["pinned"]:
        return "no"
    return "yes, nbgrader too" if row.get("nbgrader_pinned", True) else "yes"


def _recordings(row: dict) -> str:
    """How often, and for how long in all, the run recorded finished submissions in the shared SQLite gradebook."""
    if not row.get("recordings"):  # one worker, a shared gradebook, or a report from before they were timed
        return "-"
    return f"{row['recordings']}, {row['recording_s']:.0f}"


def _cpu_by_kind(row: dict) -> str:
    return ", ".join(f"{kind} {seconds:.0f}" for kind, seconds in row.get("cpu_s_by_kind", {}).items())


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def _without_out(argv: list[str]) -> list[str]:
    """The command line as a report shows it: without ``--out`` (a folder of the machine it ran on)."""
    shown, skip = [], False
    for part in argv:
        if skip or part.startswith("--out="):
            skip = False
            continue
        skip = part == "--out"
        if not skip:
            shown.append(part)
    return shown


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the architecture where it says none: lent machines of one kind
    differ in speed, and a report should say which one it measured."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.machine()


def physical_cores() -> int | None:
    """Physical cores behind this machine's logical CPUs, as its topology files say (None where they say nothing):
    two hyperthreads of one core share its execution units, so eight busy workers on 16 logical CPUs of 8 cores
    run each slower than one worker alone."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            package, core = ((topology / name).read_text().strip() for name in ("physical_package_id", "core_id"))
            cores.add((package, core))
        except OSError:
            return None
    return len(cores) or None


def machine_description() -> str:
    """CPU model and cores (and the physical cores, where fewer), Python version, and the GPU grading can see (or
    "no GPU")."""
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    physical = physical_cores()
    smt = f" ({physical} physical)" if physical and physical < (os.cpu_count() or 0) else ""
    return f"{cpu_model()}, {os.cpu_count()} cores{smt}, Python {platform.python_version()}, {gpu}"


def boot_id() -> str:
    """This boot of this machine: a random id the kernel draws at boot (empty where there is none)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def earlier_rows(path: Path, lab: str, machine: str) -> tuple[list[dict], list[str]]:
    """The rows and commands of an earlier run's JSON report, to be reported with this run's (``--append``).

    Raises:
        SystemExit: the file is missing, holds another lab, or was measured on another machine or before this
            machine's last boot: rows of different machines are not compared in one report.
    """
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--append: cannot read the earlier report {path}: {exc}") from exc
    if earlier.get("lab") != lab:
        raise SystemExit(f"--append: {path} measured {earlier.get('lab')}, not {lab}")
    if earlier.get("machine") != machine or not boot_id() or earlier.get("boot_id") != boot_id():
        raise SystemExit(f"--append: {path} was measured on another machine or before this one's last boot; "
                         "rows of different machines are not compared in one report")
    return earlier["rows"], earlier.get("commands", [])


def one_worker_rate(rows: list[dict], row: dict) -> float | None:
    """Submissions per minute of one worker grading the way ``row`` does: every such run of the report pooled
    (all their submissions over all their time). The same one-worker run repeated on one machine minutes apart
    took 73 and 85 s (reports/grading-throughput-h100-cpu.md): a speedup against one of them alone says as much
    about that run as about the workers."""
    same = [r for r in rows if r["workers"] == 1 and all(r.get(k) == row.get(k) for k in
                                                          ("kernels_ahead", "forked", "sandboxed"))]
    seconds = sum(r["seconds"] for r in same)
    return sum(r["submissions"] for r in same) / seconds * 60 if seconds else None


def _per_submission(row: dict, key: str) -> str:
    """``row[key]`` per submission for a report cell; ``-`` where the row predates the field."""
    return f"{row[key] / row['submissions']:.2f}" if key in row else "-"


def _kernel_threads_table(rows: list[dict], shown: int = 6) -> list[str]:
    """Report lines: the kernels' CPU seconds per submission by thread name (``main: ``: a process's main thread),
    the ``shown`` busiest names of all rows as columns and the rest summed."""
    rows = [row for row in rows if row.get("kernel_thread_cpu_s")]
    if not rows:
        return []
    totals: dict[str, float] = {}
    for row in rows:
        for name, seconds in row["kernel_thread_cpu_s"].items():
            totals[name] = totals.get(name, 0.0) + seconds / row["submissions"]
    names = sorted(totals, key=totals.get, reverse=True)[:shown]
    lines = ["", "Kernel CPU time per submission, by thread (seconds; thread names as the kernels set them, digits "
             "read `#`), and the time the kernels' main threads were ready to run but waiting for a CPU "
             "(`/proc/PID/schedstat`):", "", "| workers | CPUs pinned per worker | submissions | "
             + " | ".join(f"`{name}`" for name in names) + " | other threads | main threads waiting for a CPU |",
             ("| --- | --- | --- | " + "--- | " * (len(names) + 2)).rstrip()]
    for row in rows:
        per = {name: seconds / row["submissions"] for name, seconds in row["kernel_thread_cpu_s"].items()}
        rest = sum(seconds for name, seconds in per.items() if name not in names)
        lines.append(f"| {row['workers']} | {_pinned(row)} | "
                     f"{row['submissions']} | " + " | ".join(f"{per.get(name, 0.0):.2f}" for name in names)
                     + f" | {rest:.2f} | {_per_submission(row, 'kernel_main_wait_s')} |")
    return lines


def _workers(row: dict) -> str:
    return f"{row['workers']} worker{'s' if row['workers'] > 1 else ''}"


def _notebook_parts_table(rows: list[dict]) -> list[str]:
    """Report lines: median seconds per submission of each part of the notebook (``--cell-times`` rows), a column
    per row."""
    rows = [row for row in rows if row.get("notebook_parts_s")]
    if not rows:
        return []
    names = list(dict.fromkeys(name for row in rows for name in row["notebook_parts_s"]))
    lines = ["", "Where a submission's time went, median seconds per submission by part of the notebook, from the cell "
             "timestamps nbclient recorded (`--cell-times`; each part's cells as the kernel ran them, the test cells "
             "the grader ran between them, and the grader's other requests between cells):", "",
             "| part | " + " | ".join(f"{_workers(row)}, "
                                     f"{row['submissions']} submissions" for row in rows) + " |",
             "| --- | " + "--- | " * len(rows)]
    lines[-1] = lines[-1].rstrip()
    for name in [*names, "in all (the medians above, summed)"]:
        values = [sum(row["notebook_parts_s"].values()) if name.startswith("in all")
                  else row["notebook_parts_s"].get(name, 0.0) for row in rows]
        lines.append(f"| {name} | " + " | ".join(f"{value:.2f}" for value in values) + " |")
    return lines + _test_stretches_table(rows)


def _test_stretches_table(rows: list[dict], shown: int = 10) -> list[str]:
    """Report lines: the ``shown`` stretches of test cells whose median grew most from the first ``--cell-times`` row
    to the last (rows of reports made before the stretches were kept have none)."""
    rows = [row for row in rows if row.get("test_stretches_s")]
    if len(rows) < 2:
        return []
    first, last = rows[0]["test_stretches_s"], rows[-1]["test_stretches_s"]
    grown = sorted(first.keys() & last.keys(), key=lambda name: last[name] - first[name], reverse=True)[:shown]
    lines = ["", f"The {len(grown)} stretches of test cells (the grader's, run between two kernel cells) that grew most "
             "from the first of these rows to the last, median seconds per submission:", "",
             "| test cells | " + " | ".join(_workers(row) for row in rows) + " |",
             "| --- | " + "--- | " * len(rows)]
    lines[-1] = lines[-1].rstrip()
    for name in grown:
        lines.append(f"| {name} | " + " | ".join(f"{row['test_stretches_s'].get(name, 0.0):.2f}" for row in rows) + " |")
    return lines


def _failed_runs(rows: list[dict], shown: int = 6) -> list[str]:
    """Report lines naming every run in which a reference submission lost points, failed or raised (none when every
    run graded correctly): such a run's figures do not measure correct grading."""
    failed = [row for row in rows if row.get("failed")]
    if not failed:
        return []
    lines = ["", "**Failed runs**: a reference submission lost points, failed or had a cell raise, so these rows do not "
             "measure correct grading:", ""]
    for row in failed:
        more = len(row["failed"]) - shown
        listed = "; ".join(f"`{entry}`" for entry in row["failed"][:shown]) + (f"; and {more} more" if more > 0 else "")
        lines.append(f"- {_workers(row)}, {row['submissions']} submissions: "
                     f"{listed}")
    return lines


def write_report(stem: Path, lab: str, machine: str, boot: str, commands: list[str], rows: list[dict]) -> None:
    """``stem``.md (the tables) and ``stem``.json (every row) of a report measured on ``machine`` (boot id ``boot``)."""
    measured_by = " and then ".join(f"`{c}`" for c in commands)
    lines = [
        f"# Grading throughput: {lab} at quick scale", "",
        f"Measured by {measured_by} on {machine}{', one run after another' if len(commands) > 1 else ''}: copies "
        "of the reference solution (the number in each row) graded into a fresh SQLite course per run (gradebook preparation included). Sandboxed: "
        "grading kernels in bubblewrap (else no working bubblewrap, or EFFICIENT_AI_SANDBOX=off). "
        "Speedup: against one worker with the same kernel start and sandbox (every such run of the report "
        "pooled: their submissions over their time).", "",
        "| workers | kernels sandboxed | kernel pool and fork server | kernels forked from a zygote | "
        "CPUs pinned per worker | submissions | wall time (s) | submissions / min | speedup | per submission (s) | "
        "median autograde (s) | before the first / after the last (s) | gradebook recordings (runs, s) | CPU busy | "
        "GPU busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        base = one_worker_rate(rows, row)
        speedup = "-" if base is None else f"{row['submissions_per_minute'] / base:.2f}x"
        lines.append(f"| {row['workers']} | {'yes' if row.get('sandboxed') else 'no'} | "
                     f"{'yes' if row['kernels_ahead'] else 'no'} | "
                     f"{'yes' if row.get('forked') else 'no'} | "
                     f"{_pinned(row)} | "
                     f"{row['submissions']} | {row['seconds']:.0f} | "
                     f"{row['submissions_per_minute']:.2f} | {speedup} | "
                     f"{row['seconds'] / row['submissions']:.1f} | {statistics.median(row['autograde_seconds']):.1f} | "
                     f"{row.get('before_first_s', 0):.0f} / {row.get('after_last_s', 0):.0f} | "
                     f"{_recordings(row)} | {_percent(row['cpu_busy_percent'])} | {_percent(row['gpu_busy_percent'])} |")
    lines += _failed_runs(rows)
    by_kind = [row for row in rows if row.get("cpu_s_by_kind") and row.get("cores")]
    if by_kind:
        lines += ["", "CPU time per submission, by process (seconds of user and system time; `ProcessCpu`):", "",
                  "| workers | kernels forked from a zygote | CPUs pinned per worker | submissions | kernels | "
                  "nbgrader | grader (workers, recorder) | other | in all | wall time per submission x cores |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in by_kind:
            per = {kind: seconds / row["submissions"] for kind, seconds in row["cpu_s_by_kind"].items()}
            lines.append(f"| {row['workers']} | {'yes' if row.get('forked') else 'no'} | "
                         f"{_pinned(row)} | {row['submissions']} | "
                         + " | ".join(f"{per.get(kind, 0):.1f}" for kind in ProcessCpu.KINDS)
                         + f" | {sum(per.values()):.1f} | {row['seconds'] / row['submissions'] * row['cores']:.1f} |")
    lines += _kernel_threads_table(rows)
    lines += _notebook_parts_table(rows)
    split = [row for row in rows if "reports_s" in row and "after_last_s" in row]
    if split:
        lines += ["", "After the last submission ended (seconds): recording what was left in the gradebook, then "
                  "`grades.csv` and `scores.png`, and the rest (ending the workers, their kernels and servers, where it "
                  "takes longer than the reports: `course grade` writes them meanwhile):", "",
                  "| workers | CPUs pinned per worker | submissions | after the last | recording | grades.csv and "
                  "scores.png | the rest |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for row in split:
            recording, reports = row.get("recording_after_last_s", 0.0), row["reports_s"]
            lines.append(f"| {row['workers']} | {_pinned(row)} | "
                         f"{row['submissions']} | {row['after_last_s']:.1f} | {recording:.1f} | {reports:.1f} | "
                         f"{row['after_last_s'] - recording - reports:.1f} |")
    lines += ["", "Kernel pool (`course/kernel_pool.py`): each worker starts its next submission's kernel, with the "
              "lab's setup imports done, while the current submission grades. Fork server (`course/fork_server.py`): "
              "every nbgrader process is forked from one that already imported nbgrader and the grader's libraries. "
              "With SQLite, workers execute in private copies of the course and one thread records their results "
              "in the gradebook, one nbgrader process at a time, while they go on; what it records after the last "
              "submission finished and the per-run gradebook preparation are the serial part that keeps the "
              "speedup under the worker count. A PostgreSQL gradebook (NBGRADER_DB_URL) is written by the workers "
              "directly. CPU busy: the share of all the machine's CPU time that was not idle during the run "
              "(`/proc/stat`); GPU busy: the mean of `nvidia-smi`'s utilisation, sampled every 0.5 s. CPUs pinned "
              "per worker: its kernels run on its share of the CPUs, and its nbgrader processes on any CPU (`yes`) "
              "or on the share too (`yes, nbgrader too`: reports made before only kernels were pinned). Zygote "
              "(`course/kernel_zygote.py`): the workers' kernels are forked from one process that made their imports "
              "once; a sandboxed one enters a sandbox made for it as for a kernel started the usual way. Median "
              "autograde: one "
              "submission's nbgrader run; before the first: from the start of the run to the first submission's "
              "(gradebook preparation, the workers' first kernels and fork server); after the last: from the last "
              "submission's end to the end of the run (recording what was left). Gradebook recordings: the "
              "recording thread's nbgrader runs, each for every submission that finished since its last, and their "
              "time in all."]
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "boot_id": boot, "lab": lab,
                                                     "commands": commands, "rows": rows}, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--submissions", type=int, nargs="+", default=[8],
                        help="class size: one for every run, or one per --workers entry")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "reports")
    parser.add_argument("--tag", default="", help="names the report grading-throughput-<tag>.md (default: no tag)")
    parser.add_argument("--kernels-ahead", choices=("on", "off", "both"), default="on",
                        help="start each worker's next kernel ahead and fork nbgrader from the fork server (course grade's "
                             "default), or neither, or both ways")
    parser.add_argument("--zygote", choices=("on", "off", "both"), default="on",
                        help="fork the kernels started ahead from a zygote (EFFICIENT_AI_KERNEL_ZYGOTE; "
                             "the default), or start each with python; both: each worker count both ways")
    parser.add_argument("--pin", choices=("on", "off", "both"), default="on",
                        help="pin each worker to its share of the CPUs (EFFICIENT_AI_PIN_CPUS; course grade's default), "
                             "let workers share every CPU, or both ways (only runs with more than one worker differ)")
    parser.add_argument("--cell-times", action="store_true",
                        help="keep nbclient's cell timestamps (ClearMetadataPreprocessor off in the bench's course) and "
                             "report the median seconds of each part of the notebook")
    parser.add_argument("--append", action="store_true",
                        help="report this run's rows after those of the report already at --out/--tag (same lab, "
                             "measured on this machine since its last boot): one report from runs that each fit "
                             "a time limit")
    parser.add_argument("--render", type=Path, metavar="REPORT.json",
                        help="grade nothing: write the report of REPORT.json's rows again, next to it, as this "
                             "version of the script writes reports")
    args = parser.parse_args()
    if args.render:
        report = json.loads(args.render.read_text())
        for row in report["rows"]:  # rows measured before the report gave them their machine's cores
            row.setdefault("cores", int(report["machine"].split(" cores")[0].rsplit(" ", 1)[-1]))
        write_report(args.render.with_suffix(""), report["lab"], report["machine"], report.get("boot_id", ""),
                     report["commands"], report["rows"])
        print(f"wrote {args.render.with_suffix('.md')}")
        return 0
    modes = ON_OFF[args.kernels_ahead][::-1]  # both: off first
    pins, zygotes = ON_OFF[args.pin], ON_OFF[args.zygote]
    sizes = args.submissions * len(args.workers) if len(args.submissions) == 1 else args.submissions
    if len(sizes) != len(args.workers):
        parser.error("give one --submissions, or one per --workers entry")
    machine = machine_description()
    command = " ".join(["python scripts/bench_grading_throughput.py", *_without_out(sys.argv[1:])])
    stem = args.out / ("grading-throughput" + (f"-{args.tag}" if args.tag else ""))
    rows, commands = earlier_rows(stem.with_suffix(".json"), args.lab, machine) if args.append else ([], [])
    commands.append(command)
    measured: list[dict] = []
    for workers, submissions in zip(args.workers, sizes):
        for ahead in modes:
            for pin, zygote in [(p, z) for p in (pins if workers > 1 else pins[:1]) for z in zygotes]:
                row = grade_class(args.lab, submissions, workers, ahead, pin, zygote, args.cell_times)
                rows.append(row)
                measured.append(row)
                print(f"workers={workers} kernels_ahead={ahead} pinned={pin} forked={row['forked']} "
                      f"sandboxed={row['sandboxed']}: "
                      f"{row['seconds']:.0f} s, "
                      f"{row['submissions_per_minute']:.2f} submissions/min, CPU busy {_percent(row['cpu_busy_percent'])}, "
                      f"GPU busy {_percent(row['gpu_busy_percent'])}, median autograde "
                      f"{statistics.median(row['autograde_seconds']):.2f} s, before the first "
                      f"{row.get('before_first_s', 0):.1f} s, after the last {row.get('after_last_s', 0):.1f} s, per turn "
                      f"outside the autograde {row.get('turn_outside_autograde_s', 0):.2f} s, gradebook recordings "
                      f"{_recordings(row)}, after the last: recording {row.get('recording_after_last_s', 0):.1f} s, "
                      f"grades.csv and scores.png {row.get('reports_s', 0):.1f} s, CPU s by process {_cpu_by_kind(row)}, failed={row['failed']}",
                      flush=True)
                write_report(stem, args.lab, machine, boot_id(), commands, rows)  # each row kept, if a limit cuts the rest
    print(f"wrote {stem.with_suffix('.md')}")
    if any(row["failed"] for row in measured):
        print("FAILED: a reference submission lost points, failed or raised in a run above (the report lists them); "
              "its figures do not measure correct grading", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
