"""Quoting student text in what a TA reads (terminal, ``grades.csv``, notes, flags, reasons): an ANSI escape
(``ESC [ 8 m`` hides the rest of a line), a carriage return or a direction override is written as its Python escape."""
from __future__ import annotations

import unicodedata

# Controls, format characters (direction overrides, zero-width characters), surrogates, private and unassigned code
# points, line and paragraph separators.
ESCAPED_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def escape_controls(text: str) -> str:
    """``text`` (``str()`` of any other value) on one line, every control and format character written as its
    Python escape (``"a\\x1b[8mb"``)."""
    text = text if isinstance(text, str) else str(text)
    return "".join(repr(char)[1:-1] if unicodedata.category(char) in ESCAPED_CATEGORIES else char for char in text)
