"""recover: give back the nbgrader metadata a submission lost, by where its cells sit.

Cells pasted into a fresh notebook, or saved by an editor that drops unknown metadata (Colab, VS Code), have no
``metadata.nbgrader``. The instructor's locked cells (**anchors**) are found by their text, in order; an **answer**
between two anchors is the cell there that defines what the solution defines (``def gemm``), else the only cell of its
kind there (several in order when their numbers match). An ambiguous answer is left unplaced and named, so that
grading asks for a TA instead of scoring it zero.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from ..common.notebooks import grade_id
from .scan import is_locked


@dataclass
class Recovery:
    """What ``recover_metadata`` did: the grade ids it recovered and the answers it could not place."""

    anchors: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    unplaced: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        """Sentences for the TA (empty when nothing was missing)."""
        notes = []
        if self.anchors or self.answers:
            notes.append(f"nbgrader metadata was missing: {len(self.anchors) + len(self.answers)} cells recovered by "
                         f"their place in the notebook (answers: {', '.join(self.answers) or 'none'})")
        if self.unplaced:
            notes.append(f"answers that could not be placed (a TA must look): {', '.join(self.unplaced)}")
        return notes


def release_of(source_nb):
    """The release notebook of an instructor notebook, derived with nbgrader's own preprocessors: cells locked as
    nbgrader locks them, solutions replaced by stubs, hidden tests and mark schemes removed, and ``course measure``'s
    declarations cleared as the build clears them."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearMarkScheme, ClearSolutions, LockCells

    from ..common.measure_cells import clear_declarations

    nb, resources = copy.deepcopy(source_nb), {}
    for preprocessor in (LockCells(), ClearSolutions(), ClearHiddenTests(), ClearMarkScheme()):
        nb, resources = preprocessor.preprocess(nb, resources)
    clear_declarations(nb)  # what the build does after them: the release shows a measured piece's note only
    return nb


def _text(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def defined_names(source: str) -> set[str]:
    """Top-level names a code cell defines (functions, classes, assigned variables); empty when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def recover_metadata(nb, release_nb, source_nb) -> Recovery:
    """Label, in place, the cells of the submitted ``nb`` that lost their nbgrader metadata, by aligning them with
    ``release_nb`` (what students got) and ``source_nb`` (what each solution defines); returns what it did."""
    reference = {gid: cell for cell in release_nb.cells if (gid := grade_id(cell))}
    solutions = {gid: cell.source for cell in source_nb.cells if (gid := grade_id(cell))}
    ordinary = {_text(cell.source) for cell in release_nb.cells if grade_id(cell) is None}
    order = list(reference)
    labelled = {grade_id(cell): i for i, cell in enumerate(nb.cells) if grade_id(cell) in reference}
    unlabelled = [i for i, cell in enumerate(nb.cells) if grade_id(cell) is None]
    # answers are looked for among the unlabelled cells that are not the release's own explanations or demo code
    free = [i for i in unlabelled if _text(nb.cells[i].source) not in ordinary]
    recovery = Recovery()
    if len(labelled) == len(order) or not unlabelled:
        return recovery

    def label(i: int, gid: str, found: list[str]) -> None:
        nb.cells[i].metadata["nbgrader"] = copy.deepcopy(reference[gid].metadata["nbgrader"])
        labelled[gid] = i
        if i in free:
            free.remove(i)
        found.append(gid)

    last = -1
    for gid in order:  # anchors, matched by their text in order (each after the last one found)
        ref = reference[gid]
        if gid in labelled:
            last = max(last, labelled[gid])
        elif is_locked(ref):
            match = next((i for i in unlabelled if i > last and nb.cells[i].cell_type == ref.cell_type
                          and _text(nb.cells[i].source) == _text(ref.source)), None)
            if match is not None:
                label(match, gid, recovery.anchors)
                last = match

    slots: dict[tuple[int, int, str], list[str]] = {}
    for position, gid in enumerate(order):  # answers, grouped by the anchors around them
        if gid in labelled or is_locked(reference[gid]):
            continue
        before = max((labelled[g] for g in order[:position] if g in labelled), default=-1)
        after = min((labelled[g] for g in order[position + 1:] if g in labelled), default=len(nb.cells))
        slots.setdefault((before, after, reference[gid].cell_type), []).append(gid)
    for (before, after, kind), gids in slots.items():
        candidates = [i for i in free if before < i < after and nb.cells[i].cell_type == kind]
        for gid in list(gids):  # a code answer: the cell that defines what the solution defines
            wanted = defined_names(solutions.get(gid, "")) if kind == "code" else set()
            definers = [i for i in (candidates or free) if wanted and wanted & defined_names(nb.cells[i].source)
                        and nb.cells[i].cell_type == kind]
            if definers:
                label(definers[-1], gid, recovery.answers)  # the last definition is the one the tests see
                candidates = [i for i in candidates if i in free]
                gids.remove(gid)
        if len(candidates) == len(gids):
            for i, gid in zip(candidates, gids):
                label(i, gid, recovery.answers)
        elif gids and candidates:  # with no candidate, a missing answer is restored as the release stub
            recovery.unplaced += gids
    recovery.unplaced.sort(key=order.index)
    return recovery
