"""Every lab: the pre-release gate, prepared answers against the hidden tests, and grading through nbgrader.

- ``check``: lint, reference solution full autograded marks, blank release zero, and the order of grades on the
  prepared answers (a skip earns at most a quarter and less than any one-mistake answer), from the one harness run
  the other tests use.
- Prepared answers (``labs/<lab>/variants.py``, tried by course/cli/harness.py): each correct answer written differently
  from the reference passes every test; each plausible wrong answer, and each answer that skips the prescribed
  method, fails its own question's tests and nothing else.
- A mixed submission (alternatives on every other autograded question, wrong answers on the rest) earns exactly
  the expected autograded score through ``nbgrader autograde``.
- The demo round earns its exact expected scores.
"""
from __future__ import annotations

import importlib.util
import math
import re

import pytest

from course.cli import check, demo
from course.cli.grade import grade_lab
from course.cli.harness import load_variants, run_harness, variants_path
from course.cli.nbgrader_run import make_course_dir
from course.common.notebooks import (
    autograded_points_by_cell,
    autograded_points_by_question,
    find_headings,
    grade_id,
    is_autograded_test,
    is_bonus_id,
    make_submission,
    question_key,
    question_sort_key,
    read_notebook,
    replace_cell_source,
    write_notebook,
)
from course.common.paths import REPO_ROOT, discover_labs
from course.grader.nbgrader_ext import RECORDS_CALLS
from course.grader.scan import recording_bypass_flags

LABS = discover_labs(REPO_ROOT)
VARIANT_LABS = [lab for lab in LABS if variants_path(lab).exists()]


def variants(lab: str):
    return load_variants(variants_path(lab))


def source_nb(lab: str):
    return read_notebook(REPO_ROOT / "source" / lab / f"{lab}.ipynb")


DEMO_LAB = "lab1"  # the lab `course demo` grades


def test_every_lab_has_prepared_answers():
    assert VARIANT_LABS == LABS, "every lab keeps its prepared answers in labs/<lab>/variants.py"


@pytest.fixture(scope="module", params=VARIANT_LABS)
def harness_result(request):
    """One run of the harness per lab (a few minutes), shared by course check's order of grades and the tests below."""
    return request.param, run_harness(request.param)


def test_check_passes(harness_result):
    # The demo (test_demo_round_exact_scores) autogrades this lab's reference and blank release through the same
    # grade_lab, and requires exactly the full and the zero autograded total, which holds only when every test cell
    # of the reference earns its points and none of the blank's does: grading them a second time here would add two
    # full Lab 1 gradings and test nothing more. check's lint and its order of grades still run here, the latter on
    # this module's harness result (check would otherwise run the harness a second time).
    lab, result = harness_result
    problems = check.check_lab(lab, REPO_ROOT, execute=lab != DEMO_LAB, harness=result)
    assert problems == [], "check must pass:\n" + "\n".join(map(str, problems))


def test_reference_runs_cleanly_in_one_process(harness_result):
    lab, result = harness_result
    failing = {gid: err for gid, (ok, err, _) in result["reference"].items() if not ok}
    assert failing == {}, f"{lab}: the reference fails these tests when run top to bottom: {failing}"
    assert result["setup_errors"] == {}, f"{lab}: cells that raise at quick scale: {result['setup_errors']}"


def test_every_autograded_question_has_prepared_answers(harness_result):
    lab, _ = harness_result
    prepared = variants(lab)
    questions = set(autograded_points_by_question(source_nb(lab)))
    covered_alt = {question_key(cell) for cell in prepared.alternatives}
    covered_wrong = {question_key(cell) for cell in prepared.wrong}
    assert questions - covered_alt == set(), f"{lab}: questions without a correct alternative answer"
    assert questions - covered_wrong == set(), f"{lab}: questions without a plausible wrong answer"


CODE_HINT_RE = re.compile(r"\b(?:hint|tip)s?\b\s*:[^\n]*`", re.IGNORECASE)


