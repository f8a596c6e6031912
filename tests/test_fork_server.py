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


class RawServer:
    """``python -m course.fork_server`` spoken to line by line, as ``ForkServer`` does, to see which process ran what."""

    def __init__(self, tmp_path):
        self.tmp_path, self.next_id = tmp_path, 0
        self.process = subprocess.Popen([sys.executable, "-m", "course.fork_server"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, cwd=REPO, start_new_session=True,
                                        env={**nbgrader_run.nbgrader_env(), **fork_server.SERVER_ENV})
        assert self.answer().get(fork_server.READY), "the server says when it is ready"

    def answer(self) -> dict:
        import json

        line = self.process.stdout.readline()
        assert line, "the fork server ended"
        return json.loads(line)

    def run(self, env: dict[str, str], ahead: bool = True) -> tuple[int, int, str]:
        """``nbgrader --version`` in a child; its pid, exit status and output."""
        import json

        self.next_id += 1
        output = self.tmp_path / f"run{self.next_id}.log"
        request = {"id": self.next_id, "args": ["--version"], "cwd": str(self.tmp_path), "env": env,
                   "output": str(output), "ahead": ahead}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        pid = self.answer()["pid"]
        ended = self.answer()
        assert ended["id"] == self.next_id
        return pid, ended["status"], output.read_text()

    def children(self) -> set[int]:
        """The server's child processes now (Linux ``/proc``)."""
        found = set()
        for task in os.listdir(f"/proc/{self.process.pid}/task"):
            with open(f"/proc/{self.process.pid}/task/{task}/children") as handle:
                found |= {int(pid) for pid in handle.read().split()}
        return found

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _wait_for(condition, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's children from /proc")
def test_a_spare_made_ahead_runs_the_next_run_of_its_worker_only(tmp_path):
    """An ``ahead`` run leaves a spare (a child forked for the next run, its CUDA context made where there is a GPU);
    the next ``ahead`` run with the same CUDA environment runs in it, with its own folder, output and environment; a
    run for another GPU gets a fresh child, and closing the server ends the spares that wait."""
    server = RawServer(tmp_path)
    try:
        env = {**nbgrader_run.nbgrader_env(), "CUDA_VISIBLE_DEVICES": "0"}
        first, status, output = server.run(env)
        assert status == 0 and "Python version" in output, output
        assert _wait_for(lambda: len(server.children()) == 1), "an ahead run leaves one spare for the next"
        (spare,) = server.children()
        assert spare != first
        second, status, output = server.run({**env, "MARK": "second"})
        assert second == spare, "the next ahead run of the same worker must run in the spare made for it"
        assert status == 0 and "Python version" in output, f"a spare runs nbgrader as a fresh child would: {output}"
        assert _wait_for(lambda: len(server.children()) == 1 and spare not in server.children()), (
            "the spare ended with its run, and a new one waits for the next")
        (next_spare,) = server.children()
        other, status, _ = server.run({**env, "CUDA_VISIBLE_DEVICES": "1"})
        assert other != next_spare and status == 0, "a run for another GPU must not take a spare made for GPU 0"
        plain, status, _ = server.run(env, ahead=False)
        assert plain != next_spare and status == 0, "a run not marked ahead gets a fresh child"
        assert next_spare in server.children(), "the spare for GPU 0 still waits"
    finally:
        waiting = server.children()
        server.close()
    assert waiting and _wait_for(lambda: not any(_alive(pid) for pid in waiting)), (
        f"closing the server must end its spares: {waiting} still run")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's children from /proc")
def test_a_spare_that_died_before_its_run_is_replaced_by_a_fresh_child(tmp_path):
    server = RawServer(tmp_path)
    try:
        env = nbgrader_run.nbgrader_env()
        server.run(env)
        assert _wait_for(lambda: len(server.children()) == 1)
        (spare,) = server.children()
        os.kill(spare, signal.SIGKILL)
        assert _wait_for(lambda: not _alive(spare)), "the server reaps a spare that ended"
        pid, status, output = server.run(env)
        assert pid != spare and status == 0 and "Python version" in output, (
            f"a run whose spare died must run in a fresh child: {output}")
    finally:
        server.close()
