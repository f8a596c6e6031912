"""``python -m course.grading_worker PARENT_PID``: a process that imports nbgrader and the grader's libraries once,
then runs each nbgrader command it is sent in a fresh process forked from itself.

A forked process is what ``python -m course.nbgrader_child`` would be (its own session, its own output file, ending
when nbgrader does), without paying for the imports again: a crash, a hang or a time limit still costs one
submission only, and the process ends as a fresh one does (its exit handlers run: its kernels' folders go). Nothing
that a fork cannot carry happens here before a fork: no thread, no CUDA call, no socket, no torch operation, no
instructor file imported (each process imports the lab's ``utils`` itself), and no module of the course: each
process imports those itself, so a secret one makes at import (``nbgrader_ext``'s partial-credit token) is its own.

Protocol, one JSON object per line: the worker reads ``{"args": [...], "output": PATH}`` on stdin and answers
``{"pid": PID}`` when the process started, then ``{"status": CODE}`` when it ended (minus the signal that ended it).
``course.nbgrader_run.NbgraderWorker`` is its client.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys

from .nbgrader_child import skip_slow_optional_imports
from .processes import die_with_parent

# What every autograde process imports: nbgrader's stack and what the grader's test runs import
# (``course.boundary.warm_imports``). No module here starts a thread or touches a GPU when imported.
PRELOAD = (
    "nbformat", "nbclient", "jupyter_client", "nbconvert", "sqlalchemy", "sqlalchemy.dialects.sqlite", "alembic",
    "nbgrader.apps.nbgraderapp", "nbgrader.preprocessors", "nbgrader.api", "nbgrader.converters", "IPython",
    "numpy", "torch", "torch.testing", "torch.nn.functional", "sympy", "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor", "transformers.models.gemma3.configuration_gemma3", "matplotlib.pyplot",
)


# While the worker imports, a library that asks whether CUDA is there is answered by NVML, without the CUDA driver
# (a driver started before a fork does not work in the forked process); the forked processes run without it.
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def preload() -> None:
    """Import ``PRELOAD``; a module that is missing or fails is left to the process that needs it."""
    skip_slow_optional_imports()
    own = os.environ.get(NVML_CHECK_ENV)
    os.environ[NVML_CHECK_ENV] = "1"
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if own is None:
        os.environ.pop(NVML_CHECK_ENV)
    else:
        os.environ[NVML_CHECK_ENV] = own


def run_child(args: list[str], output: str) -> int:
    """In the forked process: nbgrader ``args``, its output to ``output``; its exit status."""
    code = 1
    try:
        os.setsid()
        die_with_parent(os.getppid())
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        from nbgrader.apps.nbgraderapp import main as nbgrader_main

        sys.argv = ["nbgrader", *args]
        nbgrader_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:  # noqa: BLE001 - reported in the output, as a fresh process would
        import traceback

        traceback.print_exc()
    return code


def serve(requests, answers) -> int | None:
    """Answer every request of ``requests`` (lines) on ``answers``, one at a time. In a forked process: the exit
    status of its nbgrader command (it leaves the loop and ends as a fresh process would)."""
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            return run_child([str(a) for a in request["args"]], request["output"])
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        answers.write(json.dumps({"status": code}) + "\n")
        answers.flush()
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m course.grading_worker PARENT_PID", file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    preload()
    return serve(sys.stdin, sys.stdout) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
