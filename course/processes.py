"""Processes this one did not start itself, seen through ``/proc`` (Linux): alive or not, and which one a pid is."""
from __future__ import annotations


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``); None when it is gone or a zombie.

    The pair (pid, start time) names one process: a pid the kernel reused later has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]
