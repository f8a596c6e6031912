"""Late submissions: the course's late-penalty policy (an nbgrader plugin) and the penalties the gradebook holds.

nbgrader's ``AssignLatePenalties`` asks the plugin for a penalty when a submission's ``timestamp.txt`` is after the
due date, from the points known at autograde time: points a TA gives written answers later are not penalised.
"""
from __future__ import annotations

import math
from pathlib import Path

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Enum, Float

from .paths import COURSE_ID


class LatePenalty(LateSubmissionPlugin):
    """nbgrader's late-submission plugin with one more method, a percentage of the score per day late."""

    penalty_method = Enum(
        ("none", "zero", "percent_per_day"), default_value="none",
        help="How a late submission is penalised: 'none' (no penalty), 'zero' (it scores 0), 'percent_per_day' "
             "(LatePenalty.percent_per_day percent of its score per day late or part of one, at most all of it).",
    ).tag(config=True)

    percent_per_day = Float(
        10.0, min=0.0,
        help="With penalty_method 'percent_per_day': the percentage of the score taken per day (24 h) late, or part "
             "of one; a submission 1 s late loses one day's percentage.",
    ).tag(config=True)

    def late_submission_penalty(self, student_id: str, score: float, total_seconds_late: float) -> float | None:
        """The points taken from a notebook's ``score`` for being ``total_seconds_late`` late (None: no penalty)."""
        if self.penalty_method != "percent_per_day":
            return super().late_submission_penalty(student_id, score, total_seconds_late)
        days_late = math.ceil(total_seconds_late / (24 * 3600))
        return score * min(1.0, days_late * self.percent_per_day / 100.0)


def late_penalties(course_root: Path, lab: str) -> dict[str, float]:
    """Student id -> the late penalty (points) the gradebook records for the student's submission of ``lab``."""
    from nbgrader.api import Assignment, Gradebook, SubmittedAssignment

    from .nbgrader_run import db_url_for  # not at the top: nbgrader_config.py imports this module

    with Gradebook(db_url_for(course_root), course_id=COURSE_ID) as gb:
        rows = (gb.db.query(SubmittedAssignment.student_id, SubmittedAssignment.late_submission_penalty)
                .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                .filter(Assignment.name == lab))
        return {student: float(penalty or 0.0) for student, penalty in rows}
