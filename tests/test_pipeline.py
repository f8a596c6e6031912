"""The course pipeline on a tiny fixture lab: build idempotence, every lint rule, check and grade."""
from __future__ import annotations

import csv
import json
import os
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from fixture_lab import FIXTURE, LAB, README, make_root  # noqa: E402

from course.cli import build, check, grade, lint
from course.cli.nbgrader_run import GradingProcess, make_course_dir
from course.common.job import WorkerSlot
from course.common.notebooks import (
    BONUS_POINTS,
    COURSE_METADATA,
    cell_points,
    make_submission,
    read_notebook,
    write_notebook,
)
from course.common.speed import SPEED_ENV


@pytest.fixture(scope="module")
def built_root(tmp_path_factory) -> Path:
    root = make_root(tmp_path_factory.mktemp("built"))
    assert build.main([LAB], root) == 0
    return root


@pytest.fixture
def root(built_root, tmp_path) -> Path:
    """A private copy of the built fixture repository, free to break."""
    copy = tmp_path / "repo"
    shutil.copytree(built_root, copy)
    return copy


def problems_of(root: Path) -> list[str]:
    return [str(p) for p in lint.lint_lab(LAB, root, check_fresh=False)]


def edit_source(root: Path, edit) -> None:
    path = root / "source" / LAB / f"{LAB}.ipynb"
    nb = read_notebook(path)
    edit(nb)
    write_notebook(nb, path)


def cell(nb, gid):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def test_build_makes_a_self_contained_release(built_root):
    release = built_root / "release" / LAB
    assert (release / f"{LAB}.ipynb").exists(), "the release notebook must be generated"
    assert (release / "utils.py").read_text() == (built_root / "utils.py").read_text(), "release must carry utils.py"
    assert (release / "assets" / "figure.png").exists(), "release must carry assets/"
    text = (release / f"{LAB}.ipynb").read_text()
    assert "raise NotImplementedError()" in text and "return a + b" not in text, "solutions must be stubbed"
    assert "add(-40, 17)" not in text, "hidden tests must be removed from the release"
    lock = (built_root / "labs" / LAB / "grade_ids.lock").read_text()
    assert "q1_1_add_tests" in lock, "build must record the grade ids"


def test_build_takes_bonus_points_out_of_nbgraders_maximum(built_root):
    """The author writes a bonus cell's real points; nbgrader's copy says 0 (the lab is out of its core points) and
    the course keeps the bonus points beside it."""
    assert '"grade_id": "b1_1_square_tests", "locked": true, "points": 1' in (built_root / "labs" / LAB / f"{LAB}.py").read_text()
    for tree in ("source", "release"):
        nb = read_notebook(built_root / tree / LAB / f"{LAB}.ipynb")
        bonus = cell(nb, "b1_1_square_tests")
        assert bonus.metadata.nbgrader["points"] == 0 and bonus.metadata[COURSE_METADATA] == {BONUS_POINTS: 1}, tree
        assert cell_points(bonus) == 1 and cell_points(cell(nb, "q1_1_add_tests")) == 3
        assert sum(c.metadata.nbgrader.get("points", 0) for c in nb.cells if "nbgrader" in c.metadata) == 7, tree


def test_build_twice_changes_nothing(root):
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert build.build_lab(LAB, root) == [], "a second build must not rewrite any file"
    assert build.record_grade_ids(LAB, root) == []
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert before == after


def test_build_follows_an_edit(root):
    text_path = root / "labs" / LAB / f"{LAB}.py"
    text_path.write_text(text_path.read_text().replace("Write `add(a, b)`.", "Write `add(a, b)` for ints."))
    changed = {p.relative_to(root).as_posix() for p in build.build_lab(LAB, root)}
    assert changed == {f"source/{LAB}/{LAB}.ipynb", f"release/{LAB}/{LAB}.ipynb"}


