"""Quoting student text in what a TA reads: terminal output, ``grades.csv``, notes, flags and reasons.

A file name, a grade id, a magic's argument or an error message can carry control characters: an ANSI escape
sequence (``ESC [ 8 m`` hides the rest of a line in a terminal, ``ESC [ 2 K`` erases it), a carriage return that
overwrites what came before, or a Unicode direction override that shows text in another order. Every such
character is written as its Python escape (``\\x1b``, ``\\r``, ``\\u202e``), so what a TA reads is what is there.
"""
from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls and DEL; line and paragraph separators; Unicode format characters (direction overrides and
# isolates, zero-width characters, the byte order mark) are matched by category below.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape_controls(text: str) -> str:
    """``text`` with every control and format character written as its Python escape (``"a\\x1b[8mb"``).

    Args:
        text: any text, typically quoted from a submission; other values are converted with ``str``.

    Returns:
        The same text on one line, with nothing a terminal or a spreadsheet would act on.
    """
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return "".join(
        _escape(char) if _CONTROL_RE.match(char) or unicodedata.category(char) in ("Cf", "Cs", "Co", "Cn") else char
        for char in text
    )
