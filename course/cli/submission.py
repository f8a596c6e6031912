"""submission: the staged, repaired copy of a submission that grading reads, with notes a TA can read.

Grading reads ``<staging>/<student>/<lab>/``: only ``<lab>.ipynb`` (renamed, duplicated, deleted, reordered or edited
nbgrader cells repaired, each repair noted) and ``timestamp.txt``, since other files would shadow libraries on the
kernel's ``sys.path`` (a ``numpy.py``). ``submitted/`` is never modified.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import filecmp
import json
import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.corpus.words import generate_corpus_id

from ..common.notebooks import (
    NB_VERSION,
    NotebookError,
    choose_notebook,
    grade_id,
    nbgrader_meta,
    read_notebook,
    write_notebook,
)
from ..common.paths import COURSE_ID, course_directory
from ..common.quoting import escape_controls
from ..common.scores import is_autograded_grade
from ..grader.recover import recover_metadata, release_of
from ..grader.scan import is_locked, scan_notebook

NO_NOTEBOOK = "no notebook submitted"
TIMESTAMP = "timestamp.txt"
JUNK = {".ipynb_checkpoints", "__pycache__", ".DS_Store", "Thumbs.db"}  # ignored without a note
EXCHANGE_FILES = {TIMESTAMP, "submission_secret.txt"}  # nbgrader collect writes them: no note either
METADATA_CHECKED = {"grade": bool, "solution": bool, "locked": bool, "task": bool, "points": float}  # nbgrader's
CELL_ID_RE = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")  # nbformat 4.5


@dataclass
class Staged:
    """One submission as it will be graded."""

    student: str
    notebook: Path | None = None  # the staged, repaired notebook; None when there is nothing to grade
    reason: str = ""  # why there is nothing to grade
    zero: bool = True  # record zero points when there is nothing to grade; False when staging itself failed
    notes: list[str] = field(default_factory=list)  # the repairs made, one short sentence each
    flags: list[str] = field(default_factory=list)  # suspicious code (course.grader.scan); never changes a score
    review: str = ""  # why a TA must look although it was graded (answers course.grader.recover could not place)

    @property
    def gradable(self) -> bool:
        return self.notebook is not None


def _same_as_release(path: Path, release_copy: Path) -> bool:
    """Whether a submitted file or folder equals the instructor's copy of the same name."""
    if path.is_file() and release_copy.is_file():
        return filecmp.cmp(path, release_copy, shallow=False)
    if not (path.is_dir() and release_copy.is_dir()):
        return False
    mine = {p.relative_to(path) for p in path.rglob("*") if p.is_file() and not JUNK & set(p.relative_to(path).parts)}
    theirs = {p.relative_to(release_copy) for p in release_copy.rglob("*") if p.is_file()}
    return mine == theirs and all(filecmp.cmp(path / rel, release_copy / rel, shallow=False) for rel in mine)


def ignored_entries(folder: Path, release_dir: Path) -> list[str]:
    """Names of the ignored submitted files and folders (``name/``) for the note, less editor debris, notebooks
    (choose_notebook names them) and unchanged copies of the release's own files (``utils.py``, ``assets/``)."""
    return [entry.name + ("/" if entry.is_dir() else "") for entry in sorted(folder.iterdir())
            if not (entry.name in JUNK | EXCHANGE_FILES or entry.suffix == ".pyc"
                    or (entry.name.endswith(".ipynb") and entry.is_file())
                    or _same_as_release(entry, release_dir / entry.name))]


def _copy_timestamp(folder: Path, dest: Path) -> list[str]:
    """Copy the submission's ``timestamp.txt`` into ``dest`` when nbgrader can read it, else leave it out (nbgrader
    would fail the submission) and return a note."""
    from nbgrader.utils import parse_utc

    stamp = folder / TIMESTAMP
    if not stamp.is_file():
        return []
    text = stamp.read_text(errors="replace").strip()
    try:
        parse_utc(text)  # an empty text raises too
    except (ValueError, OverflowError):
        return [f"timestamp.txt unreadable ({text[:40]!r}): graded without it, check lateness by hand"]
    shutil.copy2(stamp, dest / TIMESTAMP)
    return []


