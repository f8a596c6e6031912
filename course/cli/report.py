"""Reporting a lab's grades from what grading recorded: the score table printed to the TA, ``grades.csv``,
``canvas.csv`` and the histogram. Nothing here grades.

A submission's final score exists only once no cell of it waits for a TA (``course.cli.feedback.ungraded_answers``, the
rule ``course feedback`` refuses by): until then ``grades.csv`` lists the waiting cells in its ``ungraded`` column and
leaves ``late_penalty`` and ``final_score`` empty, and ``canvas.csv`` leaves the score empty (Canvas's import then
keeps the student's grade as it is). A cell without any score is empty too, never 0.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..common.notebooks import question_key
from ..common.outcome import Outcome
from ..common.quoting import escape_controls
from ..common.scores import SubmissionScores, read_scores
from ..common.spreadsheet import read_cell, write_csv
from ..grader.lms import final_score, write_canvas_csv
from .feedback import settle_late_penalties, ungraded_answers

NO_SUBMISSION = "no submission"  # the status of a roster student without a submission (course grade --report --roster)


@dataclass
class QuestionScore:
    """One question (or part) of one submission: its autograded and its manually graded points."""

    auto_score: float = 0.0
    auto_max: float = 0.0
    manual_score: float = 0.0
    manual_max: float = 0.0
    manual_pending: bool = False  # some manual part still waits for a TA

    def cell(self) -> str:
        """Compact table entry: ``4/5`` autograded, ``+2?`` manual points still to grade."""
        parts = [f"{self.auto_score:g}/{self.auto_max:g}"] if self.auto_max else []
        if self.manual_max:
            parts.append(f"+{self.manual_max:g}?" if self.manual_pending else f"+{self.manual_score:g}/{self.manual_max:g}m")
        return " ".join(parts)


def question_scores(scores: SubmissionScores, group: Callable[[str], str] = str) -> dict[str, QuestionScore]:
    """Per question key (``q1_1``), or per ``group(question key)``: the autograded and manual points."""
    grouped: dict[str, QuestionScore] = {}
    for cell in scores.cells.values():
        entry = grouped.setdefault(group(question_key(cell.grade_id) or cell.grade_id), QuestionScore())
        if cell.autograded:
            entry.auto_score += cell.score
            entry.auto_max += cell.max_score
        else:
            entry.manual_max += cell.max_score
            if cell.manual_score is None and cell.needs_manual_grade:
                entry.manual_pending = True
            else:
                entry.manual_score += cell.score
    return grouped


def part_of(key: str) -> str:
    """The part a question belongs to: ``q3_1_1`` -> ``P3``; a bonus question -> ``bonus``."""
    return "bonus" if key.startswith("b") else f"P{key[1:].split('_')[0]}" if key[:1] == "q" else key


def _points(value: float) -> str:
    """Points as the table shows them: at most two decimals (grades.csv has them exact)."""
    return f"{round(value, 2):g}"


def _part_cell(entry: QuestionScore | None) -> str:
    """A part's autograded points (``14/15``); "" when nothing in it is autograded, ``-`` when it is not there."""
    if entry is None:
        return "-"
    return f"{_points(entry.auto_score)}/{_points(entry.auto_max)}" if entry.auto_max else ""


