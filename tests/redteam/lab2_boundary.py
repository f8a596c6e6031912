"""Red-team cases of Lab 2 against the grading boundary (issue 14): one case per attack class, in two submissions;
a third submission (issue 50) redefines earlier answers after they were graded and gives answers of the right form
that compute nothing.

Every attack comes with a wrong answer to the question it aims at, so that only the attack could make that question
pass; the rest of the submission is the reference solution, which must keep full marks. Before the boundary these
attacks worked because the hidden tests, their expected values and their comparisons ran in the student's kernel;
now they run in the grader, so each attack either finds nothing to read or changes only the kernel's own copies.
With partial credit: a function mode (the guard finds it; the scan sees ``torch.overrides``, a recording bypass)
zeroes its cell; the attacks nothing can see there earn what their wrong answers earn alone (``keeps``/``loses``,
read from the lab by ``boundary_cases.expected_scores``).
"""
from __future__ import annotations

from boundary_cases import BoundaryCase, answer, insert_after, with_answers

# -- wrong answers the attacks try to rescue ------------------------------------------------------------------------
WRONG_HBM_BYTES = '''def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    k = n if k is None else k
    return int((n * k + k * n) * bytes_per_element)  # forgets the (n, n) output and the relu's round trip
'''
# Counts 1 FLOP per multiply-add: exactly right if the H100's bf16 peak were half its datasheet value, which is
# what the trusted-data attack writes into the kernel's GPU_SPECS.
WRONG_SPEEDUP = '''def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    k = n if k is None else k
    flops = n * k * n
    matmul_s = max(flops / (peak_tflops * 1e12), (2 * n * k + n * n) * bytes_per_element / (bandwidth_tb_s * 1e12))
    return (matmul_s + 2 * n * n * bytes_per_element / (bandwidth_tb_s * 1e12)) / matmul_s
'''
WRONG_CHAIN_FLOPS = '''def chain_flops(seq_len, kv_head):
    return int(2 * seq_len * seq_len * kv_head)  # the first product only
'''
# Reads the test's expected value from a calling frame (sys._getframe, then a traceback's tb_frame); without one it
# returns the intensity of the inputs only (a wrong answer).
FRAME_ORACLE_INTENSITY = '''import sys


def _expected_from_callers(names=("want", "expected", "_ideal")):
    frame = sys._getframe(2)
    while frame is not None:
        for name in names:
            if isinstance(frame.f_locals.get(name), float):
                return frame.f_locals[name]
        frame = frame.f_back
    try:
        raise RuntimeError
    except RuntimeError as exc:
        frame = exc.__traceback__.tb_frame
    while frame is not None:
        for name in names:
            if isinstance(frame.f_locals.get(name), float):
                return frame.f_locals[name]
        frame = frame.f_back
    return None


def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    found = _expected_from_callers()
    if found is not None:
        return found
    return 4.0 * kv_head * seq_len * seq_len / (3 * seq_len * kv_head * bytes_per_element)
'''
# Block by block but without the max shift (exp overflows on the tests' scores): a plain torch.Tensor whose instance
# attribute `cpu`, which the tests call, returns the test's own expected value read from the caller's frame.
ATTRIBUTE_ORACLE_LSE = '''import sys


def _callers_value(name):
    frame = sys._getframe(2)
    while frame is not None:
        if name in frame.f_locals:
            return frame.f_locals[name]
        frame = frame.f_back
    return None


def blockwise_logsumexp(x, block_size):
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        total = total + torch.exp(x[..., start:start + block_size]).sum(dim=-1)
    lse = torch.log(total)
    plain = lse.clone()
    lse.cpu = lambda *args, **kwargs: _callers_value("want") if _callers_value("want") is not None else plain.cpu()
    return lse
'''
WRONG_CAUSAL_MASK = '''def causal_mask(seq_len, device=None):
    positions = torch.arange(seq_len, device=device)
    return (positions[None, :] <= positions[:, None]) & (positions[None, :] >= positions[:, None] - 1)  # 2 keys only
'''
TILED_FORWARD_WITHOUT_RESCALE = ("acc = acc * rescale[..., None] + ", "acc = acc + ")  # the output is never rescaled

