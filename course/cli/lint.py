"""lint: the static rules every lab's notebooks must satisfy (docs/AUTHORING.md).

Each rule returns problems that name the lab, the cell and what is wrong; ``check`` fails on any of them.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import io
import math
import re
import sys
import tempfile
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..common.notebooks import (
    BONUS_POINTS,
    COURSE_METADATA,
    HEADING_RE,
    HIDDEN_BEGIN,
    HIDDEN_END,
    MARK_SCHEME_BEGIN,
    MARK_SCHEME_END,
    SOLUTION_BEGIN,
    SOLUTION_END,
    NotebookError,
    cell_points,
    course_meta,
    find_headings,
    grade_id,
    is_autograded_test,
    is_bonus_cell,
    is_graded,
    is_solution,
    nbgrader_meta,
    question_key,
    question_key_from_heading,
    question_label,
    question_labels,
    question_sort_key,
    read_notebook,
    region_lines,
)
from ..common.paths import REPO_ROOT, STUDENT_REFERENCE, is_cache, release_notebook_path, source_notebook_path
from ..grader.boundary import HELPERS_TAG, global_reads

REQUIRED_KEYS = ("grade", "grade_id", "locked", "schema_version", "solution", "task")
GRADE_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
TABLE_ROW_RE = re.compile(r"^\|\s*\**(?P<kind>Question|Bonus)\s+(?P<number>\d+(?:\.\d+)*)\**\s*\|(?P<rest>.*)\|\s*$")
REGIONS = ((SOLUTION_BEGIN, SOLUTION_END), (HIDDEN_BEGIN, HIDDEN_END), (MARK_SCHEME_BEGIN, MARK_SCHEME_END))
MIN_LEAK_LINE_CHARS = 16  # shorter lines (``return out``) appear in stubs and prose too often to count as leaks
MARKDOWN_HEADING_RE = re.compile(r"^ {0,3}#{1,6}\s+\S")
ORDERED_ITEM_RE = re.compile(r"^ {0,3}(?P<number>\d{1,9})[.)](?: |$)")
CONTRACT_NAMES = {"check", "finish_checks"}  # checks.py's partial-credit names: a test must not shadow them


@dataclass(frozen=True)
class Problem:
    """One broken rule: where it is and what is wrong."""

    lab: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.lab}: {self.where}: {self.message}"


def _where(index: int, cell) -> str:
    gid = grade_id(cell)
    return f"cell {index}" + (f" ({gid})" if gid else "")


def _calls(node, *names: str) -> bool:
    """Whether ``node`` is a call of a plain name among ``names`` (``print(...)``, not ``x.print(...)``)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def _last_expression(tree: ast.Module) -> ast.expr | None:
    """The value of the cell's last statement when that is an expression (what IPython displays)."""
    return tree.body[-1].value if tree.body and isinstance(tree.body[-1], ast.Expr) else None


def _tree(cell) -> ast.Module | None:
    """The cell's syntax tree; None when it does not parse (``check_test_cells`` reports such test cells)."""
    try:
        return ast.parse(cell.source)
    except SyntaxError:
        return None


def check_metadata(lab: str, nb) -> list[Problem]:
    """Full schema-3 nbgrader metadata; unique, well-formed grade ids; points on every graded cell; a bonus cell's
    points in the course metadata (nbgrader points 0), and no other cell's there (``course build`` writes both)."""
    problems, seen = [], {}
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        if not meta:
            continue
        gid, messages = meta.get("grade_id"), []
        if missing := [key for key in REQUIRED_KEYS if key not in meta]:
            messages.append(f"nbgrader metadata lacks {', '.join(missing)} (schema 3 needs all)")
        if meta.get("schema_version") != 3:
            messages.append(f"schema_version is {meta.get('schema_version')!r}, expected 3")
        if gid is not None:
            if not GRADE_ID_RE.match(str(gid)):
                messages.append(f"grade id {gid!r} is not lower-case letters, digits and _")
            if gid in seen:
                messages.append(f"grade id {gid!r} is also used by cell {seen[gid]}")
            seen.setdefault(gid, index)
        if (meta.get("grade") or meta.get("task")) and not cell_points(cell) > 0:
            messages.append("graded cell has no points (points must be > 0)")
        if is_bonus_cell(cell):
            points = float(meta.get("points", 0) or 0)
            if points != 0 or BONUS_POINTS not in course_meta(cell):
                messages.append(f"bonus cell must have nbgrader points 0 and its points in metadata {COURSE_METADATA}."
                                f"{BONUS_POINTS} (has points {points:g}; run python -m course build)")
        elif BONUS_POINTS in course_meta(cell):
            messages.append(f"only bonus cells (grade ids b...) carry {COURSE_METADATA}.{BONUS_POINTS}")
        if is_graded(cell) and question_key(gid) is None:
            messages.append(f"graded cell id {gid!r} names no question (q<N>_<M>_name or b...)")
        problems += [Problem(lab, _where(index, cell), message) for message in messages]
    return problems


