"""Grading limits without nbgrader: execution-affecting metadata, output caps, failure reasons, busy-machine
wording and retries, and control characters in what a TA reads (tests/test_grading_routes.py grades for real)."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from fixture_lab import REPO, processes_working_in, wait_until_no_process_works_in

from course.cli import grade, report  # noqa: E402
from course.cli.nbgrader_run import GradingRun  # noqa: E402
from course.common.grading_result import GradingResult  # noqa: E402
from course.common.job import GradingJob, WorkerSlot  # noqa: E402
from course.common.quoting import escape_controls  # noqa: E402
from course.common.scores import CellScore, SubmissionScores  # noqa: E402
from course.grader import nbgrader_child  # noqa: E402
from course.grader.guarded_execute import GuardedExecute  # noqa: E402
from course.grader.kernel_channel import DIED, KernelChannel, KernelLoss  # noqa: E402
from course.grader.nbgrader_ext import neutralise_cell_metadata  # noqa: E402
from course.grader.scan import scan_notebook  # noqa: E402

ESC_HIDE = "\x1b[8m"  # "conceal": a terminal shows nothing of what follows
MIB = 2**20


# ---------------------------------------------------------------------------------------------------------------
# Cell metadata that changes how a cell runs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tags, kept, removed", [
    (["skip-execution"], [], ["tag 'skip-execution'"]),
    (["raises-exception", "hide-input"], ["hide-input"], ["tag 'raises-exception'"]),
    (["hide-input"], ["hide-input"], []),
])
def test_execution_tags_are_removed_and_other_tags_kept(tags, kept, removed):
    cell = nbformat.v4.new_code_cell("assert False", metadata={"tags": list(tags)})
    assert neutralise_cell_metadata(cell, "skip-execution") == removed
    assert cell.metadata["tags"] == kept


def test_nbgrader_flags_without_a_grade_id_make_a_student_cell():
    fake_locked = nbformat.v4.new_code_cell("import math", metadata={"nbgrader": {"locked": True, "grade": False}})
    assert neutralise_cell_metadata(fake_locked, "skip-execution") == ["nbgrader metadata without a grade id"]
    assert "nbgrader" not in fake_locked.metadata, "a locked flag without a grade id must not make an instructor cell"
    real = nbformat.v4.new_code_cell("import math", metadata={"nbgrader": {"locked": True, "grade_id": "setup"}})
    assert neutralise_cell_metadata(real, "skip-execution") == [] and real.metadata["nbgrader"]["locked"]


# ---------------------------------------------------------------------------------------------------------------
# Output caps, applied as messages arrive
# ---------------------------------------------------------------------------------------------------------------
@pytest.fixture
def executor():
    ex = GuardedExecute(max_cell_output_bytes=1000, max_notebook_output_bytes=2500, max_error_bytes=4000)
    ex._make_parts()
    ex.clear_before_next_output = False  # set by nbclient when a cell starts
    return ex


def message(msg_type: str, **content) -> dict:
    return {"msg_type": msg_type, "header": {"msg_type": msg_type}, "parent_header": {"msg_id": "m"},
            "content": content, "metadata": {}}


def stream(text: str) -> dict:
    return message("stream", name="stdout", text=text)


def kept_text(outs) -> str:
    return "".join(out.get("text", "") for out in outs if out.output_type == "stream")


def test_a_cell_keeps_its_cap_and_a_note(executor):
    outs = []
    for _ in range(50):
        executor.output(outs, stream("x" * 300), None, 0)
    text = kept_text(outs)
    assert text.count("x") == 1000, "the cell keeps exactly its cap of output"
    assert "the grader dropped the rest of this cell's output" in text and text.count("grader dropped") == 1
    assert executor._budget.dropped[0] == 50 * 300 - 1000


def test_the_notebook_cap_holds_across_cells_and_errors_are_always_kept(executor):
    cells = [[] for _ in range(4)]
    for index, outs in enumerate(cells):
        executor.output(outs, stream("y" * 900), None, index)
        executor.output(outs, message("display_data", data={"text/plain": "z" * 900}, metadata={}), None, index)
    assert sum(kept_text(outs).count("y") for outs in cells) + sum(
        len(o.data["text/plain"]) for outs in cells for o in outs if o.output_type == "display_data") <= 2500
    huge = message("error", ename="AssertionError", evalue="e" * MIB, traceback=["line"] * 100_000)
    executor.output(cells[3], huge, None, 3)
    errors = [out for out in cells[3] if out.output_type == "error"]
    assert len(errors) == 1, "an error is kept even when the budget is spent: it decides the test's score"
    assert len(errors[0].evalue) < 2000 and sum(map(len, errors[0].traceback)) < 4000
    assert errors[0].traceback[0].startswith("[... ") and "dropped by the grader" in errors[0].traceback[0]


def test_widget_messages_never_capture_a_cells_outputs(executor):
    # (A test cell's error cannot be cleared by student code: test cells run in the grader, which writes their
    # outputs after the kernel has answered, course/grader/boundary.py.)
    outs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="wrong", traceback=[])]
    executor.handle_comm_msg(outs, message("comm_open", comm_id="c", target_name="jupyter.widget",
                                           data={"state": {"_model_name": "OutputModel", "msg_id": "m"}}), 0)
    assert not executor.output_hook_stack["m"], "an output widget must not capture a cell's outputs"


# ---------------------------------------------------------------------------------------------------------------
# Reasons a TA reads
# ---------------------------------------------------------------------------------------------------------------
def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """``exc`` as Python leaves it after ``raise exc from cause`` (its chain set)."""
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the exception under test
        return caught


def test_a_failure_reason_is_the_exception_s_whole_line():
    import sqlalchemy.exc

    error = sqlalchemy.exc.OperationalError("UPDATE grade SET auto_score=?", {}, Exception("disk I/O error"))
    reason, busy = nbgrader_child.failure_reason(error)
    assert reason.startswith("sqlalchemy.exc.OperationalError: (builtins.Exception) disk I/O error"), reason
    assert not busy, "a disk error is no busy machine's doing"


@pytest.mark.parametrize("exc, expected", [
    (RuntimeError("Kernel didn't respond in 60 seconds"), (nbgrader_child.KERNEL_SLOW, True)),
    (ValueError("v" * 2000), ("ValueError: " + "v" * (nbgrader_child.MAX_REASON_CHARS - 12) + " [...]", False)),
    (RuntimeError(f"hidden{ESC_HIDE}text"), ("RuntimeError: hidden\\x1b[8mtext", False)),
    (Exception("(sqlite3.OperationalError) database is locked"),
     ("Exception: (sqlite3.OperationalError) database is locked", True)),
])
def test_failure_reasons_name_the_cause_and_whether_to_grade_again(exc, expected):
    assert nbgrader_child.failure_reason(exc) == expected


def test_a_known_cause_is_found_along_the_exception_chain():
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from nbformat.reader import NotJSONError

    wrapped = raised(RuntimeError("nbconvert gave up"), DeadKernelError("Kernel died"))
    assert nbgrader_child.failure_reason(wrapped) == (nbgrader_child.KERNEL_DIED, False)
    assert nbgrader_child.failure_reason(NotJSONError("not JSON")) == (nbgrader_child.NOT_JSON, False)
    iopub = CellTimeoutError("Timeout waiting for IOPub output")
    assert nbgrader_child.failure_reason(iopub) == (nbgrader_child.CELL_TIMEOUT, True)


def test_a_failed_run_s_result_becomes_a_failed_outcome_that_a_busy_machine_retries(monkeypatch, tmp_path):
    results = [GradingResult(failure="the kernel did not start", retry="the kernel did not start"), GradingResult()]

    class Finished:
        def __init__(self, job):
            self.job = job

        def finish(self):
            return GradingRun(results.pop(0))

    monkeypatch.setattr(grade, "GradingProcess", Finished)
    outcome = grade.autograde_one(grade.grading_job(tmp_path, "lab0", "ada"))
    assert outcome.status == "ok" and not results
    assert outcome.notes == ["graded twice: the first run was not kept (the kernel did not start)"]


def test_a_result_file_round_trips_and_a_broken_one_reads_empty(tmp_path):
    result = GradingResult(stopped="the notebook exceeded its time limit", integrity={"q1_tests": ["builtins.type"]})
    result.write(tmp_path)
    assert GradingResult.read(tmp_path) == result
    (tmp_path / "grading_result.json").write_text('{"stopped": 3, "retry": "again"}')
    assert GradingResult.read(tmp_path) == GradingResult(retry="again"), "a field of the wrong kind keeps its default"


def test_a_grading_job_round_trips_through_json(tmp_path):
    job = grade.grading_job(tmp_path, "lab0", "ada", WorkerSlot("1", (2, 3), 1), tmp_path / "staged", 30.0, True)
    assert GradingJob.from_json(job.to_json()) == job
    assert job.config().Sandbox.cpus == [2, 3] and job.config().CourseDirectory.submitted_directory == str(
        tmp_path / "staged")
    with pytest.raises(ValueError):
        GradingJob.from_json('{"lab": "lab0"}')


MUTE = KernelLoss(died=False, detail="no reply in 60 s")


def lost_kernel_reason(student_code_ran: bool, loss: KernelLoss) -> tuple[str, str]:
    ex = GuardedExecute()
    ex._make_parts()
    ex._channel = KernelChannel(client=None, manager=None)
    ex._channel.lose(loss)
    ex._record.student_code_ran = student_code_ran
    ex._stop_lost_kernel("before cell 1 (setup_imports)")
    return ex._record.stopped, ex._record.retry


@pytest.mark.parametrize("loss", [MUTE, DIED], ids=["mute", "died"])
def test_a_kernel_lost_before_student_code_is_not_blamed_and_is_retried(loss):
    stopped, retry = lost_kernel_reason(False, loss)
    assert "before any student code ran, so not because of the submission" in stopped and "student code broke" not in stopped
    assert retry, "course.cli.grade must grade it again"


def test_a_mute_kernel_after_student_code_names_both_causes_and_is_retried():
    stopped, retry = lost_kernel_reason(True, MUTE)
    assert "the kernel stopped answering (no reply in 60 s)" in stopped
    assert "student code can break it" in stopped and "machine too busy" in stopped and retry
    stopped, retry = lost_kernel_reason(True, DIED)
    assert "the kernel died" in stopped and "os._exit, a segfault or the out-of-memory killer" in stopped and not retry


def test_a_run_a_busy_machine_explains_is_graded_once_more(monkeypatch):
    runs = [grade.Outcome("ada", "partial", "the kernel stopped answering", 5.0, retry="no reply in 60 s"),
            grade.Outcome("ada", "ok", "", 4.0)]
    monkeypatch.setattr(grade, "_autograde_once", lambda *args: runs.pop(0))
    outcome = grade.autograde_one(grade.grading_job(Path("."), "lab0", "ada"))
    assert outcome.status == "ok" and outcome.seconds == 9.0 and not runs
    assert outcome.notes == ["graded twice: the first run was not kept (no reply in 60 s)"]


def test_the_same_trouble_twice_is_recorded_as_seen_twice(monkeypatch):
    runs = [grade.Outcome("ada", "partial", "kernel mute", retry="mute") for _ in range(2)]
    monkeypatch.setattr(grade, "_autograde_once", lambda *args: runs.pop(0))
    outcome = grade.autograde_one(grade.grading_job(Path("."), "lab0", "ada"))
    assert outcome.status == "partial" and outcome.reason == "kernel mute (the same in two runs: mute)" and not runs


# ---------------------------------------------------------------------------------------------------------------
# Control characters
# ---------------------------------------------------------------------------------------------------------------
def test_escape_controls():
    assert escape_controls("plain text, ünïcode and emoji 🙂") == "plain text, ünïcode and emoji 🙂"
    assert escape_controls(f"a{ESC_HIDE}b\r\n\t\x07\x9b\u202eevil\u2066") == "a\\x1b[8mb\\r\\n\\t\\x07\\x9b\\u202eevil\\u2066"
    assert escape_controls(escape_controls(f"x{ESC_HIDE}")) == escape_controls(f"x{ESC_HIDE}"), "idempotent"


def test_scan_flags_escape_student_text():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"%pip install x{ESC_HIDE}hidden")])
    flags = scan_notebook(nb)
    assert flags and all(ESC_HIDE not in flag for flag in flags) and "\\x1b[8mhidden" in flags[0], flags


def test_table_csv_and_review_escape_student_text(tmp_path):
    who = f"eve{ESC_HIDE}"
    outcome = grade.Outcome(who, "failed", f"boom{ESC_HIDE}", notes=[f"ignored extra files: a{ESC_HIDE}.py"],
                            flags=[f"cell 3: %pip x{ESC_HIDE}"])
    scores = {who: SubmissionScores(who, {"q1_tests": CellScore("q1_tests", 3, None, None, True, True)})}
    header, rows = report.score_table("lab0", {who: outcome}, scores)
    printed = report.format_table(header, rows) + report.flagged_for_review({who: outcome})
    assert "\x1b" not in printed and printed.count("\\x1b[8m") == 4, printed
    report.write_grades_csv(tmp_path / "grades.csv", "lab0", {who: outcome}, scores)
    text = (tmp_path / "grades.csv").read_text()
    row = list(csv.DictReader(text.splitlines()))[0]
    assert "\x1b" not in text and row["student"] == "eve\\x1b[8m" and row["notes"].endswith("a\\x1b[8m.py")
    assert row["q1_tests"] == "", "an autograded cell without a score (cleared after a failed run) is blank"


def test_workers_get_disjoint_cpu_shares_and_matching_thread_counts():
    from course.cli.nbgrader_run import grading_workers
    from course.common.job import THREAD_ENVS

    workers = grading_workers(4, [], list(range(16)))
    shares = [set(worker.kernel_cpus) for worker in workers]
    assert all(len(share) == 4 for share in shares), f"16 CPUs over 4 workers must be 4 each: {shares}"
    assert set().union(*shares) == set(range(16)), "together the workers use every CPU, each CPU once"
    assert all(w.environment()[name] == "3" for w in workers for name in THREAD_ENVS), \
        "a kernel's thread pools leave one CPU of its worker's share to the next submission getting ready"
    assert grading_workers(1, [], list(range(16))) == [WorkerSlot(threads=15)], \
        "one worker runs its kernels on every CPU, with one left to the next submission"
    assert grading_workers(2, [], [0, 1])[0].environment()["OMP_NUM_THREADS"] == "1", "one thread at least"
    gpu_workers = grading_workers(3, ["0", "1"], [0, 1])
    assert [w.gpu for w in gpu_workers] == ["0", "1", "0"], "one GPU per worker, round robin"
    assert all(w.kernel_cpus in ((0,), (1,)) for w in gpu_workers), "more workers than CPUs still get one"


def test_a_worker_s_nbgrader_processes_run_on_every_cpu(tmp_path):
    """nbgrader runs no student code: pinned to its worker's share it would take CPU from that worker's kernel while
    other workers' CPUs idle. It is left on every CPU; only the kernels run on the worker's share (next test)."""
    from course.cli import nbgrader_run

    everywhere = sorted(os.sched_getaffinity(0))
    if len(everywhere) < 2:
        pytest.skip("one CPU: a pinned and an unpinned process cannot be told apart")
    seen = tmp_path / "affinity.txt"
    (tmp_path / "nbgrader_config.py").write_text(  # nbgrader runs its config file at start-up, in its own process
        f"import os\nopen({str(seen)!r}, 'w').write(repr(sorted(os.sched_getaffinity(0))))\n")
    job = grade.grading_job(tmp_path, "lab0", "ada", WorkerSlot(kernel_cpus=tuple(everywhere[:1])), timeout_s=120)
    nbgrader_run.GradingProcess(job).finish()  # no such lab: it fails after nbgrader ran the config file
    assert seen.read_text() == repr(everywhere), "a worker's nbgrader process may use every CPU"


@pytest.mark.parametrize("fork_server", ["on", "off"])
def test_an_nbgrader_process_ends_with_the_process_that_started_it(tmp_path, fork_server):
    """``kill -9`` of course grade alone (not its process group) ends its nbgrader processes: each reads a pipe from
    course grade (its stdin, or a multiprocessing connection when forked from the fork server) and ends its group
    when that pipe ends."""
    (tmp_path / "nbgrader_config.py").write_text(  # nbgrader runs its config file at start-up, in its own process
        "import time\nopen('started', 'w').close()\ntime.sleep(600)\n")
    starter = subprocess.Popen(
        [sys.executable, "-c", "from pathlib import Path\nfrom course.cli.nbgrader_run import run_nbgrader\n"
                               "run_nbgrader(Path('.'), ['db', 'student', 'list'])"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO), "EFFICIENT_AI_GRADING_SPEED": f"fork_server={fork_server}"})
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists() and time.monotonic() < deadline and starter.poll() is None:
        time.sleep(0.2)
    assert (tmp_path / "started").exists(), "the nbgrader process did not start"
    assert processes_working_in(tmp_path), "the nbgrader process works in the course folder"
    starter.kill()
    starter.wait()
    left = wait_until_no_process_works_in(tmp_path)
    assert not left, f"nbgrader processes outlived the process that started them: {left}"
