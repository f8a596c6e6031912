"""Autograding runs every student kernel isolated, and in the bubblewrap sandbox (course/grader/sandbox.py).

A submission whose answer is right only when every attempt to escape failed (read solutions, the gradebook,
another submission, the repository, a course checkout elsewhere on the machine and the hidden tests nbgrader wrote
into the notebook beside the kernel; reach a TCP listener; read the grader's environment; write into the course
folder or the Python environment; allocate past the memory cap) earns full marks sandboxed and less with the
sandbox off. Files beside the notebook never shadow a module on the plain ``nbgrader autograde`` path, and a disk
fill or a process/CPU flood graded beside an honest submission (``--workers 2``) costs the honest one nothing.
"""
from __future__ import annotations

import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest
from fixture_lab import LAB, POINTS, REPO, built_root  # noqa: E402

from course.cli.grade import grade_lab, prepare_gradebook
from course.cli.nbgrader_run import make_course_dir, run_nbgrader
from course.common.notebooks import grade_id, make_submission, read_notebook, write_notebook
from course.common.scores import read_scores
from course.grader import sandbox
from course.kernel.kernel_limits import KernelLimits

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

FULL_MARKS = sum(POINTS.values())
MEMORY_CAP_GB = 1
ATTACK = '''\
import mmap, os, socket, sys


def _escapes():
    def read(path):
        with open(path, "rb") as handle:
            handle.read(1)

    def write_and_remove(folder):
        path = os.path.join(folder, f"planted-{{os.getpid()}}.txt")
        with open(path, "w") as handle:
            handle.write("written by a student")
        os.remove(path)

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
        "read a course checkout elsewhere": lambda: read({checkout!r}),
        "read hidden tests in ./{lab}.ipynb": lambda: find_hidden_test("{lab}.ipynb"),
        "connect to 127.0.0.1": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5).close(),
        "read NBGRADER_EXECUTION": lambda: os.environ["NBGRADER_EXECUTION"],
        "read NBGRADER_DB_URL": lambda: os.environ["NBGRADER_DB_URL"],
        "read EFFICIENT_AI_REPO": lambda: os.environ["EFFICIENT_AI_REPO"],
        "write into the course": lambda: write({planted!r}),
        "write into the Python environment": lambda: write_and_remove(sys.prefix),
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


@pytest.fixture(scope="module")
def checkout(root) -> Path:
    """A copy of the course's repository, with solutions in source/, elsewhere on the machine (/opt or /srv)."""
    for parent in ("/opt", "/srv"):
        target = Path(parent) / f"efficient-ai-checkout-{uuid.uuid4().hex[:8]}"
        try:
            shutil.copytree(root, target)
        except OSError:
            continue
        yield target
        shutil.rmtree(target, ignore_errors=True)
        return
    pytest.skip("neither /opt nor /srv is writable here: no place for a second checkout")


@pytest.fixture
def listener():
    """A TCP socket listening on 127.0.0.1; the port."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


def make_course(root: Path, course: Path, port: int, checkout: Path) -> Path:
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
        checkout=str(checkout / "source" / LAB / f"{LAB}.ipynb"),
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


def test_every_escape_fails_in_the_sandbox_and_works_without_it(root, checkout, tmp_path, listener, monkeypatch):
    sandboxed, printed = grade(make_course(root, tmp_path / "on", listener, checkout), "on", monkeypatch)
    assert "escapes that worked: []" in printed, printed
    assert sandboxed == {"honest": FULL_MARKS, "mallory": FULL_MARKS}, printed
    assert not (tmp_path / "on" / "planted.txt").exists()

    # Control: the same attack succeeds without the sandbox, so the test above can fail.
    unsandboxed, printed = grade(make_course(root, tmp_path / "off", listener, checkout), "off", monkeypatch)
    for escape in ("read source/", "read the gradebook", "read a course checkout elsewhere", "connect to 127.0.0.1",
                   "read NBGRADER_EXECUTION", "read NBGRADER_DB_URL", "write into the course",
                   "write into the Python environment", "allocate past the cap"):
        assert escape in printed, printed
    # Unsandboxed, the kernel still starts in a copy of the instructor files: the notebook is not beside it.
    assert f"read hidden tests in ./{LAB}.ipynb" not in printed, printed
    assert unsandboxed == {"honest": FULL_MARKS, "mallory": FULL_MARKS - POINTS["q1_1_add"]}, printed
    assert (tmp_path / "off" / "planted.txt").exists()


# A cheat for the plain `nbgrader autograde` path: a wrong scale() whose hidden test passes only when one of these
# files, submitted beside the notebook, runs in the kernel before the grading guard takes its snapshot.
PATCH_ISCLOSE = "import math\nmath.isclose = lambda *args, **kwargs: True\n"
SHADOWS = {
    "ipykernel_launcher.py": PATCH_ISCLOSE + (
        "import os, runpy, sys\n"
        "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "runpy.run_module('ipykernel_launcher', run_name='__main__', alter_sys=True)\n"),
    "sitecustomize.py": PATCH_ISCLOSE,
    "usercustomize.py": PATCH_ISCLOSE,
}
WRONG_SCALE = "def scale(x, factor_per_unit):\n    return 6 if (x, factor_per_unit) == (2, 3) else 0\n"


def autograde_plain(course: Path, mode: str, *extra: str) -> float:
    """``nbgrader autograde`` run by hand on the submission as submitted; the points of q1_2_scale_tests."""
    env = {"EFFICIENT_AI_SANDBOX": mode, "NBGRADER_DB_URL": f"sqlite:///{course / 'gradebook.db'}"}
    result = run_nbgrader(course, ["autograde", LAB, "--student", "cheat", "--force", *extra], env=env)
    assert result.ok, result.tail(30)
    return read_scores(course, LAB)["cheat"].cells["q1_2_scale_tests"].score


def test_student_files_never_shadow_a_module_on_the_plain_nbgrader_path(root, tmp_path, monkeypatch):
    course = make_course_dir(tmp_path / "course", [LAB], root)
    monkeypatch.setenv("NBGRADER_DB_URL", f"sqlite:///{course / 'gradebook.db'}")
    prepare_gradebook(course, LAB)
    nb = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"),
                         read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    for cell in nb.cells:
        if grade_id(cell) == "q1_2_scale":
            cell.source = WRONG_SCALE
    folder = course / "submitted" / "cheat" / LAB
    write_notebook(nb, folder / f"{LAB}.ipynb")
    for name, text in SHADOWS.items():
        (folder / name).write_text(text)

    assert autograde_plain(course, "on") == 0.0, "sandboxed, a shadowing file must not earn the cheat its points"
    assert autograde_plain(course, "off") == 0.0, "unsandboxed, the kernel must still start isolated"
    # Naming another kernel changes nothing: every grading kernel starts through the course's provisioner, and a
    # patched isclose in the kernel could not pass a test the grader runs anyway (the boundary).
    named = autograde_plain(course, "off", "--Execute.kernel_name=python3")
    assert named == 0.0, f"a patched isclose in the kernel cannot pass a test the grader runs, got {named}"


SCRATCH_MB = 64
MAX_PROCESSES = 48
HOLD_S = 10  # the attacker's kernel keeps its flood going this long, so the honest kernel runs beside it
EXIT_GRACE_S = 10
FLOODS = '''\
import os, time