def check_points(lab: str, nb) -> list[Problem]:
    """Heading points == metadata points per question; every question has a heading and graded cells."""
    problems, seen, metadata_points = [], {}, {}
    for cell in nb.cells:
        key = question_key(grade_id(cell))
        if is_graded(cell) and key:
            metadata_points[key] = metadata_points.get(key, 0.0) + cell_points(cell)
    shown: dict[str, int] = {}
    for heading in find_headings(nb):
        label, where = heading.label, f"cell {heading.cell_index}"
        got = metadata_points.get(heading.key)
        if label in shown:
            problems.append(Problem(lab, where, f"{label} has a second heading (first in cell {shown[label]})"))
            continue
        shown[label] = heading.cell_index
        if heading.key[0] != label[0].lower():
            problems.append(Problem(lab, where, f"{label}'s heading names the grade ids {heading.key}_*: a "
                                    f"{'bonus' if heading.key[0] == 'b' else 'core'} question's ids"))
        if heading.key in seen:
            problems.append(Problem(lab, where, f"{label} has a second heading (first in cell {seen[heading.key]})"))
            continue
        seen[heading.key] = heading.cell_index
        if got is None:
            problems.append(Problem(lab, where, f"{label} heading has no graded cell (grade ids {heading.key}_...; a "
                                    "renumbered question's heading names its ids: <!-- grade ids q2_7_* -->)"))
        elif got != heading.points:
            problems.append(Problem(lab, where, f"{label} heading says {heading.points} points, its graded cells' "
                                    f"metadata sums to {got:g}"))
    return problems + [
        Problem(lab, "headings", f"graded cells {key}_... have no '#### {question_label(key)} (N points)' heading")
        for key in sorted(set(metadata_points) - set(seen), key=question_sort_key)]


def lab_total_text(nb) -> str:
    """The lab's total from its question headings: ``100 + 20 bonus``, or ``100`` without bonus questions."""
    headings = find_headings(nb)
    core = sum(h.points for h in headings if h.key.startswith("q"))
    bonus = sum(h.points for h in headings if h.key.startswith("b"))
    return f"{core} + {bonus} bonus" if bonus else f"{core}"


def check_points_table(lab: str, nb) -> list[Problem]:
    """The first markdown cell's points table (rows ``| Question 1.1 | ... | 5 |``) lists every question with its
    heading's points, and the right total."""
    first_md = next((cell.source for cell in nb.cells if cell.cell_type == "markdown"), "")
    labels = question_labels(nb)
    keys_shown = {label: key for key, label in labels.items()}  # a renumbered question's row shows its heading's label
    table = {}
    for line in first_md.splitlines():
        if match := TABLE_ROW_RE.match(line.strip()):
            listed = match["rest"].split("|")[-1].strip().strip("*")
            key = keys_shown.get(f"{match['kind']} {match['number']}",
                                 question_key_from_heading(match["kind"], match["number"]))
            table[key] = int(listed) if listed.isdigit() else -1
    if not table:
        return [Problem(lab, "first markdown cell", "no points table (rows like '| Question 1.1 | ... | 5 |')")]
    messages = []
    headings = {h.key: h.points for h in find_headings(nb)}
    for key, points in headings.items():
        if key not in table:
            messages.append(f"{labels[key]} is missing")
        elif table[key] != points:
            messages.append(f"{labels[key]} lists {table[key]} points, its heading says {points}")
    messages += [f"{question_label(key)} is listed but has no heading in the lab"
                 for key in table.keys() - headings.keys()]
    total = lab_total_text(nb)
    if not re.search(r"\*\*\s*" + re.escape(total) + r"\s*\*\*", first_md):
        messages.append(f"total row must read **{total}**")
    return [Problem(lab, "points table", message) for message in messages]