# -- the attacks (student code cells inserted into the reference) ------------------------------------------------
# Messaging layer: every error the kernel reports (execute_reply status, error output) is turned into success.
MESSAGING_PATCH = '''import jupyter_client.session

_send = jupyter_client.session.Session.send


def _send_without_errors(self, stream, msg_or_type, content=None, *args, **kwargs):
    if isinstance(msg_or_type, dict):
        content = msg_or_type.get("content")
        msg_type = msg_or_type.get("header", {}).get("msg_type")
    else:
        msg_type = msg_or_type
    if msg_type == "error":
        return None
    if isinstance(content, dict) and content.get("status") == "error":
        content.clear()
        content.update(status="ok", execution_count=0, user_expressions={}, payload=[])
    return _send(self, stream, msg_or_type, content, *args, **kwargs)


jupyter_client.session.Session.send = _send_without_errors
'''
# Audit hook: when the test cell of Question 2.2 (or any kernel-side probe of a test: all a test compiles in this
# process) compiles, the helpers its comparisons use are made to agree (math.isclose and the contract's as_real,
# as_integer and assert_close, in checks and in the notebook's namespace), and put back when the next source text
# compiles (a check, a cell).
AUDIT_HOOK = '''import math
import sys

import checks

_names = ("as_real", "as_integer", "assert_close")
_real = {"isclose": math.isclose, **{name: getattr(checks, name) for name in _names}}
_patched = []


def _agree(value, *args, **kwargs):
    return value


def _hook(event, args):
    if event != "compile" or not args or not isinstance(args[0], (str, bytes)):
        return
    source = str(args[0])
    if "chain_flops(seq_len=" in source or "<kernel_side" in str(args[1:2]):  # a test compiles: patch until it ran
        math.isclose = lambda *a, **k: True
        for name in _names:
            setattr(checks, name, _agree)
            globals()[name] = _agree
        _patched.append(True)
    elif _patched:  # the next text compiled (a guard's check, the next cell): put everything back first
        math.isclose = _real["isclose"]
        for name in _names:
            setattr(checks, name, _real[name])
            globals()[name] = _real[name]
        _patched.clear()


sys.addaudithook(_hook)
'''
# Trusted data: the GPU table the public tests read (the H100's bf16 peak halved, which is what the wrong speedup
# assumes; one shared dict, so utils.GPU_SPECS changes too) and the copy module (a deepcopy that copies nothing).
TRUSTED_DATA = '''import copy

GPU_SPECS["H100-SXM"]["bf16_tflops"] = GPU_SPECS["H100-SXM"]["bf16_tflops"] / 2
copy.deepcopy = lambda value, memo=None: value
'''
# Function mode: a TorchFunctionMode left on the stack that makes every comparison of tensors say "equal" (isclose,
# equal, allclose) and every absolute difference zero.
FUNCTION_MODE = '''import torch
from torch.overrides import TorchFunctionMode


class _AllEqual(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("equal", "allclose"):
            return True
        if name == "isclose":
            return torch.ones(torch.broadcast_shapes(args[0].shape, args[1].shape), dtype=torch.bool,
                              device=args[0].device)
        if name == "abs":
            return torch.zeros_like(args[0])
        return func(*args, **(kwargs or {}))


_AllEqual().__enter__()
'''
# Dispatcher: ATen's own kernels of equal and isclose (so allclose) replaced through torch.library, below every
# Python mode and method the grading guard could watch.
DISPATCHER_OVERRIDE = '''import torch

_aten = torch.library.Library("aten", "IMPL")


def _always_equal(a, b):
    return True


def _all_close(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return torch.ones(torch.broadcast_shapes(a.shape, b.shape), dtype=torch.bool, device=a.device)


_aten.impl("equal", _always_equal, "CPU")
_aten.impl("isclose", _all_close, "CompositeImplicitAutograd")
'''


def messaging_frames_attributes(reference):
    """Messaging-layer patch (1.1), caller-frame oracle (2.3), instance-attribute oracle (4.1.2)."""
    nb = with_answers(reference, {"q1_1_hbm_bytes": WRONG_HBM_BYTES, "q2_3_chain_intensity": FRAME_ORACLE_INTENSITY,
                                  "q4_1_2_blockwise_lse": ATTRIBUTE_ORACLE_LSE})
    return insert_after(nb, "q1_1_hbm_bytes", MESSAGING_PATCH)


