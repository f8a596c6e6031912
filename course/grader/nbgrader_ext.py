"""nbgrader preprocessors of our own, named in ``nbgrader_config.py``."""
from __future__ import annotations

import math
import re
import secrets
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor, OverwriteCells
from nbgrader.utils import is_grade, is_locked, is_solution

from ..common.notebooks import (
    HIDDEN_BEGIN,
    HIDDEN_END,
    NotebookError,
    bonus_points,
    cells_by_grade_id,
    is_autograded_test,
    marked_lines,
    read_notebook,
    region_lines,
    strip_lines,
)
from .recover import recover_metadata, release_of

FAILED_CHECK_PREFIX = "FAILED "  # how checks.Scorecard.failures starts a line
RECORDS_CALLS = "record_torch_calls"  # a test cell that names it checks how an answer was computed (docs/SECURITY.md)
# Marks the partial-credit results this grading process wrote (a secret of the process: the kernel never sees it).
_PARTIAL_CREDIT_TOKEN = secrets.token_hex(16)


def partial_credit_output(cell, share: float, failed: list[str]) -> NotebookNode:
    """The ``execute_result`` nbgrader's ``determine_grade`` reads as a test cell's score: ``share`` (of its checks
    that passed) times its points, rounded down to a hundredth. ``AwardBonusPoints`` reads a bonus cell's share."""
    points = float(cell.metadata.get("nbgrader", {}).get("points", 0) or 0)
    score = math.floor(share * points * 100 + 1e-9) / 100
    return NotebookNode(output_type="execute_result", execution_count=None, data={"text/plain": f"{score:g}"},
                        metadata={"efficient_ai": {"partial_credit": _PARTIAL_CREDIT_TOKEN, "share": share,
                                                   "failed": failed}})


def partial_credit_share(cell) -> float | None:
    """The share of a test cell's checks that passed, when this grading process recorded partial credit on it."""
    for out in cell.get("outputs", []):
        mark = (out.get("metadata") or {}).get("efficient_ai") or {}
        if out.get("output_type") == "execute_result" and mark.get("partial_credit") == _PARTIAL_CREDIT_TOKEN:
            return float(mark["share"])
    return None


class DropTestResults(NbGraderPreprocessor):
    """Remove ``execute_result`` outputs from test cells before nbgrader scores them, except this process's partial
    credit: nbgrader reads a shown number as the score, and our test cells never end in an expression (``course
    lint``), so any other result came from student code (``get_ipython().displayhook(5)``)."""

    def preprocess_cell(self, cell, resources, cell_index):
        if is_autograded_test(cell):
            cell.outputs = [out for out in cell.get("outputs", []) if out.get("output_type") != "execute_result"
                            or partial_credit_share({"outputs": [out]}) is not None]
        return cell, resources


class AwardBonusPoints(NbGraderPreprocessor):
    """Record bonus questions' points as nbgrader's ``extra_credit``, after ``SaveAutoGrades``.

    Bonus cells have nbgrader points 0 (``course build``); their bonus points come from the instructor notebook,
    never from the submission's metadata (docs/SECURITY.md). An autograded bonus test earns its share of them (its
    partial credit, else ``determine_grade``). A manually graded one keeps the TA's extra credit, with an automatic
    score of 0 where there is none (nbgrader ignores extra credit without a score).
    """

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry

        info = resources["nbgrader"]
        source = read_course_source(self.config, info, self.log, "Bonus points not awarded")
        bonus = bonus_points(source) if source is not None else {}
        if not bonus:
            return nb, resources
        reference, submitted = cells_by_grade_id(source), cells_by_grade_id(nb)
        with Gradebook(info["db_url"]) as gb:
            for gid, points in bonus.items():
                try:
                    grade = gb.find_grade(gid, info["notebook"], info["assignment"], info["student"])
                except MissingEntry:
                    self.log.warning("Bonus cell %s is not in the gradebook: no bonus recorded", gid)
                    continue
                if is_autograded_test(reference[gid]):
                    grade.extra_credit = self._earned(reference[gid], submitted.get(gid), points)
                elif grade.auto_score is None:
                    grade.auto_score = 0.0
            gb.db.commit()
        return nb, resources

    def _earned(self, reference, cell, points: float) -> float:
        """What the submitted ``cell`` earns of the instructor's ``reference`` worth ``points``: its share of them when
        this process recorded partial credit, else what ``determine_grade`` gives it; 0 when the submission lacks it."""
        from nbformat import from_dict
        from nbgrader.utils import determine_grade

        if cell is None:
            return 0.0
        if (share := partial_credit_share(cell)) is not None:
            return math.floor(share * points * 100 + 1e-9) / 100
        if cell.get("cell_type") != "code":
            return 0.0
        scored = from_dict({"cell_type": "code", "source": cell.get("source", ""), "outputs": cell.get("outputs", []),
                            "metadata": {"nbgrader": {**reference.metadata["nbgrader"], "points": points}}})
        try:
            earned, _ = determine_grade(scored, self.log)
        except (ValueError, KeyError):  # a shown number nbgrader cannot read (DropTestResults removes results first)
            return 0.0
        return float(earned or 0.0)