def check_readme_total(lab: str, nb, readme: Path) -> list[Problem]:
    """README's lab table states the lab's total, e.g. ``| Lab 1 | ... | 100 + 20 bonus |``."""
    if not readme.exists():
        return [Problem(lab, "README.md", "missing")]
    number, total = lab[3:], lab_total_text(nb)
    for line in readme.read_text().splitlines():
        if re.match(rf"^\|\s*\[?Lab {number}\b", line):
            if re.search(rf"\|\s*{re.escape(total)}\s*\|", line):
                return []
            return [Problem(lab, "README.md", f"the Lab {number} row must state its total '{total}': {line.strip()}")]
    return [Problem(lab, "README.md", f"no row '| Lab {number} | ... | {total} |' in the labs table")]


def check_test_cells(lab: str, nb) -> list[Problem]:
    """Autograded test cells parse, and do not end in an expression (nbgrader reads a number there as partial
    credit); ``None``, ``print(...)`` and ``finish_checks(...)`` display nothing and are allowed."""
    problems = []
    for index, cell in enumerate(nb.cells):
        if not is_autograded_test(cell):
            continue
        try:
            last = _last_expression(ast.parse(cell.source))
        except SyntaxError as exc:
            problems.append(Problem(lab, _where(index, cell), f"test cell does not parse: {exc.msg} (line {exc.lineno})"))
            continue
        shows_nothing = isinstance(last, ast.Constant) and last.value is None or _calls(last, "print", "finish_checks")
        if last is not None and not shows_nothing:
            problems.append(Problem(lab, _where(index, cell), "test cell ends in an expression; nbgrader would read "
                                    "its value as partial credit (assign it: `_ = ...`)"))
    return problems


def _comparison_problems(tree: ast.Module) -> list[str]:
    """Comparisons a test or helper cell makes by itself instead of through checks.py (kernel_side probes, which run
    beside the student's code and return data, are left alone)."""
    found, in_probe = [], set()
    for node in ast.walk(tree):  # breadth first: a probe is met before anything inside it
        if id(node) in in_probe:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(d, ast.Name) and d.id == "kernel_side" for d in node.decorator_list):
            in_probe |= {id(inner) for inner in ast.walk(node) if inner is not node}
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name == "isclose":
                found.append(f"line {node.lineno}: `{ast.unparse(func)}(...)` compares a number itself: use "
                             "checks.assert_close")
            elif name in ("isinstance", "plain_value"):
                found.append(f"line {node.lineno}: `{name}(...)` checks a type itself: use checks.py's as_*/assert_* "
                             "(every form the question allows, no lying subclasses)")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            is_type = any(_calls(side, "type") for side in sides)
            is_float = any(isinstance(side, ast.Constant) and type(side.value) is float or _calls(side, "float")
                           for side in sides)
            if is_type and any(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) for op in node.ops):
                found.append(f"line {node.lineno}: `{ast.unparse(node)[:60]}` checks a type itself: use checks.py")
            elif is_float and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                found.append(f"line {node.lineno}: `{ast.unparse(node)[:60]}` compares floats with ==: use "
                             "checks.assert_close")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name in CONTRACT_NAMES or re.match(r"^_?check_", node.name)):
            found.append(f"line {node.lineno}: defines `{node.name}`, a lab's own checking helper (or a shadow of "
                         "checks.check): use checks.py's and name local helpers otherwise")
    return found


