"""Running nbgrader in a course folder (a process per command, ``course.nbgrader_child``, so that one submission's
crash, hang or dead kernel ends that process only), and reading scores back from its gradebook.

The processes come from ``multiprocessing``'s fork server: as in any multiprocessing program, a script that starts
them keeps its own work under ``if __name__ == "__main__":`` (each process imports the script's main module again).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import nbgrader_child
from .boundary import INSTRUCTOR_MODULES
from .notebooks import NotebookError, bonus_points, cells_by_grade_id, is_bonus_id, read_notebook
from .paths import COURSE_ID, REPO_ROOT
from .processes import kill_group

THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


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


def run_nbgrader(course_root: Path, args: list[str], timeout_s: float | None = None,
                 env: dict[str, str] | None = None) -> NbgraderResult:
    """Run ``nbgrader ARGS`` (e.g. ``["db", "student", "list"]``) in ``course_root``, a folder holding
    ``nbgrader_config.py``, with ``env`` added and a wall-clock limit of ``timeout_s`` seconds (its process group is
    killed past it). Never raises for nbgrader's own failures."""
    return NbgraderProcess(course_root, args, env).finish(timeout_s)


FORKS = multiprocessing.get_context("forkserver")
# What every nbgrader process imports, imported once by the fork server (course.nbgrader_child first: it says why).
PRELOAD = ("course.nbgrader_child", "nbgrader.apps.nbgraderapp", "nbgrader.preprocessors", "nbclient", "IPython", "torch")
SERVER_RESTART_S = 60  # how long a fork server that died starting may take to be seen dead (a machine under load)
_start_lock = threading.Lock()  # multiprocessing's record of a process's children is not safe across threads


def preload(modules: list[str] = ()) -> None:
    """Have the fork server also import ``modules`` (a lab's libraries) when it starts (nothing once it runs)."""
    FORKS.set_forkserver_preload([*PRELOAD, *(name for name in modules if name.split(".")[0] not in INSTRUCTOR_MODULES)])


preload()


def _forked(job: tuple):
    """A process forked from the fork server (started now if it is not running) that runs ``nbgrader_child.run(*job)``.
    A server that died starting (a lab library raised at import; its error is above) starts again without the lab's
    libraries.

    multiprocessing starts a server again only once it has reaped the dead one (a non-blocking ``waitpid`` in
    ``ensure_running``), and a server that has closed its sockets may not be reaped yet: until then it is taken for
    alive and its address refuses the connection, or takes it and closes unanswered. So a start after that failure
    is tried again until multiprocessing starts the new server (at most ``SERVER_RESTART_S`` seconds)."""
    with _start_lock:
        try:
            return _start(job)
        except (EOFError, ConnectionError):  # the server died before it answered: it imported a failing library
            preload()
        deadline = time.monotonic() + SERVER_RESTART_S
        while True:
            try:
                return _start(job)
            except (EOFError, ConnectionError):  # still the dead server's address
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _start(job: tuple):
    process = FORKS.Process(target=nbgrader_child.run, args=job)
    process.start()
    return process


class NbgraderProcess:
    """One ``nbgrader ARGS`` process (``course.nbgrader_child.run``), forked from a server that imported nbgrader and
    the lab's libraries once, in its own session so that a time limit kills its kernel too.

    Started ``ahead``, it gets ready (kernel, locked setup cells) and waits before the notebook's first student cell
    until ``go``: ``course grade`` starts a worker's next submission this way while it grades one.
    """

    def __init__(self, course_root: Path, args: list[str], env: dict[str, str] | None = None, ahead: bool = False,
                 kernel_cpus: list[int] | None = None):
        turn, self._turn = FORKS.Pipe(duplex=False) if ahead else (None, None)
        handle, self._output = tempfile.mkstemp(prefix="efficient-ai-nbgrader-", suffix=".log")
        os.close(handle)
        job = (args, str(course_root), nbgrader_env(env), self._output, list(kernel_cpus or ()), turn)
        try:
            self._proc = _forked(job)
        except BaseException:
            os.unlink(self._output)
            raise
        finally:
            if turn is not None:
                turn.close()

    def go(self) -> None:
        """Let a process started ahead go on past its first student cell (nothing for one started at its turn)."""
        if self._turn is not None:
            with contextlib.suppress(OSError):  # it ended before its turn (a notebook nbgrader could not read)
                self._turn.send_bytes(b"go")
            self._turn.close()
            self._turn = None

    def finish(self, timeout_s: float | None = None) -> NbgraderResult:
        """``go``, then wait at most ``timeout_s`` seconds for the process to end (its group is killed after)."""
        self.go()
        self._proc.join(timeout_s)
        timed_out = self._proc.exitcode is None
        if timed_out:
            kill_group(self._proc.pid)
            self._proc.kill()  # in case it had not yet made its group
            self._proc.join()
        output = Path(self._output).read_text(errors="replace")
        os.unlink(self._output)
        return NbgraderResult(-9 if timed_out else self._proc.exitcode, output, timed_out)


