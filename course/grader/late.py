"""Late submissions: the course's late-penalty policy (an nbgrader plugin) and the penalties the gradebook holds.

nbgrader's ``AssignLatePenalties`` asks the plugin for a penalty at autograde, when a submission's ``timestamp.txt`` is
after the due date, from the notebook's score at that time: points a TA gives written answers later are not in it.
The course's penalty applies to the final score, autograded and manual points together: ``course grade`` asks the
same plugin again with the score as it is now before it writes any report (``course.cli.feedback.settle_late_penalties``), and records
the answer where nbgrader records its own, so ``grades.csv``, ``canvas.csv``, feedback and ``nbgrader export`` agree.
"""
from __future__ import annotations

import math
from pathlib import Path

from nbgrader.plugins import ExportPlugin, LateSubmissionPlugin
from nbgrader.preprocessors import AssignLatePenalties
from traitlets import Enum, Float

from ..common.paths import COURSE_ID, course_directory


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


class FinalScorePenalties(ExportPlugin):
    """``nbgrader export --exporter=course.grader.late.FinalScorePenalties --assignment=LAB``: exports nothing; records for
    every submission of LAB the late penalty of its score as it is now, manual points included.

    nbgrader's export runs its plugin with the course's settings and the gradebook; the penalty comes from the
    late-submission plugin nbgrader_config.py sets (``c.AssignLatePenalties.plugin_class``) and is bounded by
    ``AssignLatePenalties``' own rule, exactly as at autograde.
    """

    def export(self, gradebook) -> None:
        assigner = AssignLatePenalties(parent=self)
        assigner.init_plugin()
        for lab in self.assignment:
            for submission in gradebook.find_assignment(lab).submissions:
                seconds_late = submission.total_seconds_late
                for notebook in submission.notebooks:
                    penalty = (assigner.plugin_inst.late_submission_penalty(submission.student.id, notebook.score,
                                                                            seconds_late) if seconds_late > 0 else None)
                    notebook.late_submission_penalty = (None if penalty is None
                                                        else assigner._check_late_penalty(notebook, penalty))
        gradebook.db.commit()


def late_penalties(course_root: Path, lab: str) -> dict[str, float]:
    """Student id -> the late penalty (points) the gradebook records for the student's submission of ``lab``."""
    from nbgrader.api import Assignment, Gradebook, SubmittedAssignment

    with Gradebook(course_directory(course_root).db_url, course_id=COURSE_ID) as gb:
        rows = (gb.db.query(SubmittedAssignment.student_id, SubmittedAssignment.late_submission_penalty)
                .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                .filter(Assignment.name == lab))
        return {student: float(penalty or 0.0) for student, penalty in rows}
