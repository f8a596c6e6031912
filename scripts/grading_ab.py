"""A/B of each speed piece of ``course grade`` (``course/common/speed.py``): grades the demo class (``course demo``'s three
submissions) with every piece on and with each piece off in turn, in alternated rounds, in one command, and prints a
markdown table of the time per submission.

    python scripts/grading_ab.py [--lab lab1] [--rounds 3] [--workers 1] [--report reports/grading-time-cpu-2core.md]

The pieces are ``course/common/speed.py``'s, each switched off through ``EFFICIENT_AI_GRADING_SPEED``. ``--report`` writes the table with the machine, commit and command that made it.

A piece that does not save at least 20 % of the time per submission goes (docs/GRADING.md). Run it on an idle
machine: the table is only as quiet as the machine.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course.cli import build  # noqa: E402
from course.cli.demo import demo_class  # noqa: E402
from course.cli.nbgrader_run import make_course_dir  # noqa: E402
from course.common.speed import SPEED_ENV, SpeedPieces  # noqa: E402

ALL_ON = "every piece on"


def variants() -> dict[str, dict[str, str]]:
    """Variant name -> the environment that makes it."""
    found = {ALL_ON: {}}
    for piece in fields(SpeedPieces):
        found[f"{piece.name} off"] = {SPEED_ENV: f"{piece.name}=off"}
    return found


def grade_seconds(course: Path, lab: str, switches: dict[str, str], workers: int) -> float:
    """Wall-clock seconds of ``course grade LAB`` in ``course`` with the environment ``switches``."""
    env = {**os.environ, **switches,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "course", "grade", lab, "--course-dir", str(course),
                           "--workers", str(workers)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    with (course / "grading" / lab / "grades.csv").open(newline="") as handle:
        statuses = {row["student"]: row["status"] for row in csv.DictReader(handle)}
    if done.returncode != 0 or set(statuses.values()) != {"ok"}:
        raise SystemExit(f"course grade failed with {switches or 'every piece on'} ({statuses}):\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds


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
    args = parser.parse_args(argv)
    if build.main([args.lab], REPO) != 0:
        return 1
    named = variants()
    times: dict[str, list[float]] = {name: [] for name in named}
    with tempfile.TemporaryDirectory(prefix="efficient-ai-ab-") as scratch:
        course = make_course_dir(Path(scratch) / "course", [args.lab], REPO)
        submissions = len(demo_class(args.lab, REPO, course))
        order = list(named)
        for round_number in range(args.rounds):
            for name in order if round_number % 2 == 0 else order[::-1]:  # alternated: drift hits every variant
                times[name].append(grade_seconds(course, args.lab, named[name], args.workers))
                print(f"round {round_number + 1}: {name}: {times[name][-1] / submissions:.1f} s per submission",
                      file=sys.stderr)
            heading = (f"{args.lab}, {submissions} submissions, {args.workers} worker(s), {round_number + 1} "
                       f"alternated round(s), {len(os.sched_getaffinity(0))} CPUs usable:")
            if args.report:  # after every round: a run stopped early (a time limit) still leaves its whole rounds
                args.report.write_text(report_text(args, heading, table(times, submissions)))
    print(heading + "\n\n" + table(times, submissions))
    return 0


def report_text(args, heading: str, markdown_table: str) -> str:
    """The report: what was measured, where and how, then the table and the rule it is read by."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    return "\n".join([
        "# Grading time on CPU: each speed piece of `course grade`, A/B", "",
        f"Made by `python scripts/grading_ab.py --lab {args.lab} --rounds {args.rounds} --workers {args.workers} "
        f"--report ...` at commit {commit}, in one command, on {args.machine or platform.platform()} "
        f"(Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f} at the end). Each round grades `course demo`'s class "
        "(reference, blank, partial) once per variant into the same course folder, variants in alternated order; "
        "the time per submission is the whole `course grade` command over the submissions. A piece that does not "
        "save at least 20 % of the time per submission goes (issue 53).", "",
        heading, "", markdown_table, ""])


if __name__ == "__main__":
    sys.exit(main())
