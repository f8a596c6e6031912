"""The LMS in and out: sorting an LMS's download into ``submitted/`` (plain ``nbgrader zip_collect``, with the file-name
pattern and the collector ``nbgrader_config.py`` sets), final grades in Canvas's gradebook import format
(``grading/LAB/canvas.csv``, written by ``course grade LAB --report``), and ``nbgrader export``'s CSV of the whole
gradebook (``GradebookCsvExport``).

``UploadCollector`` is nbgrader's ``FileNameCollectorPlugin`` with a view of the whole download (``plan_collection``):
one student's several uploads of a notebook keep the newest, a file inside a student's upload is filed for that
student only, and an upload the LMS marks late gets a ``timestamp.txt`` that the course's late policy reads. What it
does not file, and why, goes into ``downloaded/LAB/collect_report.csv`` and nbgrader's log.

Only Canvas's pattern is tested against its documented names: check another against your LMS's zip with
``nbgrader zip_collect LAB --debug`` before grading.
"""
from __future__ import annotations

import csv
import datetime
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from nbgrader.plugins import ExportPlugin, FileNameCollectorPlugin

from ..common.quoting import escape_controls
from ..common.spreadsheet import write_csv

# Canvas: doejane_12345_6789012_lab1.ipynb (sortable name lower-cased, Canvas user id, file id, the file's name),
# doejane_LATE_12345_6789012_lab1.ipynb when late, ..._lab1-1.ipynb for a re-upload of a file of the same name. The
# student id is the name part; two students with the same name collide: use (?P<student_id>\d+) on the user id
# instead. Optional groups UploadCollector reads: ``late`` (the LMS marks the upload late), ``reupload`` (the re-upload
# number, higher is newer) and ``upload_id`` (the LMS's file id, higher is newer).
CANVAS = (r".*/(?P<student_id>[^/_]+)_(?P<late>LATE_)?\d+_(?P<upload_id>\d+)_(?P<file_id>[^/]+?)"
          r"(?:-(?P<reupload>\d+))?\.ipynb$")
# Moodle: "Jane Doe_123456_assignsubmission_file_lab1.ipynb", or a folder "Jane Doe_123456_assignsubmission_file_/"
# holding lab1.ipynb when downloaded in folders. The student id is the full name (spaces included).
MOODLE = r".*/(?P<student_id>[^/_]+)_\d+_assignsubmission_file_/?(?P<file_id>[^/]+)\.ipynb$"
# Blackboard Learn: "Lab 1_jdoe_attempt_2025-03-01-23-59-59_lab1.ipynb" (assignment, user name, attempt time, file).
# The attempt time is left out: nbgrader's date parser misreads that form.
BLACKBOARD = r".*/[^/]*_(?P<student_id>[^/_]+)_attempt_[\d-]+_(?P<file_id>[^/]+)\.ipynb$"
ZIP_COLLECT_PATTERNS = {"canvas": CANVAS, "moodle": MOODLE, "blackboard": BLACKBOARD}

COLLECT_REPORT = "collect_report.csv"  # beside the download's archive/ and extracted/ folders
LATE_BY = datetime.timedelta(seconds=1)  # a late-marked upload's timestamp: the due date plus this


@dataclass
class Candidate:
    """A notebook of the download that can be filed: whose it is, as which notebook, and what the LMS says of its
    upload."""

    path: Path
    student: str
    notebook: str  # file name without .ipynb
    late: bool
    rank: tuple[int, int]  # (re-upload number, LMS file id): the highest is the newest upload


@dataclass
class CollectPlan:
    """What ``nbgrader zip_collect`` files (absolute path -> nbgrader's collect dict) and what it leaves, with why."""

    filed: dict[str, dict] = field(default_factory=dict)
    anomalies: list[tuple[str, str, str]] = field(default_factory=list)  # student, file (in the download), what

    def note(self, student: str, path: Path, root: Path, what: str) -> None:
        """Record what happened to ``path`` (shown relative to the download's folder ``root``)."""
        self.anomalies.append((student, path.relative_to(root).as_posix(), what))


