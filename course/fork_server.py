"""nbgrader processes forked from a server that has already imported what every grading process imports.

Each submission is graded by its own nbgrader process (a crash, a hang or a time limit then costs that submission
only). Started with ``python``, every such process imports nbgrader and its Jupyter stack, and then, for the test
cells it runs outside the kernel, torch, what torch's first ``assert_close`` imports (sympy, torch.distributed.tensor)
and transformers' Gemma-3 config: several seconds of CPU per submission, on the critical path once the kernel is
started ahead (reports/grading-breakdown-h100-ahead.md). ``course grade`` therefore starts one ``ForkServer`` that
imports those modules once and forks a fresh process for every nbgrader command; each child is what
``python -m course.fast_start nbgrader ARGS`` would be: its own session, CPUs, folder, environment and output file,
and it exits when nbgrader does. The server also makes, once, the first calls that every child would otherwise repeat
(``_warm``: compiled schema validators, the Markdown parser's patterns, the sandbox probe).

What a fork cannot carry is never done in the server: no CUDA (``PYTORCH_NVML_BASED_CUDA_CHECK``; torch's CUDA is
initialised lazily, in the child), no threads (``SERVER_ENV`` keeps OpenBLAS, OpenMP and MKL to one thread and no
torch operation runs in the server; each child sizes torch's threads from its own ``OMP_NUM_THREADS``, else to its
CPUs; numpy's BLAS in the grader stays single-threaded), no instructor files (each child imports the lab's
``utils``), no sockets.

A grading process that runs test cells on a GPU creates a CUDA context of its own: 0.16 s in one process, 0.8 s
while seven others start theirs (reports/start-costs-h100-libraries.md), and the first test cell waited for it. A
request marked ``ahead`` therefore also has the server fork a *spare* for the next such request: a child that
creates its CUDA context and loads what test cells first call (cuBLAS, attention) while the current submission
grades, then waits for its job. The next ``ahead`` request whose environment agrees on every variable CUDA reads at
start (``spare_key``) is handed to that spare instead of a fresh fork; anything else gets a fresh fork, as before.

``python -m course.fork_server``: the server. It reads one JSON request per line on stdin
(``{"id", "args", "cwd", "env", "output", "ahead"}``) and answers on stdout ``{"id", "pid"}`` when a child took
it and ``{"id", "status"}`` when the child ended (the exit status, or minus the signal that ended it).
``EFFICIENT_AI_FORK_SERVER=off`` makes ``course.nbgrader_run`` start every nbgrader process with ``python`` instead.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from .kernel_boot import FORK_SAFE_ENV, create_cuda_context
from .processes import close_and_wait, die_with_parent, kill_group

MODE_ENV = "EFFICIENT_AI_FORK_SERVER"
PRELOAD = (
    "nbformat", "nbclient", "jupyter_client", "zmq", "nbconvert", "sqlalchemy", "alembic",
    "nbgrader.apps.nbgraderapp", "nbgrader.preprocessors", "nbgrader.api",
    "course.nbgrader_ext", "course.sanitize", "course.feedback", "course.sandbox",
    "numpy", "torch", "torch.testing", "torch.nn.functional", "sympy", "torch.fx.experimental.symbolic_shapes",
    "torch.distributed.tensor", "transformers.models.gemma3.configuration_gemma3",
    # found by listing what one autograde imported after these: jupyter_client's kernelspec lookup imports all of
    # IPython (with prompt_toolkit and jedi), the grader's own test runs import utils' matplotlib.pyplot, and the
    # gradebook its SQLite dialect
    "IPython", "matplotlib.pyplot", "sqlalchemy.dialects.sqlite",
)
READY = "ready"
# The server's own environment: no thread pool may start before a fork (OpenBLAS starts one per core when numpy is
# imported), and what kernel_boot's zygote sets for its imports too: no CUDA call (a CUDA driver initialised before
# fork fails in the child), and no allocator thread of pyarrow's (which transformers' import reaches on the H100
# machine).
SERVER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **FORK_SAFE_ENV}


def enabled() -> bool:
    return os.environ.get(MODE_ENV, "").strip().lower() not in ("off", "0", "no", "false") and hasattr(os, "fork")


# -- the server ----------------------------------------------------------------------------------------------------
def _preload() -> None:
    from .fast_start import check_metadata_schema_once, find_schema_version_in_process, skip_slow_optional_imports

    skip_slow_optional_imports()
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child imports it itself, as a fresh process would
            pass
    find_schema_version_in_process()
    check_metadata_schema_once()
    try:
        _warm()
    except Exception:  # noqa: BLE001 - each child then pays those first calls itself
        pass


# Markdown with what the labs' cells hold (a heading, emphasis, math, code, a table, a link, inline HTML): its first
# rendering compiles the Markdown parser's patterns.
WARM_MARKDOWN = ("# Title\n\nSome *text* with `code`, $x^2$ and $$y = mx + b$$.\n\n| a | b |\n| - | - |\n| 1 | 2 |\n\n"
                 "- [a link](#title)\n\n```python\nprint(1)\n```\n\n<b>bold</b>\n")


def _warm() -> None:
    """Pay, once in the server, the first calls that every nbgrader process would pay again after the fork: the
    notebook schema's compiled validator (about 50 ms), the Markdown parser's patterns (about 100 ms), the metadata
    schema's check, and the sandbox probe (30 to 70 ms)."""
    import nbformat
    from nbgrader.nbgraderformat import MetadataValidator

    from .sandbox import unavailable_reason
    from .sanitize import sanitize_markdown

    cell = nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {
        "grade": True, "grade_id": "warm", "locked": False, "points": 1, "schema_version": 3, "solution": True,
        "task": False}})
    notebook = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell(WARM_MARKDOWN)])
    nbformat.validate(notebook, relax_add_props=True)
    MetadataValidator().validate_nb(notebook)
    sanitize_markdown(WARM_MARKDOWN)
    unavailable_reason()


