"""Every route to a grade gives the same score, and one submission's output, interrupt or failed regrade leaves
the others and the gradebook honest (the fixture lab0, graded for real; unit tests: tests/test_grading_limits.py).

- Plain ``nbgrader autograde`` (also what the formgrader's Autograde button runs) and ``course grade`` give the
  same scores to test cells tagged ``skip-execution`` or ``raises-exception`` and to a student cell posing as a
  locked instructor cell: zero for the cheat.
- A cell interrupted at the time limit that keeps running past nbclient's wait for its output
  (``CellTimeoutError``) makes the submission ``partial``, keeps its points and grades the later cells.
- A failed regrade clears the earlier run's scores instead of leaving them looking current.
- A 1 GiB output flood graded with ``--workers 2`` beside an honest reference: the reference keeps full marks, the
  flood is recorded with a readable note, and the grader's memory and the autograded notebook stay bounded.
"""
from __future__ import annotations

import copy
import csv
import os
import subprocess
import sys

import nbformat
import pytest
from fixture_lab import LAB, REPO, built_root, plain_autograde_scores  # noqa: E402

from course.cli import grade  # noqa: E402
from course.cli.nbgrader_run import make_course_dir  # noqa: E402
from course.common.notebooks import grade_id, make_submission, read_notebook, replace_cell_source, write_notebook  # noqa: E402

FULL = {"q1_1_add_tests": 3.0, "q1_2_scale_tests": 2.0, "b1_1_square_tests": 1.0}
CELL_TIMEOUT_S = "5"
OUTPUT_WAIT_S = "4"  # nbclient's own default; the course's is longer (busy machines)
# Defines scale, then outlives the interrupt at the cell time limit by more than the wait for its output.
LATE_SCALE = ("import time\n\ndef scale(x, factor_per_unit):\n    return x * factor_per_unit\n\ntry:\n"
              "    time.sleep(120)\nexcept KeyboardInterrupt:\n    time.sleep(10)")
# A student cell posing as an instructor cell: the guard would adopt what it patches.
FAKE_LOCKED = {"grade": False, "locked": True, "solution": False, "task": False, "schema_version": 3,
               "grade_id": "my_setup"}
WRONG_ON_HIDDEN = "def scale(x, factor_per_unit):\n    return 0 if x == 0.5 else x * factor_per_unit"
FLOOD_GIB = ("import sys\nchunk = 'x' * 2**20 + '\\n'\nfor _ in range(1024):  # 1 GiB in 1 MiB messages\n"
             "    sys.stdout.write(chunk)\n    sys.stdout.flush()\n\ndef add(a, b):\n    return a + b")


def tagged(nb, tag: str, which=lambda cell: cell.metadata.get("nbgrader", {}).get("grade")):
    result = copy.deepcopy(nb)
    for cell in result.cells:
        if which(cell):
            cell.metadata.setdefault("tags", []).append(tag)
    return result


def fake_locked_patch(nb):
    result = replace_cell_source(nb, "q1_2_scale", WRONG_ON_HIDDEN)
    at = next(i for i, cell in enumerate(result.cells) if grade_id(cell) == "q1_2_scale") + 1
    patch = nbformat.v4.new_code_cell("import math\nmath.isclose = lambda *args, **kwargs: True",
                                      metadata={"nbgrader": dict(FAKE_LOCKED)})
    result.cells.insert(at, patch)
    return result


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return built_root(tmp_path_factory.mktemp("routes-root"))


@pytest.fixture(scope="module")
def notebooks(root):
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    return make_submission(release, read_notebook(root / "source" / LAB / f"{LAB}.ipynb")), release


def points(scores, student):
    return {gid: cell.score for gid, cell in scores[student].cells.items() if cell.autograded}


CHEATS = {  # student -> (notebook from (reference, blank), expected test scores)
    "skipper": (lambda ref, blank: tagged(blank, "skip-execution"), dict.fromkeys(FULL, 0.0)),
    "excuser": (lambda ref, blank: tagged(blank, "raises-exception"), dict.fromkeys(FULL, 0.0)),
    "fake_locked": (lambda ref, blank: fake_locked_patch(ref), {**FULL, "q1_2_scale_tests": 0.0}),
    "honest": (lambda ref, blank: ref, FULL),
}


