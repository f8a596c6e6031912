"""The grading boundary (course/grader/boundary.py, course/kernel/boundary_kernel.py): what crosses it and how.

The unit tests run the kernel's server in this process against a namespace standing in for the notebook's; the last
test grades the fixture lab in real kernels, where one answer kills its kernel.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from course.grader import boundary

REPO = Path(__file__).resolve().parent.parent


class FakeShell:
    def __init__(self, namespace: dict):
        self.user_ns = namespace


def server(namespace: dict):
    """The kernel's boundary server, installed as a grading kernel installs it, over ``namespace``."""
    scope = {"__builtins__": __builtins__, "get_ipython": lambda: FakeShell(namespace)}
    exec(compile(boundary.KERNEL_SOURCE.read_text(), "<grading boundary>", "exec"), scope)
    return scope["_efficient_ai_boundary_install"](boundary.MAX_ANSWER_BYTES)


def link_to(namespace: dict) -> boundary.KernelLink:
    return boundary.KernelLink(server(namespace))


class LyingInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def test_plain_data_arrives_as_the_graders_own_exact_types():
    values = {
        "count": 7, "flag": True, "ratio": 0.1, "nothing": None, "name": "gemm", "inf": float("-inf"),
        "by_n": {1024: 170.66666666666666, 2048: 341.3333333333333}, "pair": (1, [2.5, "x"]), "seen": {"mm", "add"},
        "half": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "mask": torch.tensor([True, False]),
        "array": np.arange(4, dtype=np.int16), "scalar": np.float32(1.5), "dtype": torch.float16,
        "shape": torch.Size([2, 3]), "empty": torch.empty(0, 3),
    }
    got = link_to(values).export(sorted(values))
    for name, value in values.items():
        assert type(got[name]) is type(value), f"{name} must arrive as {type(value).__name__}, got {type(got[name])}"
    assert got["by_n"] == values["by_n"] and got["pair"] == values["pair"] and got["seen"] == values["seen"]
    assert math.isinf(got["inf"]) and got["inf"] < 0
    assert torch.equal(got["half"], values["half"]) and got["half"].dtype == torch.bfloat16
    assert torch.equal(got["mask"], values["mask"]) and got["empty"].shape == (0, 3)
    assert np.array_equal(got["array"], values["array"]) and got["array"].dtype == np.int16
    assert got["scalar"] == np.float32(1.5) and got["shape"] == torch.Size([2, 3])


def test_correct_answer_forms_the_contract_accepts_cross_by_value():
    values = {"label": np.str_("Compute-bound"), "weight": torch.nn.Parameter(torch.ones(2, 3))}
    got = link_to(values).export(sorted(values))
    assert type(got["label"]) is np.str_ and got["label"] == "Compute-bound", (
        f"a NumPy string is a label answer (checks.as_label takes it): it must arrive by value, got {got['label']!r}")
    assert type(got["weight"]) is torch.Tensor and torch.equal(got["weight"], torch.ones(2, 3)), (
        f"an nn.Parameter is a tensor answer (checks.as_tensor takes it): it must arrive as its data, got "
        f"{type(got['weight'])}")


def test_anything_else_stays_in_the_kernel_as_a_handle():
    class Tensor2(torch.Tensor):
        pass

    namespace = {"lying": LyingInt(3), "sub": torch.zeros(2).as_subclass(Tensor2), "model": torch.nn.Linear(2, 3)}
    got = link_to(namespace).export(sorted(namespace))
    for name in namespace:
        assert type(got[name]) is boundary.Remote, f"{name} (not plain data) must stay a handle, got {type(got[name])}"
    assert got["model"].out_features == 3, "attributes of a handle are read from the kernel as plain data"
    assert type(got["model"].weight) is torch.Tensor, "an exact nn.Parameter arrives as its data (a tensor answer)"


def test_calls_send_arguments_and_return_plain_data_or_raise_the_students_error():
    namespace = {}
    exec("def gemm(A, B):\n    return A @ B\n"
         "def broken(x):\n    raise ValueError(f'bad {x}')\n"
         "class Odd(Exception):\n    pass\n"
         "def odd():\n    raise Odd('strange')\n", namespace)
    got = link_to(namespace).export(["gemm", "broken", "odd"])
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert torch.equal(got["gemm"](a, b), a @ b)
    with pytest.raises(ValueError, match="bad 5"):
        got["broken"](5)
    with pytest.raises(boundary.StudentError, match="Odd: strange"):
        got["odd"]()
    with pytest.raises(TypeError, match="kernel_side"):
        got["gemm"](lambda: 1, b)