def _fill(limit_bytes):
    """Write 1 MiB blocks into every folder that takes them; bytes written per folder."""
    written, block = {{}}, b"x" * (1 << 20)
    for parent, dirs, _ in os.walk("/"):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) not in ("/proc", "/sys", "/usr")]
        for index in range(1 << 20):
            if sum(written.values()) >= limit_bytes:
                return written
            try:
                with open(os.path.join(parent, f"fill-{{index}}.bin"), "wb") as handle:
                    for _ in range(256):
                        handle.write(block)
                        handle.flush()
                        written[parent] = written.get(parent, 0) + len(block)
            except OSError:
                break
    return written


def _flood(wanted):
    started = 0
    for _ in range(wanted):
        try:
            if os.fork() == 0:
                while True:
                    pass
        except OSError:
            break
        started += 1
    return started


print("kernel uid:", os.getuid())
WRITTEN = _fill({limit_bytes})
print("written:", WRITTEN, "total:", sum(WRITTEN.values()))
print("busy processes started:", _flood(200))
_end = time.time() + {hold_s}
while time.time() < _end:
    pass


def add(a, b):
    return a + b
'''


def processes_of_uid(uid: int) -> list[int]:
    """PIDs of the processes left on the machine that run as ``uid`` (a grading kernel's own uid).

    Only the uid of the kernel under test: other tests may be grading in parallel beside this one (pytest-xdist),
    with kernels of their own that are rightly alive."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            found = int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if found == uid:
            pids.append(int(status.parent.name))
    return pids


def test_a_disk_fill_and_a_process_flood_beside_an_honest_submission_cost_it_nothing(root, tmp_path, monkeypatch):
    course = make_course_dir(tmp_path / "course", [LAB], root)
    src = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    honest = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"), src)
    write_notebook(honest, course / "submitted" / "honest" / LAB / f"{LAB}.ipynb")
    for cell in honest.cells:
        if grade_id(cell) == "q1_1_add":
            cell.source = FLOODS.format(limit_bytes=8 * SCRATCH_MB << 20, hold_s=HOLD_S)
    write_notebook(honest, course / "submitted" / "attacker" / LAB / f"{LAB}.ipynb")
    for key, value in {"EFFICIENT_AI_SANDBOX": "on", "EFFICIENT_AI_SANDBOX_SCRATCH_MB": str(SCRATCH_MB),
                       "EFFICIENT_AI_SANDBOX_MAX_PROCESSES": str(MAX_PROCESSES),
                       "NBGRADER_DB_URL": f"sqlite:///{course / 'gradebook.db'}"}.items():
        monkeypatch.setenv(key, value)

    outcomes, scores = grade_lab(course, LAB, progress=False, workers=2)  # both kernels run at once

    assert outcomes["honest"].status == "ok" and scores["honest"].autograded_score() == FULL_MARKS, (
        f"the honest submission graded beside a disk fill and a process flood must keep full marks: {outcomes}")
    attacker = outcomes["attacker"]
    assert "attacker" in scores and scores["attacker"].cells, f"the attacker's grade must be recorded: {attacker}"
    assert attacker.status == "ok" or (len(attacker.reason) > 20 and attacker.reason.isprintable()), (
        f"a failed or partial attacker needs a reason a TA can read: {attacker}")
    graded = read_notebook(course / "autograded" / "attacker" / LAB / f"{LAB}.ipynb")
    printed = "".join(out.get("text", "") for cell in graded.cells if grade_id(cell) == "q1_1_add"
                      for out in cell.get("outputs", []))
    total = int(printed.split("total:")[1].split()[0])
    private = (SCRATCH_MB << 20) + KernelLimits().shm_bytes
    assert 0 < total <= private, f"the kernel may only fill its private /tmp and /dev/shm: {printed}"
    started = int(printed.split("busy processes started:")[1].split()[0])
    assert 0 < started < MAX_PROCESSES, f"the process cap ({MAX_PROCESSES}) must stop the flood: {printed}"
    uid = int(printed.split("kernel uid:")[1].split()[0])
    if sandbox.KERNEL_UID_BASE <= uid:  # a uid of the kernel's own (the grader runs as root)
        deadline = time.monotonic() + EXIT_GRACE_S  # a killed process's children are reaped a moment later
        while processes_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_of_uid(uid), f"every process of a kernel ends with it (within {EXIT_GRACE_S} s)"
    print(printed)
