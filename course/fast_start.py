"""Start-up time of the course's Python processes: three slow steps of nbgrader's, made fast.

1. Skip one optional import that costs about 3 s in each process.

``nbformat`` imports ``jsonschema``, whose format checkers import ``rfc3987_syntax`` when it is installed (it comes
with ``jsonschema[format-nongpl]``, which jupyter-events requires). Version 1.1.0 of that package compiles about 40
Lark grammars at import: 2-3 s of CPU in every process that reads a notebook, which is every ``nbgrader`` command
the course runs, so several seconds of each submission's grading (reports/grading-breakdown-cpu-2core.md). It only
validates the JSON-schema formats ``iri`` and ``iri-reference``, which neither the notebook format nor nbgrader's
files use. Marking it absent before ``jsonschema`` is imported makes jsonschema skip those two checkers, as it does
wherever the package is not installed.

2. Find the gradebook schema's version in this process. Creating a gradebook (every new course, and each
``course grade --workers`` run's private template), nbgrader records the schema version by running ``alembic heads``
in a subprocess: 4-5 s on the 2-core machine, nearly all of it that Python's start and alembic's import. Alembic's API
gives the same head from the same migration scripts in about 0.2 s; where it finds more than one head (nbgrader's
scripts have one), nbgrader's own subprocess answers, as always.

3. Check nbgrader's cell-metadata schema once per process, not once per cell. ``CheckCellMetadata`` validates every
graded cell's ``nbgrader`` metadata with ``jsonschema.validate``, which first checks the schema itself against its
metaschema: 62 ms of each of the four validations of a Lab 1 submission (two when it is autograded, two when a
worker's result is recorded in a SQLite gradebook), 4 ms when the schema is checked once. Cell by cell the outcome is
``jsonschema.validate``'s, the same error included.

``python -m course.fast_start nbgrader ARGS`` runs ``nbgrader ARGS`` with the first two (``course.nbgrader_run`` does);
the course's nbgrader_config.py applies the third to every nbgrader command, plain ones included.
Plain ``nbgrader`` commands keep their usual start-up and behave the same. With ``EFFICIENT_AI_PARENT_PID`` set
(``course.nbgrader_run`` sets it), the process ends when that parent does (``course.processes.die_with_parent``).
"""
from __future__ import annotations

import json
import os
import sys

from .processes import PARENT_ENV, die_with_parent

SLOW_OPTIONAL_MODULES = ("rfc3987_syntax",)


def skip_slow_optional_imports() -> None:
    """Make ``import rfc3987_syntax`` raise ImportError in this process, unless it is already imported."""
    for name in SLOW_OPTIONAL_MODULES:
        sys.modules.setdefault(name, None)


def find_schema_version_in_process() -> None:
    """Make nbgrader's ``get_alembic_version`` ask alembic's API in this process instead of a subprocess."""
    import nbgrader.api as api

    if getattr(api.get_alembic_version, "in_process", False):
        return
    original = api.get_alembic_version

    def get_alembic_version() -> str:
        try:
            from alembic.config import Config
            from alembic.script import ScriptDirectory

            with api._temp_alembic_ini("sqlite:////tmp/gradebook.db") as alembic_ini:  # as nbgrader's own
                heads = ScriptDirectory.from_config(Config(alembic_ini)).get_heads()
        except Exception:  # noqa: BLE001 - nbgrader's own way then answers, error included
            heads = []
        return heads[0] if len(heads) == 1 else original()

    get_alembic_version.in_process = True
    api.get_alembic_version = get_alembic_version


class SchemaCheckedOnce:
    """The ``jsonschema`` module as nbgrader's metadata validator uses it, except that ``validate`` checks each schema
    against its metaschema once (then keeps its validator) instead of at every call."""

    def __init__(self, module):
        self._module = module
        self._validators: dict[str, object] = {}

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    def validate(self, instance, schema, *args, **kwargs) -> None:
        """``jsonschema.validate(instance, schema)``: raises its ``ValidationError`` (the best match) when invalid."""
        if args or kwargs:  # a validator class or its options: as jsonschema does it
            return self._module.validate(instance, schema, *args, **kwargs)
        key = json.dumps(schema, sort_keys=True)
        validator = self._validators.get(key)
        if validator is None:
            kind = self._module.validators.validator_for(schema)
            kind.check_schema(schema)
            validator = self._validators[key] = kind(schema)
        error = self._module.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error


def check_metadata_schema_once() -> None:
    """Make nbgrader's cell-metadata validation check its schema once in this process (``SchemaCheckedOnce``)."""
    import nbgrader.nbgraderformat.common as common

    if not isinstance(common.jsonschema, SchemaCheckedOnce):
        common.jsonschema = SchemaCheckedOnce(common.jsonschema)


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "nbgrader":
        print("usage: python -m course.fast_start nbgrader ARGS", file=sys.stderr)
        return 2
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        die_with_parent(int(parent))
    skip_slow_optional_imports()
    find_schema_version_in_process()
    from nbgrader.apps.nbgraderapp import main as nbgrader_main

    sys.argv = ["nbgrader", *argv[1:]]
    nbgrader_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
