"""A course folder the project creates works with plain nbgrader commands, from any folder, or stops nbgrader.

nbgrader logs an exception raised in ``nbgrader_config.py`` and carries on with its stock settings, which show
hidden tests in feedback and grade without our guard and sandbox. The course tooling is an installed package
(``pip install -e .``, run by ``scripts/install.sh``), so a course folder outside the repository (the demo's
``demo/``, any ``--course-dir``) loads our settings; where they cannot load, every nbgrader command must stop.

These tests run nbgrader the way a TA does: ``nbgrader ...`` in the course folder, with none of the environment
that ``course.cli.nbgrader_run`` adds (no PYTHONPATH).
"""
from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_lab import LAB, built_root  # noqa: E402

from course.cli.nbgrader_run import make_course_dir
from course.common.grading_result import RESULT_FILE
from course.common.notebooks import (
    BONUS_POINTS,
    COURSE_METADATA,
    cell_points,
    cells_by_grade_id,
    is_bonus_cell,
    is_graded,
    make_submission,
    read_notebook,
    replace_cell_source,
    write_notebook,
)
from course.common.paths import course_directory
from course.common.scores import read_scores
from course.grader.nbgrader_ext import hidden_test_lines

CONFIG_FAILURE = "Exception while loading config file"
TAMPERED = "q1_1_add_tests"
BONUS_TEST = "b1_1_square_tests"  # the fixture's bonus question (1 point on top of the core 7)
CORE_ANSWERS = {"q1_1_add", "q1_2_scale", "q1_3_answer"}
LOGS: dict[str, str] = {}  # what each nbgrader command of the course_dir fixture wrote to stderr


