"""The TA grades what the student saw (course/grader/ta_view.py): a submission of the fixture lab with a plot question
(tests/student_run_lab.py) whose notebook carries the student's own run (an H100, a measured table, a plot, script
payloads, a forged test result) is graded by plain ``nbgrader autograde`` (what the formgrader's Autograde button
runs) and by ``course grade``. On both routes the autograded notebook (what the formgrader shows) holds, in each code
cell that is not a test, the grader's re-run and then the student's run, each under its label, sanitized; each
manually graded cell is followed by its mark scheme. Test cells hold only the grader's outputs, and the scores are
those of the same submission without outputs. Feedback shows the student's run and no mark scheme.
"""
from __future__ import annotations

import json

import nbformat
import pytest
from fixture_lab import LAB
from student_run_lab import (
    ANSWER_GID,
    ANSWER_SCHEME,
    FORGED_SCORE,
    MEASURE_MARK,
    PLOT_GID,
    PLOT_SCHEME,
    SETUP_GID,
    STUDENT_GPU,
    STUDENT_TABLE_ROW,
    in_order,
    plot_lab_root,
    run_submission,
)
from traitlets.config import Config

from course.cli import grade
from course.cli.feedback import generate_feedback
from course.cli.nbgrader_run import make_course_dir, run_nbgrader
from course.common.notebooks import COURSE_METADATA, grade_id, make_submission, read_notebook, write_notebook
from course.common.scores import read_scores
from course.grader.sanitize import WIDGET_VIEW, sanitize_output
from course.grader.ta_view import (
    GRADER_RUN,
    MARK_SCHEME_KEY,
    STUDENT_RUN,
    KeepStudentRun,
    ShowMarkSchemes,
    is_mark_scheme_cell,
    mark_schemes,
    within_cap,
)

pytestmark = pytest.mark.slow
ROUTES = {"plain": "ada_plain", "course": "ada_course"}  # the route -> the student it graded
EXPECTED_TESTS = {"q1_1_add_tests": 3.0, "q1_2_scale_tests": 2.0, "b1_1_square_tests": 1.0}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return plot_lab_root(tmp_path_factory.mktemp("ta-view-root"))


