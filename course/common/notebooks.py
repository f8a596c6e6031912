"""Notebook helpers shared by every job: nbgrader cell kinds, grade ids, question headings, submissions.

Grade ids name the question they belong to (docs/AUTHORING.md): ``q1_1_gemm`` and ``q1_1_gemm_tests``
belong to "Question 1.1", ``b3_1_attn_module_mac`` to "Bonus 3.1". Grade ids never change after a release, but a
lab may renumber its questions: a heading then names its grade ids explicitly,
``#### Question 2.3 (3 points) <!-- grade ids q2_7_* -->`` (an HTML comment, which students do not see).
"""
from __future__ import annotations

import copy
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import nbformat

NB_VERSION = 4

QUESTION_ID_RE = re.compile(r"^(?P<kind>[qb])(?P<digits>\d+(?:_\d+)*)(?=_[a-z]|$)")
HEADING_RE = re.compile(
    r"^#{1,6}\s*(?P<kind>Question|Bonus)\s+(?P<number>\d+(?:\.\d+)*)\s*\((?P<points>\d+)\s*points?\)"
    r"(?:[ \t]*<!--\s*grade ids\s+(?P<ids>[qb]\d+(?:_\d+)*)_\*\s*-->)?", re.MULTILINE)
SOLUTION_BEGIN = "### BEGIN SOLUTION"
SOLUTION_END = "### END SOLUTION"
HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
HIDDEN_END = "### END HIDDEN TESTS"
MARK_SCHEME_BEGIN = "=== BEGIN MARK SCHEME ==="
MARK_SCHEME_END = "=== END MARK SCHEME ==="
# A built bonus cell has nbgrader ``points`` 0 and its points in ``metadata["efficient_ai"]["bonus_points"]``, so that
# nbgrader's maximum is the core total; they reach the gradebook as extra credit (docs/AUTHORING.md, "Points").
COURSE_METADATA = "efficient_ai"
BONUS_POINTS = "bonus_points"


class NotebookError(Exception):
    """A notebook that cannot be read or does not have the structure a job needs."""


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read an ``.ipynb`` file as nbformat v4; NotebookError (naming the file) when it is missing or malformed."""
    try:
        return nbformat.read(str(path), as_version=NB_VERSION)
    except FileNotFoundError:
        raise NotebookError(f"{path}: no such notebook") from None
    except Exception as exc:  # nbformat raises several types for malformed JSON
        raise NotebookError(f"{path}: not a readable notebook ({type(exc).__name__}: {exc})") from None


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write a notebook, creating the parent folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def nbgrader_meta(cell) -> dict:
    """The cell's nbgrader metadata, or an empty dict."""
    return dict(cell.get("metadata", {}).get("nbgrader", {}) or {})


def course_meta(cell) -> dict:
    """The cell's course metadata (``cell.metadata["efficient_ai"]``), or an empty dict."""
    meta = cell.get("metadata", {}).get(COURSE_METADATA, {})
    return dict(meta) if isinstance(meta, dict) else {}


def grade_id(cell) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def is_graded(cell) -> bool:
    return bool(nbgrader_meta(cell).get("grade"))