def test_build_sets_aside_files_it_did_not_write(root, capsys):
    """A student who worked inside release/ loses nothing to a rebuild, and is told where the files went."""
    work = root / "release" / LAB / "my_answers.ipynb"
    work.write_text("{}")
    build.build_lab(LAB, root)
    kept = root / build.SET_ASIDE_DIR / LAB / "my_answers.ipynb"
    assert not work.exists(), "the release must hold only what the build writes"
    assert kept.read_text() == "{}", "a file the build did not write must be moved aside, never deleted"
    assert str(kept) in capsys.readouterr().out, "the build must say where it moved the file"


def test_what_jupyter_and_python_leave_in_a_lab_folder_is_no_part_of_it(root):
    """An instructor who opened source/ or release/ in JupyterLab (checkpoints) or imported utils.py there
    (``__pycache__``) gets no stale-lab problem, and a rebuild neither copies nor sets aside any of it."""
    for tree in ("source", "release"):
        for cache in (f".ipynb_checkpoints/{LAB}-checkpoint.ipynb", "__pycache__/utils.cpython-311.pyc"):
            (root / tree / LAB / cache).parent.mkdir(exist_ok=True)
            (root / tree / LAB / cache).write_text("{}")
    assert lint.check_up_to_date(LAB, root) == []
    assert build.build_lab(LAB, root) == [], "a rebuild changes nothing"
    assert (root / "release" / LAB / ".ipynb_checkpoints" / f"{LAB}-checkpoint.ipynb").exists()
    assert not (root / build.SET_ASIDE_DIR).exists(), "nothing is set aside"


def test_clean_fixture_passes_lint(root):
    assert lint.lint_lab(LAB, root, check_fresh=True) == []


def test_lint_flags_stale_source_and_release(root):
    text_path = root / "labs" / LAB / f"{LAB}.py"
    text_path.write_text(text_path.read_text().replace("return a + b", "return b + a"))
    messages = [str(p) for p in lint.check_up_to_date(LAB, root)]
    assert messages == [f"{LAB}: source: out of date with labs/ and utils.py ({LAB}.ipynb): run `python -m course build {LAB}`"]
    (root / "utils.py").write_text("SCALE = 'teaching'\n")
    messages = [str(p) for p in lint.check_up_to_date(LAB, root)]
    assert any("source: out of date" in m and "utils.py" in m for m in messages), messages
    assert any("release: out of date" in m and "utils.py" in m for m in messages), messages


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda nb: cell(nb, "q1_1_add").metadata.nbgrader.pop("schema_version"), "cell 3 (q1_1_add): nbgrader metadata lacks schema_version"),
        (lambda nb: cell(nb, "q1_2_scale").metadata.nbgrader.update(grade_id="q1_1_add"), "grade id 'q1_1_add' is also used by cell 3"),
        (lambda nb: cell(nb, "q1_2_scale_tests").metadata.nbgrader.update(points=0), "(q1_2_scale_tests): graded cell has no points"),
        (lambda nb: cell(nb, "q1_2_scale_tests").metadata.nbgrader.update(points=4), "Question 1.2 heading says 2 points, its graded cells' metadata sums to 4"),
        (lambda nb: cell(nb, "q1_1_add_tests").metadata.nbgrader.update(grade_id="add_tests"), "graded cell id 'add_tests' names no question"),
        (lambda nb: setattr(nb.cells[0], "source", nb.cells[0].source.replace("| Question 1.2 | scale | 2 |", "| Question 1.2 | scale | 3 |")), "Question 1.2 lists 3 points, its heading says 2"),
        (lambda nb: setattr(nb.cells[0], "source", nb.cells[0].source.replace("**7 + 1 bonus**", "**8 + 1 bonus**")), "total row must read **7 + 1 bonus**"),
        (lambda nb: setattr(cell(nb, "q1_1_add_tests"), "source", cell(nb, "q1_1_add_tests").source + "\nadd(1, 1)"), "(q1_1_add_tests): test cell ends in an expression"),
        (lambda nb: setattr(cell(nb, "q1_2_scale"), "source", cell(nb, "q1_2_scale").source.replace("    ### END SOLUTION", "")), "(q1_2_scale): unbalanced '### BEGIN SOLUTION'"),
        (lambda nb: setattr(cell(nb, "q1_2_scale"), "source", cell(nb, "q1_2_scale").source.replace("q1_1", "x")), None),
        (lambda nb: cell(nb, "b1_1_square_tests").metadata.nbgrader.update(points=1), "(b1_1_square_tests): bonus cell must have nbgrader points 0"),
        (lambda nb: cell(nb, "q1_2_scale_tests").metadata.update({COURSE_METADATA: {BONUS_POINTS: 2}}), "(q1_2_scale_tests): only bonus cells"),
    ],
    ids=["schema", "duplicate-id", "no-points", "heading-vs-metadata", "id-names-no-question", "table-row", "table-total",
         "bare-expression", "unbalanced-markers", "harmless-edit", "bonus-in-nbgrader-points", "bonus-on-core-cell"],
)
def test_each_lint_rule_names_the_cell(root, edit, expected):
    edit_source(root, edit)
    problems = problems_of(root)
    if expected is None:
        assert problems == [], problems
    else:
        assert any(expected in p for p in problems), f"expected a problem containing {expected!r}, got {problems}"