@pytest.fixture(scope="module")
def graded(root, tmp_path_factory):
    """ada's run graded by each route, and ``quiet``, the same answers submitted without outputs."""
    course = make_course_dir(tmp_path_factory.mktemp("ta-view") / "course", [LAB], root)
    for student in ROUTES.values():
        write_notebook(run_submission(root, hostile=True), course / "submitted" / student / LAB / f"{LAB}.ipynb")
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    quiet = make_submission(release, read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    write_notebook(quiet, course / "submitted" / "quiet" / LAB / f"{LAB}.ipynb")
    grade.prepare_gradebook(course, LAB)
    plain = run_nbgrader(course, ["autograde", LAB, "--student", ROUTES["plain"], "--create", "--force"])
    assert plain.ok, plain.tail(30)
    outcomes, _ = grade.grade_lab(course, LAB, students=[ROUTES["course"], "quiet"], progress=False, workers=2)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    return course


def autograded(course, student):
    return read_notebook(course / "autograded" / student / LAB / f"{LAB}.ipynb")


def cell_of(nb, gid=None, starts=None):
    return next(c for c in nb.cells if (gid and grade_id(c) == gid) or (starts and c.source.startswith(starts)))


def shown(cell) -> list[str]:
    """Each output of a cell as the text a reader sees of it (labels, streams, text and HTML, images by type)."""
    texts = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        texts.append(out.get("text") or data.get("text/html") or data.get("text/plain") or ",".join(data))
    return texts


def position(texts: list[str], needle: str) -> int:
    return next((i for i, text in enumerate(texts) if needle in text), -1)


@pytest.mark.parametrize("route", ROUTES)
def test_the_student_run_shows_after_the_grader_rerun(graded, route):
    nb = autograded(graded, ROUTES[route])
    setup = shown(cell_of(nb, SETUP_GID))
    assert (position(setup, GRADER_RUN) < position(setup, "GPU: none found") < position(setup, STUDENT_RUN)
            < position(setup, STUDENT_GPU)) and position(setup, GRADER_RUN) == 0, (
        f"{route}: the setup cell shows the grader's GPU, then the student's, each under its label: {setup}")
    measured = shown(cell_of(nb, starts=MEASURE_MARK))
    assert position(measured, STUDENT_RUN) < position(measured, STUDENT_TABLE_ROW), (
        f"{route}: the measuring cell shows the student's table as the student's run: {measured}")
    plot = cell_of(nb, PLOT_GID)
    images = [i for i, out in enumerate(plot.outputs) if "image/png" in out.get("data", {})]
    assert images and min(images) > position(shown(plot), STUDENT_RUN) >= 0, (
        f"{route}: the plot question shows the student's plot as the student's run: {shown(plot)}")


@pytest.mark.parametrize("route", ROUTES)
def test_submitted_outputs_never_reach_a_test_cell_or_a_score(graded, route):
    nb = autograded(graded, ROUTES[route])
    test_cell = json.dumps(cell_of(nb, "q1_1_add_tests").outputs)
    assert FORGED_SCORE not in test_cell and STUDENT_RUN not in test_cell and "3 points" not in test_cell, test_cell
    for cell in nb.cells:
        if cell.get("outputs") and STUDENT_RUN in json.dumps(cell.outputs):
            kinds = {out["output_type"] for out in cell.outputs[position(shown(cell), STUDENT_RUN):]}
            assert "execute_result" not in kinds, f"a copied result must not look like one nbgrader scores: {kinds}"
    scores = read_scores(graded, LAB, [ROUTES[route], "quiet"])
    tests = {student: {gid: c.score for gid, c in s.cells.items() if c.autograded} for student, s in scores.items()}
    assert tests[ROUTES[route]] == tests["quiet"] == EXPECTED_TESTS, tests


@pytest.mark.parametrize("route", ROUTES)
def test_copied_outputs_are_sanitized(graded, route):
    """The payloads' outputs come out as course/grader/sanitize.py leaves them (the browser test shows none runs)."""
    cell = cell_of(autograded(graded, ROUTES[route]), starts=MEASURE_MARK)
    copied = [dict(out) for out in cell.outputs[position(shown(cell), STUDENT_RUN) + 1:]]
    assert copied and copied == [sanitize_output(out) for out in copied], "copied outputs are sanitized"
    assert STUDENT_TABLE_ROW in json.dumps(copied) and "could run script" in json.dumps(copied), copied
    mimes = {mime for out in copied for mime in out.get("data", {})}
    assert not mimes & {"application/javascript", "image/svg+xml", WIDGET_VIEW}, mimes
    assert not [out for out in copied if "onerror" in str(out.get("data", {}).get("text/html", ""))], copied


@pytest.mark.parametrize("route", ROUTES)
def test_a_mark_scheme_follows_each_manually_graded_cell(graded, route):
    cells = autograded(graded, ROUTES[route]).cells
    for gid, scheme in ((ANSWER_GID, ANSWER_SCHEME), (PLOT_GID, PLOT_SCHEME)):
        at = next(i for i, cell in enumerate(cells) if grade_id(cell) == gid)
        after = cells[at + 1]
        assert is_mark_scheme_cell(after) and scheme in after.source and after.cell_type == "markdown", (
            f"{route}: {gid} must be followed by its mark scheme: {after.source[:200]!r}")
    assert sum(map(is_mark_scheme_cell, cells)) == 2, "only manually graded cells get a mark scheme"


def test_feedback_shows_the_student_run_and_no_mark_scheme(graded):
    [page] = generate_feedback(graded, LAB, [ROUTES["course"]])
    html = page.read_text()
    for text in (STUDENT_RUN, STUDENT_GPU, STUDENT_TABLE_ROW, GRADER_RUN):
        assert text in html, f"feedback must show {text!r}"
    for text in (ANSWER_SCHEME, PLOT_SCHEME, "Mark scheme of", "add(-40, 17)", "square(-9)"):
        assert text not in html, f"feedback must not show {text!r}"


def test_mark_schemes_are_read_from_the_instructor_notebook(root):
    schemes = mark_schemes(read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    assert schemes == {ANSWER_GID: ANSWER_SCHEME, PLOT_GID: f"1 point: {PLOT_SCHEME}, and shown."}, schemes
    release = mark_schemes(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"))
    assert release == {}, "the release holds no mark scheme (what a submission could carry)"


def test_a_forged_mark_scheme_cell_loses_its_mark(root, tmp_path):
    """Only ShowMarkSchemes makes scheme cells: a submitted cell carrying the metadata is kept as the student's cell
    (feedback would otherwise drop the student's own answer), and the real scheme follows the answer."""
    course = make_course_dir(tmp_path / "course", [LAB], root)
    nb = run_submission(root)
    answer = cell_of(nb, ANSWER_GID)
    answer.metadata[COURSE_METADATA] = {MARK_SCHEME_KEY: ANSWER_GID}
    config = Config()
    config.CourseDirectory.root = str(course)
    step = ShowMarkSchemes(config=config)
    result, _ = step.preprocess(nb, {"nbgrader": {"assignment": LAB, "notebook": LAB, "student": "x"}})
    at = result.cells.index(answer)
    assert not is_mark_scheme_cell(answer) and is_mark_scheme_cell(result.cells[at + 1])
    assert sum(map(is_mark_scheme_cell, result.cells)) == 2


def test_the_kept_outputs_are_capped():
    outputs = [{"output_type": "stream", "name": "stdout", "text": "x" * 1000} for _ in range(5)]
    kept, used = within_cap(outputs, 2500)
    assert len(kept) == 3 and kept[:2] == outputs[:2] and used <= 2500, kept[2:]
    assert "KiB of the student's outputs not shown" in kept[2]["text"], kept[2]


def keep_student_run(course, student: str, nb):
    """``KeepStudentRun`` run on ``nb`` as autograde runs it for ``student`` in the course folder ``course``."""
    config = Config()
    config.CourseDirectory.root = str(course)
    resources = {"nbgrader": {"assignment": LAB, "notebook": LAB, "student": student}}
    return KeepStudentRun(config=config).preprocess(nb, resources)[0]


def one_cell_notebook(text: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('x')", outputs=[nbformat.v4.new_output("stream", text=text)])]
    return nb


def test_a_renamed_notebook_shows_its_run_and_an_unreadable_one_grades_without_it(tmp_path):
    """The submitted notebook course grade grades is the one read (a renamed one included); one that cannot be read
    leaves the graded notebook as it is, and grading goes on."""
    write_notebook(one_cell_notebook("student\n"), tmp_path / "submitted" / "renamed" / LAB / f"{LAB} (1).ipynb")
    shown_run = json.dumps(keep_student_run(tmp_path, "renamed", one_cell_notebook("grader\n")).cells[0].outputs)
    assert in_order(shown_run, GRADER_RUN, "grader", STUDENT_RUN, "student"), shown_run
    (tmp_path / "submitted" / "broken" / LAB).mkdir(parents=True)
    (tmp_path / "submitted" / "broken" / LAB / f"{LAB}.ipynb").write_bytes(b'{"cells": [\xff')
    for student in ("broken", "absent"):
        graded = keep_student_run(tmp_path, student, one_cell_notebook("grader\n"))
        assert [out.text for out in graded.cells[0].outputs] == ["grader\n"], (student, graded.cells[0].outputs)


def test_malformed_submitted_outputs_become_notes(tmp_path):
    """The submitted file is read as plain JSON, never validated: what is no valid output is left out with a note,
    and a file nested too deep to parse is graded without its run; grading goes on either way."""
    folder = tmp_path / "submitted" / "odd" / LAB
    folder.mkdir(parents=True)
    odd = [{"output_type": "stream", "name": "stdout", "text": [1, 2]},
           {"output_type": "display_data", "data": {"text/plain": "x"}, "metadata": ["not", "a", "dict"]},
           {"output_type": "display_data", "data": "not a dict"}, "not an output"]
    cell = {"cell_type": "code", "source": "print('x')", "metadata": {}, "outputs": odd, "execution_count": 1}
    (folder / f"{LAB}.ipynb").write_text(json.dumps({"cells": [cell], "metadata": {}}))
    outputs = keep_student_run(tmp_path, "odd", one_cell_notebook("grader\n")).cells[0].outputs
    assert json.dumps(outputs).count("not a valid output") == 2 and "empty output removed" in json.dumps(outputs), outputs
    (folder / f"{LAB}.ipynb").write_text("[" * 100_000 + "]" * 100_000)
    graded = keep_student_run(tmp_path, "odd", one_cell_notebook("grader\n"))
    assert [out.text for out in graded.cells[0].outputs] == ["grader\n"]