def course_source_folder(config, lab: str) -> Path:
    """The course's instructor folder of ``lab`` (``source/<lab>/``, as nbgrader's CourseDirectory settings place it)."""
    course = config.get("CourseDirectory", {})
    return Path(course.get("root") or Path.cwd()) / (course.get("source_directory") or "source") / str(lab)


def read_course_source(config, info, log, failure: str):
    """The instructor notebook of the one nbgrader is processing (``info``: ``resources["nbgrader"]``), or None when
    there is none or it cannot be read, logged as an error that starts with ``failure`` and names the path."""
    try:
        return read_notebook(course_source_folder(config, info["assignment"]) / f"{info['notebook']}.ipynb")
    except NotebookError as exc:
        log.error("%s: %s", failure, exc)
        return None


class ShowBonusPoints(NbGraderPreprocessor):
    """In feedback, a bonus cell reads "Score: 5 / 5", not "/ 0": after ``GetGrades``, its points become the bonus
    points of the instructor notebook (never the submission's). The page's total stays nbgrader's."""

    def preprocess(self, nb, resources):
        source = read_course_source(self.config, resources["nbgrader"], self.log, "Bonus cells shown out of 0 points")
        bonus = bonus_points(source) if source is not None else {}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if isinstance(meta, dict) and meta.get("grade_id") in bonus:
                meta["points"] = bonus[meta["grade_id"]]
        return nb, resources


def hidden_test_lines(source: str) -> list[str]:
    """The lines between the hidden-test markers of a cell's source."""
    return region_lines(source, HIDDEN_BEGIN, HIDDEN_END)


def _squeeze(text: str) -> str:
    """``text`` without ANSI colour codes and whitespace (how hidden-test lines are matched in outputs)."""
    return re.sub(r"\s+", "", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text))


class StripHiddenTests(NbGraderPreprocessor):
    """Keep hidden tests out of feedback HTML: a hidden test region becomes a one-line note, a test cell keeps only
    its error's name and message and its failed checks (``MAX_MESSAGE_CHARS`` each), and in every cell an output line
    quoting a line of hidden test source (whitespace ignored, ``min_quoted_chars`` or longer) becomes a note."""

    MAX_MESSAGE_CHARS = 500
    min_quoted_chars = 12

    def preprocess(self, nb, resources):
        hidden = {_squeeze(line) for cell in nb.cells if is_autograded_test(cell) for line in hidden_test_lines(cell.source)}
        self._hidden = sorted((h for h in hidden if len(h) >= self.min_quoted_chars), key=len)
        return super().preprocess(nb, resources)

    def _redact(self, text: str) -> str:
        if not self._hidden or not isinstance(text, str):
            return text
        kept = []
        for line in text.splitlines(keepends=True):
            squeezed = _squeeze(line)
            if len(squeezed) >= self.min_quoted_chars and any(h in squeezed for h in self._hidden):
                line = "[a line quoting hidden test source was removed from feedback]\n"
            kept.append(line)
        return "".join(kept)

    def _redact_output(self, out) -> None:
        if "text" in out:
            out["text"] = self._redact("".join(out["text"]) if isinstance(out["text"], list) else out["text"])
        for mime, value in list(out.get("data", {}).items()):
            if mime.startswith("text/") or mime in ("application/json", "image/svg+xml"):
                out["data"][mime] = self._redact("".join(value) if isinstance(value, list) else value)
        if out.get("output_type") == "error":
            out["evalue"] = self._redact(str(out.get("evalue", "")))
            out["traceback"] = [self._redact(line) for line in out.get("traceback", [])]

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code":
            return cell, resources
        if not is_autograded_test(cell):
            for out in cell.get("outputs", []):
                self._redact_output(out)
            return cell, resources
        if HIDDEN_BEGIN in cell.source:
            kept = []
            for line, where in marked_lines(cell.source, HIDDEN_BEGIN, HIDDEN_END):
                if where == "begin":
                    indent = line[: len(line) - len(line.lstrip())]
                    kept.append(f"{indent}# (hidden tests ran here; their source is not shown in feedback)")
                elif where == "outside":
                    kept.append(line)
            cell.source = "\n".join(kept)
        outputs = []
        failed = [line[: self.MAX_MESSAGE_CHARS] for out in cell.get("outputs", [])
                  if out.get("output_type") == "stream" and out.get("name") == "stdout"
                  for line in "".join(out.get("text", "")).splitlines() if line.startswith(FAILED_CHECK_PREFIX)]
        if failed:  # the grader's list of failed checks (checks.py): assertion messages, written for students
            outputs.append(NotebookNode(output_type="stream", name="stdout", text=self._redact(
                "Some checks failed; this cell earned the weighted share of the checks that passed:\n"
                + "\n".join(failed) + "\n")))
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                message = str(out.get("evalue", ""))
                if len(message) > self.MAX_MESSAGE_CHARS:
                    message = message[: self.MAX_MESSAGE_CHARS] + " [...]"
                out["evalue"] = self._redact(message)
                out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}"]
                outputs.append(out)
        cell.outputs = outputs
        return cell, resources