def test_lint_flags_a_heading_without_graded_cells(root):
    edit_source(root, lambda nb: nb.cells.insert(2, nbformat.v4.new_markdown_cell("#### Question 9.9 (4 points)")))
    assert any("Question 9.9 heading has no graded cell" in p for p in problems_of(root))


def test_lint_flags_readme_total(root):
    (root / "README.md").write_text(README.replace("7 + 1 bonus", "7"))
    assert any("README.md: the Lab 0 row must state its total '7 + 1 bonus'" in p for p in problems_of(root))


def test_lint_flags_solution_and_hidden_test_leaks(root):
    path = root / "release" / LAB / f"{LAB}.ipynb"
    nb = read_notebook(path)
    cell(nb, "q1_1_add").source = "def add(a, b):\n    return a + b  # noqa"
    cell(nb, "q1_1_add_tests").source += '\nassert add(-40, 17) == -23, "add(-40, 17) must be -23"'
    cell(nb, "q1_2_scale").source += "\n### END SOLUTION"
    write_notebook(nb, path)
    problems = problems_of(root)
    assert any("shows a line of the solution or hidden tests: 'assert add(-40, 17) == -23" in p for p in problems), problems
    assert any("contains the delimiter '### END SOLUTION'" in p for p in problems), problems


def test_lint_flags_a_question_swallowed_by_an_answer_cell(tmp_path):
    """A forgotten `# %% [markdown]` line puts the next question's statement into the answer cell above it; the
    release replaces that cell with a stub, so students never see the question."""
    text = FIXTURE.read_text()
    marker = "# %% [markdown]\n# #### Bonus 1.1 (1 points)"
    assert marker in text
    root = make_root(tmp_path / "repo", text.replace(marker, "# #### Bonus 1.1 (1 points)"))
    assert build.main([LAB], root) == 0
    problems = problems_of(root)
    assert any("(q1_3_answer): Bonus 1.1 ('#### Bonus 1.1 (1 points)') sits inside a solution cell" in p for p in problems), problems
    assert f"{LAB}: release: Bonus 1.1 has no heading in the release notebook: students do not see the question" in problems, problems


def test_lint_flags_a_heading_missing_from_the_release(root):
    path = root / "release" / LAB / f"{LAB}.ipynb"
    nb = read_notebook(path)
    heading = next(c for c in nb.cells if "#### Question 1.2" in c.source)
    heading.source = heading.source.replace("#### Question 1.2 (2 points)", "Question 1.2")
    write_notebook(nb, path)
    assert problems_of(root) == [f"{LAB}: release: Question 1.2 has no heading in the release notebook: students do not see the question"]


