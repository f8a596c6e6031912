"""The mark of a finished grading run (course/common/grading_result.py), which `course grade --resume` trusts: a notebook that
nbgrader wrote before grading (sanitized, or left by a killed run) is never taken for a graded one."""
from __future__ import annotations

import json
import shutil

from course.common.grading_result import RESULT_FILE as GRADING_REPORT
from course.common.grading_result import is_recorded, mark_recorded

NOTEBOOK = "lab1.ipynb"


def graded_folder(tmp_path, name="alice"):
    folder = tmp_path / name / "lab1"
    folder.mkdir(parents=True)
    (folder / NOTEBOOK).write_text('{"cells": ["graded"]}')
    (folder / GRADING_REPORT).write_text(json.dumps({"stopped": "", "kernel_restarts": []}))
    return folder


def test_a_marked_folder_is_recorded_and_keeps_its_report(tmp_path):
    folder = graded_folder(tmp_path)
    assert not is_recorded(folder, NOTEBOOK), "a report GuardedExecute wrote says nothing about the gradebook"
    mark_recorded(folder, NOTEBOOK)
    assert is_recorded(folder, NOTEBOOK)
    report = json.loads((folder / GRADING_REPORT).read_text())
    assert report["stopped"] == "" and report["kernel_restarts"] == [], "the grading report's own fields stay"
    assert sorted(p.name for p in folder.iterdir()) == sorted([NOTEBOOK, GRADING_REPORT]), "no temporary file is left"


def test_a_notebook_written_after_the_mark_is_not_recorded(tmp_path):
    folder = graded_folder(tmp_path)
    mark_recorded(folder, NOTEBOOK)
    (folder / NOTEBOOK).write_text('{"cells": ["sanitized, not yet run"]}')  # a later run, killed part-way
    assert not is_recorded(folder, NOTEBOOK)


def test_a_mark_copied_from_another_submission_does_not_match(tmp_path):
    alice, bob = graded_folder(tmp_path, "alice"), graded_folder(tmp_path, "bob")
    (bob / NOTEBOOK).write_text('{"cells": ["bob, sanitized"]}')
    mark_recorded(alice, NOTEBOOK)
    shutil.copy2(alice / GRADING_REPORT, bob / GRADING_REPORT)
    assert not is_recorded(bob, NOTEBOOK)


def test_missing_or_broken_files_read_as_not_recorded(tmp_path):
    folder = graded_folder(tmp_path)
    (folder / GRADING_REPORT).write_text("{not json")
    assert not is_recorded(folder, NOTEBOOK)
    (folder / GRADING_REPORT).write_text(json.dumps(["recorded_notebook_sha256"]))
    assert not is_recorded(folder, NOTEBOOK)
    mark_recorded(folder, NOTEBOOK)  # a broken report is replaced by one that holds the mark
    (folder / NOTEBOOK).unlink()
    assert not is_recorded(folder, NOTEBOOK)
    assert not is_recorded(tmp_path / "nobody" / "lab1", NOTEBOOK)
