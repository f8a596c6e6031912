"""grade: autograde every submission of a lab, then report it (``course.cli.report``).

Each submission is graded from a staged, repaired copy (``course.cli.submission``) by its own nbgrader process with a
time limit, so a crash, a hang or a dead kernel costs that submission only.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..common.grading_result import GradingResult, is_recorded, mark_recorded
from ..common.job import GradingJob, Limits, WorkerSlot, autograded_folder
from ..common.outcome import NEEDS_TA, Outcome
from ..common.paths import REPO_ROOT, course_directory, source_notebook_path
from ..common.quoting import escape_controls
from ..common.scores import SubmissionScores, read_scores
from ..common.speed import speed_pieces
from ..grader.lms import read_roster
from ..grader.sandbox import unavailable_reason
from ..grader.settings import sandbox_mode
from .feedback import settle_late_penalties, ungraded_answers
from .nbgrader_run import GradingProcess, available_cpus, grading_workers, run_nbgrader
from .report import (
    NO_SUBMISSION,
    flagged_for_review,
    previous_outcomes,
    print_table,
    write_canvas_export,
    write_reports,
)
from .submission import ClassStaging, clear_autograded_scores, record_zero

DEFAULT_SUBMISSION_TIMEOUT_S = 900.0


def prepare_gradebook(course_root: Path, lab: str) -> None:
    """Record the lab's cells in the gradebook (nbgrader generate_assignment); RuntimeError when nbgrader cannot."""
    for attempt in range(3):  # shards starting together on one PostgreSQL gradebook may collide once
        with tempfile.TemporaryDirectory(prefix="efficient-ai-release-") as scratch:
            result = run_nbgrader(course_root, ["generate_assignment", lab, "--force",
                                                f"--CourseDirectory.release_directory={scratch}"])
        if result.ok:
            return
        time.sleep(1 + 2 * attempt)
    raise RuntimeError(f"nbgrader generate_assignment {lab} failed:\n{result.tail(25)}")


def list_students(course_root: Path, lab: str) -> list[str]:
    """Students with a submission folder for ``lab`` under ``submitted/``, sorted."""
    coursedir = course_directory(course_root)
    submitted = Path(coursedir.root) / coursedir.submitted_directory
    return sorted(p.name for p in submitted.iterdir() if (p / lab).is_dir()) if submitted.is_dir() else []


def grading_job(course_root: Path, lab: str, student: str, slot: WorkerSlot | None = None,
                staging: Path | None = None, timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S,
                ahead: bool = False) -> GradingJob:
    """The job of autograding one submission (from ``staging``, default ``submitted/``) on ``slot``, with the speed
    pieces ``EFFICIENT_AI_GRADING_SPEED`` leaves on (``ahead`` only when that piece is)."""
    pieces = speed_pieces()
    result_file = Path(tempfile.gettempdir()) / f"efficient-ai-result-{uuid.uuid4().hex}.json"
    return GradingJob(Path(course_root), lab, student, result_file, staging, slot or WorkerSlot(), Limits(timeout_s),
                      ahead=ahead and pieces.ahead)


def autograde_one(job: GradingJob, started: GradingProcess | None = None) -> Outcome:
    """Autograde one submission (``started``: its process, started ahead). Never raises for a bad submission.

    A run a busy machine can explain (``Outcome.retry``) is graded once more and the second run kept; a run that hit a
    sticky CUDA error is graded once more with the GPU hidden, as a CPU grader would. A note says so either way.
    """
    outcome = _autograde_once(job, started)
    job = replace(job, ahead=False)
    if outcome.retry:
        first = outcome
        outcome = _autograde_once(job)
        outcome.seconds += first.seconds
        if outcome.retry:
            outcome.reason = f"{outcome.reason} (the same in two runs: {first.retry})"
        outcome.notes.insert(0, f"graded twice: the first run was not kept ({first.retry})")
    cuda_error = outcome.cuda_error
    gpu = job.slot.gpu if job.slot.gpu is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if not cuda_error or gpu == "":
        return outcome
    cpu = _autograde_once(replace(job, slot=job.slot.without_gpu()))
    cpu.seconds += outcome.seconds
    cpu.notes.insert(0, f"graded on the CPU: on the GPU, {cuda_error} made every later CUDA call fail")
    return cpu


