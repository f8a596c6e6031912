"""What an executed notebook shows a student besides its results: every stderr stream, error and widget output,
cell by cell, as a Markdown table. Used to check that a correct run prints nothing that reads as a failure.

Usage: python scripts/gpu/stderr_report.py EXECUTED.ipynb [LABEL] >> report.md
"""
from __future__ import annotations

import json
import sys

WIDGET = "application/vnd.jupyter.widget-view+json"


def shown_outputs(path: str) -> list[dict]:
    """Per cell with any: its widget outputs (progress bars), errors, stderr lines, and the distinct kinds of
    stderr message among those ``_message_kind`` knows (``AUTOTUNE``, ``UserWarning``, ...)."""
    rows = []
    for index, cell in enumerate(json.load(open(path))["cells"]):
        row = {"cell": index, "widgets": 0, "errors": [], "stderr_lines": 0, "kinds": []}
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream" and output.get("name") == "stderr":
                lines = "".join(output.get("text", "")).splitlines()
                row["stderr_lines"] += len(lines)
                for line in lines:
                    word = _message_kind(line)
                    if word and word not in row["kinds"]:
                        row["kinds"].append(word)
            elif kind == "error":
                row["errors"].append(str(output.get("ename")))
            elif WIDGET in output.get("data", {}):
                row["widgets"] += 1
        if row["widgets"] or row["errors"] or row["stderr_lines"]:
            rows.append(row)
    return rows


def _message_kind(line: str) -> str:
    """The known kind of message a stderr line belongs to, or ``""``."""
    for kind in ("AUTOTUNE", "Autotune Choices Stats", "No valid triton configs", "UserWarning", "USDT",
                 "IProgress", "Traceback"):
        if kind in line:
            return kind
    return ""


def main(path: str, label: str = "") -> int:
    rows = shown_outputs(path)
    print(f"\n### {label or path}\n\n| cell | progress bars | errors | stderr lines | stderr messages |\n"
          "| ---: | ---: | --- | ---: | --- |")
    for row in rows:
        print(f"| {row['cell']} | {row['widgets']} | {', '.join(row['errors']) or '-'} | {row['stderr_lines']} | "
              f"{', '.join(row['kinds']) or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
