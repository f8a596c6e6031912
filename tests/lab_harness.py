"""Run a lab's instructor notebook in one Python process and try prepared answers against its tests.

Used by tests/test_labs.py as a subprocess:
``python tests/lab_harness.py LAB VARIANTS_MODULE OUT_JSON``. The notebook runs top to bottom at quick scale in
a scratch copy of ``source/LAB/`` (so ``from utils import *`` finds the instructor's utils.py). Then, for each
prepared answer (``ALTERNATIVES`` and ``WRONG`` in the variants module), the answer replaces its solution cell,
every autograded test cell runs again, and the reference answer is restored. The JSON result lists, per run and
test cell, ``[passed, first line of its first failure, share of its checks' weight that passed]``.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from course.notebooks import grade_id, is_autograded_test, read_notebook  # noqa: E402


def load_variants(path: Path):
    """``ALTERNATIVES`` and ``WRONG`` of a variants module; its ``HINTS`` (answers that follow a hint of the lab's text
    literally) join the alternatives: they must pass everything too."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    alternatives = {cell: list(sources) for cell, sources in getattr(module, "ALTERNATIVES", {}).items()}
    hints = {cell: [(f"hint: {label}", source) for label, source in pairs]
             for cell, pairs in getattr(module, "HINTS", {}).items()}
    return alternatives, getattr(module, "WRONG", {}), hints


@functools.lru_cache(maxsize=None)
def statements(source: str) -> tuple[tuple[str, frozenset[str], bool], ...]:
    """A cell's top-level statements: each one's source, the names it defines (functions, classes, assigned
    variables), and whether it is a definition (``def`` or ``class``, whose body runs only when called). A cell that
    does not parse is one statement defining nothing. Cached: every prepared answer asks again about the same cells."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ((source, frozenset(), False),)
    found = []
    for node in tree.body:
        names: set[str] = set()
        is_definition = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if is_definition:
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        found.append((ast.get_source_segment(source, node) or "", frozenset(names), is_definition))
    return tuple(found)


def affected_tests(cell_id: str, sources: dict[str, str], tests: list[tuple[str, str]]) -> list[str]:
    """Test cells that can see a change to ``cell_id``: they name what it defines, directly or through another
    answer or setup cell that names it. Other test cells keep their reference result and are not re-run.

    A ``def`` or ``class`` that names a changed definition passes the change on to its own name only, so in a cell
    of test helpers only the helpers that reach the change are affected; any other statement that names one may
    change whatever its cell defines (a loop appending to a list), so it passes the change on to all of them. Only
    answer and setup cells pass a change on: a test cell's own names (``_q``, ``_out``) are its scratch values,
    deleted at its end (``del _q, ...``), so a test that reuses the same scratch names does not depend on it.
    """
    import re

    def mentions(text: str, names: set[str]) -> bool:
        return bool(names) and re.search(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b", text) is not None

    test_ids = {gid for gid, _ in tests}
    names = set().union(*(defined for _, defined, _ in statements(sources[cell_id])))
    changed = True
    while changed:
        changed = False
        for gid, source in sources.items():
            if gid == cell_id or gid in test_ids:
                continue
            cell = statements(source)
            everything = set().union(*(defined for _, defined, _ in cell))
            for text, defined, is_definition in cell:
                reached = defined if is_definition else everything
                if reached - names and mentions(text, names):
                    names |= reached
                    changed = True
    return [gid for gid, source in tests if mentions(source, names)]


def run_cell(source: str, namespace: dict, name: str) -> tuple[bool, str]:
    """Execute one cell's code; (passed, first line of the error)."""
    import linecache

    import matplotlib.pyplot as plt

    sink = io.StringIO()
    filename = f"<cell {name}>"
    # Register the source as Jupyter does, so inspect.getsource (which Triton's @jit uses) can read it.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            exec(compile(source, filename, "exec"), namespace)
        return True, ""
    except BaseException as exc:  # noqa: BLE001 - a test cell may raise anything, SystemExit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
        return False, line
    finally:
        plt.close("all")


def run_test_cell(source: str, namespace: dict, name: str) -> tuple[bool, str, float]:
    """Run one autograded test cell as the grader scores it: (passed, first line of its first failure, share of its
    ``checks.check`` weight that passed; 0.0 after an error outside the checks)."""
    contract = sys.modules.get("checks")
    if contract is not None:
        contract.begin_cell(graded=True)
    ok, error = run_cell(source, namespace, name)
    card = contract.end_cell() if contract is not None else None
    if not ok:
        return False, error, 0.0
    if card is None or card.share == 1.0:
        return True, "", 1.0
    return False, card.failures()[0].splitlines()[0][:300], card.share


def main(lab: str, variants_path: str, out_path: str) -> int:
    os.environ["EFFICIENT_AI_SCALE"] = "quick"
    os.environ.setdefault("MPLBACKEND", "Agg")
    source_dir = REPO / "source" / lab
    nb = read_notebook(source_dir / f"{lab}.ipynb")
    alternatives, wrong, hints = load_variants(Path(variants_path))
    work = Path(tempfile.mkdtemp(prefix=f"harness-{lab}-"))
    shutil.copytree(source_dir, work, dirs_exist_ok=True)
    os.chdir(work)
    sys.path.insert(0, str(work))

    namespace: dict = {"__name__": "__main__", "display": lambda *a, **k: None}
    cells = [c for c in nb.cells if c.cell_type == "code"]
    tests = [(grade_id(c), c.source) for c in cells if is_autograded_test(c)]
    reference = {grade_id(c): c.source for c in cells if grade_id(c)}
    result: dict = {"reference": {}, "setup_errors": {}, "variants": []}
    for index, cell in enumerate(cells):
        gid = grade_id(cell) or f"code-cell-{index}"
        if is_autograded_test(cell):
            result["reference"][gid] = list(run_test_cell(cell.source, namespace, gid))
            continue
        ok, error = run_cell(cell.source, namespace, gid)
        if not ok:
            result["setup_errors"][gid] = error
    # What the reference run loaded leaves the cyclic collector's walk, as in a grading kernel started ahead
    # (course.guarded_execute.IMPORT_AHEAD): utils.benchmark_memory collects on every call the variants make.
    gc.freeze()

    def try_answer(kind: str, cell_id: str, label: str, source: str) -> None:
        if cell_id not in reference:
            result["variants"].append({"kind": kind, "cell": cell_id, "label": label, "error": f"no cell {cell_id!r}"})
            return
        ok, error = run_cell(source, namespace, cell_id)
        rerun = set(affected_tests(cell_id, reference, tests))
        runs = {
            gid: list(run_test_cell(test_source, namespace, gid)) if gid in rerun else result["reference"][gid]
            for gid, test_source in tests
        }
        result["variants"].append({"kind": kind, "cell": cell_id, "label": label, "answer_error": error, "tests": runs})
        run_cell(reference[cell_id], namespace, cell_id)

    for cell_id, sources in alternatives.items():
        for number, source in enumerate(sources):
            try_answer("alternative", cell_id, f"alternative {number + 1}", source)
    for cell_id, pairs in hints.items():
        for label, source in pairs:
            try_answer("alternative", cell_id, label, source)
    for cell_id, pairs in wrong.items():
        for label, source in pairs:
            try_answer("wrong", cell_id, label, source)
    gc.unfreeze()  # collected at exit as usual (nanobind reports objects it still finds alive as leaks)
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:4]))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
