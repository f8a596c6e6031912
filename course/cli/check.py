"""check: the instructor's pre-release gate for a lab: ``lint`` passes, the reference solution (the release answered
from the source) earns every autograded point, the blank release earns zero, and the prepared answers of
``labs/LAB/variants.py`` keep the order of grades (docs/AUTHORING.md): an answer that skips the method a question
prescribes earns at most a quarter of it and less than any answer with one mistake. Prints the per-question table.
"""
from __future__ import annotations

import ast
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..common.notebooks import (
    cell_points,
    grade_id,
    is_autograded_test,
    make_submission,
    question_key,
    question_label,
    question_labels,
    question_sort_key,
    read_notebook,
    write_notebook,
)
from ..common.outcome import Outcome
from ..common.paths import REPO_ROOT, release_notebook_path, source_notebook_path
from ..common.scores import SubmissionScores
from .grade import grade_lab
from .harness import question_score, run_harness, variants_path
from .lint import Problem, lint_lab
from .nbgrader_run import make_course_dir
from .report import question_scores

REFERENCE, BLANK = "reference", "blank"
SKIP_CAP = 0.25
"""The most an answer that skips the prescribed method may earn, as a share of the question's points: the rule of
docs/AUTHORING.md, which ``checks.SKIPPED_METHOD_SHARE`` implements in every test cell (tests/test_checks.py keeps
the two equal; checks.py is the lab's file, never imported by the course tooling)."""


def grade_reference_and_blank(lab: str, root: Path, workdir: Path) -> tuple[dict[str, Outcome], dict[str, SubmissionScores]]:
    """Autograde the reference solution and the blank release of ``lab`` in a scratch course ``workdir``."""
    course = make_course_dir(workdir, [lab], root)
    source_nb = read_notebook(source_notebook_path(root, lab))
    release_nb = read_notebook(release_notebook_path(root, lab))
    write_notebook(make_submission(release_nb, source_nb), course / "submitted" / REFERENCE / lab / f"{lab}.ipynb")
    write_notebook(release_nb, course / "submitted" / BLANK / lab / f"{lab}.ipynb")
    return grade_lab(course, lab, [REFERENCE, BLANK], out_dir=course / "grading", progress=False)


def grading_problems(lab: str, outcomes: dict[str, Outcome], scores: dict[str, SubmissionScores]) -> list[Problem]:
    """Reference: every autograded cell full marks. Blank: every autograded cell zero."""
    problems = []
    for student, failure in ((REFERENCE, "the reference solution fails this test"),
                             (BLANK, "this test passes without an answer")):
        if outcomes[student].status != "ok":
            problems.append(Problem(lab, f"{student} submission", f"autograde failed: {outcomes[student].reason}"))
        if student not in scores:
            problems.append(Problem(lab, f"{student} submission", "no scores in the gradebook"))
            continue
        for cell in scores[student].cells.values():
            expected = cell.max_score if student == REFERENCE else 0
            if cell.autograded and cell.score != expected:
                problems.append(Problem(lab, f"{student} ({cell.grade_id})",
                                        f"earned {cell.score:g} of {cell.max_score:g}: {failure}"))
    return problems


