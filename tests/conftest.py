"""Shared fixtures (a throw-away PostgreSQL server for the grading-at-scale tests) and the markers of each module.

Markers (declared in pyproject.toml) let a developer run the quick loop: ``python -m pytest -m "not slow"``
(seconds to a few minutes) while the whole suite is what CI runs.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pg_server import PostgresServer, find_pg_bin

# What each test module needs: a module that grades whole labs or many submissions is slow.
MODULE_MARKERS = {
    "test_browser": ("browser", "slow"),
    "test_course_dir": ("slow",),
    "test_deploy": ("slurm", "postgres", "slow"),
    "test_grading_routes": ("sandbox", "slow"),
    "test_labs": ("slow",),
    "test_pipeline": ("slow",),
    "test_redteam": ("sandbox", "slow"),
    "test_redteam_boundary": ("slow",),
    "test_sandbox": ("sandbox", "slow"),
    "test_scale": ("postgres", "slow"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in MODULE_MARKERS.get(Path(str(item.fspath)).stem, ()):
            item.add_marker(getattr(pytest.mark, name))


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
