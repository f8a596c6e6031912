"""demo: build a lab, grade a demo class in ``demo/`` (its own SQLite gradebook) and print the table; non-zero
unless each of ``demo-reference`` (the reference solution), ``demo-blank`` (the release) and ``demo-partial`` (every
other autograded question answered) earns exactly the score expected of it.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..common.notebooks import (
    autograded_points_by_question,
    grade_id,
    is_solution,
    make_submission,
    question_key,
    question_sort_key,
    read_notebook,
    write_notebook,
)
from ..common.paths import REPO_ROOT, release_notebook_path, source_notebook_path
from ..common.scores import SubmissionScores
from . import build
from .grade import grade_lab
from .nbgrader_run import make_course_dir
from .report import print_table


def partial_answer_ids(source_nb) -> tuple[set[str], set[str]]:
    """Solution cells the partial submission answers (those of every other autograded question in lab order: 1st,
    3rd, ...), and the autograded questions that leaves answered."""
    questions = sorted(autograded_points_by_question(source_nb), key=question_sort_key)
    answered_questions = set(questions[::2])
    answered_cells = {gid for cell in source_nb.cells
                      if is_solution(cell) and (gid := grade_id(cell)) and question_key(gid) in answered_questions}
    return answered_cells, answered_questions


def demo_class(lab: str, root: Path, course: Path) -> dict[str, float]:
    """Write the demo submissions into ``course/submitted``; return each student's expected autograded score."""
    source_nb = read_notebook(source_notebook_path(root, lab))
    release_nb = read_notebook(release_notebook_path(root, lab))
    points = autograded_points_by_question(source_nb)
    answered_cells, answered_questions = partial_answer_ids(source_nb)
    submissions = {
        "demo-reference": (make_submission(release_nb, source_nb), sum(points.values())),
        "demo-blank": (release_nb, 0.0),
        "demo-partial": (make_submission(release_nb, source_nb, answered_cells),
                         sum(points[q] for q in answered_questions)),
    }
    for student, (nb, _) in submissions.items():
        write_notebook(nb, course / "submitted" / student / lab / f"{lab}.ipynb")
    return {student: expected for student, (_, expected) in submissions.items()}


def mismatches(expected: dict[str, float], scores: dict[str, SubmissionScores]) -> list[str]:
    got = {student: scores[student].autograded_score() if student in scores else None for student in expected}
    return [f"{student}: expected {want:g} autograded points, got {got[student]}"
            for student, want in expected.items() if got[student] != want]


def main(lab: str = "lab1", root: Path = REPO_ROOT, course: Path | None = None) -> int:
    course = course or root / "demo"
    where = course.relative_to(root) if course.is_relative_to(root) else course
    print(f"1/3 build {lab}")
    if build.main([lab], root) != 0:
        return 1
    print(f"2/3 demo class in {where}/ (reference, blank, partial)")
    if course.exists():
        shutil.rmtree(course)
    make_course_dir(course, [lab], root)
    expected = demo_class(lab, root, course)
    print(f"3/3 autograde into the SQLite gradebook {course.name}/gradebook.db")
    outcomes, scores = grade_lab(course, lab, sorted(expected), out_dir=course / "grading" / lab)
    print()
    print_table(lab, outcomes, scores)
    print(f"\ngrades.csv and scores.png are in {course / 'grading' / lab}")
    problems = mismatches(expected, scores)
    for problem in problems:
        print(f"UNEXPECTED: {problem}")
    if problems:
        return 1
    print("demo: every submission earned exactly the autograded points expected of it.")
    print("\nNext steps with the demo class:\n"
          f"  (cd {where} && jupyter lab)   # then Nbgrader > Formgrader: grade the written answers of {lab}\n"
          f"  python -m course feedback {lab} --course-dir {where}   # feedback/<student>/{lab}/{lab}.html")
    return 0