def check_blocks(source: str) -> list[tuple[str, float, bool]]:
    """(name, weight, method) of each ``with check(name, weight=w, method=m):`` block of a test cell's source, in
    order (a source that does not parse has none)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.With, ast.AsyncWith)):
            continue
        for item in node.items:
            call = item.context_expr
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "check":
                weight = next((k.value for k in call.keywords if k.arg == "weight"),
                              call.args[1] if len(call.args) > 1 else ast.Constant(1))
                method = next((k.value for k in call.keywords if k.arg == "method"),
                              call.args[2] if len(call.args) > 2 else ast.Constant(False))
                found.append((ast.literal_eval(call.args[0]), float(ast.literal_eval(weight)),
                              bool(ast.literal_eval(method))))
    return found


@dataclass
class QuestionOrder:
    """What the prepared answers of one autograded question earn on it (harness scores, quick scale)."""

    points: float  # the question's autograded points
    method: bool = False  # one of its test cells has a check(..., method=True) block
    skips: dict[str, float] = field(default_factory=dict)  # label of each answer in SKIPS -> its score
    mistakes: dict[str, float] = field(default_factory=dict)  # label of each answer in WRONG -> its score
    tampering: dict[str, float] = field(default_factory=dict)  # label of each answer in TAMPERING -> its score


def order_of_grades(source_nb, harness: dict) -> dict[str, QuestionOrder]:
    """Per question key: its points, whether it prescribes a method, and what each skip and each one-mistake answer
    of the harness result ``harness`` (course/cli/harness.py) earns on that question's test cells."""
    cells: dict[str, dict[str, float]] = {}  # question -> test cell -> points
    orders: dict[str, QuestionOrder] = {}
    for cell in filter(is_autograded_test, source_nb.cells):
        key = question_key(grade_id(cell)) or grade_id(cell)
        cells.setdefault(key, {})[grade_id(cell)] = cell_points(cell)
        order = orders.setdefault(key, QuestionOrder(0.0))
        order.points += cell_points(cell)
        order.method = order.method or any(method for *_, method in check_blocks(cell.source))
    for run in harness["variants"]:
        key = question_key(run["cell"])
        if run["kind"] not in ("skip", "wrong", "tampering") or "tests" not in run or key not in orders:
            continue
        table = {"skip": orders[key].skips, "wrong": orders[key].mistakes, "tampering": orders[key].tampering}
        table[run["kind"]][run["label"]] = question_score(run["tests"], cells[key])
    return orders


def skip_problem(label: str, score: float, order: QuestionOrder) -> str | None:
    """Why one skip answer breaks the order of grades of its question, in one line; None when it keeps it."""
    cap = SKIP_CAP * order.points
    reasons = []
    if score > cap + 1e-9:
        reasons.append(f"more than a quarter ({cap:g}; a check(..., method=True) block must catch it)")
    above = sorted((lower, mistake) for mistake, lower in order.mistakes.items() if score >= lower - 1e-9)
    if above:
        shown = ", ".join(f"{mistake!r} ({lower:g})" for lower, mistake in above)
        reasons.append(f"not less than the one-mistake answer{'s' if len(above) > 1 else ''} {shown}"
                       + (" (a one-mistake answer that earns nothing leaves no room below it)" if above[0][0] == 0 else ""))
    return f"the skip {label!r} earns {score:g} of {order.points:g}: " + "; ".join(reasons) if reasons else None


def order_problems(lab: str, orders: dict[str, QuestionOrder], harness: dict) -> list[Problem]:
    """The broken rules of the order of grades: a question that prescribes a method has a skip and a one-mistake
    answer; every skip earns at most ``SKIP_CAP`` of its question and less than every one-mistake answer of it; an
    answer that tampers with the grader (``TAMPERING``) earns at most ``SKIP_CAP`` from the tests alone (the harness
    runs no grading guard, which zeroes it: the red team's tests grade such answers for real). A prepared answer for
    a cell the lab does not have is reported too (the harness could not try it)."""
    problems = [Problem(lab, f"labs/{lab}/variants.py", f"the {run['kind']} answer {run['label']!r} replaces cell "
                        f"{run['cell']!r}, which the lab does not have") for run in harness["variants"] if "error" in run]
    for key in sorted(orders, key=question_sort_key):
        order, where = orders[key], f"{question_label(key)}, order of grades"
        if order.method:
            for table, name, what in ((order.skips, "SKIPS", "that skips the method it prescribes"),
                                      (order.mistakes, "WRONG", "with one mistake")):
                if not table:
                    problems.append(Problem(lab, where, f"it prescribes a method (check(..., method=True)) but "
                                            f"labs/{lab}/variants.py has no answer in {name} {what}"))
        for label, score in order.skips.items():
            found = skip_problem(label, score, order)
            if found:
                problems.append(Problem(lab, where, found))
        problems += [Problem(lab, where, f"the tampering answer {label!r} earns {score:g} of {order.points:g}: more "
                             f"than a quarter ({SKIP_CAP * order.points:g}) from the tests alone")
                     for label, score in order.tampering.items() if score > SKIP_CAP * order.points + 1e-9]
    return problems


