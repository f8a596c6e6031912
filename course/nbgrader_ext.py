"""nbgrader preprocessors of our own, named in ``nbgrader_config.py``."""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import threading
import time
from pathlib import Path

from nbclient.util import run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor, OverwriteCells
from nbgrader.utils import is_grade, is_locked, is_solution
from traitlets import Bool, Enum, Float, Integer

from . import boundary, kernel_pool
from .notebooks import (
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
from .scan import recording_bypass_flags

GUARD_SOURCE = Path(__file__).with_name("guard_kernel.py")
GRADING_REPORT = "grading_report.json"  # written beside each autograded notebook
DEFAULT_NOTEBOOK_TIMEOUT_S = 600
# How long the grader waits for the kernel to answer one of its own requests (a guard command, or the empty
# request sent after every cell); a healthy kernel answers in milliseconds.
KERNEL_REPLY_TIMEOUT_S = 60
# Cell tags nbclient acts on besides ``Execute.skip_cells_with_tag``: ``raises-exception`` lets a cell's error pass.
EXECUTION_TAGS = ("raises-exception",)
MIB = 1024 * 1024
# A kernel that dies or stops answering is replaced by a fresh one (earlier cells run again) at most this often.
MAX_KERNEL_RESTARTS = 3


# Settings of a grading kernel, made before any student code: cuDNN's attention prepares its kernels on each shape's
# first call in a process, on the CPU, and every grading kernel is a fresh process; FlashAttention or the
# memory-efficient kernel give the same results. A student's own kernel keeps PyTorch's defaults.
GRADING_KERNEL_SETTINGS = (
    "import sys as _s\n"
    "if 'torch' in _s.modules and hasattr(_s.modules['torch'].backends.cuda, 'enable_cudnn_sdp'):\n"
    "    _s.modules['torch'].backends.cuda.enable_cudnn_sdp(False)\n"
    "del _s\n"
)
FAILED_CHECK_PREFIX = "FAILED "  # how checks.Scorecard.failures starts a line
RECORDS_CALLS = "record_torch_calls"  # a test cell that names it checks how an answer was computed (docs/SECURITY.md)
# Marks the partial-credit results the grader wrote: one secret per grading run, shared through the environment with
# the nbgrader processes it starts. ``course grade --workers N`` (SQLite gradebook) executes a submission in one
# nbgrader process and records its scores in another (``autograde --no-execute``): with a secret of each process the
# recording dropped every partial result, and a test cell whose checks partly failed scored full marks. A sandboxed
# kernel never sees it (course/sandbox.py keeps only ENV_KEEP); a kernel cannot write a test cell's outputs anyway.
PARTIAL_CREDIT_TOKEN_ENV = "EFFICIENT_AI_PARTIAL_CREDIT_TOKEN"
PARTIAL_CREDIT_KEY = "partial_credit"  # the test cell's own mark, in cell.metadata["efficient_ai"]
_PARTIAL_CREDIT_TOKEN = os.environ.setdefault(PARTIAL_CREDIT_TOKEN_ENV, secrets.token_hex(16))


def partial_credit_output(cell, share: float, failed: list[str]) -> NotebookNode:
    """The ``execute_result`` that records a test cell's partial credit: the weighted share of its checks that passed
    (``checks.py``) times the cell's nbgrader points, rounded down to a hundredth, as nbgrader's ``determine_grade``
    reads it. A bonus cell (nbgrader points 0) shows 0 here; ``AwardBonusPoints`` reads the share from the mark.

    The mark (token and share) is also put in the cell's metadata, which ``SanitizeNotebook`` keeps while it drops
    every output's metadata: ``course grade --workers N`` records the scores of the executed notebook in a second
    nbgrader process (``autograde --no-execute``), which finds the mark only there."""
    points = float(cell.metadata.get("nbgrader", {}).get("points", 0) or 0)
    score = f"{math.floor(share * points * 100 + 1e-9) / 100:g}"
    cell.metadata.setdefault("efficient_ai", {})[PARTIAL_CREDIT_KEY] = {
        "token": _PARTIAL_CREDIT_TOKEN, "share": share, "score": score}
    return NotebookNode(output_type="execute_result", execution_count=None, data={"text/plain": score},
                        metadata={"efficient_ai": {"partial_credit": _PARTIAL_CREDIT_TOKEN, "share": share,
                                                   "failed": failed}})


def _partial_mark(cell, out) -> dict | None:
    """The mark (with its ``share``) when ``out`` is the partial-credit result the grader wrote in ``cell``: the mark on
    the output, or the cell's mark with the same score once ``SanitizeNotebook`` has dropped the output's metadata."""
    if out.get("output_type") != "execute_result":
        return None
    on_output = (out.get("metadata") or {}).get("efficient_ai") or {}
    if on_output.get("partial_credit") == _PARTIAL_CREDIT_TOKEN:
        return on_output
    mark = ((cell.get("metadata") or {}).get("efficient_ai") or {}).get(PARTIAL_CREDIT_KEY) or {}
    text = (out.get("data") or {}).get("text/plain")
    text = "".join(text) if isinstance(text, list) else text
    return mark if mark.get("token") == _PARTIAL_CREDIT_TOKEN and mark.get("score") == text else None


def partial_credit_share(cell) -> float | None:
    """The share of a test cell's checks that passed, when this grading run recorded partial credit on it."""
    for out in cell.get("outputs", []):
        mark = _partial_mark(cell, out)
        if mark is not None:
            return float(mark["share"])
    return None


class DropTestResults(NbGraderPreprocessor):
    """Remove ``execute_result`` outputs from autograded test cells before nbgrader scores them, except the partial
    credit this grading process recorded (``partial_credit_output``).

    nbgrader reads a number shown as a test cell's result as partial credit, and stops at the first such
    output, even when an assertion error follows it. Our test cells never end in an expression (``check``
    enforces it), so any other result there was put there by student code (``get_ipython().displayhook(5)``).
    Without it the cell scores on its errors alone.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if is_autograded_test(cell):
            cell.outputs = [out for out in cell.get("outputs", []) if out.get("output_type") != "execute_result"
                            or _partial_mark(cell, out) is not None]
        return cell, resources


class AwardBonusPoints(NbGraderPreprocessor):
    """Record the bonus points of bonus questions as nbgrader's ``extra_credit``, after ``SaveAutoGrades``.

    A bonus grade cell has nbgrader ``points`` 0 (``course build``), so nbgrader's maximum of a lab is its core total
    and the formgrader, ``nbgrader export`` and our reports show e.g. 57/100. Its points are read here from the
    course's own instructor notebook (``source/<lab>/<notebook>.ipynb`` of the course folder), never from the
    submission, whose metadata the student can edit (docs/SECURITY.md).

    - An autograded bonus test cell earns what nbgrader's ``determine_grade`` gives the graded cell (its outputs as
      the grader left them) with the real bonus points: all of them when it passed, 0 when it failed or is missing.
      Every grading run overwrites the earlier extra credit of these cells.
    - A manually graded bonus cell is the TA's: its extra credit (the formgrader's "Extra credit" box) is kept. Its
      automatic score is set to 0 where nbgrader left none, so that the extra credit a TA enters counts in nbgrader's
      score even when the TA leaves the score box (out of 0) empty.
    """

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry

        info = resources["nbgrader"]
        source = read_course_source(self.config, info, self.log, "Bonus points not awarded")
        if source is None:
            return nb, resources
        bonus = bonus_points(source)
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
                    share = partial_credit_share(submitted[gid]) if gid in submitted else None
                    grade.extra_credit = self._earned(reference[gid], submitted.get(gid), points) if share is None \
                        else math.floor(share * points * 100 + 1e-9) / 100
                elif grade.auto_score is None:
                    grade.auto_score = 0.0  # the TA's extra credit alone counts (nbgrader ignores it without a score)
            gb.db.commit()
        return nb, resources

    def _earned(self, reference, cell, points: float) -> float:
        """What nbgrader's own rule gives the graded test cell ``cell`` (its outputs as the grader left them) when it
        is the instructor's cell ``reference`` worth ``points``; 0 when the submission lacks it."""
        from nbformat import from_dict
        from nbgrader.utils import determine_grade

        if cell is None or cell.get("cell_type") != "code":
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
    return Path(course.get("root") or os.getcwd()) / (course.get("source_directory") or "source") / str(lab)


