"""``GuardedExecute``: nbgrader's Execute with the grading boundary and guard, recovery from a lost kernel, output
caps and a notebook time limit (docs/SECURITY.md). It decides what runs where, cell by cell; ``KernelChannel``,
``GuardClient``, ``BoundaryClient``, ``OutputBudget`` and ``GradingResult`` (``grading_result.json``) do the rest.

- Test cells never run in the kernel: ``course/grader/boundary.py`` runs them here and writes their outputs; nothing the
  kernel reports decides a score.
- Around every test cell and before every locked cell, the guard undoes what student code changed (charged to the
  next test cell); what a locked cell itself changes becomes the reference (``adopt``), and so does what the course's
  imports of the locked cells' modules change (``IMPORT_AHEAD``, in every kernel after the locked setup cells).
- A dead or mute kernel fails its cell; a fresh kernel runs the earlier cells (not the tests) again. Execution stops
  at the notebook time limit or after a sticky CUDA error. A kernel lost before any student code ran, or output
  that did not arrive, asks ``course.cli.grade`` to grade again.
"""
from __future__ import annotations

import contextlib
import os
import time

from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Callable, Enum, Float, Integer, Unicode

from ..common.grading_result import GradingResult
from ..common.notebooks import is_autograded_test
from . import boundary
from .boundary_client import BoundaryClient
from .guard_client import GuardClient
from .kernel_channel import DIED, KERNEL_REPLY_TIMEOUT_S, CappedKernelClient, KernelChannel
from .nbgrader_ext import (
    NEUTRALISED_KEY,
    RECORDS_CALLS,
    course_source_folder,
    error_output,
    is_setup_cell,
    neutralise_cell_metadata,
    partial_credit_output,
    sticky_cuda_error,
    where,
)
from .output_budget import MIB, OutputBudget, shorten
from .sandbox import use_sandbox
from .scan import recording_bypass_flags

DEFAULT_NOTEBOOK_TIMEOUT_S = 600
# The modules of the lab's locked cells, imported in every kernel as a locked cell would (``_import_ahead``): after the
# locked setup cells, which may prepare what the imports need (Lab 2 sets TRITON_INTERPRET before importing triton),
# before the next cell; in a run started ahead, while it waits for its turn, so that no locked cell loads them on
# the clock.
IMPORT_AHEAD = (
    "import contextlib as _c, importlib as _i\n"
    "for _m in {modules!r}:\n"
    "    with _c.suppress(BaseException):\n"
    "        _i.import_module(_m)\n"
    "del _c, _i, _m\n"
)
MAX_KERNEL_RESTARTS = 3  # a kernel that dies or stops answering is replaced (earlier cells run again) this often
SCALE_ENV = "EFFICIENT_AI_SCALE"  # utils.py's sizes, set to GuardedExecute.scale while a notebook is graded
# Fixed limits, not settings: no lab needs other values (docs/SECURITY.md, "Output is capped while it arrives").
MAX_ERROR_BYTES = 64 * 1024  # an error output (message and traceback) is shortened to this size