def check_test_contract(lab: str, nb) -> list[Problem]:
    """Test cells and test-helpers cells compare answers through checks.py only (docs/AUTHORING.md, "The test
    contract"), and a test cell that uses ``check`` blocks ends them with ``finish_checks``."""
    problems = []
    for index, cell in enumerate(nb.cells):
        helpers = cell.cell_type == "code" and HELPERS_TAG in (cell.metadata.get("tags") or ())
        tree = _tree(cell) if is_autograded_test(cell) or helpers else None
        if tree is None:
            continue
        problems += [Problem(lab, _where(index, cell), message) for message in _comparison_problems(tree)]
        uses_checks = any(isinstance(node, ast.With) and any(_calls(item.context_expr, "check") for item in node.items)
                          for node in ast.walk(tree))
        if uses_checks and not _calls(_last_expression(tree), "finish_checks"):
            problems.append(Problem(lab, _where(index, cell), "a test cell with `check` blocks must end with "
                                    "`finish_checks(...)` (else a failed check passes silently in a notebook)"))
    return problems


def _bound_names(body: list[ast.stmt], folder: Path) -> set[str]:
    """Names top-level statements bind (definitions, assignments, imports; ``*`` imports resolved in ``folder``)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.names[0].name == "*":  # ``*`` stands alone in its import
            names |= _star_names(node.module or "", folder)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        else:
            names |= {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)}
    return names


def _star_names(module: str, folder: Path) -> set[str]:
    saved = list(sys.path)
    sys.path.insert(0, str(folder))
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a module lint cannot import binds nothing it can see
        return set()
    finally:
        sys.path[:] = saved
    return set(getattr(mod, "__all__", [n for n in vars(mod) if not n.startswith("_")]))


def check_test_boundary(lab: str, nb, folder: Path = REPO_ROOT) -> list[Problem]:
    """Every name a test cell reads is the grader's (an instructor import, a ``test-helpers`` cell) or the
    student's (bound in a cell students edit): never instructor data kept in the kernel, where student code could
    change it (course/grader/boundary.py)."""
    grader, student, kernel_only, problems = set(), set(), {}, []
    for index, cell in enumerate(nb.cells):
        tree = _tree(cell) if cell.cell_type == "code" else None
        if tree is None:
            continue
        if is_autograded_test(cell):
            reads = global_reads(compile(cell.source, "<test>", "exec")) - grader - set(dir(builtins))
            for name in sorted(reads - student):
                why = "no cell before defines it" if name not in kernel_only else (
                    f"a locked cell ({kernel_only[name]}) defines it in the kernel, where student code can change it: "
                    "define it in a cell tagged test-helpers or in utils.py")
                problems.append(Problem(lab, _where(index, cell), f"the test reads {name!r}, but {why}"))
            continue
        bound = _bound_names(tree.body, folder)
        if not nbgrader_meta(cell).get("locked") or is_solution(cell):
            student |= bound
        elif HELPERS_TAG in (cell.metadata.get("tags") or []):
            grader |= bound
        else:
            imported = _bound_names([n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))], folder)
            grader |= imported
            kernel_only.update({name: _where(index, cell) for name in bound - imported})
    return problems


def check_markers(lab: str, nb) -> list[Problem]:
    """Solution/hidden-test/mark-scheme delimiters come in ordered pairs and sit in the right kind of cell."""
    problems = []
    for index, cell in enumerate(nb.cells):
        lines, messages = [line.strip() for line in cell.source.splitlines()], []
        for begin, end in REGIONS:
            delimiters = [line for line in lines if line in (begin, end)]
            if delimiters != [begin, end] * (len(delimiters) // 2):
                messages.append(f"unbalanced {begin!r} / {end!r}")
        if SOLUTION_BEGIN in lines and not is_solution(cell):
            messages.append("has a solution region but is not a solution cell")
        if HIDDEN_BEGIN in lines and not is_autograded_test(cell):
            messages.append("has hidden tests but is not an autograded test cell")
        if is_solution(cell) and cell.cell_type == "code" and SOLUTION_BEGIN not in lines:
            messages.append(f"code solution cell has no {SOLUTION_BEGIN!r} region")
        problems += [Problem(lab, _where(index, cell), message) for message in messages]
    return problems


def check_question_statements(lab: str, source_nb, release_nb) -> list[Problem]:
    """Every question statement reaches students: the release replaces a solution cell's text with a stub, so a
    heading inside a written-answer cell (typically after a forgotten ``# %% [markdown]`` line) vanishes."""
    problems = []
    for index, cell in enumerate(source_nb.cells):
        if cell.cell_type != "markdown" or not is_solution(cell):
            continue
        for line in filter(MARKDOWN_HEADING_RE.match, cell.source.splitlines()):
            match = HEADING_RE.match(line.strip())
            what = f"{match['kind']} {match['number']}" if match else "a heading"
            problems.append(Problem(lab, _where(index, cell), f"{what} ({line.strip()[:50]!r}) sits inside a solution "
                                    "cell, whose text the release replaces with a stub: start a new markdown cell "
                                    "(`# %% [markdown]`) before it"))
    released = {heading.key for heading in find_headings(release_nb)}
    return problems + [
        Problem(lab, "release", f"{heading.label} has no heading in the release notebook: students do "
                "not see the question")
        for heading in find_headings(source_nb) if heading.key not in released]


def _rendered_list_lines(markdown: str) -> set[int]:
    """Line numbers (0-based) that CommonMark renders inside a list, a code block or an HTML block."""
    from markdown_it import MarkdownIt

    covered: set[int] = set()
    for token in MarkdownIt("commonmark").parse(markdown):
        if token.map and token.type in ("ordered_list_open", "bullet_list_open", "fence", "code_block", "html_block"):
            covered |= set(range(*token.map))
    return covered


def check_numbered_lists(lab: str, nb) -> list[Problem]:
    """An item ``k.`` followed in the same cell by ``k+1.`` renders as a list (CommonMark lets only a list that
    starts at 1 interrupt a paragraph: ``7.`` right after a line of text is running text)."""
    problems = []
    for index, cell in enumerate(nb.cells):
        lines = cell.source.splitlines() if cell.cell_type == "markdown" else []
        items = {row: int(match["number"]) for row, line in enumerate(lines) if (match := ORDERED_ITEM_RE.match(line))}
        followed = [row for row, number in items.items() if number + 1 in items.values()]
        covered = _rendered_list_lines(cell.source) if followed else set()
        problems += [Problem(lab, _where(index, cell), f"the numbered item {lines[row].strip()[:40]!r} renders as "
                             "running text, not as a list (a list that does not start at 1 needs a blank line "
                             "before it)") for row in followed if row not in covered]
    return problems


def _stripped(lines: list[str]) -> list[str]:
    """The non-blank lines, stripped (how leaks are matched)."""
    return [line.strip() for line in lines if line.strip()]


def check_release_leaks(lab: str, source_nb, release_nb) -> list[Problem]:
    """The release holds no delimiter, no hidden test line, no solution line and no model answer."""
    release_text = "\n".join(cell.source for cell in release_nb.cells)
    release_lines = {line.strip() for line in release_text.splitlines()}
    problems = [Problem(lab, "release", f"contains the delimiter {marker!r}")
                for region in REGIONS for marker in region if marker in release_text]
    outside_lines: set[str] = set()
    secret: list[tuple[str, str]] = []
    for cell in source_nb.cells:
        solution, hidden, mark_scheme = (_stripped(region_lines(cell.source, *region)) for region in REGIONS)
        if is_solution(cell) and cell.cell_type == "markdown" and SOLUTION_BEGIN not in cell.source:
            solution = _stripped(cell.source.splitlines())  # a written answer: the whole cell is the model answer
        secret += [(grade_id(cell) or "?", line) for line in hidden + solution]
        outside_lines |= {line.strip() for line in cell.source.splitlines()} - {*solution, *hidden, *mark_scheme}
    return problems + [
        Problem(lab, f"release cell ({gid})", f"shows a line of the solution or hidden tests: {line[:60]!r}")
        for gid, line in secret
        if len(line) >= MIN_LEAK_LINE_CHARS and line in release_lines and line not in outside_lines]


REFERENCE_NUMBER_RE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])|"
                                 r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
