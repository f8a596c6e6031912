"""Grading from staged, repaired copies (course.cli.submission): each repair, its note, and its exact scores.

The unit tests stage submissions of the fixture lab0 without nbgrader; one ``grade_lab`` call then grades a
class holding one submission per repair and checks every cell's score.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

import nbformat
import pytest
from fixture_lab import LAB, built_root  # noqa: E402

from course.cli import grade  # noqa: E402
from course.cli.nbgrader_run import make_course_dir  # noqa: E402
from course.cli.submission import NO_NOTEBOOK, Instructor, stage_submission  # noqa: E402
from course.common.notebooks import grade_id, make_submission, read_notebook, replace_cell_source, write_notebook  # noqa: E402
from course.common.scores import read_scores  # noqa: E402

FULL = {"q1_1_add_tests": 3.0, "q1_2_scale_tests": 2.0, "q1_3_answer": 0.0, "b1_1_square_tests": 1.0}
ZERO = dict.fromkeys(FULL, 0.0)
ANCHORS = ["intro", "setup_imports", "q1_1_add", "q1_1_add_tests", "q1_2_scale", "q1_2_scale_tests", "q1_3_answer",
           "b1_1_square", "b1_1_square_tests"]  # the fixture's graded and locked cells, in order
WRONG_SCALE = "def scale(x, factor_per_unit):\n    return x + factor_per_unit"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return built_root(tmp_path_factory.mktemp("submission-root"))


@pytest.fixture(scope="module")
def notebooks(root):
    """(reference submission, blank release) of the fixture lab."""
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    return make_submission(release, read_notebook(root / "source" / LAB / f"{LAB}.ipynb")), release


@pytest.fixture
def course(root, tmp_path) -> Path:
    return make_course_dir(tmp_path / "course", [LAB], root)


def folder(course: Path, student: str) -> Path:
    path = course / "submitted" / student / LAB
    path.mkdir(parents=True, exist_ok=True)
    return path


def submit(course: Path, student: str, nb, name: str = f"{LAB}.ipynb") -> Path:
    path = folder(course, student) / name
    write_notebook(nb, path)
    return path


def stage(course: Path, student: str):
    return stage_submission(course, LAB, student, course.parent / "staging")


def ids(nb) -> list[str]:
    return [gid for cell in nb.cells if (gid := grade_id(cell))]


def index(nb, gid: str) -> int:
    return next(i for i, cell in enumerate(nb.cells) if grade_id(cell) == gid)


def answer(nb, gid: str) -> str:
    return nb.cells[index(nb, gid)].source


def without(nb, *gids: str):
    result = copy.deepcopy(nb)
    result.cells = [cell for cell in result.cells if grade_id(cell) not in gids]
    return result


def duplicated(nb, gid: str, source: str | None = None, at: int | None = None):
    """``nb`` with a copy of cell ``gid`` (same grade id, a new cell id) inserted at ``at`` (default: the end)."""
    result = copy.deepcopy(nb)
    twin = copy.deepcopy(result.cells[index(result, gid)])
    twin["id"] = f"{gid}-copy"
    twin.source = twin.source if source is None else source
    result.cells.insert(len(result.cells) if at is None else at, twin)
    return result


def moved(nb, gids: list[str], before: str | None):
    """``nb`` with the cells ``gids`` (and the ordinary cells right after each) moved before ``before`` (None: end)."""
    result = copy.deepcopy(nb)
    block = []
    for gid in gids:
        start = index(result, gid)
        end = start + 1
        while end < len(result.cells) and grade_id(result.cells[end]) is None:
            end += 1
        block += result.cells[start:end]
        del result.cells[start:end]
    at = len(result.cells) if before is None else index(result, before)
    result.cells[at:at] = block
    return result


def tampered(nb):
    """The blank answer to Q1.1 with its test cell replaced by ``pass`` worth 30 points, under another kernel."""
    result = replace_cell_source(nb, "q1_1_add_tests", "pass")
    result.cells[index(result, "q1_1_add_tests")].metadata.nbgrader["points"] = 30
    result.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    return result


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------
# Staging without nbgrader
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["reference", "blank"])
def test_an_honest_submission_is_staged_unchanged(course, notebooks, which):
    nb = notebooks[0] if which == "reference" else notebooks[1]
    submit(course, "ada", nb)
    staged = stage(course, "ada")
    assert staged.notes == [] and staged.flags == [] and staged.reason == "", staged
    out = read_notebook(staged.notebook)
    assert [(c.cell_type, c.source) for c in out.cells] == [(c.cell_type, c.source) for c in nb.cells], \
        "an honest notebook must be graded exactly as submitted"


@pytest.mark.parametrize(
    "edit, notes, expected_order",
    [
        (lambda nb: without(nb, "q1_1_add_tests", "setup_imports"),
         ["missing cells restored from the instructor's notebook: setup_imports, q1_1_add_tests"], ANCHORS),
        (lambda nb: without(nb, "q1_2_scale"),
         ["missing answer cells restored as the release stub: q1_2_scale"], ANCHORS),
        (lambda nb: duplicated(nb, "q1_1_add_tests"), ["duplicate locked cells dropped: q1_1_add_tests"], ANCHORS),
        (lambda nb: duplicated(nb, "q1_2_scale", WRONG_SCALE, at=index(nb, "q1_2_scale")),
         ["duplicate answer cells kept as ordinary cells after the first: q1_2_scale"], ANCHORS),
        (lambda nb: moved(nb, ["q1_2_scale", "q1_2_scale_tests"], None),
         ["cells put back in the instructor's order: q1_2_scale, q1_2_scale_tests"], ANCHORS),
        (tampered,
         ["kernelspec 'ir' replaced by the instructor's 'python3'",
          "edited locked cells restored from the instructor's notebook: q1_1_add_tests",
          "nbgrader metadata restored: q1_1_add_tests (points 30.0 -> 3.0)"], ANCHORS),
    ],
    ids=["deleted-locked", "deleted-answer", "duplicated-test", "duplicated-answer", "reordered", "tampered"],
)
def test_each_repair_leaves_its_note_and_the_instructor_s_cell_order(course, notebooks, edit, notes, expected_order):
    submit(course, "ada", edit(notebooks[1]))
    staged = stage(course, "ada")
    assert staged.notes == notes
    assert ids(read_notebook(staged.notebook)) == expected_order, "every graded and locked cell once, in order"


def test_restored_cells_are_the_release_cells_at_their_place(course, notebooks):
    reference, release = notebooks
    submit(course, "ada", without(reference, "q1_1_add_tests", "q1_2_scale"))
    out = read_notebook(stage(course, "ada").notebook)
    release_source = {grade_id(c): c.source for c in release.cells}
    assert out.cells[index(out, "q1_2_scale")].source == release_source["q1_2_scale"], "a deleted answer is the stub"
    assert "raise NotImplementedError()" in release_source["q1_2_scale"]
    assert out.cells[index(out, "q1_1_add_tests")].source == release_source["q1_1_add_tests"]
    assert "add(-40, 17)" not in json.dumps(nbformat.v4.writes(out)), "staged copies never carry hidden tests"
    assert out.cells[index(out, "q1_1_add_tests") - 1].source == answer(reference, "q1_1_add"), \
        "a restored cell comes after the cells that preceded it"


def test_reordering_keeps_the_student_cells_with_the_cell_they_followed(course, notebooks):
    nb = copy.deepcopy(notebooks[0])
    nb.cells.insert(index(nb, "q1_1_add") + 1, nbformat.v4.new_code_cell("HELPER = 1"))
    submit(course, "ada", moved(nb, ["q1_1_add"], "b1_1_square_tests"))
    out = read_notebook(stage(course, "ada").notebook)
    assert out.cells[index(out, "q1_1_add") + 1].source == "HELPER = 1"
    assert index(out, "q1_1_add") < index(out, "q1_1_add_tests")


def test_unknown_grade_ids_become_ordinary_cells(course, notebooks):
    nb = copy.deepcopy(notebooks[0])
    nb.cells[index(nb, "q1_1_add")].metadata.nbgrader["grade_id"] = "my_add"
    submit(course, "ada", nb)
    staged = stage(course, "ada")
    assert staged.notes == ["unknown grade ids, kept as ordinary cells: my_add",
                            "missing answer cells restored as the release stub: q1_1_add"]
    out = read_notebook(staged.notebook)
    assert any("return a + b" in c.source and "nbgrader" not in c.metadata for c in out.cells)


@pytest.mark.parametrize(
    "names, newest, chosen, note",
    [
        (["lab0 (1).ipynb"], None, "lab0 (1).ipynb", "graded 'lab0 (1).ipynb' as lab0.ipynb"),
        (["lab0 (1).ipynb", "lab0.ipynb"], "lab0 (1).ipynb", "lab0.ipynb",
         "2 notebooks submitted ('lab0 (1).ipynb', 'lab0.ipynb'): graded 'lab0.ipynb', the release name"),
        (["draft.ipynb", "final.ipynb"], "draft.ipynb", "draft.ipynb",
         "2 notebooks submitted ('draft.ipynb', 'final.ipynb'): graded 'draft.ipynb', the most recently modified"),
    ],
    ids=["renamed", "several-release-name-first", "several-newest"],
)
def test_the_notebook_graded_and_its_note(course, notebooks, names, newest, chosen, note):
    for number, name in enumerate(names):
        path = submit(course, "ada", notebooks[name != chosen], name)
        os.utime(path, (1_700_000_000 + 10 * (name == newest) + number, 1_700_000_000 + 10 * (name == newest) + number))
    staged = stage(course, "ada")
    assert staged.notes == [note]
    assert staged.notebook.name == f"{LAB}.ipynb"
    assert answer(read_notebook(staged.notebook), "q1_1_add") == answer(notebooks[0], "q1_1_add"), \
        f"{chosen} must be the one graded"


def test_extra_files_are_never_staged_and_submitted_is_never_changed(course, notebooks, root):
    where = folder(course, "ada")
    submit(course, "ada", notebooks[0])
    (where / "timestamp.txt").write_text("2024-03-01 10:00:00.000000 UTC")
    (where / "submission_secret.txt").write_text("0123abcd")  # nbgrader's exchange writes it: normal, not named
    (where / "math.py").write_text("def isclose(*args, **kwargs):\n    return False\n")
    (where / "sitecustomize.py").write_text("import os\n")
    (where / "numpy").mkdir()
    (where / "numpy" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    (where / "utils.py").write_text("SCALE = 'teaching'\n")  # edited: named
    (where / "assets").mkdir()
    (where / "assets" / "figure.png").write_bytes((root / "assets" / "figure.png").read_bytes())  # as released: not named
    (where / ".ipynb_checkpoints").mkdir()
    before = digest(course / "submitted")
    staged = stage(course, "ada")
    assert staged.notes == ["ignored extra files: math.py, numpy/, sitecustomize.py, utils.py"]
    assert sorted(p.name for p in staged.notebook.parent.iterdir()) == [f"{LAB}.ipynb", "timestamp.txt"]
    assert (staged.notebook.parent / "timestamp.txt").read_text() == "2024-03-01 10:00:00.000000 UTC", "late penalties need it"
    assert digest(course / "submitted") == before, "staging never changes a submission"


def test_an_unreadable_timestamp_is_dropped_with_a_note(course, notebooks):
    submit(course, "ada", notebooks[0])
    (folder(course, "ada") / "timestamp.txt").write_text("yesterday")
    staged = stage(course, "ada")
    assert staged.notes == ["timestamp.txt unreadable ('yesterday'): graded without it, check lateness by hand"]
    assert not (staged.notebook.parent / "timestamp.txt").exists()


@pytest.mark.parametrize(
    "content, reason",
    [
        (None, NO_NOTEBOOK),
        ('{"cells": [{"cell_type": "code", "sour', "not a valid notebook (truncated or invalid JSON: "),
        ('{"hello": 1}', "not a valid notebook (JSON without notebook cells)"),
        (b"\xff\xfe\x00garbage", "not a valid notebook (not UTF-8 text)"),
    ],
    ids=["missing", "truncated", "not-a-notebook", "binary"],
)
def test_nothing_to_grade_has_a_reason(course, content, reason):
    where = folder(course, "ada")
    if isinstance(content, str):
        (where / f"{LAB}.ipynb").write_text(content)
    elif content is not None:
        (where / f"{LAB}.ipynb").write_bytes(content)
    staged = stage(course, "ada")
    assert not staged.gradable and staged.zero and staged.reason.startswith(reason), staged


def test_a_lenient_read_keeps_the_cells_of_a_schema_invalid_notebook(course, notebooks):
    raw = json.loads(nbformat.v4.writes(notebooks[0]))
    for cell in raw["cells"]:
        cell.pop("id", None)
        cell.pop("outputs", None)
    raw["cells"].append({"cell_type": "banana", "source": "?"})
    (folder(course, "ada") / f"{LAB}.ipynb").write_text(json.dumps(raw))
    staged = stage(course, "ada")
    assert staged.notes == [f"unreadable cells dropped: {len(raw['cells']) - 1}"]
    out = read_notebook(staged.notebook)
    assert [c.source for c in out.cells] == [c.source for c in notebooks[0].cells]


def test_instructor_reference_is_the_release(root, notebooks):
    reference = Instructor.load(root, LAB).reference
    release = {grade_id(c): c for c in notebooks[1].cells if grade_id(c)}
    assert list(reference) == ANCHORS
    assert {g: c.source for g, c in reference.items()} == {g: c.source for g, c in release.items()}


# ---------------------------------------------------------------------------------------------------------------
# Grading: one class, one submission per repair, exact scores
# ---------------------------------------------------------------------------------------------------------------
def test_grading_a_class_from_staged_copies(course, notebooks):
    reference, blank = notebooks
    submit(course, "deleted_locked", without(reference, "q1_1_add_tests", "setup_imports"))
    (folder(course, "deleted_locked") / "timestamp.txt").write_text("2024-03-01 10:00:00.000000 UTC")
    submit(course, "deleted_answer", without(reference, "q1_2_scale"))
    wrong_then_right = replace_cell_source(reference, "q1_2_scale", WRONG_SCALE)
    wrong_then_right = duplicated(wrong_then_right, "q1_2_scale", answer(reference, "q1_2_scale"),
                                  at=index(reference, "q1_2_scale") + 1)
    submit(course, "duplicated", duplicated(wrong_then_right, "q1_1_add_tests"))
    submit(course, "reordered", moved(moved(reference, ["q1_1_add_tests"], "q1_1_add"),
                                      ["q1_2_scale", "q1_2_scale_tests"], None))
    submit(course, "shadow", reference)
    (folder(course, "shadow") / "math.py").write_text("def isclose(*args, **kwargs):\n    return False\n")
    (folder(course, "shadow") / "utils.py").write_text("raise ImportError('a student utils.py was imported')\n")
    submit(course, "renamed", replace_cell_source(reference, "q1_1_add", "import inspect\n\ndef add(a, b):\n    return a + b"),
           "lab0 (1).ipynb")
    for name, nb, stamp in [("draft.ipynb", blank, 1_700_000_000), ("final (2).ipynb", reference, 1_700_000_100)]:
        os.utime(submit(course, "several", nb, name), (stamp, stamp))
    submit(course, "tampered", tampered(replace_cell_source(reference, "q1_1_add", answer(blank, "q1_1_add"))))
    folder(course, "missing")
    (folder(course, "missing") / "notes.txt").write_text("sorry, forgot the notebook")
    (folder(course, "truncated") / f"{LAB}.ipynb").write_text(nbformat.v4.writes(reference)[:300])

    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    got = {s: {gid: c.score for gid, c in sub.cells.items()} for s, sub in scores.items()}
    q1_1_blank = {**FULL, "q1_1_add_tests": 0.0}
    expected = {
        "deleted_locked": FULL,  # the deleted test is restored and its answer is right; so is the deleted import
        "deleted_answer": {**FULL, "q1_2_scale_tests": 0.0},
        "duplicated": FULL,  # the test counted once; the later, right copy of the answer ran last
        "reordered": FULL,
        "shadow": FULL,  # neither math.py nor utils.py reached the kernel
        "renamed": FULL,
        "several": FULL,  # the newest notebook
        "tampered": q1_1_blank,  # the test cell and its points are the instructor's again
        "missing": ZERO,
        "truncated": ZERO,
    }
    assert got == expected
    status = {s: o.status for s, o in outcomes.items()}
    assert status == {**dict.fromkeys(expected, "ok"), "missing": "failed", "truncated": "failed"}
    assert outcomes["missing"].reason == NO_NOTEBOOK
    assert outcomes["truncated"].reason.startswith("not a valid notebook (truncated or invalid JSON")
    assert outcomes["missing"].notes == ["ignored extra files: notes.txt"]
    assert outcomes["shadow"].notes == ["ignored extra files: math.py, utils.py"]
    assert not (course / "autograded" / "shadow" / LAB / "math.py").exists(), "extra files never reach the kernel's folder"
    assert outcomes["renamed"].notes == ["graded 'lab0 (1).ipynb' as lab0.ipynb"]
    assert outcomes["renamed"].flags == ["q1_1_add: import inspect"], "flags are reported, and change no score"
    assert all(not o.flags for s, o in outcomes.items() if s != "renamed")
    assert outcomes["tampered"].notes[0] == "kernelspec 'ir' replaced by the instructor's 'python3'"

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", course_id="efficient-ai") as gb:
        assert str(gb.find_submission(LAB, "deleted_locked").timestamp).startswith("2024-03-01 10:00:00"), \
            "the submission's timestamp reaches the gradebook (late penalties)"
        for student in ("missing", "truncated"):
            grades = [g for nb in gb.find_submission(LAB, student).notebooks for g in nb.grades]
            assert sorted(g.name for g in grades) == sorted(FULL)
            assert all(g.auto_score == 0 and not g.needs_manual_grade for g in grades), "zero, nothing left to grade"
    rows = {line.split(",")[0]: line for line in (course / "grading" / LAB / "grades.csv").read_text().splitlines()}
    assert rows["student"].startswith("student,lab,status,reason,notes,flags,")
    assert rows["missing"].startswith(f"missing,{LAB},failed,{NO_NOTEBOOK},ignored extra files: notes.txt,,")
    assert ",q1_1_add: import inspect," in rows["renamed"]
    assert read_scores(course, LAB).keys() == expected.keys(), "every student is in the gradebook"


def test_nothing_to_grade_takes_back_an_earlier_bonus(course):
    """A submission recorded as zero loses the bonus test points an earlier run gave it; a TA's extra credit on a
    written answer stays."""
    from nbgrader.api import Gradebook

    from course.cli.submission import record_zero
    from course.common.paths import course_directory

    grade.prepare_gradebook(course, LAB)
    record_zero(course, LAB, "zed")
    with Gradebook(course_directory(course).db_url) as gb:
        gb.find_grade("b1_1_square_tests", LAB, LAB, "zed").extra_credit = 1.0  # what an earlier honest run recorded
        gb.find_grade("q1_3_answer", LAB, LAB, "zed").extra_credit = 0.5  # what a TA entered
        gb.db.commit()
    record_zero(course, LAB, "zed")
    cells = read_scores(course, LAB)["zed"].cells
    assert cells["b1_1_square_tests"].score == 0 and cells["b1_1_square_tests"].max_score == 1
    assert cells["q1_3_answer"].extra_credit == 0.5
