"""What happened while one notebook was graded: ``grading_report.json``, read by ``course.grade``."""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

GRADING_REPORT = "grading_report.json"  # written beside each autograded notebook


@dataclass
class GradingRecord:
    """What one grading run found; every field is reported as is (``write``)."""

    stopped: str = ""  # why execution stopped early ("" when every cell ran)
    guard: str = ""  # why the grading guard's answers could no longer be trusted
    integrity: dict[str, list[str]] = field(default_factory=dict)  # test cell -> what student code changed
    cuda_error: str = ""  # a sticky CUDA error, and where
    output_missed: list[str] = field(default_factory=list)  # cells whose output did not finish arriving
    retry: str = ""  # what a busy machine could explain: course.grade grades the submission again
    neutralised: dict[str, list[str]] = field(default_factory=dict)  # cell -> execution-affecting metadata removed
    output_dropped_bytes: dict[str, int] = field(default_factory=dict)  # cell -> output bytes dropped
    kernel_restarts: list[str] = field(default_factory=list)  # why each fresh kernel was started
    output_caps_bytes: list[int] = field(default_factory=lambda: [0, 0])  # per cell, per notebook
    student_code_ran: bool = False  # whether any cell that is not the instructor's has started (not reported)

    def write(self, folder: str | Path | None) -> None:
        """Write the report into ``folder`` (nothing when there is none or it cannot be written)."""
        if not folder:
            return
        report = asdict(self)
        del report["student_code_ran"]
        with contextlib.suppress(OSError):
            (Path(folder) / GRADING_REPORT).write_text(json.dumps(report, indent=1))
