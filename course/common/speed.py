"""The speed pieces of ``course grade``, each switchable for an A/B (``scripts/grading_ab.py``), read here only.

``EFFICIENT_AI_GRADING_SPEED`` lists pieces to switch off, comma separated (``ahead=off``); unset,
every piece is on. Each piece kept has its own measurement in ``reports/grading-time-cpu-2core.md``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

SPEED_ENV = "EFFICIENT_AI_GRADING_SPEED"


@dataclass(frozen=True)
class SpeedPieces:
    """Which speed pieces are on.

    Attributes:
        ahead: each worker starts its next submission's grading process while it grades one; that process gets ready
            (imports, kernel, locked setup cells) and waits before the notebook's first student cell.
        fork_server: each nbgrader process is forked from a multiprocessing fork server that imported nbgrader and
            torch once (``course.grader.preload``), instead of a new Python that imports them again.
    """

    ahead: bool = True
    fork_server: bool = True


def speed_pieces(text: str | None = None) -> SpeedPieces:
    """The pieces ``text`` (default: ``EFFICIENT_AI_GRADING_SPEED``) leaves on.

    Raises:
        SystemExit: an entry that is not ``piece=on`` or ``piece=off`` for a known piece.
    """
    text = os.environ.get(SPEED_ENV, "") if text is None else text
    known = {piece.name for piece in fields(SpeedPieces)}
    chosen = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = entry.partition("=")
        if name not in known or value not in ("on", "off"):
            raise SystemExit(f"{SPEED_ENV}: {entry!r} is not piece=on|off for a piece among {', '.join(sorted(known))}")
        chosen[name] = value == "on"
    return SpeedPieces(**chosen)

