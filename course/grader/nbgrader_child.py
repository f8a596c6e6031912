"""The process that runs nbgrader for ``course grade`` (``course.cli.nbgrader_run``), one per submission, so that one
submission's crash, hang or dead kernel ends that process only.

``python -m course.grader.nbgrader_child --job`` reads one ``GradingJob`` (a line of JSON on stdin), builds nbgrader's
settings from the course's ``nbgrader_config.py`` and the job, runs nbgrader's ``Autograde`` converter and writes one
``GradingResult`` to the job's ``result_file``; a failure is recorded there as it happens, as a TA reads it.
``python -m course.grader.nbgrader_child -- ARGS`` runs the command ``nbgrader ARGS`` in the folder it was started in.
``forked`` does either in a process forked from ``course grade``'s fork server (``course.cli.nbgrader_run``), which
imported nbgrader and the libraries the tests use once; the job then comes as an argument and a multiprocessing
``Connection`` stands in for stdin.

Either way stdin (or that connection) stays open while ``course grade`` lives: a line ``go`` lets a process started
ahead of its turn go on past the notebook's first student cell, and its end (``course grade`` ended, ``kill -9``
included) ends this process's group.
"""
from __future__ import annotations

import copy
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from ..common.grading_result import GradingResult
from ..common.job import GradingJob

MAX_REASON_CHARS = 500
KERNEL_DIED = "the kernel died (os._exit, a segfault or the out-of-memory killer)"
KERNEL_SLOW = "the kernel did not start in time (a busy machine, or a broken environment)"
CELL_TIMEOUT = "nbclient stopped waiting for a cell's output (CellTimeoutError)"
NO_NOTEBOOK = "no notebook named as the release in the submission"
NOT_JSON = "the notebook is not valid JSON"
NO_GRADED_NOTEBOOK = "nbgrader wrote no autograded notebook"


def read_stdin() -> bytes:
    """What stdin holds next (b"" at its end). os.read, not sys.stdin: a daemon thread blocked in a buffered reader
    stops the interpreter's exit."""
    return os.read(0, 4096)


def connection_reader(connection) -> Callable[[], bytes]:
    """A reader like ``read_stdin`` of a multiprocessing ``Connection`` that ``course grade`` writes to."""

    def read() -> bytes:
        try:
            return connection.recv_bytes()
        except (EOFError, OSError):  # course grade closed its end, or ended
            return b""

    return read


class ParentLink:
    """The line from ``course grade`` (stdin, or a connection): the turn, then its end (read by a thread of its own)."""

    def __init__(self, read: Callable[[], bytes] = read_stdin):
        self._read = read
        self._go = threading.Event()
        threading.Thread(target=self._watch, name="course-grade-link", daemon=True).start()

    def _watch(self) -> None:
        pending = b""
        while chunk := self._read():
            pending += chunk
            if b"go\n" in pending:
                self._go.set()
        # course grade closed stdin or ended (kill -9 included): nothing may go on grading behind it.
        self._go.set()
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def __deepcopy__(self, memo) -> ParentLink:
        return self  # traitlets copies settings it applies: the copy must still be this process's one link

    def wait_for_turn(self) -> None:
        """Return once ``course grade`` says go (at once should it have ended: the line's end kills this process)."""
        self._go.wait()


def read_line(fd: int = 0) -> str:
    """One line from ``fd``, read unbuffered (the rest stays for ``ParentLink``)."""
    line = b""
    while not line.endswith(b"\n") and (byte := os.read(fd, 1)):
        line += byte
    return line.decode()


