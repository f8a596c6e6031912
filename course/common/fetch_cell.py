"""The cell that fetches a lab's files where its release notebook sits alone (Google Colab, a notebook downloaded on
its own), from the course's published bundle (``labs/bundle_url.txt``). ``build`` puts it first in each release
notebook; ``scan`` recognises it as the course's code. Apart from ``build`` (which runs nbgrader), so that a scan
imports nothing of the grading path.
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from .notebooks import NB_VERSION
from .paths import LAB_FILES, REPO_ROOT, STUDENT_REFERENCE, TEMPLATES_DIR

FETCH_CELL_TEMPLATE = TEMPLATES_DIR / "fetch_cell" / "cell.txt"
FETCH_CELL_ID = "fetch-lab-files"


def bundle_url(lab: str, root: Path = REPO_ROOT) -> str:
    """Where the course publishes ``lab``'s student bundle (``course bundle``'s zip): the one line of
    ``labs/bundle_url.txt`` with ``{lab}`` replaced; "" when the file is absent or empty."""
    path = root / "labs" / "bundle_url.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    url = next((line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")), "")
    return url.replace("{lab}", lab)


def fetch_cell_source(url: str, lab: str) -> str:
    """The code of the fetch cell of ``lab``'s release notebook, fetching from the bundle at ``url``."""
    files = (*LAB_FILES, STUDENT_REFERENCE)  # the reference is fetched when the bundle has one
    text = FETCH_CELL_TEMPLATE.read_text().format(url=url, lab=lab, files=files, listed=", ".join(files))
    return text.rstrip("\n")


def add_fetch_cell(notebook: Path, url: str) -> None:
    """Put the cell that fetches the lab's files where they are missing (Colab) first among the release notebook's
    code cells, unless it has one."""
    nb = nbformat.read(notebook, as_version=NB_VERSION)
    if any(cell.get("id") == FETCH_CELL_ID for cell in nb.cells):
        return
    cell = nbformat.v4.new_code_cell(fetch_cell_source(url, notebook.stem))
    cell["id"] = FETCH_CELL_ID
    first_code = next(i for i, other in enumerate(nb.cells) if other.cell_type == "code")
    nb.cells.insert(first_code, cell)
    nbformat.write(nb, notebook)
