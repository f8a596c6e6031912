"""harness: run a lab's instructor notebook in one Python process and try its prepared answers against its tests.

``python -m course.cli.harness LAB OUT_JSON [--variants PATH] [--root ROOT]`` (``tests/lab_harness.py LAB VARIANTS OUT``
is the same). The notebook runs top to bottom at quick scale in a scratch copy of ``source/LAB/`` (so
``from utils import *`` finds the instructor's utils.py). Then, for each prepared answer of ``labs/LAB/variants.py``
(``ALTERNATIVES``, ``HINTS``, ``WRONG``, ``SKIPS`` and ``TAMPERING``), the answer replaces its solution cell, the test cells that
can see it run again, and the reference answer is restored. The JSON result lists, per run and test cell,
``[passed, first line of its first failure, share of its checks' weight that passed]``.

``course check`` and tests/test_labs.py run it in a subprocess (``run_harness``): the notebook's code runs there, never
in the caller, and one result serves both the order of grades (course/cli/check.py) and the tests.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..common.notebooks import grade_id, is_autograded_test, read_notebook
from ..common.paths import REPO_ROOT

KINDS = ("alternative", "wrong", "skip", "tampering")  # the kinds of prepared answer; HINTS run as alternatives
TAMPERING_LABEL = "tampering:"  # a WRONG or SKIPS answer whose label starts so counts as TAMPERING


@dataclass
class Variants:
    """A lab's prepared answers: solution cell grade id -> list of (label, full replacement source)."""

    alternatives: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # correct, written differently
    wrong: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # one plausible mistake each
    skips: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # skip the method the question asks for
    tampering: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # cheat the grader: must earn nothing

    def by_kind(self):
        """(kind, cell, label, source) of every answer, alternatives first."""
        for kind, table in zip(KINDS, (self.alternatives, self.wrong, self.skips, self.tampering)):
            for cell, pairs in table.items():
                for label, source in pairs:
                    yield kind, cell, label, source


def variants_path(lab: str, root: Path = REPO_ROOT) -> Path:
    """Where a lab keeps its prepared answers."""
    return root / "labs" / lab / "variants.py"


def load_variants(path: Path) -> Variants:
    """The prepared answers of a variants module. ``ALTERNATIVES`` hold bare sources (labelled ``alternative N``);
    ``HINTS`` (answers that follow a hint of the lab's text literally) join them, as they must pass everything too;
    ``WRONG``, ``SKIPS`` and ``TAMPERING`` hold (label, source) pairs; an answer of WRONG or SKIPS labelled
    ``"tampering: ..."`` joins ``TAMPERING``. A table the module lacks is empty."""
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    alternatives = {cell: [(f"alternative {n + 1}", source) for n, source in enumerate(sources)]
                    for cell, sources in getattr(module, "ALTERNATIVES", {}).items()}
    for cell, pairs in getattr(module, "HINTS", {}).items():
        alternatives.setdefault(cell, []).extend((f"hint: {label}", source) for label, source in pairs)
    wrong, skips, tampering = ({cell: list(pairs) for cell, pairs in getattr(module, name, {}).items()}
                               for name in ("WRONG", "SKIPS", "TAMPERING"))
    for table in (wrong, skips):  # an answer labelled "tampering: ..." is one, whichever table it was written in
        for cell, pairs in table.items():
            tampering.setdefault(cell, []).extend(pair for pair in pairs if pair[0].startswith(TAMPERING_LABEL))
            pairs[:] = [pair for pair in pairs if not pair[0].startswith(TAMPERING_LABEL)]
    return Variants(alternatives, wrong, skips, {cell: pairs for cell, pairs in tampering.items() if pairs})


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


def run_test_cell(source: str, namespace: dict, name: str, kept: dict) -> tuple[bool, str, float]:
    """Run one autograded test cell as the grader scores it: (passed, first line of its first failure, share of its
    ``checks.check`` weight that passed; 0.0 after an error outside the checks). ``kept`` is the store of
    ``checks.keep_carried`` for this run, as the grader keeps one per submission."""
    contract = sys.modules.get("checks")
    if contract is not None:
        contract.begin_cell(graded=True, kept=kept)
    ok, error = run_cell(source, namespace, name)
    card = contract.end_cell() if contract is not None else None
    if not ok:
        return False, error, 0.0
    if card is None or card.share == 1.0:
        return True, "", 1.0
    return False, card.failures()[0].splitlines()[0][:300], card.share


