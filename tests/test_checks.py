"""The test contract (checks.py) and the lint that keeps every lab on it.

- Answers are accepted in every form a question allows and lying types are refused, with messages that name them.
- Weighted checks: a failed block is recorded and the next runs; a notebook's cell fails listing them; the grader's
  card gives the weighted share.
- The meta-default device probe sees a result created without the input's device.
- ``course lint`` fails on a test or helper cell that compares by itself, on a lab's own check helper, and on check
  blocks without ``finish_checks``.
"""
from __future__ import annotations

import nbformat
import numpy as np
import pytest
import torch

import checks
from checks import (
    ChecksFailed,
    as_integer,
    as_real,
    as_truth,
    as_tuple,
    assert_calls,
    assert_close,
    assert_integer,
    assert_label,
    assert_on_input_device,
    assert_or_carried,
    assert_reals_by_key,
    assert_tensor_close,
    carried,
    check,
    finish_checks,
    output_devices_with_meta_default,
    record_torch_calls,
)
from course.lint import check_test_contract


class AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize("value", [3, 3.0, np.int64(3), np.float32(3.0), torch.tensor(3.0), torch.tensor([3]),
                                   np.array([3.0])])
def test_a_number_is_accepted_in_every_form(value):
    assert as_real(value, "x") == 3.0 and as_integer(value, "x") == 3
    assert_close(value, 3.0000001, "x") and assert_integer(value, 3, "x") == 3


@pytest.mark.parametrize("value, named", [(True, "bool"), ("3", "str"), (AlwaysEqual(3), "AlwaysEqual"),
                                          (1 + 0j, "complex"), (torch.ones(2), r"shape \(2,\)")])
def test_lying_or_wrong_types_are_refused_by_name(value, named):
    with pytest.raises(AssertionError, match=named):
        assert_integer(value, 3, "count")


def test_a_lying_answer_zeroes_the_whole_cell():
    checks.begin_cell(graded=True)
    with check("an unrelated check", weight=5):
        pass
    with check("the value", weight=1):
        assert_integer(AlwaysEqual(3), 3, "count")
    card = checks.end_cell()
    assert card.share == 0.0 and "a subclass: refused" in card.failures()[0], card.failures()
    checks.begin_cell(graded=True)
    with check("an honest wrong type", weight=1):
        assert_integer(np.str_("3"), 3, "count")
    with check("an unrelated check", weight=1):
        pass
    assert checks.end_cell().share == 0.5, "a NumPy string or a bool is a mistake, not tampering"


def test_float32_tolerance_by_default_and_a_stated_one_when_asked():
    assert_close(np.float32(1 / 3), 1 / 3, "third")  # float32 rounding passes REL_TOL
    with pytest.raises(AssertionError, match=r"must be 0\.3333333333333333 \(to a relative 1e-09\)"):
        assert_close(np.float32(1 / 3), 1 / 3, "third", rel_tol=1e-9)
    with pytest.raises(AssertionError, match="whole number"):
        as_integer(2.5, "count")


def test_labels_and_dicts():
    assert assert_label(np.str_(" Memory-Bound "), "memory-bound", "regime") == "memory-bound"
    with pytest.raises(AssertionError, match="must be a string"):
        assert_label(1, "memory-bound", "regime")
    assert_reals_by_key({"a": np.float64(1.0), "b": torch.tensor(2.0)}, {"a": 1.0, "b": 2.0}, "table")
    with pytest.raises(AssertionError, match="exactly the keys"):
        assert_reals_by_key({"a": 1.0}, {"a": 1.0, "b": 2.0}, "table")


