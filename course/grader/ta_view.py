"""ta_view: the TA grades what the student saw, with the mark scheme beside each answer (docs/GRADING.md).

Autograde clears every output and re-runs the notebook at quick scale on the grader (a CPU, ``MPLBACKEND=Agg``), so
without this step the formgrader and feedback would show only the grader's run: no plot, the grader's tiny tables,
"GPU: none found" for a student who ran on an H100. Three preprocessors, named in ``nbgrader_config.py``:

- ``KeepStudentRun`` (autograde, after every step that scores): each code cell that is not an autograded test gets,
  after the grader's outputs, the outputs the student's own notebook in ``submitted/`` shows under the same code,
  sanitized (``course.grader.sanitize``) and capped, each group under a label. Test cells never get any: their outputs
  are the grader's alone, and nothing copied is read for a score (the copies are made after scoring, and a copied
  ``execute_result``, the output nbgrader reads as a score, becomes a ``display_data``).
- ``ShowMarkSchemes`` (autograde): after each manually graded cell, a Markdown cell with its mark scheme, from the
  course's ``source/`` notebook (never from the submission). The formgrader shows the autograded notebook, so the
  TA reads the scheme where they type the score.
- ``StripMarkSchemes`` (feedback): removes those cells, so no student reads a mark scheme.
"""
from __future__ import annotations

import json
import re
import secrets
from collections import defaultdict, deque
from html import escape
from pathlib import Path

from nbformat import from_dict
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Int

from ..common.notebooks import (
    COURSE_METADATA,
    MARK_SCHEME_BEGIN,
    MARK_SCHEME_END,
    choose_notebook,
    grade_id,
    is_autograded_test,
    is_graded,
    is_solution,
    nbgrader_meta,
    region_lines,
)
from .nbgrader_ext import read_course_source
from .sanitize import sanitize_output

STUDENT_RUN = "The student's run (submitted, not re-executed)"
GRADER_RUN = "The grader's re-run (quick scale, on the grading machine)"
MARK_SCHEME_KEY = "mark_scheme"  # cell.metadata["efficient_ai"]["mark_scheme"]: the grade id a scheme cell belongs to
# A submitted notebook larger than this is not read for its outputs (staging reads it whole, once, to grade it).
MAX_SUBMITTED_FILE_BYTES = 64 << 20


def is_manually_graded(cell) -> bool:
    """A cell a TA scores: a graded answer (written answer, plot) or a task."""
    meta = nbgrader_meta(cell)
    return bool(meta.get("task")) or (is_graded(cell) and is_solution(cell))


def _new_cell(nb, cell_type: str, source: str, metadata: dict):
    """A cell to insert into ``nb``, with an id only where its format has them (nbformat 4.5 and newer)."""
    cell = {"cell_type": cell_type, "source": source, "metadata": metadata}
    if cell_type == "code":
        cell.update(outputs=[], execution_count=None)
    if (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5):
        cell["id"] = secrets.token_hex(8)
    return from_dict(cell)


# ---- the student's run ----------------------------------------------------------------------------------------


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value if isinstance(value, str) else ""


def _code_key(source) -> str:
    """How a graded cell is matched with the submitted cell that ran the same code."""
    return _text(source).rstrip()


def submitted_notebook(root: Path, student: str, lab: str, notebook: str) -> Path | None:
    """The notebook the student submitted: ``submitted/<student>/<lab>/<notebook>.ipynb``, else (a renamed notebook)
    the one ``course grade`` grades. Always the course's ``submitted/``, as ``course grade``'s staging reads it: the
    staged copy that nbgrader is given there holds no outputs."""
    folder = root / "submitted" / student / lab
    named = folder / f"{notebook}.ipynb"
    if named.is_file() or notebook != lab:
        return named if named.is_file() else None
    return choose_notebook(folder, lab)[0] if folder.is_dir() else None


