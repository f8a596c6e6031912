"""``python -m course.nbgrader_child PARENT_PID ARGS``: ``nbgrader ARGS``, as ``course grade`` runs it.

Two differences from a plain ``nbgrader`` command, neither of which changes what nbgrader does:

- The process ends when ``PARENT_PID`` (the ``course grade`` process) does, ``kill -9`` included
  (``course.processes.die_with_parent``): no grading goes on behind a killed run.
- ``rfc3987_syntax`` is marked absent before anything imports ``jsonschema``. That optional package compiles
  Lark grammars at import, seconds of CPU in every process that reads a notebook; it only checks the
  JSON-schema formats ``iri`` and ``iri-reference``, which neither the notebook format nor nbgrader uses, and
  ``jsonschema`` skips those two checkers wherever the package is not installed
  (``scripts/bench_autograde_cpu.py`` measures the import with and without it).
"""
from __future__ import annotations

import sys

from .processes import die_with_parent

SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)


def skip_slow_optional_imports() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, unless it is already imported."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)


def main(argv: list[str]) -> int:
    if len(argv) < 1 or not argv[0].isdigit():
        print("usage: python -m course.nbgrader_child PARENT_PID NBGRADER_ARGS", file=sys.stderr)
        return 2
    die_with_parent(int(argv[0]))
    skip_slow_optional_imports()
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv = ["nbgrader", *argv[1:]]
    nbgrader_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
