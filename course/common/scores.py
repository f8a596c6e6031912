"""The score model of a graded class: what nbgrader's gradebook holds for each submission's cells (its SQL read once
per lab), with the facts of the instructor notebook it needs (which cells are autograded, bonus points)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .notebooks import NotebookError, bonus_points, cells_by_grade_id, is_bonus_id, read_notebook
from .paths import COURSE_ID, course_directory


@dataclass
class CellScore:
    """One graded cell of one submission."""

    grade_id: str
    max_score: float
    auto_score: float | None
    manual_score: float | None
    needs_manual_grade: bool
    autograded: bool  # a test cell (not a written answer or open-ended code)
    extra_credit: float | None = None
    bonus: bool = False  # a bonus question's cell: max_score is its bonus points, on top of the lab's maximum

    @property
    def score(self) -> float:
        """nbgrader's score: the manual score, else the automatic one (else 0), plus any extra credit."""
        value = self.manual_score if self.manual_score is not None else self.auto_score
        if value is None:
            return 0.0
        return float(value) + float(self.extra_credit or 0.0)


@dataclass
class SubmissionScores:
    """Scores of one student's submission of one lab, as the gradebook has them."""

    student: str
    cells: dict[str, CellScore] = field(default_factory=dict)

    def autograded_score(self) -> float:
        """Points of the autograded cells, bonus included."""
        return sum(c.score for c in self.cells.values() if c.autograded)

    def autograded_short(self) -> list[CellScore]:
        """The autograded cells, bonus ones included, that earned less than their maximum."""
        return [c for c in self.cells.values() if c.autograded and c.score < c.max_score]

    def autograded_max(self) -> float:
        """Maximum of the autograded cells, bonus excluded (bonus points come on top)."""
        return sum(c.max_score for c in self.cells.values() if c.autograded and not c.bonus)

    def total_score(self) -> float:
        """nbgrader's score of the submission: every cell's score, bonus (extra credit) included."""
        return sum(c.score for c in self.cells.values())

    def total_max(self) -> float:
        """nbgrader's maximum of the submission: the core points, bonus excluded (100 for a lab)."""
        return sum(c.max_score for c in self.cells.values() if not c.bonus)

    def bonus_max(self) -> float:
        return sum(c.max_score for c in self.cells.values() if c.bonus)


def read_scores(course_root: Path, lab: str, students: list[str] | None = None) -> dict[str, SubmissionScores]:
    """Per-cell scores of every submission of ``lab`` in the gradebook (or of the given students).

    Cells are in the order of the course's ``source/<lab>/`` notebook (others last, by name); a bonus cell's maximum
    is its bonus points from that notebook (nbgrader records 0). A few queries whatever the class size: nbgrader's
    ORM objects would load each grade's cell in a query of its own.
    """
    from nbgrader.api import Grade, Gradebook, MissingEntry, SubmittedAssignment, SubmittedNotebook

    coursedir = course_directory(course_root)
    with Gradebook(coursedir.db_url, course_id=COURSE_ID) as gb:
        try:
            assignment = gb.find_assignment(lab)
        except MissingEntry:
            return {}
        cells: dict[str, tuple[str, float, bool]] = {}  # cell id -> grade id, maximum, autograded
        order: dict[str, int] = {}
        for notebook in assignment.notebooks:
            grade_ids, bonus = _source_notebook_facts(
                Path(coursedir.format_path(coursedir.source_directory, ".", lab)) / f"{notebook.name}.ipynb")
            for gid in grade_ids:
                order.setdefault(gid, len(order))
            solution_names = {cell.name for cell in notebook.solution_cells}
            for cell in [*notebook.grade_cells, *notebook.task_cells]:
                cells[cell.id] = (cell.name, bonus.get(cell.name, float(cell.max_score)),
                                  _is_autograded_cell(cell, solution_names))
        submitted = (gb.db.query(SubmittedAssignment.student_id)
                     .filter(SubmittedAssignment.assignment_id == assignment.id))
        result = {student: SubmissionScores(student) for (student,) in submitted
                  if students is None or student in students}
        rows = (gb.db.query(SubmittedAssignment.student_id, Grade.cell_id, Grade.auto_score, Grade.manual_score,
                            Grade.extra_credit, Grade.needs_manual_grade)
                .join(SubmittedNotebook, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                .join(Grade, Grade.notebook_id == SubmittedNotebook.id)
                .filter(SubmittedAssignment.assignment_id == assignment.id))
        for student, cell_id, auto_score, manual_score, extra_credit, needs_manual_grade in rows:
            if student in result:
                name, max_score, autograded = cells[cell_id]
                result[student].cells[name] = CellScore(
                    name, max_score, _number(auto_score), _number(manual_score), bool(needs_manual_grade),
                    autograded, _number(extra_credit), bonus=is_bonus_id(name))
    for sub in result.values():
        sub.cells = dict(sorted(sub.cells.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))
    return result


def _number(value) -> float | None:
    return None if value is None else float(value)


def _source_notebook_facts(path: Path) -> tuple[list[str], dict[str, float]]:
    """The grade ids (in notebook order) and bonus points of an instructor notebook; empty when it is missing."""
    try:
        nb = read_notebook(path)
    except NotebookError:  # missing too
        return [], {}
    return list(cells_by_grade_id(nb)), bonus_points(nb)


def is_autograded_grade(grade) -> bool:
    """Whether a gradebook grade is an autograded test cell's (``_is_autograded_cell``)."""
    cell = grade.cell
    return _is_autograded_cell(cell, {solution.name for solution in cell.notebook.solution_cells})


def _is_autograded_cell(cell, solution_names: set[str]) -> bool:
    """Whether a gradebook grade or task cell is an autograded test: code, and not also a solution cell."""
    return cell.cell_type == "code" and cell.name not in solution_names