@pytest.mark.parametrize(
    "text, flagged",
    [
        ("Rules.\n\n**Bytes.**\n7. Read once.\n8. Write once.", True),
        ("Rules.\n\n**Bytes.**\n\n7. Read once.\n8. Write once.", False),
        ("Steps:\n1. Read once.\n2. Write once.", False),
        ("A sentence that wraps before a number\n64. That is not a list item.", False),
        ("```\n7. in a code block\n8. also\n```", False),
    ],
    ids=["list-after-text", "blank-line-before", "starts-at-1", "wrapped-number", "code-block"],
)
def test_lint_flags_a_numbered_list_that_renders_as_text(root, text, flagged):
    edit_source(root, lambda nb: nb.cells.insert(2, nbformat.v4.new_markdown_cell(text)))
    problems = [p for p in problems_of(root) if "renders as running text" in p]
    assert bool(problems) == flagged, problems


def test_lint_flags_a_renamed_grade_id(root):
    edit_source(root, lambda nb: cell(nb, "q1_2_scale").metadata.nbgrader.update(grade_id="q1_2_scaled"))
    assert any("'q1_2_scale' is recorded in grade_ids.lock but gone from the lab" in p for p in problems_of(root))


def test_check_passes_reference_full_and_blank_zero(root, capsys):
    assert check.main([LAB], root) == 0
    out = capsys.readouterr().out
    assert "check lab0: OK" in out
    assert "Question 1.1          3          3         3      0" in out, out
    assert "Bonus 1.1             1          1         1      0" in out, "the reference earns the bonus, the blank not"


def test_check_fails_when_a_hidden_test_rejects_the_reference_or_passes_a_blank(root):
    def break_tests(nb):
        tests = cell(nb, "q1_2_scale_tests")
        tests.source = tests.source.replace("3.625", "3.5")
        square_tests = cell(nb, "b1_1_square_tests")
        square_tests.source = "### BEGIN HIDDEN TESTS\nassert True\n### END HIDDEN TESTS"

    edit_source(root, break_tests)
    build.generate_release(LAB, root / "source" / LAB, root / "release" / LAB)
    messages = [str(p) for p in check.check_lab(LAB, root)]
    assert any("reference (q1_2_scale_tests): earned 0 of 2" in m for m in messages), messages
    assert any("blank (b1_1_square_tests): earned 1 of 1: this test passes without an answer" in m for m in messages), messages


def test_grade_continues_past_broken_submissions(built_root, tmp_path):
    course = make_course_dir(tmp_path / "course", [LAB], built_root)
    source_nb = read_notebook(built_root / "source" / LAB / f"{LAB}.ipynb")
    release_nb = read_notebook(built_root / "release" / LAB / f"{LAB}.ipynb")
    write_notebook(make_submission(release_nb, source_nb), course / "submitted" / "ada" / LAB / f"{LAB}.ipynb")
    write_notebook(make_submission(release_nb, source_nb, {"q1_2_scale"}), course / "submitted" / "bob" / LAB / f"{LAB}.ipynb")
    broken = course / "submitted" / "cy" / LAB / f"{LAB}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text(json.dumps(nbformat.v4.writes(release_nb))[:200])  # truncated JSON
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    assert outcomes["ada"].status == "ok" and scores["ada"].autograded_score() == 6
    assert outcomes["bob"].status == "ok" and scores["bob"].autograded_score() == 2
    assert outcomes["cy"].status == "failed" and outcomes["cy"].reason, outcomes["cy"]
    csv_text = (course / "grading" / LAB / "grades.csv").read_text()
    assert csv_text.splitlines()[0].startswith("student,lab,status,reason,")
    assert "\ncy,lab0,failed," in csv_text, "a broken submission still gets a row with its reason"
    rows = {row["student"]: row for row in csv.DictReader(csv_text.splitlines())}
    totals = {k: rows["ada"][k] for k in ("b1_1_square_tests", "autograded_score", "autograded_max", "total_score", "total_max")}
    assert totals == {"b1_1_square_tests": "1", "autograded_score": "6", "autograded_max": "5", "total_score": "6",
                      "total_max": "7"}, f"scores include the bonus, maxima are the core points as in nbgrader: {totals}"
    assert (course / "grading" / LAB / "scores.png").read_bytes()[:4] == b"\x89PNG"


