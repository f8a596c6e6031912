"""How long writing a lab's grade reports takes for a class of N: reading the gradebook, ``grades.csv``, ``scores.png``.

Usage: ``python scripts/bench_report_writing.py [--lab lab1] [--students 64 128 300] [--repeat 3] [--tag cpu-2core]
[--code-from DIR]``.

``course grade`` writes the reports after its last submission is graded, and ``course grade LAB --report`` after a
TA graded written answers; both read every listed student's scores from the gradebook
(``course.nbgrader_run.read_scores``). This script builds, for each class size, a fresh SQLite course whose gradebook
holds the lab's cells (``nbgrader generate_assignment``) and one submission per student, entered with nbgrader's own
API (``Gradebook.add_submission``) and given autograded scores; no notebook runs. It then times, ``--repeat`` times
each, in this process with nbgrader and matplotlib already imported (as in ``course grade``, which imports them while
its workers grade):

- ``read_scores``: every student's per-cell scores;
- ``write_reports``: ``grades.csv`` and ``scores.png``, the gradebook read included.

``--code-from DIR`` imports ``course`` from another checkout (a ``git worktree`` of an earlier commit), so that one
machine measures two versions the same way; rows name the commit they ran. Appends its rows to
``reports/report-writing-<tag>.json`` and rewrites ``reports/report-writing-<tag>.md`` from all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _import_course(code_from: Path):
    """``course``'s grading modules from ``code_from`` (its ``course`` package first on ``sys.path``)."""
    sys.path.insert(0, str(code_from))
    from course import grade, nbgrader_run, outcome, report

    if Path(nbgrader_run.__file__).resolve().parents[1] != code_from.resolve():
        raise SystemExit(f"imported course from {nbgrader_run.__file__}, not from {code_from}")
    return grade, nbgrader_run, outcome.Outcome, report


def commit_of(tree: Path) -> str:
    """The checkout's commit, with ``+ changes`` where its ``course`` package differs from that commit."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "course"], capture_output=True,
                             text=True)
    return (head.stdout.strip() or "unknown") + (" + changes" if changed.stdout.strip() else "")


def fill_gradebook(nbgrader_run, course_root: Path, lab: str, students: int, seed: int = 0) -> None:
    """One submission per student in the course's gradebook, with random autograded scores (written answers left
    ungraded, as after autograding)."""
    from nbgrader.api import Gradebook

    rng = random.Random(seed)
    # nbgrader's add_submission makes SQLAlchemy warn about its own relationship handling; nothing to act on here.
    warnings.filterwarnings("ignore", message="Object of type", module="nbgrader")
    with Gradebook(nbgrader_run.db_url_for(course_root), course_id=nbgrader_run.COURSE_ID) as gb:
        for index in range(students):
            student = f"student-{index:04d}"
            gb.update_or_create_student(student)
            submission = gb.add_submission(lab, student)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if nbgrader_run.is_autograded_grade(grade):
                        grade.auto_score = rng.choice([0.0, float(grade.max_score)])
                        grade.needs_manual_grade = False
        gb.db.commit()


def measure(modules, lab: str, students: int, repeat: int, code_from: Path) -> dict:
    grade, nbgrader_run, Outcome, report = modules
    report.prepare_plotting()
    import nbgrader.api  # noqa: F401  (imported ahead, as course grade has it by the time it writes reports)

    with tempfile.TemporaryDirectory(prefix="bench-report-writing-") as scratch:
        course_root = nbgrader_run.make_course_dir(Path(scratch) / "course", [lab], repo_root=REPO)
        grade.prepare_gradebook(course_root, lab)
        started = time.perf_counter()
        fill_gradebook(nbgrader_run, course_root, lab, students)
        fill_s = time.perf_counter() - started
        outcomes = {name: Outcome(name, "ok", "", 1.0) for name in (f"student-{i:04d}" for i in range(students))}
        read_s, write_s = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            scores = nbgrader_run.read_scores(course_root, lab)
            read_s.append(time.perf_counter() - started)
            if len(scores) != students:
                raise SystemExit(f"read_scores found {len(scores)} submissions, expected {students}")
            out_dir = Path(scratch) / "out"
            started = time.perf_counter()
            report.write_reports(course_root, lab, out_dir, outcomes)
            write_s.append(time.perf_counter() - started)
            (out_dir / "grades.csv").unlink()  # each repeat writes it from the gradebook alone, as the first did
    return {"lab": lab, "students": students, "repeat": repeat, "commit": commit_of(code_from),
            "fill_gradebook_s": round(fill_s, 2), "read_scores_s": [round(x, 3) for x in read_s],
            "write_reports_s": [round(x, 3) for x in write_s]}


def machine_description() -> str:
    """Cores and Python version of this machine."""
    import platform

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_report(stem: Path, machine: str, rows: list[dict]) -> None:
    lines = [
        "# Writing grade reports: reading the gradebook, `grades.csv` and `scores.png`",
        "",
        f"Measured by `python scripts/bench_report_writing.py` on {machine}: a fresh SQLite course per class size, one "
        "submission per student entered with nbgrader's API and given autograded scores (no notebook runs). Median "
        "seconds of the repeats, in one process with nbgrader and matplotlib imported ahead (as `course grade` has "
        "them when its last submission ends). `write_reports` includes reading the gradebook.",
        "",
        "| commit | lab | students | repeats | `read_scores` (s) | `write_reports` (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(f"| {row['commit']} | {row['lab']} | {row['students']} | {row['repeat']} | "
                     f"{statistics.median(row['read_scores_s']):.2f} | {statistics.median(row['write_reports_s']):.2f} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--students", type=int, nargs="+", default=[64, 128, 300])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tag", default="cpu")
    parser.add_argument("--code-from", type=Path, default=REPO,
                        help="a checkout whose course package to measure (default: this one)")
    args = parser.parse_args()
    stem = REPO / "reports" / f"report-writing-{args.tag}"
    modules = _import_course(args.code_from)  # before anything imports this checkout's course package
    machine = machine_description()
    rows = json.loads(stem.with_suffix(".json").read_text())["rows"] if stem.with_suffix(".json").exists() else []
    for students in args.students:
        row = measure(modules, args.lab, students, args.repeat, args.code_from)
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_report(stem, machine, rows)
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
