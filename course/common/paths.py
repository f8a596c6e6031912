"""Where things live in the repository, and which labs exist."""
from __future__ import annotations

import os
import re
from pathlib import Path

COURSE_DIR = Path(__file__).resolve().parents[1]  # course/: its rooms, and templates/
TEMPLATES_DIR = COURSE_DIR / "templates"  # feedback page, bundle README, fetch cell, measure pages
KERNEL_DIR = COURSE_DIR / "kernel"  # files sent to or started in grading kernels by path
REPO_ROOT = COURSE_DIR.parent  # labs/, source/, release/, utils.py, assets/, nbgrader_config.py
COURSE_ID = "efficient-ai"  # nbgrader's course id: nbgrader_config.py sets it, the gradebook is opened with it
LAB_NAME_RE = re.compile(r"^lab\d+$")
CACHE_NAMES = ("__pycache__", ".ipynb_checkpoints")  # what Python and Jupyter write into a folder they open
LAB_FILES = ("utils.py", "_utils_private.py", "checks.py", "requirements.txt")
"""Files of the repository root that sit beside every lab's notebook: the helpers students call, their private
plumbing, the test contract and the students' requirements (the first cell's version check reads them). ``build``
copies them into ``source/labN/``, nbgrader into ``release/labN/`` (the student bundle) and, at autograde, over a
student's copies; the Colab cell fetches them. ``REQUIRED_LAB_FILES`` must exist; the others are copied when present."""
REQUIRED_LAB_FILES = ("utils.py", "checks.py")
TEACHING_GPU = "H200"
"""The card of the course's committed teaching-scale runs (``reports/h200/``, ``reports/<lab>-h200.md``), which the lab
texts and the student references quote: change it, rerun ``scripts/gpu/run_reports.sh`` there and re-quote when the
course measures on another card."""
TEACHING_RUNS = Path("reports") / TEACHING_GPU.lower()  # relative to the repository root
STUDENT_REFERENCE = "measured_runs.md"
"""A lab's student reference, ``labs/labN/measured_runs.md``: what its measuring cells printed in the course's committed
runs (``TEACHING_GPU`` and cpu scale), made by ``scripts/make_student_reference.py``. ``build`` copies it into ``source/labN/`` when
present, so it ships beside the notebook (release, bundle, Colab fetch); the bundle check fails when it leaks answers
(``lint.check_reference_leaks``)."""


def is_cache(relative: Path) -> bool:
    """Whether ``relative`` (a path below a lab's folder) is something Python or Jupyter wrote there, no part of
    the lab: ``__pycache__``, ``*.pyc``, JupyterLab's ``.ipynb_checkpoints``."""
    return relative.suffix == ".pyc" or any(part in CACHE_NAMES for part in relative.parts)


def lab_text_path(root: Path, lab: str) -> Path:
    """A lab's authored text file, ``labs/labN/labN.py``."""
    return root / "labs" / lab / f"{lab}.py"


def student_reference_path(root: Path, lab: str) -> Path:
    """A lab's student reference as committed, ``labs/labN/measured_runs.md``."""
    return root / "labs" / lab / STUDENT_REFERENCE


def source_notebook_path(root: Path, lab: str) -> Path:
    """A lab's instructor notebook, ``source/labN/labN.ipynb``."""
    return root / "source" / lab / f"{lab}.ipynb"


def release_notebook_path(root: Path, lab: str) -> Path:
    """A lab's student notebook, ``release/labN/labN.ipynb``."""
    return root / "release" / lab / f"{lab}.ipynb"


def discover_labs(root: Path = REPO_ROOT) -> list[str]:
    """Names of the labs authored under ``labs/`` (``lab1``, ``lab2``, ...), in numeric order."""
    folders = (root / "labs").iterdir() if (root / "labs").is_dir() else []
    labs = [p.name for p in folders
            if p.is_dir() and LAB_NAME_RE.match(p.name) and lab_text_path(root, p.name).exists()]
    return sorted(labs, key=lambda name: int(name[3:]))


def resolve_labs(requested: list[str] | None, root: Path = REPO_ROOT) -> list[str]:
    """The labs a command should act on: the requested ones, or all of them; SystemExit for a requested lab
    without ``labs/labN/labN.py``."""
    available = discover_labs(root)
    unknown = [lab for lab in requested or [] if lab not in available]
    if unknown:
        raise SystemExit(f"unknown lab(s) {', '.join(unknown)}: expected one of {', '.join(available) or '(none)'}; "
                         "a lab is a file labs/labN/labN.py")
    return list(requested) if requested else available


DB_URL_ENV = "NBGRADER_DB_URL"  # nbgrader_config.py's switch to a shared gradebook (PostgreSQL)


def course_directory(course_root: Path, **traits):
    """nbgrader's ``CourseDirectory`` of the course folder ``course_root``: its folders (``format_path``) and gradebook
    URL as ``nbgrader_config.py`` sets them (``NBGRADER_DB_URL``, else nbgrader's SQLite file in the folder), with
    ``traits`` (``student_id=...``) on top. The config file itself is not run here: it configures grading kernels."""
    from nbgrader.coursedir import CourseDirectory  # not at the top: most commands never open a course folder

    url = os.environ.get(DB_URL_ENV)
    return CourseDirectory(root=os.path.abspath(course_root), course_id=COURSE_ID, **({"db_url": url} if url else {}),
                           **traits)
