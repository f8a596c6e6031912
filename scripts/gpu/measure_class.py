"""The GPU report of ``course measure`` (run by scripts/gpu/run_measure.sh on a lent GPU): a course folder with the
reference and four prepared submissions per lab (scripts/gpu/measure_variants.py), recorded in the gradebook as
having passed the measured pieces' tests (tests/measure_class.py: no autograde run, to save GPU time), then
``python -m course measure LAB`` for each lab; writes OUT/measure-report.md, each lab's measure.json, the lab 2
leaderboard page and the roofline figure a student gets.

Usage: python3 scripts/gpu/measure_class.py --out DIR [--timeout-s 20] [--workers N] [labs...]
"""
from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(Path(__file__).parent)]

from measure_class import write_graded_class  # noqa: E402
from measure_variants import variants  # noqa: E402

from course.cli.nbgrader_run import make_course_dir  # noqa: E402

FIGURE_STUDENT = "slow"  # whose feedback page's figure the report shows


def _fmt(value, digits=3):
    return "" if value is None else f"{value:.{digits}g}"


def lab_section(results: dict, elapsed_s: float) -> list[str]:
    metric = {p: info["metric"] for p, info in results["pieces"].items()}
    roof = results["roofline"]
    lines = [f"## {results['lab']}", "",
             f"Card: **{results['gpu']}**. Measured roof (this run): {roof['bandwidth_tb_s']:.3g} TB/s copy bandwidth, "
             + ", ".join(f"{t:.3g} TFLOP/s {d} matmul" for d, t in sorted(roof["matmul_tflops"].items()))
             + f". Whole command: {elapsed_s:.0f} s for {len(results['seconds'])} measured submissions "
             "(reference included), per submission: "
             + ", ".join(f"{s} {t:.0f} s" for s, t in results["seconds"].items()) + ".", "",
             "| submission | piece | shape | status | ms (median) | rate | share of roof | rel. error | reason |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in results["rows"]:
        rate = row["tflops"] if metric[row["piece"]] == "tflops" else row["gbps"]
        unit = "TFLOP/s" if metric[row["piece"]] == "tflops" else "GB/s"
        share = f"{row['roof_share']:.1%}" if row["roof_share"] else ""
        reason = re.sub(r"\s+", " ", row["reason"])[:120].replace("|", "/")
        lines.append(f"| {row['student']} | {row['piece']} | {row['label']} | {row['status']} | {_fmt(row['ms'])} | "
                     f"{_fmt(rate)} {unit if rate else ''} | {share} | {_fmt(row['rel_err'], 2)} | {reason} |")
    return [*lines, ""]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("labs", nargs="*", default=["lab1", "lab2", "lab3"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout-s", default="lab1=15,lab2=20,lab3=40",
                        help="limit of one request, per lab (LAB=S,...) or for all (S)")
    parser.add_argument("--course", type=Path, default=Path("/tmp/measure-course"))
    parser.add_argument("--workers", type=int, default=1, help="submissions measured at once, one GPU each")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.course, ignore_errors=True)
    course = make_course_dir(args.course, args.labs, REPO)
    limits = dict(item.split("=") for item in args.timeout_s.split(",")) if "=" in args.timeout_s else {}
    report = ["# `course measure` on a lent GPU", "",
              "Made by `scripts/gpu/run_measure.sh` (scripts/gpu/measure_class.py): the reference and four prepared "
              "submissions per lab (scripts/gpu/measure_variants.py: `slow` correct but slower, `wrong` wrong at the "
              "larger shapes, `hang` never returns there, `fault` a CUDA fault there), recorded in the gradebook as "
              "having passed the measured pieces' tests, then `python -m course measure LAB --timeout-s S "
              f"--workers {args.workers}` (S per lab: {args.timeout_s}; one GPU per worker). One run each; times are "
              "one-off measurements on the card named in each section.",
              ""]
    for lab in args.labs:
        write_graded_class(course, lab, variants(course / "source", lab))
        start = time.monotonic()
        command = [sys.executable, "-m", "course", "measure", lab, "--course-dir", str(course),
                   "--timeout-s", limits.get(lab, args.timeout_s), "--workers", str(args.workers)]
        result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        elapsed = time.monotonic() - start
        (args.out / f"{lab}-measure.log").write_text(result.stdout + result.stderr)
        print(result.stdout[-4000:], result.stderr[-2000:], flush=True)
        results_path = course / "grading" / lab / "measure.json"
        if result.returncode != 0 or not results_path.exists():
            report += [f"## {lab}", "", f"`course measure {lab}` failed (exit {result.returncode}); log: "
                       f"{lab}-measure.log", ""]
            continue
        results = json.loads(results_path.read_text())
        shutil.copy2(results_path, args.out / f"{lab}-measure.json")
        report += lab_section(results, elapsed)
        page = (course / "feedback" / FIGURE_STUDENT / lab / "measure.html").read_text()
        if found := re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page):
            (args.out / f"{lab}-roofline-{FIGURE_STUDENT}.png").write_bytes(base64.b64decode(found.group(1)))
        if lab == "lab2":
            shutil.copy2(course / "grading" / lab / "leaderboard.html", args.out / "lab2-leaderboard.html")
            shutil.copy2(course / "feedback" / FIGURE_STUDENT / lab / "measure.html", args.out / "lab2-feedback.html")
    (args.out / "measure-report.md").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
