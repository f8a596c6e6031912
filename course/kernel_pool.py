"""Grading kernels started before their submission needs them, and their adoption by nbgrader.

Every submission's nbgrader process used to start its own kernel and wait for it: the kernel's start and the imports
done before any student code (the guard's numpy, torch and utils; the setup cells' pandas, matplotlib, transformers)
cost 5 to 8 s of each submission's time (reports/grading-breakdown-*.md). ``course grade`` now keeps a
``KernelPool`` per worker that starts the *next* submission's kernel while the current one grades:

- the same kernelspec, sandbox, environment and CPUs as the kernel nbgrader would start itself
  (``sandbox.grading_kernel_spec``, ``nbgrader_run.nbgrader_env``), each kernel with its own folder and ipc socket
  folder (a kernel never sees another's sockets);
- ``kernel_boot.py --preload`` imports what the lab's setup cells and the guard import (``preload_modules``) before
  the kernel answers. Those imports ran before any student code already; only their time moves.
- ``kernel_boot.py --cuda`` creates the kernel's CUDA context before it answers (``EFFICIENT_AI_KERNEL_CUDA_AHEAD=off``
  leaves it to the first GPU cell);
- it is forked from the run's zygote, which made those imports once (``course/kernel_zygote.py``); a sandboxed one
  enters a sandbox made for it as for a kernel started the usual way.

The nbgrader process finds the pool in ``EFFICIENT_AI_KERNEL_POOL`` and adopts one kernel (``PooledProvisioner``, set
by ``GuardedExecute``); with no kernel ready it starts its own, as before. A kernel serves one submission: when the
worker's nbgrader process ends, the worker kills whatever that process claimed (``KernelPool.release``). A fresh
kernel after a dead one is always started by nbgrader itself.

Claiming: the pool publishes a started kernel as ``<pool>/ready/<id>.json`` (its connection file, pid, process start
time, log file); a claimer renames that file into ``<pool>/claimed/`` (atomic: one claimer wins), then checks that the
process is still the one the pool started.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Unicode

from . import boundary, kernel_zygote
from .kernel_zygote import ZygoteGone, zygote_enabled
from .nbgrader_run import nbgrader_env
from .processes import kill_group, start_time
from .sandbox import (
    CPUS_ENV,
    CUDA_AHEAD_ENV,
    KERNEL_NAME,
    LAUNCHER_SCRIPT,
    PRELOAD_ENV,
    RUNTIME_ENV,
    SOURCE_ENV,
    grading_kernel_spec,
    parse_cpus,
    sandbox_works,
)

POOL_ENV = "EFFICIENT_AI_KERNEL_POOL"  # the pool folder an nbgrader process may adopt a kernel from
POOL_OFF_ENV = "EFFICIENT_AI_KERNEL_POOL_OFF"  # set to 1: course grade starts no kernels ahead (to compare)
CUDA_ENV = "EFFICIENT_AI_KERNEL_CUDA_AHEAD"  # off: a kernel started ahead leaves its CUDA context to its first GPU cell
LOG_TAIL_BYTES = 64 * 1024  # of a pooled kernel's own stdout and stderr, copied to the adopting nbgrader's stderr
REFILL_POLL_S = 0.05
MAX_FAILURES = 3  # kernels started ahead that fail before the pool stops starting them
FAILURE_PAUSE_S = 2.0


def pool_enabled() -> bool:
    return os.environ.get(POOL_OFF_ENV, "").strip() not in ("1", "true", "yes", "on")


def cuda_ahead() -> bool:
    return os.environ.get(CUDA_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


def preload_modules(source_folder: Path) -> list[str]:
    """What a pre-started kernel of the lab in ``source_folder`` (``source/<lab>/``) imports before it answers: the
    guard's libraries where the lab uses them, then every module that the instructor's setup cells (locked code cells
    that are neither tests nor answers) import, in order."""
    import nbformat

    from .nbgrader_ext import setup_cells  # here: nbgrader_ext imports this module

    # numpy, torch, utils: what the guard imports before any student code
    modules = sorted(boundary.GUARD_LIBRARIES) if boundary.lab_uses_guard_libraries(source_folder) else []
    for path in sorted(source_folder.glob("*.ipynb")):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable notebook preloads nothing; its kernel starts as usual
            continue
        modules += boundary.modules_to_import(setup_cells(nb), None)
    return list(dict.fromkeys(modules))


class KernelPool:
    """Keeps one grading kernel of ``lab`` started ahead for a worker of ``course grade``.

    Args:
        course_root: the course folder (its ``source/<lab>/`` holds the instructor files).
        lab: the lab being graded.
        env: the worker's environment variables (its GPU, CPUs and thread counts; ``nbgrader_run.worker_envs``).
        more_to_grade: whether another submission may still need a kernel; none is started ahead otherwise.
    """

    def __init__(self, course_root: Path, lab: str, env: dict[str, str] | None = None,
                 more_to_grade: Callable[[], bool] = lambda: True):
        self._more_to_grade = more_to_grade
        source = Path(course_root) / "source" / lab
        preload = ",".join(preload_modules(source))
        sandboxed = sandbox_works()
        # Short path under /tmp: ipc socket paths must stay under about 100 characters.
        self.folder = Path(tempfile.mkdtemp(prefix="efficient-ai-pool-", dir="/tmp"))
        for name in ("ready", "claimed"):
            (self.folder / name).mkdir()
        spec = grading_kernel_spec(str(course_root), None, None, str(self.folder), sandboxed)
        self._argv = spec["argv"]
        # What nbgrader autograde adds for the kernels it starts: NBGRADER_EXECUTION (the sandbox keeps it from the
        # kernel; an unsandboxed one sees it, and Lab 1 reads it). JPY_PARENT_PID: an unsandboxed kernel ends with
        # this process, as one nbgrader starts ends with nbgrader (a sandboxed one ends with its bwrap).
        self._env = {**nbgrader_env(env), **spec["env"], PRELOAD_ENV: preload, "NBGRADER_EXECUTION": "autograde",
                     "JPY_PARENT_PID": str(os.getpid())}
        self._env.pop(POOL_ENV, None)
        self._cwd = source
        self._cpus = parse_cpus(self._env.get(CPUS_ENV, ""))
        if cuda_ahead():
            self._env[CUDA_AHEAD_ENV] = "1"
        self._kernels: dict[str, subprocess.Popen | AdoptedProcess] = {}
        self._zygote = None
        self._started = 0  # kernels started ahead so far
        self._sandboxed = sandboxed
        if zygote_enabled():  # kernels forked from one that made the imports (kernel_zygote.py)
            try:
                self._zygote = kernel_zygote.shared_zygote(str(source), spec["env"][SOURCE_ENV], preload, self._env,
                                                           sandboxed)
            except (ZygoteGone, OSError) as exc:
                print(f"kernel pool: kernels start without a zygote ({exc})", file=sys.stderr)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._keep_one_ready, name="kernel-pool", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        """What the worker's nbgrader process needs in its environment to adopt this pool's kernels."""
        return {POOL_ENV: str(self.folder)}

    def release(self) -> None:
        """Kill every kernel claimed so far (their nbgrader process has ended) and remove its files."""
        with self._lock:
            for name in os.listdir(self.folder / "claimed"):
                self._remove(name.removesuffix(".json"))

    def close(self) -> None:
        """Kill every kernel of the pool, claimed or not, and remove the pool's folder."""
        self._closed.set()
        self._thread.join()
        with self._lock:
            for kernel_id in list(self._kernels):
                self._remove(kernel_id)
            if self._zygote is not None:
                kernel_zygote.release(self._zygote)
                self._zygote = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> KernelPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inside -----------------------------------------------------------------------------------------------------
    def _keep_one_ready(self) -> None:
        failures = 0  # kernels that could not start or ended unused: after MAX_FAILURES, none is started ahead
        while not self._closed.is_set() and failures < MAX_FAILURES:
            failed = False
            with self._lock:
                for kernel_id, process in list(self._kernels.items()):  # reap: a killed kernel is no zombie for long
                    if process.poll() is None or (self.folder / "claimed" / f"{kernel_id}.json").exists():
                        continue  # a claimed kernel is removed by release(), after its nbgrader process
                    print(f"kernel pool: a kernel started ahead ended before any submission used it (exit status "
                          f"{process.returncode}); its output:\n{_tail(self.folder / kernel_id / 'kernel.log')}",
                          file=sys.stderr)
                    self._remove(kernel_id)
                    failed = True
                    if isinstance(process, AdoptedProcess) and self._zygote is not None:  # forked: fork no more
                        self._give_up_zygote("a kernel it forked ended before any submission used it")
                if (not failed and not os.listdir(self.folder / "ready") and self._more_to_grade()
                        and not self._awaiting_zygote()):
                    try:
                        self._start_one()
                    except Exception as exc:  # noqa: BLE001 - without a kernel ahead, nbgrader starts its own
                        print(f"kernel pool: could not start a kernel ahead ({exc})", file=sys.stderr)
                        failed = True
            failures += failed
            self._closed.wait(FAILURE_PAUSE_S if failed else REFILL_POLL_S)
        if failures >= MAX_FAILURES:
            print(f"kernel pool: {failures} kernels started ahead failed; nbgrader starts every kernel itself",
                  file=sys.stderr)

    def _awaiting_zygote(self) -> bool:
        """Whether the next kernel waits for the zygote's imports instead of starting the usual way: every kernel but
        the pool's first. The first may be needed at once; any later one is needed when a submission ends, and the
        zygote, started before the first kernel, makes its imports sooner than a kernel started now would make its
        own, without a second import taking CPU from the submission being graded."""
        return self._started > 0 and self._zygote is not None and self._zygote.importing()

    def _start_one(self) -> None:
        from jupyter_client.connect import write_connection_file

        kernel_id = f"k{secrets.token_hex(4)}"
        home = self.folder / kernel_id
        (home / "ipc").mkdir(parents=True)
        (home / "runtime").mkdir()
        connection_file = str(home / "connection.json")
        write_connection_file(connection_file, ip=str(home / "ipc" / "kernel"), transport="ipc",
                              key=secrets.token_hex(32).encode(), kernel_name=KERNEL_NAME)
        argv = [connection_file if part == "{connection_file}" else part for part in self._argv]
        # The pool's first kernel starts the usual way when the zygote has not made its imports yet: a kernel the pool
        # publishes at once is one the first submission adopts, instead of starting its own. Later ones wait for the
        # zygote (_awaiting_zygote).
        if self._zygote is not None and self._zygote.failed():
            self._give_up_zygote(f"the zygote did not start ({self._zygote.why})")
        env = {**self._env, RUNTIME_ENV: str(home / "runtime")}
        process = self._fork(argv, home, env) if self._zygote is not None and self._zygote.ready() else None
        if process is None:  # the launcher puts it on the worker's CPUs (CPUS_ENV), as it does nbgrader's own kernels
            with open(home / "kernel.log", "wb") as log:
                process = subprocess.Popen(
                    argv, cwd=self._cwd, env=env,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
        self._kernels[kernel_id] = process
        self._started += 1
        started = start_time(process.pid)
        record = {"connection_file": connection_file, "pid": process.pid, "start_time": started,
                  "log": str(home / "kernel.log")}
        staging = home / "ready.json"
        staging.write_text(json.dumps(record))
        os.rename(staging, self.folder / "ready" / f"{kernel_id}.json")

    def _fork(self, argv: list[str], home: Path, env: dict[str, str]) -> AdoptedProcess | None:
        """The kernel of the launcher command ``argv`` with environment ``env``, forked from the zygote (None: it
        cannot fork; the zygote is then given up and every later kernel starts the usual way). A sandboxed kernel's
        pid is that of the zygote's child which made its sandbox and waits for it (``kernel_boot.run_sandboxed_child``):
        killing its process group ends the kernel and the sandbox."""
        launcher_args = argv[argv.index(LAUNCHER_SCRIPT) + 1:]
        args = ["--on-path", "--files", self._zygote.files, "--work", str(home / "work"),
                *(["--cuda"] if self._env.get(CUDA_AHEAD_ENV) == "1" else []), "--",
                *[a for a in launcher_args if a != "--unsandboxed"]]
        try:
            pid = self._zygote.fork(args, str(home / "kernel.log"), env, self._cpus,
                                    launcher_args if self._sandboxed else None)
        except ZygoteGone as exc:
            self._give_up_zygote(str(exc))
            return None
        return AdoptedProcess(pid, start_time(pid))

    def _give_up_zygote(self, why: str) -> None:
        print(f"kernel pool: kernels start without the zygote from now on ({why})", file=sys.stderr)
        kernel_zygote.release(self._zygote)
        self._zygote = None

    def _remove(self, kernel_id: str) -> None:
        """Kill the kernel (its whole process group), reap it and remove its files. Call with the lock held."""
        process = self._kernels.pop(kernel_id, None)
        if process is not None:
            kill_group(process.pid)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for name in ("ready", "claimed"):
            (self.folder / name / f"{kernel_id}.json").unlink(missing_ok=True)
        shutil.rmtree(self.folder / kernel_id, ignore_errors=True)


def _tail(path: Path | str) -> str:
    """The last ``LOG_TAIL_BYTES`` of a kernel's log, as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def claim(folder: str) -> dict | None:
    """Take a started kernel from the pool in ``folder``: its record (``KernelPool._start_one``), or None."""
    ready, claimed = os.path.join(folder, "ready"), os.path.join(folder, "claimed")
    try:
        names = sorted(os.listdir(ready))
    except OSError:
        return None
    for name in names:
        try:
            os.rename(os.path.join(ready, name), os.path.join(claimed, name))
            with open(os.path.join(claimed, name)) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if record.get("start_time") and start_time(record["pid"]) == record["start_time"]:
            return record
    return None


class AdoptedProcess:
    """The ``subprocess.Popen`` face of a kernel process that another process (the pool) started."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, start_time: str):
        self.pid, self._start_time, self.returncode = pid, start_time, None

    def poll(self) -> int | None:
        if self.returncode is None and start_time(self.pid) != self._start_time:
            self.returncode = -signal.SIGKILL  # its real status belongs to the pool, which reaps it
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class PooledProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, which first tries to adopt a started kernel from ``pool_folder``.

    Only the first kernel of the process is adopted; a fresh kernel (after a dead one) is launched as usual. The
    adopted kernel's own output is copied to this process's stderr when it is cleaned up, where a launched kernel's
    output would have gone."""

    pool_folder = Unicode("")
    adopted = Bool(False)
    _tried = False
    _log = ""

    async def launch_kernel(self, cmd: list[str], **kwargs):
        record = None
        if self.pool_folder and not self._tried:
            self._tried = True
            record = claim(self.pool_folder)
        if record is None:
            self.adopted = False
            return await super().launch_kernel(cmd, **kwargs)
        with open(record["connection_file"]) as handle:
            info = json.load(handle)
        info["key"] = info["key"].encode()
        self.connection_info = info
        self.process = AdoptedProcess(record["pid"], record["start_time"])
        self.pid = self.pgid = record["pid"]  # started in a session of its own
        self.cwd = kwargs.get("cwd")
        self.adopted, self._log = True, record.get("log", "")
        return self.connection_info

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if self._log:
            text, self._log = _tail(self._log), ""
            if text.strip():
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
