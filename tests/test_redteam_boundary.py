"""Red team against the grading boundary in Labs 2 and 3 (issue 14; Lab 1's cases are in test_redteam.py).

Each lab's cases (``tests/redteam/lab2_boundary.py``, ``lab3_boundary.py``) are graded as one class next to the
reference solution: every attack earns nothing on the question it aims at (zero where the grader finds tampering,
exactly what its wrong answer earns alone where the boundary makes it harmless unseen) and full marks elsewhere. The
expected scores are read from the lab's instructor notebook (``boundary_cases.case_expected``).
"""
from __future__ import annotations

import importlib

import pytest
from boundary_cases import case_expected

from course.cli.grade import grade_lab
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import make_submission, read_notebook, write_notebook
from course.common.paths import REPO_ROOT

LABS = ["lab2", "lab3"]


def lab_cases(lab: str) -> list:
    try:
        return importlib.import_module(f"{lab}_boundary").CASES
    except ModuleNotFoundError:
        return []


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
    return lab, source, cases, scores


def test_each_attack_earns_nothing_where_it_aims_and_full_marks_elsewhere(graded):
    lab, source, cases, scores = graded
    problems = []
    for case in cases:
        expected = case_expected(source, case)
        cells = scores[case.student].cells if case.student in scores else {}
        got = {gid: cells[gid].score if gid in cells else None for gid in expected}
        wrong = {gid: (got[gid], expected[gid]) for gid in expected if got[gid] != expected[gid]}
        if wrong:
            problems.append(f"{lab} {case.student} ({case.what}): (got, expected) per test cell: {wrong}")
    assert not problems, "\n".join(problems)
