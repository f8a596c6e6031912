"""``python -m course.nbgrader_child PARENT_PID [--kernel-cpus LIST] (--serve | ARGS)``: ``nbgrader ARGS``, as
``course grade`` runs it.

It differs from a plain ``nbgrader`` command in ways that do not change what nbgrader does: it ends when
``PARENT_PID`` does (``course.processes.die_with_parent``); ``rfc3987_syntax`` is marked absent before ``jsonschema``
is imported (it compiles grammars at import, for the ``iri`` formats no notebook schema uses; ``jsonschema`` skips
those checks without it); it skips the interpreter's teardown (``exit_now``). ``--kernel-cpus 0,1`` are the CPUs its
kernels run on (``course.sandbox.kernel_cpus``: a worker's share).

With ``--serve`` it runs one nbgrader command after another, each as a fresh nbgrader application, in one process
that imports nbgrader, and the grader's copies of the lab's libraries, once (``serve``): a ``course grade`` worker
keeps two, one grading a submission while the other gets its next one ready (``course.nbgrader_run.GradingServer``).
"""
from __future__ import annotations

import atexit
import json
import os
import sys
import traceback

from .processes import die_with_parent


def skip_slow_optional_imports() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, unless it is already imported."""
    sys.modules.setdefault("rfc3987_syntax", None)


_waiting = False  # a served command whose turn has not come yet


def waiting() -> bool:
    """Whether this process runs a served command whose turn has not come yet."""
    return _waiting


def wait_for_turn() -> None:
    """Return when this command's turn has come: at once unless it is a served one, and at once after the first
    call. The turn is a line on standard input; its end (``course grade`` stopped) ends this process."""
    global _waiting
    if _waiting:
        _waiting = False
        if not sys.stdin.buffer.readline():
            exit_now(1)


def run_command(args: list[str]) -> int:
    """``nbgrader ARGS`` in this process, as a fresh application (no instance left from an earlier command); its
    exit status."""
    from nbgrader.apps.nbgraderapp import NbGraderApp
    from traitlets.config import SingletonConfigurable

    classes = [SingletonConfigurable]
    while classes:  # the application and its subcommand's are singletons: an earlier command's would be reused
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        cls._instance = None
    try:
        NbGraderApp.launch_instance(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return 0


def serve() -> int:
    """Run the commands read from standard input, one JSON line each: ``{"args": [...], "output": PATH}``. Each
    command's output (this process's and its kernels' standard output and error) goes to its file; it waits for its
    turn (``wait_for_turn``) before the notebook's first student cell, or at its end; its exit status then goes to
    standard output, one line. Ends at the end of standard input."""
    global _waiting
    status = os.fdopen(os.dup(1), "w")  # not inherited by the kernels, which write to the command's file
    os.dup2(2, 1)  # until the first command: where the process's own errors go
    while line := sys.stdin.buffer.readline():
        job = json.loads(line)
        output = os.open(job["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        _waiting = True
        try:
            code = run_command(job["args"])
        except Exception:  # noqa: BLE001 - this command failed; the next one gets a fresh application
            traceback.print_exc()
            code = 1
        wait_for_turn()  # a command that ended before its first student cell still ends at its turn
        sys.stdout.flush()
        sys.stderr.flush()
        status.write(f"{code}\n")
        status.flush()
    return 0


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: python -m course.nbgrader_child PARENT_PID [--kernel-cpus LIST] (--serve | NBGRADER_ARGS)",
              file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    from course import nbgrader_child, sandbox  # the modules GuardedExecute and the config import (this is __main__)

    args = argv[1:]
    if args[:1] == ["--kernel-cpus"]:
        sandbox.kernel_cpus, args = [int(cpu) for cpu in args[1].split(",")], args[2:]
    skip_slow_optional_imports()
    return nbgrader_child.serve() if args == ["--serve"] else nbgrader_child.run_command(args)


def exit_now(status: int) -> None:
    """Exit with ``status`` once the exit handlers ran, without the interpreter's teardown: with torch and
    transformers imported it takes seconds and has nothing left to save."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main(sys.argv[1:]))
