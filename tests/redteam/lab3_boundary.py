"""Red-team cases of Lab 3 against the grading boundary (issue 14): one per attack class, in three submissions.

Every attack rescues a WRONG answer on the question it aims at, so only the attack could make that question pass.
With partial credit (``tests/test_redteam_boundary.py``, scores read from the lab by ``boundary_cases``): an attack the
grader finds (the guard: a patched showtraceback, a function mode; the scan: a recording bypass) zeroes its cell; an
attack the boundary makes harmless without seeing it (frame and attribute oracles, an audit hook, the kernel's copy of
trusted data, a dispatcher override) earns what its wrong answer earns alone; every other question full marks.
Three submissions keep CI time down; each attack sits in the answer cell of its own question, or (carry-forward gaming,
issue 50) in a cell of its own after the test of the answer it redefines.
"""
from __future__ import annotations

from boundary_cases import BoundaryCase, answer, insert_after, with_answers


def _replaced(source: str, *pairs: tuple[str, str]) -> str:
    """``source`` with each (old, new) replaced; every ``old`` must occur (the reference answer changed otherwise)."""
    for old, new in pairs:
        assert old in source, f"the reference answer no longer contains {old!r}"
        source = source.replace(old, new)
    return source


# --- submission 1 -------------------------------------------------------------------------------------------------
# messaging-layer patch (Question 2.1): jupyter_client's Session never reports an error, and error replies read "ok";
# the answer forgets the factor 2.
MESSAGING_PATCH = '''from jupyter_client.session import Session

_real_send = Session.send


def _send_without_errors(self, stream, msg_or_type, content=None, *args, **kwargs):
    if msg_or_type == "error":
        return None
    if msg_or_type == "execute_reply" and isinstance(content, dict) and content.get("status") == "error":
        content = {**content, "status": "ok"}
    return _real_send(self, stream, msg_or_type, content, *args, **kwargs)


Session.send = _send_without_errors
get_ipython().showtraceback = lambda *args, **kwargs: None


def matmul_flops(M, K, N):
    return M * K * N
'''

# caller-frame oracle (Question 4.1): the answers read `expected` from the frames that call them, through
# sys._getframe (per layer) and through a traceback's tb_frame (total). Without a test frame (the tests run in the
# grader) they return 1: wrong, and not 0, which would make the student's own Question 4.3 divide by zero (a
# dependent question would then be charged for this one's mistake).
CALLER_FRAME_PER_LAYER = '''import sys


def _expected_from(frame):
    while frame is not None:
        value = frame.f_locals.get("expected")
        if type(value) is int:
            return value
        frame = frame.f_back
    return 1


def kv_cache_bytes_per_layer(B, N, D, bytes_per_element):
    return _expected_from(sys._getframe(1))
'''
CALLER_FRAME_TOTAL = '''def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):
    try:
        raise RuntimeError
    except RuntimeError as exc:
        return _expected_from(exc.__traceback__.tb_frame.f_back)
'''

# instance-attribute oracle (Question 2.3): the times are plain one-element tensors whose instance attribute `item`
# (which the contract's as_real calls) reads the test's expected value from assert_close's frame; the bound is right.
INSTANCE_ATTRIBUTE = '''import sys


def _peeking_number():
    value = torch.tensor(0.0, dtype=torch.float64)

    def item():
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_name == "assert_close":
                return float(frame.f_locals["expected"])
            frame = frame.f_back
        return 0.0

    value.item = item
    return value


def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    t_compute_s, t_memory_s = flops / peak_flops_per_s, bytes_moved / bandwidth_bytes_per_s
    return {key: _peeking_number() for key in
            ("intensity_flop_per_byte", "ridge_flop_per_byte", "t_compute_s", "t_memory_s", "t_roofline_s")} | {
        "bound": "compute" if t_compute_s > t_memory_s else "memory"}
'''

# audit hook (Question 6.3): when the source of a cell that tests expected_tokens_per_pass is compiled (or a test's
# kernel-side probe: all a test compiles in the kernel now), the hook makes the kernel's helpers agree (math.isclose,
# the contract's assert_close); the next source compiled (the guard's request after the cell) puts them back before
# the guard looks. The answer is a constant.
AUDIT_HOOK = '''import math
import sys

_saved = {}


def _around_test_cells(event, args):
    if event != "compile":
        return
    try:
        source = args[0].decode(errors="ignore") if isinstance(args[0], bytes) else args[0]
        if not isinstance(source, str):
            return  # an AST being compiled: the cell whose source was seen is about to run
        shell = get_ipython()
        test = "expected_tokens_per_pass" in source and "assert_close" in source or "<kernel_side" in str(args[1:2])
        if test and not _saved:
            _saved.update(isclose=math.isclose, check=shell.user_ns.get("assert_close"))
            math.isclose = lambda *a, **k: True
            shell.user_ns["assert_close"] = lambda *a, **k: None
        elif _saved:
            math.isclose = _saved.pop("isclose")
            shell.user_ns["assert_close"] = _saved.pop("check")
    except Exception:  # noqa: BLE001 - a hook must never raise
        pass


sys.addaudithook(_around_test_cells)


def expected_tokens_per_pass(alpha, gamma):
    return 1.0
'''


