"""``GradingResult``: what grading one submission came to, in one file written and read by this class only.

``grading_result.json`` sits beside each autograded notebook: ``GuardedExecute`` writes what it found on every route
(``course grade``, plain ``nbgrader autograde``, the formgrader), and ``course grade`` adds the mark ``--resume``
trusts once the submission's scores are in the gradebook (``mark_recorded``). The grading process of ``course grade``
(``course.grader.nbgrader_child``) also writes the whole result, a failure included, to its job's ``result_file``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

RESULT_FILE = "grading_result.json"  # beside each autograded notebook


@dataclass
class GradingResult:
    """What one grading run found; every field is written as is (``write``), ``student_code_ran`` excepted."""

    stopped: str = ""  # why execution stopped early ("" when every cell ran)
    guard: str = ""  # why the grading guard's answers could no longer be trusted
    integrity: dict[str, list[str]] = field(default_factory=dict)  # test cell -> what student code changed
    cuda_error: str = ""  # a sticky CUDA error, and where
    output_missed: list[str] = field(default_factory=list)  # cells whose output did not finish arriving
    retry: str = ""  # what a busy machine could explain: course.cli.grade grades the submission again
    neutralised: dict[str, list[str]] = field(default_factory=dict)  # cell -> execution-affecting metadata removed
    output_dropped_bytes: dict[str, int] = field(default_factory=dict)  # cell -> output bytes dropped
    kernel_restarts: list[str] = field(default_factory=list)  # why each fresh kernel was started
    output_caps_bytes: list[int] = field(default_factory=lambda: [0, 0])  # per cell, per notebook
    failure: str = ""  # why nbgrader wrote no graded notebook ("" when it did), as a TA reads it
    recorded_notebook_sha256: str = ""  # the autograded notebook's digest once its scores are in the gradebook
    student_code_ran: bool = False  # whether any cell that is not the instructor's has started (not written)

    def write(self, path: str | Path | None) -> None:
        """Write the result to ``path``, a file or a folder (then into its ``RESULT_FILE``), atomically: a reader
        sees the old result or the new one. Nothing when ``path`` is empty or cannot be written."""
        if path:
            with contextlib.suppress(OSError):
                self.save(_target(path))

    def save(self, target: Path) -> None:
        """Write the result to the file ``target`` atomically; OSError when it cannot be written."""
        data = asdict(self)
        del data["student_code_ran"]
        partial = target.with_name(f".{target.name}.partial")
        partial.write_text(json.dumps(data, indent=1))
        os.replace(partial, target)

    @classmethod
    def read(cls, path: str | Path) -> GradingResult:
        """The result in ``path`` (a file, or a folder holding ``RESULT_FILE``); an empty one when there is none or it
        is not one (a field of the wrong kind is left at its default)."""
        try:
            data = json.loads(_target(path).read_text())
        except (OSError, ValueError):
            return cls()
        result = cls()
        if isinstance(data, dict):
            for known in fields(cls):
                value = data.get(known.name)
                if value is not None and isinstance(value, type(getattr(result, known.name))):
                    setattr(result, known.name, value)
        return result

    def notes(self) -> list[str]:
        """What a TA reads about this run besides its status: the guard, fresh kernels, tampering, removed metadata
        and dropped output."""
        notes = [f"grading guard: {self.guard}"] if self.guard else []
        notes += [f"{restart}: a fresh kernel was started and the earlier cells were run again in it; only that "
                  "cell's question lost its points" for restart in self.kernel_restarts]
        notes += [f"{cell} scored zero, student code changed what tests rely on: {'; '.join(found)}"
                  for cell, found in sorted(self.integrity.items())]
        notes += [f"{cell}: removed before grading, it changes how cells run: {', '.join(removed)}"
                  for cell, removed in self.neutralised.items()]
        caps = (self.output_caps_bytes + [0, 0])[:2]
        notes += [f"{cell}: {size / 2**20:.1f} MiB of output dropped (the grader keeps {caps[0] / 2**20:g} MiB per "
                  f"cell, {caps[1] / 2**20:g} MiB per notebook)" for cell, size in self.output_dropped_bytes.items()]
        return notes

    def partial_reason(self) -> str:
        """Why execution stopped early or output went missing ("" when every cell ran to the end)."""
        return "; ".join(self.output_missed + ([self.stopped] if self.stopped else []))


def _target(path: str | Path) -> Path:
    """``path`` itself, or its ``RESULT_FILE`` when it is a folder."""
    return Path(path) / RESULT_FILE if Path(path).is_dir() else Path(path)


def _digest(notebook: Path) -> str:
    return hashlib.sha256(notebook.read_bytes()).hexdigest()


def mark_recorded(folder: Path, notebook: str) -> None:
    """Mark the submission in ``folder`` (``autograded/<student>/<lab>/``, with the notebook file ``notebook``) as
    finished, for ``--resume``: a killed run leaves notebooks that look graded, so only a submission whose scores are
    in the gradebook is marked, by its notebook's SHA-256 (a later change to the notebook, or a mark copied from
    elsewhere, does not match). OSError when the notebook cannot be read or the result written."""
    result = GradingResult.read(folder)
    result.recorded_notebook_sha256 = _digest(folder / notebook)
    result.save(folder / RESULT_FILE)


def is_recorded(folder: Path, notebook: str) -> bool:
    """Whether ``folder`` holds a submission whose grading a run finished, with the notebook that run wrote."""
    try:
        mark = GradingResult.read(folder).recorded_notebook_sha256
        return bool(mark) and mark == _digest(folder / notebook)
    except OSError:
        return False