def test_a_functions_name_comes_with_its_handle():
    namespace = {}
    exec("def gemm(A, B):\n    return A @ B\n", namespace)
    requests = []
    serve = server(namespace)
    link = boundary.KernelLink(lambda payload: requests.append(payload) or serve(payload))
    gemm = link.export(["gemm"])["gemm"]
    asked = len(requests)
    assert gemm.__name__ == "gemm", "a handle to a function answers __name__ with the student's function name"
    assert len(requests) == asked, "a function's __name__ is sent with its handle: reading it asks the kernel nothing"
    namespace["gemm"].__name__ = "renamed"
    assert link.export(["gemm"])["gemm"].__name__ == "renamed", "the name is the function's own at export time"


def test_a_handle_can_be_passed_back_to_the_kernel():
    namespace = {}
    exec("def make():\n    return object()\n"
         "def same(x, y):\n    return x is y\n", namespace)
    got = link_to(namespace).export(["make", "same"])
    obj = got["make"]()
    assert got["same"](obj, obj) is True and got["same"](obj, [obj]) is False


@pytest.mark.parametrize("answer, error", [
    ('{"ok": {"$": "code", "source": "1"}}', "unknown answer tag"),
    ('{"ok": {"$": "tensor", "dtype": "float32", "shape": [4], "data": "AAAA"}}', "cannot hold"),
    ('{"ok": {"$": "tensor", "dtype": "Tensor", "shape": [], "data": ""}}', "unknown tensor dtype"),
    ('{"ok": {"$": "float", "repr": "__import__(\'os\')"}}', "malformed float"),
    ('[1, 2]', "not a JSON object"),
    ('{"error": "x"}', "malformed"),
    ("not json", "not valid JSON"),
])
def test_the_decoder_refuses_anything_but_plain_data(answer, error):
    link = boundary.KernelLink(lambda payload: answer)
    with pytest.raises(boundary.BoundaryError, match=error):
        link.request("export", ["x"])


def test_no_answer_means_the_kernel_is_lost():
    with pytest.raises(boundary.KernelLost):
        boundary.KernelLink(lambda payload: None).request("export", ["x"])


def test_kernel_side_runs_in_the_kernel_and_refuses_closures():
    namespace = {"secret_in_kernel": 41}
    link = link_to(namespace)
    grader = boundary.GraderSide(None, link)
    source = (
        "@kernel_side\n"
        "def probe(x):\n"
        "    return secret_in_kernel + x\n"
        "result = probe(1)\n"
        "def outer():\n"
        "    y = 2\n"
        "    @kernel_side\n"
        "    def inner():\n"
        "        return y\n"
        "    return inner()\n"
        "try:\n"
        "    outer()\n"
        "    closure_error = None\n"
        "except TypeError as exc:\n"
        "    closure_error = str(exc)\n"
        "print(result, closure_error)\n"
    )
    printed, error, _ = grader.run_test_cell(source, "t")
    assert error is None, error
    assert printed.startswith("42 kernel_side function inner uses variables of the function around it (y)")


def test_the_shared_device_rule_probes_in_the_kernel_on_a_cpu_grader():
    namespace = {}
    exec("import torch\n"
         "def made_anywhere(a):\n    return torch.tensor(a.tolist())\n"
         "def made_on_input(a):\n    return torch.tensor(a.tolist(), device=a.device)\n", namespace)
    grader = boundary.GraderSide(REPO, link_to(namespace))
    grader.run_locked_cell("import torch\nfrom checks import *\n", [])
    cell = ("with check('device rule', weight=1):\n"
            "    assert_on_input_device({fn}, (torch.ones(3),), 'cpu', '{fn}(x)')\n"
            "finish_checks()\n")
    _, error, share = grader.run_test_cell(cell.format(fn="made_on_input"), "t")
    assert (error, share) == (None, 1.0), error
    _, error, share = grader.run_test_cell(cell.format(fn="made_anywhere"), "t")
    assert share == 0.0 and "PyTorch's default device set to 'meta'" in error[1], (
        f"a result made without the input's device must fail on a CPU grader: {error}")


def test_test_cells_use_the_graders_helpers_and_the_students_answers():
    namespace = {}
    exec("def add(a, b):\n    return a - b\n"
         "def check(value, expected):\n    pass\n", namespace)  # the student's own `check` must not be used
    grader = boundary.GraderSide(None, link_to(namespace))
    grader.run_locked_cell("def check(value, expected):\n    assert value == expected, f'{value} != {expected}'\n",
                           [boundary.HELPERS_TAG])
    grader.run_locked_cell("import math\nMAGIC = 3\n", [])  # a plain locked cell: only its imports reach the grader
    printed, error, _ = grader.run_test_cell("check(add(2, 2), 4)\n", "t")
    assert error == ("AssertionError", "0 != 4"), f"the grader's check must judge the student's add: {error}"
    assert "math" in grader.base and "MAGIC" not in grader.base
    printed, error, _ = grader.run_test_cell("print('ok')\n", "t")
    assert (printed, error) == ("ok\n", None)


