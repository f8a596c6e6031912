"""Kernels forked from one process that has already made their imports (``kernel_boot.py --zygote``).

A kernel started ahead (``course/kernel_pool.py``) imports the lab's libraries before it answers: for Lab 1, torch,
transformers' modeling code, pandas and matplotlib, some 8 CPU-seconds on the 2-core machine and 8-11 on the lent
H100 (``scripts/gpu/start_costs.py``), more than grading the submission then takes. With one worker the next kernel
boots on CPUs the grading leaves idle; with a worker per pair of CPUs it takes them from the grading. A zygote makes
those imports once per worker and forks each kernel from them.

Only for kernels that are not sandboxed: a sandboxed kernel starts in a bubblewrap sandbox of its own (its own file
system view, uid and namespaces), which a fork of a shared process would not have. ``EFFICIENT_AI_KERNEL_ZYGOTE``:
``on`` (the default) or ``off``.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

from .sandbox import BOOT_SCRIPT

MODE_ENV = "EFFICIENT_AI_KERNEL_ZYGOTE"
READY_TIMEOUT_S = 300.0  # the imports of a lab on a busy machine
FORK_TIMEOUT_S = 30.0


def zygote_enabled() -> bool:
    return os.environ.get(MODE_ENV, "on").strip().lower() not in ("0", "off", "false", "no")


class ZygoteGone(RuntimeError):
    """The zygote ended, never became ready, or could not fork: start the kernel the usual way."""


class KernelZygote:
    """One ``kernel_boot.py --zygote`` process and the kernels it forks.

    Args:
        files: the instructor files (on the zygote's ``sys.path``, as a kernel's own copy would be).
        preload: the modules to import, comma-separated (``kernel_pool.preload_modules``).
        cwd, env: the zygote's folder and environment; every kernel it forks inherits them.
        cpus: the CPUs the zygote and its kernels run on (empty: any).
    """

    def __init__(self, files: str, preload: str, cwd: str, env: dict[str, str], cpus: set[int] | None = None):
        argv = [sys.executable, "-I", BOOT_SCRIPT, "--zygote", "--on-path", "--files", files, "--preload", preload]
        self._process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus and hasattr(os, "sched_setaffinity") else None)
        self._lock = threading.Lock()
        self._ready = None  # the zygote's first answer, once read
        self._buffer = b""

    def fork(self, args: list[str], log: str) -> int:
        """A kernel started with ``kernel_boot.py ARGS`` (without ``--preload``), its output appended to ``log``;
        its pid. Waits for the zygote's imports the first time.

        Raises:
            ZygoteGone: the zygote cannot start kernels.
        """
        with self._lock:
            if self._ready is None:
                self._ready = self._answer(READY_TIMEOUT_S)
            if not self._ready.get("ready"):
                why = self._ready.get("why") or "it ended or took too long"
                raise ZygoteGone(f"the zygote did not start ({why})")
            try:
                self._process.stdin.write((json.dumps({"args": args, "log": log}) + "\n").encode())
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
        """End the zygote (its kernels are ended by their pool)."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
