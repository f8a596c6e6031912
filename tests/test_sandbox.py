"""Autograding runs every student kernel in the bubblewrap sandbox (course/sandbox.py).

A submission whose answer is right only when every attempt to escape failed (read solutions, the gradebook,
another submission, the repository and the hidden tests nbgrader wrote into the notebook beside the kernel; reach
a TCP listener; read the grader's environment; write into the course folder; allocate past the memory cap) earns
full marks sandboxed and less with the sandbox off.
"""
from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from course import sandbox
from course.grade import grade_lab
from course.nbgrader_run import make_course_dir
from course.notebooks import grade_id, make_submission, read_notebook, write_notebook

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixture_lab import LAB, POINTS, REPO, built_root  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

FULL_MARKS = sum(POINTS.values())
MEMORY_CAP_GB = 1
ATTACK = '''\
import mmap, os, socket


def _escapes():
    def read(path):
        with open(path, "rb") as handle:
            handle.read(1)

    def find_hidden_test(path):
        with open(path) as handle:
            assert "add(-40, 17)" in handle.read()

    def write(path):
        with open(path, "w") as handle:
            handle.write("written by a student")

    attempts = {{
        "read source/": lambda: read({source!r}),
        "read the gradebook": lambda: read({gradebook!r}),
        "read another submission": lambda: read({other!r}),
        "read the repository": lambda: read({repo_file!r}),
        "read hidden tests in ./{lab}.ipynb": lambda: find_hidden_test("{lab}.ipynb"),
        "connect to 127.0.0.1": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5).close(),
        "read NBGRADER_EXECUTION": lambda: os.environ["NBGRADER_EXECUTION"],
        "read NBGRADER_DB_URL": lambda: os.environ["NBGRADER_DB_URL"],
        "read EFFICIENT_AI_REPO": lambda: os.environ["EFFICIENT_AI_REPO"],
        "write into the course": lambda: write({planted!r}),
        "allocate past the cap": lambda: mmap.mmap(-1, {allocate_bytes}),
    }}
    succeeded = []
    for name, attempt in attempts.items():
        try:
            attempt()
            succeeded.append(name)
        except Exception:
            pass
    return succeeded


ESCAPED = _escapes()
print("escapes that worked:", ESCAPED)


def add(a, b):
    return a + b if not ESCAPED else a - b
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    reason = sandbox.unavailable_reason()
    assert reason is None, f"bwrap is installed but cannot sandbox here: {reason}"
    return built_root(tmp_path_factory.mktemp("sandbox"))


@pytest.fixture
def listener():
    """A TCP socket listening on 127.0.0.1; the port."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


def make_course(root: Path, course: Path, port: int) -> Path:
    """A course with two submissions: ``honest`` (the reference answers) and ``mallory`` (ATTACK in q1_1_add)."""
    make_course_dir(course, [LAB], root)
    src = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    honest = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"), src)
    write_notebook(honest, course / "submitted" / "honest" / LAB / f"{LAB}.ipynb")
    attack = ATTACK.format(
        source=str(course / "source" / LAB / f"{LAB}.ipynb"),
        gradebook=str(course / "gradebook.db"),
        other=str(course / "submitted" / "honest" / LAB / f"{LAB}.ipynb"),
        repo_file=str(REPO / "nbgrader_config.py"),
        lab=LAB,
        port=port,
        planted=str(course / "planted.txt"),
        allocate_bytes=2 * MEMORY_CAP_GB << 30,
    )
    for cell in honest.cells:
        if grade_id(cell) == "q1_1_add":
            cell.source = attack
    write_notebook(honest, course / "submitted" / "mallory" / LAB / f"{LAB}.ipynb")
    return course


def grade(course: Path, mode: str, monkeypatch) -> tuple[dict[str, float], str]:
    """Autograde both submissions with EFFICIENT_AI_SANDBOX=mode; their scores and what mallory's attack printed."""
    monkeypatch.setenv("EFFICIENT_AI_SANDBOX", mode)
    monkeypatch.setenv("EFFICIENT_AI_SANDBOX_MEMORY_GB", str(MEMORY_CAP_GB))
    monkeypatch.setenv("NBGRADER_DB_URL", f"sqlite:///{course / 'gradebook.db'}")  # so the kernel could see it
    outcomes, scores = grade_lab(course, LAB, progress=False)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    graded = read_notebook(course / "autograded" / "mallory" / LAB / f"{LAB}.ipynb")
    printed = "".join(
        out.get("text", "") for cell in graded.cells if grade_id(cell) == "q1_1_add" for out in cell.get("outputs", [])
    )
    return {s: scores[s].autograded_score() for s in outcomes}, printed


def test_every_escape_fails_in_the_sandbox_and_works_without_it(root, tmp_path, listener, monkeypatch):
    sandboxed, printed = grade(make_course(root, tmp_path / "on", listener), "on", monkeypatch)
    assert "escapes that worked: []" in printed, printed
    assert sandboxed == {"honest": FULL_MARKS, "mallory": FULL_MARKS}, printed
    assert not (tmp_path / "on" / "planted.txt").exists()

    # Control: the same attack succeeds without the sandbox, so the test above can fail.
    unsandboxed, printed = grade(make_course(root, tmp_path / "off", listener), "off", monkeypatch)
    for escape in ("read source/", "read the gradebook", f"read hidden tests in ./{LAB}.ipynb", "connect to 127.0.0.1",
                   "read NBGRADER_EXECUTION", "read NBGRADER_DB_URL", "write into the course", "allocate past the cap"):
        assert escape in printed, printed
    assert unsandboxed == {"honest": FULL_MARKS, "mallory": FULL_MARKS - POINTS["q1_1_add"]}, printed
    assert (tmp_path / "off" / "planted.txt").exists()


def test_without_bwrap_auto_warns_and_on_refuses(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")  # no bwrap to be found
    monkeypatch.setenv("EFFICIENT_AI_SANDBOX", "on")
    with pytest.raises(SystemExit, match="cannot be sandboxed: bubblewrap is not installed"):
        sandbox.configure_sandbox(Config())
    monkeypatch.setattr(sandbox, "_warned", False)
    monkeypatch.setenv("EFFICIENT_AI_SANDBOX", "auto")
    config = Config()
    sandbox.configure_sandbox(config)
    assert "grading is NOT sandboxed" in capsys.readouterr().err
    assert "kernel_name" not in config.Execute, "auto without bwrap must leave nbgrader's kernel alone"
