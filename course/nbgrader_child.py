"""The body of each nbgrader process ``course grade`` runs (``course.nbgrader_run.NbgraderProcess``): ``nbgrader
ARGS`` in a process of its own, forked from a server that has imported nbgrader and the lab's libraries once
(``multiprocessing``'s forkserver), so that one submission's crash, hang or dead kernel ends that process only.

Started ahead of its turn, ``GuardedExecute`` waits before the notebook's first student cell until ``course grade``
says go (``wait_for_turn``).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from multiprocessing import forkserver

from .processes import die_with_parent

# rfc3987_syntax compiles grammars at import for jsonschema's ``iri`` formats, which no notebook schema uses: a
# process that runs nbgrader marks it absent before anything imports nbformat (this module is imported first).
sys.modules.setdefault("rfc3987_syntax", None)

_turn = None  # the Connection that says this process's turn has come (None: it started at its turn)


def waiting() -> bool:
    """Whether this process was started ahead and its turn has not come yet."""
    return _turn is not None


def wait_for_turn() -> None:
    """Return when this process's turn has come (at once unless it was started ahead and this is the first call)."""
    global _turn
    turn, _turn = _turn, None
    if turn is not None:
        with contextlib.suppress(EOFError, OSError):  # a message, or end of file should course grade stop
            turn.recv_bytes()
        turn.close()


def run(args: list[str], cwd: str, env: dict[str, str], output_path: str, kernel_cpus: list[int], turn) -> None:
    """Run ``nbgrader ARGS`` in ``cwd`` with exactly ``env``, its output (stdout and stderr) into ``output_path``, its
    kernels on ``kernel_cpus`` (``course.sandbox.kernel_cpus``; empty: every CPU), waiting for ``turn`` (a
    ``multiprocessing`` Connection, or None) before the first student cell; then exit with nbgrader's status.

    The process leads a session of its own (a time limit kills it with its kernels) and is SIGKILLed when its parent,
    the fork server, ends: that server ends with the process that started it (``kill -9`` included).
    """
    os.setsid()
    # The fork server outlives the process that started it while one of its children holds this "alive" pipe: let
    # go of it, so that the server ends with course grade, and this process with the server.
    os.close(forkserver._forkserver._forkserver_alive_fd)
    die_with_parent(os.getppid())
    gc.freeze()  # what the server imported stays out of the garbage collector's walk
    with open(output_path, "ab", buffering=0) as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]  # as `python` started in cwd
    global _turn
    from . import sandbox

    sandbox.kernel_cpus, _turn = list(kernel_cpus), turn
    from nbgrader.apps.nbgraderapp import main

    sys.argv = ["nbgrader", *args]
    try:
        main()
        status = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    exit_now(status)


def exit_now(status: int) -> None:
    """Exit with ``status`` once the exit handlers ran, skipping the interpreter's slow teardown (nothing to save)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