def submitted_runs(path: Path) -> dict[str, deque]:
    """The outputs of each code cell of a submitted notebook, by code (``_code_key``), in notebook order. Read as
    plain JSON and leniently: what is not a list of output dicts counts as no output."""
    raw = json.loads(path.read_bytes().decode("utf-8-sig"))
    runs: dict[str, deque] = defaultdict(deque)
    for cell in (raw.get("cells") if isinstance(raw, dict) else None) or []:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            outputs = cell.get("outputs") if isinstance(cell.get("outputs"), list) else []
            runs[_code_key(cell.get("source", ""))].append([out for out in outputs if isinstance(out, dict)])
    return runs


def _note(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text + "\n"}


def _as_shown(out) -> dict:
    """One submitted output, sanitized; a result becomes a display (nbgrader reads a test cell's result as its score,
    and a copy must never look like one). The file was never validated: an output that is no valid output (a stream
    whose text is a list of numbers, say) becomes a note instead of stopping grading."""
    try:
        clean = sanitize_output(out)
    except Exception:  # noqa: BLE001 - any malformed output; sanitize_output expects nbformat's schema
        return _note("[an output of the submitted notebook that is not a valid output was left out]")
    if clean["output_type"] == "execute_result":
        clean = {"output_type": "display_data", "data": clean["data"], "metadata": clean["metadata"]}
    return clean


def within_cap(outputs: list[dict], cap: int) -> tuple[list[dict], int]:
    """The leading ``outputs`` whose JSON fits in ``cap`` bytes, then a note of what was left out; and the bytes
    kept."""
    kept, used = [], 0
    for index, out in enumerate(outputs):
        size = len(json.dumps(out))
        if used + size > cap:
            left = sum(len(json.dumps(rest)) for rest in outputs[index:])
            kept.append(_note(f"[{left / 1024:.0f} KiB of the student's outputs not shown: over the size kept per cell "
                              "and per notebook (c.KeepStudentRun.max_cell_bytes, max_notebook_bytes)]"))
            break
        kept.append(out)
        used += size
    return kept, used


def run_label(text: str, colour: str) -> dict:
    """A label output that heads one group of a cell's outputs (sanitized like any output: a styled ``div``)."""
    style = f"border-top: 2px solid {colour}; padding-left: 4px; font-weight: bold"
    html = f'<div style="{style}">{escape(text, quote=False)}</div>'
    return {"output_type": "display_data", "data": {"text/html": html, "text/plain": f"--- {text} ---"},
            "metadata": {}}


def labelled_outputs(grader: list, student: list) -> list[dict]:
    """A cell's outputs: the grader's re-run, then the student's run, each under its label (saying when it is empty)."""
    return ([run_label(GRADER_RUN + ("" if grader else ": no output"), "#777777"), *grader,
             run_label(STUDENT_RUN + ("" if student else ": the submitted notebook shows no output here"), "#31708f"),
             *student])