def score_table(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-student table, a part of the lab per column (``TABLE_LEGEND`` reads them)."""
    per_part = {s: question_scores(sub, part_of) for s, sub in scores.items()}
    parts = {part for grouped in per_part.values() for part in grouped} - {"bonus"}
    ordered = sorted(parts, key=lambda p: int(p[1:]) if p[1:].isdigit() else 10**6)
    header = ["student", "status", *ordered, "autograded", "to grade", "flags", "reason"]
    rows = []
    for student in sorted(outcomes):
        outcome, sub, grouped = outcomes[student], scores.get(student), per_part.get(student, {})
        cells = [_part_cell(grouped.get(part)) for part in ordered]
        auto = "0"
        if sub:
            core = [c for c in sub.cells.values() if c.autograded and not c.bonus]
            bonus = sum(c.score for c in sub.cells.values() if c.autograded and c.bonus)
            auto = f"{_points(sum(c.score for c in core))}/{_points(sum(c.max_score for c in core))}"
            auto += f" + {_points(bonus)} bonus" if bonus else ""
        manual = [entry for entry in grouped.values() if entry.manual_max]
        manual_max = _points(sum(entry.manual_max for entry in manual))
        to_grade = ("" if not manual else f"+{manual_max}?" if any(entry.manual_pending for entry in manual)
                    else f"+{_points(sum(entry.manual_score for entry in manual))}/{manual_max}")
        rows.append([student, outcome.status, *cells, auto, to_grade, str(len(outcome.flags) or ""), outcome.reason])
    return header, [[escape_controls(value) for value in row] for row in rows]


TABLE_LEGEND = """\
P3 = Part 3's autograded points earned/possible; autograded = the lab's autograded points, bonus points on top;
+12? = points of written answers or plots still to grade (in JupyterLab, Nbgrader > Formgrader), +10/12 once graded;
- = not in this submission's gradebook entry. grades.csv has every question and the whole reason."""
TABLE_WIDTH = 120  # a terminal's columns


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """The table as text, columns padded to their widest entry; the last column (the reason, long text) goes on a line
    of its own under its row, cut to ``TABLE_WIDTH``."""
    widths = [max(len(value) for value in column) for column in zip(header[:-1], *(row[:-1] for row in rows))]

    def line(values: list[str]) -> str:
        return "  ".join(value.ljust(w) for value, w in zip(values, widths)).rstrip()

    lines = [line(header), line(["-" * w for w in widths])]
    for row in rows:
        lines.append(line(row))
        if row[-1]:
            below = f"  {header[-1]}: {row[-1]}"
            lines.append(below if len(below) <= TABLE_WIDTH else below[: TABLE_WIDTH - 3] + "...")
    return "\n".join(lines)


def print_table(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> None:
    """Print the score table and its legend."""
    print(format_table(*score_table(lab, outcomes, scores)))
    print(TABLE_LEGEND)


def flagged_for_review(outcomes: dict[str, Outcome]) -> str:
    """The students whose code was flagged, one line each, cut to ``TABLE_WIDTH`` ("" when none)."""
    lines = []
    for student in sorted(s for s, o in outcomes.items() if o.flags):
        line = escape_controls(f"  {student} ({len(outcomes[student].flags)}): " + "; ".join(outcomes[student].flags))
        lines.append(line if len(line) <= TABLE_WIDTH else line[: TABLE_WIDTH - 24] + " ... (see grades.csv)")
    header = "flagged for review (flags never change a score; read the student's cells):"
    return "\n".join([header, *lines]) if lines else ""


def write_grades_csv(path: Path, lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores],
                     penalties: dict[str, float] | None = None, ungraded: dict[str, list[str]] | None = None) -> None:
    """One row per student: status, reason, notes, flags, every graded cell's score, the autograded and total scores,
    the late penalty (``penalties``, points), the final score, the cells still waiting for a TA (``ungraded``: by
    student, as ``course.cli.feedback.ungraded_answers`` lists them) and the grading time. Scores include bonus points
    (nbgrader's extra credit); maxima do not, as in the formgrader and ``nbgrader export``. A cell without a score is
    empty; the late penalty and final score are empty while a cell waits (``final_scores``)."""
    penalties, ungraded = penalties or {}, ungraded or {}
    finals = final_scores(outcomes, scores, penalties, ungraded)
    cell_ids = list(dict.fromkeys(gid for s in scores.values() for gid in s.cells))  # in order, each once
    rows: list[list] = [["student", "lab", "status", "reason", "notes", "flags", *cell_ids, "autograded_score",
                         "autograded_max", "total_score", "total_max", "late_penalty", "final_score", "ungraded",
                         "seconds"]]
    for student in sorted(outcomes):
        sub, outcome = scores.get(student) or SubmissionScores(student), outcomes[student]
        quoted = [escape_controls(text) for text in
                  (student, outcome.status, outcome.reason, "; ".join(outcome.notes), "; ".join(outcome.flags))]
        final = finals[student]
        rows.append([quoted[0], lab, *quoted[1:], *(_csv_score(sub.cells.get(g)) for g in cell_ids),
                     sub.autograded_score(), sub.autograded_max(), sub.total_score(), sub.total_max(),
                     None if final is None else penalties.get(student, 0.0), final,
                     "; ".join(ungraded.get(student, [])), f"{outcome.seconds:.1f}"])
    write_csv(path, rows)


def _csv_score(cell) -> float | None:
    """A cell's score for grades.csv; None (empty) when the submission lacks the cell or no score was given to it
    (an answer waiting for a TA, an autograded cell cleared after a failed run): never 0 for "not graded"."""
    if cell is None or cell.auto_score is None and cell.manual_score is None:
        return None
    return cell.score


def final_scores(outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores], penalties: dict[str, float],
                 ungraded: dict[str, list[str]]) -> dict[str, float | None]:
    """Student -> what the student gets (``final_score``), or None while it is not known: a cell waits for a TA, or
    there is no submission."""
    return {student: None if ungraded.get(student) or outcome.status == NO_SUBMISSION else
            final_score(scores[student].total_score() if student in scores else 0.0, penalties.get(student, 0.0))
            for student, outcome in outcomes.items()}