MIN_LEAK_DIGITS = 3  # fewer significant digits (0.5, 64, 12.0, 1e-5) say too little to be an answer
MIN_LEAK_INTEGER = 10_000  # smaller integer literals of tests are the shapes and counts of their inputs (333, 4097)


def significant(token: str) -> str:
    """The informative significant digits of a number as written, trailing zeros dropped: "0.9172" -> "9172",
    "1,400" -> "14", "12.0" -> "12", "3.35e12" -> "335"."""
    mantissa = token.replace(",", "").replace("_", "").lower().split("e")[0]
    return mantissa.replace(".", "").strip("0")


def _numbers(text: str) -> list[tuple[str, float]]:
    """(significant digits, value) of every number in ``text`` with at least MIN_LEAK_DIGITS significant digits."""
    found = []
    for token in REFERENCE_NUMBER_RE.findall(text):
        digits = significant(token)
        if len(digits) >= MIN_LEAK_DIGITS:
            found.append((digits, float(token.replace(",", ""))))
    return found


def _literals(lines: list[str]) -> list[tuple[str, float]]:
    """(significant digits, value) of the numeric literals of code (comments and strings left out): floats of at
    least MIN_LEAK_DIGITS significant digits and integers from MIN_LEAK_INTEGER up that are not powers of two (sizes)."""
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(textwrap.dedent("\n".join(lines)) + "\n").readline):
            if token.type != tokenize.NUMBER or token.string[-1] in "jJ" or token.string.lower().startswith("0x"):
                continue
            value, digits = float(token.string.replace("_", "")), significant(token.string)
            is_float = any(c in token.string.lower() for c in ".e")
            power_of_two = not is_float and value >= 1 and int(value) & (int(value) - 1) == 0  # a size: 2**28
            if len(digits) >= MIN_LEAK_DIGITS and (is_float or value >= MIN_LEAK_INTEGER) and not power_of_two:
                found.append((digits, value))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a region that is not whole code: the literals before the error count
    return found


