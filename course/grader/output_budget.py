"""What a grading run keeps of the kernel's output: capped while it arrives, per cell and per notebook
(docs/SECURITY.md, "Output is capped while it arrives"); errors are always kept, shortened."""
from __future__ import annotations

from nbformat.notebooknode import NotebookNode

MIB = 1024 * 1024


def approx_bytes(value) -> int:
    """Roughly a message content's size in bytes (strings by length, containers summed)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(str(key)) + approx_bytes(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return sum(approx_bytes(item) for item in value)
    return 8


def format_bytes(count: int) -> str:
    return f"{count / MIB:.1f} MiB" if count >= MIB else f"{count / 1024:.0f} KiB"


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters dropped by the grader]"


class OutputBudget:
    """The output one notebook's cells may keep, and what each cell has kept and dropped (bytes)."""

    def __init__(self, cell_bytes: int, notebook_bytes: int, error_bytes: int):
        self.cell_bytes, self.notebook_bytes, self.error_bytes = cell_bytes, notebook_bytes, error_bytes
        self.kept: dict[int, int] = {}
        self.dropped: dict[int, int] = {}

    def admit(self, msg: dict, cell_index: int) -> tuple[bool, int]:
        """Whether an output message of cell ``cell_index`` is kept, and how many of its bytes are dropped (a stream
        text too long is cut in place; errors are always kept, shortened)."""
        content = msg.get("content") or {}
        if msg.get("msg_type") == "error":
            self.shorten_error(content)
            return True, 0
        room = self.room(cell_index)
        text = content.get("text") if msg.get("msg_type") == "stream" else None
        size = len(text) if isinstance(text, str) else approx_bytes(content)
        if size <= room:
            self.kept[cell_index] = self.kept.get(cell_index, 0) + size
            return True, 0
        if not isinstance(text, str) or room <= 0:
            return False, size
        content["text"] = text[:room]
        self.kept[cell_index] = self.kept.get(cell_index, 0) + room
        return True, size - room

    def room(self, cell_index: int) -> int:
        notebook_left = self.notebook_bytes - sum(self.kept.values())
        return max(0, min(self.cell_bytes - self.kept.get(cell_index, 0), notebook_left))

    def fits_update(self, msg: dict) -> bool:
        """Whether a display update may replace an output (one too large to keep is dropped)."""
        size = approx_bytes(msg.get("content") or {})
        return size <= self.cell_bytes and sum(self.kept.values()) + size <= self.notebook_bytes

    def drop(self, outs: list, cell_index: int, size: int) -> None:
        """Count ``size`` dropped bytes; the first drop in a cell leaves a note in its outputs ``outs``."""
        first = cell_index not in self.dropped
        self.dropped[cell_index] = self.dropped.get(cell_index, 0) + size
        if first:
            outs.append(NotebookNode(output_type="stream", name="stdout", text=(
                f"\n[the grader dropped the rest of this cell's output: it keeps {format_bytes(self.cell_bytes)} per "
                f"cell and {format_bytes(self.notebook_bytes)} per notebook]\n")))

    def shorten_error(self, content: dict) -> None:
        """Shorten an error's message and traceback in place to about ``error_bytes``."""
        limit = self.error_bytes
        content["ename"] = shorten(str(content.get("ename", "Error")), 200)
        content["evalue"] = shorten(str(content.get("evalue", "")), limit // 4)
        lines = [shorten(str(line), limit // 8) for line in content.get("traceback") or []]
        kept, size = [], 0
        for line in reversed(lines):  # the end of a traceback says the most
            size += len(line)
            if size > limit // 2:
                kept.append(f"[... {len(lines) - len(kept)} traceback lines dropped by the grader]")
                break
            kept.append(line)
        content["traceback"] = kept[::-1]
