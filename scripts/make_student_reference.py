"""Write each lab's student reference ``labs/<lab>/measured_runs.md``: what the lab's measuring cells printed in the
course's committed runs, for students without that hardware (issue 52).

Sources: the teaching-scale run on the course's GPU (``course.common.paths.TEACHING_RUNS``: ``<lab>_executed.ipynb`` and
``<lab>_run.json``, made
by ``scripts/gpu/run_reports.sh``) and the cpu-scale run on the 2-core machine
(``reports/cpu-2core/<lab>-cpu_executed.ipynb`` and ``<lab>-cpu_run.json``, made by ``scripts/run_cpu_scale.py``).
``python -m course build`` copies the file into ``source/<lab>/``, nbgrader into ``release/<lab>/``, so it is in the
bundle (and the Colab cell fetches it) beside the notebook.

Which cells (the rule, docs/AUTHORING.md "The student reference"): the printed output of every code cell of a run,
except
- graded cells and solution cells (outputs of autograded tests and of answers), cells whose grade id names a test
  (``*_tests``: self-checks of optional questions) and cells tagged ``test-helpers``;
- the cells listed in ``EXCLUDED`` below, by a piece of their source: cells that print answers, values the reference
  solution computes on the hidden tests' inputs or that a model answer checks; ``REDACTED`` cuts such columns and
  lines out of a cell that prints measurements beside them;
- what is not a result: standard error (warnings), progress bars, figures (each is named, not shown: the numbers it
  draws are printed beside it).
Nothing else of the notebooks is copied: no source, no markdown. ``course.cli.lint.check_reference_leaks`` then checks the
written text for answer leaks, and this script refuses to write a reference that fails it.

Usage: ``python scripts/make_student_reference.py [lab ...]`` (all labs by default), after committing new runs;
``--check`` writes nothing and exits 1 when a committed reference differs from what it would write.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import nbformat  # noqa: E402

from course.cli.lint import check_reference_leaks  # noqa: E402
from course.common.notebooks import grade_id, is_graded, is_solution, read_notebook  # noqa: E402
from course.common.paths import (  # noqa: E402
    STUDENT_REFERENCE,
    TEACHING_GPU,
    TEACHING_RUNS,
    discover_labs,
    release_notebook_path,
    source_notebook_path,
)

RUNS = (  # (title, executed notebook, run record); a run that is not committed is left out
    (f"On the course's {TEACHING_GPU}, teaching scale", f"{TEACHING_RUNS}/{{lab}}_executed.ipynb",
     f"{TEACHING_RUNS}/{{lab}}_run.json"),
    ("On a 2-core CPU, cpu scale", "reports/cpu-2core/{lab}-cpu_executed.ipynb", "reports/cpu-2core/{lab}-cpu_run.json"),
)
# lab -> {a piece of a cell's source: why its output is left out}. A cell that prints nothing but what a hidden test
# checks or a model answer derives (the reference solution's values on the hidden tests' inputs) goes here.
EXCLUDED: dict[str, dict[str, str]] = {
    "lab1": {},
    "lab2": {
        "eager_round_trips = einsum_round_trips": "its round_trips column is Question 3.2's einsum_round_trips less one, "
                                                  "which a hidden test checks",
    },
    "lab3": {
        "T4_PEAK_FLOPS_PER_S": "its tables are the reference solution's counts, roofline times and breakdowns on the T4, "
                               "the hidden cases of Questions 3.2, 4.2, 5.1 and 6.1",
        "gpt2_predicted": "its predicted columns are Question 5.1's hidden cases on the course's GPU (the cell before prints "
                          "the measured times)",
        "a100_case": "it computes (measures nothing) Questions 2.2 and 2.7's answers on (16, 16384, 4096, 16), a hidden "
                     "case of Question 2.2",
    },
}
# lab -> {a piece of a cell's source: (columns of its printed tables, lines matching a pattern, why)}: a cell that
# prints measurements beside answers keeps the measurements; the answers' columns and lines are cut out.
REDACTED: dict[str, dict[str, tuple[tuple[str, ...], str | None, str]]] = {
    "lab2": {
        "def relu_matmul(": (("eager_MB", "fused_MB", "predicted_speedup"), None,
                             "Questions 1.1 and 1.2's bytes and predicted speedup at n = 2048, 8192 and (4096, 64), "
                             "their hidden cases"),
        "def chain(a, b, c)": (("intensity_flop_per_byte",), r"GFLOP per call",
                               "Questions 2.2 and 2.3's FLOPs and intensity at SEQ = 10000, KV_HEAD = 128, their hidden "
                               "cases"),
        "def chain_no_relu_right(": ((), r"^FLOPs: ", "Question 2.2's FLOPs at SEQ = 10000, KV_HEAD = 128, a hidden case"),
    },
}
PROGRESS_RE = re.compile(r"^\s*[^\n]*:\s*\d+%\|.*\|")  # a tqdm bar
# The environment report's "Run time:" line quotes the record committed before the run (assets/run_times.json), not
# what the run measured; each run's own time heads its section.
EARLIER_RECORD_RE = re.compile(r"^Run time: ")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def printed(cell) -> tuple[str, int]:
    """What a cell printed (standard output, displayed text; no warnings, progress bars or figure reprs), and how
    many figures it drew."""
    parts, figures = [], 0
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "stream":
            if output.get("name") == "stdout":
                parts.append(_text(output.get("text")))
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "image/png" in data or "image/svg+xml" in data:
                figures += 1
                continue
            text = _text(data.get("text/plain"))
            if text.startswith("<Figure") or PROGRESS_RE.match(text) or "it/s]" in text or "s/it]" in text:
                continue
            parts.append(text + "\n")
    text = ANSI_RE.sub("", "".join(parts))
    lines = [line.rstrip() for line in text.splitlines()
             if not PROGRESS_RE.match(line) and not EARLIER_RECORD_RE.match(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n"), figures


def excluded_because(lab: str, cell) -> str | None:
    """Why a code cell's output stays out of the reference, or None when it goes in."""
    gid = grade_id(cell) or ""
    if is_graded(cell) or is_solution(cell):
        return "a graded or solution cell"
    if gid.endswith("_tests"):
        return "a self-check"
    if "test-helpers" in cell.get("metadata", {}).get("tags", []):
        return "test helpers"
    for piece, why in EXCLUDED.get(lab, {}).items():
        if piece in cell.source:
            return why
    return None


