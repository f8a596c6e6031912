"""Every measurement a lab quotes is a committed measurement (issue 52).

The rule, kept small on purpose:

- **Where quotes are read**: a lab's authored text ``labs/labN/labN.py`` (markdown cells, including written answers'
  model answers and mark schemes, and the comments and string literals of code cells), split into paragraphs (a
  blank line, a new list item, a new comment block or a new string ends one).
- **What a quote is**: a number written with a unit of measurement (``ms``, ``µs``/``us``, ``ns``, ``s``, ``GB/s``,
  ``TB/s``, ``TFLOP/s``, ``GFLOP/s``, ``FLOP/byte``, ``GB``, ``MB``, ``x``/``×``, ``%``; a range ``7 to 8 ms`` or
  ``1.4–2.6x`` quotes both ends) in a paragraph that cites a measurement: it names a report (``report``,
  ``reports/``, ``measured_runs.md``) or says ``measured``/``measures``, ``H100``/``H200``, ``cpu scale`` or ``teaching scale``.
- **Where it must appear**: among the numbers of the lab's committed runs: ``reports/*.md`` naming the lab (and the
  reports naming no lab), the outputs of ``reports/**/labN*_executed.ipynb``, and the lab's student reference
  ``labs/labN/measured_runs.md``. A quote of k significant digits is found when one of those numbers, rounded to k
  significant digits, equals it (``6.8 ms`` is found as ``6.82``; ``7 ms`` as anything from 6.5 to 7.5; a whole
  number ending in zeros within 5 %: ``10x`` as 9.5x to 10.5x, ``~990`` as 985 to 995), among the
  numbers of the quote's kind (times, ratios, percentages, rates, FLOP/byte, sizes: a number's kind is the unit
  written after it, or its table's row label, column header or title).
- **Definitions, not measurements**: the datasheet figures of ``utils.GPU_SPECS`` (and the ridge points and GB/s
  they imply) are found too, and ``ALLOWED`` lists the few other numbers a lab may quote with a unit that are
  sizes or definitions, each with its reason.

``python tests/test_quotes.py [--out-dir DIR]`` prints the quotes not found, per lab, and writes them to
``DIR/quotes_labN.txt`` (default ``/tmp``).
"""
from __future__ import annotations

import argparse
import ast
import bisect
import math
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
LABS = sorted((p.name for p in (REPO / "labs").iterdir() if (p / f"{p.name}.py").is_file()), key=lambda n: int(n[3:]))

NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = (r"(?:GB/s|TB/s|TFLOP/s|TFLOPS|GFLOP/s|FLOP/byte|FLOP/B|GiB|GB|MB|ms|µs|μs|us|ns|s(?:econds?)?|%|×|x)"
        r"(?![\w/])")
# A quote: numbers joined as a range ("7 to 8", "1.4–2.6"), then a unit. "x"/"×" followed by a number is a shape
# (64 x 2048), not a ratio.
QUOTE_RE = re.compile(rf"(?<![\w.$^{{/])(?P<numbers>(?:{NUMBER})(?:\s*(?:–|-|to)\s*(?:{NUMBER}))*)\s?"
                      rf"(?P<unit>{UNIT})(?!\s*\d)")
NUMBER_RE = re.compile(rf"(?<![\w.])(?:{NUMBER})(?:e[-+]?\d+)?")
CITES_RE = re.compile(r"\breports?\b|reports/|measured_runs\.md|\bmeasured\b|\bmeasures\b|\bH100\b|\bH200\b|"
                      r"cpu[- ]scale|teaching scale", re.IGNORECASE)
LIST_ITEM_RE = re.compile(r"^\s*(?:[-*+]|\d{1,2}[.)])\s")

