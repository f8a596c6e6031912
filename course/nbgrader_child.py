"""``python -m course.nbgrader_child PARENT_PID ARGS``: ``nbgrader ARGS``, as ``course grade`` runs it.

It differs from a plain ``nbgrader`` command in two ways, neither of which changes what nbgrader does: it ends when
``PARENT_PID`` does (``course.processes.die_with_parent``), and ``rfc3987_syntax`` is marked absent before
``jsonschema`` is imported (it compiles grammars at import, for the ``iri`` formats no notebook schema uses;
``jsonschema`` skips those checks without it).
"""
from __future__ import annotations

import sys

from .processes import die_with_parent


def skip_slow_optional_imports() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, unless it is already imported."""
    sys.modules.setdefault("rfc3987_syntax", None)


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
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