def _same_number(a: tuple[str, float], b: tuple[str, float]) -> bool:
    """Whether two numbers are one value written to different precisions: they differ by at most half the last
    significant digit of the less precise one (0.9172 and 0.917, 3.625 and 3.63; not 0.917 and 9.17, nor 0.9172 and
    0.918)."""
    (digits, value), (_, other) = sorted((a, b), key=lambda item: len(item[0]))
    if not value:
        return not other
    place = math.floor(math.log10(abs(value))) - len(digits) + 1
    return abs(value - other) <= 0.5 * 10.0 ** place * (1 + 1e-9)


def secret_numbers(source_nb, release_nb, shown_text: str = "") -> dict[tuple[str, float], str]:
    """Numbers that only instructors see ((significant digits, value) -> where): the numeric literals of the hidden
    tests and of the solution code of the source notebook (``_literals``: comments, which may quote a measurement,
    left out), less every number a student is shown: in the release notebook (the question's inputs, the public tests' values) and in ``shown_text`` (the
    lab's other files, ``utils.py``'s datasheet figures), compared by significant digits (a test's 3.35e12 is the text's
    3.35 TB/s)."""
    shown = {digits for digits, _ in _numbers(shown_text + "\n".join(cell.source for cell in release_nb.cells))}
    secret: dict[tuple[str, float], str] = {}
    for cell in source_nb.cells:
        regions = [("hidden tests", region_lines(cell.source, HIDDEN_BEGIN, HIDDEN_END))]
        if cell.cell_type == "code":
            regions.append(("solution code", region_lines(cell.source, SOLUTION_BEGIN, SOLUTION_END)))
        for what, lines in regions:
            for number in _literals(lines):
                if number[0] not in shown:
                    secret.setdefault(number, f"{what} of {grade_id(cell) or 'a cell'}")
    return secret


def check_reference_leaks(lab: str, source_nb, release_nb, text: str, shown_text: str = "") -> list[Problem]:
    """A student reference (``measured_runs.md``) holds no answer: no delimiter and no line of a solution, hidden test or
    model answer (``check_release_leaks``), and none of the numbers only the hidden tests and solution code hold
    (``secret_numbers``; ``shown_text``: the lab's other files), at the precision either is written (``_same_number``)."""
    as_notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_raw_cell(text)])
    problems = [Problem(lab, "student reference", p.message) for p in check_release_leaks(lab, source_nb, as_notebook)]
    secret = secret_numbers(source_nb, release_nb, shown_text)
    for number in dict.fromkeys(_numbers(text)):
        match = next((s for s in secret if _same_number(number, s)), None)
        if match:
            problems.append(Problem(lab, "student reference", f"holds {number[1]:g}, a number only the {secret[match]} "
                                    f"hold ({match[1]:g}): an answer leak"))
    return problems


