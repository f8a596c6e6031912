"""GuardedExecute on the fixture lab: tampering found and undone, points kept after a dead kernel or the notebook
time limit, and the TA told why (Lab 1's red team is tests/test_redteam.py)."""
from __future__ import annotations

import pytest
from fixture_lab import FIXTURE, LAB, make_root, plain_autograde_scores  # noqa: E402

from course.cli import build, grade
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import make_submission, read_notebook, replace_cell_source, write_notebook

SLOW_LIMIT_S = 30  # the notebook time limit for the slow submission: room for a kernel start on a busy machine
SLOW_SCALE = f"import time\ntime.sleep({SLOW_LIMIT_S + 3})\n\ndef scale(x, factor_per_unit):\n    return x * factor_per_unit"
SUBMISSIONS = {
    "patcher": ("q1_2_scale", "import math\nmath.isclose = lambda *a, **k: True\n\ndef scale(x, factor_per_unit):\n"
                   "    return 0 if x == 0.5 else x * factor_per_unit  # wrong on the hidden test's input"),
    "dies": ("q1_2_scale", "import os\nos._exit(1)"),
    "slow": ("q1_2_scale", SLOW_SCALE),
    # What a device-side assert looks like to the grader; it happens only while a GPU is visible.
    "cuda_assert": ("q1_2_scale", "import os\nif os.environ.get('CUDA_VISIBLE_DEVICES') != '':\n"
                                  "    raise RuntimeError('CUDA error: device-side assert triggered')\n\n"
                                  "def scale(x, factor_per_unit):\n    return x * factor_per_unit"),
}
STUDENTS = ["honest", *SUBMISSIONS]


@pytest.fixture(scope="module")
def graded(tmp_path_factory, request):
    root = make_root(tmp_path_factory.mktemp("guard"))
    assert build.main([LAB], root) == 0
    course = make_course_dir(root / "course", [LAB], root)
    reference = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"),
                                read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    write_notebook(reference, course / "submitted" / "honest" / LAB / f"{LAB}.ipynb")
    for student, (gid, source) in SUBMISSIONS.items():
        write_notebook(replace_cell_source(reference, gid, source), course / "submitted" / student / LAB / f"{LAB}.ipynb")
    monkeypatch = pytest.MonkeyPatch()
    try:
        # The time limit applies to the slow submission only: on a busy machine (CI grades in two processes on two
        # cores) a kernel start and a replay after a crash can take longer than a short limit by themselves.
        outcomes, scores = grade.grade_lab(course, LAB, students=[s for s in STUDENTS if s != "slow"], progress=False)
        monkeypatch.setenv("EFFICIENT_AI_NOTEBOOK_TIMEOUT_S", str(SLOW_LIMIT_S))
        slow_outcomes, slow_scores = grade.grade_lab(course, LAB, students=["slow"], progress=False)
        outcomes, scores = {**outcomes, **slow_outcomes}, {**scores, **slow_scores}
        monkeypatch.delenv("EFFICIENT_AI_NOTEBOOK_TIMEOUT_S")
        monkeypatch.setenv("EFFICIENT_AI_GUARD", "off")
        control_outcomes, control_scores = grade.grade_lab(course, LAB, students=["patcher"], progress=False)
    finally:
        monkeypatch.undo()
    return outcomes, scores, control_scores


def points(scores, student):
    return {gid: cell.score for gid, cell in scores[student].cells.items() if cell.autograded}


def test_tampering_is_found_undone_and_costs_only_its_test(graded):
    outcomes, scores, control = graded
    assert points(scores, "patcher") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 0, "b1_1_square_tests": 1}
    assert any("math.isclose was replaced" in note for note in outcomes["patcher"].notes), outcomes["patcher"]
    assert points(control, "patcher")["q1_2_scale_tests"] == 0, (
        "with EFFICIENT_AI_GUARD=off the patched math.isclose is the kernel's: the grader's test still fails")


def test_a_dead_kernel_costs_only_the_question_it_died_in(graded):
    outcomes, scores, _ = graded
    assert points(scores, "dies") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 0, "b1_1_square_tests": 1}, (
        "a fresh kernel replays the earlier cells, so the questions after the crash keep their points")
    said = " ".join([outcomes["dies"].reason, *outcomes["dies"].notes])
    assert "kernel died in cell" in said and "(q1_2_scale)" in said, (
        f"the TA is told where the kernel died, by grade id: {outcomes['dies']}")


def test_a_sticky_cuda_error_is_graded_again_without_the_gpu(graded):
    outcomes, scores, _ = graded
    assert points(scores, "cuda_assert") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 2, "b1_1_square_tests": 1}, (
        "after a device-side assert the submission is graded again with CUDA hidden, and earns its CPU score")
    note = (outcomes["cuda_assert"].notes or [""])[0]
    assert note.startswith("graded on the CPU: on the GPU, device-side assert triggered in cell") and (
        "(q1_2_scale)" in note), f"the TA must be told why and where: {outcomes['cuda_assert']}"
    assert outcomes["cuda_assert"].status == "ok", outcomes["cuda_assert"]