def test_tensors_against_a_float64_reference():
    reference = torch.linspace(-1, 1, 7, dtype=torch.float64)
    assert_tensor_close(reference.float(), reference, "y")
    assert_tensor_close(reference.half(), reference, "y")  # half's own tolerance
    with pytest.raises(AssertionError, match="largest absolute error"):
        assert_tensor_close(reference.float() + 1e-3, reference, "y")
    with pytest.raises(AssertionError, match="dtype torch.float64"):
        assert_tensor_close(reference.float(), reference, "y", dtype=torch.float64)
    with pytest.raises(AssertionError, match="shape"):
        assert_tensor_close(reference[:3], reference, "y")
    assert_tensor_close(reference, reference, "y", device=torch.device("cpu"))
    with pytest.raises(AssertionError, match="must be on meta"):
        assert_tensor_close(reference, reference, "y", device="meta")
    with pytest.raises(AssertionError, match="NaN"):
        assert_tensor_close(torch.full((7,), float("nan")), reference, "y")


def test_call_records():
    assert_calls({"add", "mul"}, "f", forbidden={"matmul"}, required={"mul"})
    with pytest.raises(AssertionError, match=r"must not call \['matmul'\]"):
        assert_calls(["matmul"], "f", forbidden={"matmul"})


def test_weighted_checks_in_a_notebook_run_every_block_and_list_the_failures(capsys):
    with check("ordinary inputs", weight=3):
        assert 1 + 1 == 2
    with check("the named edge", weight=1):
        raise AssertionError("edge missed")
    with check("an error of the student's code", weight=1):
        raise TypeError("bad operand")
    with pytest.raises(ChecksFailed) as failed:
        finish_checks("Question 9.9")
    message = str(failed.value)
    assert "2 of 3 checks failed (60% of this cell's weight passed)" in message
    assert "FAILED the named edge (weight 1 of 5): edge missed" in message
    assert "FAILED an error of the student's code (weight 1 of 5): TypeError: bad operand" in message
    with check("fresh cell", weight=1):
        pass
    finish_checks("Question 9.9")
    assert "all 1 checks passed" in capsys.readouterr().out


def test_the_grader_s_card_gives_the_weighted_share_and_lets_its_own_errors_through():
    class GraderError(Exception):
        pass

    checks.begin_cell(graded=True, passthrough=(GraderError,))
    with check("a", weight=3):
        pass
    with check("b", weight=1):
        raise AssertionError("no")
    finish_checks()  # the grader decides: no raise
    with pytest.raises(GraderError):
        with check("c", weight=1):
            raise GraderError("the kernel died")
    card = checks.end_cell()
    assert card.share == 0.75 and card.failures() == ["FAILED b (weight 1 of 4): no"]


def test_the_device_probe_sees_a_result_made_without_the_input_s_device():
    x = torch.ones(3)
    assert output_devices_with_meta_default(lambda a: torch.tensor(a.tolist()), x) == ["meta"]
    assert output_devices_with_meta_default(lambda a: torch.tensor(a.tolist(), device=a.device), x) == ["cpu"]
    assert output_devices_with_meta_default(lambda a: (a * 2, torch.zeros(2, device=a.device)), x) == ["cpu", "cpu"]
    assert output_devices_with_meta_default(lambda a: torch.tensor(a.tolist()).to(a.device), x) is None  # undecided


def test_the_device_rule_fails_on_a_cpu_grader_too():
    x = torch.ones(3)
    assert_on_input_device(lambda a: a * 2, (x,), x.device, "double(x)")
    assert_on_input_device(lambda a: (a, a + 1), (x,), "cpu", "pair(x)", outputs=2)
    assert_on_input_device(lambda a: torch.tensor(a.tolist()).to(a.device), (x,), x.device, "moved(x)")  # undecided
    with pytest.raises(AssertionError, match="also when it creates tensors itself"):
        assert_on_input_device(lambda a: torch.tensor(a.tolist()), (x,), x.device, "made(x)")
    with pytest.raises(AssertionError, match="tuple of 2 values"):
        assert_on_input_device(lambda a: a, (x,), "cpu", "pair(x)", outputs=2)


