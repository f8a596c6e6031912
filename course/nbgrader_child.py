"""``python -m course.nbgrader_child PARENT_PID [--kernel-cpus LIST] [--turn-fd FD] ARGS``: ``nbgrader ARGS``, as
``course grade`` runs it, doing what nbgrader does. It ends when ``PARENT_PID`` does; its kernels run on the CPUs of
``--kernel-cpus 0,1`` (``course.sandbox.kernel_cpus``); started ahead of its turn, ``GuardedExecute`` waits before
the notebook's first student cell until ``course grade`` writes to the pipe ``--turn-fd`` (``wait_for_turn``).
"""
from __future__ import annotations

import atexit
import os
import sys

from .processes import die_with_parent


def skip_slow_optional_imports() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, unless it is already imported: it compiles
    grammars at import for ``jsonschema``'s ``iri`` formats, which no notebook schema uses."""
    sys.modules.setdefault("rfc3987_syntax", None)


_turn_fd: int | None = None  # the pipe that says this process's turn has come (None: it started at its turn)


def waiting() -> bool:
    """Whether this process was started ahead and its turn has not come yet."""
    return _turn_fd is not None


def wait_for_turn() -> None:
    """Return when this process's turn has come (at once unless it was started ahead and this is the first call)."""
    global _turn_fd
    fd, _turn_fd = _turn_fd, None
    if fd is not None:
        os.read(fd, 1)  # a byte, or end of file should course grade stop (it then ends this process)
        os.close(fd)


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: python -m course.nbgrader_child PARENT_PID [--kernel-cpus LIST] [--turn-fd FD] NBGRADER_ARGS",
              file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    from course import nbgrader_child, sandbox  # the modules GuardedExecute and the config import (this is __main__)

    if argv[1:2] == ["--kernel-cpus"]:
        sandbox.kernel_cpus, argv = [int(cpu) for cpu in argv[2].split(",")], [argv[0], *argv[3:]]
    if argv[1:2] == ["--turn-fd"]:
        nbgrader_child._turn_fd, argv = int(argv[2]), [argv[0], *argv[3:]]
    skip_slow_optional_imports()
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv = ["nbgrader", *argv[1:]]
    try:
        nbgrader_main()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


def exit_now(status: int) -> None:
    """Exit with ``status`` once the exit handlers ran, skipping the interpreter's slow teardown (nothing to save)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
