"""``python -m course measure`` on the CPU (EFFICIENT_AI_MEASURE_ON_CPU=1, Triton's interpreter, tiny shapes): a
small class of a one-question Triton lab, graded by writing the gradebook directly (tests/measure_class.py), then
measured in the sandbox: a correct kernel and a slower one are timed, a wrong one is not, a hanging one times out,
a crashing one and one that reports a CUDA fault cost only their own rows, one that failed its tests is not
measured; then the files, the leaderboard (pseudonyms, CSV neutralised), the feedback pages and the optional extra
credit (at a ratio every correct kernel meets). Also: the declarations beside the questions (build, lint) and a
class split in shards, then merged. No timing assertions."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.cli import measure_credit, measure_shards
from course.cli.lint import check_measure_declarations
from course.cli.nbgrader_run import make_course_dir
from course.common import measure_cells, measure_spec
from course.common.notebooks import read_notebook
from course.common.paths import COURSE_ID, course_directory
from course.common.scores import read_scores
from course.kernel import measure_probe

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from measure_class import write_graded_class  # noqa: E402

LAB = "lab7"
KERNEL = '''@triton.jit
def _gelu_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(Y + offs, HALF * x * (1.0 + t), mask=mask)
    LOOP


def gelu_triton(x):
    """GeLU (tanh) of x (N,), float32, with a Triton kernel."""
    PRE
    y = torch.empty_like(x)
    _gelu_kernel[(triton.cdiv(x.numel(), BLOCK_SIZE),)](x, y, x.numel(), BLOCK=BLOCK_SIZE)
    return y
'''


def kernel(half="0.5", loop="", pre="pass", block="128") -> str:
    return (KERNEL.replace("HALF", half).replace("LOOP", loop or "pass").replace("PRE", pre)
            .replace("BLOCK_SIZE", block))


VARIANTS = {
    "zz_ada": kernel(),  # correct
    "=cmd|' /C calc'!A0": kernel(block="16"),  # correct, more programs: slower; an id that is a spreadsheet formula
    "zz_cy": kernel(half="0.25"),  # wrong: not timed
    "zz_dee": kernel(loop="while n > 0:\n        n = n + 0"),  # hangs inside the Triton kernel
    "zz_eve": kernel(pre="if x.numel() < 500:\n        import os\n        os._exit(3)"),  # the kernel dies at shape 1
    "zz_fay": kernel(pre="if x.numel() > 500:\n        raise RuntimeError('CUDA error: an illegal memory access was "
                      "encountered')"),  # a CUDA fault at shape 2
    "zz_gus": kernel(),  # failed its tests: not measured
}
DECLARATION = {
    "name": "gelu", "function": "gelu_triton", "kind": "gelu_tanh", "cells": ["q1_gelu"],
    "tests": ["q1_gelu_tests"], "dtype": "float32", "flops": "8 * N", "bytes": "2 * N * element_bytes",
    "metric": "gbps", "tolerance": 1e-4, "shapes": [{"N": 1 << 24}], "tiny_shapes": [{"N": 300}, {"N": 1000}],
}
EXTRA_CREDIT = 1.5  # points; the ratio below is one every correct kernel meets (no timing assertion)
EXTRA_CREDIT_CONFIG = f"\nc.Measure.extra_credit_points = {EXTRA_CREDIT}\nc.Measure.extra_credit_ratio = 1e9\n"


def cell(source: str, gid: str, **flags) -> nbformat.NotebookNode:
    meta = {"grade": False, "grade_id": gid, "locked": True, "schema_version": 3, "solution": False, "task": False}
    meta.update(flags)
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})


def declaration_cell(declaration: dict | str) -> nbformat.NotebookNode:
    """A markdown cell tagged ``measure``: a note for students, then the fenced declaration."""
    text = declaration if isinstance(declaration, str) else repr(declaration)
    return nbformat.v4.new_markdown_cell(f"The grading GPU times `gelu_triton` on 16M elements.\n\n```measure\n{text}\n```",
                                         metadata={"tags": ["measure"]})


def lab_notebook(declaration: dict | str = DECLARATION) -> nbformat.NotebookNode:
    """The one-question lab: setup, solution, test cell, then its declaration."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        cell("import math\nimport torch\nimport triton\nimport triton.language as tl", "setup_imports"),
        cell(kernel(), "q1_gelu", locked=False, solution=True),
        cell("assert gelu_triton(torch.zeros(3)).shape == (3,)", "q1_gelu_tests", grade=True, points=2),
        declaration_cell(declaration),
    ]
    return notebook


