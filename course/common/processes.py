"""Process groups (POSIX): each nbgrader process runs in a session of its own, so that a time limit can kill its
group."""
from __future__ import annotations

import contextlib
import os
import signal


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads; nothing when it is gone."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
