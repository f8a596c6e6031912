"""Process groups and parents (Linux): each nbgrader process runs in its own session, so that a time limit can kill
its group, and asks for a SIGKILL when ``course grade`` ends (``kill -9`` included), so that no grading goes on
writing the gradebook behind a killed run."""
from __future__ import annotations

import contextlib
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads; nothing when it is gone."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


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
