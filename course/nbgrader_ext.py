"""nbgrader preprocessors of our own, named in ``nbgrader_config.py``."""
from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor

from .notebooks import HIDDEN_BEGIN, HIDDEN_END


class StripHiddenTests(NbGraderPreprocessor):
    """Replace hidden test regions by a one-line note, so feedback HTML never shows hidden test source.

    nbgrader's feedback shows the autograded notebook, hidden tests included; instructors who want them shown
    set ``c.StripHiddenTests.enabled = False``.
    """

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type == "code" and HIDDEN_BEGIN in cell.source:
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
        return cell, resources