def _upload_facts(match: re.Match) -> tuple[bool, tuple[int, int]]:
    """Whether the LMS marks the upload late, and its rank among one student's uploads (higher: newer)."""
    groups = match.groupdict()
    return bool(groups.get("late")), (int(groups.get("reupload") or 0), int(groups.get("upload_id") or 0))


def _upload_folder(path: Path, root: Path, pattern: str) -> re.Match | None:
    """The outermost folder above ``path`` (below ``root``) that is a student's upload unpacked (an uploaded zip):
    one whose name the pattern reads as an uploaded file's, e.g. ``doejane_12345_6789012_lab1/``. None: ``path`` is
    an upload itself."""
    folder = root
    for part in path.relative_to(root).parts[:-1]:
        folder = folder / part
        if match := re.match(pattern, f"{folder}.ipynb"):
            return match
    return None


def _is_editor_copy(relative: Path) -> bool:
    """A file an editor or an archiver adds (``.ipynb_checkpoints/``, ``__MACOSX/``, ``._lab1.ipynb``): not the
    student's notebook."""
    return any(part.startswith(".") or part == "__MACOSX" for part in relative.parts)


def _candidate(path: Path, root: Path, pattern: str, notebooks: set[str], plan: CollectPlan) -> Candidate | None:
    """The candidate ``path`` is, or None with the reason noted. A file inside an uploaded zip belongs to the
    uploader: it is filed as a notebook of the lab (by its name, or named by the pattern as the uploader's) and never
    for the student another name in it gives."""
    own, upload = re.match(pattern, str(path)), _upload_folder(path, root, pattern)
    if upload is None:
        if own is None:
            plan.note("", path, root, "the name does not match c.FileNameCollectorPlugin.named_regexp: not filed")
            return None
        return Candidate(path, own["student_id"], Path(own["file_id"]).stem, *_upload_facts(own))
    uploader = upload["student_id"]
    if own is not None and own["student_id"] != uploader:
        plan.note(uploader, path, root, f"inside {uploader}'s upload, named as {own['student_id']}'s submission: not "
                  "filed (a file inside an upload is only ever the uploader's)")
        return None
    notebook = Path(own["file_id"]).stem if own is not None else path.stem
    if own is None and notebook not in notebooks:
        plan.note(uploader, path, root, f"inside {uploader}'s upload, not a notebook of the lab "
                  f"({', '.join(sorted(notebooks))}): not filed")
        return None
    return Candidate(path, uploader, notebook, *_upload_facts(upload))


def plan_collection(root: Path, pattern: str, notebooks: set[str], late_stamp: datetime.datetime | None,
                    extensions: tuple[str, ...] = (".ipynb",)) -> CollectPlan:
    """What to file from an unpacked LMS download in ``root`` (nbgrader's ``extracted`` folder).

    Args:
        pattern: ``c.FileNameCollectorPlugin.named_regexp``, with the optional groups ``late``, ``reupload`` and
            ``upload_id`` (``CANVAS``).
        notebooks: the lab's notebook names (``lab1``): an unpacked zip's files are filed by these names.
        late_stamp: the ``timestamp.txt`` of an upload the LMS marks late (the due date + ``LATE_BY``); None when
            the gradebook has no due date.
        extensions: the notebook file extensions (``c.FileNameCollectorPlugin.valid_ext``).

    Returns:
        One file per student and notebook, the newest upload by the LMS's re-upload number (then its file id); each
        file left and each late upload noted.
    """
    plan = CollectPlan()
    grouped: dict[tuple[str, str], list[Candidate]] = defaultdict(list)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in extensions):
        if not _is_editor_copy(path.relative_to(root)) and (found := _candidate(path, root, pattern, notebooks, plan)):
            grouped[found.student, found.notebook].append(found)
    for (student, notebook), group in sorted(grouped.items()):
        kept, *older = sorted(group, key=lambda c: c.rank, reverse=True)  # stable: path order among equal ranks
        for other in older:
            why = ("the same re-upload number and file id as the kept one: cannot tell which is newer, check by hand"
                   if other.rank == kept.rank else "an older upload")
            plan.note(student, other.path, root, f"{why} of {notebook}.ipynb (kept {kept.path.name}): not filed")
        if kept.late:
            plan.note(student, kept.path, root, _late_note(late_stamp))
        plan.filed[os.path.normpath(kept.path)] = {"student_id": student, "file_id": notebook,
                                                   "timestamp": late_stamp if kept.late else None}
    return plan


