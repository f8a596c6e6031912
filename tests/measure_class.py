"""A graded class for ``course measure`` without running autograde: autograded notebooks (the instructor's notebook
with some cells replaced by a variant's) and a gradebook holding the scores autograde would have recorded.

Used by tests/test_measure.py (a tiny Triton lab on the CPU) and scripts/gpu/measure_class.py (the real labs on a
GPU, with prepared variants).
"""
from __future__ import annotations

from pathlib import Path

from course.common.notebooks import (
    cells_by_grade_id,
    is_graded,
    is_solution,
    nbgrader_meta,
    read_notebook,
    write_notebook,
)
from course.common.paths import COURSE_ID, course_directory


def write_graded_class(course_root: Path, lab: str, answers: dict[str, dict[str, str]],
                       short: dict[str, list[str]] | None = None) -> None:
    """Record ``lab`` and its submissions in the course's gradebook as if autograded.

    Args:
        course_root: a course folder holding ``source/<lab>/<lab>.ipynb`` and ``nbgrader_config.py``.
        lab: the lab.
        answers: student -> {grade id: source} of the cells replaced in their notebook (others: the solution).
        short: student -> grade ids of the test cells that earned zero (others earned full marks).
    """
    from nbgrader.api import Gradebook

    def points(cell) -> float:  # nbgrader's maximum (a bonus cell's is 0: its points are extra credit)
        return float(nbgrader_meta(cell).get("points", 0) or 0)

    source = read_notebook(course_root / "source" / lab / f"{lab}.ipynb")
    graded = [(gid, cell) for gid, cell in cells_by_grade_id(source).items() if is_graded(cell) or is_solution(cell)]
    with Gradebook(course_directory(course_root).db_url, course_id=COURSE_ID) as gb:
        gb.update_or_create_assignment(lab)
        gb.update_or_create_notebook(lab, lab)
        for gid, cell in graded:
            if is_graded(cell):
                gb.update_or_create_grade_cell(gid, lab, lab, max_score=points(cell), cell_type=cell.cell_type)
            if is_solution(cell):
                gb.update_or_create_solution_cell(gid, lab, lab)
        for student, replaced in answers.items():
            gb.update_or_create_student(student)
            gb.add_submission(lab, student)
            for gid, cell in graded:
                if is_graded(cell) and cell.cell_type == "code" and not is_solution(cell):
                    grade = gb.find_grade(gid, lab, lab, student)
                    grade.auto_score = 0.0 if gid in (short or {}).get(student, []) else points(cell)
            gb.db.commit()
            notebook = read_notebook(course_root / "source" / lab / f"{lab}.ipynb")
            for gid, cell in cells_by_grade_id(notebook).items():
                if gid in replaced:
                    cell.source = replaced[gid]
            write_notebook(notebook, course_root / "autograded" / student / lab / f"{lab}.ipynb")
