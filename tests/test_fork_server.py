"""nbgrader processes forked from course grade's fork server (course/fork_server.py): the same results as a process
started with python, time limits, a server with no threads to carry into a fork, and a server that is gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import nbformat
import pytest
from fixture_lab import LAB, REPO, built_root, make_class, processes_working_in, wait_until_no_process_works_in  # noqa: E402,E501

from course import fork_server, nbgrader_run  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return built_root(tmp_path_factory.mktemp("fork-root"))


@pytest.fixture()
def server(monkeypatch):
    monkeypatch.delenv(fork_server.MODE_ENV, raising=False)
    started = nbgrader_run.start_fork_server()
    assert started is not None and started.wait_ready(), "the fork server must start where os.fork exists"
    return started


def test_the_server_holds_no_thread_a_fork_would_copy():
    code = ("import os; from course.fork_server import _preload; _preload(); "
            "print(len(os.listdir('/proc/self/task')))")
    result = subprocess.run([sys.executable, "-c", code], env={**nbgrader_run.nbgrader_env(), **fork_server.SERVER_ENV},
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "1", (
        f"after its imports the fork server must run one thread (a thread pool would be copied half-locked into every "
        f"forked nbgrader): {result.stdout.strip()} threads")


def test_a_forked_nbgrader_answers_as_a_started_one(root, server):
    for args in (["--version"], ["autograde", LAB, "--student", "nobody-submitted-this"]):
        forked = nbgrader_run.run_nbgrader(root, args, fork=True)
        started = nbgrader_run.run_nbgrader(root, args, fork=False)
        assert (forked.returncode, forked.timed_out) == (started.returncode, started.timed_out), (forked, started)
        last = [line for line in started.output.splitlines() if line.strip()][-1]
        assert last in forked.output, f"a forked nbgrader must print what a started one prints: {forked.output[-2000:]}"
    assert str(root / "submitted" / "nobody-submitted-this") in forked.output, (
        "the forked nbgrader runs in the course folder it was given, with that course's nbgrader_config.py")


def test_a_forked_nbgrader_is_killed_with_its_group_at_the_time_limit(root, server):
    started = time.monotonic()
    result = nbgrader_run.run_nbgrader(root, ["autograde", LAB, "--student", "nobody"], timeout_s=0.05, fork=True)
    assert result.timed_out and result.returncode == -9, result
    assert time.monotonic() - started < 30, "a process past its time limit is killed, not waited for"


def test_with_the_server_gone_nbgrader_is_started_the_usual_way(root, server, monkeypatch):
    server._process.kill()
    server._process.wait()
    deadline = time.monotonic() + 10
    while not server.gone and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.gone
    monkeypatch.setattr(nbgrader_run, "MAX_FORK_SERVERS", 0)  # no replacement: the usual start
    result = nbgrader_run.run_nbgrader(root, ["--version"], fork=True)
    assert result.ok and "Python version" in result.output, result
    monkeypatch.setattr(nbgrader_run, "MAX_FORK_SERVERS", 100)
    replacement = nbgrader_run.start_fork_server()
    assert replacement is not None and replacement is not server and replacement.wait_ready(), (
        "a fork server that ended is replaced by a fresh one")


def test_off_starts_no_server(monkeypatch):
    monkeypatch.setenv(fork_server.MODE_ENV, "off")
    assert nbgrader_run.start_fork_server() is None
    assert not fork_server.enabled()


def test_a_run_the_server_dropped_is_killed_and_run_again(root, tmp_path, server, monkeypatch):
    make_class(root, tmp_path, 1)
    from course.grade import prepare_gradebook

    prepare_gradebook(tmp_path, LAB)
    killer = threading.Timer(1.0, server._process.kill)  # while the forked nbgrader grades the submission
    killer.start()
    monkeypatch.setattr(nbgrader_run, "MAX_FORK_SERVERS", 0)  # the rerun starts nbgrader the usual way
    result = nbgrader_run.run_nbgrader(tmp_path, ["autograde", LAB, "--student", "student00", "--force"], fork=True)
    killer.join()
    assert server.gone
    assert result.ok, f"a run whose fork server ended is run again the usual way: {result.tail()}"
    assert (tmp_path / "autograded" / "student00" / LAB / f"{LAB}.ipynb").exists()


@pytest.mark.parametrize("mode", ["forked", "started"])
def test_killing_the_grader_ends_its_nbgrader_processes(root, tmp_path, mode):
    """A TA's kill -9 of course grade's process group reaches nbgrader processes in their own sessions: none goes
    on grading (and writing the gradebook) behind a run that is gone."""
    make_class(root, tmp_path, 1)
    from course.grade import prepare_gradebook
    from course.notebooks import read_notebook, write_notebook

    submitted = tmp_path / "submitted" / "student00" / LAB / f"{LAB}.ipynb"
    nb = read_notebook(submitted)
    nb.cells.insert(0, nbformat.v4.new_code_cell("import time\ntime.sleep(600)"))  # grading outlives the kill
    write_notebook(nb, submitted)
    prepare_gradebook(tmp_path, LAB)
    script = ("from pathlib import Path; from course import nbgrader_run; nbgrader_run.run_nbgrader("
              f"Path({str(tmp_path)!r}), ['autograde', {LAB!r}, '--student', 'student00', '--force'], fork=True)")
    env = {**os.environ, "PYTHONPATH": str(REPO), fork_server.MODE_ENV: "on" if mode == "forked" else "off"}
    client = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not processes_working_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_working_in(tmp_path), "nbgrader should have started in the course folder"
    os.killpg(client.pid, signal.SIGKILL)
    client.wait()
    left = wait_until_no_process_works_in(tmp_path)
    assert not left, f"nbgrader ({mode}) must end with the process that ran it: still running {left}"
