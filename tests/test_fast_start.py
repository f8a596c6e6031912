"""course/fast_start.py: nbgrader's slow start-up steps skipped or done in-process, with the same results."""
from __future__ import annotations

import json
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


METADATA_PROBE = """
import copy, json, sys
import jsonschema, nbformat
from nbgrader.nbgraderformat import MetadataValidator
from course import fast_start

validator = MetadataValidator()
cells = [c.metadata["nbgrader"] for c in nbformat.read("source/lab1/lab1.ipynb", as_version=4).cells
         if "nbgrader" in c.metadata]
broken = []
for meta in cells[:8]:
    for key, value in [("points", "five"), ("grade", "yes"), ("grade_id", 7), ("locked", None), ("solution", [])]:
        bad = copy.deepcopy(meta)
        bad[key] = value
        broken.append(bad)
    broken.append({k: v for k, v in meta.items() if k != "grade"})

def outcomes(validate):
    found = []
    for meta in cells + broken:
        try:
            validate(meta, validator.schema)
            found.append("ok")
        except jsonschema.ValidationError as exc:
            found.append(exc.message)
    return found

stock = outcomes(jsonschema.validate)
fast_start.check_metadata_schema_once()
fast_start.check_metadata_schema_once()  # a second call changes nothing
import nbgrader.nbgraderformat.common as common
assert isinstance(common.jsonschema, fast_start.SchemaCheckedOnce)
assert not isinstance(common.jsonschema._module, fast_start.SchemaCheckedOnce)
checked_once = outcomes(common.jsonschema.validate)
print(json.dumps({"stock": stock, "checked_once": checked_once}))
"""


def test_metadata_checked_once_accepts_and_rejects_exactly_as_jsonschema_validate():
    result = subprocess.run([sys.executable, "-c", METADATA_PROBE], capture_output=True, text=True, timeout=300,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout)
    assert found["stock"].count("ok") > 50 and len(set(found["stock"])) > 3, (
        f"the probe must validate Lab 1's cells and reject several broken ones: {found['stock']}")
    assert found["checked_once"] == found["stock"], (
        "checking nbgrader's metadata schema once must accept and reject every cell as jsonschema.validate does, "
        "with the same error")