def previous_outcomes(path: Path, lab: str) -> dict[str, Outcome]:
    """The students of an existing ``grades.csv`` of ``lab``, with the status, reason, notes and flags it recorded
    (grading some students keeps everyone else's rows from here); a roster's non-submitters are left out."""
    if not path.exists():
        return {}

    def items(text: str | None) -> list[str]:  # of a "; "-joined field
        return [part for part in (text or "").split("; ") if part]

    kept: dict[str, Outcome] = {}
    with path.open(newline="") as handle:
        for written in csv.DictReader(handle):
            row = {key: read_cell(value or "") for key, value in written.items() if key}
            if row.get("lab") != lab or not row.get("student") or row.get("status") == NO_SUBMISSION:
                continue  # a roster's non-submitters are listed again by each --report --roster
            try:
                seconds = float(row.get("seconds") or 0.0)
            except ValueError:
                seconds = 0.0
            kept[row["student"]] = Outcome(row["student"], row.get("status") or "ok", row.get("reason") or "", seconds,
                                           items(row.get("notes")), items(row.get("flags")))
    return kept


@dataclass
class ClassReport:
    """What the reports of a lab are written from: every listed student's outcome and scores, the late penalties
    and the cells still waiting for a TA (by student)."""

    outcomes: dict[str, Outcome]
    scores: dict[str, SubmissionScores]
    penalties: dict[str, float]
    ungraded: dict[str, list[str]]

    def finals(self) -> dict[str, float | None]:
        return final_scores(self.outcomes, self.scores, self.penalties, self.ungraded)


def write_reports(course_root: Path, lab: str, out_dir: Path, outcomes: dict[str, Outcome],
                  settled: bool = False) -> ClassReport:
    """Write ``grades.csv`` and ``scores.png`` from the gradebook (manual points a TA entered included):
    ``outcomes``' students updated, the others kept. Unless the caller has (``settled``), late penalties are first
    settled on the scores as they are now (``course.cli.feedback.settle_late_penalties``; when that fails, a warning says the
    gradebook's are used). Returns what the reports were written from."""
    from ..grader.late import late_penalties  # imports nbgrader

    csv_path = out_dir / "grades.csv"
    everyone = {**previous_outcomes(csv_path, lab), **outcomes}
    if not settled:
        try:
            settle_late_penalties(course_root, lab)
        except RuntimeError as exc:
            print(f"WARNING: {exc}\nRun `python -m course grade {lab} --report` once this is fixed.")
    report = ClassReport(everyone, read_scores(course_root, lab, sorted(everyone)), late_penalties(course_root, lab),
                         ungraded_answers(course_root, lab, sorted(everyone)))
    write_grades_csv(csv_path, lab, everyone, report.scores, report.penalties, report.ungraded)
    plot_histogram(out_dir / "scores.png", lab, report.scores,
                   sorted(s for s, outcome in everyone.items() if outcome.status != NO_SUBMISSION))
    return report


def write_canvas_export(out_dir: Path, lab: str, report: ClassReport, roster: dict[str, dict[str, str]] | None,
                        assignment_id: str | None) -> Path:
    """Write ``canvas.csv`` beside ``grades.csv``: every student's final score (empty while not known) in Canvas's
    gradebook import format (``course.grader.lms``). Returns its path."""
    possible = max((s.total_max() for s in report.scores.values()), default=0.0)
    path = out_dir / "canvas.csv"
    write_canvas_csv(path, lab, report.finals(), possible, roster, assignment_id)
    return path


def plot_histogram(path: Path, lab: str, scores: dict[str, SubmissionScores], students: list[str]) -> None:
    """PNG histogram of the students' total scores so far (autograded + graded manual points)."""
    from matplotlib.figure import Figure  # not pyplot: no global backend, no figure to close
    from matplotlib.ticker import MaxNLocator

    totals = [scores[s].total_score() if s in scores else 0.0 for s in students]
    max_total = max((s.total_max() for s in scores.values()), default=1.0)
    max_bonus = max((s.bonus_max() for s in scores.values()), default=0.0)
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
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
