"""``GradingJob``: everything the process that grades one submission is told, and nothing else crosses into it.

``course grade`` builds one job per submission (``course.cli.grade``), ``course.cli.nbgrader_run.GradingProcess`` sends it to
the process it starts (``course.grader.nbgrader_child``), and that process turns it into nbgrader's traitlets ``Config``
(``GradingJob.config``). What comes back is one ``course.common.grading_result.GradingResult``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from traitlets.config import Config

from .paths import course_directory

GRADING_SCALE = "quick"  # utils.py's sizes while grading: every route runs the labs at quick scale
THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def thread_pool_env(threads: int) -> dict[str, str]:
    """The variables that size PyTorch's, OpenMP's and BLAS's thread pools, all set to ``threads``."""
    return {name: str(threads) for name in THREAD_ENVS}


@dataclass(frozen=True)
class WorkerSlot:
    """What one of ``course grade``'s concurrent workers owns: a GPU, CPUs for its kernels, a thread-pool size.

    Attributes:
        gpu: the CUDA device id its kernels see ("" hides every GPU; None leaves ``CUDA_VISIBLE_DEVICES`` as it is).
        kernel_cpus: CPU numbers its kernels run on (empty: every CPU).
        threads: size of PyTorch's, OpenMP's and BLAS's thread pools (0: the libraries' default).
    """

    gpu: str | None = None
    kernel_cpus: tuple[int, ...] = ()
    threads: int = 0

    def without_gpu(self) -> WorkerSlot:
        """The same slot with every GPU hidden (a CPU grader's view)."""
        return WorkerSlot("", self.kernel_cpus, self.threads)

    def environment(self) -> dict[str, str]:
        """The variables a process of this slot is started with (its GPU and thread pools), beside the caller's."""
        env = thread_pool_env(self.threads) if self.threads else {}
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env


@dataclass(frozen=True)
class Limits:
    """Time limits of one submission's grading.

    Attributes:
        submission_timeout_s: wall-clock limit of the whole nbgrader process (seconds); past it, it is killed with its
            kernels. The per-cell and per-notebook limits are ``nbgrader_config.py``'s.
    """

    submission_timeout_s: float = 900.0


@dataclass(frozen=True)
class GradingJob:
    """One submission to autograde.

    Attributes:
        course_root: the course folder (holds ``nbgrader_config.py``, ``source/``, the gradebook by default).
        lab: nbgrader's assignment id (``lab1``).
        student: nbgrader's student id.
        staging: the folder nbgrader reads submissions from instead of ``submitted/`` (``course.cli.submission``'s
            repaired copies), or None for ``submitted/``.
        result_file: where the grading process writes its ``GradingResult`` (a file of ``course grade``'s own).
        slot: the worker's GPU, CPUs and thread pools.
        limits: time limits.
        scale: utils.py's scale for the grader's tests and the kernels.
        ahead: started ahead of its turn: waits before the notebook's first student cell for ``course grade``'s go.
    """

    course_root: Path
    lab: str
    student: str
    result_file: Path
    staging: Path | None = None
    slot: WorkerSlot = field(default_factory=WorkerSlot)
    limits: Limits = field(default_factory=Limits)
    scale: str = GRADING_SCALE
    ahead: bool = False

    def config(self) -> Config:
        """The traitlets settings this job adds to the course's ``nbgrader_config.py`` (which runs after them, so it
        sees the kernel CPUs when it configures the sandbox, and before them again, so that the job wins)."""
        config = Config()
        config.CourseDirectory.root = str(self.course_root)
        config.CourseDirectory.assignment_id = self.lab
        config.CourseDirectory.student_id = self.student
        if self.staging is not None:
            config.CourseDirectory.submitted_directory = str(self.staging)
        config.GuardedExecute.scale = self.scale
        config.Sandbox.cpus = list(self.slot.kernel_cpus)
        return config

    def autograded_folder(self) -> Path:
        """``autograded/<student>/<lab>/`` of this job's course, as nbgrader's ``CourseDirectory`` names it."""
        return autograded_folder(self.course_root, self.lab, self.student)

    def to_json(self) -> str:
        """The job as one line of JSON (what crosses into the grading process)."""
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> GradingJob:
        """The job ``to_json`` wrote. Raises ValueError for text that is not one."""
        try:
            data = json.loads(text)
            slot = data.pop("slot")
            slot = WorkerSlot(slot["gpu"], tuple(int(cpu) for cpu in slot["kernel_cpus"]), int(slot["threads"]))
            staging = data.pop("staging")
            return cls(**{**data, "course_root": Path(data["course_root"]), "result_file": Path(data["result_file"]),
                          "staging": None if staging is None else Path(staging), "slot": slot,
                          "limits": Limits(**data.pop("limits"))})
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a grading job: {exc}") from None


def autograded_folder(course_root: Path, lab: str, student: str) -> Path:
    """Where nbgrader writes ``student``'s autograded ``lab`` (``autograded/<student>/<lab>/`` by default)."""
    coursedir = course_directory(course_root)
    return Path(coursedir.format_path(coursedir.autograded_directory, student, lab))
