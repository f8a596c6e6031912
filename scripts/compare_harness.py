"""List the prepared answers whose scores differ between two harness results (a CPU run and a GPU run).

Usage: ``python scripts/compare_harness.py CPU.json GPU.json`` with two outputs of ``tests/lab_harness.py`` for
the same lab and variants module. Prints, per differing reference cell or variant, each test cell whose share of
passed check weight differs, with both results' first failures; exits 1 when anything differs (design section 2:
every autograded question gives the same score on CPU and on GPU), 0 otherwise.
"""
from __future__ import annotations

import json
import sys


def _runs(result: dict) -> dict:
    """{(kind, solution cell, label): {test cell: [passed, first failure, share]}}, the reference run included."""
    runs = {("reference", "", "reference"): result.get("reference", {})}
    for variant in result.get("variants", []):
        runs[(variant["kind"], variant["cell"], variant["label"])] = variant.get("tests", {})
    return runs


def compare(first: dict, second: dict, names=("A", "B")) -> list[str]:
    """Lines describing every (run, test cell) whose share differs, or that only one result has."""
    lines: list[str] = []
    a_runs, b_runs = _runs(first), _runs(second)
    for key in sorted(set(a_runs) | set(b_runs), key=str):
        kind, cell, label = key
        if key not in a_runs or key not in b_runs:
            lines.append(f"{kind} {cell} {label!r}: only in {names[0] if key in a_runs else names[1]}")
            continue
        a_tests, b_tests = a_runs[key], b_runs[key]
        for test in sorted(set(a_tests) | set(b_tests)):
            a, b = a_tests.get(test), b_tests.get(test)
            if a is None or b is None or abs(float(a[2]) - float(b[2])) > 1e-9:
                show = lambda r: "missing" if r is None else f"{float(r[2]):.3f} {r[1]!r}"  # noqa: E731
                lines.append(f"{kind} {cell} {label!r} -> {test}: {names[0]} {show(a)} | {names[1]} {show(b)}")
    for name, result in zip(names, (first, second)):
        for cell, error in sorted(result.get("setup_errors", {}).items()):
            lines.append(f"setup error in {name}: {cell}: {error}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        first = json.load(f)
    with open(argv[1]) as f:
        second = json.load(f)
    lines = compare(first, second, names=("CPU", "GPU"))
    print("\n".join(lines) if lines else "no differences: every variant scores the same in both results")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