def drop_columns(text: str, names: tuple[str, ...]) -> str:
    """``text`` with the named columns cut out of every table printed right-aligned (as pandas prints them): a
    column spans from the end of the header word before it to the end of its name, in its header line and in every
    line below it up to the next blank line."""
    lines = text.split("\n")
    for name in names:
        pattern = re.compile(rf"(?<!\S){re.escape(name)}(?!\S)")
        for index, line in enumerate(lines):
            match = pattern.search(line)
            if not match:
                continue
            start = len(line[:match.start()].rstrip())
            end = match.end()
            row = index
            while row < len(lines) and lines[row].strip():
                lines[row] = lines[row][:start] + lines[row][end:]
                row += 1
    return "\n".join(lines)


def redact(lab: str, cell, text: str) -> tuple[str, str]:
    """A cell's printed text less the columns and lines ``REDACTED`` lists for it, and a note saying what was cut
    ("" when nothing was)."""
    cut = []
    for piece, (columns, line_pattern, _) in REDACTED.get(lab, {}).items():
        if piece in cell.source:
            shorter = drop_columns(text, columns)
            cut += [f"the column {name}" for name in columns if name in text]
            if line_pattern:
                kept = [line for line in shorter.split("\n") if not re.search(line_pattern, line)]
                cut += ["a line of counts"] if len(kept) < len(shorter.split("\n")) else []
                shorter = "\n".join(kept)
            text = shorter
    note = (f"(Left out here: {', '.join(cut)}. They are answers to the lab's questions, which your notebook computes "
            "with your own functions.)") if cut else ""
    return text, note


def first_code_line(source: str) -> str:
    for line in source.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped[:90]
    return ""


def fence(text: str) -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}\n{text}\n{ticks}"


