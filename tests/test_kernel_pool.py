"""Kernels started ahead by ``course grade`` (course/kernel_pool.py): what they import, what they can see, that
nbgrader adopts them with unchanged scores, and that none outlives its submission or the pool."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from fixture_lab import LAB, REPO, built_root, make_class  # noqa: E402

from course import grade, kernel_pool, kernel_zygote, sandbox  # noqa: E402
from course.nbgrader_run import read_scores  # noqa: E402
from course.processes import start_time  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return built_root(tmp_path_factory.mktemp("pool-root"))


def wait_ready(pool: kernel_pool.KernelPool, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.listdir(pool.folder / "ready"):
        assert time.monotonic() < deadline, f"the pool published no kernel within {timeout_s} s"
        time.sleep(0.05)


def run_in_kernel(record: dict, code: str) -> str:
    """Run ``code`` in a claimed kernel; the repr of its last expression."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=record["connection_file"])
    client.load_connection_file()
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(code, user_expressions={"out": "_out"}, timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok", reply["content"]
        return reply["content"]["user_expressions"]["out"]["data"]["text/plain"]
    finally:
        client.stop_channels()


def alive(pid: int) -> bool:
    return start_time(pid) is not None


def test_lab1_kernels_preload_the_guard_libraries_and_the_setup_imports():
    modules = kernel_pool.preload_modules(REPO / "source" / "lab1")
    assert modules[:3] == ["numpy", "torch", "utils"], f"the guard's libraries come first, got {modules}"
    for name in ("pandas", "matplotlib.pyplot", "torch.profiler"):
        assert name in modules, f"lab1's setup cell imports {name}: a kernel started ahead must import it, got {modules}"
    assert len(modules) == len(set(modules)), f"each module once: {modules}"


def test_the_fixture_lab_preloads_only_what_its_setup_cell_imports(root):
    assert kernel_pool.preload_modules(root / "source" / LAB) == ["math", "checks"]


def test_a_claimed_kernel_has_its_imports_done_and_sees_no_other_kernel(root):
    with kernel_pool.KernelPool(root, LAB) as pool:
        wait_ready(pool)
        record = kernel_pool.claim(str(pool.folder))
        assert record is not None, "a published kernel must be claimable"
        wait_ready(pool)  # the pool starts the next kernel once one is claimed
        seen = run_in_kernel(record, "import gc, sys, os\n_out = ('math' in sys.modules, sorted(os.listdir(%r)) if "
                             "os.path.isdir(%r) else None, gc.get_freeze_count())" % (str(pool.folder), str(pool.folder)))
        preloaded, listing, frozen = eval(seen)  # noqa: S307 - the repr of a tuple of a bool, names and an int
        assert preloaded, "a kernel started ahead must have imported its lab's setup modules before it answers"
        assert frozen > 10_000, (
            f"kernel_boot must freeze what start-up made (gc.freeze), so full collections skip it; {frozen} frozen")
        if sandbox.sandbox_works():
            kernel_id = Path(record["connection_file"]).parent.name
            assert listing == [kernel_id], (
                f"a sandboxed kernel must see only its own folder of the pool, never the next submission's kernel: "
                f"{listing}")
        pool.release()
        assert not alive(record["pid"]), "release() must kill every claimed kernel"
        spare = json.loads(next((pool.folder / "ready").iterdir()).read_text())
        assert alive(spare["pid"])
    assert not alive(spare["pid"]), "close() must kill the kernels nobody claimed"
    assert not pool.folder.exists(), "close() must remove the pool's folder"


def test_a_dead_kernel_is_not_adopted(root):
    with kernel_pool.KernelPool(root, LAB, more_to_grade=lambda: False) as pool:
        assert not os.listdir(pool.folder / "ready"), "no kernel is started ahead when nothing is left to grade"
    with kernel_pool.KernelPool(root, LAB) as pool:
        wait_ready(pool)
        record = json.loads(next((pool.folder / "ready").iterdir()).read_text())
        os.killpg(record["pid"], 9)
        deadline = time.monotonic() + 10
        while alive(record["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        claimed = kernel_pool.claim(str(pool.folder))
        assert claimed is None or claimed["pid"] != record["pid"], "a kernel that died must never be adopted"


def test_graded_with_kernels_started_ahead_the_scores_match_and_no_kernel_is_left(root, tmp_path, monkeypatch):
    expected = make_class(root, tmp_path / "ahead", 4)
    outcomes, scores = grade.grade_lab(tmp_path / "ahead", LAB, progress=False)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert {s: sub.autograded_score() for s, sub in scores.items()} == expected
    reports = {s: json.loads((tmp_path / "ahead" / "autograded" / s / LAB / "grading_report.json").read_text())
               for s in expected}
    assert all(r["kernel_started_ahead"] for r in reports.values()), (
        f"with one worker every submission's kernel is started ahead: {reports}")

    monkeypatch.setenv(kernel_pool.POOL_OFF_ENV, "1")
    make_class(root, tmp_path / "own", 4)
    outcomes, scores_own = grade.grade_lab(tmp_path / "own", LAB, progress=False)
    assert {s: sub.autograded_score() for s, sub in scores_own.items()} == expected
    assert not json.loads((tmp_path / "own" / "autograded" / "student00" / LAB / "grading_report.json").read_text())[
        "kernel_started_ahead"], f"{kernel_pool.POOL_OFF_ENV}=1: nbgrader starts its own kernels"
    assert read_scores(tmp_path / "own", LAB).keys() == expected.keys()


def test_kernels_that_fail_to_start_are_not_started_again_and_again(root, monkeypatch, capfd):
    real_spec = kernel_pool.grading_kernel_spec

    def failing_spec(*args, **kwargs):
        return {**real_spec(*args, **kwargs), "argv": [sys.executable, "-c", "raise SystemExit(3)"]}

    monkeypatch.setattr(kernel_pool, "grading_kernel_spec", failing_spec)
    monkeypatch.setattr(kernel_pool, "FAILURE_PAUSE_S", 0.1)
    monkeypatch.setenv(kernel_zygote.MODE_ENV, "off")  # every kernel started the usual way, by the failing command
    with kernel_pool.KernelPool(root, LAB) as pool:
        pool._thread.join(timeout=60)
        assert not pool._thread.is_alive(), "after MAX_FAILURES failed kernels the pool stops starting them"
        assert kernel_pool.claim(str(pool.folder)) is None, "a kernel that ended is never handed out"
    err = capfd.readouterr().err
    assert err.count("ended before any submission used it") == kernel_pool.MAX_FAILURES, err
    assert "nbgrader starts every kernel itself" in err


def test_a_cuda_context_made_ahead_leaves_the_allocator_as_a_fresh_process_has_it(monkeypatch):
    """``kernel_boot --cuda``: the context is created, then nothing stays allocated, reserved or counted (a student's
    ``torch.cuda.max_memory_allocated()`` must not see it). A stand-in torch records the calls (CI has no GPU)."""
    from types import SimpleNamespace

    from course import kernel_boot

    calls = []
    cuda = SimpleNamespace(is_available=lambda: True, synchronize=lambda: calls.append("synchronize"),
                           empty_cache=lambda: calls.append("empty_cache"),
                           reset_peak_memory_stats=lambda: calls.append("reset_peak_memory_stats"),
                           reset_accumulated_memory_stats=lambda: calls.append("reset_accumulated_memory_stats"))
    fake = SimpleNamespace(cuda=cuda, empty=lambda *shape, device: calls.append(f"empty on {device}"))
    monkeypatch.setitem(sys.modules, "torch", fake)
    kernel_boot.create_cuda_context()
    assert calls[0] == "empty on cuda", f"the context comes from a first CUDA allocation: {calls}"
    assert set(calls[1:]) == {"synchronize", "empty_cache", "reset_peak_memory_stats",
                              "reset_accumulated_memory_stats"}, f"the allocator is left as new: {calls}"
    assert calls.index("empty_cache") < calls.index("reset_peak_memory_stats"), calls

    calls.clear()
    cuda.is_available = lambda: False
    kernel_boot.create_cuda_context()
    assert calls == [], "without a GPU nothing is created"


@pytest.fixture
def compiler_elsewhere():
    """A stand-in C compiler in PREFIX/bin/gcc outside /usr (as `module load gcc` installs one); PREFIX."""
    import shutil
    import tempfile

    prefix = tempfile.mkdtemp(prefix="efficient-ai-gcc-", dir="/var/tmp")  # /tmp is the sandbox's own scratch
    os.chmod(prefix, 0o755)
    os.mkdir(os.path.join(prefix, "bin"))
    compiler = os.path.join(prefix, "bin", "gcc")
    with open(compiler, "w") as handle:
        handle.write("#!/bin/sh\necho stand-in gcc\n")
    os.chmod(compiler, 0o755)
    yield prefix
    shutil.rmtree(prefix, ignore_errors=True)


def test_a_sandboxed_kernel_can_run_the_compiler_the_grader_names(root, compiler_elsewhere, monkeypatch):
    """Triton builds each kernel's launcher with $CC (else a cc on PATH): a compiler outside /usr must be shown in
    the sandbox, or every Triton cell of a submission fails there, on the GPU only."""
    if not sandbox.sandbox_works():
        pytest.skip("bubblewrap does not work here")
    monkeypatch.delenv(sandbox.MODE_ENV, raising=False)
    monkeypatch.setenv("CC", os.path.join(compiler_elsewhere, "bin", "gcc"))
    with kernel_pool.KernelPool(root, LAB) as pool:
        wait_ready(pool)
        record = kernel_pool.claim(str(pool.folder))
        ran = run_in_kernel(record, "import os, subprocess\n"
                                    "_out = subprocess.run([os.environ['CC']], capture_output=True, text=True).stdout")
        secret = run_in_kernel(record, f"import os\n_out = os.path.exists({str(root)!r})")
    assert ran == repr("stand-in gcc\n"), f"the sandboxed kernel must run the grader's $CC: {ran}"
    assert secret == "False", "showing the compiler's folder shows nothing else of the grader's"


def test_a_compiler_s_folder_is_shown_only_where_it_holds_nothing_of_the_grader_s(compiler_elsewhere, monkeypatch):
    compiler = os.path.join(compiler_elsewhere, "bin", "gcc")
    assert sandbox._toolchain_dirs({"CC": compiler, "PATH": ""}) == [compiler_elsewhere]
    assert sandbox._toolchain_dirs({"PATH": os.path.join(compiler_elsewhere, "bin")}) == [compiler_elsewhere], (
        "a gcc found on PATH is shown as $CC is")
    assert sandbox._toolchain_dirs({"CC": "/usr/bin/gcc", "PATH": ""}) == [], "/usr is shown already"
    monkeypatch.setenv("HOME", os.path.join(compiler_elsewhere, "home"))
    assert sandbox._toolchain_dirs({"CC": compiler, "PATH": ""}) == [], (
        "a compiler's folder that holds the grader's HOME is never shown")


@pytest.fixture
def under_scratch():
    """A new folder under the sandbox's scratch folder, /tmp, on the grader's side."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="efficient-ai-python-", dir=sandbox.SCRATCH_DIR)
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_python_installed_under_tmp_runs_sandboxed_kernels(root, under_scratch):
    """The sandbox mounts a private /tmp: a Python the grader runs from under /tmp (a venv of a clone in /tmp)
    must still be shown to the kernel, or every kernel dies and every submission scores 0."""
    if not sandbox.sandbox_works():
        pytest.skip("bubblewrap does not work here")
    env_link = under_scratch / "env"  # the interpreter's installation, reached under /tmp (a venv stays a venv)
    env_link.symlink_to(sys.prefix, target_is_directory=True)
    python = env_link / os.path.relpath(sys.executable, sys.prefix)
    assert python.exists(), f"{sys.executable} lies inside sys.prefix {sys.prefix}"
    script = (f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\nfrom pathlib import Path\n"
              "from course import kernel_pool, sandbox\nfrom test_kernel_pool import LAB, run_in_kernel, wait_ready\n"
              "assert sandbox.unavailable_reason() is None, sandbox.unavailable_reason()\n"
              f"with kernel_pool.KernelPool(Path({str(root)!r}), LAB) as pool:\n"
              "    wait_ready(pool)\n"
              "    print(run_in_kernel(kernel_pool.claim(str(pool.folder)), 'import sys\\n_out = sys.executable'))\n")
    import subprocess

    ran = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0 and ran.stdout.strip() == repr(str(python)), (
        f"a sandboxed kernel of the Python at {python} must start and run a cell: {ran.stdout}{ran.stderr[-2000:]}")


def test_installed_folders_under_tmp_are_shown_after_the_scratch_tmpfs(monkeypatch):
    monkeypatch.setattr(sandbox, "_python_dirs", lambda: ["/tmp/clone/.venv", "/opt/python"])
    monkeypatch.setattr(sandbox, "_toolchain_dirs", lambda: [])
    args = sandbox.bwrap_command([], "/files", "/conn.json", "/run/ipc", "/passwd", [])
    scratch = args.index(sandbox.SCRATCH_DIR, args.index("--tmpfs", args.index("/dev/shm")))
    assert args.index("/tmp/clone/.venv") > scratch, "a folder under /tmp is bound over the private /tmp, not under it"
    assert args.index("/opt/python") < scratch
    assert args[args.index("/tmp/clone") - 3:args.index("/tmp/clone") + 1] == ["--perms", "0755", "--dir", "/tmp/clone"]


def test_a_python_the_sandbox_cannot_run_makes_it_unavailable_with_the_reason(monkeypatch):
    """Detected once, before grading (auto: unsandboxed with a warning; on: refused), not as 0 for everyone."""
    if not sandbox.sandbox_works():
        pytest.skip("bubblewrap does not work here")
    if not sandbox._installed_dirs():
        pytest.skip("this Python lies in /usr, which the sandbox always shows")
    monkeypatch.setattr(sandbox, "_installed_dirs", lambda: [])
    reason = sandbox.unavailable_reason()
    assert reason and "does not run inside the sandbox" in reason and sys.executable in reason, reason
    monkeypatch.setattr(sandbox, "_installed_dirs", lambda: ["/tmp"])
    assert "overlaps the sandbox's working folder" in sandbox.unavailable_reason()
