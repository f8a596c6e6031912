"""Running nbgrader in a course folder, a process per command (``course.grader.nbgrader_child``) so that one submission's
crash, hang or dead kernel ends that process only (scores are read back by ``course.common.scores``).

Each process runs in a session of its own (a time limit kills its group) and reads a line from ``course grade`` until
``course grade`` ends: then it ends too (``kill -9`` of ``course grade`` included). It is forked from a
multiprocessing fork server that imported nbgrader and the tests' libraries once (``course.grader.preload``), or, with
the speed piece ``fork_server`` off, started by ``subprocess`` (the line is then its stdin).
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..common.grading_result import GradingResult
from ..common.job import GradingJob, WorkerSlot
from ..common.paths import REPO_ROOT
from ..common.processes import kill_group
from ..common.quoting import escape_controls
from ..common.speed import speed_pieces
from ..grader import nbgrader_child

CHILD = [sys.executable, "-m", "course.grader.nbgrader_child"]


def nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment nbgrader and its kernels run with: ours, headless plotting, and ``extra``."""
    return {
        **os.environ,
        "MPLBACKEND": "Agg",
        "PYTHONUNBUFFERED": "1",
        # nbgrader runs the `alembic` and `jupyter` executables of its own environment.
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
        **(extra or {}),
    }


@dataclass
class NbgraderResult:
    """What one nbgrader command did."""

    returncode: int
    output: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.output.strip().splitlines()[-lines:])


FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["course.grader.preload"])  # read when the server starts, at the first fork
_starting = threading.Lock()  # multiprocessing's list of a process's children is not safe across threads