# Errors after which the process's CUDA context is unusable: every later CUDA call fails too.
STICKY_CUDA_ERRORS = ("device-side assert triggered", "an illegal memory access was encountered",
                      "unspecified launch failure", "misaligned address", "an illegal instruction was encountered")


def sticky_cuda_error(cell) -> str:
    """The sticky CUDA error a cell's outputs report (``STICKY_CUDA_ERRORS``), or ""."""
    errors = [f"{out.get('ename', '')}: {out.get('evalue', '')}" for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    return next((needle for text in errors for needle in STICKY_CUDA_ERRORS if needle in text), "")


def error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def neutralise_cell_metadata(cell, skip_tag: str) -> list[str]:
    """Remove the metadata that changes how a cell runs or is trusted; returns what was removed, in words: the tags
    nbclient acts on (``skip_tag``: a test would pass unrun; ``raises-exception``), and nbgrader flags without a
    grade id (``OverwriteCells`` deletes a made-up one, so a ``locked`` student cell would run as the instructor's).
    """
    removed = []
    tags = cell.metadata.get("tags")
    if isinstance(tags, list):
        if bad := [tag for tag in tags if tag in (skip_tag, "raises-exception")]:
            cell.metadata["tags"] = [tag for tag in tags if tag not in bad]
            removed += [f"tag {tag!r}" for tag in bad]
    elif tags is not None:
        del cell.metadata["tags"]
        removed.append("malformed tags")
    meta = cell.metadata.get("nbgrader")
    if meta is not None and (not isinstance(meta, dict) or not meta.get("grade_id")):
        if not isinstance(meta, dict) or any(meta.get(key) for key in ("grade", "locked", "solution", "task")):
            removed.append("nbgrader metadata without a grade id")
        del cell.metadata["nbgrader"]
    return removed


NEUTRALISED_KEY = "efficient_ai_neutralised"  # notebook metadata: what the sanitize step removed, for the report


class NeutraliseCellMetadata(NbGraderPreprocessor):
    """``neutralise_cell_metadata`` on every cell in nbgrader's sanitize step, before ``CheckCellMetadata`` would
    reject the whole submission; what was removed goes to ``NEUTRALISED_KEY`` for ``GuardedExecute``'s report."""

    def preprocess(self, nb, resources):
        removed = {where(cell, index): found for index, cell in enumerate(nb.cells)
                   if (found := neutralise_cell_metadata(cell, "skip-execution"))}
        nb.metadata[NEUTRALISED_KEY] = removed
        return nb, resources


class RecoverCellMetadata(NbGraderPreprocessor):
    """Give back the nbgrader metadata a submission lost (a notebook pasted into a fresh one), by where its cells sit
    (``course.grader.recover``), before nbgrader looks for its graded cells; what was recovered or could not be placed is
    logged (``course grade`` does this when staging, and records ``needs-TA``)."""

    def preprocess(self, nb, resources):
        source = read_course_source(self.config, resources["nbgrader"], self.log, "Cell metadata not recovered")
        if source is None:
            return nb, resources
        for note in recover_metadata(nb, release_of(source), source).notes():
            self.log.warning("%s: %s", resources["nbgrader"].get("student"), note)
        return nb, resources


class QuietOverwriteCells(OverwriteCells):
    """nbgrader's ``OverwriteCells``, warning about a changed checksum only when the submitted source differs from
    the released one: nbgrader's checksum includes the hidden tests (jupyter/nbgrader#1961). The cell is restored
    from the gradebook either way."""

    def preprocess_cell(self, cell, resources, cell_index):
        self._submitted = (cell.cell_type, cell.source)  # before nbgrader restores anything
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name, attr, old, new):
        if attr == "checksum" and self._as_released(name):
            self.log.debug("Cell %s is as released (its recorded checksum includes hidden tests)", name)
            return
        super().report_change(name, attr, old, new)

    def _as_released(self, name: str) -> bool:
        """Whether the cell being processed (grade id ``name``) was submitted as released (without hidden tests)."""
        stored = self.gradebook.find_source_cell(name, self.notebook_id, self.assignment_id)
        released = strip_lines(stored.source, HIDDEN_BEGIN, HIDDEN_END, keep_inside=False)
        cell_type, source = self._submitted
        return cell_type == stored.cell_type and source.rstrip() == released.rstrip()


def is_setup_cell(cell) -> bool:
    """A locked code cell of the instructor's that is neither a test nor an answer (imports, data, helpers)."""
    return cell.cell_type == "code" and is_locked(cell) and not is_grade(cell) and not is_solution(cell)


def where(cell, index: int) -> str:
    """How reasons name a cell: ``cell 7 (q1_2_scale)``."""
    meta = cell.metadata.get("nbgrader")
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return f"cell {index}" + (f" ({gid})" if gid else " (a cell without a grade id)")