def plain_env(**extra: str) -> dict[str, str]:
    """The TA's shell: no variables of ours (a GPU machine's student default scale, teaching, left set), plotting
    headless."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(EFFICIENT_AI_SCALE="teaching", MPLBACKEND="Agg",
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    env.update(extra)
    return env


def nbgrader(course: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The `nbgrader` entry point of this environment, as a TA types it (not `python -m`, which adds the cwd).
    exe = Path(sys.executable).with_name("nbgrader")
    return subprocess.run([str(exe), *args], cwd=course, env=env or plain_env(), capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory) -> Path:
    """A course folder outside the repository, with the reference submission of the fixture lab graded."""
    installed = subprocess.run([sys.executable, "-I", "-c", "import course"], cwd="/", capture_output=True)
    assert installed.returncode == 0, (
        "the course tooling must be installed in this environment (scripts/install.sh runs `pip install -e .`): "
        "nbgrader loads it from any course folder")
    root = built_root(tmp_path_factory.mktemp("repo"))
    course = make_course_dir(tmp_path_factory.mktemp("elsewhere") / "course", [LAB], root)
    source = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    reference = make_submission(release, source)
    write_notebook(reference, course / "submitted" / "alice" / LAB / f"{LAB}.ipynb")
    # mallory edited a locked test cell: the one change nbgrader must warn about (and undo).
    tampered = replace_cell_source(reference, TAMPERED, cells_by_grade_id(reference)[TAMPERED].source + "\npass")
    write_notebook(tampered, course / "submitted" / "mallory" / LAB / f"{LAB}.ipynb")
    # eve gave the bonus test 50 points in her notebook's metadata (nbgrader's and the course's): she gains nothing.
    greedy = copy.deepcopy(reference)
    bonus_cell = cells_by_grade_id(greedy)[BONUS_TEST]
    bonus_cell.metadata["nbgrader"]["points"] = 50
    bonus_cell.metadata[COURSE_METADATA] = {BONUS_POINTS: 50}
    write_notebook(greedy, course / "submitted" / "eve" / LAB / f"{LAB}.ipynb")
    # carol's answer reads the scale where the tests call it, in the grading kernel: grading runs at quick scale on
    # every route, whatever the TA's shell sets.
    checks_scale = replace_cell_source(reference, "q1_2_scale", (
        "def scale(x, factor_per_unit):\n    import os\n"
        "    assert os.environ.get('EFFICIENT_AI_SCALE') == 'quick', 'the grading kernel must run at quick scale'\n"
        "    return x * factor_per_unit\n"))
    write_notebook(checks_scale, course / "submitted" / "carol" / LAB / f"{LAB}.ipynb")
    # bob left the bonus question as released: its test fails.
    write_notebook(make_submission(release, source, CORE_ANSWERS), course / "submitted" / "bob" / LAB / f"{LAB}.ipynb")
    for args in (["generate_assignment", LAB, "--force"], ["autograde", LAB, "--force"],
                 ["generate_feedback", LAB, "--force"]):
        result = nbgrader(course, *args)
        LOGS[args[0]] = result.stderr
        assert result.returncode == 0 and CONFIG_FAILURE not in result.stderr, (
            f"plain `nbgrader {' '.join(args)}` must work in a course folder the project creates:\n"
            f"{result.stderr[-3000:]}")
    return course


def test_plain_autograde_in_a_course_folder_uses_our_grading(course_dir):
    report = course_dir / "autograded" / "alice" / LAB / RESULT_FILE
    assert report.exists(), "plain nbgrader autograde must run our GuardedExecute (it writes grading_result.json)"
    assert json.loads(report.read_text())["guard"] == "", "the grading guard must be installed and answering"


def test_plain_autograde_runs_the_kernel_at_quick_scale(course_dir):
    scores = read_scores(course_dir, LAB)
    assert scores["carol"].cells["q1_2_scale_tests"].auto_score == 2, (
        "plain nbgrader autograde must run grading kernels at quick scale (EFFICIENT_AI_SCALE=quick) even when the "
        "TA's shell sets another scale")


def test_autograde_warns_about_edited_locked_cells_only(course_dir):
    warned = [line for line in LOGS["autograde"].splitlines() if "Attribute 'checksum'" in line]
    assert len(warned) == 1 and f"cell {TAMPERED} has changed" in warned[0], (
        "nbgrader must warn about the one locked cell a student edited, and not about hidden-test cells submitted as "
        f"released (jupyter/nbgrader#1961): {warned}")


def test_plain_feedback_in_a_course_folder_shows_no_hidden_test(course_dir):
    source = read_notebook(course_dir / "source" / LAB / f"{LAB}.ipynb")
    hidden = [line.strip() for cell in source.cells for line in hidden_test_lines(cell.source) if line.strip()]
    assert hidden, "the fixture lab must have hidden tests for this test to mean anything"
    html = (course_dir / "feedback" / "alice" / LAB / f"{LAB}.html").read_text()
    shown = [line for line in hidden if line in html]
    assert shown == [], f"feedback generated by plain nbgrader in a course folder shows hidden test lines: {shown}"


def test_plain_feedback_opens_with_one_row_per_question(course_dir):
    html = (course_dir / "feedback" / "alice" / LAB / f"{LAB}.html").read_text()
    table = html.split('<table class="table table-condensed" id="questions">', 1)[1].split("</table>", 1)[0]
    rows = [row for row in table.split("<tr>")[2:]]  # after the header row
    labels = [row.split('">', 1)[1].split("</a>", 1)[0] for row in rows if '<a href="#' in row]
    assert labels == ["Question 1.1", "Question 1.2", "Question 1.3", "Bonus 1.1"], (
        f"one row per question, in the lab's order, each linking to its cell:\n{table}")
    assert ">Test cell<" not in html.split('<div class="panel-body">', 1)[0], "no bare 'Test cell' links"
    assert "Score:" in html.split('<div id="toc">', 1)[0], "the page still starts with the notebook's score"
    cells = lambda row: [part.split("</td>", 1)[0].strip() for part in row.split("<td>")[1:]]  # noqa: E731
    bonus = cells(rows[3])
    assert bonus[1:4] == ["", "", "1.0 / 1.0"], f"a passed bonus test reads out of its bonus points: {bonus}"
    written = cells(rows[2])
    assert written[2].endswith("/ 2.0") and written[1] == "", f"a written answer is in the TA's column: {written}"


def _bonus_grade(course: Path, student: str):
    from nbgrader.api import Gradebook

    with Gradebook(course_directory(course).db_url) as gb:
        grade = gb.find_grade(BONUS_TEST, LAB, LAB, student)
        return grade.auto_score, grade.extra_credit, grade.max_score, grade.score


def test_bonus_points_count_on_top_of_the_core_maximum(course_dir, tmp_path):
    """nbgrader's own totals (its API, `nbgrader export`) read as the lab states them: out of the core points, a passed
    bonus test's points on top as extra credit; our read_scores agrees."""
    from nbgrader.api import Gradebook

    source = read_notebook(course_dir / "source" / LAB / f"{LAB}.ipynb")
    core = sum(cell_points(c) for c in source.cells if is_graded(c) and not is_bonus_cell(c))
    assert core == 7 and cell_points(cells_by_grade_id(source)[BONUS_TEST]) == 1
    with Gradebook(course_directory(course_dir).db_url) as gb:
        assert gb.find_assignment(LAB).max_score == core, "nbgrader's maximum of the lab is its core total"
        alice = gb.find_submission(LAB, "alice")
        assert (alice.max_score, alice.score) == (core, 6), "reference: 3 + 2 autograded + 1 bonus (the answer ungraded)"
    assert _bonus_grade(course_dir, "alice") == (0, 1, 0, 1), "a passed bonus test: its point as extra credit"
    out = tmp_path / "export.csv"
    result = nbgrader(course_dir, "export", "--to", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {row["student_id"]: row for row in csv.DictReader(out.open())}
    # The written answer still waits for a TA: the export gives the points so far as raw_score, never a final score.
    for student, points in (("alice", 6), ("bob", 5)):
        row = rows[student]
        assert (float(row["raw_score"]), float(row["max_score"])) == (points, core), row
        assert (row["score"], row["ungraded"]) == ("", "yes"), f"{student}: an ungraded answer leaves no final score"
    scores = read_scores(course_dir, LAB)
    assert (scores["alice"].total_score(), scores["alice"].total_max(), scores["alice"].bonus_max()) == (6, core, 1)
    assert scores["alice"].cells[BONUS_TEST].max_score == 1 and scores["alice"].cells[BONUS_TEST].bonus


def test_bonus_points_come_from_the_course_never_from_the_submission(course_dir):
    assert _bonus_grade(course_dir, "eve") == (0, 1, 0, 1), (
        "a student who gives a bonus test 50 points in her notebook's metadata must earn its 1 point")
    assert read_scores(course_dir, LAB)["eve"].total_score() == 6


def test_a_failed_bonus_test_earns_no_extra_credit_and_a_regrade_overwrites_it(course_dir):
    assert _bonus_grade(course_dir, "bob") == (0, 0, 0, 0), "a failed bonus test earns no extra credit"
    # bob's bonus answer arrives: a re-grade gives him the point; then mallory's earlier point goes with her answer.
    source = read_notebook(course_dir / "source" / LAB / f"{LAB}.ipynb")
    release = read_notebook(course_dir / "release" / LAB / f"{LAB}.ipynb")  # generate_assignment wrote it
    write_notebook(make_submission(release, source), course_dir / "submitted" / "bob" / LAB / f"{LAB}.ipynb")
    assert _bonus_grade(course_dir, "mallory")[1] == 1
    write_notebook(make_submission(release, source, CORE_ANSWERS),
                   course_dir / "submitted" / "mallory" / LAB / f"{LAB}.ipynb")
    for student in ("bob", "mallory"):
        result = nbgrader(course_dir, "autograde", LAB, "--student", student, "--force")
        assert result.returncode == 0, result.stderr[-2000:]
    assert _bonus_grade(course_dir, "bob") == (0, 1, 0, 1), "a re-grade that passes the bonus test awards it"
    assert _bonus_grade(course_dir, "mallory") == (0, 0, 0, 0), "a re-grade that fails it takes the earlier bonus back"


def test_nbgrader_stops_when_the_course_settings_cannot_load(course_dir, tmp_path):
    # A `course` package that fails to import, found before the installed one: the settings cannot load.
    broken = tmp_path / "shadow" / "course"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('simulated: the course tooling is missing')\n")
    env = plain_env(PYTHONPATH=str(broken.parent))
    before = (course_dir / "autograded" / "alice" / LAB / f"{LAB}.ipynb").stat().st_mtime_ns
    for args in (["autograde", LAB, "--force"], ["generate_feedback", LAB, "--force"]):
        result = nbgrader(course_dir, *args, env=env)
        assert result.returncode != 0, f"`nbgrader {args[0]}` must fail when the course settings cannot load"
        assert "could not load the Efficient AI course settings" in result.stderr + result.stdout, (
            f"the error must say why nbgrader stopped:\n{(result.stderr + result.stdout)[-2000:]}")
    after = (course_dir / "autograded" / "alice" / LAB / f"{LAB}.ipynb").stat().st_mtime_ns
    assert after == before, "nbgrader must stop before grading anything with its stock settings"


def test_read_scores_agrees_with_nbgrader_grade_by_grade(course_dir, tmp_path):
    """read_scores reads the gradebook in two queries; every value must be what nbgrader's own objects say of each
    grade (its score and maximum, manual and extra-credit points a TA entered included), a bonus cell's maximum the
    course's, and each submission's cells in the order of the lab's notebook."""
    import shutil

    from nbgrader.api import Gradebook

    from course.common.scores import is_autograded_grade

    course = shutil.copytree(course_dir, tmp_path / "course")  # the module's course stays as the other tests left it
    written = "q1_3_answer"
    with Gradebook(course_directory(course).db_url) as gb:  # a TA grades alice's written answer in the formgrader
        grade = gb.find_grade(written, LAB, LAB, "alice")
        grade.manual_score, grade.extra_credit = 1.5, 0.25
        gb.db.commit()
    scores = read_scores(course, LAB)
    source = read_notebook(course / "source" / LAB / f"{LAB}.ipynb")
    order = [gid for gid in cells_by_grade_id(source) if is_graded(cells_by_grade_id(source)[gid])]
    with Gradebook(course_directory(course).db_url) as gb:
        students = {submission.student.id for submission in gb.find_assignment(LAB).submissions}
        assert set(scores) == students, "one entry per submission in the gradebook"
        for student in students:
            grades = {grade.name: grade for grade in gb.find_submission_notebook(LAB, LAB, student).grades}
            cells = scores[student].cells
            assert list(cells) == [gid for gid in order if gid in grades], (
                f"{student}'s cells must come in the notebook's order and be exactly the gradebook's")
            for gid, grade in grades.items():
                cell = cells[gid]
                bonus = is_bonus_cell(cells_by_grade_id(source)[gid])
                assert (cell.score, cell.auto_score, cell.manual_score, cell.extra_credit, cell.needs_manual_grade,
                        cell.autograded, cell.bonus) == (
                    grade.score, grade.auto_score, grade.manual_score, grade.extra_credit, grade.needs_manual_grade,
                    is_autograded_grade(grade), bonus), f"{student}'s {gid} must read as nbgrader's grade has it"
                expected_max = cell_points(cells_by_grade_id(source)[gid]) if bonus else grade.max_score
                assert cell.max_score == expected_max, f"{gid}'s maximum: {cell.max_score} != {expected_max}"
    assert scores["alice"].cells[written].score == 1.75, "a TA's manual points and extra credit count"
    assert read_scores(course, LAB, ["alice", "nobody"]).keys() == {"alice"}, "only the students asked for"
    assert read_scores(course, "no-such-lab") == {}, "a lab the gradebook does not have reads as no submissions"
