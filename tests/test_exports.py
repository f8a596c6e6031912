"""What the course's CSV files say, without nbgrader: no cell a student or a roster controls runs as a spreadsheet
formula (OWASP's CSV injection), an answer waiting for a TA is never written as 0, and no final score exists for it
(grades.csv, canvas.csv). tests/test_lms.py and tests/test_late.py grade for real."""
from __future__ import annotations

import csv
import re

import pytest

from course.cli import report
from course.common.outcome import Outcome
from course.common.quoting import escape_controls
from course.common.scores import CellScore, SubmissionScores
from course.common.spreadsheet import read_cell, safe_cell
from course.grader.lms import POINTS_POSSIBLE, plan_collection, read_roster, write_canvas_csv, write_collect_report

FORMULAS = ["=1+2", "+1", "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)", "\t=1", "\r=1", '=HYPERLINK("http://x.example","a")']
HOSTILE = [*FORMULAS, "ok;=1+2", "a, -1", "x\n@A1", "'quoted", "''=1", "plain", "", "don't", "a;'b"]
# A cell starts where a spreadsheet may start one: the field's start, or after a separator it may split on.
CELL_START = re.compile(r"(?:^|[,;\t\r\n]) *([=+\-@\t\r])")


def formula_cells(rows: list[list[str]]) -> list[str]:
    """The cells of parsed CSV rows that a spreadsheet could read as a formula, anywhere a cell can start."""
    return [value for row in rows for value in row if CELL_START.search(value)]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_neutralised_cell_starts_no_formula_and_reads_back(text):
    cell = safe_cell(text)
    assert not CELL_START.search(cell), f"{cell!r}: a formula character still starts a cell"
    assert read_cell(cell) == text, f"{text!r} -> {cell!r} must read back as written"
    assert safe_cell("plain text") == "plain text" and safe_cell(2.5) == "2.5" and safe_cell(None) == ""


def test_grades_csv_neutralises_student_text_and_reads_it_back(tmp_path):
    outcomes = {name: Outcome(name, "ok", reason=f"because {name}", notes=[name, "x;=1+2"], flags=[f"cell 1: {name}"])
                for name in FORMULAS}
    scores = {name: SubmissionScores(name, {"q1_tests": CellScore("q1_tests", 3, 3, None, False, True)})
              for name in FORMULAS}
    path = tmp_path / "grades.csv"
    report.write_grades_csv(path, "lab0", outcomes, scores)
    rows = list(csv.reader(path.read_text().splitlines()))
    assert not formula_cells(rows), f"grades.csv must start no formula: {formula_cells(rows)}"
    kept = report.previous_outcomes(path, "lab0")
    written = {escape_controls(name): name for name in FORMULAS}  # control characters are shown escaped (\\t)
    assert sorted(kept) == sorted(written), "grades.csv must give back the student ids it was written with"
    assert all(kept[shown].notes == [shown, "x;=1+2"] for shown in written), kept


def test_canvas_csv_neutralises_roster_fields_and_student_ids(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text('student_id,Student,ID,SIS User ID,SIS Login ID,Section\n'
                      'doejane,"=HYPERLINK(""http://x.example"",""Doe"")",12345,@S001,+jdoe,-A\n')
    path = tmp_path / "canvas.csv"
    write_canvas_csv(path, "lab1", {"doejane": 87.5, "=1+2": 3.0}, 100.0, read_roster(roster), "4242")
    rows = list(csv.reader(path.read_text().splitlines()))
    assert not formula_cells(rows), f"canvas.csv must start no formula: {formula_cells(rows)}"
    assert rows[2:] == [["'=1+2", "", "", "'=1+2", "", "3"],  # not on the roster: the student id names the student
                        ["'=HYPERLINK(\"http://x.example\",\"Doe\")", "12345", "'@S001", "'+jdoe", "'-A", "87.5"]], rows


def test_collect_report_neutralises_names_from_the_download(tmp_path):
    (tmp_path / "extracted").mkdir()
    (tmp_path / "extracted" / "=cmd|' -c calc'!A0.ipynb").write_text("{}")
    plan = plan_collection(tmp_path / "extracted", r".*/(?P<student_id>x)_(?P<file_id>y)\.ipynb$", {"lab1"}, None)
    write_collect_report(tmp_path / "collect_report.csv", plan)
    rows = list(csv.reader((tmp_path / "collect_report.csv").read_text().splitlines()))
    assert len(rows) == 2 and not formula_cells(rows), rows


def written_answer(score: float | None) -> CellScore:
    return CellScore("q1_3_answer", 2, None, score, score is None, False)


def test_an_answer_waiting_for_a_ta_is_empty_and_leaves_no_final_score(tmp_path):
    tests = CellScore("q1_1_add_tests", 3, 3, None, False, True)
    scores = {"ada": SubmissionScores("ada", {"q1_1_add_tests": tests, "q1_3_answer": written_answer(None)}),
              "bob": SubmissionScores("bob", {"q1_1_add_tests": tests, "q1_3_answer": written_answer(1.5)})}
    outcomes = {s: Outcome(s, "ok") for s in ("ada", "bob", "cy")}
    outcomes["cy"].status = report.NO_SUBMISSION
    path = tmp_path / "grades.csv"
    report.write_grades_csv(path, "lab0", outcomes, scores, {"bob": 0.5}, {"ada": ["q1_3_answer"]})
    rows = {row["student"]: row for row in csv.DictReader(path.read_text().splitlines())}
    assert rows["ada"]["q1_3_answer"] == "", "an answer waiting for a TA is empty, never 0"
    assert (rows["ada"]["ungraded"], rows["ada"]["final_score"], rows["ada"]["late_penalty"]) == ("q1_3_answer", "", ""), \
        f"a submission with an answer waiting has no final score, and says which cells wait: {rows['ada']}"
    assert (rows["bob"]["q1_3_answer"], rows["bob"]["final_score"], rows["bob"]["ungraded"]) == ("1.5", "4", ""), rows["bob"]
    assert rows["cy"]["final_score"] == "" and rows["cy"]["status"] == report.NO_SUBMISSION, rows["cy"]
    assert "cy" not in report.previous_outcomes(path, "lab0"), "a roster's non-submitter is not a graded student"

    finals = report.final_scores(outcomes, scores, {"bob": 0.5}, {"ada": ["q1_3_answer"]})
    canvas = tmp_path / "canvas.csv"
    write_canvas_csv(canvas, "lab0", finals, 7.0)
    assert list(csv.reader(canvas.read_text().splitlines()))[1:] == [
        [POINTS_POSSIBLE, "", "", "", "", "7"],
        ["ada", "", "", "ada", "", ""],  # waiting for a TA: left empty, Canvas keeps its grade
        ["bob", "", "", "bob", "", "4"],
        ["cy", "", "", "cy", "", ""],  # no submission: left empty
    ]