def test_a_star_import_binds_only_the_names_tests_read(tmp_path, monkeypatch):
    (tmp_path / "utils.py").write_text(
        "__all__ = ['used', 'unused', 'LAZY']\nused, unused = 1, 2\nBUILT = []\n\n"
        "def __getattr__(name):\n    if name == 'LAZY':\n        BUILT.append(name)\n        return 3\n"
        "    raise AttributeError(name)\n")
    monkeypatch.delitem(__import__("sys").modules, "utils", raising=False)
    grader = boundary.GraderSide(tmp_path, link_to({}), needed={"used", "check"})
    grader.run_locked_cell("from utils import *\n", [])
    grader.run_locked_cell("def check(value):\n    assert value == used\n", [boundary.HELPERS_TAG])
    printed, error, _ = grader.run_test_cell("check(used)\n", "t")
    assert error is None, error
    assert "unused" not in grader.base and "LAZY" not in grader.base, "names no test reads must not be bound"
    assert __import__("sys").modules["utils"].BUILT == [], "a lazy attribute no test reads must not be built"
    assert grader.base["kernel_side"] is grader.kernel_side, "the grader's kernel_side must survive a star import"


def test_global_reads_are_the_names_a_cell_reads_but_does_not_bind():
    code = compile("import math\nx = gemm(A)\ndef f():\n    return helper(x) + math.pi\nprint(f())\n", "<t>", "exec")
    assert boundary.global_reads(code) == {"gemm", "A", "helper", "print"}


def test_oversized_results_are_refused_with_the_contract():
    namespace = {"big": lambda: torch.zeros(boundary.MAX_ANSWER_BYTES // 4 + 1)}
    got = link_to(namespace).export(["big"])
    with pytest.raises(boundary.StudentError, match="ResultTooLarge"):
        got["big"]()


@pytest.mark.slow
def test_a_killed_kernel_costs_only_its_own_question(tmp_path):
    """An answer that kills its kernel: that question scores zero, later ones earn their points (fresh kernel).
    A kernel that stops answering the boundary's requests fails the tests from there on, each with a clear error."""
    from fixture_lab import LAB, built_root

    from course.cli import grade
    from course.cli.nbgrader_run import make_course_dir
    from course.common.grading_result import GradingResult
    from course.common.notebooks import make_submission, read_notebook, replace_cell_source, write_notebook

    root = built_root(tmp_path / "repo")
    course = make_course_dir(tmp_path / "course", [LAB], root)
    reference = make_submission(read_notebook(root / "release" / LAB / f"{LAB}.ipynb"),
                                read_notebook(root / "source" / LAB / f"{LAB}.ipynb"))
    killer = replace_cell_source(reference, "q1_1_add", "import os\n\ndef add(a, b):\n    return a + b\n\nos._exit(3)\n")
    write_notebook(killer, course / "submitted" / "killer" / LAB / f"{LAB}.ipynb")
    # The second student closes the boundary's comm after Question 1.1's test: later requests get no answer.
    mute = replace_cell_source(reference, "q1_2_scale", "def scale(x, factor):\n    return x * factor\n\n"
                               "get_ipython().kernel.comm_manager.comms.clear()\n")
    write_notebook(mute, course / "submitted" / "mute" / LAB / f"{LAB}.ipynb")
    outcomes, scores = grade.grade_lab(course, LAB, progress=False)
    cells = {gid: cell.score for gid, cell in scores["killer"].cells.items() if gid.endswith("_tests")}
    assert cells == {"q1_1_add_tests": 0.0, "q1_2_scale_tests": 2.0, "b1_1_square_tests": 1.0}, (
        f"the kernel died in q1_1's answer: only q1_1 may lose its points, got {cells} ({outcomes['killer']})")
    restarts = GradingResult.read(course / "autograded" / "killer" / LAB).kernel_restarts
    assert restarts and "the kernel died" in restarts[0], restarts

    cells = {gid: cell.score for gid, cell in scores["mute"].cells.items() if gid.endswith("_tests")}
    assert cells == {"q1_1_add_tests": 3.0, "q1_2_scale_tests": 0.0, "b1_1_square_tests": 0.0}, (
        f"requests after the boundary's comm was closed get no answer: those tests fail, got {cells}")
    graded = read_notebook(course / "autograded" / "mute" / LAB / f"{LAB}.ipynb")
    errors = [out for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == "q1_2_scale_tests"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "BoundaryError" and "sent no answer" in errors[0]["evalue"], (
        f"a request the kernel handled without answering must fail its test with a BoundaryError: {errors}")
