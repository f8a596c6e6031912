"""The fixture lab with a plot question and a measuring cell, and a submission carrying the outputs of the student's
own run (an H100, a measured table, a plot), for tests/test_ta_view.py and tests/test_browser.py.

The lab is tests/fixtures/lab0 plus a locked setup cell that prints the GPU, an ordinary cell that measures ``add``
and prints a table, and Question 1.4: a plot graded by hand (1 point, with a mark scheme). The grader re-runs it
and prints "GPU: none found" and its own timings; the submission shows what the student's run printed.
"""
from __future__ import annotations

import copy
from pathlib import Path

import nbformat
from fixture_lab import FIXTURE, LAB, make_root
from payloads import PNG_BASE64, outputs_notebook

from course.cli import build
from course.common.notebooks import grade_id, make_submission, read_notebook

PLOT_GID = "q1_4_plot"
ANSWER_GID = "q1_3_answer"
SETUP_GID = "setup_device"
STUDENT_GPU = "GPU: NVIDIA H100 80GB HBM3"  # what the student's run printed; the grader prints "GPU: none found"
STUDENT_TABLE_ROW = "100 | 0.4242"  # a row of the student's measured table
PLOT_SCHEME = "the measured table plotted, n on the x axis"  # a line of Question 1.4's mark scheme
ANSWER_SCHEME = "Any reasonable answer."  # lab0's mark scheme of Question 1.3
FORGED_SCORE = "99"  # what the submission shows as a test cell's result: never read, never shown
MEASURE_MARK = "# Time add on a few sizes"
PLOT_CODE = 'import matplotlib.pyplot as plt\n\nplt.plot(list(latency_ms), list(latency_ms.values()), marker="o")\nplt.show()'

PLOT_QUESTION = f'''
# %% nbgrader={{"grade": false, "grade_id": "{SETUP_GID}", "locked": true, "schema_version": 3, "solution": false, "task": false}}
print("GPU: none found")

# %% [markdown]
# #### Question 1.4 (1 point)
# Time `add` and plot the table.

# %%
{MEASURE_MARK} (Question 1.4 plots this table).
import time

latency_ms = {{}}
for n in (1, 10, 100):
    start = time.perf_counter()
    add(n, n)
    latency_ms[n] = (time.perf_counter() - start) * 1e3
print("n | latency_ms")
for n, ms in latency_ms.items():
    print(f"{{n}} | {{ms:.4f}}")

# %% nbgrader={{"grade": true, "grade_id": "{PLOT_GID}", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}}
### BEGIN SOLUTION
# === BEGIN MARK SCHEME ===
# 1 point: {PLOT_SCHEME}, and shown.
# === END MARK SCHEME ===
{PLOT_CODE}
### END SOLUTION
'''


def plot_lab_root(path: Path) -> Path:
    """A repository root holding the fixture lab with the plot question, built."""
    root = make_root(path, FIXTURE.read_text() + PLOT_QUESTION)
    assert build.main([LAB], root) == 0
    return root


def _stream(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def student_outputs(hostile: bool = False) -> dict[str, list]:
    """The outputs of the student's run by cell (a grade id, or ``MEASURE_MARK`` for the measuring cell); with
    ``hostile``, the measuring cell also shows script payloads (tests/payloads.py)."""
    table = _stream(f"n | latency_ms\n1 | 0.0031\n10 | 0.0409\n{STUDENT_TABLE_ROW}\n")
    html_table = nbformat.v4.new_output("display_data", {
        "text/html": f"<table><tr><th>n</th><th>latency_ms</th></tr><tr><td>100</td><td>{STUDENT_TABLE_ROW[6:]}</td></tr></table>",
        "text/plain": "n latency_ms"})
    plot = nbformat.v4.new_output("display_data", {"image/png": PNG_BASE64, "text/plain": "<Figure size 640x480>"})
    forged = nbformat.v4.new_output("execute_result", {"text/plain": FORGED_SCORE}, execution_count=7)
    measured = [table, html_table] + (copy.deepcopy(outputs_notebook().cells[0].outputs) if hostile else [])
    return {SETUP_GID: [_stream(STUDENT_GPU + "\n")], MEASURE_MARK: measured, PLOT_GID: [plot],
            "q1_1_add_tests": [forged, _stream("all checks passed, 3 points\n")]}


def run_submission(root: Path, hostile: bool = False) -> nbformat.NotebookNode:
    """The reference submission of the plot lab, with the outputs of the student's run (``student_outputs``)."""
    source = read_notebook(root / "source" / LAB / f"{LAB}.ipynb")
    return with_student_run(make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"), source), hostile)


def with_student_run(nb: nbformat.NotebookNode, hostile: bool = False) -> nbformat.NotebookNode:
    """``nb``, a submission of the plot lab, given the outputs of the student's run (``student_outputs``)."""
    outputs = student_outputs(hostile)
    for cell in nb.cells:
        if grade_id(cell) == PLOT_GID:  # make_submission keeps a code cell's mark scheme (its delimiters are comments)
            cell.source = PLOT_CODE
        key = MEASURE_MARK if cell.source.startswith(MEASURE_MARK) else grade_id(cell)
        if cell.cell_type == "code" and key in outputs:
            cell.outputs = outputs[key]
            cell.execution_count = 1
    return nb


def in_order(text: str, *parts: str) -> bool:
    """Whether each of ``parts`` shows in ``text``, after the one before it."""
    at = 0
    for part in parts:
        at = text.find(part, at)
        if at < 0:
            return False
        at += len(part)
    return True