def run_notebook(lab: str, root: Path, variants: Variants) -> dict:
    """Run ``lab``'s instructor notebook, then each prepared answer in turn, in this process (it changes the
    working folder, ``sys.path`` and the environment: call it in a process of its own)."""
    os.environ["EFFICIENT_AI_SCALE"] = "quick"
    os.environ.setdefault("MPLBACKEND", "Agg")
    source_dir = root / "source" / lab
    nb = read_notebook(source_dir / f"{lab}.ipynb")
    work = Path(tempfile.mkdtemp(prefix=f"harness-{lab}-"))
    shutil.copytree(source_dir, work, dirs_exist_ok=True)
    os.chdir(work)
    sys.path.insert(0, str(work))

    namespace: dict = {"__name__": "__main__", "display": lambda *a, **k: None}
    cells = [c for c in nb.cells if c.cell_type == "code"]
    tests = [(grade_id(c), c.source) for c in cells if is_autograded_test(c)]
    reference = {grade_id(c): c.source for c in cells if grade_id(c)}
    reference_kept: dict = {}  # what the reference's test cells carried forward (checks.keep_carried)
    result: dict = {"reference": {}, "setup_errors": {}, "variants": []}
    for index, cell in enumerate(cells):
        gid = grade_id(cell) or f"code-cell-{index}"
        if is_autograded_test(cell):
            result["reference"][gid] = list(run_test_cell(cell.source, namespace, gid, reference_kept))
            continue
        ok, error = run_cell(cell.source, namespace, gid)
        if not ok:
            result["setup_errors"][gid] = error
    # What the reference run loaded leaves the cyclic collector's walk, as in a grading kernel started ahead
    # (course.grader.guarded_execute.IMPORT_AHEAD): utils.benchmark_memory collects on every call the variants make.
    gc.freeze()
    for kind, cell_id, label, source in variants.by_kind():
        if cell_id not in reference:
            result["variants"].append({"kind": kind, "cell": cell_id, "label": label, "error": f"no cell {cell_id!r}"})
            continue
        ok, error = run_cell(source, namespace, cell_id)
        rerun = set(affected_tests(cell_id, reference, tests))
        # Each answer starts from the reference's carried values, as a submission with only this answer changed
        # would, and what its re-run tests carry never reaches the next answer.
        kept = dict(reference_kept)
        runs = {gid: list(run_test_cell(test_source, namespace, gid, kept)) if gid in rerun else result["reference"][gid]
                for gid, test_source in tests}
        result["variants"].append({"kind": kind, "cell": cell_id, "label": label, "answer_error": error, "tests": runs})
        run_cell(reference[cell_id], namespace, cell_id)
    gc.unfreeze()  # collected at exit as usual (nanobind reports objects it still finds alive as leaks)
    return result


def cell_score(share: float, points: float) -> float:
    """A test cell's recorded score: its points times the share, rounded down to a hundredth, as nbgrader records
    partial credit (``partial_credit_output`` in course/grader/nbgrader_ext.py)."""
    return math.floor(share * points * 100 + 1e-9) / 100


def question_score(tests: dict, question_cells: dict[str, float]) -> float:
    """What one run of the harness (``tests``: test cell -> [passed, failure, share]) earns on the test cells
    ``question_cells`` (grade id -> points) of one question."""
    return round(sum(cell_score(tests[gid][2], points) for gid, points in question_cells.items() if gid in tests), 6)


def run_harness(lab: str, root: Path = REPO_ROOT, path: Path | None = None, timeout_s: float = 1800) -> dict:
    """Run the harness on ``lab`` (prepared answers from ``path``, by default ``labs/LAB/variants.py``) in a Python
    process of its own and return its result.

    Raises:
        RuntimeError: the harness failed (its output's tail says why) or ran past ``timeout_s``.
    """
    with tempfile.TemporaryDirectory(prefix=f"harness-out-{lab}-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "course.cli.harness", lab, str(out), "--root", str(root),
                   "--variants", str(path or variants_path(lab, root))]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"the harness ran past {timeout_s:.0f} s") from exc
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"the harness failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.cli.harness", description=__doc__.splitlines()[0])
    parser.add_argument("lab")
    parser.add_argument("out", type=Path, help="where to write the JSON result")
    parser.add_argument("--variants", type=Path, help="the prepared answers (default: labs/LAB/variants.py)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository (default: this one)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    path = (args.variants or variants_path(args.lab, root)).resolve()
    variants = load_variants(path) if path.exists() else Variants()
    out = args.out.resolve()  # before run_notebook moves to its scratch folder
    try:
        result = run_notebook(args.lab, root, variants)
    except Exception:
        traceback.print_exc()
        return 1
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
