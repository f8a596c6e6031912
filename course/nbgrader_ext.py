"""nbgrader preprocessors of our own, named in ``nbgrader_config.py``."""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import is_grade, is_solution

from .notebooks import HIDDEN_BEGIN, HIDDEN_END


def _is_test_cell(cell) -> bool:
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


class DropTestResults(NbGraderPreprocessor):
    """Remove ``execute_result`` outputs from autograded test cells before nbgrader scores them.

    nbgrader reads a number shown as a test cell's result as partial credit, and stops at the first such
    output, even when an assertion error follows it. Our test cells never end in an expression (``check``
    enforces it), so any result there was put there by student code (``get_ipython().displayhook(5)``).
    Without it the cell scores on its errors alone.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if _is_test_cell(cell):
            cell.outputs = [out for out in cell.get("outputs", []) if out.get("output_type") != "execute_result"]
        return cell, resources


class StripHiddenTests(NbGraderPreprocessor):
    """Keep hidden tests out of feedback HTML: their source, and anything the test cell printed.

    A hidden test region becomes a one-line note. A test cell keeps only its error's name and message (our
    assertion messages, written for students), so a student's code cannot print the hidden test source into
    the feedback by inspecting its caller. Instructors who want tests shown set
    ``c.StripHiddenTests.enabled = False``.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if not _is_test_cell(cell):
            return cell, resources
        if HIDDEN_BEGIN in cell.source:
            kept, inside = [], False
            for line in cell.source.splitlines():
                stripped = line.strip()
                if stripped == HIDDEN_BEGIN:
                    inside = True
                    indent = line[: len(line) - len(line.lstrip())]
                    kept.append(f"{indent}# (hidden tests ran here; their source is not shown in feedback)")
                elif stripped == HIDDEN_END:
                    inside = False
                elif not inside:
                    kept.append(line)
            cell.source = "\n".join(kept)
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
                outputs.append(out)
        cell.outputs = outputs
        return cell, resources
