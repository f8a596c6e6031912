"""The test contract (checks.py) and the lint that keeps every lab on it.

- Answers are accepted in every form a question allows and lying types are refused, with messages that name them.
- Weighted checks: a failed block is recorded and the next runs; a notebook's cell fails listing them; the grader's
  card gives the weighted share.
- The method gates the value: a failed ``check(..., method=True)`` caps the cell at a quarter of the share of its
  other checks, while an answer with one mistake and the method right keeps its weighted share.
- The call recorder checks itself: a recording switched off while it ran (``TorchFunctionMode`` patched, the mode
  popped) is tampering (``RecordingDisabled``: the cell scores zero); an honest call of the probe's function is not.
- Carried answers are kept per graded submission (``keep_carried``/``kept_carried``).
- ``course check``'s order of grades: every question that prescribes a method has a skip and a one-mistake answer,
  and a skip earns at most a quarter and less than every one-mistake answer (on harness results made up here).
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
from course.cli import check as course_check
from course.cli.lint import check_test_contract


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


def _graded_share(results: list[tuple[str, float, bool, bool]]) -> checks.Scorecard:
    """The grader's card of a cell whose checks are (name, weight, method, passed)."""
    checks.begin_cell(graded=True)
    for name, weight, method, passed in results:
        with check(name, weight=weight, method=method):
            assert passed, f"{name} failed"
    return checks.end_cell()


def test_a_failed_method_check_caps_the_cell_at_a_quarter():
    method = ("three nested loops, no library product", 1, True)
    skip = _graded_share([("the value", 3, False, True), ("the edge", 1, False, True), (*method, False)])
    assert skip.share == checks.SKIPPED_METHOD_SHARE == 0.25, (
        f"an answer that skips the method, right everywhere else, earns a quarter of the cell, got {skip.share}")
    assert "the cell earns at most 25% of its points" in skip.failures()[0], skip.failures()
    sloppy_skip = _graded_share([("the value", 3, False, True), ("the edge", 1, False, False), (*method, False)])
    assert sloppy_skip.share == 0.25 * 3 / 4, "a skip is scaled by the share of the other checks that passed"
    mistake = _graded_share([("the value", 3, False, True), ("the edge", 1, False, False), (*method, True)])
    assert mistake.share == 4 / 5 > skip.share, (
        "one mistake with the method right earns the weighted share of every check, the method's weight included")
    assert course_check.SKIP_CAP == checks.SKIPPED_METHOD_SHARE, "course check holds skips to the cap the cells apply"