def check_measure_declarations(lab: str, source_nb, release_nb) -> list[Problem]:
    """``course measure``'s declarations (markdown cells tagged ``measure``) hold together: known grade ids of the
    right kind, shapes the piece's kind can make inputs from, positive FLOP and bytes (``measure_spec.problems``);
    and the release keeps only their notes to students (``course build`` strips the fenced data)."""
    from ..common.measure_cells import FENCE_RE, is_measure_cell
    from ..common.measure_spec import problems

    found = [Problem(lab, "measure declaration", message) for message in problems(source_nb)]
    return found + [Problem(lab, f"release cell {index}", "shows a ```measure declaration: run python -m course build")
                    for index, cell in enumerate(release_nb.cells) if is_measure_cell(cell) and FENCE_RE.search(cell.source)]


def check_grade_id_lock(lab: str, nb, lock_path: Path) -> list[Problem]:
    """Every grade id recorded in ``labs/<lab>/grade_ids.lock`` still exists (ids are never renamed)."""
    if not lock_path.exists():
        return [Problem(lab, str(lock_path.name), "missing: run `python -m course build` to record the grade ids")]
    present = {grade_id(cell) for cell in nb.cells if grade_id(cell)}
    locked = [line.strip() for line in lock_path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return [Problem(lab, "grade ids", f"{gid!r} is recorded in {lock_path.name} but gone from the lab: grade ids are "
                    "never renamed or removed after a release") for gid in locked if gid not in present]


def _tree_files(folder: Path) -> dict[Path, bytes]:
    """Relative path -> content of every file under ``folder`` (caches left out); empty when it does not exist."""
    return {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*")
            if path.is_file() and not is_cache(path.relative_to(folder))}


def check_up_to_date(lab: str, root: Path) -> list[Problem]:
    """``source/<lab>/`` and ``release/<lab>/`` equal what ``build`` would write now."""
    from .build import BuildError, build_lab  # build imports nbgrader's runner, which lint needs only here

    problems = []
    with tempfile.TemporaryDirectory(prefix="efficient-ai-lint-") as tmp:
        try:
            build_lab(lab, root, out_root=Path(tmp))
        except BuildError as exc:
            return [Problem(lab, "build", str(exc))]
        for tree in ("source", "release"):
            fresh, committed = _tree_files(Path(tmp, tree, lab)), _tree_files(root / tree / lab)
            stale = sorted(str(rel) for rel in fresh.keys() | committed.keys() if fresh.get(rel) != committed.get(rel))
            if stale:
                problems.append(Problem(lab, tree, f"out of date with labs/ and utils.py ({', '.join(stale[:5])}"
                                        f"{' ...' if len(stale) > 5 else ''}): run `python -m course build {lab}`"))
    return problems


def lint_lab(lab: str, root: Path = REPO_ROOT, check_fresh: bool = True) -> list[Problem]:
    """All lint rules for one lab, on its committed source and release notebooks."""
    try:
        source_nb = read_notebook(source_notebook_path(root, lab))
        release_nb = read_notebook(release_notebook_path(root, lab))
    except NotebookError as exc:
        return [Problem(lab, "notebooks", f"{exc}: run `python -m course build {lab}`")]
    problems = []
    for rule in (check_metadata, check_markers, check_points, check_points_table, check_test_cells,
                 check_test_contract):
        problems += rule(lab, source_nb)
    problems += check_test_boundary(lab, source_nb, root)
    problems += check_readme_total(lab, source_nb, root / "README.md")
    problems += check_grade_id_lock(lab, source_nb, root / "labs" / lab / "grade_ids.lock")
    problems += check_release_leaks(lab, source_nb, release_nb)
    problems += check_measure_declarations(lab, source_nb, release_nb)
    reference = release_notebook_path(root, lab).parent / STUDENT_REFERENCE
    if reference.is_file():
        shown = "\n".join(path.read_text() for path in sorted(reference.parent.glob("*.py")))
        problems += check_reference_leaks(lab, source_nb, release_nb, reference.read_text(), shown)
    problems += check_question_statements(lab, source_nb, release_nb)
    problems += check_numbered_lists(lab, source_nb)
    if check_fresh:
        problems += check_up_to_date(lab, root)
    return problems
