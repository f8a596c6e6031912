"""After the deadline: nbgrader's late-submission plugin with the course's policy option, applied to the final score
(autograded and manual points) and shown in grades.csv, in Canvas's import CSV (``course grade LAB --report``, which
exports nothing while an answer waits for a TA unless forced) and in feedback; a submission with a timestamp.txt after
the lab's due date in the gradebook."""
from __future__ import annotations

import csv
import shutil
import subprocess

import pytest
from fixture_lab import LAB, make_root

from course.cli import build, feedback, grade
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import make_submission, read_notebook, write_notebook
from course.grader.late import LatePenalty
from course.grader.lms import POINTS_POSSIBLE

DUE = "2025-03-01 23:59:00 UTC"
LATE = "2025-03-04 11:59:00 UTC"  # 2.5 days late: 3 days at 10 % a day
AUTOGRADED = 6.0  # every autograded point of the fixture lab, its bonus point included
WRITTEN = 1.5  # what the TA gives the written answer (out of 2)


def test_percent_per_day_counts_started_days():
    plugin = LatePenalty(penalty_method="percent_per_day", percent_per_day=10.0)
    assert plugin.late_submission_penalty("s", 50.0, 1.0) == 5.0, "one second late costs a day"
    assert plugin.late_submission_penalty("s", 50.0, 2.5 * 86400) == pytest.approx(15.0)
    assert plugin.late_submission_penalty("s", 50.0, 30 * 86400) == 50.0, "never more than the score"
    assert LatePenalty(penalty_method="zero").late_submission_penalty("s", 50.0, 1.0) == 50.0
    assert LatePenalty().late_submission_penalty("s", 50.0, 1.0) is None, "'none' is the default"


@pytest.mark.slow
def test_late_submission_loses_its_percentage_in_grades_canvas_and_feedback(tmp_path):
    root = make_root(tmp_path / "repo")
    assert build.main([LAB], root) == 0
    course = make_course_dir(tmp_path / "course", [LAB], root)
    with (course / "nbgrader_config.py").open("a") as config:  # the one policy option, as a course would set it
        config.write('\nc.LateSubmissionPlugin.penalty_method = "percent_per_day"\n')
    nbgrader = shutil.which("nbgrader") or "nbgrader"
    added = subprocess.run([nbgrader, "db", "assignment", "add", LAB, f"--duedate={DUE}"], cwd=course,
                           capture_output=True, text=True, timeout=300)
    assert added.returncode == 0, added.stdout + added.stderr
    source_nb = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    answers = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"), source_nb)
    for student, stamp in (("ada", "2025-03-01 12:00:00 UTC"), ("bob", LATE)):
        write_notebook(answers, course / "submitted" / student / LAB / f"{LAB}.ipynb")
        (course / "submitted" / student / LAB / "timestamp.txt").write_text(stamp)

    grade.grade_lab(course, LAB, progress=False)
    roster = tmp_path / "roster.csv"
    roster.write_text('student_id,Student,ID,SIS User ID,SIS Login ID,Section\nada,"Lovelace, Ada",101,S1,alove,A\n')
    out = course / "grading" / LAB
    assert grade.report_main(LAB, course, roster, "4242") == 1, "no export while the written answers wait for a TA"
    assert not (out / "canvas.csv").exists()

    assert grade.report_main(LAB, course, roster, "4242", force=True) == 0
    rows = {row["student"]: row for row in csv.DictReader((out / "grades.csv").read_text().splitlines())}
    assert all((rows[s]["q1_3_answer"], rows[s]["ungraded"], rows[s]["final_score"]) == ("", "q1_3_answer", "")
               for s in ("ada", "bob")), f"forced: the waiting answer is empty and marked, with no final score: {rows}"
    assert [row[-1] for row in csv.reader((out / "canvas.csv").read_text().splitlines())][2:] == ["", ""], \
        "forced: canvas.csv leaves a score that is not final empty"

    grade_written_answers(course, WRITTEN)
    final = AUTOGRADED + WRITTEN
    penalty = 0.3 * final  # of the final score: autograded and manual points
    assert feedback.main(LAB, course, ["ada", "bob"]) == 0  # before any report: it settles the penalties itself
    pages = {student: (course / "feedback" / student / LAB / f"{LAB}.html").read_text() for student in ("ada", "bob")}
    assert "Late submission penalty" in pages["bob"] and f"-{penalty:g}" in pages["bob"], \
        "feedback shows the penalty of the final score, also when made before --report"
    assert "Late submission penalty" not in pages["ada"]

    assert grade.report_main(LAB, course, roster, "4242") == 0
    rows = {row["student"]: row for row in csv.DictReader((out / "grades.csv").read_text().splitlines())}
    assert [rows[s]["total_score"] for s in ("ada", "bob")] == [f"{final:g}"] * 2, rows
    assert (rows["ada"]["late_penalty"], rows["ada"]["final_score"]) == ("0", f"{final:g}"), rows["ada"]
    assert (float(rows["bob"]["late_penalty"]), float(rows["bob"]["final_score"])) == pytest.approx(
        (penalty, final - penalty)), f"the late penalty applies to the final score: {rows['bob']}"
    assert list(csv.reader((out / "canvas.csv").read_text().splitlines())) == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 0 (4242)"],
        [POINTS_POSSIBLE, "", "", "", "", "7"],
        ["Lovelace, Ada", "101", "S1", "alove", "A", f"{final:g}"],
        ["bob", "", "", "bob", "", f"{final - penalty:g}"],
    ]



def grade_written_answers(course, points: float) -> None:
    """What a TA does in the formgrader: every submission's written answer gets ``points``."""
    from nbgrader.api import Gradebook

    from course.common.paths import course_directory

    with Gradebook(course_directory(course).db_url, course_id="efficient-ai") as gb:
        for student in ("ada", "bob"):
            cell = gb.find_grade("q1_3_answer", LAB, LAB, student)
            cell.manual_score, cell.needs_manual_grade = points, False
        gb.db.commit()
