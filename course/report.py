"""Reporting a lab's grades: the per-question score table printed to the TA, ``grades.csv`` and the histogram.

Everything here reads what grading recorded (each submission's ``Outcome``, the gradebook's scores and late
penalties) and grades nothing; ``course.grade`` and ``course.check`` print their tables with it, and
``course grade LAB --report`` rewrites ``grades.csv`` once a TA has graded the written answers, and writes
``canvas.csv`` for Canvas's gradebook import.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from .lms import read_roster, write_canvas_csv
from .nbgrader_run import SubmissionScores, read_scores
from .notebooks import question_key
from .outcome import Outcome
from .quoting import escape_controls


@dataclass
class QuestionScore:
    """One question of one submission: its autograded part and its manually graded part, in points."""

    auto_score: float = 0.0
    auto_max: float = 0.0
    manual_score: float = 0.0
    manual_max: float = 0.0
    manual_pending: bool = False  # some manual part still waits for a TA

    def cell(self) -> str:
        """Compact table entry: ``4/5`` autograded, ``+2?`` manual points still to grade."""
        parts = []
        if self.auto_max:
            parts.append(f"{self.auto_score:g}/{self.auto_max:g}")
        if self.manual_max:
            parts.append(f"+{self.manual_max:g}?" if self.manual_pending else f"+{self.manual_score:g}/{self.manual_max:g}m")
        return " ".join(parts)


def question_scores(scores: SubmissionScores) -> dict[str, QuestionScore]:
    """Per question key (``q1_1``): the autograded and manual points of this submission."""
    per_question: dict[str, QuestionScore] = {}
    for cell in scores.cells.values():
        entry = per_question.setdefault(question_key(cell.grade_id) or cell.grade_id, QuestionScore())
        if cell.autograded:
            entry.auto_score += cell.score
            entry.auto_max += cell.max_score
        else:
            entry.manual_max += cell.max_score
            if cell.manual_score is None and cell.needs_manual_grade:
                entry.manual_pending = True
            else:
                entry.manual_score += cell.score
    return per_question


def part_of(key: str) -> str:
    """The part a question belongs to: ``q3_1_1`` -> ``P3``; a bonus question -> ``bonus``."""
    return "bonus" if key.startswith("b") else f"P{key[1:].split('_')[0]}" if key[:1] == "q" else key


REASON_CHARS = 40  # the table shows a reason's start; grades.csv has it whole


def score_table(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-student table, a part of the lab per column (it fits a 120-column terminal;
    grades.csv has every question).

    Each part shows its autograded points (``14/15``), ``bonus`` the bonus points earned (``+5``), ``autograded`` the
    core total and the bonus on top (``47/47 + 10 bonus``), ``to grade`` the written answers and plots still waiting
    for a TA (``+12?``) or their points once graded (``+10/12``); ``flags`` counts the flags for review.
    """
    parts: set[str] = set()
    for sub in scores.values():
        parts |= {part_of(key) for key in question_scores(sub)}
    ordered = sorted(parts - {"bonus"}, key=lambda p: int(p[1:]) if p[1:].isdigit() else 10**6) + (
        ["bonus"] if "bonus" in parts else [])
    header = ["student", "status", *ordered, "autograded", "to grade", "flags", "reason"]
    rows = []
    for student in sorted(outcomes):
        outcome, sub = outcomes[student], scores.get(student)
        per_part: dict[str, QuestionScore] = {}
        for key, entry in (question_scores(sub) if sub else {}).items():
            total = per_part.setdefault(part_of(key), QuestionScore())
            total.auto_score += entry.auto_score
            total.auto_max += entry.auto_max
            total.manual_score += entry.manual_score
            total.manual_max += entry.manual_max
            total.manual_pending |= entry.manual_pending
        cells = []
        for part in ordered:
            entry = per_part.get(part)
            if entry is None or not entry.auto_max:
                cells.append("-" if entry is None else "")
            else:
                cells.append(f"+{entry.auto_score:g}" if part == "bonus" else f"{entry.auto_score:g}/{entry.auto_max:g}")
        core = [c for c in sub.cells.values() if c.autograded and not c.bonus] if sub else []
        bonus = sum(c.score for c in sub.cells.values() if c.autograded and c.bonus) if sub else 0.0
        auto = (f"{sum(c.score for c in core):g}/{sum(c.max_score for c in core):g}" + (f" + {bonus:g} bonus" if bonus else "")
                if sub else "0")
        manual = [entry for entry in per_part.values() if entry.manual_max]
        waiting = any(entry.manual_pending for entry in manual)
        manual_max = sum(entry.manual_max for entry in manual)
        to_grade = "" if not manual else f"+{manual_max:g}?" if waiting else \
            f"+{sum(entry.manual_score for entry in manual):g}/{manual_max:g}"
        reason = outcome.reason if len(outcome.reason) <= REASON_CHARS else outcome.reason[: REASON_CHARS - 3] + "..."
        rows.append([student, outcome.status, *cells, auto, to_grade, str(len(outcome.flags) or ""), reason])
    return header, [[escape_controls(value) for value in row] for row in rows]


