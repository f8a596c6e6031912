"""A/B of each speed piece of ``course grade`` (``course/common/speed.py``): grades the demo class (``course demo``'s three
submissions) with every piece on and with each piece off in turn, in alternated rounds, in one command, and prints a
markdown table of the time per submission.

    python scripts/grading_ab.py [--lab lab1] [--rounds 3] [--workers 1] [--copies 1] [--student demo-reference]
                                 [--pieces ahead,...] [--report reports/grading-time-cpu-2core.md]

The pieces are ``course/common/speed.py``'s (``--pieces``: only these), each switched off through
``EFFICIENT_AI_GRADING_SPEED``; ``--copies N`` grades a class of N copies of those three (what a command costs once
weighs less), ``--student`` that submission alone (a regrade). ``--report`` writes the table with the machine, commit and command that made it.

A piece that does not save at least 20 % of the time per submission goes (docs/GRADING.md). Run it on an idle
machine: the table is only as quiet as the machine.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from run_cpu_scale import source_commit  # noqa: E402  (scripts/, this script's folder)

from course.cli import build  # noqa: E402
from course.cli.demo import demo_class  # noqa: E402
from course.cli.nbgrader_run import make_course_dir  # noqa: E402
from course.common.speed import SPEED_ENV, SpeedPieces  # noqa: E402
from course.grader.sandbox import unavailable_reason  # noqa: E402

ALL_ON = "every piece on"


def variants(pieces: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Variant name -> the environment that makes it: every piece on, then each of ``pieces`` (default: all) off."""
    known = [piece.name for piece in fields(SpeedPieces)]
    if unknown := set(pieces or ()) - set(known):
        raise SystemExit(f"--pieces: {', '.join(sorted(unknown))} not among {', '.join(known)}")
    found = {ALL_ON: {}}
    for name in pieces or known:
        found[f"{name} off"] = {SPEED_ENV: f"{name}=off"}
    return found


def grade_seconds(course: Path, lab: str, switches: dict[str, str], workers: int, student: str | None = None) -> float:
    """Wall-clock seconds of ``course grade LAB`` (``--student``: that one) in ``course`` with the environment
    ``switches``."""
    env = {**os.environ, **switches,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    only = ["--student", student] if student else []
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "course", "grade", lab, "--course-dir", str(course),
                           "--workers", str(workers), *only], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with (course / "grading" / lab / "grades.csv").open(newline="") as handle:
        statuses = {row["student"]: row["status"] for row in csv.DictReader(handle)
                    if student is None or row["student"] == student}
    if done.returncode != 0 or set(statuses.values()) != {"ok"}:
        raise SystemExit(f"course grade failed with {switches or 'every piece on'} ({statuses}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds


def copy_class(course: Path, students: dict, copies: int) -> int:
    """Add ``copies - 1`` copies of each of ``students``' submissions (STUDENT-2, ...); the class's size."""
    for student in students:
        for number in range(2, copies + 1):
            shutil.copytree(course / "submitted" / student, course / "submitted" / f"{student}-{number}")
    return len(students) * copies


def table(times: dict[str, list[float]], submissions: int) -> str:
    """The markdown table: per variant, the median seconds per submission, every round's, and the change against
    every piece on (positive: that piece saves time)."""
    base = statistics.median(times[ALL_ON]) / submissions
    lines = ["| variant | median s / submission | rounds (s / submission) | the piece saves |",
             "|---|---:|---|---:|"]
    for name, runs in times.items():
        per = [run / submissions for run in runs]
        median = statistics.median(per)
        saves = "" if name == ALL_ON else f"{(median - base) / median:+.0%}"
        lines.append(f"| {name} | {median:.1f} | {', '.join(f'{x:.1f}' for x in per)} | {saves} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each grades the class once per variant")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report", type=Path, help="write the table and how it was made to this markdown file")
    parser.add_argument("--machine", default="", help="words for the machine in the report (cores, idle or not)")
    parser.add_argument("--copies", type=int, default=1, help="the class is this many copies of the demo class")
    parser.add_argument("--student", help="grade only this submission of the demo class (e.g. demo-reference)")
    parser.add_argument("--pieces", help="switch off only these pieces, comma separated (default: each in turn)")
    parser.add_argument("--commit", help="the commit measured, for the report (default: run_cpu_scale.source_commit)")
    args = parser.parse_args(argv)
    if build.main([args.lab], REPO) != 0:
        return 1
    named = variants(args.pieces.split(",") if args.pieces else None)
    times: dict[str, list[float]] = {name: [] for name in named}
    with tempfile.TemporaryDirectory(prefix="efficient-ai-ab-") as scratch:
        course = make_course_dir(Path(scratch) / "course", [args.lab], REPO)
        class_size = copy_class(course, demo_class(args.lab, REPO, course), args.copies)
        submissions = 1 if args.student else class_size
        order = list(named)
        for round_number in range(args.rounds):
            for name in order if round_number % 2 == 0 else order[::-1]:  # alternated: drift hits every variant
                times[name].append(grade_seconds(course, args.lab, named[name], args.workers, args.student))
                print(f"round {round_number + 1}: {name}: {times[name][-1] / submissions:.1f} s per submission",
                      file=sys.stderr)
            graded = f"{args.student} alone" if args.student else f"{submissions} submissions"
            heading = (f"{args.lab}, {graded}, {args.workers} worker(s), {round_number + 1} "
                       f"alternated round(s), {len(os.sched_getaffinity(0))} CPUs usable:")
            if args.report:  # after every round: a run stopped early (a time limit) still leaves its whole rounds
                args.report.write_text(report_text(args, heading, table(times, submissions), class_size))
    print(heading + "\n\n" + table(times, submissions))
    return 0


def report_text(args, heading: str, markdown_table: str, class_size: int) -> str:
    """The report: what was measured, where and how, then the table and the rule it is read by."""
    commit = args.commit or source_commit()
    options = "".join(f" --{name} {value}" for name, value in
                      (("copies", args.copies if args.copies > 1 else None), ("student", args.student),
                       ("pieces", args.pieces)) if value)
    reason = unavailable_reason()
    sandboxed = "grading kernels in bubblewrap" if reason is None else f"grading kernels unsandboxed: {reason}"
    graded = (f"the submission {args.student} of `course demo`'s class alone" if args.student else
              "`course demo`'s class (reference, blank, partial)" +
              (f" in {args.copies} copies ({class_size} submissions)" if args.copies > 1 else ""))
    return "\n".join([
        "# Grading time on CPU: each speed piece of `course grade`, A/B", "",
        f"Made by `python scripts/grading_ab.py --lab {args.lab} --rounds {args.rounds} --workers {args.workers}"
        f"{options} --report ...` at commit {commit}, in one command, on {args.machine or platform.platform()} "
        f"(Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the end; {sandboxed}). "
        f"Each round grades {graded} once per variant into the same course folder, variants in alternated order; "
        "the time per submission is the whole `course grade` command over the submissions. A piece that does not "
        "save at least 20 % of the time per submission goes (issue 53).", "",
        heading, "", markdown_table, ""])


if __name__ == "__main__":
    sys.exit(main())
