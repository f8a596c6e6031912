"""nbgrader preprocessors of our own, named in ``nbgrader_config.py``."""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from pathlib import Path

from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from nbgrader.utils import is_grade, is_locked, is_solution

from .notebooks import HIDDEN_BEGIN, HIDDEN_END

GUARD_SOURCE = Path(__file__).with_name("guard_kernel.py")
GRADING_REPORT = "grading_report.json"  # written beside each autograded notebook
DEFAULT_NOTEBOOK_TIMEOUT_S = 600
# How long the grader waits for the kernel to answer one of its own requests (a guard command, or the empty
# request sent after every cell); a healthy kernel answers in milliseconds.
KERNEL_REPLY_TIMEOUT_S = 60


def _is_test_cell(cell) -> bool:
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


class DropTestResults(NbGraderPreprocessor):
    """Remove ``execute_result`` outputs from autograded test cells before nbgrader scores them.

    nbgrader reads a number shown as a test cell's result as partial credit, and stops at the first such
    output, even when an assertion error follows it. Our test cells never end in an expression (``check``
    enforces it), so any result there was put there by student code (``get_ipython().displayhook(5)``).
    Without it the cell scores on its errors alone.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if _is_test_cell(cell):
            cell.outputs = [out for out in cell.get("outputs", []) if out.get("output_type") != "execute_result"]
        return cell, resources


def hidden_test_lines(source: str) -> list[str]:
    """The lines between the hidden-test markers of a cell's source."""
    lines, inside = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == HIDDEN_BEGIN:
            inside = True
        elif stripped == HIDDEN_END:
            inside = False
        elif inside:
            lines.append(line)
    return lines


def _squeeze(text: str) -> str:
    """``text`` without ANSI colour codes and whitespace (how hidden-test lines are matched in outputs)."""
    return re.sub(r"\s+", "", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text))


class StripHiddenTests(NbGraderPreprocessor):
    """Keep hidden tests out of feedback HTML: their source, and any output that quotes them.

    - A hidden test region becomes a one-line note.
    - A test cell keeps only its error's name and message (our assertion messages, written for students),
      shortened to ``max_message_chars``; its printed output and traceback are dropped.
    - In every cell, any output line that quotes a line of hidden test source (compared without whitespace,
      for source lines of at least ``min_quoted_chars`` characters) is replaced by a note, so student code that
      copied hidden test text during grading cannot print it into the feedback later.

    Instructors who want tests shown set ``c.StripHiddenTests.enabled = False``.
    """

    max_message_chars = 500
    min_quoted_chars = 12

    def preprocess(self, nb, resources):
        hidden = {_squeeze(line) for cell in nb.cells if _is_test_cell(cell) for line in hidden_test_lines(cell.source)}
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
        if not _is_test_cell(cell):
            for out in cell.get("outputs", []):
                self._redact_output(out)
            return cell, resources
        if HIDDEN_BEGIN in cell.source:
            kept, inside = [], False
            for line in cell.source.splitlines():
                stripped = line.strip()
                if stripped == HIDDEN_BEGIN:
                    inside = True
                    indent = line[: len(line) - len(line.lstrip())]
                    kept.append(f"{indent}# (hidden tests ran here; their source is not shown in feedback)")
                elif stripped == HIDDEN_END:
                    inside = False
                elif not inside:
                    kept.append(line)
            cell.source = "\n".join(kept)
        outputs = []
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