@pytest.fixture(scope="module")
def graded(root, notebooks, tmp_path_factory):
    """The cheats graded by plain nbgrader autograde, then the cheats and a late cell by course grade."""
    course = make_course_dir(tmp_path_factory.mktemp("routes") / "course", [LAB], root)
    for student, (make, _) in CHEATS.items():
        write_notebook(make(*notebooks), course / "submitted" / student / LAB / f"{LAB}.ipynb")
    env = {"EFFICIENT_AI_CELL_TIMEOUT_S": CELL_TIMEOUT_S, "EFFICIENT_AI_OUTPUT_WAIT_S": OUTPUT_WAIT_S}
    plain_scores = plain_autograde_scores(course, env)
    write_notebook(replace_cell_source(notebooks[0], "q1_2_scale", LATE_SCALE),
                   course / "submitted" / "late" / LAB / f"{LAB}.ipynb")
    monkeypatch = pytest.MonkeyPatch()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    finally:
        monkeypatch.undo()
    return course, plain_scores, outcomes, scores


@pytest.mark.parametrize("student", CHEATS)
def test_every_route_gives_the_same_score(graded, student):
    _, plain_scores, outcomes, scores = graded
    expected = CHEATS[student][1]
    assert points(plain_scores, student) == expected, f"plain nbgrader autograde: {student}"
    assert points(scores, student) == expected, f"course grade: {student}: {outcomes[student]}"


def test_removed_metadata_is_noted_for_the_ta(graded):
    _, _, outcomes, _ = graded
    assert any("tag 'skip-execution'" in note for note in outcomes["skipper"].notes), outcomes["skipper"]


def test_an_interrupt_that_misses_the_output_wait_is_partial_and_grading_goes_on(graded):
    _, _, outcomes, scores = graded
    late = outcomes["late"]
    assert late.status == "partial" and "CellTimeoutError" in late.reason and "(q1_2_scale)" in late.reason, late
    assert "the same in two runs" in late.reason and late.notes[0].startswith("graded twice"), (
        "what a busy machine can explain is graded once more before it is recorded")
    assert points(scores, "late") == FULL, "the interrupted answer cell defined scale; later cells were graded"


def test_a_failed_regrade_clears_the_earlier_scores(graded, monkeypatch):
    course, _, outcomes, scores = graded
    assert points(scores, "honest") == FULL and outcomes["honest"].status == "ok"
    # Starting its own kernel, nbgrader always takes longer than the 1 s limit, so this regrade fails for certain.
    again, scores_after = grade.grade_lab(course, LAB, students=["honest"], timeout_s=1, progress=False)
    outcome = again["honest"]
    assert outcome.status == "failed" and "time limit of 1 s" in outcome.reason, outcome
    assert "scores of an earlier run were cleared" in outcome.reason, outcome
    cells = scores_after["honest"].cells
    assert all(cells[gid].auto_score is None and cells[gid].needs_manual_grade for gid in FULL), cells
    rows = {row["student"]: row for row in csv.DictReader((course / "grading" / LAB / "grades.csv").read_text().splitlines())}
    assert set(rows) == set(outcomes), f"regrading one student keeps every other row of grades.csv: {sorted(rows)}"
    row = rows["honest"]
    assert row["status"] == "failed" and all(row[gid] == "" for gid in FULL), row
    assert not (course / "autograded" / "honest" / LAB).exists(), "no feedback from the earlier run's notebook"


def test_an_output_flood_beside_an_honest_reference_stays_bounded(root, notebooks, tmp_path):
    course = make_course_dir(tmp_path / "course", [LAB], root)
    write_notebook(notebooks[0], course / "submitted" / "honest" / LAB / f"{LAB}.ipynb")
    write_notebook(replace_cell_source(notebooks[0], "q1_1_add", FLOOD_GIB), course / "submitted" / "flood" / LAB / f"{LAB}.ipynb")
    proc = subprocess.Popen([sys.executable, "-m", "course", "grade", LAB, "--workers", "2", "--course-dir", str(course)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, output[-3000:]
    peak_mib = usage.ru_maxrss / 1024  # the largest process of the grading run (grader, nbgrader, kernels)
    notebook_mib = (course / "autograded" / "flood" / LAB / f"{LAB}.ipynb").stat().st_size / 2**20
    print(f"1 GiB flood with --workers 2: peak RSS of any grading process {peak_mib:.0f} MiB, "
          f"autograded notebook {notebook_mib:.2f} MiB")
    assert peak_mib < 1024 and notebook_mib < 4, (peak_mib, notebook_mib)
    rows = {row["student"]: row for row in csv.DictReader((course / "grading" / LAB / "grades.csv").read_text().splitlines())}
    assert rows["honest"]["status"] == "ok" and rows["honest"]["autograded_score"] == "6", rows["honest"]
    assert rows["flood"]["status"] in ("ok", "partial") and "MiB of output dropped" in rows["flood"]["notes"], rows["flood"]