def _submission_1(reference):
    return with_answers(reference, {
        "q2_1_matmul_flops": MESSAGING_PATCH,
        "q4_1_kv_cache_bytes_per_layer": CALLER_FRAME_PER_LAYER,
        "q4_1_kv_cache_bytes_total": CALLER_FRAME_TOTAL,
        "q2_7_roofline_estimate": INSTANCE_ATTRIBUTE,
        "q6_3_expected_tokens_per_pass": AUDIT_HOOK,
    })


# --- submission 2 -------------------------------------------------------------------------------------------------
# function-mode hiding (Question 1.1): a TorchFunctionMode left active makes abs() zero and isclose() true; the
# answer scales the scores by 1/d instead of 1/sqrt(d).
FUNCTION_MODE = '''from torch.overrides import TorchFunctionMode


class _Agree(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "abs":
            return torch.zeros_like(args[0])
        if name == "isclose":
            return torch.ones_like(args[0], dtype=torch.bool)
        return func(*args, **(kwargs or {}))


_Agree().__enter__()


def causal_self_attention(q, k, v):
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / q.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
'''

# trusted-data mutation (Question 6.1): the kernel's copy of what the tests trust is changed (the default
# tolerances of the contract's assert_close, GPU_SPECS); the answer is all zeros.
TRUSTED_DATA = '''import utils

assert_close.__defaults__ = (1e9, 1e9, None)  # relative and absolute tolerance: anything is close
for _spec in utils.GPU_SPECS.values():
    for _key in list(_spec):
        if isinstance(_spec[_key], float):
            _spec[_key] *= 1000.0


def decode_time_breakdown_s(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    return {"weights_s": 0.0, "kv_cache_s": 0.0, "other_memory_s": 0.0, "compute_s": 0.0}
'''

# dispatcher hiding (Question 6.4): aten::abs on the CPU is overridden through torch.library to return zeros, so
# every deviation |frequency - p| reads 0; the answer draws a rejected draft's replacement from p, not the residual.
DISPATCHER = '''import torch.library

_aten = torch.library.Library("aten", "IMPL")
_aten.impl("abs", lambda self: torch.zeros(self.shape, dtype=self.dtype, device=self.device), "CPU")

'''


# what the prompt gives away (issue 50), Question 2.3: every number 0 and the bound the constant "memory" (its tie
# check paid 0.6/3 for it; now each bound check has a case a constant label fails).
CONSTANT_ESTIMATE = '''def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    return {"intensity_flop_per_byte": 0.0, "ridge_flop_per_byte": 0.0, "t_compute_s": 0.0, "t_memory_s": 0.0,
            "t_roofline_s": 0.0, "bound": "memory"}
'''


def _submission_2(reference):
    wrong_step = _replaced(answer(reference, "q6_4_speculative_step"),
                           ("residual = (p_next - q_padded[rows, num_accepted]).clamp_min(0)", "residual = p_next.clone()"))
    return with_answers(reference, {
        "q1_1_causal_attention": FUNCTION_MODE,
        "q6_1_decode_time_breakdown": TRUSTED_DATA,
        "q6_4_speculative_step": DISPATCHER + wrong_step,
        "q2_7_roofline_estimate": CONSTANT_ESTIMATE,
    })


# --- submission 3 -------------------------------------------------------------------------------------------------
# carry-forward gaming (issue 50): an earlier answer redefined after its own question was graded, so that a later
# question's carry-forward (which called the student's earlier function again) accepts a wrong later answer. Question
# 3.1's counts are 0 FLOPs and 7 bytes per layer, and layer_costs is redefined to rows of (0, 1) after Question 2.2's
# test (which graded the right one);
# Question 3.2's bounds are reversed, and roofline_estimate is wrapped after Question 2.3's test to reverse its bound.
# The later tests use the answers as their own questions graded them: Question 3.1 earns nothing, Question 3.2 keeps
# only its values check (its reversed bounds fail), every other question full marks (Question 5.1 accepts the counts
# Question 3.1 was graded with: a mistake is charged once).
ZERO_LAYER_COSTS = '''def layer_costs(B, N, D, H, bytes_per_element):
    return {op: (0, 1) for op in ("qkv_projection", "scores", "mask", "softmax", "attention_value", "output_projection",
                                  "mlp")}
'''
REVERSED_ESTIMATE = '''_graded_roofline_estimate = roofline_estimate


def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    estimate = dict(_graded_roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s))
    estimate["bound"] = "memory" if estimate["bound"] == "compute" else "compute"
    return estimate
'''


