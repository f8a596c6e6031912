"""grade: autograde every submission of a lab, then write the score table, grades.csv and a histogram.

Submissions are read from ``submitted/<student>/<lab>/<lab>.ipynb`` (nbgrader's layout). Each submission is
autograded by its own nbgrader process with a time limit, so a crash, a hang or a dead kernel costs that
submission only; its status and reason are recorded beside whatever points the gradebook holds for it.
"""
from __future__ import annotations

import csv
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .nbgrader_run import SubmissionScores, read_scores, run_nbgrader
from .notebooks import question_key, question_label, question_sort_key
from .paths import REPO_ROOT

DEFAULT_SUBMISSION_TIMEOUT_S = 900.0


@dataclass
class Outcome:
    """How autograding one submission went."""

    student: str
    status: str  # "ok" or "failed"
    reason: str = ""
    seconds: float = 0.0


def prepare_gradebook(course_root: Path, lab: str) -> None:
    """Record the lab's cells in the gradebook (nbgrader generate_assignment, output to a scratch folder).

    Raises:
        RuntimeError: nbgrader could not generate the assignment.
    """
    with tempfile.TemporaryDirectory(prefix="efficient-ai-release-") as scratch:
        result = run_nbgrader(
            course_root, ["generate_assignment", lab, "--force", f"--CourseDirectory.release_directory={scratch}"]
        )
    if not result.ok:
        raise RuntimeError(f"nbgrader generate_assignment {lab} failed:\n{result.tail(25)}")


def list_students(course_root: Path, lab: str) -> list[str]:
    """Students with a submission folder for ``lab`` under ``submitted/``, sorted."""
    submitted = course_root / "submitted"
    if not submitted.is_dir():
        return []
    return sorted(p.name for p in submitted.iterdir() if (p / lab).is_dir())


def _failure_reason(result_output: str) -> str:
    for needle, reason in (
        ("DeadKernelError", "the kernel died (os._exit, a segfault or the out-of-memory killer)"),
        ("Kernel died", "the kernel died (os._exit, a segfault or the out-of-memory killer)"),
        ("CellTimeoutError", "a cell exceeded the per-cell time limit"),
        ("No submitted file", "no notebook named as the release in the submission"),
        ("NotJSONError", "the notebook is not valid JSON"),
        ("not valid JSON", "the notebook is not valid JSON"),
    ):
        if needle in result_output:
            return reason
    lines = [line for line in result_output.strip().splitlines() if "ERROR" in line or "Error" in line]
    return (lines[-1] if lines else result_output.strip().splitlines()[-1:] or ["nbgrader failed"])[0][:300]


def autograde_one(course_root: Path, lab: str, student: str, timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S) -> Outcome:
    """Autograde one submission in its own nbgrader process. Never raises for a bad submission."""
    start = time.perf_counter()
    result = run_nbgrader(
        course_root, ["autograde", lab, "--student", student, "--create", "--force"], timeout_s=timeout_s
    )
    seconds = time.perf_counter() - start
    graded_nb = course_root / "autograded" / student / lab / f"{lab}.ipynb"
    if result.timed_out:
        return Outcome(student, "failed", f"exceeded the per-submission time limit of {timeout_s:.0f} s", seconds)
    if not result.ok or not graded_nb.exists():
        return Outcome(student, "failed", _failure_reason(result.output), seconds)
    return Outcome(student, "ok", "", seconds)


def autograde_all(
    course_root: Path,
    lab: str,
    students: list[str],
    timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S,
    progress: bool = True,
) -> dict[str, Outcome]:
    """Autograde each student's submission in turn with one progress bar; continue past failures."""
    from tqdm import tqdm

    outcomes: dict[str, Outcome] = {}
    bar = tqdm(students, desc=f"autograde {lab}", unit="submission", disable=not progress)
    for student in bar:
        bar.set_postfix_str(student)
        outcomes[student] = autograde_one(course_root, lab, student, timeout_s)
    bar.close()
    return outcomes


def question_scores(scores: SubmissionScores) -> dict[str, tuple[float | None, float, bool]]:
    """Per question: (score or None while a TA has not graded it, max points, autograded?)."""
    per_question: dict[str, list] = {}
    for cell in scores.cells.values():
        key = question_key(cell.grade_id) or cell.grade_id
        entry = per_question.setdefault(key, [0.0, 0.0, True, False])
        entry[1] += cell.max_score
        if cell.autograded:
            entry[0] += cell.score
        else:
            entry[2] = False
            if cell.manual_score is None and cell.needs_manual_grade:
                entry[3] = True  # still waiting for a TA
            else:
                entry[0] += cell.score
    return {key: (None if pending else got, max_pts, auto) for key, (got, max_pts, auto, pending) in per_question.items()}


