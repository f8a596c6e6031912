"""Processes seen through ``/proc`` and ``prctl`` (Linux): alive or not, which one a pid is, killing a process group,
and ending with a parent.

``course grade`` starts nbgrader processes (``course.nbgrader_child``) in their own sessions, so that a time limit
can kill a whole process group. A TA's ``kill -9`` of ``course grade`` or of its process group therefore does not
reach them: each asks the kernel for a SIGKILL when its parent ends
(``die_with_parent``), so no grading goes on writing autograded notebooks and gradebook rows after the run that
started it is gone (a resumed run would grade the same submissions at the same time).
"""
from __future__ import annotations

import os
import signal
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``); None when it is gone or a zombie.

    The pair (pid, start time) names one process: a pid the kernel reused later has another start time.
    """
    fields = stat_fields(pid)
    return None if not fields or fields[0] in ("Z", "X") else fields[19]


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state first: index 1 is the parent's pid, 11 and 12
    the user and system CPU time in clock ticks, 19 the start time); empty when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def kill_group(pid: int, wait_s: float = 0.0) -> None:
    """SIGKILL the process group ``pid`` leads (nothing when it is gone); with ``wait_s``, wait up to that long for
    the process ``pid`` to be gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and start_time(pid) is not None:
        time.sleep(0.05)


def die_with_parent(parent_pid: int) -> bool:
    """Have this process SIGKILLed when the thread that started it ends; exit now if ``parent_pid`` already ended.

    Only the calling process is covered (a child it starts later is not, nor is a program it execs with more
    privileges). Returns whether the request was made: False where ``prctl`` is not to be had (not Linux).
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent ended before the request: nobody will send the signal
        os._exit(1)
    return True
