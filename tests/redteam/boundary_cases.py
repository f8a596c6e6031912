"""Red-team cases against the grading boundary (issue 14) for Labs 2 and 3, one module of cases per lab.

Each lab's module (``lab2_boundary.py``, ``lab3_boundary.py``) defines ``CASES``: a list of ``BoundaryCase``. A case
is one submission built from the reference solution by inserting student code cells (the attack) and replacing
answers (wrong ones the attack tries to rescue); ``zero`` names the test cells that must score zero, and every
other autograded test cell must earn full marks. ``tests/test_redteam_boundary.py`` grades each lab's cases as one
class, next to the reference solution.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import nbformat

from course.notebooks import grade_id, replace_cell_source


@dataclass
class BoundaryCase:
    """One submission of ``lab``: how to build it from the reference notebook, which test cells must score zero."""

    student: str
    what: str  # the attack classes it uses and the questions each targets
    build: Callable  # reference notebook -> notebook
    zero: set[str] = field(default_factory=set)


def answer(nb, gid: str) -> str:
    """The source of cell ``gid``."""
    return next(cell.source for cell in nb.cells if grade_id(cell) == gid)


def with_answers(nb, answers: dict[str, str]):
    """A copy of ``nb`` with the cells named in ``answers`` replaced."""
    for gid, source in answers.items():
        nb = replace_cell_source(nb, gid, source)
    return nb


def insert_after(nb, gid: str, source: str):
    """A copy of ``nb`` with a new student code cell after cell ``gid``."""
    result = copy.deepcopy(nb)
    index = next(i for i, cell in enumerate(result.cells) if grade_id(cell) == gid)
    result.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    return result