def test_notebook_time_limit_keeps_the_points_earned_before(graded):
    outcomes, scores, _ = graded
    assert points(scores, "slow") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 0, "b1_1_square_tests": 0}
    assert outcomes["slow"].status == "partial" and f"time limit of {SLOW_LIMIT_S} s" in outcomes["slow"].reason, (
        outcomes["slow"])
    assert points(scores, "honest") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 2, "b1_1_square_tests": 1}
    assert outcomes["honest"].status == "ok" and not outcomes["honest"].notes, outcomes["honest"]


# Like `import transformers`, which imports trio, which registers an IPython exception handler: instructor code
# changing what the guard watches. A second locked cell sits between a student's answer and its test.
LIBRARY_HOOK = ("import math\nget_ipython().set_custom_exc((KeyboardInterrupt,), "
                "lambda shell, etype, value, tb, tb_offset=None: ['interrupted'])")
INPUTS_CELL = ('# %% nbgrader={"grade": false, "grade_id": "q1_2_inputs", "locked": true, "schema_version": 3, '
               '"solution": false, "task": false}\nSCALE_INPUTS = (2, 3)\n\n')


@pytest.fixture(scope="module")
def graded_with_locked_cells(tmp_path_factory):
    text = FIXTURE.read_text()
    text = text.replace("\nimport math\n", "\n" + LIBRARY_HOOK + "\n", 1)
    test_header = '# %% nbgrader={"grade": true, "grade_id": "q1_2_scale_tests"'
    assert LIBRARY_HOOK in text and test_header in text, "the fixture lab changed: update this test"
    text = text.replace(test_header, INPUTS_CELL + test_header, 1)
    root = make_root(tmp_path_factory.mktemp("guard-locked"), text)
    assert build.main([LAB], root) == 0
    course = make_course_dir(root / "course", [LAB], root)
    reference = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"),
                                read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    write_notebook(reference, course / "submitted" / "honest" / LAB / f"{LAB}.ipynb")
    patcher_gid, patcher_source = SUBMISSIONS["patcher"]
    write_notebook(replace_cell_source(reference, patcher_gid, patcher_source),
                   course / "submitted" / "patcher" / LAB / f"{LAB}.ipynb")
    return grade.grade_lab(course, LAB, progress=False)


def test_changes_made_by_locked_cells_are_not_tampering(graded_with_locked_cells):
    outcomes, scores = graded_with_locked_cells
    assert points(scores, "honest") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 2, "b1_1_square_tests": 1}, (
        "an exception handler registered by a locked cell (as importing trio does) must not cost the student points")
    assert outcomes["honest"].notes == [], outcomes["honest"]


def test_tampering_before_a_locked_cell_is_charged_to_the_next_test(graded_with_locked_cells):
    outcomes, scores = graded_with_locked_cells
    assert points(scores, "patcher") == {"q1_1_add_tests": 3, "q1_2_scale_tests": 0, "b1_1_square_tests": 1}, (
        "math.isclose patched before a locked cell must still cost the next test cell, and only that one")
    assert any("math.isclose was replaced" in note for note in outcomes["patcher"].notes), outcomes["patcher"]


# A code cell before the first locked cell (the course's own fetch cell, an empty cell a student adds at the top), and
# the locked cells' modules, which the grader imports in the kernel after the locked setup cells (IMPORT_AHEAD).
# Importing torch (checks.py does) imports torch.package, which replaces inspect.getfile, and here _utils_private.py
# (a lab file the guard does not import itself), imported by a locked cell after the first answer, registers an
# IPython exception handler at import (as importing transformers, through trio, does). Both are the course's doing,
# never the student's, on every route, wherever the student's cells are; a student's own replacement still costs.
# _utils_private.py also reads at import what the setup cell sets (as Triton reads TRITON_INTERPRET, which Lab 2's
# setup cell sets on a CPU): the lab's modules are never imported before its setup cells.
FULL = {"q1_1_add_tests": 3, "q1_2_scale_tests": 2, "b1_1_square_tests": 1}
TOP_CELLS = {  # student -> (the cell added before the first code cell, or None; the test scores)
    "reference": (None, FULL),
    "top_empty": ("", FULL),
    # Its kernel dies in q1_2_scale: a fresh kernel runs the earlier cells again, the top one included.
    "top_empty_dies": ("", {**FULL, "q1_2_scale_tests": 0}),
    "top_patcher": ("import inspect\ninspect.getfile = lambda obj: 'nowhere'", {**FULL, "q1_1_add_tests": 0}),
}
SETS_UP = "\nimport math\nimport os\n\nos.environ['LAB0_SETUP'] = 'done'  # before the lab's modules are imported\n"
PRIVATE_WITH_A_HOOK = ('"""A lab file that reads what the setup cell set and registers an IPython exception handler at '
                       'import."""\nimport builtins\nimport os\n\nSEEN = os.environ.get("LAB0_SETUP", "missing")\n'
                       'if getattr(builtins, "get_ipython", None) is not None:\n'
                       '    get_ipython().set_custom_exc((KeyboardInterrupt,), lambda *args, **kwargs: ["interrupted"])\n')
