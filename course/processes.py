"""Process groups and parents: killing a group, ending with a parent (Linux).

``course grade`` starts each nbgrader process (``course.nbgrader_child``) in its own session, so that a time limit
can kill the whole group. A ``kill -9`` of ``course grade`` does not reach such a session, so each child asks the
kernel for a SIGKILL when its parent ends: no grading goes on writing the gradebook behind a killed run.
"""
from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads; nothing when it is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def die_with_parent(parent_pid: int) -> bool:
    """Have this process (not its later children) SIGKILLed when the thread that started it ends; exit now if
    ``parent_pid`` already ended. Returns False where ``prctl`` is not to be had (not Linux)."""
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
