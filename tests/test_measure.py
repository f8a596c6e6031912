"""``python -m course measure`` on the CPU (EFFICIENT_AI_MEASURE_ON_CPU=1, Triton's interpreter, tiny shapes): a
small class of a one-question Triton lab, graded by writing the gradebook directly (tests/measure_class.py), then
measured in the sandbox: a correct kernel and a slower one are timed, a wrong one is not, a hanging one times out,
a crashing one and one that reports a CUDA fault cost only their own rows, one that failed its tests is not
measured; then the files, the leaderboard (pseudonyms, CSV neutralised) and the feedback pages. No timing
assertions."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course import measure_spec
from course.nbgrader_run import make_course_dir, read_scores

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
    "setup_cells": ["setup_imports"],
    "rank_by": "roof_share",
    "pieces": [{
        "name": "gelu", "function": "gelu_triton", "kind": "gelu_tanh", "cells": ["q1_gelu"],
        "tests": ["q1_gelu_tests"], "dtype": "float32", "flops": "8 * N", "bytes": "2 * N * element_bytes",
        "metric": "gbps", "tolerance": 1e-4, "shapes": [{"N": 1 << 24}], "tiny_shapes": [{"N": 300}, {"N": 1000}],
    }],
}


def cell(source: str, gid: str, **flags) -> nbformat.NotebookNode:
    meta = {"grade": False, "grade_id": gid, "locked": True, "schema_version": 3, "solution": False, "task": False}
    meta.update(flags)
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})


def make_course(path: Path) -> Path:
    """A course folder with the one-question lab (source notebook, declaration, nbgrader_config.py)."""
    course = make_course_dir(path, [])
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        cell("import math\nimport torch\nimport triton\nimport triton.language as tl", "setup_imports"),
        cell(kernel(), "q1_gelu", locked=False, solution=True),
        cell("assert gelu_triton(torch.zeros(3)).shape == (3,)", "q1_gelu_tests", grade=True, points=2),
    ]
    (course / "source" / LAB).mkdir(parents=True)
    nbformat.write(notebook, course / "source" / LAB / f"{LAB}.ipynb")
    (course / "labs" / LAB).mkdir(parents=True)
    (course / "labs" / LAB / "measure.py").write_text(f"MEASURE = {DECLARATION!r}\n")
    return course


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("measure") / "course")
    write_graded_class(course, LAB, {s: {"q1_gelu": src} for s, src in VARIANTS.items()}, short={"zz_gus": ["q1_gelu_tests"]})
    env = {**os.environ, "EFFICIENT_AI_MEASURE_ON_CPU": "1"}
    result = subprocess.run([sys.executable, "-m", "course", "measure", LAB, "--course-dir", str(course),
                             "--workers", "2", "--timeout-s", "15"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
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


def test_measuring_writes_no_grade(measured):
    course, _, _ = measured
    scores = read_scores(course, LAB)
    assert {s: scores[s].cells["q1_gelu_tests"].score for s in scores} == {
        s: 0.0 if s == "zz_gus" else 2.0 for s in VARIANTS}


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
    for lab in ("lab1", "lab2", "lab3"):
        declared = measure_spec.load(lab)
        assert declared.pieces and all(p.shapes and p.tiny_shapes for p in declared.pieces)


def test_without_a_gpu_it_says_what_it_needs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EFFICIENT_AI_MEASURE_ON_CPU"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-m", "course", "measure", "lab2", "--course-dir", str(REPO)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no CUDA GPU" in result.stderr
