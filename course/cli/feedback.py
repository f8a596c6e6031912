"""feedback: generate feedback HTML for autograded submissions and release it.

``nbgrader generate_feedback`` writes ``feedback/<student>/<lab>/<lab>.html``, hidden test source replaced by a
one-line note (``course.grader.nbgrader_ext.StripHiddenTests``). With ``--exchange DIR`` the feedback is also released into
an nbgrader exchange folder, where students fetch it with ``nbgrader fetch_feedback``.
"""
from __future__ import annotations

from pathlib import Path

from ..common.notebooks import (
    grade_id,
    is_autograded_test,
    is_bonus_id,
    nbgrader_meta,
    question_key,
    question_label,
    question_labels,
)
from ..common.paths import COURSE_ID, REPO_ROOT, course_directory
from ..common.scores import read_scores
from ..grader.late import FinalScorePenalties
from .nbgrader_run import run_nbgrader


def _points(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def question_rows(nb) -> list[dict]:
    """The feedback page's summary (the ``course_feedback`` template): one row per question, in the lab's order,
    from the grades nbgrader's ``GetGrades`` and ``ShowBonusPoints`` wrote into each cell's metadata.

    Each row: ``label`` ("Question 3.1.1", as the question's heading shows it, renumbered or not), ``anchor`` (the
    grade id of its first graded cell), ``autograded``, ``ta`` and ``bonus`` as ``[score, points]`` or None (score None
    until a TA grades it), and the TA's ``comments``."""
    rows: dict[str, dict] = {}
    labels = question_labels(nb)
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        if not meta.get("grade") and not meta.get("task"):
            continue
        gid = grade_id(cell)
        key = question_key(gid) or gid
        label = (labels.get(key) or question_label(key)) if question_key(gid) else gid
        row = rows.setdefault(key, {"label": label, "anchor": gid,
                                    "autograded": None, "ta": None, "bonus": None, "comments": []})
        column = "bonus" if is_bonus_id(key) else "autograded" if is_autograded_test(cell) else "ta"
        score, points = _points(meta.get("score")), _points(meta.get("points")) or 0.0
        if row[column] is not None:
            earlier, earlier_points = row[column]
            score = None if earlier is None or score is None else earlier + score
            points += earlier_points
        row[column] = [score, points]
        if meta.get("comment"):
            row["comments"].append(str(meta["comment"]))
    return list(rows.values())


def _run(course_root: Path, args: list[str]) -> None:
    """Run nbgrader in ``course_root``; raise RuntimeError (with its output's tail) when it fails."""
    result = run_nbgrader(course_root, args)
    if not result.ok:
        raise RuntimeError(f"nbgrader {args[0]} {args[1]} failed:\n{result.tail(20)}")


def generate_feedback(course_root: Path, lab: str, students: list[str] | None = None) -> list[Path]:
    """Generate feedback HTML; return the files written (RuntimeError with nbgrader's output when it fails)."""
    # nbgrader takes one --student (a name or a glob) per run: one run for everyone, or one per named student.
    for student in students or [None]:
        _run(course_root, ["generate_feedback", lab, "--force", *(["--student", student] if student else [])])
    if students:
        return sorted(path for student in students for path in (course_root / "feedback" / student / lab).glob("*.html"))
    return sorted((course_root / "feedback").glob(f"*/{lab}/*.html"))


def ungraded_answers(course_root: Path, lab: str, students: list[str] | None = None) -> dict[str, list[str]]:
    """Cells still waiting for a TA's score (written answers, plots), by student; students with none are left out
    (nbgrader's feedback shows such a cell as 0 points, which reads as a grade)."""
    waiting = {student: sorted(gid for gid, cell in scores.cells.items() if cell.needs_manual_grade)
               for student, scores in read_scores(course_root, lab, students).items()}
    return {student: cells for student, cells in waiting.items() if cells}


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
        settle_late_penalties(root, lab)  # feedback shows the penalty of the final score, whatever ran before it
        files = generate_feedback(root, lab, students)
        if exchange:
            Path(exchange).resolve().mkdir(parents=True, exist_ok=True)
            _run(root, ["release_feedback", lab, f"--Exchange.root={Path(exchange).resolve()}"])
    except RuntimeError as exc:
        print(exc)
        return 1
    for path in files:
        print(path.relative_to(root))
    where = f"released into {exchange}" if exchange else "in feedback/<student>/; return them or pass --exchange"
    print(f"feedback {lab}: {len(files)} file(s), {where}")
    return 0


def settle_late_penalties(course_root: Path, lab: str) -> None:
    """Record every late submission's penalty of its score as it is now (``FinalScorePenalties``, in an nbgrader
    process); nothing to do, and no process, when no submission of ``lab`` is after the due date. RuntimeError with
    nbgrader's output when it fails (the gradebook then keeps the penalties of autograde)."""
    if not _any_after_due_date(course_root, lab):
        return
    result = run_nbgrader(course_root, ["export", f"--exporter={FinalScorePenalties.__module__}.{FinalScorePenalties.__name__}",
                                        f"--assignment={lab}"])
    if not result.ok:
        raise RuntimeError(f"recording the late penalties of {lab} on the final scores failed (the gradebook keeps "
                           f"those of autograde):\n{result.tail(20)}")


def _any_after_due_date(course_root: Path, lab: str) -> bool:
    """Whether a submission of ``lab`` has a time after the lab's due date (extensions aside: a superset of the late
    ones, in one query)."""
    from nbgrader.api import Assignment, Gradebook, SubmittedAssignment

    with Gradebook(course_directory(course_root).db_url, course_id=COURSE_ID) as gb:
        return gb.db.query(SubmittedAssignment.id).join(Assignment).filter(
            Assignment.name == lab, Assignment.duedate.isnot(None),
            SubmittedAssignment.timestamp > Assignment.duedate).first() is not None