def load_submitted_notebook(path: Path) -> tuple[nbformat.NotebookNode, list[str]]:
    """Read a submitted notebook leniently, each cell rebuilt without outputs (nbgrader clears them anyway). Returns
    it (nbformat 4, valid) and notes on dropped cells; NotebookError, saying why for the TA, when it is no notebook."""
    try:
        raw = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise NotebookError("not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise NotebookError(f"truncated or invalid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        raise NotebookError("JSON without notebook cells")
    if "worksheets" in raw:  # nbformat 3 and older: let nbformat convert it
        try:
            raw = nbformat.reads(json.dumps(raw), as_version=NB_VERSION)
        except Exception as exc:  # noqa: BLE001 - nbformat raises several types
            raise NotebookError(f"an old notebook format nbformat cannot convert: {exc}") from None
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
    rebuilt = [_rebuild_cell(cell) for cell in raw["cells"]]
    dropped = [str(index) for index, cell in enumerate(rebuilt) if cell is None]
    nb = nbformat.v4.new_notebook(metadata=copy.deepcopy(metadata))
    nb.cells = [cell for cell in rebuilt if cell is not None]  # validated by _ensure_valid, once repaired
    _ensure_valid(nb)
    return nb, [f"unreadable cells dropped: {', '.join(dropped)}"] if dropped else []


def _rebuild_cell(cell) -> nbformat.NotebookNode | None:
    """A fresh cell of the same type, source, metadata, id and attachments; None if it is not a cell."""
    if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
        return None
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        source = "".join(source)
    if not isinstance(source, str):
        return None
    metadata = cell["metadata"] if isinstance(cell.get("metadata"), dict) else {}
    new = _new_cell(cell["cell_type"], source, metadata, cell.get("id") if isinstance(cell.get("id"), str) else None)
    if cell["cell_type"] != "code" and isinstance(cell.get("attachments"), dict):
        new["attachments"] = copy.deepcopy(cell["attachments"])
    return new


def _ensure_valid(nb) -> None:
    """Make cell ids unique and drop cell metadata the schema rejects (nbgrader's own is kept); NotebookError when
    the notebook is still not valid."""
    seen: set[str] = set()
    for cell in nb.cells:
        if not isinstance(cell.get("id"), str) or not CELL_ID_RE.match(cell["id"]) or cell["id"] in seen:
            cell["id"] = generate_corpus_id()
        seen.add(cell["id"])
    with contextlib.suppress(nbformat.ValidationError):
        nbformat.validate(nb)
        return
    for cell in nb.cells:
        cell.metadata = nbformat.from_dict({"nbgrader": cell.metadata["nbgrader"]} if "nbgrader" in cell.metadata else {})
        cell.pop("attachments", None)
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as exc:
        raise NotebookError(f"fails the notebook schema: {exc.message}") from None


@dataclass
class Instructor:
    """The instructor's side of a lab, read once per class."""

    source_nb: nbformat.NotebookNode  # source/<lab>/<lab>.ipynb
    reference: dict[str, nbformat.NotebookNode]  # the release's graded and locked cells by grade id, in order
    release_nb: nbformat.NotebookNode  # the whole notebook as the release has it

    @classmethod
    def load(cls, course_root: Path, lab: str) -> "Instructor":
        """Read the instructor's notebook and derive its release (NotebookError when it cannot be read)."""
        source_nb = read_notebook(course_root / "source" / lab / f"{lab}.ipynb")
        nb = release_of(source_nb)
        return cls(source_nb, {gid: cell for cell in nb.cells if (gid := grade_id(cell))}, nb)


def _listed(what: str, ids: list[str]) -> list[str]:
    return [f"{what}: {', '.join(ids)}"] if ids else []


def _sections(cells, reference: dict) -> tuple[list, dict[str, list], list[str]]:
    """Split cells into the leading ordinary cells and, per grade id, its first cell with the ordinary cells after
    it; returns them and the notes. Later copies of a locked cell are dropped; later copies of an answer (they ran in
    the student's notebook too), unknown grade ids and metadata without one become ordinary cells."""
    head, sections, current = [], {}, None
    dropped, demoted, unknown = [], [], []
    for cell in cells:
        gid = grade_id(cell)
        if gid in reference and gid not in sections:
            sections[gid] = current = [cell]
            continue
        if gid in reference and is_locked(reference[gid]):
            dropped.append(gid)
            continue
        if gid is not None:
            (demoted if gid in reference else unknown).append(gid)
        cell.metadata.pop("nbgrader", None)
        (head if current is None else current).append(cell)
    notes = (_listed("duplicate locked cells dropped", dropped)
             + _listed("duplicate answer cells kept as ordinary cells after the first", demoted)
             + _listed("unknown grade ids, kept as ordinary cells", unknown))
    return head, sections, notes


def _restore_edits(sections: dict[str, list], reference: dict) -> list[str]:
    """Give each graded or locked cell the instructor's nbgrader metadata and cell type, and a locked cell the
    instructor's source (nbgrader's OverwriteCells would restore most of it: this makes it visible)."""
    metadata_notes, edited_locked, retyped = [], [], []
    for gid, section in sections.items():
        cell, ref = section[0], reference[gid]
        if changed := _metadata_changes(nbgrader_meta(cell), nbgrader_meta(ref)):
            metadata_notes.append(f"{gid} ({', '.join(changed)})")
        if is_locked(ref):
            if cell.cell_type != ref.cell_type or cell.source.rstrip() != ref.source.rstrip():
                edited_locked.append(gid)
            section[0] = _new_cell(ref.cell_type, ref.source, ref.metadata, cell.get("id"))
            continue
        if cell.cell_type != ref.cell_type:
            retyped.append(f"{gid} ({cell.cell_type} -> {ref.cell_type})")
            section[0] = cell = _new_cell(ref.cell_type, cell.source, ref.metadata, cell.get("id"))
        cell.metadata["nbgrader"] = copy.deepcopy(ref.metadata["nbgrader"])
    return (_listed("edited locked cells restored from the instructor's notebook", edited_locked)
            + _listed("nbgrader metadata restored", metadata_notes)
            + _listed("cell types restored", retyped))


def _metadata_changes(mine: dict, theirs: dict) -> list[str]:
    """What a student changed in a cell's nbgrader metadata: ``"points 30 -> 3"``, ``"locked False -> True"``."""
    def value(kind, raw):
        try:
            return kind(raw or 0)
        except (TypeError, ValueError):
            return raw

    pairs = {key: (value(kind, mine.get(key)), value(kind, theirs.get(key))) for key, kind in METADATA_CHECKED.items()}
    return [f"{key} {was} -> {should}" for key, (was, should) in pairs.items() if was != should]


def _new_cell(cell_type: str, source: str, metadata: dict, cell_id: str | None) -> nbformat.NotebookNode:
    new = getattr(nbformat.v4, f"new_{cell_type}_cell")(source=source, metadata=copy.deepcopy(metadata))
    if cell_id:
        new["id"] = cell_id
    return new


def repair_cells(nb, reference: dict) -> list[str]:
    """Repair ``nb`` in place so that it has every cell of ``reference`` once, in order, with its nbgrader metadata,
    each followed by the student's cells that followed it; returns the notes."""
    head, sections, notes = _sections(nb.cells, reference)
    notes += _restore_edits(sections, reference)
    found = list(sections)  # the cells outside the longest runs shared with the instructor's order were moved
    matcher = difflib.SequenceMatcher(None, found, [gid for gid in reference if gid in sections], autojunk=False)
    in_place = {found[block.a + i] for block in matcher.get_matching_blocks() for i in range(block.size)}
    notes += _listed("cells put back in the instructor's order", [gid for gid in found if gid not in in_place])
    restored, stubs = [], []
    nb.cells = head
    for gid, ref in reference.items():
        if gid in sections:
            nb.cells += sections[gid]
            continue
        (restored if is_locked(ref) else stubs).append(gid)
        at = len(nb.cells)  # after the student's cells that precede it, before the next section's headings
        while at and nb.cells[at - 1].cell_type == "markdown" and grade_id(nb.cells[at - 1]) is None:
            at -= 1
        nb.cells.insert(at, _new_cell(ref.cell_type, ref.source, ref.metadata, ref.get("id")))
    _ensure_valid(nb)
    return (notes + _listed("missing cells restored from the instructor's notebook", restored)
            + _listed("missing answer cells restored as the release stub", stubs))


def repair_kernelspec(nb, source_nb) -> list[str]:
    """Give the notebook the instructor's kernelspec (nbgrader's OverwriteKernelspec does the same)."""
    theirs = source_nb.metadata.get("kernelspec")
    mine = nb.metadata.get("kernelspec")
    if not theirs or mine == theirs:
        return []
    nb.metadata["kernelspec"] = copy.deepcopy(theirs)
    was = mine.get("name") if isinstance(mine, dict) else mine
    return [f"kernelspec {was!r} replaced by the instructor's {theirs.get('name')!r}"]


def stage_submission(course_root: Path, lab: str, student: str, staging_root: Path,
                     instructor: Instructor | None = None) -> Staged:
    """Write the repaired copy of ``submitted/<student>/<lab>/`` into ``staging_root/<student>/<lab>/``; student text
    in the notes and reasons is escaped (``course.common.quoting``). NotebookError: no instructor's notebook."""
    staged = _stage(course_root, lab, student, staging_root, instructor)
    staged.notes = [escape_controls(note) for note in staged.notes]
    staged.reason = escape_controls(staged.reason)
    staged.review = escape_controls(staged.review)
    return staged


def _stage(course_root: Path, lab: str, student: str, staging_root: Path, instructor: Instructor | None) -> Staged:
    folder = course_root / "submitted" / student / lab
    dest = staging_root / student / lab
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    staged = Staged(student)
    chosen, note = choose_notebook(folder, lab)
    staged.notes += ([note] if note else []) + _copy_timestamp(folder, dest)
    staged.notes += _listed("ignored extra files", ignored_entries(folder, course_root / "source" / lab))
    if chosen is None:
        staged.reason = NO_NOTEBOOK
        return staged
    instructor = instructor or Instructor.load(course_root, lab)
    try:
        nb, notes = load_submitted_notebook(chosen)
    except NotebookError as exc:
        staged.reason = f"not a valid notebook ({exc})"
        return staged
    recovery = recover_metadata(nb, instructor.release_nb, instructor.source_nb)
    if recovery.unplaced:
        staged.review = f"answers without nbgrader metadata that could not be placed: {', '.join(recovery.unplaced)}"
    staged.notes += (notes + recovery.notes() + repair_kernelspec(nb, instructor.source_nb)
                     + repair_cells(nb, instructor.reference))
    staged.notebook = dest / f"{lab}.ipynb"
    write_notebook(nb, staged.notebook)
    return staged


def _stage_and_scan(course_root: Path, lab: str, student: str, staging_root: Path, instructor: Instructor) -> Staged:
    """Stage and scan one submission. A failure of staging itself leaves it ungraded, for a TA (no zero recorded)."""
    try:
        staged = stage_submission(course_root, lab, student, staging_root, instructor)
    except Exception as exc:  # noqa: BLE001 - one submission's problem never stops the others
        staged = Staged(student, reason=escape_controls(
            f"could not stage the submission ({type(exc).__name__}: {exc}); grade it by hand"), zero=False)
    if staged.notebook is not None:
        try:
            staged.flags = scan_notebook(read_notebook(staged.notebook))
        except Exception as exc:  # noqa: BLE001 - a scan that fails must not stop grading
            staged.flags = [escape_controls(f"the scan failed ({type(exc).__name__}: {exc}): read the code by hand")]
    return staged


class ClassStaging:
    """Every student's submission staged and scanned in a thread, in the order of ``students``, while grading goes
    on: ``get(student)`` waits for that submission only. Raises NotebookError: no instructor's notebook."""

    def __init__(self, course_root: Path, lab: str, students: list[str], staging_root: Path):
        self.students = list(students)
        instructor = Instructor.load(course_root, lab)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="class-staging")
        self._staged = {student: self._pool.submit(_stage_and_scan, course_root, lab, student, staging_root, instructor)
                        for student in self.students}

    def get(self, student: str) -> Staged:
        """The staged submission of ``student``, once it is staged (CancelledError when staging was closed first)."""
        return self._staged[student].result()

    def all(self) -> dict[str, Staged]:
        """Every staged submission, in the order of ``students`` (waits for the last)."""
        return {student: self.get(student) for student in self.students}

    def close(self) -> None:
        """Stop after the submission being staged and wait for it (before the staging folder is removed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def record_zero(course_root: Path, lab: str, student: str, staged_folder: Path | None = None) -> None:
    """Record a submission with nothing to grade as nbgrader records a missing notebook (every graded cell zero), with
    the timestamp in ``staged_folder``; an earlier autograded output is removed (no feedback from it)."""
    stamp = staged_folder / TIMESTAMP if staged_folder else None
    fields = {"timestamp": stamp.read_text().strip()} if stamp and stamp.is_file() else {}
    with _submission_grades(course_root, lab, student, create=fields) as grades:
        for grade in grades:
            grade.auto_score = 0
            grade.needs_manual_grade = False
            if is_autograded_grade(grade):
                grade.extra_credit = None  # an earlier run's bonus points (a TA's extra credit on an answer is kept)


def clear_autograded_scores(course_root: Path, lab: str, student: str) -> bool:
    """After a failed run, clear an earlier run's automatic scores of this submission and mark their cells for manual
    grading (a TA's scores stay), and remove its autograded notebook. Returns whether there were automatic scores."""
    with _submission_grades(course_root, lab, student) as grades:
        had_scores = any(grade.auto_score is not None for grade in grades)
        for grade in grades:
            grade.auto_score = None
            grade.needs_manual_grade = True
    return had_scores


@contextlib.contextmanager
def _submission_grades(course_root: Path, lab: str, student: str, create: dict | None = None):
    """Every grade of one submission in the gradebook, committed after the ``with`` block. With ``create`` (the
    submission's fields) the student and the submission are created, else a submission not in the gradebook has no
    grades. The submission's autograded output is removed either way."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    with warnings.catch_warnings(), Gradebook(course_directory(course_root).db_url, course_id=COURSE_ID) as gb:
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission warns about its own session use
        notebooks = []
        if create is not None:
            gb.update_or_create_student(student)
            notebooks = gb.update_or_create_submission(lab, student, **create).notebooks
        else:
            with contextlib.suppress(MissingEntry):
                notebooks = gb.find_submission(lab, student).notebooks
        yield [grade for notebook in notebooks for grade in notebook.grades]
        gb.db.commit()
    shutil.rmtree(course_root / "autograded" / student / lab, ignore_errors=True)