def run_summary(lab: str, record: dict, run_path: str) -> list[str]:
    tr = record.get("teaching_run", {})
    machine = record.get("machine", {})
    device = record.get("device", "?")
    where = device if device != "cpu" else f"CPU ({machine.get('cpu', 'model not recorded')}, {tr.get('cpus')} cores)"
    lines = [f"Every cell ran top to bottom at {tr.get('scale', '?')} scale on {where}, torch {record.get('torch', '?')}, "
             f"in {tr.get('total_s', 0):.0f} s ({len(tr.get('errors', []))} cell(s) raised)."]
    load = machine.get("load_average_while_running")
    if load:
        lines[-1] += (f" Other work shared the machine: its load average was {load['min']:g} to {load['max']:g} "
                      f"(mean {load['mean']:g}) on {machine.get('cpus')} cores while the lab ran, so an idle machine is "
                      f"faster; torch.compile's caches were {machine.get('compile_caches', '?')} "
                      "(cold: every compile paid in full, as on your first run).")
    elif tr.get("load_average"):
        before, after = tr["load_average"]
        lines[-1] += f" Load average {before:g} before and {after:g} after, on {tr.get('cpus')} CPUs."
    lines += ["", "| part | seconds |", "| --- | --- |"]
    lines += [f"| {part} | {seconds:.1f} |" for part, seconds in tr.get("parts_s", {}).items()]
    lines += ["", f"(Record: `{run_path}` in the course repository.)"]
    return lines


def reference_text(lab: str, root: Path = REPO) -> str | None:
    """The reference's markdown, or None when no run of the lab is committed."""
    title = lab.replace("lab", "Lab ")
    out = [f"# {title}: measured runs", "",
           f"What the course measured when it ran `{lab}.ipynb` top to bottom: the printed output of the cells that "
           "measure (timings, sweeps, tables, profiles), without the outputs of tests and answers. Read it when a "
           f"question asks for numbers your machine cannot produce (a GPU's, or the {TEACHING_GPU}'s), and say in your answer that "
           "you took them from here. Each section names the heading the cell sits under and its first line of code.", "",
           "Generated by `scripts/make_student_reference.py` from the course's committed runs; do not edit.", ""]
    found = False
    for run_title, notebook_pattern, record_pattern in RUNS:
        notebook, record_path = root / notebook_pattern.format(lab=lab), root / record_pattern.format(lab=lab)
        if not notebook.is_file():
            continue
        found = True
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        out += [f"## {run_title}", "", *run_summary(lab, record, record_pattern.format(lab=lab)), ""]
        nb = nbformat.read(notebook, as_version=4)
        headings: dict[int, str] = {}
        last_place = None
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                for line in cell.source.splitlines():
                    match = HEADING_RE.match(line)
                    if match:
                        level = len(match.group(1))
                        headings = {k: v for k, v in headings.items() if k < level}
                        headings[level] = match.group(2).replace("*", "")
                continue
            if cell.cell_type != "code" or excluded_because(lab, cell):
                continue
            text, figures = printed(cell)
            text, note = redact(lab, cell, text)
            if not text and not figures:
                continue
            place = " > ".join(headings[level] for level in sorted(headings)) or "Setup"
            if place != last_place:
                out += [f"### {place}", ""]
                last_place = place
            out.append(f"The cell starting `{first_code_line(cell.source)}`:")
            out += ["", fence(text)] if text else []
            if note:
                out += ["", note]
            if figures:
                out += ["", f"(It also drew {figures} figure(s), not shown here: they plot the numbers printed above; "
                        "the notebook draws them on your machine.)"]
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n" if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("labs", nargs="*")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a reference is stale")
    args = parser.parse_args()
    status = 0
    for lab in args.labs or discover_labs(REPO):
        text = reference_text(lab)
        target = REPO / "labs" / lab / STUDENT_REFERENCE
        if text is None:
            print(f"{lab}: no committed run, no {STUDENT_REFERENCE}")
            continue
        release = release_notebook_path(REPO, lab)
        shown = "\n".join(path.read_text() for path in sorted(release.parent.glob("*.py")))  # utils.py, checks.py
        problems = check_reference_leaks(lab, read_notebook(source_notebook_path(REPO, lab)), read_notebook(release),
                                         text, shown)
        if problems:
            print(f"{lab}: the reference would leak answers; add the cell to EXCLUDED:\n  "
                  + "\n  ".join(str(p) for p in problems))
            status = 1
            continue
        if args.check:
            if not target.is_file() or target.read_text() != text:
                print(f"{lab}: {target.relative_to(REPO)} is out of date: run scripts/make_student_reference.py {lab}")
                status = 1
            continue
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
            print(f"{lab}: wrote {target.relative_to(REPO)} ({len(text.splitlines())} lines)")
        else:
            print(f"{lab}: {target.relative_to(REPO)} unchanged")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
