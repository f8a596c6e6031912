"""Execute a lab's reference notebook at teaching scale and autograde it, timing both; write JSON and figures.

Run from the repository root (scripts/gpu/run_reports.sh does, on the lent GPU):
``python scripts/gpu/run_lab.py lab1 --out DIR``. Writes into DIR:
- ``<lab>_executed.ipynb``: the instructor notebook executed top to bottom at teaching scale;
- ``<lab>_run.json``: wall time per part and per cell, cells that raised, the autograde time of one
  submission (the reference solution, graded as TAs grade it: quick scale);
- ``<lab>_fig_NN.png``: the figures the notebook drew.
With ``--skip-execute`` only the autograde runs, and its record is ``<lab>_autograde.json``. ``--scale cpu``
runs the notebook at cpu scale instead (what a student without a GPU runs; files named ``<lab>-cpu_*``).

``--gpu-memory-gb GB`` (default: ``EFFICIENT_AI_GPU_MEMORY_GB``) caps the kernel's CUDA allocator at GB
(``scripts/gpu/memory_cap.py``) to show how the lab runs on a smaller GPU; the files are then named
``<lab>-capNgb_*`` and the record also holds the cap, the highest reservation seen after a cell and every output
line that reports running out of memory. ``--skip-autograde`` leaves the autograde out.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_cap import CAP_ENV, cap_from_env  # noqa: E402

PART_RE = re.compile(r"^#\s+(Part\s+\d+[^\n]*)", re.MULTILINE)
# Output lines where a lab reports a size that did not fit (a row marked OOM, "(out of memory)", status 'oom').
OOM_LINE_RE = re.compile(r"\bOOM\b|out of memory|'oom'", re.IGNORECASE)
# A legend explaining the notation ("OOM = out of memory", "'nan' = out of memory") reports nothing.
OOM_LEGEND_RE = re.compile(r"\bOOM\s*=|=\s*out of memory", re.IGNORECASE)


def reports_oom(line: str) -> bool:
    """Whether a printed line reports a size that ran out of memory (not a legend of the notation)."""
    return bool(OOM_LINE_RE.search(line)) and not OOM_LEGEND_RE.search(line)


def cell_seconds(cell) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return 0.0
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def oom_lines(cell) -> list[str]:
    """The lines of a cell's printed output that report running out of memory."""
    lines = []
    for output in cell.get("outputs", []):
        text = output.get("text", "") if output.get("output_type") == "stream" else \
            output.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        lines += [line.rstrip() for line in text.splitlines() if reports_oom(line)]
    return lines


def cap_kernel_memory(cap_gb: float, work: Path) -> Path:
    """Make kernels started from now on cap their CUDA memory at cap_gb; return where they record peaks."""
    from memory_cap import write_startup_file

    record = work / "gpu_memory_peaks.json"
    ipython_dir = work / ".ipython"
    write_startup_file(ipython_dir, cap_gb, record)
    os.environ["IPYTHONDIR"] = str(ipython_dir)
    return record


def peak_reserved_gb(record: Path, nb) -> dict:
    """The highest reservation after any cell (GB) and the cell after which it was first seen."""
    if not record.exists():
        return {"peak_reserved_gb": None, "peak_cell_index": None}
    peaks = json.loads(record.read_text())["peak_reserved_bytes_after_cell"]
    count, peak = max(peaks, key=lambda item: item[1])
    index = next((i for i, cell in enumerate(nb.cells) if cell.get("execution_count") == count), None)
    return {"peak_reserved_gb": peak / 1e9, "peak_cell_index": index}


def execute(lab: str, out: Path, timeout_s: int, cap_gb: float | None = None, prefix: str | None = None,
            scale: str = "teaching") -> dict:
    import nbclient

    from course.common.notebooks import grade_id, read_notebook, write_notebook

    prefix = prefix or lab
    nb = read_notebook(REPO / "source" / lab / f"{lab}.ipynb")
    work = Path(tempfile.mkdtemp(prefix=f"{prefix}-{scale}-"))
    shutil.copytree(REPO / "source" / lab, work, dirs_exist_ok=True)
    os.environ["EFFICIENT_AI_SCALE"] = scale
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # figures become notebook outputs
    record = cap_kernel_memory(cap_gb, work) if cap_gb else None
    client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3", allow_errors=True,
                                     record_timing=True, resources={"metadata": {"path": str(work)}})
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    client.execute()
    total_s = time.perf_counter() - start
    write_notebook(nb, out / f"{prefix}_executed.ipynb")

    parts: dict[str, float] = {}
    part = "Setup"
    cells, errors, figures, ooms = [], [], 0, []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            match = PART_RE.search(cell.source)
            if match:
                part = match.group(1).strip()
            continue
        seconds = cell_seconds(cell)
        parts[part] = parts.get(part, 0.0) + seconds
        cells.append({"index": index, "grade_id": grade_id(cell), "part": part, "seconds": seconds})
        ooms += [{"index": index, "grade_id": grade_id(cell), "part": part, "line": line} for line in oom_lines(cell)]
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                errors.append({"index": index, "grade_id": grade_id(cell), "error": f"{output['ename']}: {output['evalue']}"[:500]})
            png = output.get("data", {}).get("image/png") if output.get("output_type") in ("display_data", "execute_result") else None
            if png:
                figures += 1
                (out / f"{prefix}_fig_{figures:02d}.png").write_bytes(base64.b64decode(png))
    result = {"scale": scale, "total_s": total_s, "cpus": os.cpu_count(),  # the load: other work sharing the machine
              "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "parts_s": parts, "cells": cells, "errors": errors, "figures": figures,
              "oom_lines": ooms}
    if record is not None:
        result.update(peak_reserved_gb(record, nb))
    return result