TABLE_LEGEND = (
    "P3 = Part 3's autograded points earned/possible; bonus = bonus points earned, on top of the lab's maximum; "
    "+12? = points of written answers or plots still to grade (in JupyterLab, Nbgrader > Formgrader), +10/12 once "
    "graded; - = not in this submission's gradebook entry. grades.csv has every question and the whole reason."
)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)] if rows else [len(h) for h in header]
    line = lambda values: "  ".join(str(v).ljust(w) for v, w in zip(values, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *[line(r) for r in rows]])


def flagged_for_review(outcomes: dict[str, Outcome], width: int = 160) -> str:
    """A short list of the students whose code was flagged, one line each ("" when none)."""
    lines = []
    for student in sorted(s for s, o in outcomes.items() if o.flags):
        line = escape_controls(f"  {student} ({len(outcomes[student].flags)}): " + "; ".join(outcomes[student].flags))
        lines.append(line if len(line) <= width else line[: width - 24] + " ... (see grades.csv)")
    if not lines:
        return ""
    return "\n".join(["flagged for review (flags never change a score; read the student's cells):", *lines])


def write_grades_csv(path: Path, lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores],
                     penalties: dict[str, float] | None = None) -> None:
    """One row per student: status, reason, repair notes, flags, every graded cell's score, autograded and total
    scores, the late penalty (``penalties``, points; ``course.late``) and the final score (total less penalty).
    Scores include bonus points (nbgrader's extra credit); maxima do not (a lab is out of 100 + bonus), as in the
    formgrader and ``nbgrader export``."""
    penalties = penalties or {}
    cell_ids: list[str] = []
    for s in scores.values():
        cell_ids += [gid for gid in s.cells if gid not in cell_ids]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "lab", "status", "reason", "notes", "flags", *cell_ids, "autograded_score", "autograded_max",
                         "total_score", "total_max", "late_penalty", "final_score", "seconds"])
        for student in sorted(outcomes):
            sub, outcome = scores.get(student), outcomes[student]
            values = [_csv_score(sub.cells[g]) if sub and g in sub.cells else "" for g in cell_ids]
            auto = sub.autograded_score() if sub else 0.0
            auto_max = sub.autograded_max() if sub else 0.0
            total = sub.total_score() if sub else 0.0
            total_max = sub.total_max() if sub else 0.0
            quoted = [escape_controls(text) for text in
                      (student, outcome.status, outcome.reason, "; ".join(outcome.notes), "; ".join(outcome.flags))]
            penalty = penalties.get(student, 0.0)
            writer.writerow([quoted[0], lab, *quoted[1:], *values, f"{auto:g}", f"{auto_max:g}", f"{total:g}",
                             f"{total_max:g}", f"{penalty:g}", f"{final_score(total, penalty):g}",
                             f"{outcome.seconds:.1f}"])


def final_score(total: float, penalty: float) -> float:
    """What a student gets: the total score less the late penalty, never below 0."""
    return max(0.0, total - penalty)


