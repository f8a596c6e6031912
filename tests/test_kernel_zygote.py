"""Unsandboxed kernels started ahead are forked from a zygote that made their imports (course/kernel_zygote.py,
``kernel_boot.py --zygote``): each is a fresh kernel of its own, scores are unchanged, and a zygote that ends leaves
kernels to start the usual way."""
from __future__ import annotations

import json
import os
import time

import pytest
from fixture_lab import LAB, built_root, make_class
from test_kernel_pool import alive, run_in_kernel, wait_ready

from course import grade, kernel_pool, kernel_zygote, sandbox


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return built_root(tmp_path_factory.mktemp("zygote-root"))


@pytest.fixture
def unsandboxed(monkeypatch):
    monkeypatch.setenv(sandbox.MODE_ENV, "off")
    monkeypatch.delenv(kernel_zygote.MODE_ENV, raising=False)


def ended(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def claim_forked(pool: kernel_pool.KernelPool, zygote_pid: int) -> dict:
    """Claim kernels until one is the zygote's child: those published before its imports were done started the
    usual way (so the first submission of a run never waits for the zygote)."""
    for _ in range(4):
        wait_ready(pool)
        record = kernel_pool.claim(str(pool.folder))
        if record is not None and parent_of(record["pid"]) == zygote_pid:
            return record
        pool.release()
        deadline = time.monotonic() + 120
        while not pool._zygote.ready() and time.monotonic() < deadline:
            time.sleep(0.1)
    raise AssertionError("once the zygote is ready, the pool forks its kernels from it")


def test_each_kernel_forked_from_the_zygote_starts_fresh(root, unsandboxed):
    with kernel_pool.KernelPool(root, LAB) as pool:
        assert pool._zygote is not None, "an unsandboxed pool forks its kernels from a zygote"
        zygote_pid = pool._zygote._process.pid
        first = claim_forked(pool, zygote_pid)
        seen = run_in_kernel(first, "import gc, os, sys\nleft_behind = 41\nopen('mark.txt', 'w').close()\n"
                                    "_out = (os.getcwd(), 'math' in sys.modules, gc.get_freeze_count())")
        first_cwd, preloaded, frozen = eval(seen)  # noqa: S307 - the repr of a tuple of a str, a bool and an int
        assert preloaded, "a forked kernel has the lab's setup imports done"
        assert frozen > 10_000, f"a forked kernel's start-up heap is frozen (gc.freeze); {frozen} frozen"
        pool.release()
        assert not alive(first["pid"]), "release() must kill a claimed kernel forked from the zygote"

        second = claim_forked(pool, zygote_pid)
        assert second["pid"] != first["pid"]
        seen = run_in_kernel(second, "import os\n_out = (os.getcwd(), 'left_behind' in globals(), "
                                     "os.path.exists('mark.txt'))")
        second_cwd, inherited, mark = eval(seen)  # noqa: S307 - the repr of a tuple of a str and two bools
        assert second_cwd != first_cwd, "every kernel works in a folder of its own"
        assert not inherited and not mark, (
            "a kernel forked after another submission's kernel must see nothing that kernel did")
        spare_record = json.loads(next((pool.folder / "ready").iterdir()).read_text()) if os.listdir(
            pool.folder / "ready") else None
    assert not alive(second["pid"]) and (spare_record is None or not alive(spare_record["pid"])), (
        "close() must kill every kernel the zygote forked")
    assert ended(zygote_pid), "close() must end the zygote"


def test_graded_from_the_zygote_the_scores_match(root, unsandboxed, tmp_path, monkeypatch):
    expected = make_class(root, tmp_path / "forked", 3)
    outcomes, scores = grade.grade_lab(tmp_path / "forked", LAB, progress=False)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert {s: sub.autograded_score() for s, sub in scores.items()} == expected, (
        "kernels forked from the zygote must earn exactly what the fixture class is built to earn")

    monkeypatch.setenv(kernel_zygote.MODE_ENV, "off")
    make_class(root, tmp_path / "started", 3)
    outcomes, scores = grade.grade_lab(tmp_path / "started", LAB, progress=False)
    assert {s: sub.autograded_score() for s, sub in scores.items()} == expected, (
        f"{kernel_zygote.MODE_ENV}=off starts every kernel the usual way, with the same scores")


def test_when_the_zygote_ends_kernels_start_the_usual_way(root, unsandboxed, capfd):
    with kernel_pool.KernelPool(root, LAB) as pool:
        wait_ready(pool)
        zygote_pid = pool._zygote._process.pid
        pool._zygote._process.kill()  # its kernels end with it (ipykernel's parent poller)
        deadline = time.monotonic() + 120
        record = None
        while time.monotonic() < deadline:
            record = kernel_pool.claim(str(pool.folder))
            if record is not None and alive(record["pid"]) and parent_of(record["pid"]) != zygote_pid:
                break
            if record is not None:
                pool.release()
            record = None
            time.sleep(0.1)
        assert record is not None, "without its zygote the pool still starts kernels ahead"
        assert run_in_kernel(record, "import sys\n_out = 'math' in sys.modules") == "True"
        assert pool._zygote is None, "a zygote that cannot fork is given up"
    assert "without the zygote" in capfd.readouterr().err, "the pool says that it gave the zygote up"


def test_sandboxed_kernels_are_never_forked_from_a_shared_process(root, monkeypatch):
    if not sandbox.sandbox_works():
        pytest.skip("bubblewrap does not work here")
    monkeypatch.delenv(sandbox.MODE_ENV, raising=False)
    with kernel_pool.KernelPool(root, LAB, more_to_grade=lambda: False) as pool:
        assert pool._zygote is None, (
            "a sandboxed kernel needs a sandbox of its own: a fork of a shared process would share its file system view")


def test_the_workers_of_a_run_share_one_zygote_and_each_kernel_runs_on_its_workers_cpus(root, unsandboxed):
    from course.nbgrader_run import available_cpus, worker_envs

    cpus = available_cpus()
    envs = worker_envs(2, [], cpus)
    with kernel_pool.KernelPool(root, LAB, envs[0]) as first, kernel_pool.KernelPool(root, LAB, envs[1]) as second:
        assert first._zygote is not None and first._zygote is second._zygote, (
            "workers whose environments differ only in their CPUs and GPU share one zygote (one set of imports)")
        for pool, env in ((first, envs[0]), (second, envs[1])):
            record = claim_forked(pool, first._zygote._process.pid)
            seen = run_in_kernel(record, "import os\n_out = (sorted(os.sched_getaffinity(0)), "
                                         "os.environ.get('OMP_NUM_THREADS'))")
            affinity, threads = eval(seen)  # noqa: S307 - the repr of a list of ints and a str
            expected = sorted(int(c) for c in env["EFFICIENT_AI_CPUS"].split(",")) if "EFFICIENT_AI_CPUS" in env \
                else sorted(cpus)
            assert affinity == expected, f"a forked kernel runs on its worker's CPUs {expected}, not {affinity}"
            assert threads == env.get("OMP_NUM_THREADS"), "a forked kernel has its worker's thread counts"
        zygote_pid = first._zygote._process.pid
        second.close()
        assert alive(zygote_pid), "the zygote lives while a pool still uses it"
    assert ended(zygote_pid), "the last pool to close ends the zygote"
