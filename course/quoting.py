"""Quoting student text in what a TA reads (terminal, ``grades.csv``, notes, flags, reasons): an ANSI escape
(``ESC [ 8 m`` hides the rest of a line), a carriage return or a direction override is written as its Python escape."""
from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls, DEL, line and paragraph separators; format characters (direction overrides, zero-width
# characters) are matched by category in escape_controls.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """``text`` (``str()`` of any other value) on one line, every control and format character written as its
    Python escape (``"a\\x1b[8mb"``)."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return "".join(
        _escape(char) if _CONTROL_RE.match(char) or unicodedata.category(char) in ("Cf", "Cs", "Co", "Cn") else char
        for char in text
    )
