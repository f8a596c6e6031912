"""A/B of grading time on this machine: the demo class graded by two trees of the course, alternated.

Usage::

    python scripts/bench_autograde_cpu.py [--before-commit COMMIT] [--layer-base COMMIT] [--rounds 3] [--copies 3]
        [--lab lab1] [--out reports/...md] [--from-json PATH --after-commit COMMIT]

``--before-commit`` (default: where this branch leaves ``main``, so that both trees hold the same labs) checks that
commit out as a ``git worktree`` beside this repository (``--before``, default
``../<repo>-before``; kept for later runs). Each round grades the demo class (``course demo``'s three submissions:
the reference solution, the blank release and a partial one, each ``--copies`` times under other names, so that a
worker grades a row of submissions as in a real class) once with each tree, each tree with its own ``course``
package, ``nbgrader_config.py`` and lab, into a fresh SQLite course under /tmp, in a child process started in that
tree (``python -c`` with ``PYTHONPATH`` set to it). The order of the two trees alternates from round to round, so the
load of other work on the machine weighs on both. The demo's scores are checked: a run whose scores differ from
the demo's expected ones is reported as failed. The machine's load average (1 minute) is recorded before and after
every run. The time per submission is the whole ``grade_lab`` call divided by the number of submissions: with the
speed layer a submission's own process starts before its turn, so its own time says less.

``--layer-base COMMIT`` adds a third tree, this tree without its speed layer (nbgrader processes forked from a
server that imported nbgrader and the lab's libraries once; each worker starts the next submission's nbgrader
process ahead, which loads the modules of the lab's locked cells in its kernel, freezes them out of the garbage
collector's walk and is held before its first student cell until its turn; a kernel's thread pools leave it one
CPU; nbgrader processes skip the interpreter's teardown), checked out beside the other two (``../<repo>-layer-base``): what the layer saves is the
difference between it and this tree, in the same rounds. ``--from-json PATH`` writes the report again from the runs
a run saved, grading nothing.

It also times, alternated in the same way, what the one speed measure kept in ``course.nbgrader_child`` saves:
importing nbgrader with and without ``rfc3987_syntax`` marked absent.

Writes the Markdown report (default ``reports/grading-time-cpu-2core.md``; every run is in it) and the runs as JSON
under /tmp.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in the tree being measured (its cwd and PYTHONPATH): grade the demo class, print one JSON line.
DRIVER = r"""
import json, shutil, sys, time
from pathlib import Path
from course.demo import demo_class, mismatches
from course.grade import grade_lab
from course.nbgrader_run import make_course_dir
root, course, lab = Path.cwd(), Path(sys.argv[1]), sys.argv[2]
make_course_dir(course, [lab], root)
expected = demo_class(lab, root, course)
for student in list(expected):
    for copy in range(2, int(sys.argv[3]) + 1):
        shutil.copytree(course / "submitted" / student, course / "submitted" / f"{student}-{copy}")
        expected[f"{student}-{copy}"] = expected[student]
start = time.perf_counter()
outcomes, scores = grade_lab(course, lab, sorted(expected), out_dir=course / "grading" / lab, progress=False)
print(json.dumps({"wall_s": time.perf_counter() - start,
                  "autograde_s": {s: o.seconds for s, o in outcomes.items()},
                  "status": {s: o.status for s, o in outcomes.items()},
                  "mismatches": mismatches(expected, scores)}))
