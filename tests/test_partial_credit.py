"""Partial credit from weighted checks (checks.py), scored by the grader on every route.

A tiny lab whose test cells use ``with check(..., weight=w)`` blocks, graded for real by plain ``nbgrader autograde``,
by ``course grade`` and by ``course grade --workers 2`` (two grading workers on one SQLite gradebook):
- an answer right everywhere but one edge earns the weighted share of the cell's points, on both routes, and the
  feedback lists the failed check with its message (and never the hidden test's source);
- a bonus cell's share becomes its extra credit;
- nothing the student's kernel shows can raise a score (a number displayed as the cell's result), and tampering the
  guard finds, or an answer of a lying subclass, zeroes the cell even where some of its checks passed;
- code that can switch off the recording of torch calls zeroes the test that relies on it (the static scan), and a
  recording switched off at run time (``TorchFunctionMode`` patched through ``getattr``) zeroes it too;
- the method gates the value: an answer that hands the work to the library (``torch.sum`` where a loop is asked)
  earns a quarter of the question though its value is right;
- a carried answer is the answer as graded: a later question accepts a value built on the student's earlier answer
  as its test recorded it (``keep_carried``), not on a function redefined after that test ran;
- ``course check`` runs the prepared answers of ``labs/lab0/variants.py`` (course/cli/harness.py) and reports a skip
  that earns more than a quarter of its question, and none where skips are below every one-mistake answer;
- a grading kernel runs with the grader's settings (cuDNN attention off), which ``import utils`` no longer makes.
"""
from __future__ import annotations

import nbformat
import pytest
from fixture_lab import LAB, make_root, plain_autograde_scores  # noqa: E402

from course.cli import build, check, grade  # noqa: E402
from course.cli.nbgrader_run import make_course_dir, run_nbgrader  # noqa: E402
from course.common.notebooks import make_submission, read_notebook, replace_cell_source, write_notebook  # noqa: E402