def _thread_names() -> list[str]:
    """The names of this process's threads (Linux; one entry elsewhere)."""
    try:
        tasks = sorted(os.listdir("/proc/self/task"))
    except OSError:
        return ["main"]
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as handle:
                names.append(handle.read().strip())
        except OSError:
            names.append(task)
    return names


def _child(request: dict, server_pid: int) -> None:
    """In the forked child: become what ``python -m course.fast_start nbgrader ARGS`` would be, run it, exit.
    It ends with the server (``die_with_parent``), which ends the children of a client that is gone."""
    code = 1
    try:
        die_with_parent(server_pid)
        if os.getsid(0) != os.getpid():  # a spare made its session when it was forked
            os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(devnull, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(devnull)
        os.close(output)
        sys.stdout = sys.__stdout__  # the server pointed it at stderr
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threads = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(threads) if threads.isdigit() and int(threads) > 0 else len(os.sched_getaffinity(0))
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(threads)  # the server imported torch with one thread
        from nbgrader.apps.nbgraderapp import main as nbgrader_main

        sys.argv = ["nbgrader", *request["args"]]
        try:
            nbgrader_main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the child's output, like an uncaught error in python
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            threading._shutdown()  # what an exiting interpreter does: wait for non-daemon threads, then atexit
            atexit._run_exitfuncs()  # (the sandbox removes its folder)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# What CUDA, torch's CUDA allocator and the dynamic loader (as CUDA's libraries load) read when a spare prepares: a
# spare serves only requests that agree on these variables with the request it was made for (its worker's).
CUDA_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "PYTORCH_", "TORCH_CUDA", "LD_")


def spare_key(env: dict[str, str]) -> str:
    """The part of a request's environment that a spare's CUDA context was made with (``CUDA_ENV_PREFIXES``)."""
    return json.dumps(sorted((k, v) for k, v in env.items() if k.startswith(CUDA_ENV_PREFIXES)))


def _prepare_cuda() -> None:
    """In a spare: create torch's CUDA context as a kernel started ahead does (``kernel_boot.create_cuda_context``),
    then make the first calls test cells make (``warm_cuda_libraries``) and return the allocator's blocks; nothing
    where torch sees no GPU. Errors are left for the grading to meet."""
    create_cuda_context()
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    try:
        from .boundary import warm_cuda_libraries

        warm_cuda_libraries(torch)
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - the grading process's own first GPU call meets the same error
        pass


