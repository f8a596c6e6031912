"""Grading at class scale: parallel workers, SQLite and PostgreSQL gradebooks, shards, a killed run resumed.

Every parallel or sharded run must give exactly the per-cell scores of the serial SQLite run.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fixture_lab import LAB, REPO, built_root, make_class, wait_until_no_process_works_in  # noqa: E402

from course.cli import grade  # noqa: E402
from course.common.grading_result import is_recorded  # noqa: E402
from course.common.scores import read_scores  # noqa: E402

CLASS_SIZE = 8  # every subset of the three answers once (fixture_lab.make_class); the PostgreSQL run: 2 workers
SMALL_CLASS = 6  # the other runs use the first 6 students (each answers a different subset)


def cell_scores(scores) -> dict[str, dict[str, float]]:
    return {s: {gid: c.score for gid, c in sub.cells.items()} for s, sub in scores.items()}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return built_root(tmp_path_factory.mktemp("scale-root"))


@pytest.fixture(scope="module")
def serial(root, tmp_path_factory):
    course = tmp_path_factory.mktemp("serial")
    expected = make_class(root, course, CLASS_SIZE)
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert {s: sub.autograded_score() for s, sub in scores.items()} == expected
    return cell_scores(scores)


def first(serial: dict, size: int) -> dict:
    return {s: serial[s] for s in sorted(serial)[:size]}


def test_two_workers_on_sqlite_match_the_serial_run(root, serial, tmp_path):
    make_class(root, tmp_path, SMALL_CLASS)
    outcomes, scores = grade.grade_lab(tmp_path, LAB, progress=False, workers=2)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert cell_scores(scores) == first(serial, SMALL_CLASS)


def test_shards_partition_the_class_and_match_the_serial_run(root, serial, tmp_path):
    make_class(root, tmp_path, SMALL_CLASS)
    students = grade.list_students(tmp_path, LAB)
    shards = [grade.shard_students(students, (i, 3)) for i in range(3)]
    assert sorted(s for shard in shards for s in shard) == sorted(students), "shards must cover every student once"
    merged = {}
    for shard in shards:
        _, scores = grade.grade_lab(tmp_path, LAB, shard, progress=False)
        merged.update(cell_scores(scores))
    assert merged == first(serial, SMALL_CLASS)
    assert cell_scores(read_scores(tmp_path, LAB)) == merged, "the gradebook holds the union of the shards"


@pytest.mark.parametrize("text, expected", [("0/1", (0, 1)), ("2/3", (2, 3))])
def test_parse_shard(text, expected):
    assert grade.parse_shard(text) == expected


@pytest.mark.parametrize("text", ["3/3", "-1/2", "a/b", "1"])
def test_parse_shard_rejects_bad_input(text):
    with pytest.raises(ValueError, match="--shard"):
        grade.parse_shard(text)


def test_two_workers_on_postgresql_match_the_serial_sqlite_run(root, serial, postgres, tmp_path, monkeypatch):
    monkeypatch.setenv("NBGRADER_DB_URL", postgres.create_database("gradebook_workers"))
    make_class(root, tmp_path, CLASS_SIZE)
    outcomes, scores = grade.grade_lab(tmp_path, LAB, progress=False, workers=2)
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert cell_scores(scores) == serial
    assert not (tmp_path / "gradebook.db").exists(), "with NBGRADER_DB_URL set nothing may go to SQLite"


def test_a_killed_run_resumes_with_nothing_lost_or_duplicated(root, serial, postgres, tmp_path):
    db_url = postgres.create_database("gradebook_killed")
    make_class(root, tmp_path, SMALL_CLASS)
    env = {**os.environ, "NBGRADER_DB_URL": db_url, "PYTHONPATH": str(REPO)}
    script = f"from pathlib import Path; from course.cli import grade; grade.grade_lab(Path({str(tmp_path)!r}), {LAB!r}, progress=False, workers=2)"
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    students = sorted(first(serial, SMALL_CLASS))

    def finished() -> list[str]:
        return [s for s in students if is_recorded(tmp_path / "autograded" / s / LAB, f"{LAB}.ipynb")]

    deadline = time.time() + 300
    while time.time() < deadline and len(finished()) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the workers and their kernels die mid-run
    proc.wait()
    left = wait_until_no_process_works_in(tmp_path)
    assert not left, f"no grading may go on behind a killed run: {left}"
    graded_before = finished()
    assert 2 <= len(graded_before) < SMALL_CLASS, f"the kill should land mid-run ({graded_before} graded)"

    os.environ["NBGRADER_DB_URL"] = db_url
    try:
        outcomes, scores = grade.grade_lab(tmp_path, LAB, progress=False, workers=2, resume=True)
    finally:
        del os.environ["NBGRADER_DB_URL"]
    kept = [s for s, o in outcomes.items() if o.reason == "graded by an earlier run"]
    assert kept == graded_before, "the resumed run keeps what the killed run finished, and only that"
    assert all(o.status == "ok" for o in outcomes.values()), outcomes
    assert cell_scores(scores) == first(serial, SMALL_CLASS), "every submission ends with its serial score: nothing lost"
    from nbgrader.api import Gradebook

    with Gradebook(db_url, course_id="efficient-ai") as gb:
        submissions = gb.find_assignment(LAB).submissions
        assert sorted(s.student.id for s in submissions) == sorted(first(serial, SMALL_CLASS)), "one submission per student: nothing duplicated"