def hooks_data_modes_dispatcher(reference):
    """Trusted-data mutation (1.2), audit hook (2.2), dispatcher override (3.3), function-mode hiding (4.2)."""
    old, new = TILED_FORWARD_WITHOUT_RESCALE
    nb = with_answers(reference, {"q1_2_predicted_speedup": WRONG_SPEEDUP, "q2_2_chain_flops": WRONG_CHAIN_FLOPS,
                                  "q3_3_causal_mask": WRONG_CAUSAL_MASK,
                                  "q4_2_tiled_forward": answer(reference, "q4_2_tiled_forward").replace(old, new)})
    nb = insert_after(nb, "q1_2_predicted_speedup", TRUSTED_DATA)
    nb = insert_after(nb, "q2_2_chain_flops", AUDIT_HOOK)
    nb = insert_after(nb, "q3_3_causal_mask", DISPATCHER_OVERRIDE)
    return insert_after(nb, "q4_2_tiled_forward", FUNCTION_MODE)


# -- issue 50: carried answers are the answers as graded; a check earns nothing for what the prompt gives away --------
# An answer cell of a later question redefines the earlier function it builds on (after that function was graded),
# so that a carry-forward computed by calling the student's function again would accept the later wrong answer.
REDEFINED_FLOPS_INTENSITY = '''def chain_flops(seq_len, kv_head):  # redefined after Question 2.2 was graded: one product only
    return 2 * seq_len * seq_len * kv_head


def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    io_bytes = sum(chain_io_bytes(seq_len, kv_head, bytes_per_element))
    return chain_flops(seq_len, kv_head) / (io_bytes + intermediate_round_trips * 2 * seq_len * seq_len * bytes_per_element)
'''
REDEFINED_UPDATE_LSE = '''def online_softmax_update(running_max, running_sum, scores_block):  # redefined after 4.1.1: no rescale
    new_max = torch.maximum(running_max, scores_block.amax(dim=-1))
    shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
    return new_max, running_sum + torch.exp(scores_block - shift[..., None]).sum(dim=-1)


def blockwise_logsumexp(x, block_size):
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        running_max, running_sum = online_softmax_update(running_max, running_sum, x[..., start:start + block_size])
    return running_max + torch.log(running_sum)
'''
# An honest carry-forward: Question 1.1's bytes count the relu's round trip once (one mistake), and Question 1.2's
# answer builds on them: the mistake is charged in 1.1 only, 1.2 earns full marks.
ROUND_TRIP_ONCE_BYTES = '''def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    k = n if k is None else k
    return int((n * k + k * n + n * n + (0 if fused else n * n)) * bytes_per_element)  # the relu's round trip once
'''
SPEEDUP_ON_YOUR_BYTES = '''def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    k = n if k is None else k
    fused_bytes = relu_matmul_hbm_bytes(n, k, bytes_per_element, fused=True)
    relu_bytes = relu_matmul_hbm_bytes(n, k, bytes_per_element, fused=False) - fused_bytes
    matmul_s = max(2 * n * k * n / (peak_tflops * 1e12), fused_bytes / (bandwidth_tb_s * 1e12))
    return (matmul_s + relu_bytes / (bandwidth_tb_s * 1e12)) / matmul_s
'''
# Answers of the form the prompt gives away, built on the blank release: the right types and shapes, nothing computed.
RIGHT_FORM_GARBAGE = {
    "b2_5_reassociated_cost": "def reassociated_chain_cost(seq_len, kv_head, bytes_per_element=2):\n    return 0, 0\n",
    "q3_1_einsum_attention": "def einsum_attention(q, k, v, mask=None):\n    return q.clone()\n",
    "q3_2_attention_cost": ("def attention_cost(batch, seq_len, heads, head_dim, bytes_per_element=2, score_round_trips=0):\n"
                            "    return {\"flops\": 1, \"hbm_bytes\": 1, \"intensity\": 1.0}\n\n\neinsum_round_trips = 0\n"),
    "q3_3_causal_mask": ("def causal_mask(seq_len, device=None):\n"
                         "    return torch.zeros(seq_len, seq_len, dtype=torch.bool, device=device)\n"),
}