class GuardedExecute(Execute):
    """nbgrader's Execute, with the grading guard, partial credit after a dead kernel, and a notebook time limit.

    - Before any notebook cell, the guard (``course/guard_kernel.py``) is installed in the fresh kernel. Around
      every autograded test cell the grader asks it, through ``user_expressions`` (no input transformers, no
      hooks), whether student code replaced anything the tests rely on; answers are signed with a key only the
      grader holds. Anything replaced is put back and the test cell gets a ``GradingIntegrityError``: it scores
      zero, and the cells after it are graded on an honest environment. Changes are also undone before every
      locked (instructor) cell and charged to the next test cell; what a locked cell itself changes (a library it
      imports registering an IPython hook, as trio does) becomes the reference. A guard that no longer answers
      correctly fails every later test cell (fail closed).
    - Test cells run outside IPython's history, and their source is dropped from ``linecache`` afterwards, so
      later student cells cannot read hidden tests back from ``In``, ``_ih`` or ``linecache``.
    - A dead kernel (``os._exit``, a segfault, the out-of-memory killer) or the notebook time limit
      (``EFFICIENT_AI_NOTEBOOK_TIMEOUT_S``, default 600 s) stops execution; the cells already run keep their
      results, every later test cell gets an error saying why it did not run, and nbgrader scores the notebook.
    - A sticky CUDA error (a device-side assert, an illegal memory access) leaves the GPU unusable for the rest of
      the process, so execution stops there the same way and the report names it (``cuda_error``);
      ``course.grade`` then grades the submission again without the GPU, as a CPU grader would.

    What happened is written to ``grading_report.json`` beside the autograded notebook. ``EFFICIENT_AI_GUARD=off``
    turns the guard off (to compare, or to rule it out when a reference solution loses points).
    """

    def preprocess(self, nb, resources=None, km=None):
        self._guard_key: bytes | None = None
        self._guard_broken = ""
        self._stopped = ""
        self._cuda_error = ""
        self._kernel_lost = ""  # "died" or "stopped answering ...", found by a request of the grader's own
        self._integrity: dict[str, list[str]] = {}
        self._pending: list[str] = []  # tampering undone before a locked cell, charged to the next test cell
        self._guard_on = os.environ.get("EFFICIENT_AI_GUARD", "on") != "off"
        timeout_s = float(os.environ.get("EFFICIENT_AI_NOTEBOOK_TIMEOUT_S", DEFAULT_NOTEBOOK_TIMEOUT_S))
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._write_report(resources)

    # -- the guard protocol -------------------------------------------------------------------------------------
    async def _async_request(self, code: str, expression: str | None) -> dict | None:
        from queue import Empty

        from nbclient.exceptions import DeadKernelError
        from nbclient.util import ensure_async

        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False,
                                 user_expressions={"guard": expression} if expression else None)
        deadline = time.monotonic() + KERNEL_REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=1))
            except Empty:
                if not await ensure_async(self.kc.is_alive()):
                    raise DeadKernelError("Kernel died") from None
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg
        return None

    def _request(self, code: str, expression: str | None = None) -> dict | None:
        """Send the kernel a silent request; its reply, or None (and ``_kernel_lost`` set) when none came."""
        from nbclient.exceptions import DeadKernelError
        from nbclient.util import run_sync

        if self._kernel_lost:
            return None
        try:
            reply = run_sync(self._async_request)(code, expression)
        except DeadKernelError:
            self._kernel_lost = "died"
            return None
        if reply is None:
            self._kernel_lost = f"stopped answering (no reply in {KERNEL_REPLY_TIMEOUT_S} s)"
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
            "import builtins as _b\n"
            "_g = {'__builtins__': dict(vars(_b)), '__name__': '_efficient_ai_guard'}\n"
            f"exec(compile({GUARD_SOURCE.read_text()!r}, '<grading guard>', 'exec'), _g)\n"
            "_efficient_ai_guard = _g['_efficient_ai_guard_install']()\n"
            "del _b, _g\n"
        )
        reply = self._request(source)
        if not reply or reply["content"].get("status") != "ok":
            self._guard_broken = "the grading guard could not be installed in the kernel"
            return
        key = self._guard_value(self._request("", "_efficient_ai_guard('key')"))
        if not key:
            self._guard_broken = "the grading guard could not be installed in the kernel"
            return
        self._guard_key = bytes.fromhex(key)

    def _guard(self, command: str) -> list[str] | None:
        """Run a guard command; its findings (a list), or None when its answer cannot be trusted."""
        if not self._guard_on:
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
        if self._guard_key is None and not self._guard_broken and not self._stopped and self._guard_on:
            self._install_guard()
        is_test = _is_test_cell(cell)
        is_setup = cell.cell_type == "code" and is_locked(cell) and not is_grade(cell) and not is_solution(cell)
        if self._stopped:
            if is_test:
                cell.outputs = [_error_output("NotRun", self._stopped)]
            return cell, self.resources
        if cell.cell_type != "code":
            return cell, self.resources
        found: list[str] = []
        if is_test:
            found += self._pending + self._findings_or_broken("restore")
            self._pending = []
        elif is_setup:
            # Student changes are undone before a locked cell (and charged to the next test cell), so that what
            # the locked cell changes can be adopted as the instructor's own.
            self._pending += self._findings_or_broken("restore")
            self._guard("mark")
        from nbclient.exceptions import DeadKernelError

        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        where = f"cell {index}" + (f" ({gid})" if gid else " (a cell without a grade id)")
        if self._kernel_lost:
            self._stop_lost_kernel(f"before {where}")
            if is_test:
                cell.outputs = [_error_output("NotRun", self._stopped)]
            return cell, self.resources
        try:
            cell = self.execute_cell(cell, index, store_history=not is_test)
        except DeadKernelError:
            self._kernel_lost = "died"
            self._stop_lost_kernel(f"in {where}")
            cell.outputs.append(_error_output("DeadKernelError", self._stopped))
            return cell, self.resources
        if is_test:
            found += self._findings_or_broken("restore")
            self._guard("forget")
        elif is_setup:
            self._guard("adopt")
        else:
            # Student code can leave the kernel unable to answer (replacing builtins.type breaks ipykernel's
            # message handler): ask now, so a kernel in that state costs one wait, not one per remaining cell.
            self._request("")
        if self._kernel_lost:
            self._stop_lost_kernel(f"after {where}")
            if is_test and not found:
                found = ["the kernel stopped answering after this test cell"]
        if found:
            found = sorted(set(found))
            self._integrity[gid or str(index)] = found
            cell.outputs.append(_error_output(
                "GradingIntegrityError",
                "this test does not count: student code changed what the tests rely on (" + "; ".join(found) +
                "). The change was undone for the cells after this one."))
        cuda_error = sticky_cuda_error(cell)
        if cuda_error:
            self._cuda_error = f"{cuda_error} in {where}"
            self._stopped = (f"a CUDA error that leaves the GPU unusable ({cuda_error}) in {where}; "
                             "cells after it were not run")
        elif time.monotonic() > self._deadline:
            self._stopped = (f"the notebook exceeded its time limit of {self._timeout_s:.0f} s "
                             f"(EFFICIENT_AI_NOTEBOOK_TIMEOUT_S) after {where}; cells after it were not run")
        return cell, self.resources

    def _stop_lost_kernel(self, when: str) -> None:
        if self._kernel_lost == "died":
            self._stopped = (f"the kernel died {when} (os._exit, a segfault or the out-of-memory killer); "
                             "cells after it were not run")
        else:
            self._stopped = (f"the kernel {self._kernel_lost} {when}: student code broke it (replacing "
                             "builtins.type does, for one); cells after it were not run")

    def _findings_or_broken(self, command: str) -> list[str]:
        findings = self._guard(command)
        return [self._guard_broken] if findings is None else findings

    def _write_report(self, resources) -> None:
        folder = ((resources or {}).get("metadata") or {}).get("path")
        if not folder:
            return
        report = {"stopped": self._stopped, "guard": self._guard_broken, "integrity": self._integrity,
                  "cuda_error": self._cuda_error}
        try:
            (Path(folder) / GRADING_REPORT).write_text(json.dumps(report, indent=1))
        except OSError:
            pass