def make_course(path: Path, config: str = "") -> Path:
    """A course folder with the one-question lab (its source notebook holds the declaration) and nbgrader_config.py
    (``config`` appended)."""
    course = make_course_dir(path, [])
    with (course / "nbgrader_config.py").open("a") as handle:
        handle.write(config)
    (course / "source" / LAB).mkdir(parents=True)
    nbformat.write(lab_notebook(), course / "source" / LAB / f"{LAB}.ipynb")
    return course


def extra_credit(course: Path, student: str) -> float | None:
    return read_scores(course, LAB)[student].cells["q1_gelu_tests"].extra_credit


def set_extra_credit(course: Path, student: str, value: float | None) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(course_directory(course).db_url, course_id=COURSE_ID) as gb:
        gb.find_grade("q1_gelu_tests", LAB, LAB, student).extra_credit = value
        gb.db.commit()


def run_measure(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EFFICIENT_AI_MEASURE_ON_CPU": "1"}
    return subprocess.run([sys.executable, "-m", "course", "measure", LAB, "--course-dir", str(course),
                           "--timeout-s", "15", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("measure") / "course", EXTRA_CREDIT_CONFIG)
    write_graded_class(course, LAB, {s: {"q1_gelu": src} for s, src in VARIANTS.items()}, short={"zz_gus": ["q1_gelu_tests"]})
    for student in ("zz_cy", "zz_gus"):  # what an earlier run gave, before the kernel went wrong or failed its tests
        set_extra_credit(course, student, EXTRA_CREDIT)
    result = run_measure(course, "--workers", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return course, json.loads((course / "grading" / LAB / "measure.json").read_text()), result.stdout


def rows_of(results: dict, student: str) -> list[dict]:
    return [r for r in results["rows"] if r["student"] == student]


def test_each_submission_gets_its_own_verdict(measured):
    _, results, _ = measured
    status = {s: [r["status"] for r in rows_of(results, s)] for s in [*VARIANTS, "(reference)"]}
    assert status["(reference)"] == ["ok", "ok"]
    assert status["zz_ada"] == ["ok", "ok"] and status["=cmd|' /C calc'!A0"] == ["ok", "ok"]
    assert status["zz_cy"] == ["wrong", "wrong"]
    assert all(r["ms"] is None and "not timed" in r["reason"] for r in rows_of(results, "zz_cy"))
    assert status["zz_dee"] == ["timeout", "not-measured"]
    assert status["zz_eve"] == ["crashed", "ok"]  # a fresh kernel measures the next shape
    assert status["zz_fay"] == ["ok", "cuda-fault"]
    assert status["zz_gus"] == [] and "q1_gelu_tests" in results["not_measured"]["zz_gus"]
    for row in rows_of(results, "zz_ada"):
        assert row["ms"] > 0 and row["roof_share"] > 0 and row["rel_err"] < 1e-4 and row["gbps"] > 0
        assert row["grader_ms_per_call"] > 0


def test_measuring_writes_no_score(measured):
    course, _, _ = measured
    scores = read_scores(course, LAB)
    assert {s: scores[s].cells["q1_gelu_tests"].auto_score for s in scores} == {
        s: 0.0 if s == "zz_gus" else 2.0 for s in VARIANTS}


def test_extra_credit_only_for_correct_timed_kernels(measured):
    course, results, stdout = measured
    winners = {"zz_ada", "=cmd|' /C calc'!A0"}  # every shape correct and timed; the ratio is one all of them meet
    assert {s: extra_credit(course, s) for s in VARIANTS} == {s: EXTRA_CREDIT if s in winners else None for s in VARIANTS}
    assert read_scores(course, LAB)["zz_ada"].total_score() == 2.0 + EXTRA_CREDIT  # what reports and exports add up
    assert results["extra_credit"] == {s: {"gelu": EXTRA_CREDIT} for s in winners}
    assert "extra credit" in (course / "feedback" / "zz_ada" / LAB / "measure.html").read_text()
    assert "extra credit" in stdout
    measure_credit.record(course, LAB, results, measure_credit.awards(results, EXTRA_CREDIT, 1e9))  # a second run
    assert extra_credit(course, "zz_ada") == EXTRA_CREDIT and extra_credit(course, "zz_cy") is None  # no stacking
    assert measure_credit.awards(results, 0.0, 1e9) == {}  # off: nothing to write


def test_extra_credit_rule_compares_with_the_reference():
    def row(student, label, ms, status="ok"):
        return {"student": student, "piece": "p", "label": label, "grader_ms_per_call": ms, "status": status,
                "ms": ms and ms / 1000}  # the kernel's own report: never what decides credit

    results = {"pieces": {"p": {"credit_cell": "q1_tests"}}, "not_measured": {"skipped": "tests failed"}, "rows": [
        row("(reference)", "a", 1.0), row("(reference)", "b", 4.0),
        row("fast", "a", 0.5), row("fast", "b", 4.0),  # geometric mean of 0.5 and 1: 0.71
        row("slow", "a", 2.0), row("slow", "b", 4.0),  # 1.41
        row("half", "a", 0.1), row("half", "b", None, "timeout")]}
    earned = measure_credit.awards(results, 2.0, 1.0)
    assert earned == {"fast": {"p": 2.0}, "slow": {"p": 0.0}, "half": {"p": 0.0}, "skipped": {"p": 0.0}}
    assert measure_credit.awards(results, 2.0, 0.5)["fast"] == {"p": 0.0}
    liar = [row("liar", "a", 1.0), row("liar", "b", 4.0)]  # as slow as the reference by the grader's clock
    for entry in liar:
        entry["ms"] = 1e-6  # whatever the kernel's patched clock reported
    results["rows"] += liar
    assert measure_credit.awards(results, 2.0, 0.9)["liar"] == {"p": 0.0}


def test_results_leaderboard_and_feedback(measured):
    course, results, stdout = measured
    grading = course / "grading" / LAB
    with (grading / "measure.csv").open() as handle:
        table = list(csv.reader(handle))
    assert table[0][:3] == ["gpu", "student", "piece"]
    assert any(line[1] == "'=cmd|' /C calc'!A0" for line in table[1:])  # neutralised, not a formula
    with (grading / "leaderboard.csv").open() as handle:
        board = list(csv.reader(handle))
    names = [line[1] for line in board[1:]]
    assert "(reference)" in names and not any(s in names for s in VARIANTS)  # pseudonyms by default
    ranked = [line for line in board[1:] if line[0] not in ("", "ref")]
    assert [line[0] for line in ranked] == [str(i + 1) for i in range(len(ranked))] and len(ranked) == 2
    page = (grading / "leaderboard.html").read_text()
    assert "calc" not in page and "<script" not in page
    mine = (course / "feedback" / "zz_ada" / LAB / "measure.html").read_text()
    assert "data:image/png;base64," in mine and results["gpu"] in mine
    assert not any(other in mine for other in VARIANTS if other != "zz_ada")
    wrong = (course / "feedback" / "zz_cy" / LAB / "measure.html").read_text()
    assert "not timed" in wrong
    skipped = (course / "feedback" / "zz_gus" / LAB / "measure.html").read_text()
    assert "q1_gelu_tests" in skipped
    assert "(reference)" in stdout


def test_declarations_of_the_labs_hold_together():
    assert set(measure_spec.KINDS) == set(measure_probe.KINDS)
    for lab in ("lab1", "lab2", "lab3"):
        declared = measure_spec.load(lab)
        assert declared.pieces and all(p.shapes and p.tiny_shapes for p in declared.pieces)
        source = read_notebook(REPO / "source" / lab / f"{lab}.ipynb")
        release = read_notebook(REPO / "release" / lab / f"{lab}.ipynb")
        assert check_measure_declarations(lab, source, release) == []
        notes = [cell.source for cell in release.cells if measure_cells.is_measure_cell(cell)]
        assert len(notes) == len(declared.pieces) and all(note and "```" not in note for note in notes)
        assert not (REPO / "labs" / lab / "measure.py").exists()


@pytest.mark.parametrize("change, expected", [
    ({"tests": ["q1_gelu_testz"]}, "grade id 'q1_gelu_testz' is not in the lab"),
    ({"tests": ["q1_gelu"]}, "'q1_gelu' is not an autograded test cell"),
    ({"cells": ["setup_imports", "q2_later"]}, "grade id 'q2_later' is not in the lab"),
    ({"setup_cells": ["q1_gelu"]}, "'q1_gelu' is not a locked code cell"),
    ({"tiny_shapes": [{"M": 300}]}, "kind gelu_tanh needs N"),
    ({"shapes": [{"N": -4}]}, "N must be a positive integer"),
    ({"shapes": []}, "shapes must be a non-empty list"),
    ({"kind": "softmax"}, "kind 'softmax' is not one of"),
    ({"flops": "8 * N * K"}, "names 'K'"),
    ({"flops": "__import__('os')"}, "Call is not allowed"),
    ({"shape": [{"N": 4}]}, "unexpected keyword argument 'shape'"),
])
def test_lint_names_what_is_wrong_in_a_declaration(change, expected):
    notebook = lab_notebook({**DECLARATION, **change})
    found = check_measure_declarations(LAB, notebook, notebook)
    assert any(expected in problem.message for problem in found), found


def test_lint_refuses_a_declaration_before_its_question_and_an_unreadable_one():
    notebook = lab_notebook()
    notebook.cells.insert(1, notebook.cells.pop())  # the declaration above the cells it names
    assert "comes after the declaration" in " ".join(p.message for p in check_measure_declarations(LAB, notebook, notebook))
    broken = lab_notebook("{'name': 'gelu',")
    assert "not a Python literal" in check_measure_declarations(LAB, broken, broken)[0].message


def test_build_strips_the_declaration_from_the_release(tmp_path):
    path = tmp_path / f"{LAB}.ipynb"
    nbformat.write(lab_notebook(), path)
    assert measure_cells.strip_declarations(path)
    release = read_notebook(path)
    assert release.cells[-1].source == "The grading GPU times `gelu_triton` on 16M elements."
    assert [p.message for p in check_measure_declarations(LAB, lab_notebook(), release)] == []
    assert "shows a ```measure declaration" in check_measure_declarations(LAB, lab_notebook(), lab_notebook())[0].message
    assert not measure_cells.strip_declarations(path)  # once stripped, left alone


def test_a_class_in_shards_merges_into_one_run(tmp_path):
    course = make_course(tmp_path / "course")  # extra credit off (the default): no grade written
    class_ = {"zz_ada": VARIANTS["zz_ada"], "zz_cy": VARIANTS["zz_cy"], "zz_gus": VARIANTS["zz_gus"]}
    write_graded_class(course, LAB, {s: {"q1_gelu": src} for s, src in class_.items()}, short={"zz_gus": ["q1_gelu_tests"]})
    first = run_measure(course, "--shard", "0/2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    early = run_measure(course, "--merge")
    assert early.returncode != 0 and "1/2" in early.stderr  # a shard is missing: no merge
    second = run_measure(course, "--shard", "1/2")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    grading = course / "grading" / LAB
    shards = [json.loads((grading / f"shard-{i}-of-2" / "measure.json").read_text()) for i in range(2)]
    assert not (grading / "leaderboard.html").exists()  # a shard alone writes only its results
    assert [sorted({r["student"] for r in part["rows"]} | set(part["not_measured"])) for part in shards] == [
        ["(reference)", "zz_ada", "zz_gus"], ["(reference)", "zz_cy"]]  # course grade's split, the reference in each
    merged = run_measure(course, "--merge")
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    results = json.loads((grading / "measure.json").read_text())
    assert [(r["student"], r["status"]) for r in results["rows"]] == [
        ("(reference)", "ok"), ("(reference)", "ok"), ("zz_ada", "ok"), ("zz_ada", "ok"), ("zz_cy", "wrong"),
        ("zz_cy", "wrong")]
    assert list(results["not_measured"]) == ["zz_gus"] and len(results["shards"]) == 2
    assert (grading / "leaderboard.html").exists() and (course / "feedback" / "zz_cy" / LAB / "measure.html").exists()
    assert all(extra_credit(course, s) is None for s in class_)


def test_merge_refuses_shards_that_do_not_fit():
    part = {"lab": LAB, "gpu": "cpu", "rows": [{"student": "a"}], "not_measured": {}, "seconds": {}}
    with pytest.raises(SystemExit, match="measured by shards 0 and 1"):
        measure_shards.merge([part, part])
    with pytest.raises(SystemExit, match="different labs"):
        measure_shards.merge([part, {**part, "lab": "lab8"}])


def test_without_a_gpu_it_says_what_it_needs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EFFICIENT_AI_MEASURE_ON_CPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-m", "course", "measure", "lab2", "--course-dir", str(REPO)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no CUDA GPU" in result.stderr


def test_cluster_recipes_run_a_shard_each_and_say_how_to_merge():
    from course.__main__ import parse_args

    slurm = (REPO / "deploy" / "slurm" / "measure_array.sbatch").read_text()
    k8s = (REPO / "deploy" / "k8s" / "measure-job.yaml").read_text()
    assert 'python -m course measure "$LAB" --shard "${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}"' in slurm
    assert 'python -m course measure "$LAB" --shard "${JOB_COMPLETION_INDEX}/${SHARDS}"' in k8s
    assert "--merge" in slurm and "--merge" in k8s
    args = parse_args(["measure", "lab2", "--shard", "3/8", "--course-dir", "/course"])
    assert (args.shard, args.merge) == ("3/8", False) and parse_args(["measure", "lab2", "--merge"]).merge



def test_workers_threads_build_the_gpt2_reference_once(monkeypatch):
    """``--workers N`` measures from N threads of one process: they build the GPT-2 reference once per device, one
    thread at a time (two threads importing transformers' model class at once failed on two H200s)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from course.cli import measure_reference

    builds, inside = [], threading.Semaphore(1)

    def slow_build(model, dtype, seed, device):
        assert inside.acquire(blocking=False), "two threads built a reference model at once"
        builds.append(device)
        time.sleep(0.2)
        inside.release()
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr(measure_reference.probe, "gpt2_model", slow_build)
    measure_reference._built_gpt2.cache_clear()
    try:
        with ThreadPoolExecutor(4) as pool:
            nets = list(pool.map(lambda _: measure_reference._float_gpt2("{}", "float32", 0, "cpu"), range(4)))
    finally:
        measure_reference._built_gpt2.cache_clear()
    assert builds == ["cpu"] and all(net is nets[0] for net in nets), builds
