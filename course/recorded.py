"""Which autograded submissions a run of ``course grade`` finished: the mark ``--resume`` trusts.

A killed run leaves notebooks that look graded, so a submission is marked only once its scores are in the
gradebook: the SHA-256 of its autograded notebook, in its ``grading_report.json``. Any later change to the notebook
drops the mark, and a mark copied from elsewhere does not match.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .grading_record import GRADING_REPORT

MARK = "recorded_notebook_sha256"


def _digest(notebook: Path) -> str:
    return hashlib.sha256(notebook.read_bytes()).hexdigest()


def read_report(path: Path) -> dict:
    """The JSON object in ``path`` (a ``grading_report.json``); {} when it cannot be read or is not an object."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}


def mark_recorded(folder: Path, notebook: str) -> None:
    """Mark the submission in ``folder`` (``autograded/<student>/<lab>/``, with the notebook file ``notebook``) as
    finished; OSError when the notebook cannot be read or the report written."""
    report = read_report(folder / GRADING_REPORT)
    report[MARK] = _digest(folder / notebook)
    partial = folder / f".{GRADING_REPORT}.partial"
    partial.write_text(json.dumps(report, indent=1))
    os.replace(partial, folder / GRADING_REPORT)  # a reader sees the old report or the new one, never half


def is_recorded(folder: Path, notebook: str) -> bool:
    """Whether ``folder`` holds a submission whose grading a run finished, with the notebook that run wrote."""
    try:
        return read_report(folder / GRADING_REPORT).get(MARK) == _digest(folder / notebook)
    except OSError:
        return False
