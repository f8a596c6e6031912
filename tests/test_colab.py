"""A release notebook opened alone, as on Google Colab, fetches its lab files from the course's published bundle.

The fixture lab is built with ``labs/bundle_url.txt`` naming a bundle served over HTTP on the loopback address by the
test (``course bundle``'s zip). The release notebook alone in an empty folder runs its first cells in a real kernel:
the fetch cell brings the lab files (``utils.py``, ``_utils_private.py``, ``checks.py``, ``requirements.txt``) and
``assets/``, and the setup cell then imports them. With the
files present the cell fetches nothing; without a URL the build adds no cell.
"""
from __future__ import annotations

import functools
import http.server
import shutil
import threading

import nbformat
import pytest
from fixture_lab import LAB, REPO, make_root

from course.cli import build, bundle
from course.common.fetch_cell import FETCH_CELL_ID
from course.common.notebooks import grade_id, read_notebook
from course.common.paths import LAB_FILES


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A built fixture root whose release fetches from a loopback HTTP server serving its bundle."""
    site = tmp_path_factory.mktemp("site")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    root = make_root(tmp_path_factory.mktemp("colab-root"))
    for name in ("_utils_private.py", "requirements.txt"):  # beside the fixture's stand-in utils.py
        shutil.copy2(REPO / name, root / name)
    (root / "labs" / "bundle_url.txt").write_text(
        f"# where the course publishes its bundles\nhttp://127.0.0.1:{server.server_port}/{{lab}}.zip\n")
    assert build.main([LAB], root) == 0
    assert bundle.main([LAB], site, root) == 0  # site/lab0.zip, as an instructor publishes it
    yield root, site
    server.shutdown()


def run_first_cells(notebook, folder, count: int) -> list[str]:
    """Execute the first ``count`` code cells of ``notebook`` in a fresh kernel working in ``folder``; their text
    output, one string per cell."""
    from nbclient import NotebookClient

    nb = read_notebook(notebook)
    code = [cell for cell in nb.cells if cell.cell_type == "code"][:count]
    nb.cells = code
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}}).execute()
    return ["".join(out.get("text", "") for out in cell.outputs) for cell in nb.cells]


def test_a_lone_release_notebook_fetches_its_files_and_runs(served, tmp_path):
    root, _ = served
    release = root / "release" / LAB / f"{LAB}.ipynb"
    nb = read_notebook(release)
    first_code = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert first_code.get("id") == FETCH_CELL_ID and grade_id(first_code) is None, (
        "the fetch cell is the first code cell, an ordinary one (grading restores nothing of it)")
    alone = tmp_path / "content"  # Colab's working folder holds the uploaded notebook only
    alone.mkdir()
    shutil.copy2(release, alone / f"{LAB}.ipynb")
    fetch_output, setup_output = run_first_cells(alone / f"{LAB}.ipynb", alone, 2)
    assert f"Fetched {len(LAB_FILES) + 1} lab files" in fetch_output, fetch_output  # LAB_FILES, assets/figure.png
    for name in LAB_FILES:  # requirements.txt too: the environment report checks versions against it
        assert (alone / name).read_bytes() == (root / "release" / LAB / name).read_bytes(), name
    assert (alone / "assets" / "figure.png").is_file()
    assert not (alone / "README.md").exists(), "only the lab's files are taken from the bundle"
    again, _ = run_first_cells(alone / f"{LAB}.ipynb", alone, 2)
    assert again == "", "with the files present the cell fetches nothing and says nothing"


def test_no_url_no_fetch_cell(tmp_path):
    root = make_root(tmp_path / "root")
    assert build.main([LAB], root) == 0
    nb = nbformat.read(root / "release" / LAB / f"{LAB}.ipynb", as_version=4)
    assert all(cell.get("id") != FETCH_CELL_ID for cell in nb.cells)