class KeepStudentRun(NbGraderPreprocessor):
    """Show the student's own outputs beside the grader's re-run (module docstring). It never fails grading: a
    submission that cannot be read is graded as it is, without them, and the reason is logged."""

    max_cell_bytes = Int(1 << 20, help="Most bytes of one cell's submitted outputs kept (JSON).").tag(config=True)
    max_notebook_bytes = Int(8 << 20, help="Most bytes of submitted outputs kept per notebook (JSON).").tag(config=True)

    def _runs(self, info) -> dict[str, deque]:
        """The student's run of the submission nbgrader is grading (``info``: ``resources["nbgrader"]``); empty, with
        the reason logged, when there is none to read."""
        root = Path(self.config.get("CourseDirectory", {}).get("root") or Path.cwd())
        try:
            path = submitted_notebook(root, info["student"], info["assignment"], info["notebook"])
            if path is not None and path.stat().st_size <= MAX_SUBMITTED_FILE_BYTES:
                return submitted_runs(path)
            reason = "no submitted notebook" if path is None else f"{path} is over {MAX_SUBMITTED_FILE_BYTES >> 20} MiB"
        except (OSError, ValueError, RecursionError) as exc:  # unreadable, not UTF-8, not JSON, nested too deep
            reason = str(exc)
        self.log.warning("The student's run is not shown: %s", reason)
        return {}

    def preprocess(self, nb, resources):
        runs = self._runs(resources["nbgrader"])
        if not runs:
            return nb, resources
        budget = self.max_notebook_bytes
        for cell in nb.cells:
            if cell.cell_type != "code" or is_autograded_test(cell):
                continue
            queue = runs.get(_code_key(cell.source))
            submitted = queue.popleft() if queue else []
            if not submitted and not is_manually_graded(cell):
                continue  # nothing to show beside an ordinary cell; a plot question says it has no plot
            kept, used = within_cap([_as_shown(out) for out in submitted], min(self.max_cell_bytes, budget))
            budget -= used
            cell.outputs = [from_dict(out) for out in labelled_outputs(list(cell.get("outputs", [])), kept)]
        return nb, resources


# ---- mark schemes ----------------------------------------------------------------------------------------------


def mark_schemes(source_nb) -> dict[str, str]:
    """Grade id -> the mark scheme of each cell of an instructor notebook that has one, as Markdown (a code cell's
    scheme is written as comments: their ``#`` goes)."""
    schemes = {}
    for cell in source_nb.cells:
        text = cell.source
        if cell.cell_type == "code":  # its delimiters are comments too: "# === BEGIN MARK SCHEME ==="
            text = "\n".join(re.sub(r"^\s*# ?", "", line) for line in text.splitlines())
        lines = region_lines(text, MARK_SCHEME_BEGIN, MARK_SCHEME_END)
        if (gid := grade_id(cell)) and "".join(lines).strip():
            schemes[gid] = "\n".join(lines).strip("\n")
    return schemes


def mark_scheme_cell(nb, gid: str, scheme: str):
    """The Markdown cell that shows the TA ``scheme`` after the cell ``gid``: a quote, set off from the answers."""
    heading = (f"**Mark scheme of `{gid}`** (the instructor's, from `source/`; shown where the TA grades, never in "
               "feedback)")
    source = "\n".join(f"> {line}".rstrip() for line in [heading, "", *scheme.splitlines()])
    return _new_cell(nb, "markdown", source, {COURSE_METADATA: {MARK_SCHEME_KEY: gid}})


def is_mark_scheme_cell(cell) -> bool:
    meta = cell.get("metadata", {}).get(COURSE_METADATA)
    return isinstance(meta, dict) and MARK_SCHEME_KEY in meta


class ShowMarkSchemes(NbGraderPreprocessor):
    """Put the mark scheme of each manually graded cell after it (module docstring). A submitted cell that carries
    the mark-scheme metadata loses it first: only this step makes scheme cells."""

    def preprocess(self, nb, resources):
        for cell in filter(is_mark_scheme_cell, nb.cells):
            cell.metadata[COURSE_METADATA].pop(MARK_SCHEME_KEY)
        source = read_course_source(self.config, resources["nbgrader"], self.log, "Mark schemes not shown")
        schemes = mark_schemes(source) if source is not None else {}
        cells = []
        for cell in nb.cells:
            cells.append(cell)
            if is_manually_graded(cell) and grade_id(cell) in schemes:
                cells.append(mark_scheme_cell(nb, grade_id(cell), schemes[grade_id(cell)]))
        nb.cells = cells
        return nb, resources


class StripMarkSchemes(NbGraderPreprocessor):
    """Remove the mark-scheme cells ``ShowMarkSchemes`` added: feedback never shows a mark scheme."""

    def preprocess(self, nb, resources):
        nb.cells = [cell for cell in nb.cells if not is_mark_scheme_cell(cell)]
        return nb, resources