def code_hints_by_question(nb) -> dict[str, list[str]]:
    """Question key -> the lines of its text that give a code hint ("Tip: ... `code`", "(Hint: ... `code`"): the
    markdown cells from its heading to the next heading."""
    hints: dict[str, list[str]] = {}
    heading_at = {h.cell_index: h.key for h in find_headings(nb)}
    current = None
    for index, cell in enumerate(nb.cells):
        current = heading_at.get(index, current)
        if current is None or cell.cell_type != "markdown":
            continue
        hints.setdefault(current, []).extend(m.group(0) for m in CODE_HINT_RE.finditer(cell.source))
    return {key: lines for key, lines in hints.items() if lines}


@pytest.mark.parametrize("lab", VARIANT_LABS)
def test_every_code_hint_is_followed_by_a_prepared_answer(lab):
    # A hint students follow literally must pass the hidden tests: each question whose text gives a code hint has an
    # answer in HINTS that follows it, which the harness runs like an alternative (it must pass everything).
    spec = importlib.util.spec_from_file_location(f"{lab}_variants_hints", variants_path(lab))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    covered = {question_key(cell) for cell in getattr(module, "HINTS", {})}
    autograded = set(autograded_points_by_question(source_nb(lab)))
    missing = {key: lines for key, lines in code_hints_by_question(source_nb(lab)).items()
               if key in autograded and key not in covered}
    assert missing == {}, f"{lab}: code hints with no answer in HINTS that follows them literally: {missing}"


def test_alternative_answers_pass_everything(harness_result):
    lab, result = harness_result
    bad = []
    for run in result["variants"]:
        if run["kind"] != "alternative":
            continue
        assert "tests" in run, run
        failing = {gid: err for gid, (ok, err, _) in run["tests"].items() if not ok}
        if run["answer_error"] or failing:
            bad.append(f"{run['cell']} {run['label']}: {run['answer_error'] or failing}")
    assert bad == [], f"{lab}: correct answers written differently are rejected:\n" + "\n".join(bad)


def test_wrong_skipping_and_tampering_answers_fail_their_question_only(harness_result):
    lab, result = harness_result
    bad = []
    for run in result["variants"]:
        if run["kind"] not in ("wrong", "skip", "tampering"):
            continue
        assert "tests" in run, run
        question = question_key(run["cell"])
        own = {gid for gid in run["tests"] if question_key(gid) == question}
        failing = {gid for gid, (ok, _, _) in run["tests"].items() if not ok}
        if not own or not failing or not failing <= own:
            bad.append(f"{run['kind']} {run['cell']} [{run['label']}]: failed {sorted(failing)}, expected some of "
                       f"{sorted(own)} and nothing else")
    assert bad == [], (f"{lab}: wrong, skipping and tampering answers must lose points on their own question's tests only:\n"
                       + "\n".join(bad))