# Numbers a lab may quote with a unit that are not measurements: (lab or "*" for every lab, number as written,
# unit) -> why.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("lab1", "215", "FLOP/byte"): "the MLP's intensity from the lab's FLOP and byte formulas, computed",
    ("lab1", "275", "GB"): "the size of the fp32 scores and probabilities at L = 65536, computed from the shapes",
    ("*", "50", "MB"): "the H100's L2 cache (datasheet)",
    ("*", "60", "MB"): "the H200's L2 cache: 62,914,560 bytes, the L2_cache_size the CUDA driver reports there",
    ("lab2", "200", "MB"): "the 10000 x 10000 bf16 intermediate, computed from the shapes",
    ("lab2", "10", "MB"): "the traffic of the reassociated chain, computed from the shapes",
    ("lab2", "300", "TFLOP/s"): "the H200's roof at 63 FLOP/byte: 63 x 4.8 TB/s (datasheet)",
    ("lab2", "50", "ms"): "the designed length of a call of the known-cost function in Question 5.1's test",
    ("lab3", "90", "%"): "the accuracy Question 1.3 asks about, a threshold",
    ("lab2", "33", "MB"): "256 KB of shared memory/L1 per SM x 132 SMs of an H100 or H200 (datasheet)",
    ("lab2", "64", "FLOP/byte"): "the intensity k of the product with k = 64, a formula",
    ("lab2", "5000", "FLOP/byte"): "the ideal intensity of the chain, a formula",
    ("lab2", "78", "x"): "SEQ/KV_HEAD = 10000/128, a ratio of FLOP counts",
    ("lab2", "17.18", "GB"): "4 x batch x S^2 x 2 bytes at S = 16384, computed from the shapes",
    ("lab2", "0.6", "s"): "the designed delay of the known-cost function Question 5.1's test times",
    ("lab3", "2.95", "GB"): "GPT-2 XL's fp16 weights, computed from the shapes",
    ("lab3", "5", "GB"): "the KV cache at (B, N) = (64, 256), computed from the shapes",
}


@dataclass(frozen=True)
class Quote:
    lab: str
    line: int  # 1-based line of labs/labN/labN.py where the paragraph starts
    number: str
    unit: str
    context: str

    def __str__(self) -> str:
        return f"labs/{self.lab}/{self.lab}.py:{self.line}: {self.number} {self.unit}: ...{self.context}..."


def value_of(text: str) -> float:
    return float(text.replace(",", ""))


# ---- the quotes of a lab -----------------------------------------------------------------------------------------

