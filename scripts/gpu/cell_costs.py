"""What each cell of a lab's reference notebook costs in one process, the first time and the second time it runs.

Usage: ``python scripts/gpu/cell_costs.py --lab lab1 [--passes 2] [--cudnn-sdp on|off] --out DIR``; then
``python scripts/gpu/cell_costs.py --render RUN.json... --out reports/cell-costs-h100.md``.

Runs the code cells of ``source/<lab>/<lab>.ipynb`` (not the test cells) in one namespace, in a temporary copy of
the lab's folder (what the cells write stays there), at quick scale (``EFFICIENT_AI_SCALE=quick``, as the grader
runs it), ``--passes`` times in a row in this one process, and records each cell's wall seconds (to a CUDA
synchronisation where there is a GPU) and the process's CPU seconds during it. The first pass pays what a fresh
grading kernel pays once (libraries' first use, cuDNN's or cuBLAS's plans, lazily loaded GPU code); the second shows
the cell's own cost. ``--cudnn-sdp on`` or ``off`` turns PyTorch's cuDNN attention backend on or off once the first
cell (the imports; ``utils`` turns it off) has run, to see what choosing it costs. Writes
``DIR/cell-costs-<lab>[-cudnn-on|-cudnn-off].json`` and prints its report (``write_report``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from course.common.notebooks import is_autograded_test  # noqa: E402


def report_lines(runs: list[Path], shown: int = 12) -> list[str]:
    """Markdown: for each run file, its pass totals, and the ``shown`` cells whose first pass took longest (wall and
    CPU seconds of each pass). The first cell holds the lab's imports (paid once per kernel, not per cell), so
    the totals leave it out."""
    lines = ["# What each cell of a lab costs in one process, first and second time", "",
             "Made by `python scripts/gpu/cell_costs.py --lab LAB --cudnn-sdp on|off` (one process each), rendered by "
             "`--render`. Totals leave out the first cell (the imports, which a grading kernel has made before its "
             "submission).", ""]
    for path in runs:
        rows = json.loads(path.read_text())
        passes = sorted({row["pass"] for row in rows})
        first_cell = min(row["cell"] for row in rows)
        def total_s(p: int) -> float:
            return sum(r["wall_s"] for r in rows if r["pass"] == p and r["cell"] != first_cell)

        totals = ", ".join(f"pass {p}: {total_s(p):.2f} s" for p in passes)
        lines += [f"## {path.stem}", "", f"All cells but the imports: {totals}.", "",
                  "| cell | first line | " + " | ".join(f"pass {p} wall (s) | pass {p} CPU (s)" for p in passes) + " |",
                  "| --- | --- | " + " | ".join("--- | ---" for _ in passes) + " |"]
        by_cell: dict[int, dict[int, dict]] = {}
        for row in rows:
            by_cell.setdefault(row["cell"], {})[row["pass"]] = row
        ranked = sorted((c for c in by_cell if c != first_cell), key=lambda c: -by_cell[c][passes[0]]["wall_s"])
        for cell in ranked[:shown]:
            first_line = by_cell[cell][passes[0]]["first_line"].replace("|", "/")
            lines.append(f"| #{cell} | `{first_line}` | " + " | ".join(
                f"{by_cell[cell][p]['wall_s']:.3f} | {by_cell[cell][p]['cpu_s']:.3f}" for p in passes) + " |")
        lines.append("")
    return lines


def write_report(runs: list[Path], out: Path) -> None:
    out.write_text("\n".join(report_lines(runs)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="lab1")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--cudnn-sdp", choices=("on", "off"), help="cuDNN attention after the first cell")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--render", type=Path, nargs="+", metavar="RUN.json",
                        help="run nothing: write --out (a .md file) comparing these runs' files")
    options = parser.parse_args()
    if options.render:
        write_report(options.render, options.out)
        print(f"wrote {options.out}")
        return 0
    options.out = options.out.resolve()
    os.environ["EFFICIENT_AI_SCALE"] = "quick"
    os.environ.setdefault("MPLBACKEND", "Agg")
    folder = Path(tempfile.mkdtemp(prefix=f"cell-costs-{options.lab}-")) / options.lab
    shutil.copytree(REPO / "source" / options.lab, folder)
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    import nbformat

    nb = nbformat.read(folder / f"{options.lab}.ipynb", as_version=4)
    cells = [(index, cell.source) for index, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and not is_autograded_test(cell)]
    namespace: dict = {"__name__": "__main__"}
    gpu = None  # torch.cuda, once a cell imported torch (None before; False without a GPU)
    rows = []
    for run in range(options.passes):
        for index, source in cells:
            start_s, cpu_s = time.perf_counter(), time.process_time()
            error = ""
            try:
                exec(compile(source, f"<cell {index}>", "exec"), namespace)
                if gpu:
                    gpu.synchronize()
            except Exception as exc:  # noqa: BLE001 - a cell that fails here is reported, not fatal
                error = f"{type(exc).__name__}: {exc}"[:200]
            first_line = source.strip().splitlines()[0][:60] if source.strip() else ""
            rows.append({"pass": run + 1, "cell": index, "first_line": first_line,
                         "wall_s": time.perf_counter() - start_s, "cpu_s": time.process_time() - cpu_s, "error": error})
            torch = sys.modules.get("torch")
            if gpu is None and torch is not None:
                gpu = torch.cuda if torch.cuda.is_available() else False
                if gpu and options.cudnn_sdp:
                    torch.backends.cuda.enable_cudnn_sdp(options.cudnn_sdp == "on")
    options.out.mkdir(parents=True, exist_ok=True)
    name = f"cell-costs-{options.lab}{f'-cudnn-{options.cudnn_sdp}' if options.cudnn_sdp else ''}.json"
    (options.out / name).write_text(json.dumps(rows, indent=1))
    print("\n".join(report_lines([options.out / name])))
    for row in rows:
        if row["error"]:
            print(f"pass {row['pass']}, cell #{row['cell']}: {row['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