def failure_reason(exc: BaseException) -> tuple[str, bool]:
    """What a TA reads for an exception that stopped nbgrader, and whether a busy machine can explain it (the
    submission is then graded once more): a known cause along the exception's chain, else its own line."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.reader import NotJSONError
    from nbgrader.converters.base import NbGraderException

    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    for link in chain:
        if isinstance(link, DeadKernelError):
            return KERNEL_DIED, False
        if isinstance(link, RuntimeError) and "Kernel didn't respond" in str(link):  # jupyter_client's wait_for_ready
            return KERNEL_SLOW, True
        if isinstance(link, CellTimeoutError):
            return CELL_TIMEOUT, "Timeout waiting for IOPub output" in str(link)
        if isinstance(link, NotJSONError):
            return NOT_JSON, False
        if isinstance(link, NbGraderException) and "No notebooks found" in str(link):
            return NO_NOTEBOOK, False
    return exception_line(chain[0]), any("database is locked" in str(link) for link in chain)


def exception_line(exc: BaseException) -> str:
    """``module.Type: message`` of an exception as one line a TA can read (escaped, cut at ``MAX_REASON_CHARS``)."""
    from ..common.quoting import escape_controls

    kind = type(exc).__qualname__ if type(exc).__module__ == "builtins" else \
        f"{type(exc).__module__}.{type(exc).__qualname__}"
    line = escape_controls(f"{kind}: {exc}" if str(exc) else kind)
    return line if len(line) <= MAX_REASON_CHARS else line[:MAX_REASON_CHARS] + " [...]"


def course_config(job: GradingJob, link: ParentLink | None):
    """nbgrader's settings for ``job``: the course's ``nbgrader_config.py``, run with the job's settings in ``c``
    (the sandbox reads the kernel CPUs there), then the job's settings again on top."""
    from traitlets.config import PyFileConfigLoader

    class CourseConfigLoader(PyFileConfigLoader):
        def clear(self) -> None:  # the file's ``c`` starts from the job's settings, not from nothing
            self.config = copy.deepcopy(job.config())

    config = CourseConfigLoader("nbgrader_config.py", path=str(job.course_root)).load_config()
    config.merge(job.config())
    if job.ahead and link is not None:
        config.GuardedExecute.wait_for_turn = link.wait_for_turn
    return config


def autograde(job: GradingJob, link: ParentLink | None) -> GradingResult:
    """Autograde the job's submission with nbgrader's ``Autograde`` converter; what it came to."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    class RecordingAutograde(Autograde):
        """nbgrader's Autograde, noting the first exception that stops a submission where it is raised."""

        failure: tuple[str, bool] | None = None

        @contextmanager
        def _noting(self):
            try:
                yield
            except BaseException as exc:
                self.failure = self.failure or failure_reason(exc)
                raise

        def init_assignment(self, assignment_id: str, student_id: str) -> None:
            with self._noting():
                super().init_assignment(assignment_id, student_id)

        def convert_single_notebook(self, notebook_filename: str) -> None:
            with self._noting():
                super().convert_single_notebook(notebook_filename)

    failure = None
    converter = None
    try:
        config = course_config(job, link)
        converter = RecordingAutograde(coursedir=CourseDirectory(config=config), config=config)
        converter.force, converter.create_student = True, True
        converter.start()
    except SystemExit as exc:  # nbgrader_config.py refused to load (it says why)
        failure = (str(exc.code), False)
    except Exception as exc:  # noqa: BLE001 - recorded for the TA; course grade goes on with the others
        failure = (converter and converter.failure) or failure_reason(exc)
    notebook = job.autograded_folder() / f"{job.lab}.ipynb"
    result = GradingResult.read(notebook.parent) if failure is None and notebook.exists() else GradingResult()
    result.recorded_notebook_sha256 = ""  # set by course grade once the scores are in the gradebook
    if failure is None and not notebook.exists():
        failure = (NO_GRADED_NOTEBOOK, False)
    if failure is not None:
        result.failure = failure[0]
        result.retry = failure[0] if failure[1] else ""
    return result


def main(argv: list[str], job_line: str | None = None, read: Callable[[], bytes] = read_stdin) -> int:
    """``--job``: grade the job (``job_line``, default: the first line of stdin); ``-- ARGS``: run ``nbgrader ARGS``.
    ``read`` reads the line from ``course grade``. Returns the exit status."""
    if argv[:1] == ["--job"]:
        job = GradingJob.from_json(read_line() if job_line is None else job_line)
        link = ParentLink(read)
        result = autograde(job, link)
        result.save(Path(job.result_file))
        return 1 if result.failure else 0
    if argv[:1] == ["--"]:
        ParentLink(read)
        from nbgrader.apps.nbgraderapp import NbGraderApp

        NbGraderApp.launch_instance(argv=argv[1:])
        return 0
    print("usage: python -m course.grader.nbgrader_child (--job | -- NBGRADER_ARGS)", file=sys.stderr)
    return 2


def forked(argv: list[str], job_line: str | None, cwd: str, env: dict[str, str], output_path: str, link) -> None:
    """``main`` in a process forked from the fork server, set up as ``subprocess`` sets up the process it starts: a
    session of its own, stdout and stderr appended to ``output_path``, ``cwd``, exactly ``env``. ``link`` (the read end
    of a multiprocessing pipe) is its line from ``course grade``. Exits with ``main``'s status."""
    os.setsid()
    output = os.open(output_path, os.O_WRONLY | os.O_APPEND)
    for fd in (1, 2):
        os.dup2(output, fd)
    os.close(output)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS"):  # the server imported torch before this job's size
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.exit(main(argv, job_line, connection_reader(link)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
