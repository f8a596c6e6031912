"""What ``course grade``'s fork server (``course.cli.nbgrader_run``) imports once, so that every nbgrader process
forked from it starts with nbgrader, nbclient, the course's grading extensions and torch already imported.

Only modules whose import reads nothing of the grading process's own environment, which it is given after the fork:
matplotlib (``MPLBACKEND``) and transformers (``HF_*``) are imported by each process itself. An import that fails
here is left to fail again in the grading process, where its error reaches the TA: the server itself must start.
"""
import importlib

MODULES = (
    "nbgrader.apps.nbgraderapp", "nbgrader.converters", "nbgrader.preprocessors", "nbconvert.exporters", "nbclient",
    "course.grader.nbgrader_child", "course.grader.guarded_execute", "course.grader.boundary", "course.grader.sandbox",
    "course.grader.nbgrader_ext", "course.grader.sanitize", "course.grader.ta_view", "course.grader.lms",
    "course.grader.late", "numpy", "torch",
)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001, S110 - see above
        pass
