"""Red-team cases against the grading boundary (issue 14) for Labs 2 and 3, one module of cases per lab.

Each lab's module (``lab2_boundary.py``, ``lab3_boundary.py``) defines ``CASES``: a list of ``BoundaryCase``. A case
is one submission built from the reference solution by inserting student code cells (the attack) and replacing
answers (wrong ones the attack tries to rescue). ``tests/test_redteam_boundary.py`` grades each lab's cases as one
class, next to the reference solution; Lab 1's cases (``lab1_redteam.py``) use the helpers below too.

Expected scores are read from the lab's instructor notebook, never written down: a test cell's points, the weights
of its ``with check(name, weight=w):`` blocks, and which cells record torch calls. Partial credit (checks.py) decides
what a case may keep:
- tampering the grader finds (the guard's findings, a lying answer type, code that can switch off the recording of
  torch calls) zeroes the cell; such cells are in ``zero``, and a recording bypass zeroes every cell that records
  calls (``bypasses_recording``: the kernel could have switched recording off for all of them);
- an attack the grading boundary makes harmless by construction (a frame oracle finds no test frame in the kernel,
  a patched messaging layer, audit hook or trusted table changes only the kernel's copies, an ignored file is never
  imported) is not seen as tampering: its cell earns exactly what the wrong answer it tries to rescue earns on its
  own, the weighted share of the checks that answer passes anyway (``keeps``: parts of those checks' names). The
  attack gains nothing; every other autograded test cell earns full marks.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable

import nbformat

from course.cli.check import check_blocks as check_weights  # (name, weight, method) of a test cell's checks
from course.common.notebooks import cell_points, grade_id, is_autograded_test, replace_cell_source
from course.grader.nbgrader_ext import RECORDS_CALLS


@dataclass
class BoundaryCase:
    """One submission of ``lab``: how to build it from the reference notebook, and what each test cell must score."""

    student: str
    what: str  # the attack classes it uses and the questions each targets
    build: Callable  # reference notebook -> notebook
    zero: set[str] = field(default_factory=set)  # test cells that must score zero
    keeps: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cell -> names of checks its wrong answer passes
    loses: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cell -> names of the only checks it fails
    bypasses_recording: bool = False  # the static scan finds code that can switch off call recording


def kept_points(source: str, points: float, kept: tuple[str, ...], where: str = "", lost: bool = False) -> float:
    """What a test cell worth ``points`` records when only the checks whose names contain one of ``kept`` pass (with
    ``lost``: when only those fail): its points times the passing checks' weighted share, rounded down to a hundredth
    (``partial_credit_output`` in course/grader/nbgrader_ext.py); a failed method check caps it (``checks.Scorecard.share``)."""
    from checks import Scorecard

    checks = check_weights(source)
    for part in kept:
        assert any(part in name for name, _, _ in checks), (
            f"{where}: no check named with {part!r}; the cell's checks: {[name for name, _, _ in checks]}")
    card = Scorecard(graded=True)  # the grader's own scoring rule, method gate included
    for name, weight, method in checks:
        if method:
            card.methods.add(name)
        card.results.append((name, weight, None if any(part in name for part in kept) != lost else "failed"))
    return math.floor(card.share * points * 100 + 1e-9) / 100


def recording_tests(source_nb) -> set[str]:
    """The autograded test cells that check which torch functions an answer called (they name record_torch_calls)."""
    return {grade_id(c) for c in source_nb.cells if is_autograded_test(c) and RECORDS_CALLS in c.source}


def expected_scores(source_nb, zero=(), keeps=None, bypasses_recording: bool = False,
                    zero_all: bool = False, loses=None) -> dict[str, float]:
    """Every autograded test cell's expected score (its bonus points for a bonus cell): 0 in ``zero`` (and in every
    cell recording torch calls with ``bypasses_recording``; everywhere with ``zero_all``), the kept share of its
    points in ``keeps`` (or what is left after ``loses``), else its points."""
    zero = set(zero) | (recording_tests(source_nb) if bypasses_recording else set())
    keeps, loses = keeps or {}, loses or {}
    expected = {}
    for cell in source_nb.cells:
        if not is_autograded_test(cell):
            continue
        gid = grade_id(cell)
        if zero_all or gid in zero:
            expected[gid] = 0.0
        elif gid in keeps:
            expected[gid] = kept_points(cell.source, cell_points(cell), keeps[gid], gid)
        elif gid in loses:
            expected[gid] = kept_points(cell.source, cell_points(cell), loses[gid], gid, lost=True)
        else:
            expected[gid] = cell_points(cell)
    unknown = (zero | set(keeps) | set(loses)) - set(expected)
    assert not unknown, f"test cells a case names that the lab no longer has: {sorted(unknown)}"
    return expected


def case_expected(source_nb, case: BoundaryCase) -> dict[str, float]:
    """What ``case`` must score in each autograded test cell."""
    return expected_scores(source_nb, case.zero, case.keeps, case.bypasses_recording, loses=case.loses)


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