def course_with_first_cell_printing(built_root: Path, tmp_path: Path, code: str) -> Path:
    """A course with its gradebook and one submission, ada's: the reference whose first student cell (q1_1_add)
    starts with ``code``."""
    course = make_course_dir(tmp_path / "course", [LAB], built_root)
    source_nb = read_notebook(built_root / "source" / LAB / f"{LAB}.ipynb")
    submission = make_submission(read_notebook(built_root / "release" / LAB / f"{LAB}.ipynb"), source_nb)
    cell(submission, "q1_1_add").source = code + cell(submission, "q1_1_add").source
    write_notebook(submission, course / "submitted" / "ada" / LAB / f"{LAB}.ipynb")
    grade.prepare_gradebook(course, LAB)
    return course


def first_cell_printed(course: Path) -> str:
    """What ada's first student cell printed when it was graded."""
    graded = read_notebook(course / "autograded" / "ada" / LAB / f"{LAB}.ipynb")
    return "".join(out.get("text", "") for out in cell(graded, "q1_1_add").outputs)


def test_a_submission_started_ahead_runs_no_student_code_before_its_turn(built_root, tmp_path):
    """course grade starts a worker's next nbgrader process while it grades one; that process's student cells wait
    for ``go``, and its time limit counts from there."""
    course = course_with_first_cell_printing(built_root, tmp_path, "import time\nprint('RAN AT', time.time())\n")
    job = grade.grading_job(course, LAB, "ada", timeout_s=120, ahead=True)
    assert job.ahead, "the piece is on unless EFFICIENT_AI_GRADING_SPEED switches it off"
    started = GradingProcess(job)
    time.sleep(20)  # far longer than this tiny lab takes to reach its first student cell
    turn_s = time.time()
    outcome = grade.autograde_one(job, started)
    assert outcome.status == "ok", outcome
    ran_s = float(first_cell_printed(course).split("RAN AT")[1].split()[0])
    assert ran_s >= turn_s, f"the first student cell ran {turn_s - ran_s:.1f} s before the submission's turn"


def test_a_submission_over_the_time_limit_costs_only_itself(built_root, tmp_path):
    """The hanging submission's nbgrader process is killed with its kernel; the next one, started ahead meanwhile,
    and the one after are graded."""
    course = course_with_first_cell_printing(built_root, tmp_path, "import time\ntime.sleep(600)\n")
    source_nb = read_notebook(built_root / "source" / LAB / f"{LAB}.ipynb")
    reference = make_submission(read_notebook(built_root / "release" / LAB / f"{LAB}.ipynb"), source_nb)
    for student in ("bob", "cy"):
        write_notebook(reference, course / "submitted" / student / LAB / f"{LAB}.ipynb")
    outcomes, scores = grade.grade_lab(course, LAB, timeout_s=30, progress=False)
    assert outcomes["ada"].status == "failed" and "time limit of 30 s" in outcomes["ada"].reason, outcomes["ada"]
    for student in ("bob", "cy"):
        assert outcomes[student].status == "ok" and scores[student].autograded_score() == 6, outcomes[student]


