"""feedback: generate feedback HTML for autograded submissions and release it.

``nbgrader generate_feedback`` writes ``feedback/<student>/<lab>/<lab>.html``; hidden test source is replaced by
a one-line note (``course.nbgrader_ext.StripHiddenTests``). With ``--exchange DIR`` the feedback is also released
into an nbgrader exchange folder, where students fetch it with ``nbgrader fetch_feedback``.
"""
from __future__ import annotations

from pathlib import Path

from .nbgrader_run import read_scores, run_nbgrader
from .notebooks import grade_id, is_autograded_test, is_manually_graded, nbgrader_meta, question_key, question_label
from .paths import REPO_ROOT

TEMPLATES_DIR = Path(__file__).parent / "templates"  # course_feedback: nbgrader's feedback page, questions named


def toc_label(cell) -> str:
    """What the feedback page's table of contents calls a graded cell: ``Question 3.1.1: tests``,
    ``Question 1.2: written answer``; ``""`` for a cell that is not graded.

    A Jinja filter of the ``course_feedback`` template (nbgrader_config.py). Cells whose grade id names no question
    keep nbgrader's own words ("Test cell", "Written response")."""
    if nbgrader_meta(cell).get("task"):
        kind, generic = "task", "Task"
    elif is_autograded_test(cell):
        kind, generic = "tests", "Test cell"
    elif not is_manually_graded(cell):
        return ""
    elif cell.get("cell_type") == "markdown":
        kind, generic = "written answer", "Written response"
    else:
        kind, generic = "code graded by a TA", "Coding free-response"
    key = question_key(grade_id(cell))
    return f"{question_label(key)}: {kind}" if key else generic


def generate_feedback(course_root: Path, lab: str, students: list[str] | None = None) -> list[Path]:
    """Generate feedback HTML; return the files written.

    Raises:
        RuntimeError: nbgrader failed (its output tail is in the message).
    """
    # nbgrader takes one --student (a name or a glob) per run: one run for everyone, or one per named student.
    for student in students or [None]:
        args = ["generate_feedback", lab, "--force", *(["--student", student] if student else [])]
        result = run_nbgrader(course_root, args)
        if not result.ok:
            raise RuntimeError(f"nbgrader generate_feedback {lab} failed:\n{result.tail(20)}")
    if students:
        return sorted(path for student in students for path in (course_root / "feedback" / student / lab).glob("*.html"))
    return sorted((course_root / "feedback").glob(f"*/{lab}/*.html"))


def ungraded_answers(course_root: Path, lab: str, students: list[str] | None = None) -> dict[str, list[str]]:
    """Cells still waiting for a TA's score (written answers, plots), by student; students with none are left out.

    nbgrader shows such a cell as 0 points in feedback, which reads as a grade.
    """
    waiting = {}
    for student, scores in read_scores(course_root, lab, students).items():
        cells = sorted(gid for gid, cell in scores.cells.items() if cell.needs_manual_grade)
        if cells:
            waiting[student] = cells
    return waiting


def release_feedback(course_root: Path, lab: str, exchange: Path) -> None:
    exchange.mkdir(parents=True, exist_ok=True)
    result = run_nbgrader(course_root, ["release_feedback", lab, f"--Exchange.root={exchange}"])
    if not result.ok:
        raise RuntimeError(f"nbgrader release_feedback {lab} failed:\n{result.tail(20)}")


def main(lab: str, root: Path = REPO_ROOT, students: list[str] | None = None, exchange: str | None = None,
         force: bool = False) -> int:
    waiting = ungraded_answers(root, lab, students)
    if waiting:
        cells = sum(len(c) for c in waiting.values())
        print(f"feedback {lab}: {len(waiting)} submission(s) still have {cells} cell(s) waiting for a TA's score "
              f"(feedback would show them as 0 points), e.g. {next(iter(waiting))}: "
              f"{', '.join(next(iter(waiting.values()))[:4])}. Grade them in JupyterLab (Nbgrader > Formgrader) "
              + ("; generating feedback anyway (--force)." if force else "first, or pass --force."))
        if not force:
            return 1
    try:
        files = generate_feedback(root, lab, students)
        if exchange:
            release_feedback(root, lab, Path(exchange).resolve())
    except RuntimeError as exc:
        print(exc)
        return 1
    for path in files:
        print(path.relative_to(root))
    where = f"released into {exchange}" if exchange else "in feedback/<student>/; return them or pass --exchange"
    print(f"feedback {lab}: {len(files)} file(s), {where}")
    return 0