def _points(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def question_table(scores: dict[str, SubmissionScores], orders: dict[str, QuestionOrder] | None = None,
                   labels: dict[str, str] | None = None) -> str:
    """Per question: points, of which autograded, and the autograded points of the reference and the blank; with
    ``orders``, also the most a skip answer earns and the least a one-mistake answer earns (``-``: none). ``labels``:
    question key -> the label its heading shows (``question_labels``; a renumbered question's differs from its ids)."""
    ref = question_scores(scores[REFERENCE]) if REFERENCE in scores else {}
    blank = question_scores(scores[BLANK]) if BLANK in scores else {}
    header = f"{'question':<16}{'points':>7}{'autograded':>11}{'reference':>10}{'blank':>7}"
    lines = [header + (f"{'skip':>7}{'mistake':>9}" if orders is not None else "")]
    for key in sorted(set(ref) | set(orders or {}), key=question_sort_key):
        q, order = ref.get(key), (orders or {}).get(key)
        auto_max = q.auto_max if q else order.points
        auto = (lambda v: _points(v) if auto_max else "-")  # noqa: E731 - a question without autograded points
        points = _points(q.auto_max + q.manual_max if q else None)
        label = (labels or {}).get(key) or question_label(key)
        line = (f"{label:<16}{points:>7}{auto(auto_max):>11}{auto(q.auto_score if q else None):>10}"
                f"{auto(blank[key].auto_score if key in blank else None):>7}")
        if orders is not None:
            skip = max(order.skips.values(), default=None) if order else None
            mistake = min(order.mistakes.values(), default=None) if order else None
            line += f"{_points(skip):>7}{_points(mistake):>9}"
        lines.append(line)
    if orders is not None:
        lines.append("skip: the most an answer in SKIPS earns; mistake: the least an answer in WRONG earns "
                     "(course/cli/harness.py, quick scale)")
    return "\n".join(lines)


def check_order(lab: str, root: Path, harness: dict | None) -> tuple[list[Problem], dict[str, QuestionOrder] | None]:
    """The order of grades of ``lab``'s prepared answers: ``harness`` is their result (course/cli/harness.py); None runs
    the harness now. A lab without ``labs/LAB/variants.py`` is not checked (and says so)."""
    if not variants_path(lab, root).exists():
        print(f"\n{lab}: no labs/{lab}/variants.py: the order of grades is not checked")
        return [], None
    if harness is None:
        print(f"\n{lab}: trying the prepared answers of labs/{lab}/variants.py (a few minutes)")
        started = time.monotonic()
        try:
            harness = run_harness(lab, root)
        except RuntimeError as exc:
            return [Problem(lab, "prepared answers", str(exc))], None
        print(f"{lab}: prepared answers tried in {time.monotonic() - started:.0f} s")
    orders = order_of_grades(read_notebook(source_notebook_path(root, lab)), harness)
    return order_problems(lab, orders, harness), orders


def check_lab(lab: str, root: Path = REPO_ROOT, execute: bool = True, harness: dict | None = None) -> list[Problem]:
    """Run every check of one lab; print its table; return the problems found.

    Args:
        lab: the lab (``lab1``).
        root: the repository.
        execute: autograde the reference and the blank release, and (without ``harness``) run the harness of
            prepared answers; False: lint only.
        harness: the harness result of this lab's prepared answers, already computed (tests/test_labs.py runs it
            once for all its tests): the order of grades is checked on it, even without ``execute``.
    """
    problems = lint_lab(lab, root)
    if any(p.where == "notebooks" for p in problems):
        return problems  # nothing to execute
    scores: dict[str, SubmissionScores] = {}
    if execute:
        with tempfile.TemporaryDirectory(prefix=f"efficient-ai-check-{lab}-") as tmp:
            try:
                outcomes, scores = grade_reference_and_blank(lab, root, Path(tmp))
            except RuntimeError as exc:
                problems.append(Problem(lab, "gradebook", str(exc)))
            else:
                problems += grading_problems(lab, outcomes, scores)
                print(f"\n{lab}: autograde of the reference solution and of the blank release "
                      f"({outcomes[REFERENCE].seconds:.0f} s and {outcomes[BLANK].seconds:.0f} s)")
    orders = None
    if execute or harness is not None:
        found, orders = check_order(lab, root, harness)
        problems += found
    if scores or orders:
        print(question_table(scores, orders, question_labels(read_notebook(source_notebook_path(root, lab)))))
    return problems


def main(labs: list[str], root: Path = REPO_ROOT, execute: bool = True) -> int:
    failed = False
    for lab in labs:
        problems = check_lab(lab, root, execute)
        failed = failed or bool(problems)
        print(f"check {lab}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  {problem}")
    return 1 if failed else 0