def _autograde_once(job: GradingJob, started: GradingProcess | None = None) -> Outcome:
    start = time.perf_counter()
    run = (started or GradingProcess(job)).finish()
    seconds = time.perf_counter() - start
    if run.timed_out:
        return Outcome(job.student, "failed",
                       f"exceeded the per-submission time limit of {job.limits.submission_timeout_s:.0f} s", seconds)
    if run.result.failure:
        return Outcome(job.student, "failed", run.result.failure, seconds, retry=run.result.retry)
    return with_result(Outcome(job.student, "ok", "", seconds), run.result)


def sandbox_status() -> str:
    """One line on whether grading kernels ran in the sandbox (docs/SECURITY.md)."""
    if sandbox_mode() == "off":
        return "sandbox: off (EFFICIENT_AI_SANDBOX=off): student code ran with the grader's rights"
    if reason := unavailable_reason():
        return f"sandbox: NOT used: {reason}. Student code ran with the grader's rights (docs/SECURITY.md)"
    return "sandbox: every grading kernel ran in bubblewrap (no network, no view of the course folder)"


def with_result(outcome: Outcome, result: GradingResult) -> Outcome:
    """``outcome`` with what the grading run recorded (``GradingResult``): ``partial`` when execution stopped early
    (a dead kernel, the notebook time limit), with the reason; what the guard found becomes notes."""
    if reason := result.partial_reason():
        outcome.status, outcome.reason = "partial", reason
    outcome.cuda_error, outcome.retry = result.cuda_error, result.retry
    outcome.notes += result.notes()
    return outcome