class GuardedExecute(Execute):
    """nbgrader's Execute with the grading boundary and guard (see this module's docstring)."""

    max_cell_output_bytes = Integer(
        1 * MIB, help="Output one cell may keep (bytes); the rest is dropped with a note. Errors are always kept."
    ).tag(config=True)
    max_notebook_output_bytes = Integer(
        16 * MIB, help="Output the whole notebook may keep (bytes); later output is dropped with a note."
    ).tag(config=True)
    notebook_timeout_s = Float(
        DEFAULT_NOTEBOOK_TIMEOUT_S,
        help="Time limit of the whole notebook (seconds): later cells do not run, the points earned so far are kept.",
    ).tag(config=True)
    guard = Bool(
        True, help="Install the grading guard (course/kernel/guard_kernel.py) in every kernel. Turn it off only to rule it out "
                   "when a reference solution loses points.",
    ).tag(config=True)
    scale = Unicode(
        "quick", help="utils.py's scale (EFFICIENT_AI_SCALE) of the grader's tests and the kernel while grading.",
    ).tag(config=True)
    wait_for_turn = Callable(
        None, allow_none=True, help="Called once before the first cell that is not a locked setup cell; returns when "
        "grading may go on (course grade sets it for a submission started ahead of its turn: course.grader.nbgrader_child).",
    ).tag(config=True)
    # nbclient's option, another default: after the last cell nothing the kernel does can change a grade.
    shutdown_kernel = Enum(
        ["graceful", "immediate"], default_value="immediate",
        help="How the kernel ends after the last cell: 'immediate' kills it, 'graceful' asks it to shut down first.",
    ).tag(config=True)

    def __init__(self, max_error_bytes: int = MAX_ERROR_BYTES, **kwargs):
        """``max_error_bytes``: smaller only in tests."""
        super().__init__(**kwargs)
        self.max_error_bytes = max_error_bytes

    def preprocess(self, nb, resources=None, km=None):
        # The grading scale on every route, for the grader's tests and the kernel (started with this environment).
        scale = os.environ.get(SCALE_ENV)
        os.environ[SCALE_ENV] = self.scale
        self._start_run(nb, resources)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if scale is None:
                os.environ.pop(SCALE_ENV, None)
            else:
                os.environ[SCALE_ENV] = scale
            self._record.output_dropped_bytes = {where(self.nb.cells[i], i): size
                                                 for i, size in self._budget.dropped.items()}
            self._record.guard = self._guard.broken if self._guard else ""
            self._record.write(((resources or {}).get("metadata") or {}).get("path"))

    def _make_parts(self) -> None:
        """Fresh parts for one notebook's run."""
        self._record = GradingResult(output_caps_bytes=[self.max_cell_output_bytes, self.max_notebook_output_bytes])
        # The grader's own links to the current kernel (``_attach``, once its client is started).
        self._channel: KernelChannel | None = None
        self._guard: GuardClient | None = None
        self._boundary: BoundaryClient | None = None
        self._test_deadline = 0.0  # time.monotonic() at which the running test cell's requests are interrupted
        self._budget = OutputBudget(self.max_cell_output_bytes, self.max_notebook_output_bytes, self.max_error_bytes)
        self._pending: list[str] = []  # tampering undone before a locked cell, charged to the next test cell
        self._setup_ran = False  # a locked setup cell ran in the current kernel
        self._imported_ahead = False  # IMPORT_AHEAD ran in the current kernel
        self._replayable: list[int] = []  # code cells (not tests) that ran without losing the kernel
        self._deadline = time.monotonic() + self.notebook_timeout_s

    def _start_run(self, nb, resources) -> None:
        """What one notebook's run needs before its first cell."""
        self._make_parts()
        lab = ((resources or {}).get("nbgrader") or {}).get("assignment")
        folder = course_source_folder(self.config, lab) if lab else None  # the grader imports utils from there
        self._grader = boundary.GraderSide(folder if folder and folder.is_dir() else None,  # runs the test cells
                                           boundary.KernelLink(self._ask_kernel), boundary.names_tests_read(nb))
        self._recording_bypass = recording_bypass_flags(nb)
        self._course_modules = boundary.locked_cell_imports(self._grader.folder)  # what IMPORT_AHEAD imports
        earlier = nb.metadata.pop(NEUTRALISED_KEY, None)  # found by NeutraliseCellMetadata in the sanitize step
        if isinstance(earlier, dict):
            self._record.neutralised.update({str(k): [str(x) for x in v] for k, v in earlier.items()
                                             if isinstance(v, list)})
        for index, cell in enumerate(nb.cells):
            if removed := neutralise_cell_metadata(cell, self.skip_cells_with_tag):
                self._record.neutralised[where(cell, index)] = removed

    def create_kernel_manager(self):
        """nbclient's kernel manager, whose kernels are grading kernels (``course.grader.sandbox.use_sandbox``) and whose
        clients drop any message over ``MAX_MESSAGE_BYTES`` unread (``CappedKernelClient``)."""
        km = super().create_kernel_manager()
        use_sandbox(km)
        km.client_factory = CappedKernelClient
        return km

    async def async_start_new_kernel_client(self):
        """nbclient's kernel client; the grader's own links then go to its kernel (``_attach``)."""
        client = await super().async_start_new_kernel_client()
        self._attach()
        return client

    start_new_kernel_client = run_sync(async_start_new_kernel_client)  # nbclient binds the sync name to its own

    def _attach(self) -> None:
        """Links of the grader's own to the kernel of ``self.kc``, which has neither the guard nor the boundary's
        server yet, nor the course's imports; a guard student code broke stays broken for the notebook."""
        self._channel = KernelChannel(self.kc, self.km)
        self._guard = GuardClient(self._channel, self.guard, self._guard.broken if self._guard else "")
        self._boundary = BoundaryClient(self._channel)
        self._setup_ran = self._imported_ahead = False

    def _ask_kernel(self, payload: str) -> str | None:
        """A request of the grading boundary to the current kernel (``boundary.KernelLink``); its answer, or None."""
        return self._boundary.ask(payload, self._test_deadline)

    def _install_kernel_side(self) -> None:
        """The grading guard and the boundary's server, in a kernel that has neither yet."""
        timeout_s = max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0)  # installing imports torch: as long as a cell
        if self._guard.needs_install():
            self._guard.install(boundary.lab_uses_guard_libraries(self._grader.folder), timeout_s)
        if not self._boundary.ready and not self._channel.lost:
            self._boundary.install(timeout_s)

    # -- cells --------------------------------------------------------------------------------------------------
    def preprocess_cell(self, cell, resources, index):
        if not self._record.stopped and not self._channel.lost:
            self._install_kernel_side()
        is_test = is_autograded_test(cell)
        if self._record.stopped:
            if is_test:
                cell.outputs = [error_output("NotRun", self._record.stopped)]
            return cell, self.resources
        if cell.cell_type != "code":
            return cell, self.resources
        is_setup = is_setup_cell(cell)
        if not is_setup:
            self._before_student_code()
        here = where(cell, index)
        if is_test:
            self._grade_test_cell(cell, index, here)
        else:
            self._run_notebook_cell(cell, index, here, is_setup)
        if cuda_error := sticky_cuda_error(cell):
            self._record.cuda_error = f"{cuda_error} in {here}"
            self._record.stopped = (f"a CUDA error that leaves the GPU unusable ({cuda_error}) in {here}; "
                                    "cells after it were not run")
        elif time.monotonic() > self._deadline:
            self._record.stopped = (f"the notebook exceeded its time limit of {self.notebook_timeout_s:.0f} s "
                                    f"(GuardedExecute.notebook_timeout_s) after {here}; cells after it were not run")
        return cell, self.resources

    def _before_student_code(self) -> None:
        """Before a cell that is not a locked setup cell: the course's imports (``_import_ahead``); in a run started
        ahead (``wait_for_turn``), before its first such cell, wait for the turn, and count the notebook's time limit
        from there."""
        self._import_ahead()
        if self.wait_for_turn is not None:
            wait, self.wait_for_turn = self.wait_for_turn, None
            self._grader.take_pending()
            wait()
            self._deadline = time.monotonic() + self.notebook_timeout_s

    def _import_ahead(self) -> None:
        """``IMPORT_AHEAD``, once per kernel, as a locked cell: before the first cell that is not a locked setup cell
        after one that is, the same point on every route and in a fresh kernel's replay. A student cell placed
        before the setup cells (an empty one, the course's fetch cell) runs before it, so the guard first undoes what
        student code changed (charged to the next test cell), then adopts what the imports change (importing torch
        imports ``torch.package``, which replaces ``inspect.getfile``): that is never the student's doing."""
        if self._imported_ahead or not self._setup_ran or self._channel.lost:
            return
        self._imported_ahead = True
        if self._course_modules:
            self._before_locked_cell()
            self._channel.request(IMPORT_AHEAD.format(modules=self._course_modules),
                                  timeout_s=max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0))
            self._guard.command("adopt")

    def _run_notebook_cell(self, cell, index: int, here: str, is_setup: bool) -> None:
        """Run a cell that is not a test in the kernel (student code, or a locked instructor cell)."""
        if is_setup:
            self._before_locked_cell()
            self._grader.run_locked_cell(cell.source, cell.metadata.get("tags"))
            self._setup_ran = True
        elif cell.source.strip():
            self._record.student_code_ran = True
        try:
            self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._channel.lose(DIED)
            cell.outputs.append(error_output("DeadKernelError", f"the kernel died in {here}"))
            self._recover(f"in {here}")
            return
        except CellTimeoutError:
            self._output_did_not_arrive(cell, here)
        if is_setup:
            self._guard.command("adopt")
        else:
            # Student code can leave the kernel mute (replacing builtins.type does): find out now, not at every cell.
            self._channel.request("")
        if self._channel.lost:
            self._recover(f"after {here}")
        else:
            self._replayable.append(index)

    def _before_locked_cell(self) -> None:
        """Undo student changes (charged to the next test cell): what the locked cell changes is then its own."""
        self._pending += self._guard.command("restore")
        self._guard.command("mark")

    def _grade_test_cell(self, cell, index: int, here: str) -> None:
        """Run a test cell in the grader (course/grader/boundary.py); its outputs are the grader's, never the kernel's."""
        gid = cell.metadata.get("nbgrader", {}).get("grade_id") or str(index)
        found, self._pending = self._pending + self._guard.command("restore"), []
        cell.outputs, cell.execution_count = [], None
        if self._channel.lost:
            self._recover(f"before {here}")
        if self._record.stopped:
            cell.outputs = [error_output("NotRun", self._record.stopped)]
            return
        self._test_deadline = time.monotonic() + (self.timeout or KERNEL_REPLY_TIMEOUT_S)
        printed, error, share = self._run_test(cell.source, gid)
        if printed:
            cell.outputs.append(NotebookNode(output_type="stream", name="stdout",
                                             text=shorten(printed, self.max_cell_output_bytes)))
        if error:
            cell.outputs.append(error_output(error[0], shorten(error[1], self.max_error_bytes)))
        if self._channel.lost:
            self._recover(f"in {here}")
        else:
            found += self._guard.command("restore")
        if self._recording_bypass and RECORDS_CALLS in cell.source:
            found += [f"code that can switch off the recording of torch calls ({flag})"
                      for flag in self._recording_bypass[:3]]
        if not error and not found and share < 1.0:  # tampering found: no partial credit, the cell scores zero
            cell.outputs.append(partial_credit_output(cell, share, self._grader.last_failures))
        if found:
            found = sorted(set(found))
            self._record.integrity[gid] = found
            cell.outputs.append(error_output(
                "GradingIntegrityError",
                "this test does not count: student code changed what the tests rely on (" + "; ".join(found) +
                "). The change was undone for the cells after this one."))

    def _run_test(self, source: str, gid: str) -> tuple[str, tuple[str, str] | None, float]:
        """What the test cell printed, its error, and the share of its checks that passed."""
        try:
            return self._grader.run_test_cell(source, gid)
        except boundary.KernelLost:
            lost = self._channel.lost
            if not lost:  # the kernel answered, but not with its boundary server's answer
                return "", ("BoundaryError", "the kernel sent no answer to a request of this test: student code "
                            "replaced or broke the grading boundary's server in the kernel"), 0.0
            return "", ("DeadKernelError" if lost.died else "TimeoutError",
                        f"the kernel {lost} while this test cell was running; the grader started a fresh kernel "
                        "for the cells after it"), 0.0

    # -- a lost kernel: a fresh one, and the cells before ----------------------------------------------------------
    def _recover(self, when: str) -> None:
        """A fresh kernel runs the earlier cells (not the tests) again; gives up after ``MAX_KERNEL_RESTARTS``, past
        the notebook's time limit, or when the earlier cells lose it too."""
        if len(self._record.kernel_restarts) >= MAX_KERNEL_RESTARTS or time.monotonic() > self._deadline:
            self._stop_lost_kernel(when)
            return
        self._record.kernel_restarts.append(f"the kernel {self._channel.lost} {when}")
        try:
            run_sync(self._async_fresh_kernel)()
        except Exception as exc:  # noqa: BLE001 - a kernel that cannot start again stops grading here
            self._stop_lost_kernel(f"{when} (a fresh kernel could not start: {type(exc).__name__})")
            return
        self._install_kernel_side()  # the fresh kernel's links are new (``_attach``)
        for earlier in list(self._replayable):
            cell = self.nb.cells[earlier]
            is_setup = is_setup_cell(cell)
            if is_setup:
                self._before_locked_cell()
                self._setup_ran = True
            else:
                self._import_ahead()  # where the first run imported them
            self._channel.request(cell.source, timeout_s=max(KERNEL_REPLY_TIMEOUT_S, self.timeout or 0))
            if is_setup:
                self._guard.command("adopt")
            if self._channel.lost:
                self._stop_lost_kernel(f"while the earlier cells ran again in a fresh kernel, {when}")
                return

    async def _async_fresh_kernel(self) -> None:
        with contextlib.suppress(Exception):  # the channels of a dead kernel may be closed already
            self.kc.stop_channels()
        await ensure_async(self.km.restart_kernel(now=True))
        await self.async_start_new_kernel_client()

    def _stop_lost_kernel(self, when: str) -> None:
        """Stop execution after the kernel died or went mute, worded by what was observed."""
        lost, record = self._channel.lost, self._record
        if not record.student_code_ran:
            cause = ("before any student code ran, so not because of the submission (a machine too busy or short of "
                     "memory, or a kernel that failed to start)")
            record.retry = record.retry or f"the kernel {lost} {when}, before any student code ran"
        elif lost.died:
            cause = "(os._exit, a segfault or the out-of-memory killer)"
        else:
            cause = ("after student code ran: student code can break it (replacing builtins.type does), and so can a "
                     "machine too busy to answer")
            record.retry = record.retry or f"the kernel {lost} {when}"
        record.stopped = f"the kernel {lost} {when} {cause}; cells after it were not run"

    def _output_did_not_arrive(self, cell, here: str) -> None:
        """nbclient's ``CellTimeoutError``: the cell fails, and the channels are reconnected in case ZeroMQ dropped an
        oversized message."""
        reason = (f"the output of {here} had not finished arriving {self.iopub_timeout} s after the kernel's reply "
                  "(nbclient's CellTimeoutError); it counts as failed")
        self._record.output_missed.append(reason)
        self._record.retry = self._record.retry or reason
        cell.outputs.append(error_output("CellTimeoutError", reason))
        self._channel.reconnect()
        self.kc = self._channel.client  # nbclient runs the next cells on the fresh client

    # -- output: nbclient's hooks, through the budget ---------------------------------------------------------------
    def output(self, outs, msg, display_id, cell_index):
        """Keep an output while the cell's and the notebook's budgets last (nbclient's ``output`` otherwise)."""
        keep, dropped = self._budget.admit(msg, cell_index)
        out = super().output(outs, msg, display_id, cell_index) if keep else None
        if dropped:
            self._budget.drop(outs, cell_index, dropped)
        return out

    def on_cell_executed(self, **kwargs):
        reply = kwargs.get("execute_reply") or {}
        if isinstance(reply.get("content"), dict) and reply["content"].get("status") == "error":
            self._budget.shorten_error(reply["content"])
        return super().on_cell_executed(**kwargs)

    def process_message(self, msg, cell, cell_index):
        """nbclient's, except that a display update too large to keep is dropped (the output it would replace stays):
        without its display id, nbclient neither replaces earlier outputs with it nor keeps it beyond the budget."""
        content = msg.get("content") or {}
        transient = content.get("transient")
        if transient and transient.get("display_id") and not self._budget.fits_update(msg):
            if msg.get("msg_type") == "update_display_data":
                return None
            content["transient"] = {key: value for key, value in transient.items() if key != "display_id"}
        return super().process_message(msg, cell, cell_index)

    def handle_comm_msg(self, outs, msg, cell_index):
        """Ignore widget (comm) messages: an output widget could capture a test cell's error."""
        return None