@pytest.mark.parametrize("fork_server", ["on", "off"])
def test_a_worker_s_kernels_run_on_its_cpus(built_root, tmp_path, monkeypatch, fork_server):
    """A worker's CPU share reaches its kernels: course grade -> GradingJob -> c.Sandbox.cpus -> the provisioner's
    KernelLimits -> kernel_limits.py, which pins itself before it becomes the kernel. The same whether the nbgrader
    process is forked from the fork server or started by subprocess (the speed piece ``fork_server``)."""
    monkeypatch.setenv(SPEED_ENV, f"fork_server={fork_server}")
    everywhere = sorted(os.sched_getaffinity(0))
    if len(everywhere) < 2:
        pytest.skip("one CPU: a pinned and an unpinned process cannot be told apart")
    course = course_with_first_cell_printing(built_root, tmp_path,
                                             "import os\nprint('CPUS', sorted(os.sched_getaffinity(0)))\n")
    slot = WorkerSlot(kernel_cpus=tuple(everywhere[-1:]))
    assert grade.autograde_one(grade.grading_job(course, LAB, "ada", slot, timeout_s=120)).status == "ok"
    printed = first_cell_printed(course)
    assert f"CPUS {everywhere[-1:]}" in printed, printed


SPOOF_ADD = '''def add(a, b):
    get_ipython().displayhook(3)  # shows "3" as the test cell's result: nbgrader would read it as 3 points
    return a - b'''
NOISY_SCALE = '''import sys

def scale(x, factor_per_unit):
    print("UserWarning: a library warning on stderr", file=sys.stderr)
    return x * factor_per_unit'''
PRINTING_ADD = '''import inspect
import linecache

def add(a, b):
    for frame in inspect.stack()[1:3]:
        print("".join(linecache.getlines(frame.filename)))  # the source of the running test cell
    return a + b'''
STASHING_ADD = '''import inspect
import linecache

_seen = []

def add(a, b):
    _seen.extend("".join(linecache.getlines(frame.filename)) for frame in inspect.stack()[1:3])
    return a + b'''
PRINTING_SCALE = '''print("\\n".join(_seen))  # hidden test source copied while add() ran under the tests

def scale(x, factor_per_unit):
    return x * factor_per_unit'''


def test_grading_ignores_spoofed_results_and_stderr_and_feedback_hides_tests(built_root, tmp_path):
    from course.cli.feedback import generate_feedback
    from course.common.notebooks import replace_cell_source

    course = make_course_dir(tmp_path / "course", [LAB], built_root)
    source_nb = read_notebook(built_root / "source" / LAB / f"{LAB}.ipynb")
    reference = make_submission(read_notebook(built_root / "release" / LAB / f"{LAB}.ipynb"), source_nb)
    submissions = {
        "spoofer": replace_cell_source(reference, "q1_1_add", SPOOF_ADD),
        "noisy": replace_cell_source(reference, "q1_2_scale", NOISY_SCALE),
        "printer": replace_cell_source(reference, "q1_1_add", PRINTING_ADD),
        "stasher": replace_cell_source(replace_cell_source(reference, "q1_1_add", STASHING_ADD), "q1_2_scale", PRINTING_SCALE),
    }
    for student, nb in submissions.items():
        write_notebook(nb, course / "submitted" / student / LAB / f"{LAB}.ipynb")
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert scores["spoofer"].cells["q1_1_add_tests"].score == 0, "a result shown by student code is not partial credit"
    assert scores["noisy"].cells["q1_2_scale_tests"].score == 2, "stderr output inside a passing test costs nothing"
    assert scores["printer"].autograded_score() == 6 and scores["stasher"].autograded_score() == 6
    for student in ("printer", "stasher"):
        printed = read_notebook(course / "autograded" / student / LAB / f"{LAB}.ipynb")
        assert "add(-40, 17)" not in json.dumps([c.get("outputs", []) for c in printed.cells]), (
            f"hidden tests run in the grader, so the {student}'s code, reading the frames that call it, cannot "
            "copy their source into its outputs")
    files = generate_feedback(course, LAB)
    assert len(files) == 4
    for html in files:
        text = html.read_text()
        assert "add(-40, 17)" not in text and "3.625" not in text, f"{html}: hidden test source leaked into feedback"
        assert "hidden tests ran here" in text
    shutil.rmtree(course / "feedback")
    named = generate_feedback(course, LAB, ["printer", "stasher"])
    assert [path.relative_to(course / "feedback").parts[0] for path in named] == ["printer", "stasher"], (
        f"feedback for two named students (`course feedback LAB --student A --student B`) must make exactly theirs: {named}")