def mixed_submission(lab: str, harness: dict):
    """Alternatives on the 1st, 3rd, ... autograded question, wrong answers on the others; the expected score, with
    the partial credit each wrong answer earned in the harness (``harness``: its JSON result).

    The harness tries one answer at a time; the grader also applies a rule to the whole notebook that no single
    answer shows: when the static scan finds code that can switch off the recording of torch calls (a wrong answer
    that tampers, Lab 2's B4.4 say), every test cell that records calls scores zero (docs/SECURITY.md, static scan),
    the alternatives' included."""
    prepared = variants(lab)
    alternatives, wrong = prepared.alternatives, prepared.wrong
    src = source_nb(lab)
    release = read_notebook(REPO_ROOT / "release" / lab / f"{lab}.ipynb")
    nb = make_submission(release, src)
    points = autograded_points_by_question(src)
    cell_points = {gid: p for gid, p in autograded_points_by_cell(src).items()}
    runs = {(run["cell"], run["label"]): run for run in harness["variants"]}
    per_cell: dict[str, float] = {}
    # A question whose tests accept values carried forward from earlier answers (checks.carried) scores differently
    # next to other wrong answers than the harness measured it alone: it always gets a right answer here.
    carries = {question_key(grade_id(cell)) for cell in src.cells
               if is_autograded_test(cell) and "carried(" in cell.source}
    for position, question in enumerate(sorted(points, key=question_sort_key)):
        if position % 2 == 0 or question in carries:
            per_cell.update({gid: p for gid, p in cell_points.items() if question_key(gid) == question})
            chosen = {cell: pairs[0][1] for cell, pairs in alternatives.items() if question_key(cell) == question}
        else:
            # One wrong answer per question, in its first solution cell that has one: the harness measured each wrong
            # answer alone, so two wrong cells of one question (Lab 3's cache and decode step) would not add up.
            cell = next((cell for cell in wrong if question_key(cell) == question), None)
            chosen = {} if cell is None else {cell: wrong[cell][0][1]}
            if cell is not None:
                for gid, (_, _, share) in runs[(cell, wrong[cell][0][0])]["tests"].items():
                    if question_key(gid) == question:
                        per_cell[gid] = per_cell.get(gid, 0.0) + math.floor(share * cell_points[gid] * 100 + 1e-9) / 100
        for cell, source in chosen.items():
            nb = replace_cell_source(nb, cell, source)
    if recording_bypass_flags(nb):
        for cell in src.cells:
            if is_autograded_test(cell) and RECORDS_CALLS in cell.source:
                per_cell[grade_id(cell)] = 0.0
    return nb, round(sum(per_cell.values()), 6)


def test_mixed_submission_scores_exactly_through_nbgrader(harness_result, tmp_path):
    lab, harness = harness_result
    nb, expected = mixed_submission(lab, harness)
    course = make_course_dir(tmp_path / "course", [lab], REPO_ROOT)
    write_notebook(nb, course / "submitted" / "mixed" / lab / f"{lab}.ipynb")
    outcomes, scores = grade_lab(course, lab, ["mixed"], progress=False)
    assert outcomes["mixed"].status == "ok", outcomes["mixed"].reason
    got = scores["mixed"].autograded_score()
    per_cell = {g: c.score for g, c in scores["mixed"].cells.items() if c.autograded}
    assert round(got, 6) == expected, f"{lab}: mixed submission earned {got}, expected {expected}; per cell {per_cell}"


@pytest.mark.skipif(DEMO_LAB not in LABS, reason="the demo grades Lab 1")
def test_demo_round_exact_scores(tmp_path, capsys):
    status = demo.main(DEMO_LAB, REPO_ROOT, course=tmp_path / "demo")
    out = capsys.readouterr().out
    assert status == 0, out
    src = source_nb(DEMO_LAB)
    points = autograded_points_by_question(src)
    core = sum(p for q, p in points.items() if not is_bonus_id(q))  # the maximum; bonus points come on top
    _, answered = demo.partial_answer_ids(src)
    partial = sum(p for q, p in points.items() if q in answered and not is_bonus_id(q))
    partial_bonus = sum(p for q, p in points.items() if q in answered and is_bonus_id(q))
    bonus = sum(points.values()) - core
    assert 0 < partial < core
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("demo-")}
    expected = {"demo-reference": f"{core:g}/{core:g} + {bonus:g} bonus",
                "demo-partial": f"{partial:g}/{core:g}" + (f" + {partial_bonus:g} bonus" if partial_bonus else ""),
                "demo-blank": f"0/{core:g}"}
    for student, total in expected.items():
        line = lines[student]
        assert line.split()[1] == "ok" and f" {total} " in f" {line} ", (
            f"{student} must show status ok and {total!r} (bonus on top of the maximum):\n{out}")
    assert all(len(line) <= 120 for line in out.splitlines() if line.startswith(("student", "demo-"))), (
        f"the table fits a 120-column terminal:\n{out}")
    assert (tmp_path / "demo" / "grading" / DEMO_LAB / "grades.csv").exists()
