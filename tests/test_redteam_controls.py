"""Red-team controls: some of Lab 1's adversarial submissions graded with the grading guard and the sandbox off.

A cheat on a kernel-side rule (how an answer was computed, measured in the kernel, best effort) earns its points
there, so the red-team case that catches it proves something; cheats on correctness verdicts still earn nothing there,
because those verdicts are decided in the grader (tests/test_redteam.py grades every case with both on).
"""
from __future__ import annotations

import pytest
from lab1_redteam import (
    CASES,
    GRADING_ENV,
    LAB,
    REFERENCE,
    autograded_scores,
    case_expected,
    environment,
    expected_scores,
    write_case,
)

from course.cli.grade import grade_lab
from course.cli.nbgrader_run import make_course_dir
from course.common.paths import REPO_ROOT
from course.grader.sandbox import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None,
    reason=f"the red team needs the grading sandbox: {unavailable_reason()} (scripts/test.sh installs bubblewrap)",
)


# Controls, graded with the grading guard and the sandbox off. A rule about how an answer was computed is measured in
# the kernel (best effort): without the guard, rebinding its recorder earns the points. Every correctness verdict is
# decided in the grader: without the guard, cheats on those still earn nothing. With the guard their tampering is
# found and zeroes the cell; without it the cell earns exactly what the cheat's wrong answer earns alone (the checks
# it passes anyway, read from the lab: case_expected(case, guard=False)), and what the static scan finds (a recording
# bypass) still zeroes the cells that record calls.
GUARD_ONLY = ["adv01_global_recorder"]
BOUNDARY_ALONE = ["adv05_math_isclose", "adv09_input_transformer", "adv26_boundary_hooks"]


def test_controls_without_the_guard(tmp_path):
    course = make_course_dir(tmp_path / "course", [LAB], REPO_ROOT)
    cases = [case for case in CASES if case.student in GUARD_ONLY + BOUNDARY_ALONE]
    for case in cases:
        write_case(case, REFERENCE, course / "submitted" / case.student / LAB)
    with environment({**GRADING_ENV, "EFFICIENT_AI_GUARD": "off", "EFFICIENT_AI_SANDBOX": "off"}):
        _, scores = grade_lab(course, LAB, progress=False, workers=2)
    for case in cases:
        got = autograded_scores(scores, case.student)
        if case.student in GUARD_ONLY:
            assert got == expected_scores(set()), (
                f"control: without the guard {case.student}'s cheat on a kernel-side rule must earn every point "
                f"(else the red-team case proves nothing), got {got}")
        else:
            assert got == case_expected(case, guard=False), (
                f"without the guard {case.student} must still earn nothing by its cheat (the tests it attacks run in "
                f"the grader): exactly what its wrong answer earns alone; got {got}")
