"""Command line: ``python -m course {build,lint,check,bundle,grade,feedback,measure,solutions,demo} ...``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common.paths import REPO_ROOT, resolve_labs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m course", description="Efficient AI Labs course tooling.")
    sub = parser.add_subparsers(dest="command", required=True)

    for name, text in [("build", "labs/labN/labN.py -> source/labN/ -> release/labN/ (idempotent)"),
                       ("lint", "static checks only: metadata, points, leaks, up to date"),
                       ("check", "pre-release gate: lint, autograde reference (full marks) and blank (zero), order of grades")]:
        sub.add_parser(name, help=text).add_argument("labs", nargs="*", help=f"labs to {name} (default: all)")

    p = sub.add_parser("bundle", help="what students get: OUT/labN/ (for a student repository) and OUT/labN.zip (for an LMS)")
    p.add_argument("labs", nargs="*", help="labs to bundle (default: all)")
    p.add_argument("--out", type=Path, required=True, help="folder to write the bundles into (outside labs/, source/, release/)")

    p = sub.add_parser("grade", help="autograde every submission in submitted/<student>/<lab>/")
    p.add_argument("lab")
    p.add_argument("--student", action="append", help="grade only this student (repeatable)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="time limit per submission in seconds, from its turn (default 900)")
    p.add_argument("--workers", type=int, default=1, help="submissions graded at once (one per GPU or CPU core)")
    p.add_argument("--shard", help="grade only shard i of n (i/n, from 0): for cluster job arrays")
    p.add_argument("--resume", action="store_true", help="keep submissions an earlier (killed) run already graded")
    p.add_argument("--report", action="store_true",
                   help="grade nothing: rewrite grading/LAB/grades.csv and scores.png from the gradebook (manual points "
                        "included), and write grading/LAB/canvas.csv for Canvas's gradebook import")
    p.add_argument("--roster", type=Path,
                   help="with --report: CSV mapping student_id to Canvas's Student, ID, SIS User ID, SIS Login ID, Section")
    p.add_argument("--canvas-assignment-id",
                   help="with --report: the Canvas assignment's id, so canvas.csv's column reads 'Lab 1 (ID)'")
    p.add_argument("--force", action="store_true",
                   help="with --report: write the reports even while answers wait for a TA (their rows have no final "
                        "score, and canvas.csv leaves it empty)")
    p.add_argument("--course-dir", type=Path, default=REPO_ROOT,
                   help="nbgrader course folder holding nbgrader_config.py, source/ and submitted/ (default: this repository)")

    p = sub.add_parser("feedback", help="generate feedback HTML for graded submissions and release it")
    p.add_argument("lab")
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p.add_argument("--exchange", help="nbgrader exchange folder to release feedback into (optional)")
    p.add_argument("--force", action="store_true", help="generate feedback even where written answers are ungraded")
    p.add_argument("--course-dir", type=Path, default=REPO_ROOT, help="nbgrader course folder (default: this repository)")

    p = sub.add_parser("measure", help="after grade, on the grading GPU: time the lab's declared pieces of every "
                                       "submission that passed their tests; results, leaderboard and feedback pages")
    p.add_argument("lab")
    p.add_argument("--student", action="append", help="only this student (repeatable); the reference is always measured")
    p.add_argument("--workers", type=int, default=1, help="submissions measured at once, one GPU each")
    p.add_argument("--timeout-s", type=float, help="time limit of one check or timing request (default: the piece's)")
    p.add_argument("--report", action="store_true",
                   help="measure nothing: rewrite the leaderboard and feedback pages from grading/LAB/measure.json")
    p.add_argument("--shard", help="measure only shard i of n (i/n, from 0; the reference always): for cluster job "
                                   "arrays; writes grading/LAB/shard-i-of-n/measure.json, which --merge joins")
    p.add_argument("--merge", action="store_true",
                   help="measure nothing: join every shard's results into grading/LAB/measure.json, then write the "
                        "leaderboard and feedback pages")
    p.add_argument("--course-dir", type=Path, default=REPO_ROOT, help="nbgrader course folder (default: this repository)")

    p = sub.add_parser("solutions", help="after the deadline: OUT/labN_solution.ipynb, model solutions without hidden tests or mark schemes")
    p.add_argument("labs", nargs="*", help="labs (default: all)")
    p.add_argument("--out", type=Path, required=True, help="folder to write the solution notebooks into")

    p = sub.add_parser("demo", help="build, grade a demo class (reference, blank, partial) and print the table")
    p.add_argument("--lab", default="lab1")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "build":
        from .cli import build
        return build.main(resolve_labs(args.labs))
    if args.command in ("lint", "check"):
        from .cli import check
        return check.main(resolve_labs(args.labs), execute=args.command == "check")
    if args.command == "bundle":
        from .cli import bundle
        return bundle.main(resolve_labs(args.labs), args.out)
    if args.command == "solutions":
        from .cli import solutions
        return solutions.main(resolve_labs(args.labs), args.out)
    if args.command == "grade":
        from .cli import grade
        return grade.main(args.lab, args.course_dir.resolve(), args.student, args.timeout_s,
                          workers=args.workers, shard=args.shard, resume=args.resume, report_only=args.report,
                          roster=args.roster, canvas_assignment_id=args.canvas_assignment_id, force=args.force)
    if args.command == "feedback":
        from .cli import feedback
        return feedback.main(args.lab, args.course_dir.resolve(), args.student, args.exchange, args.force)
    if args.command == "measure":
        from .cli import measure
        return measure.main(args.lab, args.course_dir.resolve(), args.student, args.workers, args.timeout_s,
                            report_only=args.report, shard=args.shard, merge=args.merge)
    if args.command == "demo":
        from .cli import demo
        return demo.main(resolve_labs([args.lab])[0])
    return 2


if __name__ == "__main__":
    sys.exit(main())
