"""Kernels forked from one process that has already made their imports (``kernel_boot.py --zygote``).

A kernel started ahead (``course/kernel_pool.py``) imports the lab's libraries before it answers: for Lab 1, torch,
transformers' modeling code, pandas and matplotlib, some 8 CPU-seconds on the 2-core machine and 8-11 on the lent
H100 (``scripts/gpu/start_costs.py``), more than grading the submission then takes. With one worker the next kernel
boots on CPUs the grading leaves idle; with a worker per pair of CPUs it takes them from the grading, and at the
start of a run every worker's first kernel boots at once. A zygote makes those imports once for all the workers of a
run (``shared_zygote``: the workers' environments differ only in their GPU and CPUs) and forks each kernel from
them; the child takes its worker's environment, CPUs and thread count before it starts the kernel.

A sandboxed kernel still gets a bubblewrap sandbox of its own, made for it exactly as for a kernel started the usual
way (``sandbox.start_for_fork``: the same allow-list, cgroups and limits, around a placeholder); the zygote's child
enters it (``kernel_boot.enter_sandbox``: its namespaces and root) and forks the kernel there, which then drops every
capability it would not have had (``kernel_boot.drop_capabilities``) and every descriptor but its stdin and log.
Such a zygote imports in the environment a sandboxed kernel has (``sandbox.kernel_env``), with a HOME of its own.
``EFFICIENT_AI_KERNEL_ZYGOTE``: ``on`` (the default) or ``off``.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from .processes import close_and_wait
from .sandbox import BOOT_SCRIPT, CPUS_ENV, RUNTIME_ENV, kernel_env, prepare_files

MODE_ENV = "EFFICIENT_AI_KERNEL_ZYGOTE"
PER_WORKER_ENV = ("CUDA_VISIBLE_DEVICES", CPUS_ENV, RUNTIME_ENV)  # what may differ between the kernels of one zygote
READY_TIMEOUT_S = 300.0  # the imports of a lab on a busy machine
FORK_TIMEOUT_S = 30.0


def zygote_enabled() -> bool:
    return os.environ.get(MODE_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


class ZygoteGone(RuntimeError):
    """The zygote ended, never became ready, or could not fork: start the kernel the usual way."""


class KernelZygote:
    """One ``kernel_boot.py --zygote`` process and the kernels it forks.

    Args:
        source: the lab's instructor folder (``source/<lab>/``); the zygote imports from a copy of its files, which
            its kernels also put first on ``sys.path``.
        source_root: the course's source folder (``sandbox.prepare_files``).
        preload: the modules to import, comma-separated (``kernel_pool.preload_modules``).
        env: the environment of a kernel's launcher, but for ``PER_WORKER_ENV``; the zygote runs on any CPU.
        sandboxed: its kernels are sandboxed; it imports in a sandboxed kernel's environment.

    Raises:
        ZygoteGone: ``source`` holds no instructor files.
    """

    def __init__(self, source: str, source_root: str, preload: str, env: dict[str, str], sandboxed: bool = False):
        self.folder = tempfile.mkdtemp(prefix="efficient-ai-zygote-")
        self.files = os.path.join(self.folder, "files")
        if not prepare_files(source, source_root, [], self.files):
            shutil.rmtree(self.folder, ignore_errors=True)
            raise ZygoteGone(f"no instructor files in {source}")
        argv = [sys.executable, "-I", BOOT_SCRIPT, "--zygote", "--on-path", "--files", self.files, "--preload", preload]
        env = {k: v for k, v in env.items() if k not in PER_WORKER_ENV}
        if sandboxed:
            home = os.path.join(self.folder, "home")
            os.mkdir(home)
            env = {**kernel_env(env), "HOME": home, "TMPDIR": home}
        self._process = subprocess.Popen(
            argv, cwd=source, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self._started_s = time.monotonic()
        self._lock = threading.Lock()
        self._ready = None  # the zygote's first answer, once read
        self._buffer = b""

    def ready(self) -> bool:
        """Whether the zygote has made its imports (without waiting); False once it has failed."""
        with self._lock:
            if self._ready is None and select.select([self._process.stdout.fileno()], [], [], 0)[0]:
                self._ready = self._answer(READY_TIMEOUT_S)  # its first line is arriving
            return bool(self._ready and self._ready.get("ready"))

    def importing(self) -> bool:
        """Whether the zygote is still making its imports: neither ready nor failed, for less than
        ``READY_TIMEOUT_S``."""
        return (not self.ready() and not self.failed()
                and time.monotonic() - self._started_s < READY_TIMEOUT_S)

    def failed(self) -> bool:
        """Whether the zygote answered that it cannot fork kernels, or ended before it was ready."""
        self.ready()
        return self._ready is not None and not self._ready.get("ready")

    @property
    def why(self) -> str:
        return (self._ready or {}).get("why") or "it ended or took too long"

    def fork(self, args: list[str], log: str, env: dict[str, str], cpus: set[int] | None,
             launcher_args: list[str] | None = None) -> int:
        """A kernel started with ``kernel_boot.py ARGS`` (without ``--preload``) in environment ``env`` on ``cpus``
        (empty: any), its output appended to ``log``; its pid. Waits for the zygote's imports the first time.
        ``launcher_args`` (a sandboxed kernel): the sandbox launcher's arguments (``-f CONNECTION_FILE``) instead of
        ``args``, and ``env`` the launcher's; the pid is then that of the process which keeps the kernel's sandbox.

        Raises:
            ZygoteGone: the zygote cannot start kernels.
        """
        with self._lock:
            if self._ready is None:
                self._ready = self._answer(READY_TIMEOUT_S)
            if not self._ready.get("ready"):
                raise ZygoteGone(f"the zygote did not start ({self.why})")
            try:
                request = {"args": args, "log": log, "env": env, "cpus": sorted(cpus or ()),
                           **({"launcher_args": launcher_args} if launcher_args else {})}
                self._process.stdin.write((json.dumps(request) + "\n").encode())
                self._process.stdin.flush()
            except OSError as exc:
                raise ZygoteGone(f"the zygote ended ({exc})") from exc
            answer = self._answer(FORK_TIMEOUT_S)
        if "pid" not in answer:
            raise ZygoteGone(f"the zygote could not fork ({answer.get('error', 'no answer')})")
        return int(answer["pid"])

    def _answer(self, timeout_s: float) -> dict:
        """The zygote's next answer ({} when none came within ``timeout_s``: it is then ended)."""
        deadline = time.monotonic() + timeout_s
        out = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            left_s = deadline - time.monotonic()
            chunk = os.read(out, 65536) if left_s > 0 and select.select([out], [], [], left_s)[0] else b""
            if not chunk:
                self._process.kill()
                return {}
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            return {}

    def close(self) -> None:
        """End the zygote (its kernels are ended by their pools) and remove its files."""
        close_and_wait(self._process, wait_s=10)
        shutil.rmtree(self.folder, ignore_errors=True)


_shared: dict[tuple, list] = {}  # key -> [zygote, users]
_shared_lock = threading.Lock()


def shared_zygote(source: str, source_root: str, preload: str, env: dict[str, str],
                  sandboxed: bool = False) -> KernelZygote:
    """The zygote of the kernels of lab folder ``source`` with ``preload`` and ``env`` (but for ``PER_WORKER_ENV``):
    started by the first pool that asks, shared by the others; give it back with ``release``.

    Raises:
        ZygoteGone: it cannot start.
    """
    key = (source, source_root, preload, sandboxed,
           tuple(sorted((k, v) for k, v in env.items() if k not in PER_WORKER_ENV)))
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            entry = _shared[key] = [KernelZygote(source, source_root, preload, env, sandboxed), 0]
        entry[1] += 1
        return entry[0]


def release(zygote: KernelZygote) -> None:
    """One pool no longer uses ``zygote``; the last one ends it."""
    with _shared_lock:
        for key, entry in list(_shared.items()):
            if entry[0] is zygote:
                entry[1] -= 1
                if entry[1] > 0:
                    return
                del _shared[key]
    zygote.close()