def is_solution(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def is_autograded_test(cell) -> bool:
    """A code cell nbgrader scores by running it: ``grade`` and not ``solution``."""
    return cell.cell_type == "code" and is_graded(cell) and not is_solution(cell)


def is_bonus_id(gid: str | None) -> bool:
    """Whether a grade id belongs to a bonus question (``b3_1_attn_module_mac_tests``)."""
    return (question_key(gid) or "").startswith("b")


def is_bonus_cell(cell) -> bool:
    """A graded cell of a bonus question."""
    return (is_graded(cell) or bool(nbgrader_meta(cell).get("task"))) and is_bonus_id(grade_id(cell))


def cell_points(cell) -> float:
    """The points of a graded cell as the lab states them: a built bonus cell's bonus points, else nbgrader's."""
    bonus = course_meta(cell).get(BONUS_POINTS)
    return float(nbgrader_meta(cell).get("points", 0) or 0) if bonus is None else float(bonus or 0)


def mark_bonus(cell) -> None:
    """Build step: a bonus cell's points move from nbgrader's ``points`` (then 0) to the course's ``bonus_points``;
    a cell already marked keeps its bonus points, any other cell is left alone."""
    if not is_bonus_cell(cell):
        return
    points = cell_points(cell)
    cell.metadata["nbgrader"]["points"] = 0
    cell.metadata[COURSE_METADATA] = {**course_meta(cell), BONUS_POINTS: int(points) if points.is_integer() else points}


def bonus_points(nb) -> dict[str, float]:
    """Grade id -> bonus points of every bonus grade cell of an instructor notebook. Read it from the course's own
    ``source/`` notebook, never from a submission (whose metadata the student can edit)."""
    return {grade_id(cell): cell_points(cell) for cell in nb.cells if is_bonus_cell(cell)}


def question_key(gid: str | None) -> str | None:
    """``q1_1_gemm_tests`` -> ``q1_1``; ids that name no question (``setup_imports``) -> None."""
    match = QUESTION_ID_RE.match(gid) if gid else None
    return f"{match['kind']}{match['digits']}" if match else None


def question_label(key: str) -> str:
    """``q2_1_2`` -> ``Question 2.1.2``; ``b3_1`` -> ``Bonus 3.1``."""
    return f"{'Question' if key[0] == 'q' else 'Bonus'} {key[1:].replace('_', '.')}"


def question_key_from_heading(kind: str, number: str) -> str:
    """(``Question``, ``2.1.2``) -> ``q2_1_2``."""
    return ("q" if kind == "Question" else "b") + number.replace(".", "_")


def question_sort_key(key: str) -> tuple:
    """Order questions as the lab does: by number, questions before bonus of the same number."""
    return tuple(int(part) for part in key[1:].split("_")) + (key[0] == "b",)


def heading_key(match: re.Match) -> str:
    """The question key of a ``HEADING_RE`` match: the grade ids it names (``<!-- grade ids q2_7_* -->``), else
    its number (``Question 2.3`` -> ``q2_3``)."""
    return match["ids"] or question_key_from_heading(match["kind"], match["number"])


@dataclass(frozen=True)
class Heading:
    """A question heading found in a markdown cell: the question key of its grade ids, its points, the cell, and
    the label students see (``Question 2.3``; it differs from ``question_label(key)`` when the heading names its grade
    ids explicitly)."""

    key: str
    points: int
    cell_index: int
    label: str = ""


def find_headings(nb) -> list[Heading]:
    """Every ``#### Question N.M (P points)`` / ``#### Bonus N.M (P points)`` heading, in order."""
    return [Heading(heading_key(match), int(match["points"]), index, f"{match['kind']} {match['number']}")
            for index, cell in enumerate(nb.cells) if cell.cell_type == "markdown"
            for match in HEADING_RE.finditer(cell.source)]


def question_labels(nb) -> dict[str, str]:
    """Question key -> the label its heading shows students (``{"q2_7": "Question 2.3"}`` for a renumbered question);
    a key without a heading is left out (``question_label`` names it by its grade ids)."""
    return {heading.key: heading.label for heading in find_headings(nb)}


def autograded_points_by_cell(nb) -> dict[str, float]:
    """Max points of each autograded test cell, by grade id (a bonus cell's bonus points)."""
    return {grade_id(cell): cell_points(cell) for cell in nb.cells if is_autograded_test(cell)}


def autograded_points_by_question(nb) -> dict[str, float]:
    """Max points of the autograded test cells, summed per question key."""
    totals: dict[str, float] = {}
    for cell in filter(is_autograded_test, nb.cells):
        key = question_key(grade_id(cell)) or grade_id(cell)
        totals[key] = totals.get(key, 0.0) + cell_points(cell)
    return totals


def marked_lines(source: str, begin: str, end: str, keepends: bool = False):
    """Each line of ``source`` with where it lies: ``"begin"`` or ``"end"`` (a delimiter line, matched stripped),
    ``"inside"`` or ``"outside"`` the region."""
    inside = False
    for line in source.splitlines(keepends=keepends):
        stripped = line.strip()
        if stripped in (begin, end):
            inside = stripped == begin
            yield line, "begin" if inside else "end"
        else:
            yield line, "inside" if inside else "outside"


def region_lines(source: str, begin: str, end: str) -> list[str]:
    """The lines between ``begin`` and ``end`` (as written, delimiters excluded)."""
    return [line for line, where in marked_lines(source, begin, end) if where == "inside"]


def strip_lines(source: str, begin: str, end: str, keep_inside: bool) -> str:
    """Remove the ``begin``/``end`` delimiter lines; keep or drop what lies between them."""
    kept = ("outside", "inside") if keep_inside else ("outside",)
    return "".join(line for line, where in marked_lines(source, begin, end, keepends=True) if where in kept).rstrip("\n")


def answer_source(source_cell) -> str:
    """What a student who wrote the reference answer submits: delimiters and mark schemes removed."""
    text = strip_lines(source_cell.source, SOLUTION_BEGIN, SOLUTION_END, keep_inside=True)
    return strip_lines(text, MARK_SCHEME_BEGIN, MARK_SCHEME_END, keep_inside=False)


def cells_by_grade_id(nb) -> dict[str, object]:
    return {gid: cell for cell in nb.cells if (gid := grade_id(cell))}


def make_submission(release_nb, source_nb, answered: set[str] | None = None):
    """A copy of ``release_nb`` whose solution cells in ``answered`` (None: all) hold the answers of ``source_nb``
    (NotebookError when one is missing from the source)."""
    reference = cells_by_grade_id(source_nb)
    submission = copy.deepcopy(release_nb)
    for cell in submission.cells:
        gid = grade_id(cell)
        if not is_solution(cell) or (answered is not None and gid not in answered):
            continue
        if gid not in reference:
            raise NotebookError(f"solution cell {gid!r} of the release is missing from the source notebook")
        cell.source = answer_source(reference[gid])
    return submission


def replace_cell_source(nb, gid: str, new_source: str):
    """A copy of ``nb`` whose cell ``gid`` holds ``new_source`` (NotebookError when no cell has that grade id)."""
    result = copy.deepcopy(nb)
    for cell in result.cells:
        if grade_id(cell) == gid:
            cell.source = new_source
            return result
    raise NotebookError(f"no cell with grade id {gid!r}")


def exec_cells(path: Path, grade_ids: list[str]) -> dict:
    """Execute the named cells of a notebook, in the order given, in one fresh namespace; return it.

    The namespace is a module registered as ``<notebook stem>_cells`` (a later call replaces it), so that tools that
    import a function's module by name (``torch.compile``, pickle) work. NotebookError when a named cell is missing.
    """
    cells = cells_by_grade_id(read_notebook(path))
    if missing := [gid for gid in grade_ids if gid not in cells]:
        raise NotebookError(f"{path}: no cell with grade id {missing[0]!r}")
    module = types.ModuleType(f"{path.stem}_cells")
    sys.modules[module.__name__] = module
    for gid in grade_ids:
        exec(compile(cells[gid].source, f"{path.name}:{gid}", "exec"), module.__dict__)
    return module.__dict__


def choose_notebook(folder: Path, lab: str) -> tuple[Path | None, str | None]:
    """The notebook to grade among the top-level ``*.ipynb`` of a submission folder, and a note (None for
    ``<lab>.ipynb`` alone). Of several, ``<lab>.ipynb`` is preferred, else the most recently modified one."""
    candidates = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    release_name = folder / f"{lab}.ipynb"
    if len(candidates) < 2:
        chosen = candidates[0] if candidates else None
        return chosen, None if chosen in (None, release_name) else f"graded {chosen.name!r} as {lab}.ipynb"
    if release_name in candidates:
        chosen, why = release_name, "the release name"
    else:
        chosen, why = max(candidates, key=lambda p: (p.stat().st_mtime, p.name)), "the most recently modified"
    names = ", ".join(repr(p.name) for p in candidates)
    return chosen, f"{len(candidates)} notebooks submitted ({names}): graded {chosen.name!r}, {why}"