LAB_TEXT = '''# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Lab 0: partial credit
#
# | Question | Topic | Points |
# | --- | --- | --- |
# | Question 1.1 | clip | 4 |
# | Question 1.2 | double | 2 |
# | Question 1.3 | the kernel's attention backends | 1 |
# | Question 1.4 | total | 4 |
# | Question 2.1 | area | 2 |
# | Question 2.2 | volume | 2 |
# | Bonus 1.1 | negate | 2 |
# | **Total** | | **15 + 2 bonus** |

# %% nbgrader={"grade": false, "grade_id": "setup_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import torch

from checks import *
from utils import *

# %% [markdown]
# #### Question 1.1 (4 points)
# Write `clip(x, low, high)`; it must also work when `low == high`.

# %% nbgrader={"grade": false, "grade_id": "q1_1_clip", "locked": false, "schema_version": 3, "solution": true, "task": false}
def clip(x, low, high):
    ### BEGIN SOLUTION
    return min(max(x, low), high)
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q1_1_clip_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
with check("clips ordinary values", weight=3):
    assert_close(clip(5.0, 0.0, 1.0), 1.0, "clip(5.0, 0.0, 1.0)")
### BEGIN HIDDEN TESTS
with check("the edge low == high", weight=1):
    assert_close(clip(-3.0, 2.0, 2.0), 2.0, "clip(-3.0, 2.0, 2.0)")
### END HIDDEN TESTS
finish_checks("Question 1.1")

# %% [markdown]
# #### Question 1.2 (2 points)
# Write `double(x)` without calling `torch.mul`.

# %% nbgrader={"grade": false, "grade_id": "q1_2_double", "locked": false, "schema_version": 3, "solution": true, "task": false}
def double(x):
    ### BEGIN SOLUTION
    return x + x
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q1_2_double_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def double_recorded(x):
    with record_torch_calls() as called:
        out = double(x)
    return out, sorted(called)

with check("doubles a tensor without torch.mul", weight=1):
    out, called = double_recorded(torch.ones(3))
    assert_calls(called, "double(x)", forbidden={"mul", "__mul__", "__rmul__"})
    assert_tensor_close(out, torch.full((3,), 2.0), "double(torch.ones(3))")
finish_checks("Question 1.2")

# %% [markdown]
# #### Question 1.3 (1 points)
# Write `cudnn_attention_on()`: whether PyTorch may use cuDNN's attention in this kernel.

# %% nbgrader={"grade": false, "grade_id": "q1_3_cudnn", "locked": false, "schema_version": 3, "solution": true, "task": false}
def cudnn_attention_on():
    ### BEGIN SOLUTION
    return torch.backends.cuda.cudnn_sdp_enabled()
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q1_3_cudnn_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
with check("a grading kernel runs with cuDNN attention off (the grader's setting)", weight=1):
    assert cudnn_attention_on() is False, "the grader turns cuDNN attention off in its kernels"
### END HIDDEN TESTS
finish_checks("Question 1.3")

# %% [markdown]
# #### Question 1.4 (4 points)
# Write `total(x)`: the sum of the elements of a 1-D tensor, added one by one in a loop (do not call `torch.sum`).

# %% nbgrader={"grade": false, "grade_id": "q1_4_total", "locked": false, "schema_version": 3, "solution": true, "task": false}
def total(x):
    ### BEGIN SOLUTION
    result = 0.0
    for value in x.tolist():
        result += value
    return result
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q1_4_total_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def total_recorded(x):
    with record_torch_calls() as called:
        out = total(x)
    return out, sorted(called)

### BEGIN HIDDEN TESTS
_out, _called = total_recorded(torch.arange(4.0))
with check("sums torch.arange(4.0)", weight=2):
    assert_close(_out, 6.0, "total(torch.arange(4.0))")
with check("sums a tensor of one element", weight=1):
    assert_close(total(torch.tensor([5.0])), 5.0, "total(torch.tensor([5.0]))")
with check("adds in a loop, without torch.sum", weight=1, method=True):
    assert_calls(_called, "total(x)", forbidden={"sum"})
### END HIDDEN TESTS
finish_checks("Question 1.4")

# %% [markdown]
# #### Question 2.1 (2 points)
# Write `area(w, h)`: the area of a `w` by `h` rectangle.

# %% nbgrader={"grade": false, "grade_id": "q2_1_area", "locked": false, "schema_version": 3, "solution": true, "task": false}
def area(w, h):
    ### BEGIN SOLUTION
    return w * h
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q2_1_area_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
keep_carried("area(2.0, 3.0)", area, 2.0, 3.0)  # Question 2.2 builds on this answer as graded here
with check("area(2.0, 3.0)", weight=1):
    assert_close(area(2.0, 3.0), 6.0, "area(2.0, 3.0)")
finish_checks("Question 2.1")

# %% [markdown]
# #### Question 2.2 (2 points)
# Write `volume(w, h, d)`: the volume of a `w` by `h` by `d` box, from your `area`.

# %% nbgrader={"grade": false, "grade_id": "q2_2_volume", "locked": false, "schema_version": 3, "solution": true, "task": false}
def volume(w, h, d):
    ### BEGIN SOLUTION
    return area(w, h) * d
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q2_2_volume_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
_area = kept_carried("area(2.0, 3.0)")
with check("volume(2.0, 3.0, 4.0), from your area as Question 2.1 graded it", weight=1):
    assert_or_carried(lambda want: assert_close(volume(2.0, 3.0, 4.0), want, "volume(2.0, 3.0, 4.0)"), 24.0,
                      None if _area is None else as_real(_area, "area(2.0, 3.0)") * 4.0,
                      carried_from="your area(2.0, 3.0) as Question 2.1 graded it")
finish_checks("Question 2.2")

# %% [markdown]
# #### Bonus 1.1 (2 points)
# Write `negate(x)`.

# %% nbgrader={"grade": false, "grade_id": "b1_1_negate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def negate(x):
    ### BEGIN SOLUTION
    return -x
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "b1_1_negate_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
### BEGIN HIDDEN TESTS
with check("negates positive numbers", weight=1):
    assert_integer(negate(3), -3, "negate(3)")
with check("negates negative numbers", weight=1):
    assert_integer(negate(-4), 4, "negate(-4)")
### END HIDDEN TESTS
finish_checks("Bonus 1.1")
'''
UTILS = '''"""Stand-in for the shared helpers: the tests use checks.py's kernel_side and record_torch_calls."""
SCALE = "quick"
__all__ = []
'''
NO_EDGE = "def clip(x, low, high):\n    return x if low == high else min(max(x, low), high)"
SHOWS_A_NUMBER = NO_EDGE + "\nget_ipython().displayhook(4)"
TAMPERING_NO_EDGE = NO_EDGE + "\nimport math\nmath.isclose = lambda *args, **kwargs: True"  # one check passes
HALF_NEGATE = "def negate(x):\n    return -x if x > 0 else x"
BYPASS = ("def double(x):\n    with torch._C.DisableTorchFunction():\n        return torch.mul(x, 2)")
# Right on ordinary values; at the edge a float subclass that equals anything. It crosses the grading boundary as a
# handle (never by value), which the contract refuses like any other object: the grader asks the kernel whether it
# is a lying subclass (course/grader/boundary.py, LYING_TYPES_PROBE), and a lying answer zeroes the cell (checks.LyingAnswer).
LYING_EDGE = ("class _Yes(float):\n    def __eq__(self, other):\n        return True\n    __hash__ = float.__hash__\n\n"
              "def clip(x, low, high):\n    return _Yes(x) if low == high else min(max(x, low), high)")