def carried_and_garbage(reference):
    """An honest carry-forward (1.2 on a wrong 1.1); later answers that redefine the earlier function they build on
    (2.3 on 2.2, 4.1.2 on 4.1.1); answers of the right form that compute nothing (2.5, 3.1, 3.2, 3.3)."""
    return with_answers(reference, {"q1_1_hbm_bytes": ROUND_TRIP_ONCE_BYTES, "q1_2_predicted_speedup": SPEEDUP_ON_YOUR_BYTES,
                                    "q2_3_chain_intensity": REDEFINED_FLOPS_INTENSITY,
                                    "q4_1_2_blockwise_lse": REDEFINED_UPDATE_LSE, **RIGHT_FORM_GARBAGE})


CASES = [
    BoundaryCase(
        "b2_messaging_frames_attributes",
        "messaging-layer patch (jupyter_client Session.send drops errors) on Question 1.1; caller-frame oracle "
        "(sys._getframe and a traceback's tb_frame) on Question 2.3; instance-attribute oracle (a plain tensor whose "
        "cpu() reads the test's frame) on Question 4.1.2",
        messaging_frames_attributes,
        {"q2_3_chain_intensity_tests", "q1_1_hbm_bytes_tests"},
        # Nothing here is seen as tampering: the messaging patch changes only the kernel, the oracles find no test
        # frame there. Q1.1's wrong byte count earns nothing (the check of k's position compares values too);
        # Q4.1.2's logsumexp without the max shift is right on ordinary scores and loses only the stability and -inf
        # checks.
        loses={"q4_1_2_blockwise_lse_tests": ("stability:", "-inf scores")},
    ),
    BoundaryCase(
        "b2_hooks_data_modes_dispatcher",
        "trusted-data mutation (GPU_SPECS, the copy module) on Question 1.2; audit hook that patches math.isclose and "
        "the contract's as_real/as_integer/assert_close while the test compiles on Question 2.2; torch.library override of aten::equal/isclose on "
        "Question 3.3; TorchFunctionMode faking isclose/equal/abs on Question 4.2",
        hooks_data_modes_dispatcher,
        {"q4_2_tiled_forward_tests"},
        # The function mode is found (the guard) and reaches torch.overrides (the scan: every cell that records calls
        # scores zero). The trusted data, the audit hook and the dispatcher override change only the kernel's copies:
        # each wrong answer keeps what it passes alone (the public checks of Q1.2 and Q2.2, Q3.3's device check).
        bypasses_recording=True,
        keeps={"q1_2_predicted_speedup_tests": ("public:",), "q2_2_chain_flops_tests": ("public:",),
               "q3_3_causal_mask_tests": ("created on the device asked for",)},
    ),
    BoundaryCase(
        "b2_carried_and_garbage",
        "an honest carry-forward (Question 1.2 built on a wrong 1.1); carry-forward gaming: Question 2.3's and 4.1.2's "
        "answers redefine chain_flops and online_softmax_update (wrong) after Questions 2.2 and 4.1.1 were graded; "
        "right-form garbage on Questions 2.5, 3.1, 3.2, 3.3 ((0, 0), q itself, a dict of ones, a mask of False)",
        carried_and_garbage,
        # The carried values are the earlier answers as graded, kept by the earlier question's test, and they reach
        # the later test in the grader: 1.2 built on 1.1's wrong bytes earns full marks (1.1 alone is charged: it
        # keeps its public check); the redefinitions rescue nothing: 2.3's intensity is wrong everywhere; 4.1.2's update
        # without the rescale loses every value check and keeps the block-by-block method and the one pass. The
        # garbage earns nothing: no check pays for the form the prompt gives away (nor for a device, a consistency
        # or an unchanged input without a value).
        {"q2_3_chain_intensity_tests", "b2_5_reassociated_cost_tests", "q3_1_einsum_attention_tests",
         "q3_2_attention_cost_tests", "q3_3_causal_mask_tests"},
        keeps={"q1_1_hbm_bytes_tests": ("public:",)},
        loses={"q4_1_2_blockwise_lse_tests": ("public:", "float64 scores", "stability:", "-inf scores")},
    ),
]
