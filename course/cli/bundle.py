"""bundle: what students get of a lab: ``python -m course bundle [labs...] --out DIR`` (outside this repository, which
holds every solution) writes ``DIR/labN/`` (for a student repository) and ``DIR/labN.zip`` (for an LMS): exactly
``release/labN/``'s files and a README for students, checked for solution and hidden-test text before success.
"""
from __future__ import annotations

import shlex
import shutil
import zipfile
from pathlib import Path

import nbformat

from ..common.notebooks import NB_VERSION, NotebookError, read_notebook
from ..common.paths import REPO_ROOT, STUDENT_REFERENCE, TEACHING_GPU, TEMPLATES_DIR, is_cache, source_notebook_path
from .lint import check_reference_leaks, check_release_leaks

README_TEMPLATE = TEMPLATES_DIR / "student_bundle" / "README.md"
README = "README.md"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # one fixed date: the same bundle zips to the same bytes
COLAB_PROVIDES = ("jupyterlab", "ipykernel")  # Colab runs its own notebook server and kernel


class BundleError(Exception):
    """A bundle could not be written, or failed its check; the message says why."""


def release_files(folder: Path) -> dict[str, bytes]:
    """Relative path (POSIX) -> content of every file under ``folder``, caches and checkpoints left out."""
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and not is_cache(path.relative_to(folder))}


def zip_files(zip_path: Path, lab: str) -> dict[str, bytes]:
    """Relative path (below the zip's top folder ``lab/``) -> content of every file in a bundle zip."""
    with zipfile.ZipFile(zip_path) as archive:
        return {name.removeprefix(f"{lab}/") if name.startswith(f"{lab}/") else f"(outside {lab}/) {name}":
                archive.read(name) for name in archive.namelist() if not name.endswith("/")}


def pip_requirements(requirements: Path, leave_out: tuple[str, ...] = ()) -> str:
    """The specifiers of a requirements file as shell-quoted ``pip install`` arguments, less those in ``leave_out``."""
    specs = [line.split(" #")[0].strip() for line in requirements.read_text().splitlines()]
    return " ".join(shlex.quote(spec) for spec in specs if spec and not spec.startswith(("#", "-", *leave_out)))


def bundle_contents(lab: str, root: Path = REPO_ROOT) -> dict[str, bytes]:
    """What a lab's bundle holds: ``release/<lab>/``'s files (the notebook and ``paths.LAB_FILES``: the helpers, the
    students' ``requirements.txt``, which the first cell's version check reads) and the students' README (opening
    the lab locally and on Colab, the scales, what to submit)."""
    files = release_files(root / "release" / lab)
    notebook = f"{lab}.ipynb"
    if notebook not in files:
        raise BundleError(f"{root / 'release' / lab / notebook} is missing: run `python -m course build {lab}`")
    nb = nbformat.reads(files[notebook].decode(), as_version=NB_VERSION)
    first = next((cell.source for cell in nb.cells if cell.cell_type == "markdown"), "")
    title = next((line[2:].strip() for line in first.splitlines() if line.startswith("# ")), lab)
    requirements = root / "requirements.txt"
    reference = (f" `{STUDENT_REFERENCE}` holds what the course measured when it ran the notebook (on an {TEACHING_GPU} and on a"
                 " CPU): read it when a question needs numbers your machine cannot produce."
                 if STUDENT_REFERENCE in files else "")
    files[README] = README_TEMPLATE.read_text().format(
        title=title, lab_title=title.split(":")[0], lab=lab, reference=reference,
        colab_requirements=pip_requirements(requirements, COLAB_PROVIDES)).encode()
    return files