class ChildProcess:
    """A ``course.grader.nbgrader_child`` process: its own session, its output (stdout and stderr) in a file of ours, a
    line from us open until it ends (closing it, or our end, ends the process). Forked from the fork server, or started
    by ``subprocess`` when the speed piece ``fork_server`` is off."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None, job_line: str | None = None):
        handle, self._output = tempfile.mkstemp(prefix="efficient-ai-nbgrader-", suffix=".log")
        self._proc = self._forked = self._line = None
        try:
            if speed_pieces().fork_server:
                os.close(handle)
                self._start_forked(args, env, cwd, job_line)
            else:
                with os.fdopen(handle, "wb") as output:
                    self._proc = subprocess.Popen([*CHILD, *args], stdin=subprocess.PIPE, stdout=output,
                                                  stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
                self.send(f"{job_line}\n" if job_line is not None else "")
        except BaseException:
            os.unlink(self._output)
            raise

    def _start_forked(self, args: list[str], env: dict[str, str], cwd: Path | None, job_line: str | None) -> None:
        theirs, self._line = FORKS.Pipe(duplex=False)
        try:
            self._forked = FORKS.Process(target=nbgrader_child.forked, daemon=True,  # ended with us, never joined at exit
                                         args=(args, job_line, str(cwd or os.getcwd()), env, self._output, theirs))
            with _starting:
                self._forked.start()
        finally:
            theirs.close()

    def send(self, text: str) -> None:
        """Write ``text`` to the process's line (nothing once it has ended)."""
        if not text:
            return
        try:
            if self._line is not None:
                self._line.send_bytes(text.encode())
            else:
                self._proc.stdin.write(text.encode())
                self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):  # it ended already (its output says why)
            pass

    def wait(self, timeout_s: float | None) -> tuple[int, str, bool]:
        """Wait at most ``timeout_s`` seconds for the process to end (its group is killed after); its exit status,
        output and whether it was killed at the limit."""
        status, timed_out = self._wait_forked(timeout_s) if self._forked is not None else self._wait_started(timeout_s)
        output = Path(self._output).read_text(errors="replace")
        os.unlink(self._output)
        return (-9 if timed_out else status), output, timed_out

    def _wait_started(self, timeout_s: float | None) -> tuple[int, bool]:
        try:
            self._proc.wait(timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(self._proc.pid)
            self._proc.wait()
            timed_out = True
        self._proc.stdin.close()
        return self._proc.returncode, timed_out

    def _wait_forked(self, timeout_s: float | None) -> tuple[int, bool]:
        self._forked.join(timeout_s)
        timed_out = self._forked.exitcode is None
        if timed_out:
            kill_group(self._forked.pid)
            self._forked.kill()  # should it not have made its session yet
            self._forked.join()
        self._line.close()
        status = self._forked.exitcode
        self._forked.close()
        return status, timed_out


def run_nbgrader(course_root: Path, args: list[str], timeout_s: float | None = None,
                 env: dict[str, str] | None = None) -> NbgraderResult:
    """Run ``nbgrader ARGS`` (e.g. ``["db", "student", "list"]``) in ``course_root``, a folder holding
    ``nbgrader_config.py``, with ``env`` added and a wall-clock limit of ``timeout_s`` seconds (its process group is
    killed past it). Never raises for nbgrader's own failures."""
    return NbgraderResult(*ChildProcess(["--", *args], nbgrader_env(env), cwd=course_root).wait(timeout_s))


@dataclass
class GradingRun:
    """How one grading process ended: its result (``GradingResult``), and whether it was killed at its time limit."""

    result: GradingResult
    timed_out: bool = False


class GradingProcess:
    """The process that autogrades one ``GradingJob`` (``course.grader.nbgrader_child --job``), started now.

    Started ``ahead``, it gets ready (imports, kernel, locked setup cells) and waits before the notebook's first
    student cell until ``go``: ``course grade`` starts a worker's next submission this way while it grades one.
    """

    def __init__(self, job: GradingJob):
        self.job = job
        self._process = ChildProcess(["--job"], nbgrader_env(job.slot.environment()), job_line=job.to_json())
        self._went = not job.ahead

    def go(self) -> None:
        """Let a process started ahead go on past its first student cell (nothing for one started at its turn)."""
        if not self._went:
            self._went = True
            self._process.send("go\n")

    def finish(self, timeout_s: float | None = None) -> GradingRun:
        """``go``, then wait at most ``timeout_s`` seconds (default: the job's limit) for the result."""
        self.go()
        limit_s = self.job.limits.submission_timeout_s if timeout_s is None else timeout_s
        status, output, timed_out = self._process.wait(limit_s)
        if timed_out:
            return GradingRun(GradingResult(), True)
        recorded = self.job.result_file.exists()
        result = GradingResult.read(self.job.result_file)
        self.job.result_file.unlink(missing_ok=True)
        if not recorded:  # it ended without a word: a crash of the process itself
            lines = [line.strip() for line in output.splitlines() if line.strip()]
            last = f": {escape_controls(lines[-1])[:500]}" if lines else ""
            result.failure = f"the grading process ended (status {status}) before it recorded a result{last}"
        return GradingRun(result)


def grading_workers(workers: int, gpus: list[str], cpus: list[int]) -> list[WorkerSlot]:
    """``workers`` concurrent grading jobs' slots.

    Each worker gets one GPU (round robin over ``gpus``) and, when there are several workers, an equal, disjoint share
    of ``cpus`` for its kernels, so student code that floods the CPUs slows its own worker only. A kernel's thread
    pools leave one CPU of the share to the worker's next submission getting ready beside it (a pool as wide as the
    share would stall whenever that takes one of its CPUs).
    """
    share = max(1, len(cpus) // workers) if cpus else 0
    slots = []
    for index in range(workers):
        kernel_cpus = (cpus[(index * share) % len(cpus):][:share] or cpus[:share]) if workers > 1 and cpus else []
        slots.append(WorkerSlot(gpus[index % len(gpus)] if gpus else None, tuple(kernel_cpus),
                                max(1, share - 1) if share else 0))
    return slots


def available_cpus() -> list[int]:
    """CPU numbers this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def make_course_dir(course_root: Path, labs: list[str], repo_root: Path = REPO_ROOT) -> Path:
    """Create a course folder for grading: our nbgrader_config.py and each lab's ``source/`` copied in."""
    course_root.mkdir(parents=True, exist_ok=True)
    shutil.copy2(repo_root / "nbgrader_config.py", course_root / "nbgrader_config.py")
    for lab in labs:
        dest = course_root / "source" / lab
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(repo_root / "source" / lab, dest)
    return course_root
