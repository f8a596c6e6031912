"""nbgrader settings for Efficient AI Labs (read by every nbgrader command run from this folder).

Every setting a TA may change is an option below, with its default; docs/SETTINGS.md lists them in one table. The
gradebook is SQLite in this folder by default; set NBGRADER_DB_URL (e.g. postgresql://...) to use a shared database
instead. A few options can be overridden for one run by an environment variable (a cluster job, CI: EFFICIENT_AI_*,
read by course.grader.settings.apply_environment at the end of this file; docs/SETTINGS.md names them).

This file needs the course tooling (the `course` package: `pip install -e REPO`, which scripts/install.sh runs).
When it cannot be loaded, every nbgrader command stops with an error instead of going on with nbgrader's stock
settings (those would show hidden tests in feedback and grade without the guard, the sandbox or our checks).
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(_HERE, "course")) and _HERE not in sys.path:
    sys.path.insert(0, _HERE)  # the repository itself: its `course` package, installed or not


def _refuse(exc: BaseException) -> None:
    """Stop nbgrader: traitlets only logs an Exception raised by a config file and goes on without it."""
    message = (
        f"nbgrader_config.py in {_HERE} could not load the Efficient AI course settings ({type(exc).__name__}: "
        f"{exc}). Refusing to run nbgrader with its stock settings, which would show hidden tests in feedback and "
        "grade without the course's guard and sandbox. Install the course tooling into this Python environment "
        "(pip install -e PATH_TO_THE_COURSE_REPOSITORY, or bash scripts/install.sh there) and run again."
    )
    print(f"ERROR: {message}", file=sys.stderr)
    raise SystemExit(message)


try:
    from nbconvert.exporters import Exporter
    from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds, GetGrades, IgnorePattern, LimitOutput,
        OverwriteKernelspec, SaveAutoGrades,
    )

    import nbgrader

    from course.grader.late import LatePenalty
    from course.grader.lms import ZIP_COLLECT_PATTERNS, GradebookCsvExport, UploadCollector
    from course.cli.feedback import question_rows
    from course.common.paths import COURSE_ID, TEMPLATES_DIR
    from course.grader.guarded_execute import GuardedExecute
    from course.grader.nbgrader_ext import (
        AwardBonusPoints, DropTestResults, NeutraliseCellMetadata, QuietOverwriteCells, RecoverCellMetadata,
        ShowBonusPoints, StripHiddenTests,
    )
    from course.grader.sanitize import SanitizeNotebook, clean_html, markdown2html
    from course.grader.sandbox import configure_sandbox
    from course.grader.settings import apply_environment
    from course.grader.ta_view import KeepStudentRun, ShowMarkSchemes, StripMarkSchemes
except Exception as exc:  # noqa: BLE001  (any failure to load the course's extensions stops nbgrader)
    _refuse(exc)

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = COURSE_ID
c.CourseDirectory.root = _HERE
c.CourseDirectory.db_url = os.environ.get("NBGRADER_DB_URL", "sqlite:///" + os.path.join(_HERE, "gradebook.db"))
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", "feedback", "trace*.json"]

# Time limit of one cell while autograding (seconds). Grading runs at quick scale (EFFICIENT_AI_SCALE=quick).
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
# How long nbclient waits for a cell's output to finish arriving after the kernel's reply (seconds; nbclient's default
# is 4). A cell whose output has not arrived by then counts as failed and the submission is partial: on a busy
# machine 4 s is too short for an honest kernel.
c.Execute.iopub_timeout = 20
# The whole notebook's time limit (seconds), the grading guard (course/grader/guarded_execute.py, docs/SECURITY.md; off only
# to rule it out when a reference solution loses points) and the output each cell and the notebook keep (bytes).
c.GuardedExecute.notebook_timeout_s = 600.0
c.GuardedExecute.guard = True
c.GuardedExecute.max_cell_output_bytes = 1 << 20
c.GuardedExecute.max_notebook_output_bytes = 16 << 20

# The sandbox of grading kernels (course/grader/sandbox.py, docs/SECURITY.md): "auto" (bubblewrap where it works, else a
# warning), "on" (refuse to grade without it) or "off"; and one kernel's limits.
c.Sandbox.mode = "auto"
c.Sandbox.memory_gb = 8.0
c.Sandbox.scratch_mb = 1024
c.Sandbox.max_processes = 1024

# nbconvert validates the whole notebook after each of the pipeline's preprocessors; validating once, after the last,
# rejects the same invalid notebooks.
if "optimistic_validation" in Exporter.class_trait_names():  # nbconvert 7.3 and newer
    c.Exporter.optimistic_validation = True

# A warning on stderr (PyTorch writes many) is not a failed test: errors are recorded as error outputs.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"(?s).*"

# nbgrader's sanitize step with one addition: cell metadata that changes how a cell runs (the skip-execution and
# raises-exception tags, nbgrader flags on a cell whose made-up grade id OverwriteCells removed) is removed, so plain
# `nbgrader autograde` and the formgrader's Autograde button grade a submission as `course grade` does
# (GuardedExecute removes the same again before any cell runs; docs/SECURITY.md).
c.Autograde.sanitize_preprocessors = [
    ClearOutput, DeduplicateIds, OverwriteKernelspec, RecoverCellMetadata, QuietOverwriteCells, NeutraliseCellMetadata,
    CheckCellMetadata,
]

# nbgrader's autograde pipeline with three changes. GuardedExecute runs the notebook with the grading guard, keeps
# the points earned before a dead kernel or the notebook time limit (GuardedExecute.notebook_timeout_s), keeps
# hidden tests out of the kernel's history, and caps the output it keeps (docs/SECURITY.md). DropTestResults runs before scoring: a number that
# student code shows as a test cell's result must not be read as partial credit. AwardBonusPoints, after
# SaveAutoGrades, records a passed bonus test's points as extra credit (bonus cells have nbgrader points 0, so a lab's
# maximum is its core 100), reading the points from the course's source/ notebook, never from the submission.
c.Autograde.autograde_preprocessors = [
    GuardedExecute, IgnorePattern, DropTestResults, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AwardBonusPoints, AssignLatePenalties, CheckCellMetadata, KeepStudentRun, ShowMarkSchemes, SanitizeNotebook,
]
# The TA grades what the student saw (course/grader/ta_view.py, docs/GRADING.md), after every step that scores: each code cell
# that is not a test shows, below the grader's re-run, the outputs of the student's own notebook in submitted/
# ("the student's run", sanitized, at most these many bytes per cell and per notebook), and each manually graded cell
# is followed by its mark scheme from source/ (the formgrader shows it; feedback removes it: StripMarkSchemes).
c.KeepStudentRun.max_cell_bytes = 1 << 20
c.KeepStudentRun.max_notebook_bytes = 8 << 20

# course measure (docs/GRADING.md): the leaderboard names students by pseudonym unless this is True.
c.Measure.show_names = False
# Extra credit for beating the reference: each measured piece whose time is at most extra_credit_ratio times the
# reference solution's (geometric mean over its shapes, same GPU, same run; every shape correct) earns
# extra_credit_points, recorded as nbgrader extra credit on the piece's first test cell. 0 points: off, and course
# measure writes no grade.
c.Measure.extra_credit_points = 0.0
c.Measure.extra_credit_ratio = 1.0

# Late submissions: a submission whose timestamp.txt is after the lab's due date in the gradebook (nbgrader db
# assignment add LAB --duedate="2025-03-01 23:59 Europe/Paris") loses points by this policy: "none", "zero", or
# "percent_per_day" (LatePenalty.percent_per_day percent of the score per day or part of one; course/grader/late.py), of
# its final score (autograded and manual points: course grade asks the policy again before each report).
# grades.csv, canvas.csv and feedback show the penalty.
c.AssignLatePenalties.plugin_class = LatePenalty
c.LateSubmissionPlugin.penalty_method = "none"
c.LatePenalty.percent_per_day = 10.0

# nbgrader zip_collect LAB: which student and notebook each file of an LMS's download is (course/grader/lms.py). Canvas's
# names; swap in ZIP_COLLECT_PATTERNS["moodle"] or ["blackboard"] for those LMSs. UploadCollector files one upload per
# student and notebook (the newest re-upload), a file inside a student's zip for that student only, and gives an
# upload the LMS marks late a timestamp.txt of the due date + 1 s; downloaded/LAB/collect_report.csv says what it left.
c.FileNameCollectorPlugin.named_regexp = ZIP_COLLECT_PATTERNS["canvas"]
c.ZipCollectApp.collector_plugin = UploadCollector

# nbgrader export: nbgrader's grades.csv of the whole gradebook, no score while an answer waits for a TA and no cell
# that a spreadsheet runs as a formula (course/grader/lms.py).
c.ExportApp.plugin_class = GradebookCsvExport

# Feedback never shows hidden test source, nor what test cells printed besides their failed checks and error message,
# nor the mark schemes autograde put beside the answers.
c.GenerateFeedback.preprocessors = [
    GetGrades, ShowBonusPoints, CSSHTMLHeaderPreprocessor, StripMarkSchemes, StripHiddenTests, SanitizeNotebook,
]

# Nothing a student writes runs script in a browser (course/grader/sanitize.py): SanitizeNotebook, last in autograde,
# makes the autograded notebook safe; every HTML export (the formgrader's page of a submission, feedback) runs it
# again and renders Markdown and HTML through the course's sanitizing filters.
c.HTMLExporter.preprocessors = [SanitizeNotebook]
c.HTMLExporter.sanitize_html = True
c.HTMLExporter.filters = {"markdown2html": markdown2html, "clean_html": clean_html, "question_rows": question_rows}
# Feedback pages open with a table of questions (course/templates/course_feedback), on top of nbgrader's
# feedback template. Set for feedback only: the formgrader renders submissions with its own template.
_FORMGRADER = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
c.GenerateFeedback.HTMLExporter.template_name = "course_feedback"
c.GenerateFeedback.HTMLExporter.extra_template_basedirs = [os.path.join(_FORMGRADER, "templates"), str(TEMPLATES_DIR)]
# What nbgrader sets for feedback (bootstrap's CSS), and its templates folder, where our template finds the
# `feedback/index.html.j2` it extends.
c.GenerateFeedback.HTMLExporter.extra_template_paths = [
    os.path.join(_FORMGRADER, "static", "node_modules", "bootstrap", "dist", "css"), os.path.join(_FORMGRADER, "templates"),
]

# One-run overrides from the environment (EFFICIENT_AI_SANDBOX=on in the cluster recipes, say; docs/SETTINGS.md).
apply_environment(c)

# Checks the sandbox mode once (c.Sandbox: refuses when it is required and bubblewrap cannot run); grading kernels
# start through course.grader.sandbox.SandboxProvisioner (docs/SECURITY.md).
configure_sandbox(c)