def _paragraphs(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(first line, text) of each paragraph of numbered lines: a blank line or a list item starts a new one."""
    out: list[tuple[int, list[str]]] = []
    fresh = True
    for number, line in lines:
        if not line.strip():
            fresh = True
            continue
        if fresh or LIST_ITEM_RE.match(line):
            out.append((number, []))
        out[-1][1].append(line.strip())
        fresh = False
    return [(start, " ".join(text)) for start, text in out]


def _strings(source: str) -> list[tuple[int, str]]:
    """(line offset, text) of every string literal of a code cell (f-strings with their fields as ``{}``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    inner = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{}"
                                             for part in node.values)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inner:
            out.append((node.lineno, node.value))
    return out


def text_paragraphs(lab: str, root: Path = REPO) -> list[tuple[int, str]]:
    """(line in labs/labN/labN.py, text) of every paragraph of prose the lab shows: markdown, comments, strings."""
    path = root / "labs" / lab / f"{lab}.py"
    raw = path.read_text().splitlines()
    paragraphs: list[tuple[int, str]] = []
    starts = [i for i, line in enumerate(raw) if line.startswith("# %%")] + [len(raw)]
    for begin, end in zip(starts, starts[1:]):
        header, body = raw[begin], list(enumerate(raw[begin + 1:end], start=begin + 2))
        if "[markdown]" in header:
            paragraphs += _paragraphs([(n, line[2:] if line.startswith("# ") else line.lstrip("#"))
                                       for n, line in body])
            continue
        comments, code = [], []
        for n, line in body:
            stripped = line.lstrip()
            if stripped.startswith("#"):
                comments.append((n, stripped.lstrip("#")))
            else:
                if "  # " in line:  # a trailing comment
                    comments.append((n, line.split("  # ", 1)[1]))
                comments.append((n, ""))  # code ends a comment block
                code.append(line)
        paragraphs += _paragraphs(comments)
        first = body[0][0] if body else begin + 1
        paragraphs += [(first + offset - 1, text) for offset, text in _strings("\n".join(line for _, line in body))]
    return paragraphs


def quotes_in(text: str) -> list[tuple[str, str, str]]:
    """(number, unit, context) of every number written with a unit of measurement in ``text``."""
    quotes = []
    for match in QUOTE_RE.finditer(text):
        if match.group("unit") in "x×" and text[match.end() - 2].isspace():
            continue  # "8 x S": a product, not a ratio (ratios are written 1.7x)
        context = text[max(0, match.start() - 60):match.end() + 20]
        quotes += [(number, match.group("unit"), context) for number in re.findall(NUMBER, match.group("numbers"))]
    return quotes


def lab_quotes(lab: str, root: Path = REPO) -> list[Quote]:
    """The measurements a lab quotes (the rule in this module's docstring)."""
    return [Quote(lab, line, number, unit, context) for line, text in text_paragraphs(lab, root)
            if CITES_RE.search(text) for number, unit, context in quotes_in(text)]


# ---- the numbers of the committed runs ---------------------------------------------------------------------------

# What a unit (or a table header naming one) measures, and its factor to the base unit of that kind: a quote is
# compared with committed numbers of its own kind only, in base units (0.05 ms is found as 50 us).
KINDS = (  # first match wins: rates before the times and sizes they contain
    (re.compile(r"tflop/?s|tflops", re.I), "FLOP/s", 1e12),
    (re.compile(r"gflop/s", re.I), "FLOP/s", 1e9),
    (re.compile(r"flop/b|flop_per_byte|intensity|ridge", re.I), "FLOP/byte", 1.0),
    (re.compile(r"tb/s|_tb_s\b", re.I), "B/s", 1e12),
    (re.compile(r"gb/s|_gb_s\b", re.I), "B/s", 1e9),
    (re.compile(r"speedup|slowdown|ratio|/predicted|measured/|(?<![\w.])[x×](?![\w.])", re.I), "x", 1.0),
    (re.compile(r"%|pct|percent|of roof|share", re.I), "%", 1.0),
    (re.compile(r"accuracy|acceptance|alpha", re.I), "%", 100.0),  # a fraction: 0.982 is quoted as 98.2 %
    (re.compile(r"(?<![a-z])(?:ms|_ms)(?![a-z])|ms/", re.I), "s", 1e-3),
    (re.compile(r"(?<![a-z])(?:µs|μs|us|_us)(?![a-z])", re.I), "s", 1e-6),
    (re.compile(r"(?<![a-z])(?:ns|_ns)(?![a-z])", re.I), "s", 1e-9),
    (re.compile(r"(?<![a-z])(?:s|_s|sec|seconds?)(?![a-z])", re.I), "s", 1.0),
    (re.compile(r"(?<![a-z])(?:gib)(?![a-z])", re.I), "B", 2.0 ** 30),
    (re.compile(r"(?<![a-z])(?:gb|_gb)(?![a-z])", re.I), "B", 1e9),
    (re.compile(r"(?<![a-z])(?:mb|_mb)(?![a-z])", re.I), "B", 1e6),
)
TAGGED_RE = re.compile(rf"(?<![\w.])(?P<number>{NUMBER})(?:e[-+]?\d+)?\s?(?P<unit>{UNIT})")


def kind_of(text: str) -> tuple[str, float] | None:
    """(kind, factor to its base unit) of a unit or a header naming one; None when it names none."""
    for pattern, kind, factor in KINDS:
        if pattern.search(text):
            return kind, factor
    return None


def _numbers_with_edges(line: str) -> list[tuple[int, int, float]]:
    return [(m.start(), m.end(), value_of(m.group())) for m in NUMBER_RE.finditer(line)]


def tagged_numbers(text: str) -> list[tuple[str, float]]:
    """(kind, value in base units) of every number of a report or an output that names its unit: written after it
    (``6.82 ms``, ``156.993us``, ``8.9x``, ``80%``), or in a table, by its row's label, its column's header (the
    header text above the column, tables right-aligned as pandas prints them, or a markdown table's header cell) or
    the table's title line."""
    found: list[tuple[str, float]] = []
    lines = text.splitlines()
    words: list[str] = []  # the lines of words above a table, nearest last: its header, then its titles
    pipe_header = None
    for line in lines:
        tagged_spans = []
        for match in TAGGED_RE.finditer(line):
            kind = kind_of(match.group("unit"))
            if kind and not (match.group("unit") in "x×" and line[match.end() - 2].isspace()):
                found.append((kind[0], value_of(match.group("number")) * kind[1]))
                tagged_spans.append((match.start(), match.end()))
        stripped = line.strip()
        if not stripped:
            words, pipe_header = [], None
            continue
        if stripped.startswith("|"):
            cells = [cell.strip() for cell in stripped.strip("|").split("|")]
            if pipe_header is None:
                pipe_header = cells
            elif not set("".join(cells)) <= set("-: "):
                row_kind = kind_of(cells[0]) if cells else None
                for cell, head in zip(cells, pipe_header):
                    kind = row_kind or kind_of(head)
                    if kind:
                        found += [(kind[0], value_of(m) * kind[1]) for m in re.findall(NUMBER, cell)]
            continue
        numbers = [n for n in _numbers_with_edges(line) if not any(a <= n[0] < b for a, b in tagged_spans)]
        last = stripped.split()[-1]
        if not numbers or not re.fullmatch(rf"[-+]?(?:{NUMBER})(?:e[-+]?\d+)?[%x×]?|nan|inf|oom|-|none", last, re.I):
            words.append(line)  # a line of words: the header of what follows
            continue
        label = line[:numbers[0][0]]
        header = words[-1] if words else ""
        previous_end = 0
        for start, end, value in numbers:
            kind = (kind_of(label) if re.search(r"[a-zA-Z]", label) else None) \
                or kind_of(header[previous_end:end]) \
                or next((kind_of(title) for title in reversed(words[:-1]) if kind_of(title)), None)
            if kind:
                found.append((kind[0], value * kind[1]))
            previous_end = end
    return found


def _outputs_text(notebook: Path) -> str:
    nb = nbformat.read(notebook, as_version=4)
    parts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            text = output.get("text", "") if output.get("output_type") == "stream" else \
                output.get("data", {}).get("text/plain", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return "\n\n".join(parts)


def run_files(lab: str, root: Path = REPO) -> list[Path]:
    """The committed records a lab's quotes may come from."""
    reports = root / "reports"
    named = re.compile(r"lab\d+")
    files = [p for p in sorted(reports.glob("*.md")) if lab in named.findall(p.name) or not named.search(p.name)]
    files += sorted(reports.glob(f"**/{lab}_executed.ipynb")) + sorted(reports.glob(f"**/{lab}-*_executed.ipynb"))
    reference = root / "labs" / lab / "measured_runs.md"
    return files + ([reference] if reference.is_file() else [])


def datasheet_numbers(root: Path = REPO) -> list[tuple[str, float]]:
    """(kind, value) of every figure of utils.GPU_SPECS and of the ridge points they imply (read without torch)."""
    tree = ast.parse((root / "utils.py").read_text())
    specs = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "GPU_SPECS" for t in node.targets))
    values = []
    for call in specs.values:
        spec = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        bandwidth = spec["memory_bandwidth_tb_s"]
        values += [("FLOP/s", spec[f"{p}_tflops"] * 1e12) for p in ("fp16", "bf16", "fp32")]
        values += [("FLOP/byte", spec[f"{p}_tflops"] / bandwidth) for p in ("fp16", "bf16", "fp32")]
        values += [("B/s", bandwidth * 1e12), ("B", spec["memory_gb"] * 1e9)]
    return values