def score_table(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-student, per-question table (autograded questions, then totals)."""
    keys: set[str] = set()
    for s in scores.values():
        keys |= set(question_scores(s))
    ordered = sorted(keys, key=question_sort_key)
    header = ["student", "status", *[question_label(k).replace("Question ", "Q").replace("Bonus ", "B") for k in ordered], "auto", "manual", "reason"]
    rows = []
    for student in sorted(outcomes):
        outcome = outcomes[student]
        sub = scores.get(student)
        per_q = question_scores(sub) if sub else {}
        cells = []
        for key in ordered:
            if key not in per_q:
                cells.append("-")
                continue
            got, max_pts, auto = per_q[key]
            cells.append(f"{got:g}/{max_pts:g}" if got is not None else f"?/{max_pts:g}")
        auto_got = sub.autograded_score() if sub else 0.0
        auto_max = sub.autograded_max() if sub else 0.0
        manual_max = sum(c.max_score for c in sub.cells.values() if not c.autograded) if sub else 0.0
        rows.append([student, outcome.status, *cells, f"{auto_got:g}/{auto_max:g}", f"{manual_max:g} pts to grade", outcome.reason])
    return header, rows


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)] if rows else [len(h) for h in header]
    line = lambda values: "  ".join(str(v).ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]])


def write_grades_csv(path: Path, lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> None:
    """One row per student: status, reason, every graded cell's score, autograded and total scores."""
    cell_ids: list[str] = []
    for s in scores.values():
        cell_ids += [gid for gid in s.cells if gid not in cell_ids]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "lab", "status", "reason", *cell_ids, "autograded_score", "autograded_max", "total_score", "seconds"])
        for student in sorted(outcomes):
            sub, outcome = scores.get(student), outcomes[student]
            values = [f"{sub.cells[g].score:g}" if sub and g in sub.cells else "" for g in cell_ids]
            auto = sub.autograded_score() if sub else 0.0
            auto_max = sub.autograded_max() if sub else 0.0
            total = sum(c.score for c in sub.cells.values()) if sub else 0.0
            writer.writerow([student, lab, outcome.status, outcome.reason, *values, f"{auto:g}", f"{auto_max:g}", f"{total:g}", f"{outcome.seconds:.1f}"])


def plot_histogram(path: Path, lab: str, scores: dict[str, SubmissionScores], students: list[str]) -> None:
    """PNG histogram of the students' total scores so far (autograded + graded manual points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = [sum(c.score for c in scores[s].cells.values()) if s in scores else 0.0 for s in students]
    max_total = max((sum(c.max_score for c in s.cells.values()) for s in scores.values()), default=1.0)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(totals, bins=min(20, max(5, len(totals))), range=(0, max_total), color="#4C72B0", edgecolor="white")
    ax.set_xlabel(f"total score (points, out of {max_total:g}; manual answers count once graded)")
    ax.set_ylabel("students")
    ax.set_title(f"{lab}: score distribution ({len(totals)} submissions)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def grade_lab(
    course_root: Path,
    lab: str,
    students: list[str] | None = None,
    out_dir: Path | None = None,
    timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S,
    progress: bool = True,
) -> tuple[dict[str, Outcome], dict[str, SubmissionScores]]:
    """Autograde a lab's submissions and write ``grades.csv`` and ``scores.png`` into ``out_dir``."""
    students = students if students is not None else list_students(course_root, lab)
    out_dir = out_dir or course_root / "grading" / lab
    prepare_gradebook(course_root, lab)
    outcomes = autograde_all(course_root, lab, students, timeout_s, progress)
    scores = read_scores(course_root, lab, students)
    write_grades_csv(out_dir / "grades.csv", lab, outcomes, scores)
    plot_histogram(out_dir / "scores.png", lab, scores, students)
    return outcomes, scores


def main(lab: str, root: Path = REPO_ROOT, students: list[str] | None = None, timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S) -> int:
    found = list_students(root, lab)
    if students:
        missing = [s for s in students if s not in found]
        if missing:
            print(f"grade {lab}: no submission for {', '.join(missing)} under submitted/<student>/{lab}/")
            return 2
    elif not found:
        print(f"grade {lab}: nothing to grade: put submissions in submitted/<student>/{lab}/{lab}.ipynb")
        return 2
    out_dir = root / "grading" / lab
    outcomes, scores = grade_lab(root, lab, students or found, out_dir, timeout_s)
    header, rows = score_table(lab, outcomes, scores)
    print(format_table(header, rows))
    failed = [o for o in outcomes.values() if o.status != "ok"]
    print(f"\n{len(outcomes)} submission(s), {len(failed)} failed (their points so far are recorded; see 'reason').")
    print(f"wrote {out_dir / 'grades.csv'} and {out_dir / 'scores.png'}")
    return 0
