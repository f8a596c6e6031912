"""The LMS in and out: the file-name patterns ``nbgrader zip_collect`` uses to find each downloaded submission's
student (``c.FileNameCollectorPlugin.named_regexp``, matched against the absolute path; README.md), and final grades
in Canvas's gradebook import format (``grading/LAB/canvas.csv``, written by ``course grade LAB --report``).

Only Canvas's pattern is tested against its documented names: check another against your LMS's zip with
``nbgrader zip_collect LAB --debug`` before grading.
"""
from __future__ import annotations

import csv
from pathlib import Path

# Canvas: doejane_12345_6789012_lab1.ipynb (sortable name lower-cased, Canvas user id, file id, the file's name),
# doejane_LATE_12345_6789012_lab1.ipynb when late, ..._lab1-1.ipynb for a renamed re-upload. The student id is
# the name part; two students with the same name collide: use (?P<student_id>\d+) on the user id instead.
CANVAS = r".*/(?P<student_id>[^/_]+)_(?:LATE_)?\d+_\d+_(?P<file_id>[^/]+?)(?:-\d+)?\.ipynb$"
# Moodle: "Jane Doe_123456_assignsubmission_file_lab1.ipynb", or a folder "Jane Doe_123456_assignsubmission_file_/"
# holding lab1.ipynb when downloaded in folders. The student id is the full name (spaces included).
MOODLE = r".*/(?P<student_id>[^/_]+)_\d+_assignsubmission_file_/?(?P<file_id>[^/]+)\.ipynb$"
# Blackboard Learn: "Lab 1_jdoe_attempt_2025-03-01-23-59-59_lab1.ipynb" (assignment, user name, attempt time, file).
# The attempt time is left out: nbgrader's date parser misreads that form.
BLACKBOARD = r".*/[^/]*_(?P<student_id>[^/_]+)_attempt_[\d-]+_(?P<file_id>[^/]+)\.ipynb$"
ZIP_COLLECT_PATTERNS = {"canvas": CANVAS, "moodle": MOODLE, "blackboard": BLACKBOARD}

CANVAS_FIELDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "    Points Possible"  # the second row of Canvas's own gradebook export, as it writes it


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """nbgrader student id -> Canvas fields, from a CSV roster with a ``student_id`` column (the student's
    ``submitted/`` folder) and any of ``CANVAS_FIELDS`` (Canvas's gradebook export with that column added); other
    columns are ignored. ValueError when there is no ``student_id`` column."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if "student_id" not in (reader.fieldnames or []):
            raise ValueError(f"{path}: a roster needs a student_id column (and any of {', '.join(CANVAS_FIELDS)})")
        return {row["student_id"].strip(): {f: (row.get(f) or "").strip() for f in CANVAS_FIELDS}
                for row in reader if (row.get("student_id") or "").strip()}


def write_canvas_csv(path: Path, lab: str, final_scores: dict[str, float], points_possible: float,
                     roster: dict[str, dict[str, str]] | None = None, assignment_id: str | None = None) -> None:
    """Write Canvas's gradebook import CSV: a header, the Points Possible row, one row per student.

    Args:
        final_scores: student id -> the points to upload (late penalty already taken off).
        points_possible: the assignment's maximum (bonus points come on top, as in Canvas's extra credit).
        roster: student id -> Canvas fields (``read_roster``); without an entry, the id is ``Student`` and
            ``SIS Login ID``.
        assignment_id: Canvas's id of the assignment (column ``Lab 1 (123456)``); without it the column is
            ``Lab 1`` and Canvas offers to create a new assignment.
    """
    title = f"Lab {lab[3:]}" if lab.startswith("lab") else lab
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([*CANVAS_FIELDS, f"{title} ({assignment_id})" if assignment_id else title])
        writer.writerow([POINTS_POSSIBLE, "", "", "", "", f"{points_possible:g}"])
        for student in sorted(final_scores):
            fields = (roster or {}).get(student) or {"Student": student, "SIS Login ID": student}
            writer.writerow([fields.get(name, "") for name in CANVAS_FIELDS] + [f"{final_scores[student]:g}"])