IMPORTS_PRIVATE = ('# %% nbgrader={"grade": false, "grade_id": "q1_2_setup", "locked": true, "schema_version": 3, '
                   '"solution": false, "task": false}\nimport _utils_private\n\nSETUP_SEEN = _utils_private.SEEN\n\n')
CHECKS_SETUP = "assert SETUP_SEEN == 'done', 'the lab module was imported before the setup cell ran'\n"


@pytest.fixture(scope="module")
def graded_with_a_cell_before_the_setup(tmp_path_factory):
    """Graded by plain nbgrader autograde (the formgrader's route: no kernel started ahead), then by course grade."""
    import nbformat


    text = FIXTURE.read_text()
    answer_header = '# %% nbgrader={"grade": false, "grade_id": "q1_2_scale"'
    first_check = "assert scale(2, 3) == 6"
    assert answer_header in text and "\nimport math\n" in text and first_check in text, (
        "the fixture lab changed: update this test")
    text = text.replace("\nimport math\n", SETS_UP, 1).replace(answer_header, IMPORTS_PRIVATE + answer_header, 1)
    root = make_root(tmp_path_factory.mktemp("guard-top-cell"), text.replace(first_check, CHECKS_SETUP + first_check, 1))
    (root / "_utils_private.py").write_text(PRIVATE_WITH_A_HOOK)
    assert build.main([LAB], root) == 0
    course = make_course_dir(root / "course", [LAB], root)
    reference = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"),
                                read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    first_code = next(i for i, cell in enumerate(reference.cells) if cell.cell_type == "code")
    for student, (source, _) in TOP_CELLS.items():
        submission = nbformat.from_dict(reference)
        if source is not None:
            submission.cells.insert(first_code, nbformat.v4.new_code_cell(source))
        if student.endswith("_dies"):
            submission = replace_cell_source(submission, "q1_2_scale", "import os\nos._exit(1)")
        write_notebook(submission, course / "submitted" / student / LAB / f"{LAB}.ipynb")
    plain_scores = plain_autograde_scores(course)
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    return plain_scores, outcomes, scores


@pytest.mark.parametrize("student", TOP_CELLS)
def test_what_the_course_s_imports_change_is_never_charged_to_the_student(graded_with_a_cell_before_the_setup,
                                                                         student):
    plain_scores, outcomes, scores = graded_with_a_cell_before_the_setup
    expected = TOP_CELLS[student][1]
    assert points(scores, student) == expected, f"course grade: {outcomes[student]}"
    assert points(plain_scores, student) == expected, "plain nbgrader autograde gives the same score"
    notes = outcomes[student].notes
    if expected == FULL:
        assert notes == [], outcomes[student]
    elif student.endswith("_dies"):
        assert not any("replaced" in note for note in notes), f"the fresh kernel's imports are the course's: {notes}"
    else:
        assert any("inspect.getfile was replaced" in note for note in notes) and not any(
            "custom_exceptions" in note for note in notes), f"only the student's own replacement costs: {notes}"


def test_a_kernel_started_ahead_loads_the_modules_of_the_lab_s_locked_kernel_cells():
    from course.common.paths import REPO_ROOT
    from course.grader.boundary import locked_cell_imports

    modules = locked_cell_imports(REPO_ROOT / "source" / "lab1")
    assert "transformers.models.gemma3.configuration_gemma3" in modules, "a locked cell after the first answer imports it"
    assert "dis" not in modules, "a module only test cells import is the grader's, not the kernel's"
    assert "torch.nn.attention" not in modules, "a module only a cell the student may edit imports is not loaded ahead"
    assert locked_cell_imports(None) == [], "no instructor notebooks: nothing loaded ahead"


def test_the_guard_watches_numpy_torch_and_utils_in_labs_that_import_them(tmp_path):
    from course.common.paths import REPO_ROOT, discover_labs
    from course.grader.boundary import lab_uses_guard_libraries

    for lab in discover_labs(REPO_ROOT):
        assert lab_uses_guard_libraries(REPO_ROOT / "source" / lab), (
            f"{lab} imports torch and utils: the guard must import and watch them")
    root = make_root(tmp_path / "fixture")
    assert build.main([LAB], root) == 0
    assert not lab_uses_guard_libraries(root / "source" / LAB), (
        "the fixture lab imports only math: the guard need not import numpy, torch or utils there")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "lab.ipynb").write_text("{ not json")
    assert lab_uses_guard_libraries(broken) and lab_uses_guard_libraries(None), (
        "instructor notebooks that cannot be read: the guard watches everything")
