"""Run Lab 2's reference solution at teaching scale on a GPU and write a results report.

Usage, from the repository root on a CUDA machine (no Jupyter needed)::

    python scripts/gpu/lab2_bench.py --out results/lab2              # teaching scale, every cell
    python scripts/gpu/lab2_bench.py --out results/lab2 --scale quick  # a smoke test (CPU works too)
    python scripts/gpu/lab2_bench.py --out results/lab2-cpu --scale cpu  # what a student without a GPU runs

It executes ``labs/lab2/lab2.py`` (jupytext percent format) cell by cell in one Python process, the way the
notebook runs for a student: solution cells, tests (public and hidden) and measuring cells, at the scale asked
for. For every code cell it records the wall time, what the cell printed and any error; every matplotlib figure
a cell shows is saved as a PNG. It writes

- ``OUT/report.md``: the environment, a table of cells (seconds, status) and each cell's output and figures;
- ``OUT/cells.json``: the same data, machine-readable;
- ``OUT/figures/*.png``.

Exit status: 0 when every cell ran, 1 when a cell raised (the report says which). On an H100 the whole run takes
about 4 minutes with a cold compile cache (the target: 315 s before Lab 2 cut its autotuned sizes), most of it
compiling (``torch.compile`` with ``max-autotune`` over five sizes in Part 1 and the chain of Part 2, the attention
sweep and the four Transformer sizes of Part 5). The report shows the Transformer table's achieved TFLOP/s, time
per layer and kernels per forward pass, which Question 5.3's answer reads. ``--scale cpu`` runs what a student
without a GPU runs (about ten minutes on a 2-core machine)."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import linecache
import os
import platform
import re
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "labs" / "lab2" / "lab2.py"
CELL_HEADER = re.compile(r"^# %%(?P<rest>.*)$")


def read_cells(path: Path) -> list[dict]:
    """Code cells of a percent-format file: [{"index", "grade_id", "source"}], markdown cells skipped."""
    cells, current, header = [], None, None
    for line in path.read_text().splitlines(keepends=True):
        match = CELL_HEADER.match(line.rstrip("\n"))
        if match:
            if current is not None:
                cells.append((header, "".join(current)))
            header, current = match["rest"], []
        elif current is not None:
            current.append(line)
    if current is not None:
        cells.append((header, "".join(current)))
    code = []
    for index, (header, source) in enumerate(cells):
        if "[markdown]" in header:
            continue
        grade = re.search(r'"grade_id":\s*"([^"]+)"', header)
        code.append({"index": index, "grade_id": grade.group(1) if grade else None, "source": source.strip("\n") + "\n"})
    return code


class Tee(io.TextIOBase):
    """Write to a buffer and to the real stream (progress stays visible)."""

    def __init__(self, stream):
        self.stream, self.buffer = stream, io.StringIO()

    def write(self, text):
        self.stream.write(text)
        self.stream.flush()
        return self.buffer.write(text)


def label(cell: dict) -> str:
    if cell["grade_id"]:
        return cell["grade_id"]
    first = next((line.strip() for line in cell["source"].splitlines() if line.strip()), "")
    return f"cell {cell['index']}: {first[:60]}"


def write_report(out_dir: Path, scale: str, results: list[dict], total_s: float) -> list[dict]:
    """Write OUT/cells.json and OUT/report.md for the cells run so far; return the failed cells."""
    environment = {"python": platform.python_version(), "scale": scale, "total_seconds": total_s}
    try:
        import torch

        environment["torch"] = torch.__version__
        environment["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)"
    except Exception as exc:  # noqa: BLE001
        environment["torch"] = f"unavailable ({exc})"
    try:
        import triton

        environment["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        environment["triton"] = "not installed"
    (out_dir / "cells.json").write_text(json.dumps({"environment": environment, "cells": results}, indent=1))

    failed = [r for r in results if r["status"] != "ok"]
    lines = [
        "# Lab 2 at " + scale + " scale",
        "",
        " | ".join(f"{key}: {value:.1f}" if isinstance(value, float) else f"{key}: {value}" for key, value in environment.items()),
        "",
        f"{len(results)} code cells, {len(failed)} failed.",
        "",
        "| cell | seconds | status |",
        "| --- | ---: | --- |",
    ]
    lines += [f"| {r['label']} | {r['seconds']:.1f} | {r['status']} |" for r in results]
    for r in results:
        if not (r["stdout"].strip() or r.get("error") or r.get("figures")):
            continue
        lines += ["", f"## {r['label']} ({r['seconds']:.1f} s, {r['status']})", ""]
        if r["stdout"].strip():
            text = r["stdout"].strip().splitlines()
            lines += ["```", *text[:200], *(["... (truncated)"] if len(text) > 200 else []), "```"]
        if r.get("error"):
            lines += ["```", r["error"].strip(), "```"]
        lines += [f"![{name}](figures/{name})" for name in r.get("figures", [])]
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder for report.md, cells.json, figures/")
    parser.add_argument("--scale", choices=("teaching", "cpu", "quick"), default="teaching")
    args = parser.parse_args(argv)

    os.environ["EFFICIENT_AI_SCALE"] = args.scale
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    out_dir = args.out.resolve()
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)

    import matplotlib.pyplot as plt

    figures: list[str] = []
    current: dict = {}

    def save_figures(*_args, **_kwargs):
        for number in plt.get_fignums():
            name = f"cell{current['index']:03d}_{len(figures):02d}.png"
            plt.figure(number).savefig(out_dir / "figures" / name, dpi=120, bbox_inches="tight")
            figures.append(name)
            current.setdefault("figures", []).append(name)
        plt.close("all")

    plt.show = save_figures
    namespace: dict = {"__name__": "__main__", "display": print}
    results = []
    start_all = time.perf_counter()
    for cell in read_cells(LAB):
        current = {"index": cell["index"], "label": label(cell)}
        filename = f"<lab2 cell {cell['index']}>"
        # Triton reads a kernel's source with inspect, which needs the cell in linecache (as Jupyter does).
        linecache.cache[filename] = (len(cell["source"]), None, cell["source"].splitlines(True), filename)
        print(f"\n===== {current['label']}", flush=True)
        stdout, stderr = Tee(sys.__stdout__), Tee(sys.__stderr__)
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                exec(compile(cell["source"], filename, "exec"), namespace)
                save_figures()
            current["status"] = "ok"
        except Exception:  # noqa: BLE001 - record and go on, like a notebook with allow_errors
            current["status"] = "error"
            current["error"] = traceback.format_exc(limit=6)
            print(current["error"], file=sys.__stderr__)
        current["seconds"] = time.perf_counter() - start
        current["stdout"] = stdout.buffer.getvalue()
        current["stderr"] = stderr.buffer.getvalue()
        results.append(current)
        write_report(out_dir, args.scale, results, time.perf_counter() - start_all)  # a killed run keeps its report
    total_s = time.perf_counter() - start_all
    failed = write_report(out_dir, args.scale, results, total_s)

    print(f"\n{len(results)} cells in {total_s:.0f} s, {len(failed)} failed; report: {out_dir / 'report.md'}")
    for r in failed:
        print(f"FAILED: {r['label']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