def autograde_reference(lab: str) -> dict:
    from course.cli.grade import grade_lab
    from course.cli.nbgrader_run import make_course_dir
    from course.common.notebooks import make_submission, read_notebook, write_notebook

    course = make_course_dir(Path(tempfile.mkdtemp(prefix=f"{lab}-grade-")), [lab], REPO)
    src = read_notebook(REPO / "source" / lab / f"{lab}.ipynb")
    release = read_notebook(REPO / "release" / lab / f"{lab}.ipynb")
    write_notebook(make_submission(release, src), course / "submitted" / "reference" / lab / f"{lab}.ipynb")
    outcomes, scores = grade_lab(course, lab, ["reference"], progress=False)
    sub = scores.get("reference")
    return {"status": outcomes["reference"].status, "reason": outcomes["reference"].reason,
            "seconds": outcomes["reference"].seconds,
            "autograded_score": sub.autograded_score() if sub else None,
            "autograded_max": sub.autograded_max() if sub else None,
            "cells_short_of_full_marks": [c.grade_id for c in sub.autograded_short()] if sub else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("lab")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--cell-timeout-s", type=int, default=900)
    parser.add_argument("--skip-execute", action="store_true")
    parser.add_argument("--skip-autograde", action="store_true")
    parser.add_argument("--scale", default="teaching", choices=("teaching", "cpu", "quick"),
                        help="the scale the notebook runs at (a CPU student's run: --scale cpu --skip-autograde)")
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help=f"cap the kernel's CUDA allocator at this many GB (default: ${CAP_ENV})")
    args = parser.parse_args()
    cap_gb = args.gpu_memory_gb if args.gpu_memory_gb is not None else cap_from_env()
    prefix = f"{args.lab}-cap{cap_gb:g}gb" if cap_gb else args.lab if args.scale == "teaching" else f"{args.lab}-{args.scale}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"lab": args.lab, "gpu_memory_cap_gb": cap_gb}
    try:
        import torch

        result["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        result["torch"] = torch.__version__
        if torch.cuda.is_available():
            result["device_memory_gb"] = torch.cuda.get_device_properties(0).total_memory / 1e9
    except Exception as exc:  # noqa: BLE001
        result["device"] = f"unknown ({exc})"
    if not args.skip_execute:
        result["teaching_run"] = execute(args.lab, out, args.cell_timeout_s, cap_gb, prefix, args.scale)
        print(f"{prefix}: {args.scale}-scale run {result['teaching_run']['total_s']:.0f} s, "
              f"{len(result['teaching_run']['errors'])} cell(s) raised", flush=True)
        for part, seconds in result["teaching_run"]["parts_s"].items():
            print(f"  {part}: {seconds:.1f} s")
        for error in result["teaching_run"]["errors"]:
            print(f"  ERROR cell {error['index']} ({error['grade_id']}): {error['error']}")
        for oom in result["teaching_run"]["oom_lines"]:
            print(f"  OOM cell {oom['index']}: {oom['line']}")
    if not args.skip_autograde:
        result["autograde"] = autograde_reference(args.lab)
        print(f"{args.lab}: autograde of one submission {result['autograde']['seconds']:.0f} s, "
              f"{result['autograde']['autograded_score']} autograded points of {result['autograde']['autograded_max']}"
              " (bonus included), "
              f"cells short of full marks: {result['autograde']['cells_short_of_full_marks']}",
              flush=True)
    # An autograde-only run (--skip-execute) must not overwrite the teaching-scale run's record.
    name = f"{prefix}_autograde.json" if args.skip_execute else f"{prefix}_run.json"
    (out / name).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