# What the prompt gives away (issue 50): Question 6.3's gamma + 1 whatever alpha is (its alpha = 1 check paid 0.5/2),
# Bonus 6.6's best_gamma always 0 (its public and tie checks paid 1.5 of 6); each of those checks now has a case a
# constant fails. Bonus 6.6 keeps only its speculative_speedup checks (that answer is the reference).
CONSTANT_TOKENS = "def expected_tokens_per_pass(alpha, gamma):\n    return float(gamma + 1)\n"
CONSTANT_GAMMA = "def best_gamma(alpha, cost_ratio, max_gamma):\n    return 0\n"


def _submission_3(reference):
    submission = with_answers(reference, {
        "q6_3_expected_tokens_per_pass": CONSTANT_TOKENS,
        "b6_6_best_gamma": CONSTANT_GAMMA,
        "q3_1_gpt2_forward_flops": "def gpt2_forward_flops(B, N, D, H, num_layers):\n    return 0\n",
        "q3_1_gpt2_forward_bytes": "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n    return 7 * num_layers\n",
        "q3_2_roofline_table": _replaced(answer(reference, "q3_2_roofline_table"),
                                         ('"compute" if t_compute_s > t_memory_s else "memory"',
                                          '"memory" if t_compute_s > t_memory_s else "compute"')),
    })
    submission = insert_after(submission, "q2_2_layer_costs_tests", ZERO_LAYER_COSTS)
    return insert_after(submission, "q2_7_roofline_estimate_tests", REVERSED_ESTIMATE)


CASES = [
    BoundaryCase(
        "boundary01_messages_frames_hooks",
        "messaging-layer patch (Session.send, showtraceback) on Question 2.1; caller-frame oracle (sys._getframe, "
        "tb_frame) on Question 4.1; instance-attribute oracle (Tensor.item read from the test's frame) on "
        "Question 2.3; audit hook patching helpers around test cells on Question 6.3",
        _submission_1,
        {"q2_1_matmul_tests", "q4_1_kv_cache_tests", "q6_3_expected_tokens_per_pass_tests"},
        # The guard finds the patched showtraceback (Q2.1); the oracles and the audit hook are not seen: Q2.3's
        # zero times keep the bound checks (the bound is right), Q4.1's and Q6.3's answers fail every check.
        keeps={"q2_7_roofline_estimate_tests": ("bound on hidden cases", "a tie")}),
    BoundaryCase(
        "boundary02_modes_data_dispatch",
        "function-mode hiding (a TorchFunctionMode faking abs and isclose) on Question 1.1; trusted-data "
        "mutation (assert_close's default tolerances, GPU_SPECS) on Question 6.1; dispatcher hiding "
        "(torch.library override of aten::abs) on Question 6.4; a constant answer (what the prompt gives away) on "
        "Question 2.3",
        _submission_2,
        {"q1_1_causal_attention_tests", "q6_1_decode_time_breakdown_tests", "q2_7_roofline_estimate_tests"},
        bypasses_recording=True,
        # The function mode is found (the guard; torch.overrides for the scan: every cell recording calls scores
        # zero). The trusted data and the dispatcher override change only the kernel's copies: Q6.1's zeros fail every
        # check, Q6.4's draft replaced from p instead of the residual loses only the two statistical checks it breaks.
        loses={"q6_4_speculative_step_tests": ("the first emitted token is distributed as the target",
                                               "every emitted token, the bonus included")}),
    BoundaryCase(
        "boundary03_carry_forward_redefined",
        "carry-forward gaming: layer_costs redefined after Question 2.2 was graded, to rescue wrong counts in "
        "Question 3.1; roofline_estimate's bound reversed after Question 2.3 was graded, to rescue reversed bounds in "
        "Question 3.2; constant answers (what the prompt gives away) on Question 6.3 and Bonus 6.6's best_gamma",
        _submission_3,
        {"q3_1_gpt2_forward_tests", "q6_3_expected_tokens_per_pass_tests"},
        keeps={"q3_2_roofline_table_tests": ("flops, bytes and the two times",),
               "b6_6_speculative_speedup_tests": ("public: speculative_speedup", "speculative_speedup on hidden",
                                                  "speculative_speedup at alpha = 1")}),
]