def read_course_source(config, info, log, failure: str):
    """The course's instructor notebook (``source/<lab>/<notebook>.ipynb``) of the notebook nbgrader is processing
    (``info``: ``resources["nbgrader"]``), or None, logged as an error that starts with ``failure``, when the course
    folder has none or it cannot be read."""
    path = course_source_folder(config, info["assignment"]) / f"{info['notebook']}.ipynb"
    if not path.is_file():
        log.error("%s: no instructor notebook for %s/%s in the course's source folder", failure, info["assignment"],
                  info["notebook"])
        return None
    try:
        return read_notebook(path)
    except NotebookError as exc:
        log.error("%s: %s", failure, exc)
        return None


class ShowBonusPoints(NbGraderPreprocessor):
    """In feedback, a bonus cell reads "Score: 5 / 5", not "/ 0": after nbgrader's ``GetGrades`` (which shows each
    cell out of its nbgrader points, 0 for bonus cells), its points become the bonus points of the course's source
    notebook (never the submission's metadata). The page's total stays nbgrader's: out of the core maximum, bonus
    included in the score."""

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
    """Keep hidden tests out of feedback HTML: their source, and any output that quotes them.

    - A hidden test region becomes a one-line note.
    - A test cell keeps only its error's name and message and the list of its failed checks (our assertion messages,
      written for students), shortened to ``max_message_chars``; its other printed output and traceback are dropped.
    - In every cell, any output line that quotes a line of hidden test source (compared without whitespace,
      for source lines of at least ``min_quoted_chars`` characters) is replaced by a note, so student code that
      copied hidden test text during grading cannot print it into the feedback later.

    Instructors who want tests shown set ``c.StripHiddenTests.enabled = False``.
    """

    max_message_chars = Integer(
        500, help="Length a hidden test's error message is shortened to in feedback (characters)."
    ).tag(config=True)
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
        failed = [line[: self.max_message_chars] for out in cell.get("outputs", [])
                  if out.get("output_type") == "stream" and out.get("name") == "stdout"
                  for line in "".join(out.get("text", "")).splitlines() if line.startswith(FAILED_CHECK_PREFIX)]
        if failed:  # the grader's list of failed checks (checks.py): assertion messages, written for students
            outputs.append(NotebookNode(output_type="stream", name="stdout", text=self._redact(
                "Some checks failed; this cell earned the weighted share of the checks that passed:\n"
                + "\n".join(failed) + "\n")))
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                message = str(out.get("evalue", ""))
                if len(message) > self.max_message_chars:
                    message = message[: self.max_message_chars] + " [...]"
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
    for out in cell.get("outputs", []):
        if out.get("output_type") != "error":
            continue
        text = f"{out.get('ename', '')}: {out.get('evalue', '')}"
        for needle in STICKY_CUDA_ERRORS:
            if needle in text:
                return needle
    return ""


