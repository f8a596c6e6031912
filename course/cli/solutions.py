"""solutions: after the deadline, ``python -m course solutions [labs...] --out DIR`` writes each lab's model solutions
for students, ``DIR/labN_solution.ipynb`` (it runs beside the bundle's files), checked before success.
"""
from __future__ import annotations

from pathlib import Path

from ..common.notebooks import (
    HIDDEN_BEGIN,
    HIDDEN_END,
    MARK_SCHEME_BEGIN,
    MARK_SCHEME_END,
    NotebookError,
    answer_source,
    cells_by_grade_id,
    is_solution,
    make_submission,
    marked_lines,
    read_notebook,
    strip_lines,
    write_notebook,
)
from ..common.paths import REPO_ROOT, release_notebook_path, source_notebook_path
from .lint import MIN_LEAK_LINE_CHARS

# A code cell's mark scheme is written as comments (docs/AUTHORING.md), a markdown cell's as plain lines.
CODE_MARK_SCHEME = ("# " + MARK_SCHEME_BEGIN, "# " + MARK_SCHEME_END)
SECRET_REGIONS = ((HIDDEN_BEGIN, HIDDEN_END), (MARK_SCHEME_BEGIN, MARK_SCHEME_END), CODE_MARK_SCHEME)


def _model(source: str) -> str:
    return strip_lines(source, *CODE_MARK_SCHEME, keep_inside=False)


def solution_notebook(source_nb, release_nb):
    """The students' solution notebook: the release (no hidden tests) with every solution cell holding the model
    solution or answer, without delimiters and mark schemes."""
    nb = make_submission(release_nb, source_nb)
    for cell in nb.cells:
        cell.source = _model(cell.source)
    return nb


def _secret_lines(source_nb) -> set[str]:
    """The stripped lines of every hidden test and mark scheme that appear nowhere else in the source notebook."""
    inside, outside = set(), set()
    for cell in source_nb.cells:
        regions = [[where for _, where in marked_lines(cell.source, *region)] for region in SECRET_REGIONS]
        for index, line in enumerate(cell.source.splitlines()):
            secret = any(where[index] == "inside" for where in regions)
            (inside if secret else outside).add(line.strip())
    return {line for line in inside - outside if len(line) >= MIN_LEAK_LINE_CHARS}


def check_solution_notebook(source_nb, solution_nb) -> list[str]:
    """Problems of a solution notebook (empty when none): a delimiter, a line of a hidden test or of a mark scheme,
    or a solution cell of the source whose model solution is not there in full."""
    text = "\n".join(cell.source for cell in solution_nb.cells)
    problems = [f"contains the delimiter {marker!r}" for region in SECRET_REGIONS[:2] for marker in region
                if marker in text]
    lines = {line.strip() for line in text.splitlines()}
    problems += [f"shows a line of a hidden test or mark scheme: {line[:60]!r}" for line in sorted(_secret_lines(source_nb) & lines)]
    answered = cells_by_grade_id(solution_nb)
    problems += [f"{gid}: the model solution is missing or incomplete"
                 for gid, cell in cells_by_grade_id(source_nb).items()
                 if is_solution(cell) and (gid not in answered or answered[gid].source != _model(answer_source(cell)))]
    return problems


def main(labs: list[str], out_dir: Path, root: Path = REPO_ROOT) -> int:
    """Write and check ``out_dir/<lab>_solution.ipynb`` of each lab; a lab that fails its check writes nothing."""
    for lab in labs:
        try:
            source_nb = read_notebook(source_notebook_path(root, lab))
            nb = solution_notebook(source_nb, read_notebook(release_notebook_path(root, lab)))
            problems = check_solution_notebook(source_nb, nb)
        except NotebookError as exc:  # a notebook is missing or a solution cell is not in the source
            problems = [str(exc)]
        if problems:
            print(f"solutions {lab}: FAILED\n" + "\n".join(problems))
            return 1
        path = out_dir.resolve() / f"{lab}_solution.ipynb"
        write_notebook(nb, path)
        print(f"solutions {lab}: {path} (checked: every model solution, no hidden test, no mark scheme)")
    return 0
