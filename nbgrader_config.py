"""nbgrader settings for Efficient AI Labs (read by every nbgrader command run from this folder).

The gradebook is SQLite in this folder by default; set NBGRADER_DB_URL (e.g. postgresql://...) to use a
shared database instead. Cell and notebook time limits can be raised with EFFICIENT_AI_CELL_TIMEOUT_S, the wait for
a cell's output after its reply with EFFICIENT_AI_OUTPUT_WAIT_S.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.environ.get("EFFICIENT_AI_REPO", _HERE)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds, GetGrades, IgnorePattern, LimitOutput,
    OverwriteCells, OverwriteKernelspec, SaveAutoGrades,
)
from course.nbgrader_ext import (  # noqa: E402
    DropTestResults, GuardedExecute, NeutraliseCellMetadata, StripHiddenTests,
)

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = "efficient-ai"
c.CourseDirectory.root = _HERE
c.CourseDirectory.db_url = os.environ.get("NBGRADER_DB_URL", "sqlite:///" + os.path.join(_HERE, "gradebook.db"))
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "trace*.json"]

# Time limit of one cell while autograding (seconds). Grading runs at quick scale (EFFICIENT_AI_SCALE=quick).
c.Execute.timeout = int(os.environ.get("EFFICIENT_AI_CELL_TIMEOUT_S", "120"))
c.Execute.interrupt_on_timeout = True
# How long nbclient waits for a cell's output to finish arriving after the kernel's reply (seconds; nbclient's default
# is 4). A cell whose output has not arrived by then counts as failed and the submission is partial: on a busy
# machine 4 s is too short for an honest kernel.
c.Execute.iopub_timeout = int(os.environ.get("EFFICIENT_AI_OUTPUT_WAIT_S", "20"))

# A warning on stderr (PyTorch writes many) is not a failed test: errors are recorded as error outputs.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"(?s).*"

# nbgrader's sanitize step with one addition: cell metadata that changes how a cell runs (the skip-execution and
# raises-exception tags, nbgrader flags on a cell whose made-up grade id OverwriteCells removed) is removed, so plain
# `nbgrader autograde` and the formgrader's Autograde button grade a submission as `course grade` does
# (GuardedExecute removes the same again before any cell runs; docs/SECURITY.md).
c.Autograde.sanitize_preprocessors = [
    ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, NeutraliseCellMetadata, CheckCellMetadata,
]

# nbgrader's autograde pipeline with two changes. GuardedExecute runs the notebook with the grading guard, keeps
# the points earned before a dead kernel or the notebook time limit (EFFICIENT_AI_NOTEBOOK_TIMEOUT_S), keeps
# hidden tests out of the kernel's history, and caps the output it keeps (docs/SECURITY.md). DropTestResults runs before scoring: a number that
# student code shows as a test cell's result must not be read as partial credit.
c.Autograde.autograde_preprocessors = [
    GuardedExecute, IgnorePattern, DropTestResults, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata,
]

# Feedback never shows hidden test source, nor what test cells printed.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, StripHiddenTests]

# Every kernel nbgrader starts runs in a bubblewrap sandbox (EFFICIENT_AI_SANDBOX; docs/SECURITY.md).
from course.sandbox import configure_sandbox  # noqa: E402

configure_sandbox(c)