def _gelu_by_hand(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("switch_off", ["TorchFunctionMode.__enter__ patched", "the mode popped"])
def test_a_switched_off_recording_zeroes_the_cell(monkeypatch, switch_off):
    from torch.overrides import TorchFunctionMode

    def student_gelu(x):  # the library routine the question forbids, with the recording switched off
        if switch_off == "the mode popped":
            getattr(torch._C, "_pop_torch_function_stack")()
        return torch.nn.functional.gelu(x, approximate="tanh")

    if switch_off == "TorchFunctionMode.__enter__ patched":
        monkeypatch.setattr(TorchFunctionMode, "__enter__", lambda self: self)
        monkeypatch.setattr(TorchFunctionMode, "__exit__", lambda self, *exc: None)
    checks.begin_cell(graded=True)
    with check("the value", weight=5):
        assert_tensor_close(_gelu_by_hand(torch.ones(3)), _gelu_by_hand(torch.ones(3)), "gelu(1)")
    with check("written from elementwise operations", weight=1, method=True):
        with record_torch_calls() as called:
            student_gelu(torch.ones(3))
        assert_calls(called, "gelu_tanh_python(x)", forbidden={"gelu"})
    card = checks.end_cell()
    assert card.share == 0.0, f"{switch_off}: a recording switched off is tampering, the cell scores zero: {card.results}"
    with pytest.raises(checks.RecordingDisabled):
        assert_calls(called, "gelu_tanh_python(x)", forbidden={"gelu"})
    assert torch._C._len_torch_function_stack() == 0, "the recorder leaves PyTorch's mode stack as it found it"


def test_an_honest_call_of_the_recorder_s_probe_function_is_recorded_not_tampering():
    with record_torch_calls() as called:
        torch.rad2deg(torch.ones(2))
        _gelu_by_hand(torch.ones(2))
    assert "rad2deg" in called and checks.RECORDING_OFF not in called, called
    assert_calls(called, "f", forbidden={"gelu"})


def test_carried_answers_are_kept_per_graded_submission():
    first, second = {}, {}

    def earlier_answer(n):  # the student's function as it is when its own question is graded
        return 2 * n

    checks.begin_cell(graded=True, kept=first)
    checks.keep_carried("macs", earlier_answer, 3)
    checks.end_cell()
    checks.begin_cell(graded=True, kept=second)
    checks.keep_carried("macs", lambda n: 1 / 0, 3)  # another submission's answer raises: nothing to carry
    checks.end_cell()

    def earlier_answer(n):  # noqa: F811 - redefined after it was graded: the kept value does not change
        return 100

    checks.begin_cell(graded=True, kept=first)
    assert checks.kept_carried("macs") == 6, "a later question reads the answer as it was graded, in its own submission"
    checks.end_cell()
    checks.begin_cell(graded=True, kept=second)
    assert checks.kept_carried("macs") is None, "a submission never sees another's carried answer"
    checks.end_cell()
    checks.begin_cell(graded=True, kept={})
    assert checks.kept_carried("macs") is None, "a fresh submission starts with nothing carried"
    checks.end_cell()
    assert first == {"macs": 6} and second == {"macs": None}


def _source_nb(cells: dict[str, tuple[float, str]]):
    """A source notebook holding only autograded test cells: grade id -> (points, source)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": True, "grade_id": gid, "locked": True, "points": points, "schema_version": 3, "solution": False,
        "task": False}}) for gid, (points, source) in cells.items()]
    return nb


METHOD_CELL = ('with check("the value", weight=3):\n    pass\n'
               'with check("three nested loops", weight=1, method=True):\n    pass\n')


def _run(kind: str, cell: str, label: str, shares: dict[str, float]) -> dict:
    """One prepared answer's run as the harness reports it: test cell -> [passed, failure, share]."""
    return {"kind": kind, "cell": cell, "label": label, "answer_error": "",
            "tests": {gid: [share == 1.0, "" if share == 1.0 else "FAILED", share] for gid, share in shares.items()}}


def test_course_check_reports_every_break_of_the_order_of_grades():
    nb = _source_nb({"q1_1_gemm_tests": (4, METHOD_CELL), "q1_2_mac_tests": (2, METHOD_CELL),
                     "q1_3_io_tests": (4, METHOD_CELL), "q1_4_ai_tests": (2, 'with check("v", weight=1):\n    pass\n')})
    harness = {"variants": [
        _run("skip", "q1_1_gemm", "A @ B", {"q1_1_gemm_tests": 0.75}),  # 3 of 4: more than a quarter
        _run("wrong", "q1_1_gemm", "off by one", {"q1_1_gemm_tests": 0.5}),
        _run("skip", "q1_2_mac", "torch.einsum", {"q1_2_mac_tests": 0.25}),  # 0.5: at the cap, but not below...
        _run("wrong", "q1_2_mac", "a wrong count", {"q1_2_mac_tests": 0.2}),  # ...this mistake's 0.4
        _run("wrong", "q1_3_io", "bytes of one operand", {"q1_3_io_tests": 0.5}),  # q1_3 has no skip
        _run("wrong", "q1_4_ai", "flops for macs", {"q1_4_ai_tests": 0.0}),  # no method: nothing required
        _run("tampering", "q1_4_ai", "a lying float", {"q1_4_ai_tests": 0.5}),  # over a quarter from the tests alone
        _run("tampering", "q1_1_gemm", "recorder off", {"q1_1_gemm_tests": 0.0}),  # no lower bound for skips
        {"kind": "skip", "cell": "q9_9_gone", "label": "stale", "error": "no cell 'q9_9_gone'"},
    ]}
    orders = course_check.order_of_grades(nb, harness)
    assert (orders["q1_1"].skips, orders["q1_1"].mistakes) == ({"A @ B": 3.0}, {"off by one": 2.0})
    assert orders["q1_1"].method and not orders["q1_4"].method
    problems = [str(p) for p in course_check.order_problems("lab9", orders, harness)]
    expected = [
        "lab9: labs/lab9/variants.py: the skip answer 'stale' replaces cell 'q9_9_gone', which the lab does not have",
        "lab9: Question 1.1, order of grades: the skip 'A @ B' earns 3 of 4: more than a quarter (1; a "
        "check(..., method=True) block must catch it); not less than the one-mistake answer 'off by one' (2)",
        "lab9: Question 1.2, order of grades: the skip 'torch.einsum' earns 0.5 of 2: not less than the one-mistake "
        "answer 'a wrong count' (0.4)",
        "lab9: Question 1.3, order of grades: it prescribes a method (check(..., method=True)) but "
        "labs/lab9/variants.py has no answer in SKIPS",
        "lab9: Question 1.4, order of grades: the tampering answer 'a lying float' earns 1 of 2: more than a quarter "
        "(0.5) from the tests alone",
    ]
    for text in expected:
        assert any(problem.startswith(text) for problem in problems), f"missing {text!r} in {problems}"
    assert len(problems) == len(expected), problems
    table = course_check.question_table({}, orders)
    assert "skip  mistake" in table.splitlines()[0] and "Question 1.1" in table, table
    assert table.splitlines()[1].split()[-2:] == ["3", "2"], f"the most a skip earns and the least a mistake earns:\n{table}"

    fixed = {"variants": [_run("skip", "q1_1_gemm", "A @ B", {"q1_1_gemm_tests": 0.25}),
                          _run("wrong", "q1_1_gemm", "off by one", {"q1_1_gemm_tests": 0.5}),
                          _run("skip", "q1_2_mac", "torch.einsum", {"q1_2_mac_tests": 0.1}),
                          _run("wrong", "q1_2_mac", "a wrong count", {"q1_2_mac_tests": 0.2}),
                          _run("skip", "q1_3_io", "no tiling", {"q1_3_io_tests": 0.0}),
                          _run("wrong", "q1_3_io", "bytes of one operand", {"q1_3_io_tests": 0.5})]}
    assert course_check.order_problems("lab9", course_check.order_of_grades(nb, fixed), fixed) == [], (
        "skips at or under a quarter and under every mistake keep the order")


def test_course_check_says_when_a_lab_has_no_prepared_answers(tmp_path, capsys):
    assert course_check.check_order("lab0", tmp_path, None) == ([], None)
    assert "no labs/lab0/variants.py: the order of grades is not checked" in capsys.readouterr().out


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


def test_a_lying_answer_stays_tampering_where_a_carried_value_is_accepted():
    card = checks.begin_cell(graded=True)
    with checks.check("the count, or the count built on the earlier answer", weight=1):
        checks.assert_or_carried(lambda want: checks.assert_integer(AlwaysEqual(3), want, "matmul_flops(2, 3, 4)"),
                                 48, 3)
    checks.end_cell()
    assert card.lying and card.share == 0.0, (
        "an int subclass is tampering (the cell scores zero), also where assert_or_carried tries a carried value")


def test_a_lying_answer_stays_tampering_when_a_test_helper_rewraps_its_error():
    def assert_count_with_hint(value, expected):  # the shape of Lab 3's _assert_count
        try:
            checks.assert_integer(value, expected, "matmul_flops(2, 3, 4)")
        except AssertionError as exc:
            raise AssertionError(f"{exc}. A multiply-add is 2 FLOPs.") from None

    card = checks.begin_cell(graded=True)
    with checks.check("public: matmul_flops(2, 3, 4)", weight=1):
        assert_count_with_hint(AlwaysEqual(24), 48)
    with checks.check("hidden sizes", weight=1):
        pass
    checks.end_cell()
    assert card.lying and card.share == 0.0, "a lying answer zeroes its cell, whatever helper re-raised its error"