def _late_note(late_stamp: datetime.datetime | None) -> str:
    """What a late-marked upload gets: the LMS says late, not how late, so the least late it can be."""
    if late_stamp is None:
        return ("marked late by the LMS, but the gradebook has no due date for the lab (nbgrader db assignment add "
                "LAB --duedate=...): no timestamp.txt, no late penalty")
    return f"marked late by the LMS: timestamp.txt {late_stamp:%Y-%m-%d %H:%M:%S} UTC, the due date + 1 s"


def write_collect_report(path: Path, plan: CollectPlan) -> None:
    """``collect_report.csv``: one row per file not filed or filed late, with what happened."""
    write_csv(path, [("student", "file", "what"),
                     *((escape_controls(s), escape_controls(f), escape_controls(w)) for s, f, w in plan.anomalies)])


class UploadCollector(FileNameCollectorPlugin):
    """nbgrader's file-name collector for ``nbgrader zip_collect`` (``c.ZipCollectApp.collector_plugin``) that sees
    the whole download first (``plan_collection``): never aborts on a student's several uploads, never files a file
    inside one student's upload for another, and turns the LMS's late marker into a ``timestamp.txt``."""

    _plan: CollectPlan | None = None

    def collect(self, submitted_file: str) -> dict | None:
        """nbgrader's collect dict for a file of the download (student_id, file_id, timestamp), or None to leave it."""
        if self._plan is None:
            self._plan = self._make_plan()
        return self._plan.filed.get(os.path.normpath(submitted_file))

    def _make_plan(self) -> CollectPlan:
        """Plan the whole download once, from the ZipCollectApp's folders and the lab's source notebooks; log and
        write (``COLLECT_REPORT``) what it leaves."""
        app = self.parent
        course = app.coursedir
        root = Path(app._format_collect_path(app.extracted_directory))  # nbgrader's own extracted folder
        source = Path(course.format_path(course.source_directory, ".", course.assignment_id))
        plan = plan_collection(root, self.named_regexp, {p.stem for p in source.glob("*.ipynb")},
                               self._late_stamp(), tuple(self.valid_ext))
        for student, file, what in plan.anomalies:
            self.log.warning("%s: %s", escape_controls(file), escape_controls(what))
        write_collect_report(root.parent / COLLECT_REPORT, plan)
        self.log.warning("%d file(s) to file, %d noted in %s", len(plan.filed), len(plan.anomalies),
                         root.parent / COLLECT_REPORT)
        return plan

    def _late_stamp(self) -> datetime.datetime | None:
        """The due date of the lab in the gradebook + ``LATE_BY`` (UTC, as nbgrader keeps it); None without one."""
        from nbgrader.api import Gradebook, MissingEntry

        course = self.parent.coursedir
        with Gradebook(course.db_url, course.course_id) as gb:
            try:
                due = gb.find_assignment(course.assignment_id).duedate
            except MissingEntry:
                return None
        return due + LATE_BY if due else None