def _spare(env: dict[str, str], server_pid: int, jobs: int) -> None:
    """In a child forked ahead of its job: its own session, the environment of the request it was made for,
    ``_prepare_cuda``, then wait for one request on the pipe ``jobs`` and run it as ``_child`` does; exit when the
    pipe closes first."""
    try:
        die_with_parent(server_pid)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(env)
        _prepare_cuda()
        with os.fdopen(jobs, "rb") as pipe:
            line = pipe.readline()
        request = json.loads(line) if line else None
    except BaseException:  # noqa: BLE001 - the server hands the job to a fresh fork instead
        os._exit(1)
    if request is None:
        os._exit(0)
    _child(request, server_pid)


class _Spares:
    """The server's spares: per ``spare_key``, the children waiting for a job and the pipes that hand it to them."""

    def __init__(self):
        self.waiting: dict[str, list[tuple[int, int]]] = {}  # key -> [(pid, write end of its pipe)]

    def pids(self) -> set[int]:
        return {pid for spares in self.waiting.values() for pid, _ in spares}

    def write_ends(self) -> list[int]:
        return [fd for spares in self.waiting.values() for _, fd in spares]

    def make(self, key: str, env: dict[str, str], server_pid: int) -> None:
        """Fork a spare for ``key`` (nothing happens where no process is to be had)."""
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            return
        if pid == 0:
            os.close(write_end)
            _close_all(self.write_ends())
            _spare(env, server_pid, read_end)
        os.close(read_end)
        self.waiting.setdefault(key, []).append((pid, write_end))

    def hand(self, key: str, request: dict) -> int | None:
        """Give ``request`` to a spare made for ``key``; its pid, or None where none took it."""
        while self.waiting.get(key):
            pid, write_end = self.waiting[key].pop(0)
            try:
                _write_all(write_end, (json.dumps(request) + "\n").encode())
                return pid
            except OSError:  # it ended before its job came: reaped with the others
                continue
            finally:
                os.close(write_end)
        return None

    def forget(self, pid: int) -> bool:
        """A spare that ended before its job (reaped by the server); whether ``pid`` was one."""
        for spares in self.waiting.values():
            for entry in spares:
                if entry[0] == pid:
                    spares.remove(entry)
                    os.close(entry[1])
                    return True
        return False


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def serve() -> None:
    """Answer requests on stdin until it closes or the answers cannot be written; then kill the children still
    running (their client is gone: nothing would read their results) and return."""
    _preload()
    threads = _thread_names()
    if len(threads) > 1:
        print(f"fork server: {len(threads)} threads after the imports ({', '.join(threads)}); forked children may "
              "deadlock", file=sys.stderr)
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    server_pid = os.getpid()
    running: dict[int, int] = {}  # pid -> request id
    spares = _Spares()

    def answer(message: dict) -> bool:
        try:
            out.write(json.dumps(message) + "\n")
            out.flush()
            return True
        except OSError:  # a broken pipe: the client is gone
            return False

    client = answer({"id": None, READY: True})
    stdin = sys.stdin.buffer
    buffer = b""
    while client:
        readable, _, _ = select.select([stdin], [], [], 0.02)
        if readable:
            chunk = os.read(stdin.fileno(), 65536)
            client = bool(chunk)
            buffer += chunk
            while client and b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                key = spare_key(request["env"]) if request.get("ahead") else None
                pid = spares.hand(key, request) if key is not None else None
                if pid is None:
                    try:
                        pid = os.fork()
                    except OSError as exc:  # no process to be had: the client starts it the usual way
                        client = answer({"id": request["id"], "error": str(exc)})
                        continue
                    if pid == 0:
                        _close_all(spares.write_ends())
                        _child(request, server_pid)
                running[pid] = request["id"]
                client = answer({"id": request["id"], "pid": pid})
                if key is not None:
                    spares.make(key, request["env"], server_pid)  # for the next request of this worker
        while client and (running or spares.waiting):
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid not in running and spares.forget(pid):
                continue
            client = answer({"id": running.pop(pid, None), "status": os.waitstatus_to_exitcode(status)})
    for pid in [*running, *spares.pids()]:
        kill_group(pid)
        try:
            os.kill(pid, signal.SIGKILL)  # in case it has not made its own session yet
        except OSError:
            pass
    for pid in [*running, *spares.pids()]:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