def visible_gpus() -> list[str]:
    """CUDA device ids a worker may be pinned to (CUDA_VISIBLE_DEVICES, else what nvidia-smi lists)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):  # no nvidia-smi, or it hung
        return []
    return [str(i) for i, line in enumerate(listing.splitlines()) if line.startswith("GPU ")]


def autograde_all(course_root: Path, lab: str, students: list[str], timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S,
                  progress: bool = True, workers: int = 1, submitted: Path | None = None,
                  gradable: Callable[[str], bool] | None = None) -> dict[str, Outcome]:
    """Autograde every submission, ``workers`` at a time (``grading_workers``), past failures, with a progress bar.
    ``gradable`` is asked before each one (it may wait for the staging); one it refuses is left out of the outcomes.

    Each worker starts its next submission's nbgrader process while it grades one (``GradingJob.ahead``, a speed piece
    of ``course.common.speed``), so that its imports, kernel start and setup cells overlap the cells being graded.
    """
    from tqdm import tqdm

    queue = iter(students)
    lock = threading.Lock()
    outcomes: dict[str, Outcome] = {}

    def next_student() -> str | None:
        while True:
            with lock:
                student = next(queue, None)
            if student is None or gradable is None or gradable(student):
                return student
            with lock:
                bar.update()

    def job_of(student: str, slot: WorkerSlot, ahead: bool) -> GradingJob:
        return grading_job(course_root, lab, student, slot, submitted, timeout_s, ahead)

    def start_ahead(student: str | None, slot: WorkerSlot) -> GradingProcess | None:
        if student is None or not (job := job_of(student, slot, ahead=True)).ahead:
            return None  # the piece is off: it starts at its turn
        try:
            return GradingProcess(job)
        except OSError:  # it starts at its turn instead
            return None

    def work(slot: WorkerSlot) -> None:
        student = next_student()
        started = start_ahead(student, slot)
        while student is not None:
            if started:
                started.go()
            upcoming = next_student()
            ahead = start_ahead(upcoming, slot)
            try:
                outcome = _record_finished(course_root, lab, autograde_one(
                    started.job if started else job_of(student, slot, ahead=False), started))
            except Exception as exc:  # noqa: BLE001 - a worker's own failure is one submission's failure
                outcome = Outcome(student, "failed", f"worker error: {exc}")
            with lock:
                outcomes[student] = outcome
                bar.set_postfix_str(student)
                bar.update()
            student, started = upcoming, ahead

    team = grading_workers(max(1, workers), visible_gpus() if workers > 1 else [], available_cpus())
    with tqdm(total=len(students), desc=f"autograde {lab}", unit="submission", disable=not progress) as bar, \
            ThreadPoolExecutor(max_workers=len(team), thread_name_prefix="grading-worker") as executor:
        for done in [executor.submit(work, slot) for slot in team]:
            done.result()
    return {s: outcomes[s] for s in students if s in outcomes}


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` -> (2, 8): shard 2 of 8, numbered from 0. Raises ValueError unless i/n with 0 <= i < n."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= index < count:
        raise ValueError(f"--shard {text}: need 0 <= i < n")
    return index, count


def shard_students(students: list[str], shard: tuple[int, int] | None) -> list[str]:
    """The students of shard (i, n): every n-th of the sorted list, starting at i; all of them for None."""
    index, count = shard or (0, 1)
    return sorted(students)[index::count]


def already_graded(course_root: Path, lab: str, students: list[str]) -> list[str]:
    """Students whose grading an earlier run finished (``course.recorded``) and whose scores the gradebook holds."""
    scores = read_scores(course_root, lab, students)
    return [s for s in students
            if s in scores and scores[s].cells and is_recorded(autograded_folder(course_root, lab, s), f"{lab}.ipynb")]


def _record_finished(course_root: Path, lab: str, outcome: Outcome) -> Outcome:
    """Mark a graded submission as finished for ``--resume`` (``course.recorded``); a note says when it cannot."""
    if outcome.status in ("ok", "partial"):
        try:
            mark_recorded(autograded_folder(course_root, lab, outcome.student), f"{lab}.ipynb")
        except OSError as exc:
            outcome.notes.append(f"not marked as finished ({exc}): a run with --resume grades it again")
    return outcome


def mark_earlier_scores_stale(course_root: Path, lab: str, outcome: Outcome) -> None:
    """After a failed run, clear an earlier run's scores of the submission (``clear_autograded_scores``), and say so
    in the reason, so that no old score reads as current."""
    try:
        if clear_autograded_scores(course_root, lab, outcome.student):
            outcome.reason += ("; the scores of an earlier run were cleared (the formgrader lists its cells for "
                               "manual grading)")
    except Exception as exc:  # noqa: BLE001 - reported with the submission; the others go on
        outcome.reason += f"; clearing the scores of an earlier run failed ({exc}): they are NOT current"


def grade_staged(course_root: Path, lab: str, staged: ClassStaging, staging: Path,
                 timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S, progress: bool = True, workers: int = 1,
                 resume: bool = False) -> dict[str, Outcome]:
    """The outcome of every staged submission, with its notes and flags: kept from an earlier run (``resume``),
    autograded from ``staging`` as soon as it is staged, else recorded with zero points when there is nothing to
    grade. A failed submission loses what an earlier run recorded for it."""
    students = staged.students
    done = set(already_graded(course_root, lab, students)) if resume else set()
    outcomes = {s: with_result(Outcome(s, "ok"), GradingResult.read(autograded_folder(course_root, lab, s)))
                for s in done}  # with what that run recorded (a partial run stays one)
    for outcome in outcomes.values():
        outcome.reason = "graded by an earlier run" + (f": {outcome.reason}" if outcome.reason else "")
    todo = [s for s in students if s not in done]
    outcomes.update(autograde_all(course_root, lab, todo, timeout_s, progress, workers, submitted=staging,
                                  gradable=lambda student: staged.get(student).gradable))
    everything = staged.all()
    for student in todo:
        submission = everything[student]
        if not submission.gradable:
            outcomes[student] = Outcome(student, "failed", submission.reason)
        if submission.zero and not submission.gradable:
            try:
                record_zero(course_root, lab, student, staging / student / lab)
            except Exception as exc:  # noqa: BLE001 - reported with the submission; the others go on
                outcomes[student].reason += f"; recording zero points failed: {exc}"
        elif outcomes[student].status == "failed":
            mark_earlier_scores_stale(course_root, lab, outcomes[student])
    for student, submission in everything.items():  # staging's notes first, then what grading itself reported
        if submission.review and outcomes[student].status == "ok":
            outcomes[student].status, outcomes[student].reason = NEEDS_TA, submission.review
        outcomes[student].notes = submission.notes + outcomes[student].notes
        outcomes[student].flags = submission.flags + outcomes[student].flags
    return {s: outcomes[s] for s in students}


def grade_lab(course_root: Path, lab: str, students: list[str] | None = None, out_dir: Path | None = None,
              timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S, progress: bool = True, workers: int = 1,
              resume: bool = False) -> tuple[dict[str, Outcome], dict[str, SubmissionScores]]:
    """Autograde a lab's submissions, each from its staged copy (``ClassStaging``), and write ``grades.csv`` and
    ``scores.png`` into ``out_dir``. With ``resume``, submissions an earlier run finished are kept."""
    students = students if students is not None else list_students(course_root, lab)
    out_dir = out_dir or course_root / "grading" / lab
    with tempfile.TemporaryDirectory(prefix="efficient-ai-staged-") as staging, \
            ThreadPoolExecutor(1, thread_name_prefix="gradebook-prepare") as preparing:
        gradebook = preparing.submit(prepare_gradebook, course_root, lab)  # an nbgrader process: no GIL taken
        staged = ClassStaging(course_root, lab, students, Path(staging))  # meanwhile, and while grading
        try:
            gradebook.result()
            outcomes = grade_staged(course_root, lab, staged, Path(staging), timeout_s, progress, workers, resume)
        finally:
            staged.close()  # before the staging folder goes
    scores = write_reports(course_root, lab, out_dir, outcomes).scores
    return outcomes, {student: scores[student] for student in students if student in scores}


def main(lab: str, root: Path = REPO_ROOT, students: list[str] | None = None,
         timeout_s: float = DEFAULT_SUBMISSION_TIMEOUT_S, workers: int = 1, shard: str | None = None,
         resume: bool = False, report_only: bool = False, roster: Path | None = None,
         canvas_assignment_id: str | None = None, force: bool = False) -> int:
    """``course grade LAB``: grade, print the table and what needs a TA; 2 when there is nothing to grade."""
    if report_only:
        return report_main(lab, root, roster, canvas_assignment_id, force)
    if sandbox_mode() == "on" and (reason := unavailable_reason()):
        print(f"grade {lab}: EFFICIENT_AI_SANDBOX=on, but grading kernels cannot be sandboxed here: {reason}")
        return 2
    if not source_notebook_path(root, lab).exists():
        print(f"grade {lab}: {source_notebook_path(root, lab)} is missing (build the lab, or check --course-dir)")
        return 2
    found = list_students(root, lab)
    if missing := [s for s in students or [] if s not in found]:
        print(f"grade {lab}: no submission for {', '.join(missing)} under submitted/<student>/{lab}/")
        return 2
    if not (students or found):
        print(f"grade {lab}: nothing to grade: put submissions in submitted/<student>/{lab}/{lab}.ipynb")
        return 2
    try:
        selected = shard_students(students or found, parse_shard(shard) if shard else None)
    except ValueError as exc:
        print(f"grade {lab}: {exc}")
        return 2
    out_dir = root / "grading" / lab
    if shard:
        out_dir = out_dir / f"shard-{shard.replace('/', '-of-')}"
    outcomes, scores = grade_lab(root, lab, selected, out_dir, timeout_s, workers=workers, resume=resume)
    print_table(lab, outcomes, scores)
    statuses = [o.status for o in outcomes.values()]
    noted = sum(1 for o in outcomes.values() if o.notes)
    print(f"\n{len(outcomes)} submission(s): {statuses.count('failed')} failed and {statuses.count('partial')} stopped "
          f"early (their points so far are recorded; see 'reason'), {noted} with notes (repairs, tampering found; see "
          "'notes' in grades.csv).")
    print(sandbox_status())
    if review := flagged_for_review(outcomes):
        print(review)
    print(f"wrote {out_dir / 'grades.csv'} and {out_dir / 'scores.png'}")
    return 0


def report_main(lab: str, root: Path = REPO_ROOT, roster: Path | None = None, canvas_assignment_id: str | None = None,
                force: bool = False) -> int:
    """``course grade LAB --report``: grading nothing, rewrite ``grades.csv`` and ``scores.png`` from the gradebook
    (a TA's manual points included) and write ``canvas.csv`` (``roster`` maps student ids to Canvas's fields).

    Refuses (1) while a cell of a submission waits for a TA, as ``course feedback`` does; with ``force`` it writes them,
    such a submission without a final score (``course.cli.report``). With a roster, its students without a submission
    get a row and both kinds of mismatch are listed."""
    out_dir = root / "grading" / lab
    outcomes = previous_outcomes(out_dir / "grades.csv", lab)
    if not outcomes:
        print(f"grade {lab} --report: {out_dir / 'grades.csv'} lists nobody yet: grade the lab first")
        return 2
    try:
        fields = read_roster(roster) if roster else None
    except (OSError, ValueError) as exc:  # no such file, or a roster without its student_id column
        print(f"grade {lab} --report: {exc}")
        return 2
    waiting = ungraded_answers(root, lab, sorted(outcomes))
    if waiting:
        print(_waiting_message(lab, waiting, force))
        if not force:
            return 1
    if fields is not None:
        print(_roster_mismatches(fields, outcomes))

    try:
        settle_late_penalties(root, lab)
    except RuntimeError as exc:  # no export with the penalties of autograde
        print(f"grade {lab} --report: {exc}")
        return 1
    absent = {s: Outcome(s, NO_SUBMISSION, "on the roster, no submission") for s in fields or {} if s not in outcomes}
    report = write_reports(root, lab, out_dir, absent, settled=True)
    canvas = write_canvas_export(out_dir, lab, report, fields, canvas_assignment_id)
    print_table(lab, report.outcomes, report.scores)
    print(f"wrote {out_dir / 'grades.csv'}, {out_dir / 'scores.png'} and {canvas} (Canvas's gradebook import) from the "
          "gradebook (manual points included, late penalties of the final scores taken off"
          + (f"; {len(waiting)} submission(s) without a final score, left empty)" if waiting else ")"))
    return 0


def _waiting_message(lab: str, waiting: dict[str, list[str]], force: bool) -> str:
    """Who has cells waiting for a TA, one student a line, and what ``--report`` does about it."""
    lines = [f"grade {lab} --report: {len(waiting)} submission(s) have cells waiting for a TA's score (written answers, "
             "plots, or a submission whose grading failed); an export would show them as 0 points:"]
    lines += [escape_controls(f"  {student}: {', '.join(cells)}") for student, cells in sorted(waiting.items())]
    lines.append("Grade them in JupyterLab (Nbgrader > Formgrader) first, or pass --force: their rows in grades.csv then "
                 "list them under 'ungraded' with no final_score, and canvas.csv leaves their score empty (Canvas's "
                 "import keeps the grade Canvas has)." + (" Writing them anyway (--force)." if force else ""))
    return "\n".join(lines)


def _roster_mismatches(fields: dict[str, dict[str, str]], outcomes: dict[str, Outcome]) -> str:
    """The roster's students without a submission and the graded students not on the roster, as lines for the TA."""
    absent = sorted(s for s in fields if s not in outcomes)
    unknown = sorted(s for s in outcomes if s not in fields)
    return "\n".join([
        escape_controls(f"roster: {len(absent)} student(s) without a submission (status '{NO_SUBMISSION}' in "
                        f"grades.csv, an empty score in canvas.csv): {', '.join(absent) or '-'}"),
        escape_controls(f"roster: {len(unknown)} graded student(s) not on the roster (canvas.csv names them by "
                        f"student id only, which Canvas cannot match: add them to the roster): {', '.join(unknown) or '-'}"),
    ])