@lru_cache(maxsize=None)
def known_numbers(lab: str, root: Path = REPO) -> dict[str, list[float]]:
    """kind -> every committed number of that kind, in base units, sorted."""
    known: dict[str, list[float]] = {}
    values = []
    for path in run_files(lab, root):
        values += tagged_numbers(_outputs_text(path) if path.suffix == ".ipynb" else path.read_text())
    for kind, value in values + datasheet_numbers(root):
        if math.isfinite(value):
            known.setdefault(kind, []).append(value)
    return {kind: sorted(found) for kind, found in known.items()}


def tolerance(text: str) -> float:
    """How far a committed number may lie from a quote and still round to it: half its last digit as written
    (6.82: 0.005), for a whole number ending in zeros at most 5 % of it ("10x" is 9.5x to 10.5x, "~990" 985 to 995)."""
    mantissa = text.replace(",", "")
    if "." in mantissa:
        return 10.0 ** -len(mantissa.split(".")[1]) / 2
    zeros = len(mantissa) - len(mantissa.rstrip("0")) if mantissa.strip("0") else 0
    return max(0.5, min(10.0 ** zeros / 2, 0.05 * float(mantissa)))


def found_among(number: str, unit: str, known: dict[str, list[float]]) -> bool:
    """Whether a committed number of the quote's kind (``known``: kind -> sorted values in base units) rounds to it."""
    kind, factor = kind_of(unit) or ("?", 1.0)
    value, half = value_of(number) * factor, tolerance(number) * factor * (1 + 1e-9)
    values = known.get(kind, [])
    index = bisect.bisect_left(values, value - half)
    return index < len(values) and values[index] <= value + half


def is_found(quote: Quote, root: Path = REPO) -> bool:
    """Whether a quote is allowed or found among its lab's committed numbers."""
    if (quote.lab, quote.number, quote.unit) in ALLOWED or ("*", quote.number, quote.unit) in ALLOWED:
        return True
    return found_among(quote.number, quote.unit, known_numbers(quote.lab, root))


def missing_quotes(lab: str, root: Path = REPO) -> list[Quote]:
    return [quote for quote in lab_quotes(lab, root) if not is_found(quote, root)]


# ---- the tests ---------------------------------------------------------------------------------------------------

