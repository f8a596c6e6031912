"""Shared fixtures: a throw-away PostgreSQL server for the grading-at-scale tests."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pg_server import PostgresServer, find_pg_bin  # noqa: E402


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server on 127.0.0.1 for this test session (Debian's postgresql package)."""
    bin_dir = find_pg_bin()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries are missing: .ci/run installs Debian's postgresql package")
        pytest.skip("PostgreSQL server binaries not installed (apt-get install postgresql)")
    server = PostgresServer(bin_dir).start()
    yield server
    server.stop()
