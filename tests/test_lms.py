"""The LMS in and out: Canvas's download sorted into submitted/ by plain ``nbgrader zip_collect`` with the pattern of
nbgrader_config.py, the documented Moodle and Blackboard patterns, and Canvas's gradebook import CSV."""
from __future__ import annotations

import csv
import re
import shutil
import subprocess
import zipfile

import pytest
from fixture_lab import LAB, make_root

from course import build
from course.lms import BLACKBOARD, CANVAS, MOODLE, POINTS_POSSIBLE, read_roster, write_canvas_csv
from course.nbgrader_run import make_course_dir

CANVAS_NAMES = {  # file in Canvas's "Download Submissions" zip -> (student id, notebook)
    "doejane_12345_6789012_lab1.ipynb": ("doejane", "lab1"),
    "doejane_LATE_12345_6789012_lab1.ipynb": ("doejane", "lab1"),
    "doejane_12345_6789012_lab1-1.ipynb": ("doejane", "lab1"),
    "smithjohnpaul_678_1234567_lab12-3.ipynb": ("smithjohnpaul", "lab12"),
}


@pytest.mark.parametrize("name, expected", sorted(CANVAS_NAMES.items()))
def test_canvas_pattern_names_the_student_and_the_notebook(name, expected):
    match = re.match(CANVAS, f"/course/downloaded/lab1/extracted/submissions/{name}")
    assert match and (match["student_id"], match["file_id"]) == expected, name


def test_moodle_and_blackboard_patterns_match_their_documented_names():
    for pattern, path, expected in (
        (MOODLE, "/d/Jane Doe_123456_assignsubmission_file_lab1.ipynb", ("Jane Doe", "lab1")),
        (MOODLE, "/d/Jane Doe_123456_assignsubmission_file_/lab1.ipynb", ("Jane Doe", "lab1")),
        (BLACKBOARD, "/d/Lab 1_jdoe_attempt_2025-03-01-23-59-59_lab1.ipynb", ("jdoe", "lab1")),
    ):
        match = re.match(pattern, path)
        assert match and (match["student_id"], match["file_id"]) == expected, path


def test_plain_zip_collect_sorts_a_canvas_download(tmp_path):
    """nbgrader itself has no pattern: this works only with the one the course's nbgrader_config.py sets."""
    root = make_root(tmp_path / "repo")
    assert build.main([LAB], root) == 0
    course = make_course_dir(tmp_path / "course", [LAB], root)
    release = (root / "release" / LAB / f"{LAB}.ipynb").read_bytes()
    archive = course / "downloaded" / LAB / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "submissions.zip", "w") as download:
        download.writestr(f"doejane_12345_6789012_{LAB}.ipynb", release)
        download.writestr(f"roebob_LATE_23456_7890123_{LAB}-1.ipynb", release.replace(b"YOUR", b"BOB'S"))
    result = subprocess.run([shutil.which("nbgrader") or "nbgrader", "zip_collect", LAB], cwd=course,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    found = sorted(p.relative_to(course / "submitted").as_posix() for p in (course / "submitted").rglob("*") if p.is_file())
    assert found == [f"doejane/{LAB}/{LAB}.ipynb", f"roebob/{LAB}/{LAB}.ipynb"], found
    assert (course / "submitted" / "doejane" / LAB / f"{LAB}.ipynb").read_bytes() == release
    assert b"BOB'S" in (course / "submitted" / "roebob" / LAB / f"{LAB}.ipynb").read_bytes()


def test_canvas_csv_has_canvas_columns_points_possible_and_roster_fields(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text('student_id,Student,ID,SIS User ID,SIS Login ID,Section,Notes\n'
                      'doejane,"Doe, Jane",12345,S001,jdoe,Section 1,ignored\n')
    path = tmp_path / "canvas.csv"
    write_canvas_csv(path, "lab1", {"doejane": 87.5, "roebob": 0.0}, 100.0, read_roster(roster), "4242")
    rows = list(csv.reader(path.read_text().splitlines()))
    assert rows == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 1 (4242)"],
        [POINTS_POSSIBLE, "", "", "", "", "100"],
        ["Doe, Jane", "12345", "S001", "jdoe", "Section 1", "87.5"],
        ["roebob", "", "", "roebob", "", "0"],  # not in the roster: the student id is the SIS Login ID
    ], rows
    roster.write_text("Student,ID\nx,1\n")
    with pytest.raises(ValueError, match="student_id"):
        read_roster(roster)

