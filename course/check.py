"""check: the instructor's pre-release gate for a lab: ``lint`` passes, the reference solution (the release answered
from the source) earns every autograded point, the blank release earns zero; prints the per-question table.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from .grade import grade_lab
from .lint import Problem, lint_lab
from .nbgrader_run import SubmissionScores, make_course_dir
from .notebooks import make_submission, question_label, question_sort_key, read_notebook, write_notebook
from .outcome import Outcome
from .paths import REPO_ROOT, release_notebook_path, source_notebook_path
from .report import question_scores

REFERENCE, BLANK = "reference", "blank"


def grade_reference_and_blank(lab: str, root: Path, workdir: Path) -> tuple[dict[str, Outcome], dict[str, SubmissionScores]]:
    """Autograde the reference solution and the blank release of ``lab`` in a scratch course ``workdir``."""
    course = make_course_dir(workdir, [lab], root)
    source_nb = read_notebook(source_notebook_path(root, lab))
    release_nb = read_notebook(release_notebook_path(root, lab))
    write_notebook(make_submission(release_nb, source_nb), course / "submitted" / REFERENCE / lab / f"{lab}.ipynb")
    write_notebook(release_nb, course / "submitted" / BLANK / lab / f"{lab}.ipynb")
    return grade_lab(course, lab, [REFERENCE, BLANK], out_dir=course / "grading", progress=False)


def grading_problems(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> list[Problem]:
    """Reference: every autograded cell full marks. Blank: every autograded cell zero."""
    problems = []
    for student, failure in ((REFERENCE, "the reference solution fails this test"),
                             (BLANK, "this test passes without an answer")):
        if outcomes[student].status != "ok":
            problems.append(Problem(lab, f"{student} submission", f"autograde failed: {outcomes[student].reason}"))
        if student not in scores:
            problems.append(Problem(lab, f"{student} submission", "no scores in the gradebook"))
            continue
        for cell in scores[student].cells.values():
            expected = cell.max_score if student == REFERENCE else 0
            if cell.autograded and cell.score != expected:
                problems.append(Problem(lab, f"{student} ({cell.grade_id})",
                                        f"earned {cell.score:g} of {cell.max_score:g}: {failure}"))
    return problems


def question_table(scores: dict[str, SubmissionScores]) -> str:
    """Per question: points, of which autograded, and the autograded points of the reference and the blank."""
    ref = question_scores(scores[REFERENCE]) if REFERENCE in scores else {}
    blank = question_scores(scores[BLANK]) if BLANK in scores else {}
    lines = [f"{'question':<16}{'points':>7}{'autograded':>11}{'reference':>10}{'blank':>7}"]
    for key in sorted(ref, key=question_sort_key):
        q = ref[key]
        auto = lambda v: f"{v:g}" if q.auto_max and v is not None else "-"  # noqa: E731
        lines.append(f"{question_label(key):<16}{q.auto_max + q.manual_max:>7g}{auto(q.auto_max):>11}"
                     f"{auto(q.auto_score):>10}{auto(blank[key].auto_score if key in blank else None):>7}")
    return "\n".join(lines)


def check_lab(lab: str, root: Path = REPO_ROOT, execute: bool = True) -> list[Problem]:
    """Run every check of one lab; print its table; return the problems found."""
    problems = lint_lab(lab, root)
    if not execute or any(p.where == "notebooks" for p in problems):
        return problems  # nothing to execute
    with tempfile.TemporaryDirectory(prefix=f"efficient-ai-check-{lab}-") as tmp:
        try:
            outcomes, scores = grade_reference_and_blank(lab, root, Path(tmp))
        except RuntimeError as exc:
            return problems + [Problem(lab, "gradebook", str(exc))]
        problems += grading_problems(lab, outcomes, scores)
        print(f"\n{lab}: autograde of the reference solution and of the blank release "
              f"({outcomes[REFERENCE].seconds:.0f} s and {outcomes[BLANK].seconds:.0f} s)")
        print(question_table(scores))
    return problems


def main(labs: list[str], root: Path = REPO_ROOT, execute: bool = True) -> int:
    failed = False
    for lab in labs:
        problems = check_lab(lab, root, execute)
        failed = failed or bool(problems)
        print(f"check {lab}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if failed else 0