def test_rule_finds_quotes_and_rounding():
    """The rule on a small text: what is a quote, what kind a committed number has, and when a quote is found."""
    text = ("On the course's H100 (reports/lab1-h100.md) the cached step took 6.8 ms, 1.5x to 2.81x faster (7–8 ms "
            "eagerly); a 64 x 2048 matrix, 4 x 8 x S^2 FLOPs, d/2 FLOP/byte; 92 % of the roof")
    assert [(n, u) for n, u, _ in quotes_in(text)] == [
        ("6.8", "ms"), ("1.5", "x"), ("2.81", "x"), ("7", "ms"), ("8", "ms"), ("92", "%")]
    report = ("graph 6.82 ms, eager 48.1 ms\n\n"
              " B  N  measured_cache_ms  speedup  of roof\n"
              " 1 32               6.82    2.814      92%\n\n"
              "| part | seconds |\n| --- | --- |\n| Part 1 | 5.3 |\n")
    known: dict[str, list[float]] = {}
    for kind, value in tagged_numbers(report):
        known.setdefault(kind, []).append(round(value, 9))
    assert {kind: sorted(values) for kind, values in known.items()} == {
        "s": [0.00682, 0.00682, 0.0481, 5.3], "x": [2.814], "%": [92.0]}, known
    known = {kind: sorted(values) for kind, values in known.items()}
    assert tolerance("6.8") == 0.05 and tolerance("10") == 0.5 and tolerance("990") == 5
    for number, unit, found in [("6.8", "ms", True), ("6820", "us", True), ("2.81", "x", True), ("2.8", "x", True),
                                ("3", "x", True), ("2.82", "x", False), ("92", "%", True), ("7", "ms", True), ("8", "ms", False),
                                ("5", "s", True), ("6.8", "s", False), ("48", "ms", True), ("92", "x", False)]:
        assert found_among(number, unit, known) == found, (number, unit)


@pytest.mark.parametrize("lab", LABS)
def test_quoted_measurements_are_committed(lab):
    """Every measurement the lab quotes appears in a committed report or run of that lab."""
    missing = missing_quotes(lab)
    assert not missing, (f"{len(missing)} quoted measurement(s) of {lab} appear in no committed run "
                         f"({', '.join(str(p.relative_to(REPO)) for p in run_files(lab))}):\n"
                         + "\n".join(map(str, missing)))


def test_every_allowed_number_is_quoted():
    """An ``ALLOWED`` entry no lab quotes any more is a stale excuse: remove it (or the text lost a quote)."""
    quoted = {(q.lab, q.number, q.unit) for lab in LABS for q in lab_quotes(lab)}
    stale = [key for key in ALLOWED
             if key not in quoted and not (key[0] == "*" and any(k[1:] == key[1:] for k in quoted))]
    assert not stale, f"ALLOWED entries that no lab quotes: {stale}"


@pytest.mark.parametrize("lab", LABS)
def test_student_reference_is_generated_from_the_committed_runs(lab):
    """``labs/labN/measured_runs.md`` is what ``scripts/make_student_reference.py`` writes from the committed runs
    now (regenerate it after committing new runs), it passes the leak check, and build's copies equal it."""
    sys.path.insert(0, str(REPO / "scripts"))
    import make_student_reference

    from course.cli.lint import check_reference_leaks
    from course.common.notebooks import read_notebook

    text = make_student_reference.reference_text(lab)
    path = REPO / "labs" / lab / "measured_runs.md"
    if text is None:
        assert not path.exists(), f"{path} has no committed run to come from"
        return
    assert path.is_file() and path.read_text() == text, (
        f"{path.relative_to(REPO)} is out of date with the committed runs: python scripts/make_student_reference.py "
        f"{lab} && python -m course build {lab}")
    release = REPO / "release" / lab
    shown = "\n".join(p.read_text() for p in sorted(release.glob("*.py")))
    assert check_reference_leaks(lab, read_notebook(REPO / "source" / lab / f"{lab}.ipynb"),
                                 read_notebook(release / f"{lab}.ipynb"), text, shown) == []
    for copy in (REPO / "source" / lab / "measured_runs.md", release / "measured_runs.md"):
        assert copy.is_file() and copy.read_text() == text, f"{copy.relative_to(REPO)}: run python -m course build {lab}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("labs", nargs="*", default=LABS)
    parser.add_argument("--out-dir", default="/tmp")
    args = parser.parse_args()
    for lab in args.labs:
        quotes = lab_quotes(lab)
        missing = missing_quotes(lab)
        lines = [f"# {lab}: {len(missing)} of {len(quotes)} quoted measurements appear in no committed run",
                 f"# searched: {', '.join(str(p.relative_to(REPO)) for p in run_files(lab))} and utils.GPU_SPECS",
                 "# rule: tests/test_quotes.py (docstring)", *map(str, missing)]
        (Path(args.out_dir) / f"quotes_{lab}.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines[:1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
