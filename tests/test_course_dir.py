"""A course folder the project creates works with plain nbgrader commands, from any folder, or stops nbgrader.

nbgrader logs an exception raised in ``nbgrader_config.py`` and carries on with its stock settings, which show
hidden tests in feedback and grade without our guard and sandbox. The course tooling is an installed package
(``pip install -e .``, run by ``scripts/install.sh``), so a course folder outside the repository (the demo's
``demo/``, any ``--course-dir``) loads our settings; where they cannot load, every nbgrader command must stop.

These tests run nbgrader the way a TA does: ``nbgrader ...`` in the course folder, with none of the environment
that ``course.nbgrader_run`` adds (no PYTHONPATH, no EFFICIENT_AI_REPO).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixture_lab import LAB, built_root  # noqa: E402

from course.nbgrader_ext import GRADING_REPORT, hidden_test_lines
from course.nbgrader_run import make_course_dir
from course.notebooks import cells_by_grade_id, make_submission, read_notebook, replace_cell_source, write_notebook

CONFIG_FAILURE = "Exception while loading config file"
TAMPERED = "q1_1_add_tests"
LOGS: dict[str, str] = {}  # what each nbgrader command of the course_dir fixture wrote to stderr


def plain_env(**extra: str) -> dict[str, str]:
    """The TA's shell: no variables of ours, scale and plotting as grading sets them."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EFFICIENT_AI_REPO")}
    env.update(EFFICIENT_AI_SCALE="quick", MPLBACKEND="Agg",
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
    for args in (["generate_assignment", LAB, "--force"], ["autograde", LAB, "--force"],
                 ["generate_feedback", LAB, "--force"]):
        result = nbgrader(course, *args)
        LOGS[args[0]] = result.stderr
        assert result.returncode == 0 and CONFIG_FAILURE not in result.stderr, (
            f"plain `nbgrader {' '.join(args)}` must work in a course folder the project creates:\n"
            f"{result.stderr[-3000:]}")
    return course


def test_plain_autograde_in_a_course_folder_uses_our_grading(course_dir):
    report = course_dir / "autograded" / "alice" / LAB / GRADING_REPORT
    assert report.exists(), "plain nbgrader autograde must run our GuardedExecute (it writes grading_report.json)"
    assert json.loads(report.read_text())["guard"] == "", "the grading guard must be installed and answering"


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


def test_plain_feedback_names_questions_in_its_table_of_contents(course_dir):
    html = (course_dir / "feedback" / "alice" / LAB / f"{LAB}.html").read_text()
    toc = html.split('<div id="toc">', 1)[1].split("</div>", 1)[0]
    for label in ("Question 1.1: tests", "Question 1.2: tests", "Question 1.3: written answer", "Bonus 1.1: tests"):
        assert f'">{label}</a>' in toc, f"feedback's table of contents must name each question ({label!r}):\n{toc}"
    assert ">Test cell<" not in toc, f"no bare 'Test cell' links where a question has a name:\n{toc}"
    assert "Score:" in html.split('<div id="toc">', 1)[0], "the page still starts with the notebook's score"


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