"""
IMPORT = "import sys\n{skip}import nbformat, jsonschema, nbgrader.apps.nbgraderapp\n"
SKIP = "sys.modules['rfc3987_syntax'] = None\n"


def ensure_worktree(folder: Path, commit: str) -> None:
    if not folder.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), commit], check=True)
    subprocess.run(["git", "-C", str(folder), "checkout", "-q", "--detach", commit], check=True)


def grade_demo(tree: Path, lab: str, copies: int) -> dict:
    """Grade the demo class with ``tree``'s code; its JSON line, plus the tree and the load average around it."""
    course = Path(tempfile.mkdtemp(prefix="bench-demo-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load_before = os.getloadavg()[0]
    try:
        done = subprocess.run([sys.executable, "-c", DRIVER, str(course / "class"), lab, str(copies)], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(course, ignore_errors=True)
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"tree": str(tree), "load": load, "error": (done.stderr or done.stdout)[-2000:]}
    return {"tree": str(tree), "load": load, **json.loads(lines[-1])}


def time_import(skip: bool) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT.format(skip=SKIP if skip else "")], check=True)
    return time.perf_counter() - start


def per_submission(run: dict) -> float:
    """The whole grade_lab call's seconds per submission graded."""
    return run["wall_s"] / len(run["autograde_s"]) if run.get("autograde_s") else float("nan")


