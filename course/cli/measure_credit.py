"""Optional extra credit for a measured piece that beats the reference solution (``c.Measure.extra_credit_points``,
off by default), recorded as nbgrader extra credit so that ``course grade --report``, the formgrader and every export
show it.

A piece earns ``points`` when every shape of it was measured correct and timed (status ``ok``), the reference's too,
and the geometric mean over its shapes of (the student's ``grader_ms_per_call`` / the reference's, both on the same GPU
in the same run) is at most ``ratio``. That time is the measuring process's own clock around the timing request: the
CUDA-event times come from inside the student's kernel, which could report anything, and nothing in the student's
kernel decides a score (DESIGN.md section 3). The points go to the ``extra_credit`` of the piece's first test cell
(``credit_cell`` in the results; lint keeps it off bonus cells, whose extra credit holds their bonus points). Each run
sets that value for every student it considered (points, or none), so re-running never stacks and a kernel that is
now wrong or unmeasured loses what an earlier run gave it. A shard (``--shard``) awards its own students against the
reference it measured itself.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..common.measure_spec import REFERENCE

CLOCK = "grader_ms_per_call"  # the row's time that decides credit (see above)


def time_ratios(results: dict) -> dict[str, dict[str, float | None]]:
    """student -> piece -> geometric mean over the piece's shapes of student / reference ``CLOCK``; None unless every
    shape of the piece is ``ok`` for both (the reference excluded; every student of ``results`` included)."""
    reference = {(r["piece"], r["label"]): r for r in results["rows"] if r["student"] == REFERENCE}
    rows: dict[str, dict[str, list[dict]]] = {s: {} for s in results["not_measured"]}
    for row in results["rows"]:
        if row["student"] != REFERENCE:
            rows.setdefault(row["student"], {}).setdefault(row["piece"], []).append(row)
    ratios: dict[str, dict[str, float | None]] = {}
    for student, pieces in rows.items():
        ratios[student] = {}
        for piece in results["pieces"]:
            mine = pieces.get(piece, [])
            wanted = [key for key in reference if key[0] == piece]
            pairs = [(row, reference.get((piece, row["label"]))) for row in mine]
            complete = len(mine) == len(wanted) > 0 and all(
                ref and row["status"] == ref["status"] == "ok" and row.get(CLOCK) and ref.get(CLOCK) for row, ref in pairs)
            ratios[student][piece] = (math.exp(sum(math.log(row[CLOCK] / ref[CLOCK]) for row, ref in pairs) / len(pairs))
                                      if complete else None)
    return ratios


def awards(results: dict, points: float, ratio: float) -> dict[str, dict[str, float]]:
    """student -> piece -> extra credit earned (``points`` or 0) by the rule above; empty when ``points`` is 0."""
    if points <= 0:
        return {}
    return {student: {piece: points if value is not None and value <= ratio else 0.0 for piece, value in by_piece.items()}
            for student, by_piece in time_ratios(results).items()}


def record(course_root: Path, lab: str, results: dict, earned: dict[str, dict[str, float]]) -> list[str]:
    """Set the ``extra_credit`` of each piece's credit cell for every student in ``earned`` (the sum over pieces
    sharing a cell; None for nothing, as nbgrader writes no extra credit). Returns notes on what could not be set."""
    from nbgrader.api import Gradebook, MissingEntry

    from ..common.paths import COURSE_ID, course_directory

    notes = []
    with Gradebook(course_directory(course_root).db_url, course_id=COURSE_ID) as gb:
        for student, by_piece in sorted(earned.items()):
            by_cell: dict[str, float] = {}
            for piece, value in by_piece.items():
                cell = results["pieces"][piece]["credit_cell"]
                by_cell[cell] = by_cell.get(cell, 0.0) + value
            for cell, value in by_cell.items():
                try:
                    grade = gb.find_grade(cell, lab, lab, student)
                except MissingEntry:
                    notes.append(f"{student}: no grade of {cell} in the gradebook: no extra credit recorded")
                    continue
                grade.extra_credit = value or None
        gb.db.commit()
    return notes
