"""Red team against the grading boundary in Labs 2 and 3 (issue 14; Lab 1's cases are in test_redteam.py).

Each lab's cases (``tests/redteam/lab2_boundary.py``, ``lab3_boundary.py``) are graded as one class next to the
reference solution: every case scores exactly zero on the questions it attacks and full marks on the rest.
"""
from __future__ import annotations

import importlib

import pytest

from course.grade import grade_lab
from course.nbgrader_run import make_course_dir
from course.notebooks import cell_points, grade_id, is_autograded_test, make_submission, read_notebook, write_notebook
from course.paths import REPO_ROOT

LABS = ["lab2", "lab3"]


def lab_cases(lab: str) -> list:
    try:
        return importlib.import_module(f"{lab}_boundary").CASES
    except ModuleNotFoundError:
        return []


def autograded_points(lab: str) -> dict[str, float]:
    source = read_notebook(REPO_ROOT / "source" / lab / f"{lab}.ipynb")
    return {grade_id(c): cell_points(c) for c in source.cells if is_autograded_test(c)}


@pytest.fixture(scope="module", params=LABS)
def graded(request, tmp_path_factory):
    lab = request.param
    cases = lab_cases(lab)
    if not cases:
        pytest.skip(f"{lab} has no boundary red-team cases")
    source = read_notebook(REPO_ROOT / "source" / lab / f"{lab}.ipynb")
    reference = make_submission(read_notebook(REPO_ROOT / "release" / lab / f"{lab}.ipynb"), source)
    course = make_course_dir(tmp_path_factory.mktemp(f"boundary-{lab}") / "course", [lab], REPO_ROOT)
    for case in cases:
        write_notebook(case.build(reference), course / "submitted" / case.student / lab / f"{lab}.ipynb")
    _, scores = grade_lab(course, lab, progress=False, workers=2)
    return lab, cases, scores


@pytest.mark.xfail(strict=False, reason="partial credit (issue 36): some attacks now keep the weight of the checks they do not touch; the expected scores await review against the new rule (see the closing note of 2026-11-25)")
def test_each_attack_scores_zero_where_it_aims_and_full_marks_elsewhere(graded):
    lab, cases, scores = graded
    points = autograded_points(lab)
    for case in cases:
        cells = scores[case.student].cells if case.student in scores else {}
        got = {gid: cells[gid].score if gid in cells else None for gid in points}
        expected = {gid: 0.0 if gid in case.zero else value for gid, value in points.items()}
        wrong = {gid: (got[gid], expected[gid]) for gid in points if got[gid] != expected[gid]}
        assert not wrong, f"{lab} {case.student} ({case.what}): (got, expected) per test cell: {wrong}"
