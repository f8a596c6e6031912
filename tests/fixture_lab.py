"""The tiny fixture lab (tests/fixtures/lab0/lab0.py) in a throw-away repository root, and a class of
submissions of it, for the pipeline and grading-at-scale tests."""
from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

from course.cli import build
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import make_submission, read_notebook, write_notebook

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "lab0" / "lab0.py"
LAB = "lab0"
README = "| Lab | Topic | Points |\n| --- | --- | --- |\n| Lab 0 | tiny | 7 + 1 bonus |\n"
POINTS = {"q1_1_add": 3.0, "q1_2_scale": 2.0, "b1_1_square": 1.0}  # autograded points of each answer


def make_root(path: Path, lab_text: str | None = None) -> Path:
    """A minimal repository root holding the fixture lab (not yet built)."""
    (path / "labs" / LAB).mkdir(parents=True)
    (path / "labs" / LAB / f"{LAB}.py").write_text(lab_text if lab_text is not None else FIXTURE.read_text())
    (path / "assets").mkdir()
    (path / "assets" / "figure.png").write_bytes(b"\x89PNG fixture")
    (path / "utils.py").write_text('"""Stand-in for the shared helpers."""\nSCALE = "quick"\n')
    shutil.copy2(REPO / "checks.py", path / "checks.py")  # the test contract, part of every course
    (path / "README.md").write_text(README)
    shutil.copy2(REPO / "nbgrader_config.py", path / "nbgrader_config.py")
    return path


def built_root(path: Path) -> Path:
    root = make_root(path)
    assert build.main([LAB], root) == 0
    return root


def make_class(root: Path, course: Path, size: int = 12) -> dict[str, float]:
    """A course folder with ``size`` submissions answering different subsets; returns expected scores."""
    make_course_dir(course, [LAB], root)
    src = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    release = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    subsets = [set(c) for r in range(len(POINTS) + 1) for c in itertools.combinations(POINTS, r)]
    expected = {}
    for index in range(size):
        answered = subsets[index % len(subsets)]
        student = f"student{index:02d}"
        write_notebook(make_submission(release, src, answered), course / "submitted" / student / LAB / f"{LAB}.ipynb")
        expected[student] = sum(POINTS[gid] for gid in answered)
    return expected


def processes_working_in(folder: Path) -> list[str]:
    """``pid command`` of every process whose working directory is ``folder`` or inside it (nbgrader runs in the
    course folder, an unsandboxed kernel in the notebook's)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = Path(os.readlink(f"/proc/{entry}/cwd"))
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(f"{entry} {command[:200]}")
    return found


def wait_until_no_process_works_in(folder: Path, timeout_s: float = 30.0) -> list[str]:
    """Wait until no process works in ``folder``; what still does after ``timeout_s`` (empty: none)."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_working_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def plain_autograde_scores(course: Path, env: dict[str, str] | None = None) -> dict:
    """The class of ``course`` graded by plain ``nbgrader autograde`` (the route a TA takes without ``course grade``),
    into a freshly prepared gradebook: the scores it recorded, per student (``course.common.scores.read_scores``)."""
    from course.cli import grade
    from course.cli.nbgrader_run import run_nbgrader
    from course.common.scores import read_scores

    grade.prepare_gradebook(course, LAB)
    plain = run_nbgrader(course, ["autograde", LAB, "--create", "--force"], env=env)
    assert plain.ok, plain.tail(30)
    return read_scores(course, LAB)