def test_the_call_recorder_sees_every_spelling_of_a_call():
    a = torch.randn(3, 3)
    with record_torch_calls() as called:
        _ = a @ a
    assert "matmul" in called or "__matmul__" in called, f"the @ operator must be recorded, got {called}"
    with record_torch_calls() as called:
        getattr(torch, "mat" + "mul")(a, a)
        torch.nn.functional.gelu(a, approximate="tanh")
    assert {"matmul", "gelu"} <= called, called
    with record_torch_calls() as called:
        _ = a + 1.0
    assert not {"matmul", "gelu"} & called, "nothing that was not called may be recorded"


def test_tuples_and_truth_values_in_every_allowed_form():
    assert as_tuple([1, 2], 2, "f") == (1, 2)
    with pytest.raises(AssertionError, match="tuple of 2 values, got 3"):
        as_tuple((1, 2, 3), 2, "f")
    assert as_truth(np.True_, "f") is True and as_truth(torch.tensor(False), "f") is False
    for wrong in (1, "True", torch.tensor([True, False])):
        with pytest.raises(AssertionError, match="must be True or False"):
            as_truth(wrong, "f")


def test_a_mistake_is_charged_once():
    def broken():
        raise ValueError("the earlier answer raised")

    assert carried(broken) is None and carried(lambda n: n + 1, 2) == 3
    assert assert_or_carried(lambda want: assert_integer(7, want, "g"), 6, None, 7) == 7  # built on its own f
    assert assert_or_carried(lambda want: assert_integer(6, want, "g"), 6, 7) == 6
    with pytest.raises(AssertionError, match=r"nor 7 computed the same way from f \(Question 1\)"):
        assert_or_carried(lambda want: assert_integer(5, want, "g"), 6, 7, carried_from="f (Question 1)")
    with pytest.raises(AssertionError) as failed:
        assert_or_carried(lambda want: assert_integer(5, want, "g"), 6, None)
    assert "nor" not in str(failed.value), "with nothing carried, the message is the comparison alone"


def _notebook(test_source: str, helpers: str = "") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    meta = {"grade": True, "grade_id": "q1_1_f_tests", "locked": True, "points": 2, "schema_version": 3,
            "solution": False, "task": False}
    nb.cells = [nbformat.v4.new_code_cell(helpers, metadata={"tags": ["test-helpers"]}),
                nbformat.v4.new_code_cell(test_source, metadata={"nbgrader": meta})]
    return nb


@pytest.mark.parametrize("source, why", [
    ("import math\nassert math.isclose(f(1), 0.5)", "math.isclose"),
    ("assert isinstance(f(1), float)", "isinstance"),
    ("assert type(f(1)) is int", "checks a type itself"),
    ("assert f(1) == 0.5", "compares floats with =="),
    ("assert f(1) != float(x)", "compares floats with =="),
    ("assert plain_value(f(1), 'int', 'f') == 1", "plain_value"),
    ("with check('f', weight=1):\n    assert_close(f(1), 0.5, 'f')", "must end with `finish_checks"),
    ("def check(x):\n    pass\ncheck(1)", "a shadow of checks.check"),
])
def test_lint_fails_on_a_test_cell_that_compares_by_itself(source, why):
    problems = check_test_contract("lab9", _notebook(source))
    assert any(why in p.message for p in problems), [str(p) for p in problems]


def test_lint_fails_on_a_lab_s_own_check_helper_and_passes_the_contract():
    problems = check_test_contract("lab9", _notebook("", "def _check_close(got, want):\n    return got == want"))
    assert any("_check_close" in p.message for p in problems), problems
    good = ("@kernel_side\ndef probe(x):\n    return isinstance(x, int)\n\n"
            "with check('f', weight=1):\n    assert_close(f(1), 0.5, 'f')\n    assert f(2) == 3\nfinish_checks('Q')")
    assert check_test_contract("lab9", _notebook(good)) == []
