"""What students get (``course bundle``) and the solutions they get after the deadline (``course solutions``), on the
tiny fixture lab with the course's own lab files (``utils.py``, ``_utils_private.py``, ``checks.py``,
``requirements.txt``): exactly the release and a README, no solution or hidden-test text, and an unzipped bundle whose
environment report checks the installed versions against its own ``requirements.txt``; every model solution and no
hidden test or mark scheme."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fixture_lab import LAB, REPO, make_root

from course.cli import build, bundle, lint, solutions
from course.common.notebooks import HIDDEN_BEGIN, MARK_SCHEME_BEGIN, SOLUTION_BEGIN, read_notebook
from course.common.paths import LAB_FILES, STUDENT_REFERENCE

SECRETS = ("add(-40, 17)", "scale(0.5, 7.25)", "square(-9)", "Any reasonable answer", "=== BEGIN MARK SCHEME ===",
           HIDDEN_BEGIN, SOLUTION_BEGIN)  # hidden tests, the mark scheme and delimiters of tests/fixtures/lab0
MODEL_SOLUTIONS = ("return a + b", "return x * factor_per_unit", "return x * x", "Because it is the simplest")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = make_root(tmp_path_factory.mktemp("bundle"))
    for name in LAB_FILES:  # the course's own, in place of the fixture's stand-in utils.py
        shutil.copy2(REPO / name, root / name)
    assert build.main([LAB], root) == 0
    return root


def test_bundle_holds_the_release_and_a_readme_only(root, tmp_path):
    out = tmp_path / "out"
    assert bundle.main([LAB], out, root) == 0
    release = bundle.release_files(root / "release" / LAB)
    folder, zipped = bundle.release_files(out / LAB), bundle.zip_files(out / f"{LAB}.zip", LAB)
    assert set(folder) == set(release) | {"README.md"} == {"lab0.ipynb", *LAB_FILES, "assets/figure.png",
                                                         "README.md"}, sorted(folder)
    assert folder["requirements.txt"] == (REPO / "requirements.txt").read_bytes(), "the students' requirements"
    assert zipped == folder, "the zip holds the folder's files, below one top folder lab0/"
    assert all(folder[name] == release[name] for name in release), "the release's files, byte for byte"
    readme = folder["README.md"].decode()
    for needed in ("jupyter lab lab0.ipynb", "pip install -r requirements.txt", "pip install -q 'torch>=", "Colab",
                   "lab0.zip", "What to submit", "_utils_private.py"):
        assert needed in readme, f"the students' README says {needed!r}"
    for name, content in folder.items():
        for secret in SECRETS:
            assert secret.encode() not in content, f"{name} shows {secret!r}"
    assert sorted(p.name for p in out.iterdir()) == [LAB, f"{LAB}.zip"], "nothing else is written"


def test_the_readme_states_the_scales_as_utils_reads_them(root):
    """On a CPU the default is the cpu scale (not quick), and EFFICIENT_AI_SCALE overrides it (utils.SCALE)."""
    readme = bundle.bundle_contents(LAB, root)["README.md"].decode()
    flat = " ".join(readme.split())
    assert "On a CUDA GPU the default is *teaching*" in flat and "on a CPU it is *cpu*" in flat, readme
    assert "`EFFICIENT_AI_SCALE=teaching`, `cpu` or `quick`" in flat, readme
    assert "quick scale" not in flat, "a CPU does not run at quick scale unless asked"


def test_an_unzipped_bundle_checks_versions_against_its_own_requirements(root, tmp_path):
    """The first cell's version check (utils.print_environment_report) finds the bundle's requirements.txt: unzipped
    alone, without this repository on the path, it names an installed version outside it."""
    out = tmp_path / "out"
    assert bundle.main([LAB], out, root) == 0
    with zipfile.ZipFile(out / f"{LAB}.zip") as archive:
        archive.extractall(tmp_path / "student")
    folder = tmp_path / "student" / LAB
    (folder / "requirements.txt").write_text((folder / "requirements.txt").read_text() + "numpy<1.0\n")
    probe = ("import _utils_private, utils; print('found', _utils_private.find_requirements()); "
             "utils.print_environment_report('lab0')")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"found {folder / 'requirements.txt'}" in done.stdout, done.stdout
    assert "Package numpy" in done.stdout and "pip install 'numpy<1.0'" in done.stdout, done.stdout
    assert "reports/" not in done.stdout, "the report cites nothing the bundle lacks"


def test_bundle_refuses_solution_text_and_extra_files(root):
    files = bundle.bundle_contents(LAB, root)
    assert bundle.check_bundle(LAB, files, root) == []
    leaky = json.loads(files["lab0.ipynb"])
    leaky["cells"][-1]["source"] = "assert square(-9) == 81, \"square(-9) must be 81\"\n"
    problems = bundle.check_bundle(LAB, {**files, "lab0.ipynb": json.dumps(leaky).encode()}, root)
    assert any("hidden tests" in p for p in problems) and any("differs from release" in p for p in problems), problems
    problems = bundle.check_bundle(LAB, {**files, "source/lab0.ipynb": b"{}", "utils.py": b"### BEGIN SOLUTION\n"}, root)
    assert any("not part of release" in p for p in problems), problems
    assert any("delimiter '### BEGIN SOLUTION'" in p for p in problems), problems


def test_bundle_rewrites_its_folder_and_keeps_a_repository(root, tmp_path):
    out = tmp_path / "students"
    (out / LAB / ".git").mkdir(parents=True)
    (out / LAB / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # a repository holds files
    (out / LAB / "stale.txt").write_text("from an older bundle")
    assert bundle.main([LAB], out, root) == 0
    assert (out / LAB / ".git" / "HEAD").is_file() and not (out / LAB / "stale.txt").exists()
    assert bundle.main([LAB], root / "release" / "x", root) == 2, "never inside the release"


def test_a_failed_zip_write_leaves_the_earlier_zip_and_no_partial_one(root, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert bundle.main([LAB], out, root) == 0
    earlier = (out / f"{LAB}.zip").read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bundle.zipfile.ZipFile, "writestr", disk_full)
    with pytest.raises(OSError):
        bundle.write_zip(bundle.bundle_contents(LAB, root), out / f"{LAB}.zip", LAB)
    assert (out / f"{LAB}.zip").read_bytes() == earlier, "the earlier zip must stay whole"
    assert sorted(p.name for p in out.iterdir()) == [LAB, f"{LAB}.zip"], "no partial zip may be left behind"


def test_jupyter_checkpoints_and_caches_are_not_bundled(root, tmp_path):
    release = root / "release" / LAB
    caches = (".ipynb_checkpoints", "__pycache__")
    for cache, name in zip(caches, (f"{LAB}-checkpoint.ipynb", "utils.cpython-311.pyc")):
        (release / cache).mkdir(exist_ok=True)
        (release / cache / name).write_text("{}")
    try:
        assert bundle.main([LAB], tmp_path, root) == 0
        assert not any((tmp_path / LAB / cache).exists() for cache in caches)
        assert not [name for name in bundle.zip_files(tmp_path / f"{LAB}.zip", LAB) if name.startswith(caches)]
    finally:
        for cache in caches:
            shutil.rmtree(release / cache, ignore_errors=True)


def test_solutions_show_every_model_solution_and_no_hidden_test(root, tmp_path):
    assert solutions.main([LAB], tmp_path, root) == 0
    path = tmp_path / f"{LAB}_solution.ipynb"
    text = "\n".join(cell.source for cell in read_notebook(path).cells)
    for model in MODEL_SOLUTIONS:
        assert model in text, f"the solution notebook shows {model!r}"
    for secret in SECRETS:
        assert secret not in text, f"the solution notebook shows {secret!r}"
    assert "assert add(1, 2) == 3" in text, "public tests stay"


def test_solutions_check_finds_mark_schemes_and_missing_solutions(root):
    source_nb = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    release_nb = read_notebook(root / "release" / LAB / f"{LAB}.ipynb")
    good = solutions.solution_notebook(source_nb, release_nb)
    assert solutions.check_solution_notebook(source_nb, good) == []
    assert solutions.check_solution_notebook(source_nb, release_nb) != [], "stubs are not solutions"
    code = next(c for c in good.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "q1_1_add")
    code.source = f"# {MARK_SCHEME_BEGIN}\n# Any reasonable answer.\n" + code.source
    problems = solutions.check_solution_notebook(source_nb, good)
    assert any("delimiter" in p for p in problems) and any("q1_1_add" in p for p in problems), problems


def test_the_student_reference_ships_in_the_bundle_and_leaks_nothing(tmp_path):
    """A lab's ``labs/labN/measured_runs.md`` goes through build into source/ and release/, and so into the bundle;
    the bundle check (and lint) fail when it holds a number only the hidden tests hold, at any precision it is
    written, or a hidden test's line; the lab's other numbers pass."""
    root = make_root(tmp_path / "repo")
    for name in LAB_FILES:
        shutil.copy2(REPO / name, root / name)
    clean = "# Lab 0: measured runs\n\n```\nadd: 0.1234 ms, scale: 725 ms (3.5x), square: 81.5 us\n```\n"
    (root / "labs" / LAB / STUDENT_REFERENCE).write_text(clean)
    assert build.main([LAB], root) == 0
    assert (root / "release" / LAB / STUDENT_REFERENCE).read_text() == clean, "build ships it in the release"
    out = tmp_path / "out"
    assert bundle.main([LAB], out, root) == 0
    assert (out / LAB / STUDENT_REFERENCE).read_text() == clean
    assert STUDENT_REFERENCE in bundle.zip_files(out / f"{LAB}.zip", LAB)
    assert f"`{STUDENT_REFERENCE}` holds what the course measured" in (out / LAB / "README.md").read_text()
    assert lint.lint_lab(LAB, root, check_fresh=False) == []
    files = bundle.bundle_contents(LAB, root)
    assert bundle.check_bundle(LAB, files, root) == []
    # Planted leaks: lab0's hidden tests hold scale(0.5, 7.25) == 3.625 and square(-9) == 81.
    for leak, shows in [("scale took 3.625 ms", "3.625"), ("scale: 3.63 ms", "3.625"), ("factor 7.25", "7.25"),
                        ('assert square(-9) == 81, "square(-9) must be 81"', "hidden tests")]:
        planted = {**files, STUDENT_REFERENCE: (clean + leak + "\n").encode()}
        problems = bundle.check_bundle(LAB, planted, root)
        assert any(STUDENT_REFERENCE in p and shows in p for p in problems), (leak, problems)
    (root / "release" / LAB / STUDENT_REFERENCE).write_text(clean + "scale took 3.625 ms\n")
    assert any("3.625" in str(p) for p in lint.lint_lab(LAB, root, check_fresh=False)), "lint checks the release's"