def _error_output(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def neutralise_cell_metadata(cell, skip_tag: str) -> list[str]:
    """Remove from one cell the metadata that changes how it is executed or trusted; what was removed, in words.

    - The tags nbclient acts on: ``skip_tag`` (``Execute.skip_cells_with_tag``, "skip-execution": the cell is not
      run, so a test cell would pass unrun) and ``raises-exception`` (the cell's error does not count as one).
    - nbgrader metadata without a grade id. nbgrader's sanitize step (``OverwriteCells``) restores the cells whose
      grade id is in the gradebook and deletes any other grade id, but leaves the flags: a student cell marked
      ``locked`` would be run as an instructor cell (the grading guard adopts what those change), one marked
      ``grade`` as a test cell. Without a grade id a cell is the student's own.

    The same cell from any route (``course grade``, plain ``nbgrader autograde``, the formgrader) is then run the
    same way.
    """
    removed = []
    tags = cell.metadata.get("tags")
    if isinstance(tags, list):
        bad = [tag for tag in tags if tag in (skip_tag, *EXECUTION_TAGS)]
        if bad:
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
    """nbgrader's sanitize step, after ``OverwriteCells``: ``neutralise_cell_metadata`` on every cell.

    It runs before ``CheckCellMetadata``, which would otherwise reject a student cell whose made-up grade id
    ``OverwriteCells`` deleted (nbgrader's stock pipeline then fails the whole submission, where ``course grade``
    grades it with that cell as the student's own). What was removed is kept in the notebook's metadata
    (``NEUTRALISED_KEY``, replaced on every run) for ``GuardedExecute``'s report.
    """

    def preprocess(self, nb, resources):
        removed = {}
        for index, cell in enumerate(nb.cells):
            found = neutralise_cell_metadata(cell, "skip-execution")
            if found:
                removed[_where(cell, index)] = found
        nb.metadata[NEUTRALISED_KEY] = removed
        return nb, resources


class RecoverCellMetadata(NbGraderPreprocessor):
    """Give back the nbgrader metadata a submission lost (a notebook pasted into a fresh one, an editor that drops
    metadata), by where its cells sit (``course.recover``), before nbgrader looks for its graded cells. What was
    recovered, and any answer that could not be placed (a TA must look), is logged; ``course grade`` does the same
    when it stages the submission and records the status ``needs-TA``."""

    def preprocess(self, nb, resources):
        source = read_course_source(self.config, resources["nbgrader"], self.log, "Cell metadata not recovered")
        if source is None:
            return nb, resources
        for note in recover_metadata(nb, release_of(source), source).notes():
            self.log.warning("%s: %s", resources["nbgrader"].get("student"), note)
        return nb, resources


class QuietOverwriteCells(OverwriteCells):
    """nbgrader's ``OverwriteCells`` without its false alarm on hidden-test cells a student never touched.

    nbgrader records a locked cell's checksum before ``generate_assignment`` removes the cell's hidden tests
    (jupyter/nbgrader#1961), so every untouched hidden-test cell of every submission logs "Attribute 'checksum' ...
    has changed!" and a TA learns to ignore the warning. Here it is logged (at warning level, as nbgrader does) only
    when the submitted source differs from what was released; the cell is restored from the gradebook either way.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        self._submitted = (cell.cell_type, cell.source)  # before nbgrader restores anything
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name, attr, old, new):
        if attr == "checksum" and self._as_released(name):
            self.log.debug("Cell %s is as released (its recorded checksum includes hidden tests)", name)
            return
        super().report_change(name, attr, old, new)

    def _as_released(self, name: str) -> bool:
        """Whether the cell being processed (grade id ``name``, which nbgrader just found in the gradebook) was
        submitted exactly as released: the gradebook's source without its hidden tests."""
        stored = self.gradebook.find_source_cell(name, self.notebook_id, self.assignment_id)
        released = strip_lines(stored.source, HIDDEN_BEGIN, HIDDEN_END, keep_inside=False)
        cell_type, source = self._submitted
        return cell_type == stored.cell_type and source.rstrip() == released.rstrip()


def _approx_bytes(value) -> int:
    """Roughly how many bytes a message's content takes (strings by length, containers summed)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(key)) + _approx_bytes(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_approx_bytes(item) for item in value)
    return 8


def _format_bytes(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count / 1024:.0f} KiB"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters dropped by the grader]"


def _is_setup_cell(cell) -> bool:
    """A locked code cell of the instructor's that is neither a test nor an answer (imports, data, helpers)."""
    return cell.cell_type == "code" and is_locked(cell) and not is_grade(cell) and not is_solution(cell)


def setup_cells(nb) -> list[tuple[str, list[str]]]:
    """Source and tags of each setup cell of ``nb`` (``_is_setup_cell``), as ``boundary.modules_to_import`` takes them."""
    return [(cell.source, list(cell.metadata.get("tags") or ())) for cell in nb.cells if _is_setup_cell(cell)]


def _where(cell, index: int) -> str:
    """How reasons name a cell: ``cell 7 (q1_2_scale)``."""
    gid = (cell.metadata.get("nbgrader") or {}).get("grade_id") if isinstance(cell.metadata.get("nbgrader"), dict) else None
    return f"cell {index}" + (f" ({gid})" if gid else " (a cell without a grade id)")


class GuardedExecute(Execute):
    """nbgrader's Execute, with the grading boundary and guard, recovery from a dead kernel, and a notebook time limit.

    - Test cells never run in the kernel: ``course/boundary.py`` runs them in this process, asking the kernel's
      boundary server (installed before any student code) for the student's values, and writes the cells' outputs
      itself; no reply status, error or output of the kernel decides a score. Hidden test source therefore never
      reaches the kernel (``In``, ``_ih``, ``linecache``, frames).
    - Before any notebook cell, the guard (``course/guard_kernel.py``) is installed in the fresh kernel. Around
      every autograded test cell the grader asks it, through ``user_expressions`` (no input transformers, no
      hooks), whether student code replaced anything the tests rely on; answers are signed with a key only the
      grader holds. Anything replaced is put back and the test cell gets a ``GradingIntegrityError``: it scores
      zero, and the cells after it are graded on an honest environment. Changes are also undone before every
      locked (instructor) cell and charged to the next test cell; what a locked cell itself changes (a library it
      imports registering an IPython hook, as trio does) becomes the reference. A guard that no longer answers
      correctly fails every later test cell (fail closed).
    - A dead or mute kernel (``os._exit``, a segfault, the out-of-memory killer, a request that does not answer
      even after an interrupt) fails the cell it happened in; a fresh kernel then runs the earlier cells (not the
      tests) again and grading goes on (``MAX_KERNEL_RESTARTS``; the report lists them as ``kernel_restarts``).
      When no fresh kernel can help, or at the notebook time limit (``notebook_timeout_s``, default 600 s), execution
      stops; the cells already run keep their results, every later test cell gets an error
      saying why it did not run, and nbgrader scores the notebook.
    - A sticky CUDA error (a device-side assert, an illegal memory access) leaves the GPU unusable for the rest of
      the process, so execution stops there the same way and the report names it (``cuda_error``);
      ``course.grade`` then grades the submission again without the GPU, as a CPU grader would.
    - Cell metadata that changes how a cell runs (``neutralise_cell_metadata``: the ``skip-execution`` and
      ``raises-exception`` tags, nbgrader flags without a grade id) is removed before any cell runs, on every route
      to a grade; widget messages are ignored (an output widget could swallow a test cell's error), and a test
      cell ignores ``clear_output`` (a student thread could clear its error).
    - Output is capped while it arrives: each cell keeps at most ``max_cell_output_bytes`` and the notebook
      ``max_notebook_output_bytes``; the rest is dropped with a note in the cell (errors are always kept,
      shortened). A kernel message larger than ``max_message_bytes`` is dropped by ZeroMQ before it is read.
    - A cell whose output did not finish arriving (nbclient's ``CellTimeoutError``, after an interrupt at the cell
      time limit or a flood of output) counts as failed; grading goes on while the kernel still answers, and the
      report makes the submission ``partial``.
    - A kernel that dies or stops answering before any student code ran is not blamed on the student: the reason
      says so, and the report asks ``course.grade`` to grade the submission again (``retry``); so does anything a
      busy machine can explain (no reply, output that did not arrive in time).

    What happened is written to ``grading_report.json`` beside the autograded notebook. ``guard`` (``EFFICIENT_AI_GUARD=off``)
    turns the guard off (to compare, or to rule it out when a reference solution loses points).
    """

    max_cell_output_bytes = Integer(
        1 * MIB, help="Output one cell may keep (bytes); the rest is dropped with a note. Errors are always kept."
    ).tag(config=True)
    max_notebook_output_bytes = Integer(
        16 * MIB, help="Output the whole notebook may keep (bytes); later output is dropped with a note."
    ).tag(config=True)
    max_error_bytes = Integer(
        64 * 1024, help="Size an error output (message and traceback) is shortened to (bytes)."
    ).tag(config=True)
    max_message_bytes = Integer(
        8 * MIB, help="Largest kernel message the grader reads (bytes); ZeroMQ drops a larger one unread."
    ).tag(config=True)
    notebook_timeout_s = Float(
        DEFAULT_NOTEBOOK_TIMEOUT_S,
        help="Time limit of the whole notebook (seconds): later cells do not run, the points earned so far are kept. "
             "nbgrader_config.py sets it from EFFICIENT_AI_NOTEBOOK_TIMEOUT_S.",
    ).tag(config=True)
    guard = Bool(
        True, help="Install the grading guard (course/guard_kernel.py) in every kernel. nbgrader_config.py turns it off "
                   "when EFFICIENT_AI_GUARD=off (to compare, or to rule it out when a reference loses points).",
    ).tag(config=True)
    # nbclient's own option, with another default: once the last cell has run nothing the kernel does can change a
    # grade, so it is killed instead of being asked to shut down and waited for (about 2 s per submission).
    shutdown_kernel = Enum(
        ["graceful", "immediate"], default_value="immediate",
        help="How the kernel ends after the last cell: 'immediate' kills it, 'graceful' asks it to shut down first.",
    ).tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        self._reset_state()
        # The grader runs the test cells with torch of its own: import it while the kernel starts, not after.
        self._needed = boundary.names_tests_read(nb)
        self._recording_bypass = recording_bypass_flags(nb)
        locked = setup_cells(nb)
        self._warming = threading.Thread(target=boundary.warm_imports, name="grader-imports", daemon=True,
                                         args=(self._needed, self._instructor_folder(resources),
                                               boundary.modules_to_import(locked, self._needed)))
        self._warming.start()
        earlier = nb.metadata.pop(NEUTRALISED_KEY, None)  # found by NeutraliseCellMetadata in the sanitize step
        if isinstance(earlier, dict):
            self._neutralised.update({str(k): [str(x) for x in v] for k, v in earlier.items() if isinstance(v, list)})
        for index, cell in enumerate(nb.cells):
            removed = neutralise_cell_metadata(cell, self.skip_cells_with_tag)
            if removed:
                self._neutralised[_where(cell, index)] = removed
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self._zmq_context is not None:
                self._zmq_context.destroy(linger=0)
            self._write_report(resources)

    def _reset_state(self) -> None:
        """What one notebook's run records, reset before it starts."""
        self._neutralised: dict[str, list[str]] = {}  # cell -> execution-affecting metadata removed from it
        self._student_code_ran = False  # whether any cell that is not the instructor's has started
        self._kept_bytes: dict[int, int] = {}
        self._dropped_bytes: dict[int, int] = {}
        self._output_missed: list[str] = []
        self._retry = ""  # what a busy machine could explain: course.grade grades the submission again
        self._zmq_context = None
        self._guard_key: bytes | None = None
        self._guard_broken = ""
        self._stopped = ""
        self._cuda_error = ""
        self._kernel_lost = ""  # "died" or "stopped answering ...", found by a request of the grader's own
        self._integrity: dict[str, list[str]] = {}
        self._pending: list[str] = []  # tampering undone before a locked cell, charged to the next test cell
        self._grader: boundary.GraderSide | None = None  # runs the test cells (course/boundary.py)
        self._boundary_ready = False
        self._boundary_comm = ""  # the comm the boundary's requests travel on
        self._replayable: list[int] = []  # code cells (not tests) that ran without losing the kernel
        self._restarts: list[str] = []  # why each fresh kernel was started
        self._started_ahead: bool | None = None  # whether the first kernel came from course grade's pool
        self._deadline = time.monotonic() + self.notebook_timeout_s

    def create_kernel_manager(self):
        """nbclient's kernel manager; where ``course grade`` started a kernel ahead (``course/kernel_pool.py``), its
        first kernel is that one."""
        km = super().create_kernel_manager()
        folder = os.environ.get(kernel_pool.POOL_ENV, "")
        if folder and os.path.isdir(folder):
            km.provisioner = kernel_pool.PooledProvisioner(
                kernel_id=km.kernel_id or "", kernel_spec=km.kernel_spec, parent=km, pool_folder=folder)
        return km

    async def async_start_new_kernel_client(self):
        """nbclient's kernel client, on ZeroMQ sockets that drop any message over ``max_message_bytes`` unread."""
        import zmq
        import zmq.asyncio

        if self._started_ahead is None:
            self._started_ahead = bool(getattr(self.km.provisioner, "adopted", False))
        context = zmq.asyncio.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        self._zmq_context = context
        make_client = self.km.client
        self.km.client = lambda **kwargs: make_client(context=context, **kwargs)
        try:
            return await super().async_start_new_kernel_client()
        finally:
            del self.km.client

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # nbclient binds the sync name to its own

    # -- the guard protocol -------------------------------------------------------------------------------------
    async def _async_read(self, channel, timeout_s: float, interrupt: bool, pick):
        """Read ``channel``'s messages until ``pick(message)`` returns something other than None, and return that;
        None after ``timeout_s`` seconds. With ``interrupt``, a request still running then is interrupted and given
        10 s more to answer (with the interruption). Raises DeadKernelError when the kernel dies meanwhile."""
        from queue import Empty

        from nbclient.exceptions import DeadKernelError
        from nbclient.util import ensure_async

        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                if not interrupt:
                    return None
                await ensure_async(self.km.interrupt_kernel())
                interrupt, deadline = False, time.monotonic() + 10
            try:
                msg = await ensure_async(channel.get_msg(timeout=1))
            except Empty:
                if not await ensure_async(self.kc.is_alive()):
                    raise DeadKernelError("Kernel died") from None
                continue
            picked = pick(msg)
            if picked is not None:
                return picked

    async def _async_request(self, code: str, expression: str | None, timeout_s: float) -> dict | None:
        """Send a silent request; its reply, or None after ``timeout_s`` seconds."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False,
                                 user_expressions={"guard": expression} if expression else None)
        return await self._async_read(self.kc.shell_channel, timeout_s, False,
                                      lambda msg: msg if msg["parent_header"].get("msg_id") == msg_id else None)

    def _request(self, code: str, expression: str | None = None, timeout_s: float = KERNEL_REPLY_TIMEOUT_S) -> dict | None:
        """Send the kernel a silent request; its reply, or None (and ``_kernel_lost`` set) when none came within
        ``timeout_s`` seconds."""
        from nbclient.exceptions import DeadKernelError
        from nbclient.util import run_sync

        if self._kernel_lost:
            return None
        try:
            reply = run_sync(self._async_request)(code, expression, timeout_s)
        except DeadKernelError:
            self._kernel_lost = "died"
            return None
        if reply is None:
            self._kernel_lost = f"stopped answering (no reply in {timeout_s:.0f} s)"
        return reply

    def _guard_value(self, reply: dict | None) -> str | None:
        try:
            value = reply["content"]["user_expressions"]["guard"]
            if value.get("status") != "ok":
                return None
            return ast.literal_eval(value["data"]["text/plain"])
        except (KeyError, TypeError, ValueError, SyntaxError):
            return None

    def _install_guard(self) -> None:
        # The guard's functions get a private copy of the builtins, taken before any student code runs: replacing
        # builtins.type or builtins.getattr later cannot change how the guard itself works.
        source = (
            GRADING_KERNEL_SETTINGS +
            "import builtins as _b\n"
            "_g = {'__builtins__': dict(vars(_b)), '__name__': '_efficient_ai_guard'}\n"
            f"exec(compile({GUARD_SOURCE.read_text()!r}, '<grading guard>', 'exec'), _g)\n"
            f"_efficient_ai_guard = _g['_efficient_ai_guard_install']({self._guard_watches_libraries()!r})\n"
            "del _b, _g\n"
        )
        # Installing the guard imports what it watches (torch, numpy): on a busy machine that takes as long as a cell.
        reply = self._request(source, timeout_s=max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0))
        if not reply or reply["content"].get("status") != "ok":
            self._guard_broken = "the grading guard could not be installed in the kernel"
            return
        key = self._guard_value(self._request("", "_efficient_ai_guard('key')"))
        if not key:
            self._guard_broken = "the grading guard could not be installed in the kernel"
            return
        self._guard_key = bytes.fromhex(key)

    def _guard_watches_libraries(self) -> bool:
        """numpy, torch and utils are imported and watched by the guard only in a lab whose instructor notebook
        imports one of them (a lab that does not, like the tests' fixture lab, saves seconds per submission)."""
        folder = self._grader.folder if self._grader is not None else None
        return boundary.lab_uses_guard_libraries(folder)

    def _guard(self, command: str) -> list[str] | None:
        """Run a guard command; its findings (a list), or None when its answer cannot be trusted."""
        if not self.guard:
            return []
        if self._guard_key is None:
            return None
        nonce = secrets.token_hex(16)
        value = self._guard_value(self._request("", f"_efficient_ai_guard({command!r}, {nonce!r})"))
        if self._kernel_lost:
            return []  # the kernel itself is gone or mute: execution stops there (preprocess_cell)
        payload, _, signature = (value or "").rpartition("|")
        expected = hmac.new(self._guard_key, f"{nonce}|{payload}".encode(), hashlib.sha256).hexdigest()
        if not value or not hmac.compare_digest(signature, expected):
            self._guard_key = None
            self._guard_broken = ("the grading guard stopped answering correctly (student code removed or replaced "
                                  "it); every later test cell scores zero")
            return None
        return json.loads(payload) if command in ("check", "restore") else []

    # -- cells --------------------------------------------------------------------------------------------------
    def preprocess_cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        if self._grader is None:
            self._grader = boundary.GraderSide(self._instructor_folder(resources), boundary.KernelLink(self._ask),
                                               getattr(self, "_needed", None), getattr(self, "_warming", None))
        if not self._stopped and not self._kernel_lost:
            self._install_kernel_side()
        is_test = is_autograded_test(cell)
        is_setup = _is_setup_cell(cell)
        if self._stopped:
            if is_test:
                cell.outputs = [_error_output("NotRun", self._stopped)]
            return cell, self.resources
        if cell.cell_type != "code":
            return cell, self.resources
        where = _where(cell, index)
        if is_test:
            self._grade_test_cell(cell, index, where)
        else:
            self._run_notebook_cell(cell, index, where, is_setup)
        cuda_error = sticky_cuda_error(cell)
        if cuda_error:
            self._cuda_error = f"{cuda_error} in {where}"
            self._stopped = (f"a CUDA error that leaves the GPU unusable ({cuda_error}) in {where}; "
                             "cells after it were not run")
        elif time.monotonic() > self._deadline:
            self._stopped = (f"the notebook exceeded its time limit of {self.notebook_timeout_s:.0f} s "
                             f"(EFFICIENT_AI_NOTEBOOK_TIMEOUT_S) after {where}; cells after it were not run")
        return cell, self.resources

    def _install_kernel_side(self) -> None:
        """The grading guard and the boundary's server, in a kernel that has neither yet."""
        if self._guard_key is None and not self._guard_broken and self.guard:
            self._install_guard()
        if not self._boundary_ready and not self._kernel_lost:
            self._install_boundary()

    def _run_notebook_cell(self, cell, index: int, where: str, is_setup: bool) -> None:
        """Run a cell that is not a test in the kernel (student code, or a locked instructor cell)."""
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if is_setup:
            self._before_locked_cell()
            self._grader.run_locked_cell(cell.source, cell.metadata.get("tags"))
        elif cell.source.strip():
            self._student_code_ran = True
        try:
            self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._kernel_lost = "died"
            cell.outputs.append(_error_output("DeadKernelError", f"the kernel died in {where}"))
            self._recover(f"in {where}")
            return
        except CellTimeoutError:
            self._output_did_not_arrive(cell, where)
        if is_setup:
            self._guard("adopt")
        else:
            # Student code can leave the kernel unable to answer (replacing builtins.type breaks ipykernel's
            # message handler): ask now, so a kernel in that state costs one wait, not one per remaining cell.
            self._request("")
        if self._kernel_lost:
            self._recover(f"after {where}")
        else:
            self._replayable.append(index)

    def _before_locked_cell(self) -> None:
        """Student changes are undone before a locked cell (and charged to the next test cell), so that what the
        locked cell changes can be adopted as the instructor's own (``self._guard("adopt")`` after it)."""
        self._pending += self._findings_or_broken("restore")
        self._guard("mark")

    def _grade_test_cell(self, cell, index: int, where: str) -> None:
        """Run a test cell in the grader (course/boundary.py); its outputs are the grader's, never the kernel's."""
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        found = self._pending + self._findings_or_broken("restore")
        self._pending = []
        cell.outputs = []
        if isinstance(cell.metadata.get("efficient_ai"), dict):
            cell.metadata["efficient_ai"].pop(PARTIAL_CREDIT_KEY, None)  # only this run's grader marks a result
        cell.execution_count = None
        if self._kernel_lost:
            self._recover(f"before {where}")
        if self._stopped:
            cell.outputs = [_error_output("NotRun", self._stopped)]
            return
        self._test_deadline = time.monotonic() + (self.timeout or KERNEL_REPLY_TIMEOUT_S)
        share = 0.0
        try:
            printed, error, share = self._grader.run_test_cell(cell.source, gid or str(index))
        except boundary.KernelLost:
            if not self._kernel_lost:  # the kernel answered, but not with its boundary server's answer
                printed, error = "", ("BoundaryError", "the kernel sent no answer to a request of this test: student "
                                      "code replaced or broke the grading boundary's server in the kernel")
            else:
                printed, error = "", ("DeadKernelError" if self._kernel_lost == "died" else "TimeoutError",
                                      f"the kernel {self._kernel_lost} while this test cell was running; the grader "
                                      "started a fresh kernel for the cells after it")
        if printed:
            cell.outputs.append(NotebookNode(output_type="stream", name="stdout",
                                             text=_shorten(printed, self.max_cell_output_bytes)))
        if error:
            cell.outputs.append(_error_output(error[0], _shorten(error[1], self.max_error_bytes)))
        if self._kernel_lost:
            self._recover(f"in {where}")
        else:
            found += self._findings_or_broken("restore")
        if getattr(self, "_recording_bypass", None) and RECORDS_CALLS in cell.source:
            found += [f"code that can switch off the recording of torch calls ({flag})"
                      for flag in self._recording_bypass[:3]]
        if not error and not found and share < 1.0:  # tampering found: no partial credit, the cell scores zero
            cell.outputs.append(partial_credit_output(cell, share, self._grader.last_failures))
        if found:
            found = sorted(set(found))
            self._integrity[gid or str(index)] = found
            cell.outputs.append(_error_output(
                "GradingIntegrityError",
                "this test does not count: student code changed what the tests rely on (" + "; ".join(found) +
                "). The change was undone for the cells after this one."))

    def _instructor_folder(self, resources) -> Path | None:
        """The lab's instructor files (``source/<lab>/``): the grader imports ``utils`` from there."""
        lab = ((resources or {}).get("nbgrader") or {}).get("assignment")
        folder = course_source_folder(self.config, lab) if lab else None
        return folder if folder is not None and folder.is_dir() else None

    # -- the boundary: requests of the grader's tests ------------------------------------------------------------
    def _install_boundary(self) -> None:
        """The boundary's server in the kernel, and the comm the grader's requests travel on (``_ask``)."""
        source = (
            GRADING_KERNEL_SETTINGS +
            "import builtins as _b\n"
            "_g = {'__builtins__': dict(vars(_b)), '__name__': '_efficient_ai_boundary'}\n"
            f"exec(compile({boundary.KERNEL_SOURCE.read_text()!r}, '<grading boundary>', 'exec'), _g)\n"
            f"_g['_efficient_ai_boundary_install']({boundary.MAX_ANSWER_BYTES}, {boundary.COMM_TARGET!r})\n"
            "del _b, _g\n"
        )
        reply = self._request(source, timeout_s=max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0))
        self._boundary_ready = bool(reply) and reply["content"].get("status") == "ok"
        if self._boundary_ready:
            # The kernel handles shell messages in order, so requests sent after this find the comm open.
            self._boundary_comm = secrets.token_hex(16)
            self.kc.shell_channel.send(self.kc.session.msg(
                "comm_open", {"comm_id": self._boundary_comm, "target_name": boundary.COMM_TARGET, "data": {}}))

    async def _async_ask(self, payload: str, timeout_s: float) -> tuple[str | None] | None:
        """Send one request on the boundary's comm; ``(answer text or None,)`` once the kernel has handled it (None:
        it sent no answer), None when it did not within ``timeout_s`` seconds and 10 s after an interrupt. The answer
        and the kernel's idle status are read from the IOPub channel, matched by request; other messages there are
        output of the student code the request ran, or late messages of earlier cells."""
        msg = self.kc.session.msg("comm_msg", {"comm_id": self._boundary_comm, "data": {"request": payload}})
        self.kc.shell_channel.send(msg)
        msg_id = msg["header"]["msg_id"]

        def pick(message):
            if message["parent_header"].get("msg_id") != msg_id:
                return None
            content = message["content"]
            if message["msg_type"] == "comm_msg" and content.get("comm_id") == self._boundary_comm:
                data = content.get("data")
                answer = data.get("answer") if isinstance(data, dict) else None
                return (answer if isinstance(answer, str) else None,)
            if message["msg_type"] == "status" and content.get("execution_state") == "idle":
                return (None,)
            return None

        return await self._async_read(self.kc.iopub_channel, timeout_s, True, pick)

    def _ask(self, payload: str) -> str | None:
        """One request to the kernel's boundary server; its answer text, or None when there is none (the kernel is
        lost, or student code took the server's place and sent nothing).

        A request still running at the test cell's time limit is interrupted (the server answers with the
        interruption); a kernel that does not answer even then counts as lost."""
        from nbclient.exceptions import DeadKernelError

        if self._kernel_lost or not self._boundary_ready:
            return None
        left_s = max(1.0, getattr(self, "_test_deadline", time.monotonic() + KERNEL_REPLY_TIMEOUT_S) - time.monotonic())
        try:
            handled = run_sync(self._async_ask)(payload, left_s)
        except DeadKernelError:
            self._kernel_lost = "died"
            return None
        if handled is None:
            self._kernel_lost = f"stopped answering (no reply in {left_s:.0f} s, nor after an interrupt)"
            return None
        return handled[0]

    # -- a lost kernel: a fresh one, and the cells before ----------------------------------------------------------
    def _recover(self, when: str) -> None:
        """After the kernel died or went mute: start a fresh kernel and run the earlier cells (not the tests) again,
        so a crash costs only the cell it happened in. Gives up (``_stop_lost_kernel``) after
        ``MAX_KERNEL_RESTARTS`` fresh kernels, past the notebook's time limit, or when the earlier cells lose the
        fresh kernel too."""
        lost = self._kernel_lost
        if len(self._restarts) >= MAX_KERNEL_RESTARTS or time.monotonic() > self._deadline:
            self._stop_lost_kernel(when)
            return
        self._restarts.append(f"the kernel {lost} {when}")
        try:
            run_sync(self._async_fresh_kernel)()
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot start again stops grading here
            self._stop_lost_kernel(f"{when} (a fresh kernel could not start: {type(exc).__name__})")
            return
        self._kernel_lost = ""
        self._guard_key, self._boundary_ready = None, False
        self._install_kernel_side()
        for earlier in list(self._replayable):
            cell = self.nb.cells[earlier]
            is_setup = _is_setup_cell(cell)
            if is_setup:
                self._before_locked_cell()
            self._request(cell.source, timeout_s=max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0))
            if is_setup:
                self._guard("adopt")
            if self._kernel_lost:
                self._stop_lost_kernel(f"while the earlier cells ran again in a fresh kernel, {when}")
                return

    async def _async_fresh_kernel(self) -> None:
        from nbclient.util import ensure_async

        try:
            self.kc.stop_channels()
        except Exception:  # noqa: BLE001, S110 - channels of a dead kernel may already be closed
            pass
        await ensure_async(self.km.restart_kernel(now=True))
        await self.async_start_new_kernel_client()

    def _stop_lost_kernel(self, when: str) -> None:
        """Stop execution after the kernel died or went mute, worded by what was observed."""
        if not self._student_code_ran:
            cause = ("before any student code ran, so not because of the submission (a machine too busy or short of "
                     "memory, or a kernel that failed to start)")
            self._retry = self._retry or f"the kernel {self._kernel_lost} {when}, before any student code ran"
        elif self._kernel_lost == "died":
            cause = "(os._exit, a segfault or the out-of-memory killer)"
        else:
            cause = ("after student code ran: student code can break it (replacing builtins.type does), and so can a "
                     "machine too busy to answer")
            self._retry = self._retry or f"the kernel {self._kernel_lost} {when}"
        self._stopped = f"the kernel {self._kernel_lost} {when} {cause}; cells after it were not run"

    def _output_did_not_arrive(self, cell, where: str) -> None:
        """nbclient's ``CellTimeoutError``: the kernel replied, but the cell's output did not finish arriving within
        ``iopub_timeout`` (a cell interrupted at the time limit that kept running, output dropped for its size, or a
        busy machine). The cell counts as failed; the guard's next request tells whether the kernel still answers."""
        reason = (f"the output of {where} had not finished arriving {self.iopub_timeout} s after the kernel's reply "
                  "(nbclient's CellTimeoutError); it counts as failed")
        self._output_missed.append(reason)
        self._retry = self._retry or reason
        cell.outputs.append(_error_output("CellTimeoutError", reason))
        self._reopen_channels()

    def _reopen_channels(self) -> None:
        """Connect the shell and output channels to the kernel again, and wait until output arrives on them.

        ZeroMQ closes a channel that received a message over ``max_message_bytes`` and does not reopen it; a fresh
        subscription misses what the kernel sent before it took effect, so the kernel is asked for a status until
        one arrives. A kernel that sends none within ``KERNEL_REPLY_TIMEOUT_S`` counts as no longer answering.
        """
        from nbclient.exceptions import DeadKernelError

        for name in ("_iopub_channel", "_shell_channel"):
            channel = getattr(self.kc, name, None)
            if channel is not None:
                channel.close()
                setattr(self.kc, name, None)
        try:
            arrived = run_sync(self._async_output_arrives)(KERNEL_REPLY_TIMEOUT_S)
        except DeadKernelError:
            self._kernel_lost = "died"
            return
        if not arrived:
            self._kernel_lost = f"stopped answering (no output in {KERNEL_REPLY_TIMEOUT_S} s)"

    async def _async_output_arrives(self, timeout_s: float) -> bool:
        from queue import Empty

        from nbclient.exceptions import DeadKernelError
        from nbclient.util import ensure_async

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg_id = self.kc.execute("", silent=True, store_history=False, allow_stdin=False)
            retry_at = min(deadline, time.monotonic() + 2)
            while time.monotonic() < retry_at:
                try:
                    msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=0.5))
                except Empty:
                    if not await ensure_async(self.kc.is_alive()):
                        raise DeadKernelError("Kernel died") from None
                    continue
                if msg["parent_header"].get("msg_id") == msg_id:
                    return True
        return False

    # -- output: capped while it arrives ------------------------------------------------------------------------
    def output(self, outs, msg, display_id, cell_index):
        """Keep an output while the cell's and the notebook's budgets last (nbclient's ``output`` otherwise)."""
        content = msg.get("content") or {}
        if msg.get("msg_type") == "error":
            self._shorten_error(content)
        else:
            room = self._output_room(cell_index)
            text = content.get("text") if msg.get("msg_type") == "stream" else None
            size = len(text) if isinstance(text, str) else _approx_bytes(content)
            if size > room:
                if not isinstance(text, str) or room <= 0:
                    self._drop(outs, cell_index, size)
                    return None
                content["text"] = text[:room]
                out = super().output(outs, msg, display_id, cell_index)
                self._kept_bytes[cell_index] = self._kept_bytes.get(cell_index, 0) + room
                self._drop(outs, cell_index, size - room)
                return out
            self._kept_bytes[cell_index] = self._kept_bytes.get(cell_index, 0) + size
        return super().output(outs, msg, display_id, cell_index)

    def _output_room(self, cell_index: int) -> int:
        notebook_left = self.max_notebook_output_bytes - sum(self._kept_bytes.values())
        return max(0, min(self.max_cell_output_bytes - self._kept_bytes.get(cell_index, 0), notebook_left))

    def _drop(self, outs, cell_index: int, size: int) -> None:
        """Count ``size`` dropped bytes; the first drop in a cell leaves a note there."""
        first = cell_index not in self._dropped_bytes
        self._dropped_bytes[cell_index] = self._dropped_bytes.get(cell_index, 0) + size
        if first:
            outs.append(NotebookNode(output_type="stream", name="stdout", text=(
                f"\n[the grader dropped the rest of this cell's output: it keeps "
                f"{_format_bytes(self.max_cell_output_bytes)} per cell and "
                f"{_format_bytes(self.max_notebook_output_bytes)} per notebook]\n")))

    def _shorten_error(self, content: dict) -> None:
        """Shorten an error's message and traceback in place to about ``max_error_bytes``."""
        limit = self.max_error_bytes
        content["ename"] = _shorten(str(content.get("ename", "Error")), 200)
        content["evalue"] = _shorten(str(content.get("evalue", "")), limit // 4)
        lines = [_shorten(str(line), limit // 8) for line in content.get("traceback") or []]
        kept, size = [], 0
        for line in reversed(lines):  # the end of a traceback says the most
            size += len(line)
            if size > limit // 2:
                kept.append(f"[... {len(lines) - len(kept)} traceback lines dropped by the grader]")
                break
            kept.append(line)
        content["traceback"] = kept[::-1]

    def on_cell_executed(self, **kwargs):
        reply = kwargs.get("execute_reply") or {}
        if isinstance(reply.get("content"), dict) and reply["content"].get("status") == "error":
            self._shorten_error(reply["content"])
        return super().on_cell_executed(**kwargs)

    def _update_display_id(self, display_id, msg):
        size = _approx_bytes(msg.get("content") or {})
        if size > self.max_cell_output_bytes or sum(self._kept_bytes.values()) + size > self.max_notebook_output_bytes:
            return  # an update too large to keep is dropped (the output it would replace stays)
        super()._update_display_id(display_id, msg)

    def handle_comm_msg(self, outs, msg, cell_index):
        """Ignore widget (comm) messages: grading needs no widget state, and an output widget would capture the
        outputs of the cell it names, a test cell's error included."""
        return None

    def _findings_or_broken(self, command: str) -> list[str]:
        findings = self._guard(command)
        return [self._guard_broken] if findings is None else findings

    def _write_report(self, resources) -> None:
        folder = ((resources or {}).get("metadata") or {}).get("path")
        if not folder:
            return
        dropped = {_where(self.nb.cells[i], i): size for i, size in self._dropped_bytes.items()} if self._dropped_bytes else {}
        report = {"stopped": self._stopped, "guard": self._guard_broken, "integrity": self._integrity,
                  "cuda_error": self._cuda_error, "output_missed": self._output_missed, "retry": self._retry,
                  "neutralised": self._neutralised, "output_dropped_bytes": dropped,
                  "kernel_restarts": self._restarts, "kernel_started_ahead": bool(self._started_ahead),
                  "output_caps_bytes": [self.max_cell_output_bytes, self.max_notebook_output_bytes]}
        try:
            (Path(folder) / GRADING_REPORT).write_text(json.dumps(report, indent=1))
        except OSError:
            pass