SKIPS_THE_LOOP = "def total(x):\n    return torch.sum(x)"  # right value, but the library does the work
FIRST_TWICE = ("def total(x):\n    values = x.tolist()\n    result = values[0]\n    for value in values:\n"
               "        result += value\n    return result")  # one mistake: counts the first element twice
WRONG_AREA = "def area(w, h):\n    return w + h"
# After Question 2.1 was graded with WRONG_AREA, a new area makes an unrelated volume look carried forward.
REDEFINED_AREA = "def area(w, h):\n    return 100.0"
# The recording switched off by patching TorchFunctionMode, reached without naming torch.overrides (issue 50).
SWITCHES_OFF = ("import importlib\n_mode = getattr(importlib.import_module('torch.' + 'overrides'), 'TorchFunction' + 'Mode')\n"
                "_mode.__enter__ = lambda self: self\n_mode.__exit__ = lambda self, *exc: None\n\n" + SKIPS_THE_LOOP)
INSERTED = {"redefines": ("q2_1_area_tests", REDEFINED_AREA)}  # student -> (after this cell, a new cell's source)
EXPECTED = {  # student -> (answers replaced, expected autograded points per test cell)
    "reference": ({}, {"q1_1_clip_tests": 4.0, "q1_2_double_tests": 2.0, "q1_3_cudnn_tests": 1.0,
                       "q1_4_total_tests": 4.0, "q2_1_area_tests": 2.0, "q2_2_volume_tests": 2.0,
                       "b1_1_negate_tests": 0.0}),
    # A quarter of Question 1.4's 4 points for the skip; Question 2.2 accepts the volume of the area as graded.
    "skips_and_carries": ({"q1_4_total": SKIPS_THE_LOOP, "q2_1_area": WRONG_AREA},
                          {"q1_4_total_tests": 1.0, "q2_1_area_tests": 0.0, "q2_2_volume_tests": 2.0}),
    "redefines": ({"q1_4_total": SWITCHES_OFF, "q2_1_area": WRONG_AREA},
                  {"q1_1_clip_tests": 4.0, "q1_4_total_tests": 0.0, "q2_1_area_tests": 0.0, "q2_2_volume_tests": 0.0}),
    "no_edge": ({"q1_1_clip": NO_EDGE}, {"q1_1_clip_tests": 3.0, "q1_2_double_tests": 2.0}),
    "shows_a_number": ({"q1_1_clip": SHOWS_A_NUMBER}, {"q1_1_clip_tests": 3.0}),
    "half_bonus": ({"b1_1_negate": HALF_NEGATE}, {"b1_1_negate_tests": 0.0}),
    "tampers": ({"q1_1_clip": TAMPERING_NO_EDGE}, {"q1_1_clip_tests": 0.0, "q1_2_double_tests": 2.0}),
    "bypass": ({"q1_2_double": BYPASS}, {"q1_1_clip_tests": 4.0, "q1_2_double_tests": 0.0}),
    "lying": ({"q1_1_clip": LYING_EDGE}, {"q1_1_clip_tests": 0.0, "q1_2_double_tests": 2.0}),
}
BONUS_EXTRA = {"reference": 2.0, "half_bonus": 1.0}  # extra credit of b1_1_negate_tests


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = make_root(tmp_path_factory.mktemp("partial-root"), LAB_TEXT)
    (root / "utils.py").write_text(UTILS)
    (root / "README.md").write_text("| Lab | Topic | Points |\n| --- | --- | --- |\n| Lab 0 | tiny | 15 + 2 bonus |\n")
    assert build.main([LAB], root) == 0
    source = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    reference = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"), source)
    courses = [make_course_dir(tmp_path_factory.mktemp(name) / "course", [LAB], root)
               for name in ("partial", "partial-workers")]
    for course in courses:
        for student, (answers, _) in EXPECTED.items():
            nb = reference
            for cell, text in answers.items():
                nb = replace_cell_source(nb, cell, text)
            if student in INSERTED:
                nb = insert_after(nb, *INSERTED[student])
            write_notebook(nb, course / "submitted" / student / LAB / f"{LAB}.ipynb")
    course, workers_course = courses
    plain_scores = plain_autograde_scores(course)
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    # Two workers on one SQLite gradebook: each submission's nbgrader process executes and records it, and the
    # partial credit it writes must reach the gradebook as on the other routes.
    _, workers_scores = grade.grade_lab(workers_course, LAB, progress=False, workers=2)
    return course, plain_scores, outcomes, scores, workers_scores, root