def test_feedback_waits_for_written_answers_to_be_graded(built_root, tmp_path, capsys):
    """Ungraded written answers would read as 0 points in feedback: `course feedback` refuses without --force."""
    from nbgrader.api import Gradebook

    from course.cli import feedback
    from course.common.paths import course_directory

    course = make_course_dir(tmp_path / "course", [LAB], built_root)
    source_nb = read_notebook(built_root / "source" / LAB / f"{LAB}.ipynb")
    reference = make_submission(read_notebook(built_root / "release" / LAB / f"{LAB}.ipynb"), source_nb)
    write_notebook(reference, course / "submitted" / "alice" / LAB / f"{LAB}.ipynb")
    grade.grade_lab(course, LAB, progress=False)
    assert feedback.ungraded_answers(course, LAB) == {"alice": ["q1_3_answer"]}
    assert feedback.main(LAB, course) == 1, "feedback must refuse while a written answer is ungraded"
    assert "--force" in capsys.readouterr().out, "the refusal must say how to go on anyway"
    assert not (course / "feedback").exists(), "nothing is generated when feedback refuses"
    with Gradebook(course_directory(course).db_url, course_id="efficient-ai") as gb:  # what the formgrader does for a TA
        cell = gb.find_grade("q1_3_answer", LAB, LAB, "alice")
        cell.manual_score, cell.needs_manual_grade = 2.0, False  # as nbgrader's formgrader API sets them
        gb.db.commit()
    assert feedback.ungraded_answers(course, LAB) == {}
    assert feedback.main(LAB, course) == 0
    assert (course / "feedback" / "alice" / LAB / f"{LAB}.html").exists()

    # The TA's grades.csv: `course grade LAB --report` brings in the manual points; grading one more student
    # (`--student bob`) updates bob's row and keeps alice's.
    csv_path = course / "grading" / LAB / "grades.csv"
    assert grade.main(LAB, course, report_only=True) == 0
    rows = {row["student"]: row for row in csv.DictReader(csv_path.open())}
    assert rows["alice"]["q1_3_answer"] == "2", f"--report must write the TA's manual points: {rows['alice']}"
    write_notebook(reference, course / "submitted" / "bob" / LAB / f"{LAB}.ipynb")
    grade.grade_lab(course, LAB, ["bob"], progress=False)
    rows = {row["student"]: row for row in csv.DictReader(csv_path.open())}
    assert sorted(rows) == ["alice", "bob"], f"grading one student must keep the others' rows: {sorted(rows)}"
    assert rows["alice"]["q1_3_answer"] == "2" and rows["alice"]["status"] == "ok", rows["alice"]


def test_reports_count_a_tas_extra_credit_on_a_written_bonus_answer():
    """A written bonus answer is out of 0 in nbgrader; the TA types its points as extra credit (AwardBonusPoints gave
    it an automatic 0, so nbgrader counts that extra credit): the table, totals and grades.csv count it as bonus."""
    from course.cli.report import question_scores
    from course.common.scores import CellScore, SubmissionScores

    def written(extra, pending=False):
        return CellScore("b2_5_answer", max_score=2.0, auto_score=0.0, manual_score=None, needs_manual_grade=pending,
                         autograded=False, extra_credit=extra, bonus=True)

    core = CellScore("q1_1_add_tests", 3.0, 3.0, None, False, True)
    graded = SubmissionScores("ada", {"q1_1_add_tests": core, "b2_5_answer": written(1.5)})
    assert question_scores(graded)["b2_5"].cell() == "+1.5/2m"
    assert (graded.total_score(), graded.total_max(), graded.bonus_max()) == (4.5, 3.0, 2.0)
    waiting = SubmissionScores("bob", {"q1_1_add_tests": core, "b2_5_answer": written(None, pending=True)})
    assert question_scores(waiting)["b2_5"].cell() == "+2?"
