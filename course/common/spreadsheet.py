"""Every CSV file the course writes (``grades.csv``, ``canvas.csv``, zip_collect's ``collect_report.csv``) goes
through ``write_csv``, so that no cell a student or a roster controls runs as a formula when a TA opens the file in a
spreadsheet (OWASP's "CSV Injection").

A spreadsheet reads a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return as a formula. Such a
cell gets a leading single quote, which spreadsheets read as "this is text" and do not show. The same holds after a
separator inside a value (``,``, ``;``, a tab, a line break, then optional spaces): a spreadsheet that splits on
another separator than ours, or ignores our quoting, starts a new cell there. A value that already starts a cell with
a single quote gets one more, so that ``read_cell`` gives back exactly what was written (a spreadsheet shows it as the
original). Fields are quoted as RFC 4180 says (Python's ``csv`` module); numbers are written as numbers.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Iterable, Union

Cell = Union[str, float, int, None]

_TRIGGER = r"[=+\-@\t\r']"  # what makes a cell a formula, and the quote that marks one as text
_CELL_STARTS = re.compile(rf"(^|[,;\t\r\n])( *)(?={_TRIGGER})")
_NEUTRALISED = re.compile(rf"(^|[,;\t\r\n])( *)'(?={_TRIGGER})")


def safe_cell(value: Cell) -> str:
    """``value`` as one CSV cell that a spreadsheet reads as text: a number as ``1.5`` (``:g``), None as "", and text
    with a single quote put before each formula character that starts a cell (see the module's docstring)."""
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    return _CELL_STARTS.sub(r"\1\2'", str(value))


def read_cell(text: str) -> str:
    """The value ``safe_cell`` was given for ``text`` (for the course's own reading of a file it wrote)."""
    return _NEUTRALISED.sub(r"\1\2", text)


def write_csv(path: Path, rows: Iterable[Iterable[Cell]], encoding: str = "utf-8") -> None:
    """Write ``rows`` (the header first) to ``path``, every cell through ``safe_cell``; parent folders are made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding=encoding) as handle:
        csv.writer(handle).writerows([safe_cell(value) for value in row] for row in rows)
