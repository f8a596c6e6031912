"""Red team: adversarial and faulty Lab 1 submissions graded as one class, next to honest students.

Every case of ``tests/redteam/lab1_redteam.py`` must end with its exact per-cell scores, read from the lab (zero
where the grader finds its tampering or it breaks, what its wrong answer earns alone where an attack is made
harmless without being seen, full marks on its honest questions); the honest students' grades must come out right and stay unchanged
after a vandal is graded in the same course folder; feedback must not carry hidden test source. The controls (the
same cheats graded with the guard and the sandbox off) are tests/test_redteam_controls.py: a module of their own, so
that the two test processes of the suite can grade them beside this one.
"""
from __future__ import annotations

import nbformat
import pytest
from lab1_redteam import (
    CASES,
    GRADING_ENV,
    LAB,
    REFERENCE,
    RELEASE,
    SOURCE,
    TEST_POINTS,
    autograded_scores,
    case_expected,
    environment,
    expected_scores,
    write_case,
)

from course.cli.feedback import generate_feedback
from course.cli.grade import grade_lab
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import grade_id, is_autograded_test, make_submission, question_key, write_notebook
from course.common.paths import REPO_ROOT
from course.common.scores import read_scores
from course.grader.sandbox import unavailable_reason

PARTIAL_ANSWERED = {"q1_1_gemm", "q1_2_latency", "q2_1_1_intensity", "q3_1_1_sdpa"}
# The honest partial student answers four questions: every test cell of another question scores zero (the blank
# release scores zero everywhere, course check), read from the lab.
PARTIAL_ZERO = {grade_id(c) for c in SOURCE.cells if is_autograded_test(c)
                and question_key(grade_id(c)) not in {question_key(gid) for gid in PARTIAL_ANSWERED}}
VANDAL = "zz_vandal"

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"the red team needs the grading sandbox: {unavailable_reason()} (scripts/test.sh installs bubblewrap)",
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The whole class graded with 2 workers; then the vandal graded alone, in the same course folder."""
    course = make_course_dir(tmp_path_factory.mktemp("redteam") / "course", [LAB], REPO_ROOT)
    write_notebook(REFERENCE, course / "submitted" / "honest_full" / LAB / f"{LAB}.ipynb")
    write_notebook(make_submission(RELEASE, SOURCE, PARTIAL_ANSWERED), course / "submitted" / "honest_partial" / LAB / f"{LAB}.ipynb")
    for case in CASES:
        if case.student != VANDAL:
            write_case(case, REFERENCE, course / "submitted" / case.student / LAB)
    with environment(GRADING_ENV):
        outcomes, _ = grade_lab(course, LAB, progress=False, workers=2)
        before = read_scores(course, LAB)
        others = sorted(course.glob(f"autograded/*/{LAB}/{LAB}.ipynb"))
        notebooks_before = {path: path.read_bytes() for path in others}
        vandal = next(case for case in CASES if case.student == VANDAL)
        write_case(vandal, REFERENCE, course / "submitted" / VANDAL / LAB)
        vandal_outcome, _ = grade_lab(course, LAB, students=[VANDAL], progress=False, workers=1)
    outcomes.update(vandal_outcome)
    return {"course": course, "outcomes": outcomes, "before": before, "after": read_scores(course, LAB),
            "notebooks_before": notebooks_before}


@pytest.mark.parametrize("case", CASES, ids=[case.student for case in CASES])
def test_case_scores_exactly(graded, case):
    got = autograded_scores(graded["after"], case.student)
    expected = case_expected(case)
    wrong = {gid: (got[gid], expected[gid]) for gid in TEST_POINTS if got[gid] != expected[gid]}
    outcome = graded["outcomes"][case.student]
    assert not wrong, (f"{case.student} ({case.what}) must score exactly as expected; (got, expected) per test "
                       f"cell: {wrong}; outcome: {outcome}")


def test_honest_students_score_right_and_are_untouched_by_the_others(graded):
    assert autograded_scores(graded["after"], "honest_full") == expected_scores(set()), (
        "the reference earns every autograded point, bonus included")
    assert autograded_scores(graded["after"], "honest_partial") == expected_scores(PARTIAL_ZERO)
    for student, scores in graded["before"].items():
        after = {gid: cell.score for gid, cell in graded["after"][student].cells.items()}
        assert after == {gid: cell.score for gid, cell in scores.cells.items()}, (
            f"grading {VANDAL} after {student} must not change {student}'s grades")
    for path, content in graded["notebooks_before"].items():
        assert path.read_bytes() == content, f"grading {VANDAL} must not touch {path}"


def test_failures_and_repairs_are_explained_to_the_ta(graded):
    outcomes = graded["outcomes"]
    for student in ("bad02_os_exit", "bad03_segfault"):
        text = f"{outcomes[student].reason} {' '.join(outcomes[student].notes)}"
        assert "kernel died" in text, f"{student}: the reason must say the kernel died, got {outcomes[student]}"
    for student in ("bad06_truncated", "bad07_no_notebook"):
        assert outcomes[student].status != "ok" and outcomes[student].reason, (
            f"{student} must be recorded as not gradable, with a reason: {outcomes[student]}")
    integrity = " ".join(outcomes["adv05_math_isclose"].notes + [outcomes["adv05_math_isclose"].reason])
    assert "math.isclose" in integrity, f"the TA must see what the guard found: {outcomes['adv05_math_isclose']}"
    assert outcomes["adv21_edited_utils"].notes, (
        f"adv21_edited_utils: the repair must be noted for the TA, got {outcomes['adv21_edited_utils']}")


def test_feedback_never_shows_hidden_tests(graded):
    # The lines looked for are read from the instructor notebook's hidden-test region (lab1_redteam.hidden_lines).
    smugglers = [case for case in CASES if case.feedback_must_not_contain]
    files = generate_feedback(graded["course"], LAB, [case.student for case in smugglers] + ["honest_full"])
    assert len(files) == len(smugglers) + 1, files
    for case in smugglers:
        html = (graded["course"] / "feedback" / case.student / LAB / f"{LAB}.html").read_text()
        for text in case.feedback_must_not_contain:
            assert text not in html, f"{case.student}'s feedback must not contain hidden test source {text!r}"
    # Control: the autograded notebook feedback is made from holds the lines, in the smuggler's own cell outputs
    # (printed and in its error), not only in the restored test cells.
    autograded = nbformat.read(graded["course"] / "autograded" / smugglers[0].student / LAB / f"{LAB}.ipynb", 4)
    printed = "".join(str(out) for cell in autograded.cells if cell.cell_type == "code" and not grade_id(cell)
                      for out in cell.get("outputs", []))
    assert all(text in printed for text in smugglers[0].feedback_must_not_contain), (
        "control: the smuggler's outputs did hold hidden test source before feedback was made")