def _split_joined(text: str | None) -> list[str]:
    """The items of a ``"; "``-joined ``grades.csv`` field (notes, flags)."""
    return [part for part in (text or "").split("; ") if part]


def previous_outcomes(path: Path, lab: str) -> dict[str, Outcome]:
    """The students of an existing ``grades.csv`` of ``lab``, with the status, reason, notes and flags it recorded.

    Grading some students (``--student``) updates their rows and keeps everyone else's from here.
    """
    if not path.exists():
        return {}
    kept: dict[str, Outcome] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("lab") != lab or not row.get("student"):
                continue
            try:
                seconds = float(row.get("seconds") or 0.0)
            except ValueError:
                seconds = 0.0
            kept[row["student"]] = Outcome(row["student"], row.get("status") or "ok", row.get("reason") or "", seconds,
                                           _split_joined(row.get("notes")), _split_joined(row.get("flags")))
    return kept


def write_reports(course_root: Path, lab: str, out_dir: Path, outcomes: dict[str, Outcome]) -> dict[str, SubmissionScores]:
    """Write ``grades.csv`` and ``scores.png`` from the gradebook: ``outcomes``' students updated, others kept.

    Manual points a TA entered in the formgrader are read from the gradebook, so running this after grading the
    written answers brings ``grades.csv`` up to date. Returns every listed student's scores.
    """
    from .late import late_penalties  # imports nbgrader

    csv_path = out_dir / "grades.csv"
    everyone = {**previous_outcomes(csv_path, lab), **outcomes}
    scores = read_scores(course_root, lab, sorted(everyone))
    write_grades_csv(csv_path, lab, everyone, scores, late_penalties(course_root, lab))
    plot_histogram(out_dir / "scores.png", lab, scores, sorted(everyone))
    return scores


def write_canvas_export(course_root: Path, lab: str, out_dir: Path, students: list[str],
                        scores: dict[str, SubmissionScores], roster: Path | None = None,
                        assignment_id: str | None = None) -> Path:
    """Write ``canvas.csv``, the students' final scores (total less late penalty) in Canvas's gradebook import
    format (``course.lms``), beside ``grades.csv``. Returns its path."""
    from .late import late_penalties  # imports nbgrader

    penalties = late_penalties(course_root, lab)
    finals = {s: final_score(scores[s].total_score() if s in scores else 0.0, penalties.get(s, 0.0)) for s in students}
    possible = max((s.total_max() for s in scores.values()), default=0.0)
    path = out_dir / "canvas.csv"
    write_canvas_csv(path, lab, finals, possible, read_roster(roster) if roster else None, assignment_id)
    return path


def _csv_score(cell) -> str:
    """A cell's score for grades.csv; empty for an autograded cell with no score (cleared after a failed run)."""
    if cell.autograded and cell.auto_score is None and cell.manual_score is None:
        return ""
    return f"{cell.score:g}"


def prepare_plotting() -> None:
    """Import what ``plot_histogram`` draws with (matplotlib's file-only Agg backend), which a grading run
    does while it waits for its workers instead of after the last submission."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import matplotlib.ticker  # noqa: F401


def plot_histogram(path: Path, lab: str, scores: dict[str, SubmissionScores], students: list[str]) -> None:
    """PNG histogram of the students' total scores so far (autograded + graded manual points)."""
    prepare_plotting()
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    totals = [scores[s].total_score() if s in scores else 0.0 for s in students]
    max_total = max((s.total_max() for s in scores.values()), default=1.0)
    max_bonus = max((s.bonus_max() for s in scores.values()), default=0.0)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(totals, bins=min(20, max(5, len(totals))), range=(0, max_total + max_bonus), color="#4C72B0",
            edgecolor="white")
    out_of = f"{max_total:g} + {max_bonus:g} bonus" if max_bonus else f"{max_total:g}"
    ax.set_xlabel(f"total score (points, out of {out_of}; manual answers count once graded)")
    ax.set_ylabel("students")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts of students
    ax.set_title(f"{lab}: score distribution ({len(totals)} submissions)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