CANVAS_FIELDS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
POINTS_POSSIBLE = "    Points Possible"  # the second row of Canvas's own gradebook export, as it writes it


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """nbgrader student id -> Canvas fields, from a CSV roster with a ``student_id`` column (the student's
    ``submitted/`` folder) and any of ``CANVAS_FIELDS`` (Canvas's gradebook export with that column added); other
    columns are ignored. ValueError when there is no ``student_id`` column."""
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if "student_id" not in (reader.fieldnames or []):
            raise ValueError(f"{path}: a roster needs a student_id column (and any of {', '.join(CANVAS_FIELDS)})")
        return {row["student_id"].strip(): {f: (row.get(f) or "").strip() for f in CANVAS_FIELDS}
                for row in reader if (row.get("student_id") or "").strip()}


def write_canvas_csv(path: Path, lab: str, final_scores: dict[str, float | None], points_possible: float,
                     roster: dict[str, dict[str, str]] | None = None, assignment_id: str | None = None) -> None:
    """Write Canvas's gradebook import CSV: a header, the Points Possible row, one row per student.

    Args:
        final_scores: student id -> the points to upload (late penalty already taken off), or None to leave the
            student's grade in Canvas as it is (an empty cell, which Canvas's import skips): an answer not graded yet,
            no submission.
        points_possible: the assignment's maximum (bonus points come on top, as in Canvas's extra credit).
        roster: student id -> Canvas fields (``read_roster``); without an entry, the id is ``Student`` and
            ``SIS Login ID``.
        assignment_id: Canvas's id of the assignment (column ``Lab 1 (123456)``); without it the column is
            ``Lab 1`` and Canvas offers to create a new assignment.
    """
    title = f"Lab {lab[3:]}" if lab.startswith("lab") else lab
    rows = [[*CANVAS_FIELDS, f"{title} ({assignment_id})" if assignment_id else title],
            [POINTS_POSSIBLE, "", "", "", "", points_possible]]
    for student in sorted(final_scores):
        fields = (roster or {}).get(student) or {"Student": student, "SIS Login ID": student}
        rows.append([*(fields.get(name, "") for name in CANVAS_FIELDS), final_scores[student]])
    write_csv(path, rows)


def final_score(total: float, penalty: float) -> float:
    """What a student gets: the total score less the late penalty, never below 0."""
    return max(0.0, total - penalty)


NBGRADER_EXPORT_COLUMNS = ("assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                           "raw_score", "late_submission_penalty", "score", "max_score", "ungraded")


class GradebookCsvExport(ExportPlugin):
    """``nbgrader export`` (``c.ExportApp.plugin_class``): nbgrader's CSV of the whole gradebook (one row per assignment
    and student, the columns of its own exporter), with the course's two rules: every cell through ``write_csv``, and
    no ``score`` while a cell of the submission waits for a TA (``ungraded`` says yes). A student without a submission
    scores 0, as in nbgrader."""

    def export(self, gradebook) -> None:
        rows = [NBGRADER_EXPORT_COLUMNS]
        for assignment in gradebook.assignments:
            for student in gradebook.students:
                if (not self.assignment or assignment.name in self.assignment) and \
                        (not self.student or student.id in self.student):
                    rows.append(self.row(gradebook, assignment, student))
        write_csv(Path(self.to or "grades.csv"), rows)

    @staticmethod
    def row(gradebook, assignment, student) -> list:
        """One assignment of one student, in ``NBGRADER_EXPORT_COLUMNS``' order."""
        from nbgrader.api import MissingEntry

        lab = [assignment.name, assignment.duedate]
        person = [student.id, student.last_name, student.first_name, student.email]
        try:
            submitted = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            return [*lab, None, *person, 0.0, 0.0, 0.0, assignment.max_score, ""]
        penalty, waiting = submitted.late_submission_penalty, submitted.needs_manual_grade
        return [*lab, submitted.timestamp, *person, submitted.score, penalty,
                None if waiting else final_score(submitted.score, penalty), assignment.max_score,
                "yes" if waiting else ""]
