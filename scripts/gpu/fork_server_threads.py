"""Which of the fork server's imports starts a thread on this machine (course/fork_server.py must fork with one).

Usage: ``python scripts/gpu/fork_server_threads.py``: imports ``fork_server.PRELOAD`` one by one with the server's
environment and prints each import that changed the thread count, with the threads' names.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from course import fork_server  # noqa: E402

if __name__ == "__main__":
    if any(os.environ.get(key) != value for key, value in fork_server.SERVER_ENV.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **fork_server.SERVER_ENV})
    from course.fast_start import skip_slow_optional_imports

    skip_slow_optional_imports()
    before = fork_server._thread_names()
    for name in fork_server.PRELOAD:
        importlib.import_module(name)
        after = fork_server._thread_names()
        if after != before:
            print(f"{name}: {len(before)} -> {len(after)} threads: {after}")
        before = after
    print(f"threads after every import: {len(before)}: {before}")
