"""course/fast_start.py: nbgrader's slow start-up steps skipped or done in-process, with the same results."""
from __future__ import annotations

import subprocess
import sys

from fixture_lab import REPO  # noqa: E402

PROBE = """
import sys
import nbgrader.api as api
from course import fast_start
by_subprocess = api.get_alembic_version()  # nbgrader's own: `alembic heads` in a subprocess
fast_start.find_schema_version_in_process()
fast_start.find_schema_version_in_process()  # a second call changes nothing
in_process = api.get_alembic_version()
assert api.get_alembic_version.in_process
print(by_subprocess, in_process)
"""


def test_the_schema_version_found_in_process_is_the_one_alembic_heads_prints():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    by_subprocess, in_process = result.stdout.split()
    assert len(by_subprocess) == 12 and in_process == by_subprocess, (
        "a gradebook created by the course's nbgrader processes must record the schema version nbgrader's own "
        f"`alembic heads` gives: {result.stdout!r}")


def test_slow_optional_modules_are_not_imported():
    probe = ("from course import fast_start; fast_start.skip_slow_optional_imports(); import nbformat, jsonschema, sys; "
             "print(sys.modules['rfc3987_syntax'] is None)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr[-3000:]
