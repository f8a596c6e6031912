"""Shared fixtures (a throw-away PostgreSQL server for the grading-at-scale tests) and the markers of each module.

Markers (declared in pyproject.toml) let a developer run the quick loop: ``python -m pytest -m "not slow"``
(seconds to a few minutes) while the whole suite is what CI runs.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pg_server import PostgresServer, find_pg_bin

from course.cli.nbgrader_run import available_cpus
from course.common.job import thread_pool_env


def _share_cores_between_test_processes() -> None:
    """Under pytest-xdist, cap the thread pools of everything a test process starts (kernels, graders) at its share
    of the cores, as ``course.cli.grade`` does for its own workers. Without it two processes each run torch and OpenMP
    with a thread per core, and their spinning threads slow each other: on the 2-core CI machine, two test
    processes grading Lab 1 at once took 20 % longer (111 s against 87-97 s for four submissions).
    A variable set by the caller wins."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if processes > 1:
        for name, value in thread_pool_env(max(1, len(available_cpus()) // processes)).items():
            os.environ.setdefault(name, value)


_share_cores_between_test_processes()

# What each test module needs: a module that grades whole labs or many submissions is slow.
MODULE_MARKERS = {
    "test_browser": ("browser", "slow"),
    "test_course_dir": ("slow",),
    "test_deploy": ("slurm", "postgres", "slow"),
    "test_grading_routes": ("sandbox", "slow"),
    "test_labs": ("slow",),
    "test_pipeline": ("slow",),
    "test_redteam": ("sandbox", "slow"),
    "test_redteam_controls": ("sandbox", "slow"),
    "test_redteam_boundary": ("slow",),
    "test_sandbox": ("sandbox", "slow"),
    "test_scale": ("postgres", "slow"),
}


# The longest modules, longest first (seconds of their slowest tests in one full run of scripts/test.sh on a 2-core
# machine, as --durations reported them: only the order matters). scripts/test.sh runs the suite with pytest-xdist, one
# whole module per worker at a time (``--dist loadfile``): starting the longest ones first keeps the workers busy
# until the end instead of leaving one long module running alone.
LONGEST_MODULES_S = {
    "test_redteam": 274, "test_labs": 187, "test_pipeline": 154, "test_scale": 83, "test_guard": 75,
    "test_redteam_boundary": 71, "test_partial_credit": 66, "test_grading_routes": 65, "test_sandbox": 57,
    "test_deploy": 51, "test_course_dir": 44, "test_measure": 32, "test_redteam_controls": 31, "test_browser": 28,
    "test_grading_limits": 27, "test_submission": 27, "test_lms": 22,
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in MODULE_MARKERS.get(Path(str(item.fspath)).stem, ()):
            item.add_marker(getattr(pytest.mark, name))
    # Stable sort: each module's tests keep their order and stay together.
    items.sort(key=lambda item: -LONGEST_MODULES_S.get(Path(str(item.fspath)).stem, 0))


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
