"""``Outcome``: what grading one submission came to, shared by ``course.cli.grade`` and ``course.cli.report``."""
from __future__ import annotations

from dataclasses import dataclass, field

NEEDS_TA = "needs-TA"  # graded, but a TA must look first (the reason says why)


@dataclass
class Outcome:
    """How autograding one submission went."""

    student: str
    status: str  # "ok", "partial" (stopped early, points so far kept), "needs-TA" (see reason) or "failed"
    reason: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # repairs made to the submission before grading
    flags: list[str] = field(default_factory=list)  # suspicious code for a TA to review; never changes a score
    cuda_error: str = ""  # a sticky CUDA error that stopped the run (GuardedExecute's report), if any
    retry: str = ""  # what went wrong that a busy machine can explain: the submission is graded once more
