"""Where a lab declares what ``course measure`` times: a markdown cell tagged ``measure``, right after the question
it measures, in ``labs/labN/labN.py`` (docs/AUTHORING.md, "Measured pieces").

The cell reads, in the lab's text file::

    # %% [markdown] deletable=false editable=false tags=["measure"]
    # *Timed after grading (no points):* the grading GPU times your `fn` at S = 1k, 4k and 16k ...
    #
    # ```measure
    # {"name": "...", "function": "...", ...}   # one piece: measure_spec.Piece's fields, a Python literal
    # ```

Students see the note (what is timed, at which shapes: it teaches where their kernel sits on the roofline and lets
them time the same shapes); ``course build`` removes the fenced declaration from the release (grade ids, tolerances
and time limits are the tool's, not the lesson's). The instructor notebook in ``source/`` keeps it: ``course
measure`` reads it there, in whichever course folder it runs. A markdown cell runs nothing, so the declaration
changes nothing a notebook executes. No torch here: the build and lint import this module.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

MEASURE_TAG = "measure"
FENCE_RE = re.compile(r"^```measure[ \t]*\n(?P<body>.*?)^```[ \t]*(?:\n|\Z)", re.MULTILINE | re.DOTALL)


def is_measure_cell(cell) -> bool:
    """Whether ``cell`` is a markdown cell tagged ``measure``."""
    return cell.get("cell_type") == "markdown" and MEASURE_TAG in (cell.get("metadata", {}).get("tags") or [])


def declarations(nb) -> list[tuple[int, dict]]:
    """(cell index, piece dict) of every declaration cell of ``nb``, in notebook order.

    Raises:
        ValueError: a tagged cell without exactly one fenced ``measure`` block, or one whose block is not a Python
            literal dict (the message names the cell).
    """
    found = []
    for index, cell in enumerate(nb.cells):
        if not is_measure_cell(cell):
            continue
        blocks = FENCE_RE.findall(cell.source)
        if len(blocks) != 1:
            raise ValueError(f"cell {index}: a cell tagged {MEASURE_TAG!r} needs exactly one ```measure block, "
                             f"found {len(blocks)}")
        try:
            piece = ast.literal_eval(blocks[0])  # data only: nothing in a declaration runs
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"cell {index}: the ```measure block is not a Python literal ({exc})") from None
        if not isinstance(piece, dict):
            raise ValueError(f"cell {index}: the ```measure block must be a dict, got {type(piece).__name__}")
        found.append((index, piece))
    return found


def student_note(source: str) -> str:
    """A declaration cell's text without its fenced block (what students see)."""
    return FENCE_RE.sub("", source).rstrip()


def clear_declarations(nb) -> bool:
    """Leave only the student note in each measure cell of ``nb`` (in place), as the release has it; whether any
    cell changed. ``recover.release_of`` derives the release the same way."""
    changed = False
    for cell in nb.cells:
        if is_measure_cell(cell) and FENCE_RE.search(cell.source):
            cell.source, changed = student_note(cell.source), True
    return changed


def strip_declarations(notebook: Path) -> bool:
    """Remove the fenced declarations from a release notebook's measure cells (rewriting it only when one had any);
    whether it changed."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    changed = clear_declarations(nb)
    if changed:
        nbformat.write(nb, notebook)
    return changed