def report(args, runs: list[dict], imports: list[dict]) -> list[str]:
    names = [name for name in ("before", "layer base", "after") if any(r["name"] == name for r in runs)]
    by_tree = {name: [r for r in runs if r["name"] == name] for name in names}
    med = {name: statistics.median(per_submission(r) for r in rs) for name, rs in by_tree.items()}
    size = max((len(r.get("autograde_s", {})) for r in runs), default=0)
    imp = {key: statistics.median(i[key] for i in imports) for key in ("with_s", "skipped_s")} if imports else {}
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, no GPU"
    loads = [x for r in runs for x in r.get("load", [])]
    layer = (f" --layer-base {args.layer_base}" if args.layer_base else "")
    lines = [
        f"# Grading time on CPU: {args.lab}'s demo class, before and after (issue 38)", "",
        f"Measured by `python scripts/bench_autograde_cpu.py --before-commit {args.before_commit}{layer} --rounds "
        f"{args.rounds} --copies {args.copies}` ({args.rounds_done} of {args.rounds} rounds finished) on {machine}, a machine shared with other "
        f"work (load average over 1 minute {min(loads, default=float('nan')):.2f} to "
        f"{max(loads, default=float('nan')):.2f} around the runs; the trees take turns in an order that rotates round by "
        f"round so all meet it). Each run grades the demo class (reference, blank, partial), each {args.copies} times: "
        f"{size} submissions, into a fresh SQLite course with one worker, sandboxed where bubblewrap works. The time per "
        "submission is the whole `grade_lab` call (the gradebook's preparation included) over the submissions.", "",
        f"- before: commit {args.before_commit}",
        *([f"- layer base: commit {args.layer_base} (this branch without the speed layer)"] if args.layer_base else []),
        f"- after: commit {args.after_commit}" + (" (with the speed layer)" if args.layer_base else ""), "",
        "| round | tree | per submission (s) | whole grade_lab call (s) | load before, after | statuses | "
        "demo scores |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        status = ", ".join(sorted(set(r.get("status", {}).values()))) or "error"
        scores = "as expected" if r.get("mismatches") == [] else ("; ".join(r.get("mismatches") or []) or "error")
        load = ", ".join(f"{x:.2f}" for x in r.get("load", []))
        lines.append(f"| {r['round']} | {r['name']} | {per_submission(r):.1f} | {r.get('wall_s', float('nan')):.1f} | "
                     f"{load} | {status} | {scores} |")
    lines += ["", f"Median per submission: before **{med['before']:.1f} s**, after **{med['after']:.1f} s** "
              f"(after / before = **{med['after'] / med['before']:.2f}x**; the issue's target: at most 1.3x)."]
    if args.rounds_done < 2:
        lines += ["", "With one round finished the order of the trees never rotated and each tree ran once: these are "
                  "single samples on a loaded machine, not medians of alternated runs."]
    if "layer base" in med:
        saved = 1 - med["after"] / med["layer base"]
        verdict = ("kept" if saved >= 0.2 else
                   "not kept (a layer must save at least 20 %): the branch grades without it, as the layer-base tree "
                   f"does, at {med['layer base'] / med['before']:.2f}x the before tree's time per submission")
        lines += ["", "The speed layer (nbgrader processes are forked from a server that imported nbgrader and the "
                  "lab's libraries once; each worker starts the next submission's nbgrader process ahead, which loads "
                  "the modules of the lab's locked cells in its kernel, freezes them out of the garbage collector's walk "
                  "and is held before its first student cell until its turn; a kernel's thread pools leave it one CPU; "
                  "nbgrader processes skip the interpreter's teardown): median "
                  f"per submission without it (layer base) **{med['layer base']:.1f} s**, with it (after) **{med['after']:.1f} s**: it saves "
                  f"**{saved:.0%}**; {verdict}."]
    if imp:
        lines += ["", "The one speed measure kept (`course/nbgrader_child.py`: `rfc3987_syntax` marked absent before "
                  "nbgrader is imported), timed as `python -c 'import nbformat, jsonschema, nbgrader.apps.nbgraderapp'` "
                  f"with and without it, alternated, {len(imports)} times each: median {imp['with_s']:.1f} s with the "
                  f"package imported, {imp['skipped_s']:.1f} s without; a run pays it twice (the fork server and "
                  "the process of `course grade` itself)."]
    return lines


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def dirty(tree: Path) -> bool:
    return bool(subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "course", "nbgrader_config.py"],
                               capture_output=True, text=True).stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-commit", help="the commit to compare with (default: git merge-base HEAD main)")
    parser.add_argument("--before", type=Path, default=REPO.parent / f"{REPO.name}-before",
                        help="where that commit's worktree is (made when missing)")
    parser.add_argument("--layer-base", help="this branch's commit before its speed layer (adds that tree)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=3, help="how many times the class holds each demo submission")
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "grading-time-cpu-2core.md")
    parser.add_argument("--from-json", type=Path, help="write the report from the runs an earlier run saved, grading "
                        "nothing (--before-commit, --layer-base and --after-commit say which trees they were)")
    parser.add_argument("--after-commit", help="with --from-json: the commit the 'after' runs graded with")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        args.rounds_done = max((r["round"] for r in saved["runs"]), default=0)
        args.out.write_text("\n".join(report(args, saved["runs"], saved["imports"])) + "\n")
        print(f"wrote {args.out}")
        return 0
    args.after_commit = commit_of(REPO) + (" + uncommitted changes" if dirty(REPO) else "")
    args.before_commit = args.before_commit or subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "HEAD", "main"], capture_output=True, text=True, check=True).stdout.strip()[:7]
    ensure_worktree(args.before, args.before_commit)
    trees = {"before": args.before, "after": REPO}
    if args.layer_base:
        trees["layer base"] = REPO.parent / f"{REPO.name}-layer-base"
        ensure_worktree(trees["layer base"], args.layer_base)
    runs, imports = [], []
    for round_ in range(1, args.rounds + 1):
        names = list(trees)
        shift = (round_ - 1) % len(names)
        order = names[shift:] + names[:shift]
        for name in order:
            run = {"round": round_, "name": name, **grade_demo(trees[name], args.lab, args.copies)}
            runs.append(run)
            print(f"round {round_} {name}: {per_submission(run):.1f} s per submission, "
                  f"{run.get('wall_s', float('nan')):.1f} s in all, {run.get('mismatches', run.get('error'))}", flush=True)
        first, second = (True, False) if round_ % 2 else (False, True)
        timed = {first: time_import(first), second: time_import(second)}
        imports.append({"skipped_s": timed[True], "with_s": timed[False]})
        args.rounds_done = round_
        lines = report(args, runs, imports)  # after every round: a run cut short still leaves its finished rounds
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        Path(tempfile.gettempdir(), args.out.stem + ".json").write_text(json.dumps({"runs": runs, "imports": imports},
                                                                                  indent=1))
    print("\n".join(lines[-3:]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