# -- the client ----------------------------------------------------------------------------------------------------
class ForkServerGone(RuntimeError):
    """The fork server ended or did not start: run the command the usual way."""


class _Request:
    """What the server answered about one request: the child's pid, then its exit status (or why there is none)."""

    def __init__(self):
        self.forked, self.ended = threading.Event(), threading.Event()
        self.pid: int | None = None
        self.status: int | None = None
        self.error = ""

    def answer(self, message: dict) -> bool:
        """Take one answer; whether the request is settled (nothing more will come for it)."""
        if "error" in message:
            self.error = str(message["error"])
        if "pid" in message:
            self.pid = message["pid"]
        if "status" in message:
            self.status = message["status"]
        settled = bool(self.error) or self.status is not None
        if settled or self.pid is not None:
            self.forked.set()
        if settled:
            self.ended.set()
        return settled

    def abandon(self) -> None:
        """The server ended: nothing more will come."""
        self.forked.set()
        self.ended.set()


class ForkServer:
    """A running fork server and the thread that reads its answers (one per ``course grade`` process).

    Args:
        env: the server's environment (``nbgrader_run.nbgrader_env()``).
    """

    def __init__(self, env: dict[str, str]):
        self._process = subprocess.Popen(
            [sys.executable, "-m", "course.fork_server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**env, **SERVER_ENV}, start_new_session=True)
        self._lock = threading.Lock()
        self._waiting: dict[int, _Request] = {}
        self._next_id = 0
        self._ready = threading.Event()
        self._gone = threading.Event()
        self._thread = threading.Thread(target=self._read, name="fork-server", daemon=True)
        self._thread.start()

    def run(self, args: list[str], cwd: str, env: dict[str, str], output: str,
            timeout_s: float | None, ahead: bool = False) -> tuple[int, bool]:
        """Run ``nbgrader ARGS`` in a forked child; its exit status and whether it was killed at ``timeout_s``.
        ``ahead``: run it in a spare made for an earlier ``ahead`` run with the same ``spare_key`` if one waits, and
        make a spare for the next (for the runs that execute test cells, one worker's after another's).

        Raises:
            ForkServerGone: the server is not running (nothing was started).
        """
        if not self.wait_ready():
            raise ForkServerGone("the fork server is not running")
        request = _Request()
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            self._waiting[request_id] = request
            try:
                self._process.stdin.write((json.dumps({"id": request_id, "args": args, "cwd": cwd, "env": env,
                                                       "output": output, "ahead": ahead}) + "\n").encode())
                self._process.stdin.flush()
            except OSError as exc:
                self._waiting.pop(request_id, None)
                raise ForkServerGone(f"the fork server is not running ({exc})") from exc
        started = time.monotonic()
        if not request.forked.wait(timeout_s):
            return -signal.SIGKILL, True  # not even forked within the time limit (a server that hangs)
        if request.pid is None:
            raise ForkServerGone(f"the fork server did not start the process ({request.error or 'it ended'})")
        left_s = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - started))
        timed_out = not request.ended.wait(left_s)
        if timed_out:
            kill_group(request.pid)
            request.ended.wait(60)
        if request.status is None:  # the server ended while the child ran: end the child, run it again
            kill_group(request.pid, wait_s=30)
            raise ForkServerGone("the fork server ended while nbgrader ran")
        return request.status, timed_out

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        """Wait until the server has made its imports; whether it runs."""
        return self._ready.wait(timeout_s) and not self.gone

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def close(self) -> None:
        close_and_wait(self._process, wait_s=30)

    def _read(self) -> None:
        for line in self._process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get(READY):
                self._ready.set()
                continue
            with self._lock:
                request = self._waiting.get(message.get("id"))
                if request is not None and request.answer(message):
                    del self._waiting[message["id"]]
        self._gone.set()
        self._ready.set()
        with self._lock:  # whoever still waits learns that nothing will come
            for request in self._waiting.values():
                request.abandon()


if __name__ == "__main__":
    serve()