@dataclass
class Worker:
    """One of ``course grade``'s concurrent grading jobs: the environment of its nbgrader processes (its GPU, the
    libraries' thread counts) and the CPUs its kernels run on (empty: every CPU)."""

    env: dict[str, str] = field(default_factory=dict)
    kernel_cpus: list[int] = field(default_factory=list)


def grading_workers(workers: int, gpus: list[str], cpus: list[int]) -> list[Worker]:
    """``workers`` concurrent grading jobs.

    Each worker gets one GPU (round robin over ``gpus``) and, when there are several workers, an equal, disjoint share
    of ``cpus`` for its kernels, so student code that floods the CPUs slows its own worker only. A kernel's thread
    pools leave one CPU of the share to the worker's next submission getting ready beside it (a pool as wide as the
    share would stall whenever that takes one of its CPUs).
    """
    found = [Worker() for _ in range(workers)]
    share = max(1, len(cpus) // workers) if cpus else 0
    for index, worker in enumerate(found):
        if gpus:
            worker.env["CUDA_VISIBLE_DEVICES"] = gpus[index % len(gpus)]
        if workers > 1 and cpus:
            worker.kernel_cpus = cpus[(index * share) % len(cpus):][:share] or cpus[:share]
        if share:
            worker.env.update(thread_pool_env(max(1, share - 1)))
    return found


def thread_pool_env(threads: int) -> dict[str, str]:
    """The variables that size PyTorch's, OpenMP's and BLAS's thread pools, all set to ``threads``."""
    return {name: str(threads) for name in THREAD_ENVS}


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


@dataclass
class CellScore:
    """One graded cell of one submission."""

    grade_id: str
    max_score: float
    auto_score: float | None
    manual_score: float | None
    needs_manual_grade: bool
    autograded: bool  # a test cell (not a written answer or open-ended code)
    extra_credit: float | None = None
    bonus: bool = False  # a bonus question's cell: max_score is its bonus points, on top of the lab's maximum

    @property
    def score(self) -> float:
        """nbgrader's score: the manual score, else the automatic one (else 0), plus any extra credit."""
        value = self.manual_score if self.manual_score is not None else self.auto_score
        if value is None:
            return 0.0
        return float(value) + float(self.extra_credit or 0.0)


@dataclass
class SubmissionScores:
    """Scores of one student's submission of one lab, as the gradebook has them."""

    student: str
    cells: dict[str, CellScore] = field(default_factory=dict)

    def autograded_score(self) -> float:
        """Points of the autograded cells, bonus included."""
        return sum(c.score for c in self.cells.values() if c.autograded)

    def autograded_short(self) -> list[CellScore]:
        """The autograded cells, bonus ones included, that earned less than their maximum."""
        return [c for c in self.cells.values() if c.autograded and c.score < c.max_score]

    def autograded_max(self) -> float:
        """Maximum of the autograded cells, bonus excluded (bonus points come on top)."""
        return sum(c.max_score for c in self.cells.values() if c.autograded and not c.bonus)

    def total_score(self) -> float:
        """nbgrader's score of the submission: every cell's score, bonus (extra credit) included."""
        return sum(c.score for c in self.cells.values())

    def total_max(self) -> float:
        """nbgrader's maximum of the submission: the core points, bonus excluded (100 for a lab)."""
        return sum(c.max_score for c in self.cells.values() if not c.bonus)

    def bonus_max(self) -> float:
        return sum(c.max_score for c in self.cells.values() if c.bonus)


def db_url_for(course_root: Path) -> str:
    """The gradebook URL nbgrader uses for ``course_root`` (NBGRADER_DB_URL, else SQLite in that folder)."""
    return os.environ.get("NBGRADER_DB_URL") or f"sqlite:///{course_root / 'gradebook.db'}"


def read_scores(course_root: Path, lab: str, students: list[str] | None = None) -> dict[str, SubmissionScores]:
    """Per-cell scores of every submission of ``lab`` in the gradebook (or of the given students).

    Cells are in the order of the course's ``source/<lab>/`` notebook (others last, by name); a bonus cell's maximum
    is its bonus points from that notebook (nbgrader records 0). A few queries whatever the class size: nbgrader's
    ORM objects would load each grade's cell in a query of its own.
    """
    from nbgrader.api import Grade, Gradebook, MissingEntry, SubmittedAssignment, SubmittedNotebook

    with Gradebook(db_url_for(course_root), course_id=COURSE_ID) as gb:
        try:
            assignment = gb.find_assignment(lab)
        except MissingEntry:
            return {}
        cells: dict[str, tuple[str, float, bool]] = {}  # cell id -> grade id, maximum, autograded
        order: dict[str, int] = {}
        for notebook in assignment.notebooks:
            grade_ids, bonus = _source_notebook_facts(course_root / "source" / lab / f"{notebook.name}.ipynb")
            for gid in grade_ids:
                order.setdefault(gid, len(order))
            solution_names = {cell.name for cell in notebook.solution_cells}
            for cell in [*notebook.grade_cells, *notebook.task_cells]:
                cells[cell.id] = (cell.name, bonus.get(cell.name, float(cell.max_score)),
                                  _is_autograded_cell(cell, solution_names))
        submitted = (gb.db.query(SubmittedAssignment.student_id)
                     .filter(SubmittedAssignment.assignment_id == assignment.id))
        result = {student: SubmissionScores(student) for (student,) in submitted
                  if students is None or student in students}
        rows = (gb.db.query(SubmittedAssignment.student_id, Grade.cell_id, Grade.auto_score, Grade.manual_score,
                            Grade.extra_credit, Grade.needs_manual_grade)
                .join(SubmittedNotebook, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
                .filter(SubmittedAssignment.assignment_id == assignment.id))
        for student, cell_id, auto_score, manual_score, extra_credit, needs_manual_grade in rows:
            if student in result:
                name, max_score, autograded = cells[cell_id]
                result[student].cells[name] = CellScore(
                    name, max_score, _number(auto_score), _number(manual_score), bool(needs_manual_grade),
                    autograded, _number(extra_credit), bonus=is_bonus_id(name))
    for sub in result.values():
        sub.cells = dict(sorted(sub.cells.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))
    return result


def _number(value) -> float | None:
    return None if value is None else float(value)


def _source_notebook_facts(path: Path) -> tuple[list[str], dict[str, float]]:
    """The grade ids (in notebook order) and bonus points of an instructor notebook; empty when it is missing."""
    try:
        nb = read_notebook(path)
    except NotebookError:  # missing too
        return [], {}
    return list(cells_by_grade_id(nb)), bonus_points(nb)


def is_autograded_grade(grade) -> bool:
    """Whether a gradebook grade is an autograded test cell's (``_is_autograded_cell``)."""
    cell = grade.cell
    return _is_autograded_cell(cell, {solution.name for solution in cell.notebook.solution_cells})


def _is_autograded_cell(cell, solution_names: set[str]) -> bool:
    """Whether a gradebook grade or task cell is an autograded test: code, and not also a solution cell."""
    return cell.cell_type == "code" and cell.name not in solution_names
