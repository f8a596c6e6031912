"""build: labs/labN/labN.py -> source/labN/ (instructor notebook) -> release/labN/ (student bundle).

``source/labN/`` gets the notebook, copies of the lab files (``paths.LAB_FILES``: ``utils.py`` and its private
``_utils_private.py``, ``checks.py``, ``requirements.txt``), the lab's student reference ``labs/labN/measured_runs.md``
when it has one (``paths.STUDENT_REFERENCE``) and ``assets/``; nbgrader copies them into ``release/labN/``
(a self-contained release), and ``nbgrader autograde`` overwrites a student's copies with them.
Files are written only when their content changes, so a second build changes nothing.
"""
from __future__ import annotations

import filecmp
import shutil
import tempfile
from pathlib import Path

import jupytext
import nbformat

from ..common.fetch_cell import add_fetch_cell, bundle_url
from ..common.measure_cells import is_measure_cell, strip_declarations
from ..common.notebooks import NB_VERSION, grade_id, mark_bonus, read_notebook
from ..common.paths import (
    LAB_FILES,
    REPO_ROOT,
    REQUIRED_LAB_FILES,
    STUDENT_REFERENCE,
    is_cache,
    lab_text_path,
    student_reference_path,
)
from .nbgrader_run import run_nbgrader

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# What ipykernel reports, so JupyterLab does not mark a freshly opened notebook modified; fixed: a reproducible build.
LANGUAGE_INFO = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                 "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3", "version": "3.11.7"}
SET_ASIDE_DIR = "build-set-aside"  # files found in release/labN/ that the build did not write (ignored by git)
LOCK_HEADER = "# Grade ids of this lab: the gradebook keys on them. Never rename or remove one; add new ones freely."


class BuildError(Exception):
    """A lab could not be built; the message says which and why."""


def text_to_notebook(text_path: Path) -> str:
    """The instructor notebook (as JSON text) for an authored lab file."""
    try:
        nb = jupytext.read(text_path, fmt="py:percent")
    except Exception as exc:
        raise BuildError(f"{text_path}: jupytext could not read it ({exc})") from None
    nb.metadata.pop("jupytext", None)
    nb.metadata.setdefault("kernelspec", dict(KERNELSPEC))
    nb.metadata["language_info"] = dict(LANGUAGE_INFO)
    index, previous = 0, "start"
    for cell in nb.cells:
        if is_measure_cell(cell):  # named after the question's cell before it: adding one renumbers no other cell
            cell["id"] = f"{previous}-measure"
        else:
            cell["id"] = grade_id(cell) or f"cell-{index}"  # stable ids (nbformat would draw random ones)
            index += 1
        previous = cell["id"]
        cell.metadata.pop("lines_to_next_cell", None)
        mark_bonus(cell)  # bonus points leave nbgrader's maximum (docs/AUTHORING.md, "Points")
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.nbformat, nb.nbformat_minor = NB_VERSION, 5
    return nbformat.writes(nbformat.from_dict(nb), version=NB_VERSION) + "\n"


def _copy_if_changed(src: Path, target: Path, changed: list[Path]) -> None:
    if not target.exists() or not filecmp.cmp(src, target, shallow=False):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        changed.append(target)


def sync_tree(src: Path, dest: Path, changed: list[Path], set_aside: Path | None = None) -> None:
    """Make ``dest`` a copy of ``src``: copy new or different files, remove files ``src`` lacks.

    Args:
        set_aside: where files ``src`` lacks are moved (same relative path) instead of being deleted, with a
            printed line for each; None deletes them (folders only the build writes).
    """
    dest.mkdir(parents=True, exist_ok=True)
    for item in sorted(src.rglob("*")):
        if item.is_file() and not is_cache(item.relative_to(src)):
            _copy_if_changed(item, dest / item.relative_to(src), changed)
    for item in sorted(dest.rglob("*"), reverse=True):
        if is_cache(item.relative_to(dest)) or (src / item.relative_to(dest)).exists():
            continue
        if item.is_file():
            if set_aside is None:
                item.unlink()
            else:
                kept = set_aside / item.relative_to(dest)
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(item, kept)
                print(f"build: {item} is not part of the release: moved to {kept} (work in a copy of the release)")
            changed.append(item)
        elif item.is_dir() and not any(item.iterdir()):
            item.rmdir()


