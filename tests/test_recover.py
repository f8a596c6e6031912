"""A submission that lost its nbgrader metadata is graded from its answers (course/grader/recover.py), on every route.

The fixture lab's reference and blank with every cell's nbgrader metadata and cell id removed (nbformat 4.4, as a
notebook pasted into a fresh one or saved by an editor that drops metadata): the reference earns exactly the
reference's autograded points, the blank zero, through ``course grade`` and plain ``nbgrader autograde``; an answer
that cannot be placed (two candidate written answers between the same anchors) makes the status ``needs-TA``.
"""
from __future__ import annotations

import copy

import nbformat
import pytest
from fixture_lab import LAB, POINTS, built_root, plain_autograde_scores  # noqa: E402

from course.cli import grade  # noqa: E402
from course.cli.nbgrader_run import make_course_dir  # noqa: E402
from course.common.notebooks import grade_id, make_submission, read_notebook  # noqa: E402
from course.grader.recover import recover_metadata, release_of  # noqa: E402

FULL = {"q1_1_add_tests": 3.0, "q1_2_scale_tests": 2.0}


def stripped(nb, extra_note_after: str | None = None):
    """``nb`` without nbgrader metadata or cell ids, as nbformat 4.4; optionally a student's markdown note added
    after the cell ``extra_note_after``."""
    result = copy.deepcopy(nb)
    cells = []
    for cell in result.cells:
        gid = grade_id(cell)
        cell.metadata.pop("nbgrader", None)
        cell.pop("id", None)
        cells.append(cell)
        if extra_note_after is not None and gid == extra_note_after:
            note = nbformat.v4.new_markdown_cell("My own note: I am not sure about this one.")
            note.pop("id", None)
            cells.append(note)
    result.cells = cells
    result.nbformat, result.nbformat_minor = 4, 4
    return result


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = built_root(tmp_path_factory.mktemp("recover-root"))
    source = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    return root, source, release, make_submission(release, source, set(POINTS))


def test_alignment_labels_every_cell_and_names_what_it_cannot_place(lab):
    _, source, release, reference = lab
    nb = stripped(reference)
    recovery = recover_metadata(nb, release_of(source), source)
    assert [grade_id(c) for c in nb.cells if grade_id(c)] == [grade_id(c) for c in reference.cells if grade_id(c)]
    assert recovery.unplaced == [] and "q1_1_add" in recovery.answers, recovery
    assert [c.source for c in nb.cells] == [c.source for c in reference.cells], "recovery changes no source"
    ambiguous = stripped(reference, extra_note_after="q1_3_answer")
    assert recover_metadata(ambiguous, release_of(source), source).unplaced == ["q1_3_answer"]


@pytest.fixture(scope="module")
def graded(lab, tmp_path_factory):
    root, _, release, reference = lab
    course = make_course_dir(tmp_path_factory.mktemp("recover") / "course", [LAB], root)
    submissions = {"stripped_reference": stripped(reference), "stripped_blank": stripped(release),
                   "ambiguous": stripped(reference, extra_note_after="q1_3_answer")}
    for student, nb in submissions.items():
        folder = course / "submitted" / student / LAB
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{LAB}.ipynb", version=4)
    plain_scores = plain_autograde_scores(course)
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    return plain_scores, outcomes, scores


@pytest.mark.parametrize("student, expected", [("stripped_reference", FULL), ("stripped_blank", dict.fromkeys(FULL, 0.0)),
                                               ("ambiguous", FULL)])
def test_a_stripped_submission_scores_from_its_answers_on_every_route(graded, student, expected):
    plain_scores, outcomes, scores = graded
    for route, table in (("plain nbgrader autograde", plain_scores), ("course grade", scores)):
        got = {gid: table[student].cells[gid].auto_score for gid in FULL}
        assert got == expected, f"{route}: {student}: {got} ({outcomes[student]})"
    if student == "stripped_reference":
        assert scores[student].cells["b1_1_square_tests"].extra_credit == POINTS["b1_1_square"]


def test_the_status_says_when_a_ta_must_look(graded):
    _, outcomes, _ = graded
    assert outcomes["stripped_reference"].status == "ok", outcomes["stripped_reference"]
    assert any("nbgrader metadata was missing" in note for note in outcomes["stripped_reference"].notes)
    ambiguous = outcomes["ambiguous"]
    assert ambiguous.status == "needs-TA" and "q1_3_answer" in ambiguous.reason, ambiguous


@pytest.mark.parametrize("lab_name", ["lab1", "lab2", "lab3"])
def test_every_lab_s_stripped_reference_and_blank_align_completely(lab_name):
    from course.common.paths import REPO_ROOT

    source = read_notebook(REPO_ROOT / "source" / lab_name / f"{lab_name}.ipynb")
    release = read_notebook(REPO_ROOT / "release" / lab_name / f"{lab_name}.ipynb")
    for name, nb in (("reference", make_submission(release, source)), ("blank", release)):
        expected = [grade_id(c) for c in nb.cells if grade_id(c)]
        bare = stripped(nb)
        recovery = recover_metadata(bare, release_of(source), source)
        assert recovery.unplaced == [], f"{lab_name} {name}: {recovery}"
        assert [grade_id(c) for c in bare.cells if grade_id(c)] == expected, f"{lab_name} {name}: {recovery}"
