"""Grading time per submission of this tree against an earlier commit's, lab by lab, on this machine.

Usage: ``python scripts/compare_grading_cost.py --commit bfcf140 --rounds 2 --tag cpu-2core``. ``--commit`` writes
that commit's tree into ``--baseline`` (default ``.baseline``, git-ignored) with ``git archive`` (``--write-only``: and stops there); without it the
baseline folder must already hold a tree. Where grading kernels run in the bubblewrap sandbox, put the baseline outside
this repository (``--baseline /tmp/baseline``): the sandbox of bfcf140 hides the folders of a course's repository
from its kernels, and a baseline inside this one then cannot start a kernel.

Each round grades each lab's reference solution once with each tree's own ``scripts/bench_grading_breakdown.py``
(plain ``nbgrader autograde`` as ``course grade`` runs it, in a fresh SQLite course, each tree with its own
``course`` package, labs and ``utils.py``); the order of the two trees alternates from round to round so that
neither always runs on a machine warmed by the other. Writes ``reports/grading-cost-<tag>.md`` and ``.json``: the
seconds of every run, the median per tree and lab, and their ratio (this tree / baseline).

On the lent GPU machine the baseline tree travels as an ignored path (``carry: [".whl", ".baseline"]``) and
``scripts/gpu/run_reports.sh compare`` runs this script there (write the tree first here:
``python scripts/compare_grading_cost.py --commit bfcf140 --write-only``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from bench_grading_throughput import machine_description  # noqa: E402

STEPS = ("start-up (nbgrader, settings, kernel start, guard)", "between cells (guard checks, grader requests)",
         "after the last cell (scoring, gradebook)")


def write_tree(commit: str, folder: Path) -> None:
    """``commit``'s files in ``folder`` (emptied first), and its full hash in ``folder/COMMIT``."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", full], cwd=REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    (folder / "COMMIT").write_text(full[:7] + "\n")


def grade_once(tree: Path, lab: str) -> dict[str, float]:
    """One autograde of ``lab``'s reference by ``tree``'s own breakdown benchmark; its steps in seconds."""
    with tempfile.TemporaryDirectory(prefix="grading-cost-") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        result = subprocess.run([sys.executable, str(tree / "scripts" / "bench_grading_breakdown.py"), "--lab", lab,
                                 "--repeat", "1", "--tag", "compare", "--out", out],
                                cwd=tree, env=env, capture_output=True, text=True, timeout=1200)
        report = Path(out) / "grading-breakdown-compare.json"
        if result.returncode != 0 or not report.is_file():
            raise RuntimeError(f"{tree}: benchmark of {lab} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return json.loads(report.read_text())["runs"][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, default=REPO / ".baseline", help="the earlier tree")
    parser.add_argument("--commit", help="write this commit's tree into --baseline first (needs git)")
    parser.add_argument("--write-only", action="store_true", help="only write the tree (--commit), measure nothing")
    parser.add_argument("--labs", nargs="+", default=["lab1", "lab2", "lab3"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tag", default="cpu", help="names the report: reports/grading-cost-<tag>.md")
    parser.add_argument("--out", type=Path, default=REPO / "reports")
    args = parser.parse_args()
    if args.commit:
        write_tree(args.commit, args.baseline)
        if args.write_only:
            return 0
    if not (args.baseline / "scripts" / "bench_grading_breakdown.py").is_file():
        parser.error(f"{args.baseline} holds no tree with scripts/bench_grading_breakdown.py (use --commit)")
    trees = {"baseline": args.baseline.resolve(), "this tree": REPO}
    runs: list[dict] = []
    for index in range(args.rounds):
        order = list(trees) if index % 2 == 0 else list(reversed(trees))
        for name in order:
            for lab in args.labs:
                steps = grade_once(trees[name], lab)
                runs.append({"round": index + 1, "tree": name, "lab": lab, "steps_s": steps})
                print(f"round {index + 1}, {name}, {lab}: {steps['total']:.1f} s", flush=True)
        stem = write_report(args, trees, runs, index + 1)  # after every round: a run stopped early keeps its rounds
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


def write_report(args, trees: dict[str, Path], runs: list[dict], rounds: int) -> Path:
    """``reports/grading-cost-<tag>.md`` and ``.json`` from the runs of the first ``rounds`` rounds."""
    medians = {name: {lab: statistics.median(r["steps_s"]["total"] for r in runs if r["tree"] == name
                                             and r["lab"] == lab) for lab in args.labs} for name in trees}
    baseline_label = (args.baseline / "COMMIT").read_text().strip() if (args.baseline / "COMMIT").is_file() else str(
        args.baseline)
    lines = [
        f"# Grading time per submission, this tree against {baseline_label} ({args.tag})", "",
        f"Measured by `scripts/compare_grading_cost.py --rounds {rounds} --tag {args.tag}` on "
        f"{machine_description()}: each lab's reference solution graded by plain `nbgrader autograde` at quick scale "
        "(each tree's own `scripts/bench_grading_breakdown.py --repeat 1`, so each tree grades its own version of the "
        "labs), the two trees alternating. Seconds.", "",
        "| round | tree | " + " | ".join(args.labs) + " |", "| --- | --- | " + " | ".join("---" for _ in args.labs) + " |",
    ]
    for index in range(rounds):
        for name in trees:
            row = [f"{r['steps_s']['total']:.1f}" for lab in args.labs for r in runs
                   if r["round"] == index + 1 and r["tree"] == name and r["lab"] == lab]
            lines.append(f"| {index + 1} | {name} | " + " | ".join(row) + " |")
    for name in trees:
        lines.append(f"| median | {name} | " + " | ".join(f"{medians[name][lab]:.1f}" for lab in args.labs) + " |")
    lines.append("| ratio | this tree / baseline | " + " | ".join(
        f"{medians['this tree'][lab] / medians['baseline'][lab]:.2f}" for lab in args.labs) + " |")
    lines += ["", "Median seconds of the steps that the grading boundary and guard change:", "",
              "| step | tree | " + " | ".join(args.labs) + " |", "| --- | --- | " + " | ".join("---" for _ in args.labs) + " |"]
    for step in STEPS:
        for name in trees:
            cells = [statistics.median(r["steps_s"].get(step, 0.0) for r in runs if r["tree"] == name
                                       and r["lab"] == lab) for lab in args.labs]
            lines.append(f"| {step} | {name} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    lines += ["", "Hidden tests ran in the kernel before the grading boundary (their time is in the cells' rows there) "
              "and in the grader after it (their time is in `between cells`); compare totals."]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"grading-cost-{args.tag}"
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine_description(), "baseline": baseline_label,
                                                     "runs": runs, "median_total_s": medians}, indent=1))
    return stem


if __name__ == "__main__":
    sys.exit(main())