def generate_release(lab: str, source_dir: Path, release_dir: Path, fetch_url: str = "") -> list[Path]:
    """Run ``nbgrader generate_assignment`` on ``source_dir`` and sync the result into ``release_dir``; with
    ``fetch_url``, the release notebook gets the cell that fetches the lab's files from there (``add_fetch_cell``).
    ``course measure``'s declarations leave the release; their notes to students stay (``measure_cells``)."""
    changed: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="efficient-ai-build-") as tmp:
        course = Path(tmp)
        shutil.copy2(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
        shutil.copytree(source_dir, course / "source" / lab)
        result = run_nbgrader(course, ["generate_assignment", lab, "--force", "--no-db"])
        generated = course / "release" / lab
        if not result.ok or not (generated / f"{lab}.ipynb").exists():
            raise BuildError(f"nbgrader generate_assignment {lab} failed:\n{result.tail(25)}")
        if fetch_url:
            add_fetch_cell(generated / f"{lab}.ipynb", fetch_url)
        strip_declarations(generated / f"{lab}.ipynb")  # students see the note of a measured piece, not its data
        # A student (or instructor) may have worked inside release/: set such files aside, never delete them.
        sync_tree(generated, release_dir, changed, set_aside=release_dir.parent.parent / SET_ASIDE_DIR / lab)
    return changed


def build_lab(lab: str, root: Path = REPO_ROOT, out_root: Path | None = None) -> list[Path]:
    """Build one lab's ``source/`` and ``release/`` under ``out_root`` (default ``root``). Returns the files it
    changed. With a ``labs/bundle_url.txt``, the release notebook fetches missing files (Colab) from the bundle."""
    out_root = out_root or root
    changed: list[Path] = []
    source_dir = out_root / "source" / lab
    notebook, text = source_dir / f"{lab}.ipynb", text_to_notebook(lab_text_path(root, lab))
    if not notebook.exists() or notebook.read_text() != text:
        notebook.parent.mkdir(parents=True, exist_ok=True)
        notebook.write_text(text)
        changed.append(notebook)
    for name in LAB_FILES:
        if (root / name).is_file():
            _copy_if_changed(root / name, source_dir / name, changed)
        elif name in REQUIRED_LAB_FILES:
            raise BuildError(f"{root / name} is missing: every lab ships it")
        elif (source_dir / name).exists():  # the repository no longer has it: neither does the lab
            (source_dir / name).unlink()
            changed.append(source_dir / name)
    reference = student_reference_path(root, lab)  # the lab's measured runs, for students (paths.STUDENT_REFERENCE)
    if reference.is_file():
        _copy_if_changed(reference, source_dir / STUDENT_REFERENCE, changed)
    elif (source_dir / STUDENT_REFERENCE).exists():
        (source_dir / STUDENT_REFERENCE).unlink()
        changed.append(source_dir / STUDENT_REFERENCE)
    if (root / "assets").is_dir():
        sync_tree(root / "assets", source_dir / "assets", changed)
    return changed + generate_release(lab, source_dir, out_root / "release" / lab, bundle_url(lab, root))


def record_grade_ids(lab: str, root: Path = REPO_ROOT) -> list[Path]:
    """Append the lab's new grade ids to ``labs/<lab>/grade_ids.lock`` (ids are never renamed once released)."""
    lock = root / "labs" / lab / "grade_ids.lock"
    known = [line.strip() for line in lock.read_text().splitlines()] if lock.exists() else []
    ids = [gid for cell in read_notebook(root / "source" / lab / f"{lab}.ipynb").cells if (gid := grade_id(cell))]
    new = [gid for gid in ids if gid not in known]
    if not new:
        return []
    lock.write_text("\n".join((known or [LOCK_HEADER]) + new) + "\n")
    return [lock]


def main(labs: list[str], root: Path = REPO_ROOT) -> int:
    for lab in labs:
        try:
            changed = build_lab(lab, root) + record_grade_ids(lab, root)
        except BuildError as exc:
            print(f"build {lab}: FAILED\n{exc}")
            return 1
        print(f"build {lab}: {len(changed)} file(s) changed" + "".join(f"\n  {p.relative_to(root)}" for p in changed))
    return 0