def insert_after(nb, gid: str, source: str):
    """A copy of ``nb`` with a new student code cell after cell ``gid``."""
    nb = nbformat.from_dict(nb)
    index = next(i for i, cell in enumerate(nb.cells) if cell.metadata.get("nbgrader", {}).get("grade_id") == gid)
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    return nb


@pytest.mark.parametrize("student", EXPECTED)
def test_partial_credit_is_the_same_on_every_route(graded, student):
    _, plain_scores, outcomes, scores, workers_scores, _ = graded
    for route, table in (("plain nbgrader autograde", plain_scores), ("course grade", scores),
                         ("course grade --workers 2", workers_scores)):
        cells = table[student].cells
        got = {gid: cells[gid].auto_score for gid in EXPECTED[student][1]}
        assert got == EXPECTED[student][1], f"{route}: {student}: {got} ({outcomes[student]})"
        if student in BONUS_EXTRA:
            assert cells["b1_1_negate_tests"].extra_credit == BONUS_EXTRA[student], (
                f"{route}: {student}: the bonus cell's share of its 2 points is its extra credit")


def test_the_failed_check_is_explained_in_the_autograded_notebook_and_feedback(graded):
    course, *_ = graded
    nb = read_notebook(course / "autograded" / "no_edge" / LAB / f"{LAB}.ipynb")
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q1_1_clip_tests")
    text = str(cell.outputs)
    assert "FAILED the edge low == high (weight 1 of 4)" in text and "clip(-3.0, 2.0, 2.0) must be 2.0" in text, text
    result = run_nbgrader(course, ["generate_feedback", LAB, "--force"])
    assert result.ok, result.tail(30)
    html = next((course / "feedback" / "no_edge" / LAB).glob("*.html")).read_text()
    assert "Some checks failed" in html and "FAILED the edge low == high (weight 1 of 4)" in html, (
        "the feedback lists the failed check")
    assert "clip(-3.0, 2.0, 2.0), 2.0" not in html, "never the hidden test's source"


VARIANTS = f"""
SKIPS = {{"q1_4_total": [("torch.sum", {SKIPS_THE_LOOP!r})],
          "q1_1_clip": [("no edge case", {NO_EDGE!r})]}}  # no method check: it keeps 3 of 4 points
WRONG = {{"q1_4_total": [("the first element twice", {FIRST_TWICE!r})]}}
"""


def test_course_check_orders_the_prepared_answers(graded):
    *_, root = graded
    (root / "labs" / LAB / "variants.py").write_text(VARIANTS)
    problems, orders = check.check_order(LAB, root, None)  # runs course/cli/harness.py on the lab's prepared answers
    assert (orders["q1_4"].skips, orders["q1_4"].mistakes) == ({"torch.sum": 1.0}, {"the first element twice": 3.0}), (
        "the skip earns a quarter of Question 1.4, the answer with one mistake the weight of its passed checks")
    assert [str(p) for p in problems] == [
        "lab0: Question 1.1, order of grades: the skip 'no edge case' earns 3 of 4: more than a quarter (1; "
        "a check(..., method=True) block must catch it)"], problems
