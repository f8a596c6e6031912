"""The LMS in and out: Canvas's download sorted into submitted/ by plain ``nbgrader zip_collect`` with the pattern and
the collector of nbgrader_config.py (double uploads, zips, late markers), the documented Moodle and Blackboard
patterns, and Canvas's gradebook import CSV, from a real download to canvas.csv."""
from __future__ import annotations

import csv
import datetime
import io
import re
import shutil
import subprocess
import zipfile

import nbformat
import pytest
from fixture_lab import LAB, make_root

from course.cli import build, grade
from course.cli.nbgrader_run import make_course_dir
from course.common.fetch_cell import add_fetch_cell
from course.common.notebooks import make_submission, read_notebook
from course.common.paths import course_directory
from course.grader.lms import (
    BLACKBOARD,
    CANVAS,
    COLLECT_REPORT,
    MOODLE,
    POINTS_POSSIBLE,
    plan_collection,
    read_roster,
    write_canvas_csv,
)
from course.grader.scan import scan_notebook

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



def test_plan_keeps_the_newest_upload_and_files_a_zips_content_for_its_uploader_only(tmp_path):
    root = tmp_path / "extracted"
    files = ["submissions/doejane_12345_6789012_lab1.ipynb", "submissions/doejane_12345_6789099_lab1-2.ipynb",
             "submissions/doejane_12345_6789050_lab1-1.ipynb", "submissions/roebob_LATE_23456_7890123_lab1.ipynb",
             "submissions/eve_34567_8901234_lab1/lab1/lab1.ipynb",  # eve's zip, unpacked: her notebook
             "submissions/eve_34567_8901234_lab1/carol_45678_9012345_lab1.ipynb",  # ... and one named as carol's
             "submissions/eve_34567_8901234_lab1/__MACOSX/lab1/._lab1.ipynb", "submissions/notes.ipynb"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("{}")
    due = datetime.datetime(2025, 3, 1, 23, 59)
    plan = plan_collection(root, CANVAS, {"lab1"}, due + datetime.timedelta(seconds=1))
    filed = {path.split("/extracted/")[1]: found for path, found in plan.filed.items()}
    assert filed == {
        "submissions/doejane_12345_6789099_lab1-2.ipynb": {"student_id": "doejane", "file_id": "lab1", "timestamp": None},
        "submissions/eve_34567_8901234_lab1/lab1/lab1.ipynb": {"student_id": "eve", "file_id": "lab1", "timestamp": None},
        "submissions/roebob_LATE_23456_7890123_lab1.ipynb": {
            "student_id": "roebob", "file_id": "lab1", "timestamp": datetime.datetime(2025, 3, 1, 23, 59, 1)},
    }, "one file per student: the highest re-upload number; a zip's notebook for its uploader; late: the due date + 1 s"
    noted = {(student, file): what for student, file, what in plan.anomalies}
    assert sorted(noted) == [("", "submissions/notes.ipynb"), ("doejane", "submissions/doejane_12345_6789012_lab1.ipynb"),
                             ("doejane", "submissions/doejane_12345_6789050_lab1-1.ipynb"),
                             ("eve", "submissions/eve_34567_8901234_lab1/carol_45678_9012345_lab1.ipynb"),
                             ("roebob", "submissions/roebob_LATE_23456_7890123_lab1.ipynb")], noted
    assert "named as carol's submission: not filed" in noted["eve", "submissions/eve_34567_8901234_lab1/carol_45678_9012345_lab1.ipynb"]
    assert "an older upload" in noted["doejane", "submissions/doejane_12345_6789012_lab1.ipynb"]
    late = plan_collection(root, CANVAS, {"lab1"}, None).anomalies
    assert any("no due date" in what for student, _, what in late if student == "roebob"), \
        "a late marker without a due date in the gradebook is reported, not silently dropped"


def test_the_courses_own_fetch_cell_is_not_flagged(tmp_path):
    path = tmp_path / f"{LAB}.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    add_fetch_cell(path, "https://example.org/course/lab0.zip")
    nb = read_notebook(path)
    assert scan_notebook(nb) == [], "the fetch cell course build adds is the course's code, not the student's"
    nb.cells[0].source = nb.cells[0].source.replace("LAB_BUNDLE_URL, timeout", "LAB_BUNDLE_URL + __import__('os').sep, timeout")
    assert scan_notebook(nb), "an edited fetch cell is the student's code and is scanned"


def canvas_download(release: bytes, reference: bytes) -> bytes:
    """Canvas's "Download Submissions" zip of one lab: a double upload, a late one, a zip naming another student, a
    formula in a name (student ids: doejane, roebob, evemallory, =1+2)."""
    eve = io.BytesIO()
    with zipfile.ZipFile(eve, "w") as upload:
        upload.writestr(f"{LAB}/{LAB}.ipynb", reference)
        upload.writestr(f"carolking_45678_9012345_{LAB}.ipynb", reference)  # planted: carolking did not submit
    download = io.BytesIO()
    with zipfile.ZipFile(download, "w") as canvas:
        canvas.writestr(f"doejane_12345_6789012_{LAB}.ipynb", release)  # her first upload: blank
        canvas.writestr(f"doejane_12345_6789013_{LAB}-1.ipynb", reference)  # her re-upload
        canvas.writestr(f"roebob_LATE_23456_7890123_{LAB}.ipynb", reference)
        canvas.writestr(f"evemallory_34567_8901234_{LAB}.zip", eve.getvalue())
        canvas.writestr(f"=1+2_56789_0123456_{LAB}.ipynb", reference)
    return download.getvalue()


ROSTER = """student_id,Student,ID,SIS User ID,SIS Login ID,Section
doejane,"Doe, Jane",12345,S1,jdoe,A
roebob,"Roe, Bob",23456,S2,broe,A
evemallory,"=HYPERLINK(""http://evil.example"",""Mallory"")",34567,S3,emallory,A
carolking,"King, Carol",45678,S4,cking,A
"""


@pytest.mark.slow
def test_a_canvas_download_goes_to_canvas_csv_with_every_anomaly_reported(tmp_path, capsys):
    root = make_root(tmp_path / "repo")
    assert build.main([LAB], root) == 0
    course = make_course_dir(tmp_path / "course", [LAB], root)
    with (course / "nbgrader_config.py").open("a") as config:
        config.write('\nc.LateSubmissionPlugin.penalty_method = "percent_per_day"\n')
    nbgrader = shutil.which("nbgrader") or "nbgrader"
    added = subprocess.run([nbgrader, "db", "assignment", "add", LAB, "--duedate=2025-03-01 23:59:00 UTC"], cwd=course,
                           capture_output=True, text=True, timeout=300)
    assert added.returncode == 0, added.stdout + added.stderr
    release = root / "release" / LAB / f"{LAB}.ipynb"
    reference = make_submission(read_notebook(release), read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    (course / "downloaded" / LAB / "archive").mkdir(parents=True)
    (course / "downloaded" / LAB / "archive" / "submissions.zip").write_bytes(
        canvas_download(release.read_bytes(), nbformat.writes(reference).encode()))

    collected = subprocess.run([nbgrader, "zip_collect", LAB], cwd=course, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0, "one student's double upload must not stop the class:\n" + collected.stderr
    submitted = sorted(p.relative_to(course / "submitted").as_posix() for p in (course / "submitted").rglob("*")
                       if p.is_file())
    assert submitted == [f"=1+2/{LAB}/{LAB}.ipynb", f"doejane/{LAB}/{LAB}.ipynb", f"evemallory/{LAB}/{LAB}.ipynb",
                         f"roebob/{LAB}/{LAB}.ipynb", f"roebob/{LAB}/timestamp.txt"], \
        f"the zip's notebook named as carolking's is never filed as hers: {submitted}"
    assert (course / "submitted" / "roebob" / LAB / "timestamp.txt").read_text().startswith("2025-03-01 23:59:01"), \
        "Canvas's LATE marker becomes a timestamp 1 s after the due date"
    noted = {row["file"].rsplit("/", 1)[-1]: row for row in csv.DictReader(
        (course / "downloaded" / LAB / COLLECT_REPORT).read_text().splitlines())}
    assert set(noted) == {f"doejane_12345_6789012_{LAB}.ipynb", f"roebob_LATE_23456_7890123_{LAB}.ipynb",
                          f"carolking_45678_9012345_{LAB}.ipynb"}, noted
    assert noted[f"carolking_45678_9012345_{LAB}.ipynb"]["student"] == "evemallory"
    for row in noted.values():
        assert row["file"].split("/")[-1] in collected.stderr, "zip_collect's log names every file it left or marked"

    outcomes, _ = grade.grade_lab(course, LAB, progress=False)
    assert sorted(outcomes) == ["=1+2", "doejane", "evemallory", "roebob"]
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER)
    capsys.readouterr()
    assert grade.main(LAB, course, report_only=True, roster=roster) == 1, "no export while answers wait for a TA"
    refused = capsys.readouterr().out
    assert all(f"  {s}: q1_3_answer" in refused for s in outcomes) and "--force" in refused, refused
    assert not (course / "grading" / LAB / "canvas.csv").exists()
    exported = subprocess.run([nbgrader, "export"], cwd=course, capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    everyone = {row["student_id"]: row for row in csv.DictReader((course / "grades.csv").read_text().splitlines())}
    assert sorted(everyone) == ["'=1+2", "doejane", "evemallory", "roebob"], "nbgrader export neutralises names too"
    assert all((row["score"], row["ungraded"]) == ("", "yes") for row in everyone.values()), \
        f"nbgrader export shows no score while an answer waits for a TA: {everyone}"

    from nbgrader.api import Gradebook  # the TA grades the written answer in the formgrader
    with Gradebook(course_directory(course).db_url, course_id="efficient-ai") as gb:
        for student in outcomes:
            cell = gb.find_grade("q1_3_answer", LAB, LAB, student)
            cell.manual_score, cell.needs_manual_grade = 2.0, False
        gb.db.commit()
    assert grade.main(LAB, course, report_only=True, roster=roster, canvas_assignment_id="4242") == 0
    printed = capsys.readouterr().out
    assert "1 student(s) without a submission" in printed and "carolking" in printed, printed
    assert "1 graded student(s) not on the roster" in printed and "=1+2" in printed, printed
    rows = list(csv.reader((course / "grading" / LAB / "canvas.csv").read_text().splitlines()))
    assert rows == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 0 (4242)"],
        [POINTS_POSSIBLE, "", "", "", "", "7"],
        ["'=1+2", "", "", "'=1+2", "", "8"],  # not on the roster: by student id, neutralised
        ["King, Carol", "45678", "S4", "cking", "A", ""],  # no submission: empty, Canvas keeps its grade
        ["Doe, Jane", "12345", "S1", "jdoe", "A", "8"],  # her newer upload, the reference: 6 + 2 written
        ["'=HYPERLINK(\"http://evil.example\",\"Mallory\")", "34567", "S3", "emallory", "A", "8"],
        ["Roe, Bob", "23456", "S2", "broe", "A", "7.2"],  # 1 s late: 10 % of the final 8 points
    ], rows