def check_bundle(lab: str, files: dict[str, bytes], root: Path = REPO_ROOT) -> list[str]:
    """Problems of a bundle's files (empty when none): a file that is not the release's or the README, a release
    file missing or changed, and solution or hidden-test text (only delimiters in other files than the notebook, the
    README and the student reference: ``utils.py`` shares short lines with solutions, such as
    ``start = time.perf_counter()``); the student reference (``measured_runs.md``) is checked by
    ``lint.check_reference_leaks``: no line of a solution, hidden test or model answer, no number only they hold."""
    release = release_files(root / "release" / lab)
    problems = [f"{name}: not part of release/{lab}/ nor the README" for name in sorted(set(files) - set(release) - {README})]
    problems += [f"{name}: missing (release/{lab}/ has it)" for name in sorted(set(release) - set(files))]
    problems += [f"{name}: differs from release/{lab}/{name}" for name in sorted(set(release) & set(files))
                 if files[name] != release[name]]
    try:
        source_nb = read_notebook(source_notebook_path(root, lab))
    except NotebookError as exc:
        return problems + [f"cannot check for leaks: {exc}"]
    shown = "\n".join(content.decode(errors="replace") for name, content in files.items() if name.endswith(".py"))
    for name, content in sorted(files.items()):
        try:
            text = content.decode()
            if name == STUDENT_REFERENCE:  # the lab's measured runs: no answer, no hidden test's number
                release_nb = nbformat.reads(files.get(f"{lab}.ipynb", b"{}").decode(), as_version=NB_VERSION)
                problems += [f"{name}: {problem.message}"
                             for problem in check_reference_leaks(lab, source_nb, release_nb, text, shown)]
                continue
            nb = (nbformat.reads(text, as_version=NB_VERSION) if name.endswith(".ipynb")
                  else nbformat.v4.new_notebook(cells=[nbformat.v4.new_raw_cell(text)]))
        except UnicodeDecodeError:
            continue  # a figure
        except Exception as exc:  # noqa: BLE001 - nbformat raises several types for malformed JSON
            problems.append(f"{name}: not a readable notebook ({type(exc).__name__})")
            continue
        against = source_nb if name.endswith(".ipynb") or name == README else nbformat.v4.new_notebook()
        problems += [f"{name}: {problem.message}" for problem in check_release_leaks(lab, against, nb)]
    return problems


def write_zip(files: dict[str, bytes], zip_path: Path, lab: str) -> None:
    """Write ``files`` into ``zip_path`` below one top folder ``lab/`` (unzipping makes the bundle's folder). The zip
    is written beside ``zip_path`` and then moved there, so a failed write (a full disk) leaves no partial zip."""
    part = zip_path.with_name(zip_path.name + ".part")
    try:
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, content in sorted(files.items()):
                info = zipfile.ZipInfo(f"{lab}/{name}", date_time=ZIP_DATE)
                info.external_attr = 0o644 << 16
                archive.writestr(info, content, zipfile.ZIP_DEFLATED)
        part.replace(zip_path)
    finally:
        part.unlink(missing_ok=True)


def write_folder(files: dict[str, bytes], folder: Path) -> None:
    """Make ``folder`` hold exactly ``files``; top-level entries named ``.*`` (a student repository's ``.git``) stay."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if entry.name.startswith("."):
            continue
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)


def write_bundle(lab: str, out_dir: Path, root: Path = REPO_ROOT) -> tuple[Path, Path]:
    """Write and check ``out_dir/<lab>/`` and ``out_dir/<lab>.zip``; returns both paths.

    Raises:
        BundleError: the release is missing, or what was written failed its check (none of it is left then).
    """
    files = bundle_contents(lab, root)
    if problems := check_bundle(lab, files, root):
        raise BundleError("\n".join(problems))
    folder, zip_path = out_dir / lab, out_dir / f"{lab}.zip"
    write_folder(files, folder)
    write_zip(files, zip_path, lab)
    in_folder = {name: content for name, content in release_files(folder).items()
                 if name in files or not name.startswith(".")}  # a student repository's .git is not the bundle's
    written = {"folder": in_folder, "zip": zip_files(zip_path, lab)}
    problems = [f"{kind}: {problem}" for kind, found in written.items() for problem in check_bundle(lab, found, root)]
    if problems:
        write_folder({}, folder)  # emptied, its .git kept
        zip_path.unlink()
        raise BundleError("\n".join(problems))
    return folder, zip_path


def main(labs: list[str], out_dir: Path, root: Path = REPO_ROOT) -> int:
    out_dir = out_dir.resolve()
    trees = [(root / tree).resolve() for tree in ("labs", "source", "release")]
    if out_dir == root.resolve() or any(out_dir == tree or tree in out_dir.parents for tree in trees):
        print(f"bundle: --out {out_dir} is this repository or inside labs/, source/ or release/: name another folder")
        return 2
    for lab in labs:
        try:
            folder, zip_path = write_bundle(lab, out_dir, root)
        except BundleError as exc:
            print(f"bundle {lab}: FAILED\n{exc}")
            return 1
        print(f"bundle {lab}: {folder}/ and {zip_path} ({len(release_files(folder))} files; checked: the release's "
              f"files and {README} only, no solution or hidden-test text, no answer in {STUDENT_REFERENCE})")
    return 0
