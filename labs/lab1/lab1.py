# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: nbgrader,efficient_ai,deletable,editable,tags,-all
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Lab 1: Efficient AI Fundamentals
#
# In this lab you learn the basic vocabulary of efficient AI by measuring and analysing, piece by piece, one
# decoder layer of a small language model (Gemma-3).
#
# ## Learning objectives
# By the end of this lab you will be able to:
# 1. **measure latency** correctly, and **count MACs/FLOPs and bytes moved (I/O)** of a computation;
# 2. use the **roofline model** to tell whether a computation is limited by compute or by memory, measure the
#    ceilings your hardware really reaches, and place your own measured operators on it;
# 3. **profile** PyTorch code and read which kernels run on the device, and for how long;
# 4. explain **kernel launch overhead** and the tools that reduce it: kernel fusion, `torch.compile`, CUDA Graphs;
# 5. explain **why FlashAttention is faster** and lighter on memory than standard attention.
#
# ## How this notebook works
# - Run it top to bottom. It runs at one of three scales, which `utils.at_scale` reads to pick its sizes: on a GPU
#   the *teaching* scale (the sizes of the course); on a machine without a GPU the *cpu* scale (sizes at which a
#   laptop still shows each effect the lab teaches: fusion, launch overhead, the KV cache, the roofline's two
#   regimes; the whole notebook runs in a few minutes); and the *quick* scale (tiny sizes, which only check that
#   the code runs: the autograder always uses it). `EFFICIENT_AI_SCALE=teaching|cpu|quick` overrides the default.
# - What only a GPU can show (CUDA Graphs, FlashAttention's kernels) is skipped on a CPU with one printed line;
#   the course's numbers for it, measured on an H200, are in `measured_runs.md` beside this notebook (with a run
#   at cpu scale). Questions that need GPU numbers say what to answer from when you have no GPU.
# - Questions are numbered after the section they belong to: Question 3.4.2 is the second question of Section 3.4,
#   and a section with a single question gives it the section's number (Question 3.2, Question 5.1). Sections 3.3
#   and 4.1 have no question, so the numbers skip them; Part 1's questions are 1.1 to 1.4.
# - A cell that only uses one of your answers (a timing built on your `latency`, a table built on your attention)
#   says so in one line and moves on while that answer is not written yet, and so do the plot and profiling cells
#   you have not written yet: Run All stops only at the test cell of an unfinished answer, which names it.
# - Write your code where it says `YOUR CODE HERE` and your written answers where it says `YOUR ANSWER HERE`.
#   Keep the names and signatures we give you: the tests call them.
# - Cells that check your code show a few public tests; the grader runs more (hidden) tests on inputs you have
#   not seen. Passing the public tests is necessary, not sufficient: test your code on your own inputs too.
# - Units matter: latencies in seconds (`_s`) or milliseconds (`_ms`), sizes in bytes or GB, throughput in
#   TFLOP/s and TB/s. Variable names say which.
#
# ## Points
# Autograded questions have one right answer (a function, a formula, a number). Written answers and plots are
# graded by a TA.
#
# | Question | Topic | Points |
# | --- | --- | --- |
# | Question 1.1 | tri-loop `gemm` | 5 |
# | Question 1.2 | one-shot latency (written) and the warmed-up `latency` helper | 5 |
# | Question 1.3 | `gemm_mac` | 5 |
# | Question 1.4 | `gemm_io` | 5 |
# | Question 2.1.1 | gemm arithmetic intensity and roofline | 3 |
# | Question 2.1.2 | when does gemm become compute-bound? | 5 |
# | Question 2.2 | gemv arithmetic intensity and roofline | 4 |
# | Question 3.1.1 | attention from scratch | 6 |
# | Question 3.1.2 | MACs of attention | 4 |
# | Bonus 3.1 | MACs of the whole attention module | 5 |
# | Question 3.2 | I/O of attention | 5 |
# | Bonus 3.2 | I/O of the whole attention module (prefill, bf16) | 5 |
# | Question 3.4.1 | prefill vs decode bottleneck (written) | 5 |
# | Question 3.4.2 | decode batch-size sweep on the roofline | 3 |
# | Question 3.4.3 | prefill-length sweep on the roofline | 3 |
# | Question 3.5.1 | `roofline_point`: a measurement as a point on the roofline | 2 |
# | Question 3.5.2 | every operator of the MLP and attention, measured, on the measured roofline (plot) | 2 |
# | Question 3.5.3 | which operators are compute-bound; why the one-point MLP misled (written) | 3 |
# | Bonus 4.2 | profile the decode step of the decoder layer | 5 |
# | Question 4.3.1 | `gelu_tanh_python` | 3 |
# | Question 4.3.2 | GeLU latency: Python vs PyTorch | 2 |
# | Question 4.3.3 | GeLU findings (written) | 2 |
# | Question 4.3.4 | profiler evidence for the GeLU gap | 3 |
# | Question 4.4.1 | profile the compiled MLP | 5 |
# | Bonus 4.4.2 | profile the CUDA-Graph MLP | 5 |
# | Question 5.1 | the memory wall of standard attention (written) | 10 |
# | Question 5.2 | why FlashAttention is faster (written) | 10 |
# | **Total** | | **100 + 20 bonus** |
#
# Time per part: *your time* is our estimate for a student working through the part (reading, code, written
# answers); *run time* is how long the reference notebook's cells took at cpu scale on a 2-core machine busy with
# other work, with torch.compile's caches cold (`measured_runs.md` beside this notebook: 32 s in all, set-up
# included; most of Part 4's time is its two compiles, which announce themselves). Your machine may take longer
# or less: a first compile on a slow or busy CPU can take a minute or more. On the course's H200 at teaching scale
# the whole notebook ran in 121 s (`measured_runs.md`), most of Parts 3 and 4 in their two large compiles (the
# decode step and the MLP), on a machine running other labs at the same time.
#
# | Part | your time (estimate) | run time at cpu scale |
# | --- | --- | --- |
# | Part 1: latency, MACs and I/O | 1.5 h | about 1 s |
# | Part 2: the roofline model | 1 h | about 0.4 s |
# | Part 3: the Gemma-3 decoder layer, 3.1 to 3.4 | 2.75 h | about 5 s for all of Part 3 |
# | Part 3, Section 3.5: every operator measured on your roofline | 0.75 h | (in Part 3's 5 s) |
# | Part 4: profiling, fusion, `torch.compile` and CUDA Graphs | 2.5 h | about 15 s |
# | Part 5: FlashAttention | 1.5 h | about 4.5 s |

# %% nbgrader={"grade": false, "grade_id": "setup_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools
import logging
import math
import os
import sys
import time
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np  # noqa: F401 - for your own code
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, ".")  # utils.py sits beside the notebook (and at the repository root when run as a script)
from utils import *
from checks import *

quiet_library_messages()  # hide library messages you cannot act on (profiler start/stop lines, benign autotuning)
print_environment_report("lab1")

# Your functions that later cells use, and the question of each.
YOUR_FUNCTIONS = {"gemm": "Question 1.1", "latency": "Question 1.2", "scaled_dot_product_attention": "Question 3.1.1",
                  "roofline_point": "Question 3.5.1", "gelu_tanh_python": "Question 4.3.1"}
uses_answers = functools.partial(uses_answers, your_functions=YOUR_FUNCTIONS)  # utils: names your unwritten function

# %% nbgrader={"grade": false, "grade_id": "test_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["test-helpers"]
# Used by the test cells below: run this cell, and do not redefine what it defines. When grading, the tests run
# outside your kernel with the grader's own copy of this cell. Answers are compared through checks.py, which also
# holds the carry-forward (carried, assert_or_carried, keep_carried, kept_carried) and the device rule
# (assert_on_input_device).


ROOFLINE_NS = (1024, 2048, 4096, 8192)  # the N of Questions 2.1.1 and 2.2


@kernel_side
def own_gemm_counts(function, sizes):
    """In the kernel: the student's gemm_mac (function "gemm_mac") or gemm_io ("gemm_io") of float32 meta tensors,
    A (N, N) times B (N, N) and times x (N, 1): {N: (count of the GEMM, count of the GEMV)}; None when it raises.

    Questions 1.3 and 1.4 call it while they grade those answers, and keep what it returns for Questions 2.1.1 and
    2.2 (carry-forward of the answers as graded: checks.keep_carried)."""
    import torch

    own = gemm_mac if function == "gemm_mac" else gemm_io
    try:
        return {n: tuple(own(torch.empty(n, n, device="meta"), torch.empty(n, columns, device="meta"))
                         for columns in (n, 1))
                for n in sizes}
    except Exception:  # noqa: BLE001 - no earlier answer to carry forward
        return None


def keep_gemm_counts(function):
    """Keep the counts of the student's gemm_mac or gemm_io (own_gemm_counts), as whole numbers, for the
    carry-forward of Questions 2.1.1 and 2.2 (None when they raise or are not whole numbers)."""
    own = own_gemm_counts(function, ROOFLINE_NS)
    keep_carried(f"{function} on meta tensors",
                 lambda: {n: tuple(as_integer(count, function) for count in own[n]) for n in ROOFLINE_NS})


def gemma_config(hidden, n_h, n_kv, d):
    """A copy of the Gemma-3 270M configuration with other attention sizes (hidden size, query heads, key/value
    heads, head dimension)."""
    import copy

    cfg = copy.deepcopy(GEMMA3_270M_CONFIG)
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = hidden, n_h, n_kv, d
    return cfg


def bonus_3_1_modules():
    """The modules Bonus 3.1 tests, one list per check: (config, batch_size, query_len, kv_len)."""
    return [[(GEMMA3_270M_CONFIG, 2, 128, 128)],  # a prefill of the 270M model
            [(gemma_config(96, 6, 2, 24), 3, 17, 17), (gemma_config(48, 8, 8, 12), 2, 5, 5)],  # other configurations
            [(GEMMA3_270M_CONFIG, 4, 1, 301), (gemma_config(80, 4, 1, 40), 5, 1, 64),  # decode steps, a chunk
             (gemma_config(48, 8, 8, 12), 1, 7, 19)]]


def bonus_3_2_modules():
    """The prefills Bonus 3.2 tests, one list per check: (config, batch_size, query_len == kv_len)."""
    return [[(GEMMA3_270M_CONFIG, 2, 128), (GEMMA3_270M_CONFIG, 1, 37)],
            [(gemma_config(96, 6, 2, 24), 3, 17), (gemma_config(80, 4, 1, 40), 2, 64)],
            [(gemma_config(48, 8, 8, 12), 1, 5)]]  # multi-head attention


def attention_of(cfg, batch_size, query_len, kv_len):
    """(B, H, L_q, L_kv, D_h) of the attention inside one Gemma3Attention call: the arguments of calc_attn_mac and
    calc_attn_io that Bonus 3.1 and 3.2 carry forward."""
    return (batch_size, cfg.num_attention_heads, query_len, kv_len, cfg.head_dim)


def keep_attention_counts(function, own, shapes):
    """Keep own(*shape) (the student's calc_attn_mac or calc_attn_io, as its question grades it) for each shape, as
    whole numbers, for the carry-forward of Bonus 3.1 or 3.2 (None when it raises or is not a whole number)."""
    keep_carried(function, lambda: {shape: as_integer(own(*shape), f"{function}{shape}") for shape in shapes})


def carried_intensities(which):
    """The intensities 2 * MACs / bytes (which: 0 for the GEMMs, 1 for the GEMVs) from the student's gemm_mac and
    gemm_io as Questions 1.3 and 1.4 graded them (None when either is missing)."""
    macs, io = kept_carried("gemm_mac on meta tensors"), kept_carried("gemm_io on meta tensors")
    return carried(lambda: {n: 2 * macs[n][which] / io[n][which] for n in ROOFLINE_NS})

# %% [markdown]
# # Part 1: Fundamental metrics: latency, MACs and I/O
#
# Three numbers describe the cost of a computation:
# - **latency**: how long it takes on your hardware (seconds);
# - **MACs / FLOPs**: how much arithmetic it does (a property of the algorithm, not of the hardware);
# - **I/O**: how many bytes it moves between memory and the compute units.
#
# We start with the most common operator in deep learning, the matrix multiplication (GEMM: general matrix
# multiply), $C = AB$ with $A \in \mathbb{R}^{N \times K}$, $B \in \mathbb{R}^{K \times M}$,
# $C \in \mathbb{R}^{N \times M}$, $C_{ij} = \sum_{k} A_{ik} B_{kj}$.

# %% [markdown]
# #### Question 1.1 (5 points)
#
# Write `gemm(A, B)`, a matrix multiplication with three nested Python loops (over `i`, `j` and `k`, in any
# order), one multiply-add at a time.
#
# Rules (the tests check them):
# - no library routine that multiplies matrices or vectors: not `@`, `torch.matmul`, `mm`, `bmm`, `einsum`,
#   `tensordot`, `dot`, `inner`, `outer`, `mv`, `linear`, `addmm`, NumPy's equivalents, nor any of these
#   reached through an alias or `getattr`; no vectorised reduction such as `tensor.sum()` either;
# - write the loops inside `gemm` itself (no helper function);
# - an answer that breaks either rule above (it hands the product to the library) earns at most a quarter of
#   the points;
# - the result has shape `(N, M)` and the same `dtype` and `device` as `A` (create it on `A.device`: the tests
#   check this on a CPU too, with PyTorch's default device changed); it must match a float64 product to
#   `1e-4` (largest absolute error) for `float32` inputs of a few dozen elements, and to `1e-10` for `float64`.
#
# Tip: indexing a tensor element by element (`A[i, k]`) creates a small tensor every time, and on a GPU each
# `*` or `+` on such elements launches a kernel. Converting the inputs once to Python lists (`A.tolist()`) and
# building the result at the end (`torch.tensor(..., dtype=A.dtype, device=A.device)`) is much faster; both
# are accepted.

# %% nbgrader={"grade": false, "grade_id": "q1_1_gemm", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gemm(A, B):
    """Matrix product with three nested Python loops.

    Args:
        A (torch.Tensor): left matrix, shape (N, K), any floating dtype, any device.
        B (torch.Tensor): right matrix, shape (K, M), same dtype and device as A.

    Returns:
        torch.Tensor: C = A B, shape (N, M), with A's dtype and device.
    """
    ### BEGIN SOLUTION
    n_rows, inner = A.shape
    inner_b, n_cols = B.shape
    assert inner == inner_b, f"gemm: A is {tuple(A.shape)} but B is {tuple(B.shape)}"
    a, b = A.tolist(), B.tolist()  # one copy to Python floats instead of N*K*M tiny tensor operations
    c = [[0.0] * n_cols for _ in range(n_rows)]
    for i in range(n_rows):
        for j in range(n_cols):
            acc = 0.0
            for k in range(inner):
                acc += a[i][k] * b[k][j]
            c[i][j] = acc
    return torch.tensor(c, dtype=A.dtype, device=A.device)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_1_gemm_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# The value checks use CPU tensors on every grader; the device rule is one check of its own (hidden), the same on a
# CPU and on a GPU grader.
_A = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device="cpu")
_B = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 3.0]], device="cpu")
with check("gemm of a (3, 2) and a (2, 3) float32 matrix: the product, with A's shape (3, 3) and dtype", weight=2):
    assert_tensor_close(gemm(_A, _B), torch.tensor([[1.0, 2.0, 8.0], [3.0, 4.0, 18.0], [5.0, 6.0, 28.0]], dtype=torch.float64),
                        "gemm(A, B) of the (3, 2) @ (2, 3) example", rtol=0, atol=1e-4, dtype=_A.dtype)
del _A, _B
### BEGIN HIDDEN TESTS
def _q1_1_hidden_tests():
    forbidden = {
        "matmul", "mm", "bmm", "einsum", "tensordot", "addmm", "addmv", "addbmm", "baddbmm", "addr", "dot",
        "vdot", "inner", "outer", "ger", "mv", "linear", "bilinear", "chain_matmul", "multi_dot", "matrix_power",
        "__matmul__", "__rmatmul__", "__imatmul__", "_scaled_mm", "sum", "nansum",
    }

    @kernel_side
    def gemm_bytecode():
        """In the kernel: gemm's compiled code as data (best effort: it reads the kernel's gemm).

        Returns:
            list: one list per code object (gemm's own first, then the code objects nested in it), of
            (opname, name, target, nested, argrepr, offset) per instruction: name is the argument when it is a str,
            target when it is an int (a jump target), nested the index into this list of a nested code object;
            None otherwise.
        """
        import dis
        import inspect

        codes = [gemm.__code__]
        for code in codes:  # grows while it is walked: every code object nested in one already listed
            codes += [const for const in code.co_consts if inspect.iscode(const)]
        index = {id(code): i for i, code in enumerate(codes)}

        def fields(ins):
            value = ins.argval
            return (ins.opname, value if type(value) is str else None, value if type(value) is int else None,
                    index[id(value)] if inspect.iscode(value) else None, ins.argrepr, ins.offset)

        return [[fields(ins) for ins in dis.get_instructions(code)] for code in codes]

    @kernel_side
    def gemm_recorded(A, B):
        """In the kernel: gemm(A, B) and the sorted names of the torch functions it called (best effort)."""
        with record_torch_calls() as called:
            out = gemm(A, B)
        return out, sorted(called)

    def inputs(shape_a, shape_b, dtype, seed, transpose_b=False):
        """A and B on the CPU in dtype (every grader), and their float64 product (B a non-contiguous view if asked)."""
        gen = torch.Generator().manual_seed(seed)
        A = torch.randn(*shape_a, generator=gen, dtype=torch.float64)
        B = torch.randn(*(shape_b[::-1] if transpose_b else shape_b), generator=gen, dtype=torch.float64)
        if transpose_b:
            B = B.t()
        A_in = A.to(dtype=dtype)
        B_in = B.t().contiguous().to(dtype=dtype).t() if transpose_b else B.to(dtype=dtype)
        return A_in, B_in, A @ B

    cases = [((7, 11), (11, 5), torch.float32, 11, False), ((13, 9), (9, 6), torch.float32, 12, False),
             ((10, 8), (8, 1), torch.float32, 13, False),  # matrix-vector
             ((1, 1), (1, 1), torch.float32, 14, False), ((5, 6), (6, 4), torch.float64, 15, False),
             ((4, 9), (9, 5), torch.float32, 16, True)]  # B a transposed (non-contiguous) view

    with check("matches a float64 product to 1e-4 (float32) / 1e-10 (float64), with shape (N, M) and A's dtype, for "
               "other shapes (matrix-vector, 1 x 1, a transposed B)", weight=4):
        for shape_a, shape_b, dtype, seed, transpose_b in cases:
            A, B, expected = inputs(shape_a, shape_b, dtype, seed, transpose_b)
            where = f"A {tuple(shape_a)}, B {tuple(shape_b)}{' (a transposed view)' if transpose_b else ''}, {dtype}"
            assert_tensor_close(gemm(A, B), expected, f"gemm(A, B) for {where}", rtol=0,
                                atol=1e-4 if dtype == torch.float32 else 1e-10, dtype=dtype)

    with check("returns its result on A's device (device rule, also for tensors it creates; inputs on DEVICE)", weight=1):
        A, B = (t.to(DEVICE) for t in inputs((6, 5), (5, 4), torch.float32, 17)[:2])
        assert_on_input_device(gemm, (A, B), A.device, "gemm(A, B)")

    # The method of the question: when either check fails the cell earns at most a quarter (checks.SKIPPED_METHOD_SHARE).
    with check("uses no library product or reduction (@, matmul, mm, einsum, dot, .sum(), ...), however reached", weight=1,
               method=True):
        for shape_a, shape_b, dtype, seed, transpose_b in cases[:2]:  # behavioural, first: every torch
            # function it called (a recording switched off is tampering, checks.RecordingDisabled, whatever else fails)
            A, B, _ = inputs(shape_a, shape_b, dtype, seed, transpose_b)
            _, called = gemm_recorded(A, B)
            assert_calls(called, "gemm (a product of three nested loops, one multiply-add at a time)",
                         forbidden=forbidden)
        for instructions in gemm_bytecode():  # static: gemm's compiled code
            for opname, name, _, _, argrepr, _ in instructions:
                assert not (opname == "BINARY_MATRIX_MULTIPLY" or (opname == "BINARY_OP" and argrepr.startswith("@"))), (
                    "gemm must not use the @ operator")
                if name is None:
                    continue
                if opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "STORE_ATTR"):
                    assert name not in forbidden, f"gemm must not use .{name} (a library product or reduction)"
                if opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"):
                    assert name not in forbidden - {"sum"}, f"gemm must not call {name}()"  # built-in sum() is fine
                if opname in ("IMPORT_NAME", "IMPORT_FROM"):
                    assert name.split(".")[-1] not in forbidden, f"gemm must not import {name}"
                if opname in ("LOAD_CONST", "RETURN_CONST"):
                    assert name not in forbidden, f"gemm must not look up {name!r} (getattr of a product routine)"

    with check("computes C from A and B with three nested loops (over i, j and k) written inside gemm itself", weight=1,
               method=True):
        listing = gemm_bytecode()

        def loop_depth(which):
            """Deepest loop nesting of listing[which]: each backward jump closes a loop spanning [target, jump]."""
            instructions = listing[which]
            spans = {}
            for opname, _, target, _, _, offset in instructions:
                if "JUMP" in opname and target is not None and target < offset:
                    spans[target] = max(spans.get(target, offset), offset)  # `continue` joins its loop

            def depth_at(offset):
                return sum(1 for start, stop in spans.items() if start <= offset <= stop)

            best = max((depth_at(offset) for *_, offset in instructions), default=0)
            for opname, _, _, nested, _, offset in instructions:  # generator expressions are separate code objects,
                if opname == "LOAD_CONST" and nested is not None:  # made inside the loops
                    best = max(best, depth_at(offset) + loop_depth(nested))
            return best

        depth = loop_depth(0)
        assert depth >= 3, (
            "gemm must compute C with three nested loops (over i, j and k) written inside gemm itself; "
            f"found a loop nesting depth of {depth}")
        # Loops that compute nothing are not the method: C must change when A or when B changes.
        A, B, _ = inputs((4, 3), (3, 5), torch.float64, 18)
        C = as_tensor(gemm(A, B), "gemm(A, B)")
        for changed, A_in, B_in in (("A", A + 1, B), ("B", A, B + 1)):
            assert not torch.equal(C, as_tensor(gemm(A_in, B_in), "gemm(A, B)")), (
                f"gemm must compute C from A and B: its result did not change when {changed} changed")


_q1_1_hidden_tests()
del _q1_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.1")

# %% [markdown]
# ## Latency
#
# Latency is how long your program takes to run on your hardware: the most direct measure of efficiency, and
# a surprisingly easy one to get wrong.
#
# **Timing code on a GPU.** PyTorch runs GPU work *asynchronously*: a call such as `torch.matmul(a, b)` on CUDA
# tensors only *queues* a kernel on the GPU and returns to Python at once, long before the GPU has finished.
# Timing it with `time.perf_counter()` alone measures how long it took to *launch* the kernel. Two tools fix this:
# - `torch.cuda.synchronize()` blocks the CPU until every queued kernel has finished;
# - a **CUDA event** (`torch.cuda.Event(enable_timing=True)`) is a marker placed in the GPU's queue with
#   `event.record()`; the GPU writes a timestamp when it reaches the marker. `start.elapsed_time(end)` returns the
#   GPU time between two markers, in **milliseconds**, once both have been reached (so synchronize first).
#
# On a CPU everything runs synchronously, so `time.perf_counter()` (seconds) before and after the call is enough.
# `latency_one_time` below times one call, either way, and returns **seconds**.

# %% nbgrader={"grade": false, "grade_id": "latency_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false}
def synchronize_device():
    """Wait until all queued work on DEVICE has finished (a no-op on CPU, where work is synchronous)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def latency_one_time(fn, *args, **kwargs):
    """Time one call of fn.

    Args:
        fn (Callable): the function to time.
        *args: positional arguments for fn.
        **kwargs: keyword arguments for fn.

    Returns:
        float: elapsed time of the single call, in seconds.
    """
    synchronize_device()  # do not charge earlier queued work to this call
    if DEVICE.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args, **kwargs)
        end.record()
        torch.cuda.synchronize()  # wait until the GPU has reached `end`
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds
    start_s = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start_s


# %% [markdown]
# #### Question 1.2 (5 points)
#
# **(a) Written, 2 points.** Run the cell below: it times one call of your `gemm` and one of `torch.matmul`, five
# times in a row, from a fresh start. Describe what you see for each, and explain why one single measurement is not
# a reliable latency.

# %%
one_shot_size = at_scale(teaching=64, quick=24, cpu=64)
a_one_shot = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
b_one_shot = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
with uses_answers("Question 1.1"):
    for trial in range(5):
        gemm_one_shot_s = latency_one_time(gemm, a_one_shot, b_one_shot)
        matmul_one_shot_s = latency_one_time(torch.matmul, a_one_shot, b_one_shot)
        print(f"trial {trial}: gemm {gemm_one_shot_s * 1e3:9.3f} ms   torch.matmul {matmul_one_shot_s * 1e3:8.4f} ms")

# %% [markdown] nbgrader={"grade": true, "grade_id": "q1_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# What the run shows depends on the function. On the course's H200 (`measured_runs.md`, the printed output of this
# cell) the first `torch.matmul` took 91.0987 ms and the next four 0.0795 to 0.1365 ms, while the five `gemm` calls
# took 9.172 to 9.936 ms with no clear first-call effect: the first (9.936 ms) is barely above the slowest of the
# others (9.812 ms), well within their spread. The
# first `torch.matmul` pays one-time costs of the library: on a GPU creating the cuBLAS handle and loading its
# kernels, the caching allocator's first allocation; on a CPU loading and starting the BLAS library's threads.
# `gemm` is plain Python that does the same work in every call, so its first call costs about what the others do.
# The later calls still differ from each other (by several percent for `gemm`, by more for the sub-millisecond
# `torch.matmul`): the OS schedules other processes, CPU and GPU clocks change (boost, power and thermal limits),
# and for very short operations the timer's own overhead is a large part of the result. A single measurement
# therefore measures start-up effects (for some functions) and noise (for all of them) as much as the operation:
# warm up first, then repeat many times and report a mean or median (on a GPU, with proper synchronisation,
# otherwise you time only the kernel launch). The course's cpu-scale run (also in `measured_runs.md`), on a busy
# 2-core machine, shows the same pattern: the first `torch.matmul` took 0.5577 ms and the next four 0.0783 to
# 0.0872 ms, while `gemm` took 12.521 to 12.791 ms with no first-call effect (the first, 12.745 ms, in the middle).
# On a busier machine the noise can also hide the start-up cost altogether.
# === BEGIN MARK SCHEME ===
# 2 points in total. Judge against the student's own printed times:
# - 1 point: describes what their run shows: which function's first call is slower (typically torch.matmul's,
#   often by far; gemm's first call need not stand out, and a student who says so from their numbers is right)
#   and that the repeated one-shot times vary.
# - 1 point: a correct reason: one-time start-up costs of a library (initialisation, first allocation, loading
#   code; "warm-up") and/or run-to-run noise (other processes, clock changes, timer overhead); concludes that one
#   needs warm-up and many repetitions (mean/median). Claiming a large first-call effect that their own numbers do
#   not show costs this point only if it is the whole explanation.
# === END MARK SCHEME ===

# %% [markdown]
# **(b) Code, 3 points.** The standard way to measure latency is therefore to *warm up* (run the function a few
# times without timing it) and then average many timed runs. Write `latency(fn, *args, warmup=10, repeat=100,
# **kwargs)`:
# - call `fn(*args, **kwargs)` `warmup` times untimed, then `repeat` times timed (exactly `warmup + repeat`
#   calls in total), passing the arguments through unchanged;
# - return the **mean** time of one timed call (not the median or the minimum), in **seconds**, as a number (a
#   Python `float` is simplest): the warm-up calls are not part of it, neither in the timed interval nor in the
#   average;
# - write the timing yourself: not with a routine that does it for you (`benchmark_latency` from `utils`,
#   `torch.utils.benchmark`); an answer that hands it over earns at most a quarter of the points;
# - time with `time.perf_counter()` and synchronise with `synchronize_device()` from above: call it after the
#   warm-up, before you start the clock (so that the warm-up's queued work is not timed), and after the timed
#   call(s), before you read the clock (so that their queued work is). On a GPU this is what makes the timing see
#   the GPU's work; on a CPU it does nothing. Call it by its name (the tests replace it with a stand-in whose
#   queued work finishes only when it is called, so that the rule is checked on a CPU too; `torch.cuda.synchronize`
#   or CUDA events would be correct on a GPU but cannot be checked on a CPU grader, and do not pass).
#
# The hidden tests time a function whose warm-up calls are much slower than its timed calls, whose timed calls do
# not all take the same time (so that the mean differs from the median and the minimum), and, once, whose work is
# queued as on a GPU. They check that your result lies between the time the timed calls took (measured inside the
# function) and the time your `latency` spent after the warm-up's work ended, divided by `repeat`. Both bounds
# come from the same run, so a correct `latency` passes on a loaded machine too.

# %% nbgrader={"grade": false, "grade_id": "q1_2_latency", "locked": false, "schema_version": 3, "solution": true, "task": false}
def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    """Mean latency of fn after warm-up.

    Args:
        fn (Callable): the function to time.
        *args: positional arguments for fn.
        warmup (int): untimed calls made first.
        repeat (int): timed calls; the result is their mean.
        **kwargs: keyword arguments for fn.

    Returns:
        float: mean time of one call of fn, in seconds.
    """
    ### BEGIN SOLUTION
    for _ in range(warmup):
        fn(*args, **kwargs)
    synchronize_device()  # the warm-up's queued work is not part of the timing
    start_s = time.perf_counter()
    for _ in range(repeat):
        fn(*args, **kwargs)
    synchronize_device()  # wait for the timed calls' work before reading the clock
    return (time.perf_counter() - start_s) / repeat  # the mean of one timed call: total / repeat
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_2_latency_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _latency_calls():
    """In the kernel: latency of a function that records its calls; (the calls, latency's result)."""
    calls = []
    result = latency(lambda x, scale=1: calls.append((x, scale)), 7, warmup=2, repeat=3, scale=5)
    return calls, result


with check("latency(fn, 7, warmup=2, repeat=3, scale=5) calls fn(7, scale=5) exactly 5 times and returns a number",
           weight=2):
    _calls, _result = _latency_calls()
    assert len(_calls) == 5, (
        f"latency(fn, warmup=2, repeat=3) must call fn exactly 5 times, it called it {len(_calls)} times")
    assert all(call == (7, 5) for call in _calls), "latency must pass *args and **kwargs through to fn unchanged"
    as_real(_result, "latency(fn, ...) (seconds)")
del _latency_calls
### BEGIN HIDDEN TESTS
def _q1_2_hidden_tests():
    warmup, repeat, warmup_s = 3, 10, 0.02  # each warm-up call takes 10x a timed one: counting them moves the mean

    @kernel_side
    def run_latency(queued, warmup, repeat, warmup_s, timed_s):
        """In the kernel, next to the student's latency: time a probe with it and measure what the probe did.

        The probe's first `warmup` calls take warmup_s seconds each, its timed calls timed_s[0], timed_s[1], ... in
        turn. With queued=True the probe's work is queued as on a GPU: it runs only when synchronize_device() is
        called (latency's synchronize_device, and every alias of it, is replaced by a stand-in for the call, then
        put back), so a timing that does not synchronise where it must sees none of it, or the warm-up's.

        Returns:
            dict: "result" (what latency returned), "calls" (the probe's arguments, one (tag, factor) per call),
            "timed_s" (the duration of each timed call's work, seconds), "after_warmup_s" (the time from the end of
            the warm-up's work to latency's return, seconds, or None when that work ended after latency returned).
        """
        import time

        calls, queue, timed_took = [], [], []
        warmup_end = [None]

        def work(kind, seconds):
            start = time.perf_counter()
            time.sleep(seconds)
            end = time.perf_counter()
            if kind == "timed":
                timed_took.append(end - start)
            else:
                warmup_end[0] = end

        def probe(tag, *, factor):
            calls.append((tag, factor))
            number = len(calls) - 1
            kind = "warmup" if number < warmup else "timed"
            seconds = warmup_s if kind == "warmup" else timed_s[(number - warmup) % len(timed_s)]
            if queued:
                queue.append((kind, seconds))
            else:
                work(kind, seconds)

        namespace = latency.__globals__
        original = namespace.get("synchronize_device")
        aliases = [name for name, value in list(namespace.items()) if original is not None and value is original]

        def synchronize_stand_in():
            while queue:
                work(*queue.pop(0))
            original()

        for name in aliases:
            namespace[name] = synchronize_stand_in
        try:
            result = latency(probe, "t", warmup=warmup, repeat=repeat, factor=2.5)
            returned = time.perf_counter()
        finally:
            for name in aliases:
                namespace[name] = original
        while queue:  # work latency never waited for
            work(*queue.pop(0))
        ended = warmup_end[0]
        return {"result": result, "calls": calls, "timed_s": timed_took,
                "after_warmup_s": None if ended is None or ended > returned else returned - ended}

    def assert_mean_of_timed_calls(run, what, lower="shortest"):
        """The run called the probe warmup + repeat times, and latency's result lies within the run's own bounds.

        The lower bound is the shortest timed call's work (lower="shortest") or the mean of the timed calls' work
        (lower="mean"). Calls meant to take equal time use the shortest: their sleeps still differ by the machine's
        jitter (more on a loaded grader), so a mean, a median or a minimum of honestly timed calls each lies above it,
        and only the check of unequal calls (a 30 ms outlier, far above any jitter) tells the mean from them; a
        timing that misses the work (no synchronisation, a made-up constant) stays far below either bound.
        """
        calls = run["calls"]
        assert len(calls) == warmup + repeat, (
            f"latency(fn, warmup={warmup}, repeat={repeat}) must call fn exactly {warmup + repeat} times, "
            f"it called it {len(calls)} times")
        assert all(call == ("t", 2.5) for call in calls), "latency must forward *args and **kwargs to fn unchanged"
        result = as_real(run["result"], "latency(fn, ...)")
        durations = [as_real(t, "a timed call's duration") for t in run["timed_s"]]
        lower_s = sum(durations) / repeat if lower == "mean" else min(durations)
        took = "on average" if lower == "mean" else "each at least"
        assert run["after_warmup_s"] is not None, (
            f"{what}: the warm-up's queued work finished only after latency returned: latency must call "
            "synchronize_device() after the warm-up and after the timed calls")
        upper_s = as_real(run["after_warmup_s"], "the time after the warm-up") / repeat
        # lower_s: the mean duration of the timed calls' work; upper_s: all that latency did after the warm-up's
        # work ended, per timed call.
        assert lower_s * (1 - 1e-3) <= result <= upper_s * (1 + 1e-3) + 1e-6, (
            f"{what}: latency must return the mean time of ONE timed call in SECONDS, warm-up excluded: the {repeat} "
            f"timed calls took {lower_s!r} s {took} (the {warmup} warm-up calls {warmup_s} s each), and "
            f"latency spent {upper_s!r} s per timed call after the warm-up, so the result must lie between these "
            f"two; got {result!r}")
        return result

    with check("returns the mean time of one timed call in seconds, warm-up excluded (calls that take equal time)",
               weight=3):
        assert_mean_of_timed_calls(run_latency(False, warmup, repeat, warmup_s, [0.002]),
                                   "a function whose timed calls take 2 ms each")

    @kernel_side
    def default_calls():
        """In the kernel: how many calls latency(fn, "d", factor=1.0, repeat=2) makes."""
        calls = []
        latency(lambda tag, *, factor: calls.append((tag, factor)), "d", factor=1.0, repeat=2)
        return len(calls)

    with check("uses warmup=10 by default", weight=1):
        made = default_calls()
        assert made == 12, f"latency's default warmup must be 10: with repeat=2 expected 12 calls, got {made}"

    with check("returns the mean, not the median or the minimum (timed calls of unequal duration)", weight=1.5):
        durations = [0.002, 0.002, 0.002, 0.002, 0.03, 0.002, 0.002, 0.002, 0.002, 0.002]
        assert_mean_of_timed_calls(run_latency(False, warmup, repeat, warmup_s, durations),
                                   "a function whose timed calls take 2 ms each but one 30 ms (mean 4.8 ms, median "
                                   "and minimum 2 ms)", lower="mean")

    with check("synchronises with synchronize_device() after the warm-up and before reading the clock (work queued "
               "as on a GPU)", weight=1.5):
        assert_mean_of_timed_calls(run_latency(True, warmup, repeat, warmup_s, [0.002]),
                                   "a function whose work is queued as on a GPU and runs at synchronize_device()")

    timing_routines = {"benchmark_latency", "do_bench", "benchmark"}  # utils', Triton's, torch.utils.benchmark

    @kernel_side
    def latency_names():
        """In the kernel: the global and attribute names and the string constants of latency's compiled code (and
        of the code objects nested in it), sorted (best effort: it reads the kernel's latency)."""
        import inspect

        codes, names = [latency.__code__], set()
        for code in codes:  # grows while it is walked
            codes += [const for const in code.co_consts if inspect.iscode(const)]
            names |= set(code.co_names) | {const for const in code.co_consts if type(const) is str}
        return sorted(names)

    @kernel_side
    def latency_of_sleeps(durations_s):
        """In the kernel: latency(fn, warmup=1, repeat=2) of a function that sleeps durations_s[i] seconds, for each
        i; and whether latency called the notebook's benchmark_latency (under any name bound to it)."""
        import time

        namespace = latency.__globals__
        routine = namespace.get("benchmark_latency")
        aliases = [name for name, value in list(namespace.items()) if routine is not None and value is routine]
        used = []

        def stand_in(*args, **kwargs):
            used.append(True)
            return routine(*args, **kwargs)

        for name in aliases:
            namespace[name] = stand_in
        try:
            results = [latency(lambda: time.sleep(seconds), warmup=1, repeat=2) for seconds in durations_s]
        finally:
            for name in aliases:
                namespace[name] = routine
        return results, bool(used)

    # The method of the question: when it fails the cell earns at most a quarter (checks.SKIPPED_METHOD_SHARE).
    with check("times the calls itself (no timing routine such as benchmark_latency or torch.utils.benchmark): "
               "its result grows with the time fn takes", weight=3, method=True):
        used = sorted(set(latency_names()) & timing_routines)
        assert not used, (f"latency must time the calls itself with time.perf_counter() (the question's method), "
                          f"not with {used}")
        (fast, slow), routine_called = latency_of_sleeps([0.0, 0.02])
        assert not routine_called, ("latency must time the calls itself with time.perf_counter() (the question's "
                                    "method), not call benchmark_latency")
        fast, slow = as_real(fast, "latency of a function that returns at once"), as_real(
            slow, "latency of a function that sleeps 20 ms")
        assert slow > fast, (
            f"latency must measure fn: a function that sleeps 20 ms per call got {slow!r}, one that returns at once "
            f"{fast!r}")


_q1_2_hidden_tests()
del _q1_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.2")

# %% [markdown]
# Now let us compare the latency of matrix-matrix (GEMM) and matrix-vector (GEMV) multiplication with your
# `gemm` (this can take a little while).

# %%
a_mat = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
b_mat = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
v_vec = torch.randn(one_shot_size, 1, device=DEVICE)
with uses_answers("Question 1.1", "Question 1.2"):
    gemm_latency_s = latency(gemm, a_mat, b_mat, warmup=2, repeat=5)
    gemv_latency_s = latency(gemm, a_mat, v_vec, warmup=2, repeat=5)
    print(f"gemm ({one_shot_size}x{one_shot_size} @ {one_shot_size}x{one_shot_size}): {gemm_latency_s * 1e3:.3f} ms")
    print(f"gemv ({one_shot_size}x{one_shot_size} @ {one_shot_size}x1):  {gemv_latency_s * 1e3:.3f} ms")

# %% [markdown]
# A tri-loop matrix multiplication is very slow even for small matrices: Python runs one multiply-add at a time,
# with no parallelism, no vector instructions and no reuse of data in fast memory. `torch.matmul` calls a
# library (cuBLAS on NVIDIA GPUs, a BLAS such as oneDNN/MKL or OpenBLAS on CPUs) whose kernels tile the matrices
# into blocks that stay in registers and shared memory and keep thousands of cores busy. If you want to see how,
# read the [CUTLASS documentation](https://github.com/NVIDIA/cutlass) or the
# [Triton matrix multiplication tutorial](https://triton-lang.org/main/getting-started/tutorials/03-matrix-multiplication.html).
# Run the cell below to see the gap (sizes are small so that the tri-loop finishes; if your `gemm` indexes
# tensors element by element on a GPU it may take a few minutes).

# %%
gemm_sweep_sizes = at_scale(teaching=[16, 32, 64, 128], quick=[4, 8, 16], cpu=[16, 32, 64, 128])
gemm_sweep_latencies_s, matmul_sweep_latencies_s = [], []
with uses_answers("Question 1.1", "Question 1.2"):
    for size in progress(gemm_sweep_sizes, "matrix sizes"):
        a_sweep = torch.randn(size, size, device=DEVICE)
        b_sweep = torch.randn(size, size, device=DEVICE)
        gemm_sweep_latencies_s.append(latency(gemm, a_sweep, b_sweep, warmup=1, repeat=3))
        matmul_sweep_latencies_s.append(latency(torch.matmul, a_sweep, b_sweep, warmup=5, repeat=20))
        print(f"N={size:4d}: gemm {gemm_sweep_latencies_s[-1] * 1e3:10.3f} ms   "
              f"torch.matmul {matmul_sweep_latencies_s[-1] * 1e3:8.4f} ms   "
              f"ratio {gemm_sweep_latencies_s[-1] / matmul_sweep_latencies_s[-1]:,.0f}x")
    plot_gemm_torch_matmul_latency(gemm_sweep_sizes, gemm_sweep_latencies_s, matmul_sweep_latencies_s)
    plt.show()

# %% [markdown]
# ## MACs and FLOPs
#
# A **multiply-accumulate (MAC)** computes $a \leftarrow a + b \times c$: one multiplication and one addition.
# Dot products, and therefore matrix multiplications, are made of MACs, and hardware is built around them
# (tensor cores execute many MACs per cycle).
#
# **FLOPs** (floating-point operations) count every individual arithmetic operation: additions, subtractions,
# multiplications, divisions (and, by convention, each evaluation of a function such as `tanh` or `exp` is
# counted separately or ignored; we say which). One MAC is **2 FLOPs**.
#
# Careful with the spelling: *FLOPs* (a count of operations) is not *FLOP/s* (operations per second, a speed).
#
# #### Question 1.3 (5 points)
#
# Write `gemm_mac(x, y)`: the number of MACs needed to compute `x @ y`, for `x` of shape `(N, K)` and `y` of
# shape `(K, M)`, as a whole number (a Python `int` is simplest; any integer form is accepted). It depends on
# the shapes only, not on the values, dtype or device.

# %% nbgrader={"grade": false, "grade_id": "q1_3_gemm_mac", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gemm_mac(x, y):
    """MACs of a matrix product.

    Args:
        x (torch.Tensor): left matrix, shape (N, K).
        y (torch.Tensor): right matrix, shape (K, M).

    Returns:
        int: multiply-accumulate operations needed to compute x @ y.
    """
    ### BEGIN SOLUTION
    n_rows, inner = x.shape
    n_cols = y.shape[1]
    return int(n_rows * inner * n_cols)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_3_gemm_mac_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
with check("gemm_mac of two (512, 512) and of (512, 256) @ (256, 512) float32 matrices", weight=2):
    assert_integer(gemm_mac(torch.empty(512, 512, device="cpu"), torch.empty(512, 512, device="cpu")), 134217728,
                   "gemm_mac of (512, 512) @ (512, 512)", formula="N*K*M")
    assert_integer(gemm_mac(torch.empty(512, 256, device="cpu"), torch.empty(256, 512, device="cpu")), 67108864,
                   "gemm_mac of (512, 256) @ (256, 512)", formula="N*K*M")
### BEGIN HIDDEN TESTS
def _q1_3_hidden_tests():
    def assert_macs(cases, device="cpu"):
        for shape_x, shape_y, dtype in cases:
            x = torch.empty(*shape_x, device=device, dtype=dtype)
            y = torch.empty(*shape_y, device=device, dtype=dtype)
            assert_integer(gemm_mac(x, y), shape_x[0] * shape_x[1] * shape_y[1],
                           f"gemm_mac for x {shape_x} @ y {shape_y} ({dtype}, on {device})", formula="N*K*M")

    with check("N*K*M for non-square float32 shapes (N, K and M all different, a matrix-vector product)", weight=2):
        assert_macs([((3, 5), (5, 7), torch.float32), ((11, 2), (2, 13), torch.float32),
                     ((6, 17), (17, 1), torch.float32)])

    with check("depends on the shapes only: the same count for float16, bfloat16 and float64 inputs, and on the meta "
               "device (where Question 2.1.1 may evaluate it)", weight=2):
        assert_macs([((1, 9), (9, 4), torch.float16), ((8, 3), (3, 8), torch.bfloat16),
                     ((257, 129), (129, 65), torch.float64)])
        assert_macs([((512, 512), (512, 512), torch.float32), ((6, 17), (17, 1), torch.float32)], device="meta")

    keep_gemm_counts("gemm_mac")  # for Questions 2.1.1 and 2.2: gemm_mac as graded here


_q1_3_hidden_tests()
del _q1_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.3")

# %% [markdown]
# ## I/O
#
# I/O is memory traffic: the bytes an operation **reads** from the GPU's main memory (HBM: the inputs, the
# weights) plus the bytes it **writes** back (the outputs). We use this convention throughout the lab:
#
# > **Byte convention.** An operation reads each of its inputs from memory once and writes each of its outputs
# > once; an element costs `tensor.element_size()` bytes (4 for `float32`, 2 for `float16`/`bfloat16`, 8 for
# > `float64`). Caches are ignored: this is the traffic of an ideal kernel that never re-reads anything.
#
# #### Question 1.4 (5 points)
#
# Write `gemm_io(A, B)`: the bytes read and written by `C = A @ B` under this convention, for `A` of shape
# `(N, K)` and `B` of shape `(K, M)` of the same dtype; `C` has that dtype too. Return a whole number (a Python `int`). Use the
# tensors' element size; do not assume `float32`. Like `gemm_mac`, it depends on shapes and dtype only, not on values or
# device (`meta` tensors included).

# %% nbgrader={"grade": false, "grade_id": "q1_4_gemm_io", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gemm_io(A, B):
    """Bytes moved by a matrix product: read A and B once, write C once.

    Args:
        A (torch.Tensor): left matrix, shape (N, K).
        B (torch.Tensor): right matrix, shape (K, M), same dtype as A.

    Returns:
        int: bytes read plus bytes written to compute C = A @ B (C has A's dtype).
    """
    ### BEGIN SOLUTION
    n_rows, inner = A.shape
    n_cols = B.shape[1]
    elements = n_rows * inner + inner * n_cols + n_rows * n_cols  # read A, read B, write C
    return int(elements * A.element_size())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_4_gemm_io_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
with check("gemm_io of float32 (512, 512) @ (512, 512), (512, 256) @ (256, 512) and (128, 256) @ (256, 512)", weight=2):
    for _shape_a, _shape_b, _expected in [((512, 512), (512, 512), 3145728), ((512, 256), (256, 512), 2097152),
                                          ((128, 256), (256, 512), 917504)]:
        assert_integer(gemm_io(torch.empty(*_shape_a, device="cpu"), torch.empty(*_shape_b, device="cpu")), _expected,
                       f"gemm_io of float32 {_shape_a} @ {_shape_b} (bytes)", formula="4 bytes x (N*K + K*M + N*M)")
del _shape_a, _shape_b, _expected
### BEGIN HIDDEN TESTS
def _q1_4_hidden_tests():
    def assert_bytes(cases, device="cpu"):
        for shape_a, shape_b, dtype in cases:
            A = torch.empty(*shape_a, device=device, dtype=dtype)
            B = torch.empty(*shape_b, device=device, dtype=dtype)
            n, k, m = shape_a[0], shape_a[1], shape_b[1]
            bytes_per_element = torch.finfo(dtype).bits // 8
            assert_integer(gemm_io(A, B), bytes_per_element * (n * k + k * m + n * m),
                           f"gemm_io for A {shape_a} @ B {shape_b} in {dtype} on {device}",
                           formula=f"{bytes_per_element} bytes x (N*K + K*M + N*M) (read A and B once, write C once)")

    with check("bytes of other float32 shapes (non-square, a matrix-vector product)", weight=2):
        assert_bytes([((16, 16), (16, 16), torch.float32), ((64, 128), (128, 32), torch.float32),
                      ((10, 4), (4, 1), torch.float32)])

    with check("uses the tensors' element size: float16, bfloat16 (2 bytes) and float64 (8 bytes); the same on the "
               "meta device (where Question 2.1.1 may evaluate it)", weight=2):
        assert_bytes([((7, 3), (3, 5), torch.float16), ((5, 9), (9, 2), torch.bfloat16), ((6, 6), (6, 11), torch.float64)])
        assert_bytes([((512, 512), (512, 512), torch.float32), ((10, 4), (4, 1), torch.bfloat16)], device="meta")

    keep_gemm_counts("gemm_io")  # for Questions 2.1.1 and 2.2: gemm_io as graded here


_q1_4_hidden_tests()
del _q1_4_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.4")

# %% [markdown]
# # Part 2: The roofline model
#
# A computation on real hardware is limited by how fast the chip can do arithmetic (**peak FLOP/s**) and by how
# fast it can move data between memory and the compute units (**memory bandwidth**, bytes/s). The roofline
# model puts both limits in one picture.
#
# **Arithmetic intensity (AI)** is the work done per byte moved:
#
# $$ \text{AI} = \frac{\text{FLOPs}}{\text{bytes moved}} \quad [\text{FLOP/byte}] $$
#
# An operation with intensity AI can reach at most
#
# $$ \text{attainable FLOP/s} = \min\left(\text{peak FLOP/s},\ \text{bandwidth} \times \text{AI}\right). $$
#
# The two limits meet at the **ridge point** $\text{AI}^* = \text{peak FLOP/s} / \text{bandwidth}$:
# - left of the ridge ($\text{AI} < \text{AI}^*$) the operation is **memory-bound**: it waits for data, and
#   performance grows with bandwidth x AI;
# - right of it ($\text{AI} > \text{AI}^*$) it is **compute-bound**: it runs at (close to) peak FLOP/s.
#
# Every GPU has its own ridge point, and the same GPU has a different one per data type (tensor cores make
# bf16 much faster than fp32 while the bandwidth stays the same).
#
# ![The roofline model](assets/roofline.png)
#
# The cell below picks the specifications of your GPU from `GPU_SPECS` (datasheet figures: dense, without
# sparsity); without a GPU, or with one `GPU_SPECS` does not know, it uses the NVIDIA RTX A6000 of the original
# course.

# %%
gpu_name = detect_gpu(default="A6000")
gpu_spec = GPU_SPECS[gpu_name]
peak_fp32_tflops = gpu_spec["fp32_tflops"]
peak_bf16_tflops = gpu_spec["bf16_tflops"]
peak_bandwidth_tb_s = gpu_spec["memory_bandwidth_tb_s"]
print(f"GPU specifications used: {gpu_name}: fp32 {peak_fp32_tflops} TFLOP/s, bf16 {peak_bf16_tflops} TFLOP/s, "
      f"HBM bandwidth {peak_bandwidth_tb_s} TB/s")
print(f"ridge point: fp32 {get_ridge_point(gpu_name, torch.float32):.1f} FLOP/byte, "
      f"bf16 {get_ridge_point(gpu_name, torch.bfloat16):.1f} FLOP/byte")
roofline_sizes = [1024, 2048, 4096, 8192]

# %% [markdown]
# ## 2.1 The GEMM on the roofline
#
# #### Question 2.1.1 (3 points)
#
# Consider the square GEMM $C = AB$ with $A, B, C \in \mathbb{R}^{N \times N}$, all in `float32`, under the byte
# convention of Part 1 (read $A$ and $B$ once, write $C$ once).
#
# **(a) Code, 2 points.** Fill the dictionary `gemm_intensity_by_n` that maps each `N` in `roofline_sizes` to
# the arithmetic intensity of this GEMM in FLOP/byte (a number). FLOPs = 2 x MACs. Do it with formulas (or with
# your `gemm_mac` and `gemm_io` on `meta` tensors): there is no need to allocate 8192 x 8192 matrices. Values are accepted to a relative `1e-5` (`REL_TOL`), so
# float32 arithmetic (a one-element tensor, say) is fine.

# %% nbgrader={"grade": false, "grade_id": "q2_1_1_intensity", "locked": false, "schema_version": 3, "solution": true, "task": false}
gemm_intensity_by_n = {}
### BEGIN SOLUTION
for n in roofline_sizes:
    gemm_flops = 2 * n * n * n  # n^3 MACs, 2 FLOPs each
    gemm_bytes = 4 * (3 * n * n)  # read A and B, write C; fp32
    gemm_intensity_by_n[n] = gemm_flops / gemm_bytes
### END SOLUTION
print({n: round(ai, 1) for n, ai in gemm_intensity_by_n.items()})

# %% nbgrader={"grade": true, "grade_id": "q2_1_1_intensity_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# The keys the question gives earn nothing by themselves: without them the cell scores zero (outside any check).
assert set(as_dict(gemm_intensity_by_n, "gemm_intensity_by_n")) == {1024, 2048, 4096, 8192}, (
    f"gemm_intensity_by_n must have the keys 1024, 2048, 4096, 8192, got {list(gemm_intensity_by_n)}")
### BEGIN HIDDEN TESTS
def _q2_1_1_hidden_tests():
    sizes = ROOFLINE_NS
    formula = "FLOPs / bytes = 2N^3 / (4 * 3N^2) FLOP/byte (fp32, read A and B, write C)"
    with check("each value is the arithmetic intensity 2N^3 / (4 * 3N^2) FLOP/byte (to a relative 1e-5); built from "
               "your own gemm_mac and gemm_io, a mistake of theirs is not charged again", weight=2):
        assert_or_carried(
            lambda values: assert_reals_by_key(gemm_intensity_by_n, values, "gemm_intensity_by_n", formula=formula),
            {n: (2 * n ** 3) / (4 * 3 * n ** 2) for n in sizes},
            carried_intensities(0),  # your gemm_mac and gemm_io as Questions 1.3 and 1.4 graded them
            carried_from="your gemm_mac and gemm_io")


_q2_1_1_hidden_tests()
del _q2_1_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 2.1.1")

# %% [markdown]
# **(b) Plot, 1 point.** Plot these GEMMs on the roofline of your GPU with `plot_roofline(gpu_name,
# peak_tflops, peak_bandwidth_tb_s, operations, title=...)`, where `operations` maps a label to an arithmetic
# intensity. Use the fp32 peak: the matrices are `float32`.

# %% nbgrader={"grade": true, "grade_id": "q2_1_1_plot", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 2.1.1 (b)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 1 point in total, all three needed (half a point when one is missing):
    # - plot_roofline is called with the fp32 peak of the GPU in use (peak_fp32_tflops, not bf16) and its bandwidth;
    # - the four GEMMs (N = 1024..8192) are plotted from gemm_intensity_by_n (AI = N/6), labelled by N;
    # - the plot is shown, with a title naming the GPU (or an equivalent label); points sit right of the ridge.
    # A wrong AI from (a) is not penalised twice: judge the plot against the student's own values.
    # === END MARK SCHEME ===
    plot_roofline(gpu_name, peak_fp32_tflops, peak_bandwidth_tb_s,
                  {f"gemm N={n}": ai for n, ai in gemm_intensity_by_n.items()},
                  title=f"fp32 GEMM (N x N) @ (N x N) on {gpu_name}")
    plt.show()
    ### END SOLUTION

# %% [markdown]
# #### Question 2.1.2 (5 points)
#
# From which `N` on is the fp32 square GEMM compute-bound? The answer depends on the GPU, so write it as a
# function of the GPU, and use it for an **NVIDIA RTX A6000** (the GPU of the original course) and for yours.
#
# **(a) Code, 3 points.** Write `gemm_compute_bound_n(gpu_name)`: the smallest integer `N` whose arithmetic
# intensity reaches the fp32 ridge point of `GPU_SPECS[gpu_name]` (AI >= ridge), as a whole number (a Python `int`). Read the
# specifications from `GPU_SPECS`; the tests call it for every GPU there. Where `N / 6` equals the ridge point
# exactly in real arithmetic, floating-point rounding may give that `N` or `N + 1`: both are accepted.

# %% nbgrader={"grade": false, "grade_id": "q2_1_2_threshold", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gemm_compute_bound_n(gpu_name):
    """Smallest N from which the fp32 N x N GEMM is compute-bound on a GPU.

    Args:
        gpu_name (str): a key of GPU_SPECS, e.g. "A6000".

    Returns:
        int: the smallest integer N whose arithmetic intensity (FLOP/byte) reaches the GPU's fp32 ridge point.
    """
    ### BEGIN SOLUTION
    spec = GPU_SPECS[gpu_name]
    ridge_fp32 = spec["fp32_tflops"] / spec["memory_bandwidth_tb_s"]  # (1e12 FLOP/s) / (1e12 B/s) = FLOP/byte
    # AI(N) = 2 N^3 / (4 * 3 N^2) = N / 6 >= ridge  <=>  N >= 6 * ridge
    return math.ceil(6 * ridge_fp32)
    ### END SOLUTION


print(f"fp32 GEMM is compute-bound on an A6000 from N = {gemm_compute_bound_n('A6000')}, "
      f"on the {gpu_name} from N = {gemm_compute_bound_n(gpu_name)}")

# %% nbgrader={"grade": true, "grade_id": "q2_1_2_threshold_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _compute_bound_n_without_gpu(names):
    """In the kernel: gemm_compute_bound_n(name) for each name, called as on a machine without a GPU (torch.cuda
    reports none, and the notebook's gpu_name, gpu_spec, peak_* globals hold what the cell above sets without a GPU,
    the A6000's, while it runs; all are put back after), so that the result cannot depend on the grader's GPU: an
    answer that reads this machine's GPU instead of gpu_name scores the same on a CPU and on a GPU grader.

    Returns:
        dict: name -> ("value", what it returned) or ("error", "Type: message").
    """
    import torch

    def no_gpu(*args, **kwargs):
        raise RuntimeError("no CUDA GPU (the tests call gemm_compute_bound_n as on a machine without one)")

    stand_ins = {"is_available": lambda: False, "device_count": lambda: 0, "get_device_name": no_gpu,
                 "get_device_properties": no_gpu, "current_device": no_gpu, "get_device_capability": no_gpu}
    saved = {attr: getattr(torch.cuda, attr) for attr in stand_ins}
    namespace = gemm_compute_bound_n.__globals__
    spec = GPU_SPECS["A6000"]
    no_gpu_globals = {"gpu_name": "A6000", "gpu_spec": spec, "peak_fp32_tflops": spec["fp32_tflops"],
                      "peak_bf16_tflops": spec["bf16_tflops"], "peak_bandwidth_tb_s": spec["memory_bandwidth_tb_s"]}
    saved_globals = {key: namespace[key] for key in no_gpu_globals if key in namespace}
    results = {}
    try:
        for attr, stand_in in stand_ins.items():
            setattr(torch.cuda, attr, stand_in)
        namespace.update({key: value for key, value in no_gpu_globals.items() if key in saved_globals})
        for name in names:
            try:
                results[name] = ("value", gemm_compute_bound_n(name))
            except Exception as exc:  # noqa: BLE001 - reported by the check that asked for this GPU
                results[name] = ("error", f"{type(exc).__name__}: {exc}")
    finally:
        for attr, original in saved.items():
            setattr(torch.cuda, attr, original)
        namespace.update(saved_globals)
    return results


def _compute_bound_n(name):
    """gemm_compute_bound_n(name), called in the kernel as on a machine without a GPU; raises when it raised."""
    kind, value = _compute_bound_n_without_gpu([name])[name]
    assert kind == "value", f"gemm_compute_bound_n({name!r}) raised {value}"
    return value


# A whole number is what the question asks for: it earns nothing by itself (outside any check), the hidden checks
# of its value earn the points.
as_integer(_compute_bound_n("A6000"), "gemm_compute_bound_n('A6000')")
### BEGIN HIDDEN TESTS
def _q2_1_2_hidden_tests():
    def assert_threshold(name):
        spec = GPU_SPECS[name]
        ridge = (spec["fp32_tflops"] * 1e12) / (spec["memory_bandwidth_tb_s"] * 1e12)  # FLOP/byte
        threshold = 6 * ridge  # AI(N) = 2N^3 / (12 N^2) = N / 6
        nearest = round(threshold)
        accepted = {nearest, nearest + 1} if abs(threshold - nearest) < 1e-9 else {math.ceil(threshold)}
        got = as_integer(_compute_bound_n(name), f"gemm_compute_bound_n({name!r})")
        assert got in accepted, (
            f"on a {name} (fp32 {spec['fp32_tflops']} TFLOP/s, {spec['memory_bandwidth_tb_s']} TB/s) the ridge point "
            f"is {ridge!r} FLOP/byte and the fp32 N x N GEMM has AI = 2N^3 / (4 * 3N^2) = N/6 FLOP/byte, so the "
            f"smallest compute-bound N is {min(accepted)}; gemm_compute_bound_n({name!r}) returned {got}")

    with check("the smallest N with N/6 >= the fp32 ridge point on an A6000", weight=2):
        assert_threshold("A6000")

    with check("a function of the GPU: right for every other GPU of GPU_SPECS, not only the A6000 or this machine's",
               weight=1.5):
        for name in sorted(GPU_SPECS):
            assert_threshold(name)


_q2_1_2_hidden_tests()
del _q2_1_2_hidden_tests
### END HIDDEN TESTS
del _compute_bound_n_without_gpu, _compute_bound_n
finish_checks("Question 2.1.2")

# %% [markdown]
# **(b) Written, 2 points.** Give the derivation: the FLOPs and bytes of the GEMM as functions of `N`, its
# arithmetic intensity, the A6000's ridge point with units, and the resulting condition on `N`. Then say what
# it means for the four sizes of Question 2.1.1.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q2_1_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# FLOPs $= 2N^3$ ($N^3$ MACs). Bytes $= 4 \cdot 3N^2 = 12N^2$ (read $A$ and $B$, write $C$, 4 bytes each).
# So $\text{AI}(N) = 2N^3 / 12N^2 = N/6$ FLOP/byte: it grows linearly with $N$ because every element loaded is
# reused $N$ times. The A6000's fp32 ridge point is $38.7 \cdot 10^{12}\ \text{FLOP/s} / 0.768 \cdot 10^{12}\
# \text{B/s} \approx 50.4$ FLOP/byte. Compute-bound when $N/6 \ge 50.4$, i.e. $N \ge 302.3$: from
# $N = 303$ on. All four sizes (1024 to 8192, AI 171 to 1365 FLOP/byte) are far right of the ridge: they are
# compute-bound, and a good kernel runs them near peak fp32 throughput.
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: AI(N) = 2N^3 / (12 N^2) = N/6 FLOP/byte, with FLOPs and bytes stated.
# - 1 point: ridge = peak / bandwidth (about 50 FLOP/byte for the A6000's datasheet fp32 figures in
#   GPU_SPECS), hence N >= 6 x ridge (about 303), and the conclusion that N = 1024..8192 are compute-bound.
# Accept the numbers implied by the GPU_SPECS values printed in the notebook.
# === END MARK SCHEME ===

# %% [markdown]
# ## 2.2 The GEMV on the roofline
#
# #### Question 2.2 (4 points)
#
# Now the matrix-vector product (GEMV) $y = Ax$ with $A \in \mathbb{R}^{N \times N}$ and
# $x, y \in \mathbb{R}^{N \times 1}$, in `float32`, same convention (read $A$ and $x$ once, write $y$ once).
#
# **(a) Code, 1 point.** Fill `gemv_intensity_by_n` (`N` -> FLOP/byte) for `N` in `roofline_sizes`, accepted
# to a relative `1e-5` as in Question 2.1.1.

# %% nbgrader={"grade": false, "grade_id": "q2_2_intensity", "locked": false, "schema_version": 3, "solution": true, "task": false}
gemv_intensity_by_n = {}
### BEGIN SOLUTION
for n in roofline_sizes:
    gemv_flops = 2 * n * n  # n^2 MACs
    gemv_bytes = 4 * (n * n + n + n)  # read A and x, write y; fp32
    gemv_intensity_by_n[n] = gemv_flops / gemv_bytes
### END SOLUTION
print({n: round(ai, 4) for n, ai in gemv_intensity_by_n.items()})

# %% nbgrader={"grade": true, "grade_id": "q2_2_intensity_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# The keys the question gives earn nothing by themselves: without them the cell scores zero (outside any check).
assert set(as_dict(gemv_intensity_by_n, "gemv_intensity_by_n")) == {1024, 2048, 4096, 8192}, (
    f"gemv_intensity_by_n must have the keys 1024, 2048, 4096, 8192, got {list(gemv_intensity_by_n)}")
### BEGIN HIDDEN TESTS
def _q2_2_hidden_tests():
    sizes = ROOFLINE_NS
    formula = "2N^2 / (4 (N^2 + N + N)) FLOP/byte (fp32, read A and x, write y)"
    with check("each value is the arithmetic intensity 2N^2 / (4 (N^2 + 2N)) FLOP/byte (to a relative 1e-5); built "
               "from your own gemm_mac and gemm_io, a mistake of theirs is not charged again", weight=2):
        assert_or_carried(
            lambda values: assert_reals_by_key(gemv_intensity_by_n, values, "gemv_intensity_by_n", formula=formula),
            {n: (2 * n ** 2) / (4 * (n ** 2 + 2 * n)) for n in sizes},
            carried_intensities(1),  # your gemm_mac and gemm_io as Questions 1.3 and 1.4 graded them
            carried_from="your gemm_mac and gemm_io")


_q2_2_hidden_tests()
del _q2_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 2.2")

# %% [markdown]
# **(b) Plot, 1 point.** Plot the GEMVs on your GPU's fp32 roofline.

# %% nbgrader={"grade": true, "grade_id": "q2_2_plot", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 2.2 (b)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 1 point: the four GEMVs from gemv_intensity_by_n on the fp32 roofline of the GPU in use (fp32 peak,
    # its bandwidth), labelled and shown. All four sit near 0.5 FLOP/byte on the sloped, memory-bound part.
    # === END MARK SCHEME ===
    plot_roofline(gpu_name, peak_fp32_tflops, peak_bandwidth_tb_s,
                  {f"gemv N={n}": ai for n, ai in gemv_intensity_by_n.items()},
                  title=f"fp32 GEMV (N x N) @ (N x 1) on {gpu_name}")
    plt.show()
    ### END SOLUTION

# %% [markdown]
# **(c) Written, 2 points.** Describe your findings: where do the GEMVs sit, how does their intensity change
# with `N`, and why is it so different from the GEMM's?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q2_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# All GEMVs sit at the same point, about 0.5 FLOP/byte, far left of the ridge (about 50 FLOP/byte for fp32 on
# an A6000): they are strongly memory-bound at every size, and can reach at most bandwidth x 0.5, about 1% of
# the fp32 peak. The intensity is $2N^2 / (4(N^2 + 2N)) \to 0.5$: it does not grow with $N$, because each
# element of $A$ is loaded once and used in a single multiply-add; there is no reuse. In the GEMM each loaded
# element is reused $N$ times, so its intensity grows as $N/6$. Making a GEMV faster means moving fewer bytes
# (smaller data types, batching several vectors into a GEMM), not more FLOP/s.
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: GEMV is memory-bound at all sizes, with AI about 0.5 FLOP/byte (constant in N), far below the ridge.
# - 1 point: the reason: no data reuse (each matrix element used once), unlike GEMM whose AI grows with N.
# === END MARK SCHEME ===

# %% [markdown]
# # Part 3: Case study: the Gemma-3 decoder layer
#
# We now analyse one decoder layer of [gemma-3-270m-it](https://huggingface.co/google/gemma-3-270m-it), a small
# instruction-tuned language model. We build it from its configuration (`GEMMA3_270M_CONFIG` in `utils.py`)
# with random weights: costs do not depend on the weights' values, so nothing is downloaded.
#
# In the order of the forward pass, a decoder layer is:
# - **input RMSNorm**
# - **self-attention**: query/key/value projections, query and key RMSNorm, rotary position embedding (RoPE),
#   the attention itself, output projection
# - **post-attention RMSNorm**, then the residual addition
# - **pre-MLP RMSNorm**
# - **MLP**: gate projection, up projection, GeLU activation, elementwise product, down projection
# - **post-MLP RMSNorm**, then the residual addition
#
# The code below is a compact version of the Hugging Face implementation. The `record_function` blocks only
# name regions for the profiler (Part 4). You do not need to understand every line now; we take it apart below.
# Two details of this teaching version: the attention takes a flag `use_kv_cache`; with it, the first call
# stores the keys and values of layer `layer_idx` in `past_key_values` (a cache whose memory is allocated once,
# for the longest sequence), and later calls write their new keys and values into it in place and attend over
# everything cached so far. Without it, it recomputes keys and values for all earlier tokens
# (`prefill_hidden_states`) at every step.

# %% nbgrader={"grade": false, "grade_id": "gemma3_decoder_layer", "locked": true, "schema_version": 3, "solution": false, "task": false}
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gemma3.configuration_gemma3 import Gemma3TextConfig


class GELUTanh(nn.Module):
    """GeLU with the tanh approximation, as PyTorch's fused kernel computes it."""

    def __init__(self):
        super().__init__()
        self.act = functools.partial(F.gelu, approximate="tanh")

    def forward(self, input):
        return self.act(input)


def rotate_half(x):
    """Rotate the two halves of the last dimension: (x1, x2) -> (-x2, x1)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Apply RoPE to q (B, n_h, L, d) and k (B, n_kv, L, d) with cos/sin of shape (B, L, d)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class Gemma3MLP(nn.Module):
    """Gated MLP: down_proj(gelu(gate_proj(x)) * up_proj(x)); x and the output are (B, L, D)."""

    def __init__(self, config: Gemma3TextConfig):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.intermediate_size = config.intermediate_size
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        self.act_fn = GELUTanh()

    def forward(self, x):
        with record_function("gate_proj"):
            gate = self.gate_proj(x)
        with record_function("up_proj"):
            up_x = self.up_proj(x)
        with record_function("act_fn"):
            gate_up = self.act_fn(gate) * up_x
        with record_function("down_proj"):
            down_proj = self.down_proj(gate_up)
        return down_proj


class Gemma3RMSNorm(nn.Module):
    """RMSNorm computed in float32, with Gemma's (1 + weight) scale."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class Gemma3Attention(nn.Module):
    """Grouped-query self-attention with RMSNorm on queries and keys, RoPE, and an optional KV cache."""

    def __init__(self, config: Gemma3TextConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.query_pre_attn_scalar ** -0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = True
        self.sliding_window = None  # this teaching layer always uses full attention
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias)
        self.q_norm = Gemma3RMSNorm(dim=self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Gemma3RMSNorm(dim=self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, use_kv_cache=True,
                past_key_values: Optional[KVCache] = None, cache_position=None, prefill_hidden_states=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        with record_function("q_proj"):
            query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        query_states = self.q_norm(query_states)
        cos, sin = position_embeddings

        if use_kv_cache:
            with record_function("k_proj"):
                key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            with record_function("v_proj"):
                value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
            key_states = self.k_norm(key_states)
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
            assert past_key_values is not None, "use_kv_cache=True needs past_key_values"
            # Prefill: store this layer's keys and values in the preallocated cache. Decode: write the new
            # token's key and value into the cache in place, and attend over the cached tokens plus the new one.
            key_states, value_states = past_key_values.layers[self.layer_idx].update(key_states, value_states)
        else:
            assert prefill_hidden_states is not None, "use_kv_cache=False needs prefill_hidden_states"
            all_hidden_states = torch.cat([prefill_hidden_states, hidden_states], dim=1)
            full_shape = (*all_hidden_states.shape[:-1], -1, self.head_dim)
            key_states = self.k_proj(all_hidden_states).view(full_shape).transpose(1, 2)
            value_states = self.v_proj(all_hidden_states).view(full_shape).transpose(1, 2)
            key_states = self.k_norm(key_states)
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

        attention_interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        with record_function("attn_op"):
            attn_output, _ = attention_interface(
                self, query_states, key_states, value_states, attention_mask,
                dropout=self.attention_dropout if self.training else 0.0, scaling=self.scaling,
                sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Gemma3RotaryEmbedding(nn.Module):
    """RoPE tables (cos, sin) for the positions in position_ids."""

    def __init__(self, config, device=None, layer_type="full_attention"):
        super().__init__()
        self.config = config
        base = config.rope_parameters[layer_type]["rope_theta"]
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
        self.register_buffer(f"{layer_type}_inv_freq", inv_freq, persistent=False)
        setattr(self, f"{layer_type}_attention_scaling", 1.0)

    @torch.no_grad()
    def forward(self, x, position_ids, layer_type="full_attention"):
        inv_freq = getattr(self, f"{layer_type}_inv_freq")
        attention_scaling = getattr(self, f"{layer_type}_attention_scaling")
        inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        position_ids_expanded = position_ids[:, None, :].float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * attention_scaling
            sin = emb.sin() * attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Gemma3DecoderLayer(nn.Module):
    """One decoder layer: pre/post-normalised attention and MLP blocks, each with a residual connection."""

    def __init__(self, config: Gemma3TextConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        self.layer_idx = layer_idx
        self.attention_type = "full_attention"
        self.self_attn = Gemma3Attention(config=config, layer_idx=layer_idx)
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = Gemma3RMSNorm(self.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma3RMSNorm(self.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma3RMSNorm(self.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma3RMSNorm(self.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None,
                past_key_values: Optional[KVCache] = None, cache_position=None, **kwargs):
        residual = hidden_states
        with record_function("input_norm"):
            hidden_states = self.input_layernorm(hidden_states)
        with record_function("self_attn"):
            hidden_states = self.self_attn(
                hidden_states=hidden_states, position_embeddings=position_embeddings, attention_mask=attention_mask,
                position_ids=position_ids, past_key_values=past_key_values, cache_position=cache_position, **kwargs)
        with record_function("post_attn_norm"):
            hidden_states = self.post_attention_layernorm(hidden_states)
        with record_function("res"):
            hidden_states = residual + hidden_states
        residual = hidden_states
        with record_function("pre_ffn_norm"):
            hidden_states = self.pre_feedforward_layernorm(hidden_states)
        with record_function("mlp"):
            hidden_states = self.mlp(hidden_states)
        with record_function("post_ffn_norm"):
            hidden_states = self.post_feedforward_layernorm(hidden_states)
        with record_function("res"):
            hidden_states = residual + hidden_states
        return hidden_states


# %% [markdown]
# ## 3.1 MACs and FLOPs
#
# We walk through the MLP first. Without the profiler labels its forward pass is:
#
# ```python
# gate = self.gate_proj(x)             # (B, L, D) -> (B, L, I)
# up_x = self.up_proj(x)               # (B, L, D) -> (B, L, I)
# gate_up = self.act_fn(gate) * up_x   # GeLU, then an elementwise product, (B, L, I)
# down_proj = self.down_proj(gate_up)  # (B, L, I) -> (B, L, D)
# ```
#
# with `x` of shape `(B, L, D)` (batch, sequence length, hidden size) and intermediate size `I`:
# - `gate_proj`: a linear layer with weight $W \in \mathbb{R}^{I \times D}$: every one of the $B L$ tokens
#   does a $D \times I$ matrix-vector product. MACs $= B L D I$; FLOPs $= 2 B L D I$.
# - `up_proj`: the same, MACs $= B L D I$; FLOPs $= 2 B L D I$.
# - `act_fn`: GeLU (tanh approximation, Part 4) on $B L I$ elements. Computed operation by operation it takes
#   6 multiplications and 2 additions per element (we do not count the `tanh`): FLOPs $= 8 B L I$. These are
#   not multiply-accumulates of a dot product, so we count 0 MACs.
# - `gate_up`: an elementwise product of two $(B, L, I)$ tensors: FLOPs $= B L I$, 0 MACs (nothing accumulates).
# - `down_proj`: weight $W \in \mathbb{R}^{D \times I}$: MACs $= B L I D$; FLOPs $= 2 B L I D$.

# %% nbgrader={"grade": false, "grade_id": "mlp_cost_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
def calc_mlp_mac(B, L, D, I):
    """MACs of the Gemma-3 MLP.

    Args:
        B (int): batch size.
        L (int): tokens per sequence.
        D (int): hidden size.
        I (int): intermediate (MLP) size.

    Returns:
        int: multiply-accumulates of gate_proj, up_proj and down_proj (GeLU and the product have none).
    """
    gate_proj = B * L * D * I
    up_proj = B * L * D * I
    act_fn = 0
    gate_up = 0
    down_proj = B * L * I * D
    return gate_proj + up_proj + act_fn + gate_up + down_proj


def calc_mlp_flops(B, L, D, I):
    """FLOPs of the Gemma-3 MLP (2 per MAC, 8 per GeLU element, 1 per element of the product).

    Args:
        B (int): batch size.
        L (int): tokens per sequence.
        D (int): hidden size.
        I (int): intermediate (MLP) size.

    Returns:
        int: floating-point operations of the whole MLP.
    """
    gate_proj = 2 * B * L * D * I
    up_proj = 2 * B * L * D * I
    act_fn = 8 * B * L * I
    gate_up = B * L * I
    down_proj = 2 * B * L * I * D
    return gate_proj + up_proj + act_fn + gate_up + down_proj


# %% [markdown]
# #### Question 3.1.1 (6 points)
#
# Implement scaled dot-product attention from scratch:
#
# $$ \text{Attention}(Q, K, V) = \text{softmax}\left(\frac{Q K^\top}{\sqrt{d}} + \text{mask}\right) V $$
#
# with `q` of shape `(B, H, L_q, d)` and `k`, `v` of shape `(B, H, L_kv, d)`; the output has shape
# `(B, H, L_q, d)` and `q`'s dtype and device. You may use `torch.matmul`/`@`, `torch.softmax` and elementwise
# operations, but not `torch.nn.functional.scaled_dot_product_attention` or another attention routine (an answer
# that calls one earns at most a quarter of the points).
# - The softmax runs over the keys (the last dimension of the scores), and must be numerically stable for
#   large scores (`torch.softmax` is; if you write your own, subtract the row maximum first).
# - `attn_mask` is optional and follows PyTorch's convention: it broadcasts to `(B, H, L_q, L_kv)`; a **boolean**
#   mask is `True` where a query may attend to a key (`False` positions get probability 0); a **floating-point**
#   mask is added to the scaled scores before the softmax.
# - The tests compare with a float64 reference: the largest absolute error may be `1e-4 * (1 + max|expected|)` for
#   `float32` inputs and `1e-9 * (1 + max|expected|)` for `float64` ones.

# %% nbgrader={"grade": false, "grade_id": "q3_1_1_sdpa", "locked": false, "schema_version": 3, "solution": true, "task": false}
def scaled_dot_product_attention(q, k, v, attn_mask=None):
    """Standard attention: softmax(q k^T / sqrt(d) + mask) v.

    Args:
        q (torch.Tensor): queries, shape (B, H, L_q, d).
        k (torch.Tensor): keys, shape (B, H, L_kv, d).
        v (torch.Tensor): values, shape (B, H, L_kv, d).
        attn_mask (torch.Tensor, optional): broadcastable to (B, H, L_q, L_kv); bool (True = attend) or float
            (added to the scaled scores).

    Returns:
        torch.Tensor: attention output, shape (B, H, L_q, d), dtype and device of q.
    """
    ### BEGIN SOLUTION
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, L_q, L_kv)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    probs = torch.softmax(scores, dim=-1)  # over the keys
    return torch.matmul(probs, v)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_1_1_sdpa_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
def _sdpa_tolerance(expected, dtype):
    """The question's tolerance: largest absolute error 1e-4 (float32) or 1e-9 (float64) times (1 + max|expected|)."""
    return (1e-4 if dtype == torch.float32 else 1e-9) * (1 + expected.abs().max().item())


_gen = torch.Generator().manual_seed(0)
_q, _k, _v = (torch.randn(1, 4, 128, 64, generator=_gen) for _ in range(3))  # CPU tensors on every grader
_causal = torch.ones(128, 128, dtype=torch.bool).tril()
with check("matches PyTorch's attention (computed in float64) for a (1, 4, 128, 64) float32 example, without a mask "
           "and with a boolean causal mask (True = attend), with q's shape and dtype", weight=3):
    for _mask in (None, _causal):
        _expected = F.scaled_dot_product_attention(*(t.cpu().double() for t in (_q, _k, _v)),
                                                   attn_mask=None if _mask is None else _mask.cpu())
        assert_tensor_close(scaled_dot_product_attention(_q, _k, _v) if _mask is None else
                            scaled_dot_product_attention(_q, _k, _v, attn_mask=_mask), _expected,
                            f"scaled_dot_product_attention(q, k, v{'' if _mask is None else ', causal mask'})",
                            rtol=0, atol=_sdpa_tolerance(_expected, torch.float32), dtype=_q.dtype)
del _gen, _q, _k, _v, _causal, _mask, _expected
### BEGIN HIDDEN TESTS
def _q3_1_1_hidden_tests():
    def reference(q, k, v, mask=None):
        q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            mask = mask.detach().cpu()
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
        return torch.softmax(scores, dim=-1) @ v

    @kernel_side
    def attention_recorded(q, k, v, mask):
        """In the kernel: the student's attention (attn_mask passed only when there is one), and the sorted names
        of the torch functions it called (best effort)."""
        with record_torch_calls() as called:
            out = scaled_dot_product_attention(q, k, v) if mask is None else scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out, sorted(called)

    def inputs(shape_q, shape_kv, dtype, seed, mask_kind=None, q_scale=1.0):
        gen = torch.Generator().manual_seed(seed)
        q = (torch.randn(*shape_q, generator=gen, dtype=torch.float64) * q_scale).to(dtype)  # CPU, every grader
        k = torch.randn(*shape_kv, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(*shape_kv, generator=gen, dtype=torch.float64).to(dtype)
        L_q, L_kv = shape_q[-2], shape_kv[-2]
        mask = None
        if mask_kind == "bool":  # every query sees at least one key
            mask = torch.arange(L_kv)[None, :] <= torch.arange(L_q)[:, None] + (L_kv - L_q)
        elif mask_kind == "float":
            mask = (torch.randn(shape_q[0], 1, L_q, L_kv, generator=gen, dtype=torch.float64) * 2).to(dtype)
        return q, k, v, mask

    def assert_attention(q, k, v, mask, where):
        expected = reference(q, k, v, mask)
        out = scaled_dot_product_attention(q, k, v) if mask is None else scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert_tensor_close(out, expected, f"scaled_dot_product_attention for {where} (softmax(q k^T / sqrt(d) + mask, "
                            "over the keys) v; NaN or inf: is your softmax numerically stable?)",
                            rtol=0, atol=_sdpa_tolerance(expected, q.dtype), dtype=q.dtype)

    def case(shape_q, shape_kv, dtype, seed, mask_kind=None, q_scale=1.0):
        where = (f"q {tuple(shape_q)}, k/v {tuple(shape_kv)}, {dtype}, mask={mask_kind}"
                 + (f", q scaled x{q_scale}" if q_scale != 1 else ""))
        assert_attention(*inputs(shape_q, shape_kv, dtype, seed, mask_kind, q_scale), where)

    with check("matches a float64 reference for other shapes (L_q != L_kv, a decode step), float64 inputs, a boolean "
               "and a float mask", weight=5):
        case((2, 3, 5, 8), (2, 3, 7, 8), torch.float32, 31)
        case((1, 4, 1, 16), (1, 4, 9, 16), torch.float32, 32)  # one decode step
        case((1, 2, 6, 4), (1, 2, 6, 4), torch.float64, 33)
        case((2, 2, 5, 6), (2, 2, 7, 6), torch.float32, 34, mask_kind="bool")
        case((2, 3, 4, 8), (2, 3, 6, 8), torch.float32, 35, mask_kind="float")

    with check("numerically stable for large scores (scores in the hundreds)", weight=1):
        case((1, 2, 3, 8), (1, 2, 5, 8), torch.float32, 36, q_scale=40.0)

    with check("subtracts each row's own maximum: rows of very different scale (one row's scores near +110, another's "
               "near -110; a global maximum underflows the second row)", weight=1):
        for dtype, scale in ((torch.float32, 40.0), (torch.float64, 300.0)):
            gen = torch.Generator().manual_seed(37)
            base = torch.ones(8, dtype=torch.float64)  # every key close to `base`: q . k ~ +-|q| |base|
            k = base + 0.1 * torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64)
            v = torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64)
            signs = torch.tensor([1.0, -1.0, 0.02], dtype=torch.float64)[:, None]  # row 1 far below row 0's maximum
            q = (scale * signs * base + 0.1 * torch.randn(1, 2, 3, 8, generator=gen, dtype=torch.float64))
            assert_attention(q.to(dtype), k.to(dtype), v.to(dtype), None,
                             f"q (1, 2, 3, 8) whose rows score about +{scale * 8 / math.sqrt(8):.0f}, "
                             f"-{scale * 8 / math.sqrt(8):.0f} and 0, {dtype}")

    with check("returns its result on q's device (device rule, also for tensors it creates; inputs on DEVICE)", weight=1):
        q, k, v, mask = (t.to(DEVICE) for t in inputs((2, 2, 5, 6), (2, 2, 7, 6), torch.float32, 38, mask_kind="bool"))
        assert_on_input_device(scaled_dot_product_attention, (q, k, v, mask), q.device,
                               "scaled_dot_product_attention(q, k, v, attn_mask)")

    # The method of the question: when it fails the cell earns at most a quarter (checks.SKIPPED_METHOD_SHARE).
    with check("implements attention itself (no scaled_dot_product_attention or other attention routine), computing "
               "its output from q, k and v", weight=3, method=True):
        outputs = {}
        for mask_kind in (None, "bool", "float"):
            q, k, v, mask = inputs((2, 3, 4, 8), (2, 3, 6, 8), torch.float32, 39, mask_kind=mask_kind)
            outputs[mask_kind], called = attention_recorded(q, k, v, mask)
            banned = sorted(n for n in called if "scaled_dot_product" in n or "multi_head_attention" in n or "flash" in n)
            assert_calls(called, "scaled_dot_product_attention (implement attention yourself)", forbidden=banned)
        # Code that computes nothing is not the method: the output must change when q, k or v changes.
        q, k, v, _ = inputs((2, 3, 4, 8), (2, 3, 6, 8), torch.float32, 39)
        q2, k2, v2, _ = inputs((2, 3, 4, 8), (2, 3, 6, 8), torch.float32, 40)
        out = as_tensor(outputs[None], "scaled_dot_product_attention(q, k, v)")
        for changed, args in (("q", (q2, k, v)), ("k", (q, k2, v)), ("v", (q, k, v2))):
            assert not torch.equal(out, as_tensor(scaled_dot_product_attention(*args), "scaled_dot_product_attention")), (
                f"scaled_dot_product_attention must compute its output from q, k and v: it did not change when "
                f"{changed} changed")


_q3_1_1_hidden_tests()
del _q3_1_1_hidden_tests
### END HIDDEN TESTS
del _sdpa_tolerance
finish_checks("Question 3.1.1")

# %% [markdown] deletable=false editable=false tags=["measure"]
# *Timed after grading, for no points:* on the course's grading GPU, `python -m course measure` times your
# `scaled_dot_product_attention` in float16 at (B, H, L, d) = (4, 16, 1024, 64) and (1, 16, 4096, 64), checks its
# output on those inputs, and your feedback shows where it lands on that GPU's roofline, beside the reference solution.
#
# ```measure
# {
#     # FLOP: 4 B H L^2 d (the two matmuls; the softmax's few FLOP per score left out). Fewest bytes: q, k, v read and
#     # the output written once (what a fused kernel moves; a from-scratch version also writes and reads the L x L
#     # scores, which is why it sits far below the roof).
#     "name": "attention",
#     "function": "scaled_dot_product_attention",
#     "kind": "attention_bhsd",
#     "cells": ["q3_1_1_sdpa"],
#     "tests": ["q3_1_1_sdpa_tests"],
#     "dtype": "float16",
#     "flops": "4 * B * H * S * S * D",
#     "bytes": "4 * B * H * S * D * element_bytes",
#     "metric": "tflops",
#     "tolerance": 1e-2,
#     "warmup": 3,
#     "repeat": 10,
#     "timeout_s": 60.0,
#     "shapes": [{"B": 4, "S": 1024, "H": 16, "D": 64}, {"B": 1, "S": 4096, "H": 16, "D": 64}],
#     "tiny_shapes": [{"B": 1, "S": 24, "H": 2, "D": 8}],
# }
# ```

# %% [markdown]
# #### Question 3.1.2 (4 points)
#
# Write `calc_attn_mac(B, H, L_q, L_kv, D_h)`: the MACs of your attention for these
# shapes (`D_h` is the head dimension `d`; queries `(B, H, L_q, D_h)`, keys and values `(B, H, L_kv, D_h)`).
# Count the two matrix products; scaling, masking and the softmax
# contribute no MACs. Return a whole number (a Python `int`).

# %% nbgrader={"grade": false, "grade_id": "q3_1_2_attn_mac", "locked": false, "schema_version": 3, "solution": true, "task": false}
def calc_attn_mac(B, H, L_q, L_kv, D_h):
    """MACs of scaled dot-product attention.

    Args:
        B (int): batch size.
        H (int): number of attention heads.
        L_q (int): query length.
        L_kv (int): key/value length.
        D_h (int): head dimension.

    Returns:
        int: multiply-accumulates of q @ k^T and probs @ v.
    """
    ### BEGIN SOLUTION
    qk = B * H * L_q * L_kv * D_h  # (L_q, D_h) @ (D_h, L_kv) per head
    softmax = 0  # no multiply-accumulate in a softmax
    attn_v = B * H * L_q * L_kv * D_h  # (L_q, L_kv) @ (L_kv, D_h) per head
    return int(qk + softmax + attn_v)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_1_2_attn_mac_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
with check("calc_attn_mac(1, 4, 173, 256, 128)", weight=2):
    assert_integer(calc_attn_mac(1, 4, 173, 256, 128), 45350912, "calc_attn_mac(1, 4, 173, 256, 128)",
                   formula="2 * B * H * L_q * L_kv * D_h")
### BEGIN HIDDEN TESTS
def _q3_1_2_hidden_tests():
    def assert_macs(cases):
        for case in cases:
            B, H, L_q, L_kv, D_h = case
            assert_integer(calc_attn_mac(*case), 2 * B * H * L_q * L_kv * D_h, f"calc_attn_mac{case}",
                           formula="2 * B * H * L_q * L_kv * D_h (q @ k^T plus probs @ v)")

    with check("2 * B * H * L_q * L_kv * D_h for other sizes", weight=2):
        assert_macs([(1, 1, 1, 1, 1), (2, 3, 4, 6, 5), (4, 8, 16, 32, 64), (2, 6, 9, 5, 7)])

    with check("a decode step (L_q = 1, many keys): both products use L_q queries and L_kv keys", weight=1):
        assert_macs([(3, 2, 1, 37, 11), (1, 4, 1, 301, 256)])

    # For Bonus 3.1: calc_attn_mac as graded here, for the attention of each module that bonus tests.
    keep_attention_counts("calc_attn_mac", lambda *shape: calc_attn_mac(*shape),  # None if calc_attn_mac is missing
                          {attention_of(*module) for modules in bonus_3_1_modules() for module in modules})


_q3_1_2_hidden_tests()
del _q3_1_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.1.2")

# %% [markdown]
# #### Bonus 3.1 (5 points)
#
# Write `calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config)`: the MACs of one call of the whole
# `Gemma3Attention` module above. Conventions:
# - count the matrix products only: the four projections (`q_proj`, `k_proj`, `v_proj`, `o_proj`, no bias) and
#   the two products inside attention; RMSNorm, RoPE, scaling and softmax count 0 MACs;
# - the module runs with a KV cache: `k_proj` and `v_proj` are applied to the `query_len` new tokens only, and
#   attention runs over `kv_len` keys (in prefill `query_len == kv_len`; in a decode step `query_len == 1`);
# - grouped-query attention: there are `num_attention_heads` query heads and `num_key_value_heads` key/value
#   heads of size `head_dim`; every query head attends over `kv_len` keys. Note that `head_dim` need not equal
#   `hidden_size / num_attention_heads` (it does not in Gemma-3).
#
# Return a whole number (a Python `int`).

# %% nbgrader={"grade": false, "grade_id": "b3_1_attn_module_mac", "locked": false, "schema_version": 3, "solution": true, "task": false}
def calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config):
    """MACs of one call of Gemma3Attention (KV cache: K/V projected for the new tokens only).

    Args:
        batch_size (int): batch size B.
        query_len (int): new tokens per sequence (queries), S_q.
        kv_len (int): keys/values attended per sequence (cache plus new tokens), S_kv.
        gemma_config (Gemma3TextConfig): hidden_size, num_attention_heads, num_key_value_heads, head_dim.

    Returns:
        int: multiply-accumulates of the projections and of attention.
    """
    B = batch_size
    S_q = query_len
    S_kv = kv_len
    H = gemma_config.hidden_size
    n_h = gemma_config.num_attention_heads
    n_kv = gemma_config.num_key_value_heads
    d = gemma_config.head_dim
    ### BEGIN SOLUTION
    q_proj = B * S_q * H * n_h * d
    k_proj = B * S_q * H * n_kv * d
    v_proj = B * S_q * H * n_kv * d
    scores = B * n_h * S_q * S_kv * d
    attn_v = B * n_h * S_q * S_kv * d
    o_proj = B * S_q * n_h * d * H
    return int(q_proj + k_proj + v_proj + scores + attn_v + o_proj)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b3_1_attn_module_mac_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# The tests of this bonus are hidden: check your function on inputs of your own.
### BEGIN HIDDEN TESTS
def _b3_1_hidden_tests():
    own_macs = kept_carried("calc_attn_mac")  # your calc_attn_mac as Question 3.1.2 graded it (carry-forward)
    checks_modules = bonus_3_1_modules()

    def assert_module_macs(cases):
        for cfg, B, S_q, S_kv in cases:
            H, n_h, n_kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            projections = B * S_q * H * (n_h + 2 * n_kv) * d + B * S_q * n_h * d * H  # q, k, v of the new tokens; o
            attention = 2 * B * n_h * S_q * S_kv * d  # q k^T and probs v
            assert_or_carried(
                lambda value: assert_integer(
                    calc_attn_module_mac(B, S_q, S_kv, cfg), value,
                    f"calc_attn_module_mac(B={B}, query_len={S_q}, kv_len={S_kv}) with hidden={H}, heads={n_h}, "
                    f"kv_heads={n_kv}, head_dim={d}",
                    formula="projections of the query_len new tokens (GQA key/value heads) + attention over kv_len "
                            "keys + o_proj"),
                projections + attention,
                # the attention from your calc_attn_mac
                carried(lambda: projections + own_macs[attention_of(cfg, B, S_q, S_kv)]),
                carried_from="your calc_attn_mac")

    with check("a prefill of the Gemma-3 270M configuration (query_len == kv_len)", weight=2):
        assert_module_macs(checks_modules[0])

    with check("prefills of other configurations (grouped-query heads, head_dim != hidden_size / heads)", weight=2):
        assert_module_macs(checks_modules[1])

    with check("a decode step and a chunk with a cache (query_len < kv_len): K/V projected for the new tokens only",
               weight=2):
        assert_module_macs(checks_modules[2])


_b3_1_hidden_tests()
del _b3_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Bonus 3.1")

# %% [markdown]
# ## 3.2 I/O
#
# Now the bytes. The model runs in `bfloat16` (2 bytes per element) and we use the byte convention of Part 1:
# every operation reads its inputs and writes its outputs once. The weights are already in GPU memory (we do
# not count copying them there), but a linear layer does read its weight matrix from memory at every call.
# For the MLP, operation by operation (each operation is a separate kernel in eager PyTorch):
# - `gate_proj`: reads `x` $(B, L, D)$ and the weight $(I, D)$, writes $(B, L, I)$:
#   $2 (BLD + DI + BLI)$ bytes.
# - `up_proj`: the same, $2 (BLD + DI + BLI)$ bytes.
# - `act_fn`: reads $(B, L, I)$, writes $(B, L, I)$: $2 \cdot 2 BLI$ bytes.
# - `gate_up`: reads two $(B, L, I)$ tensors, writes one: $2 \cdot 3 BLI$ bytes.
# - `down_proj`: reads $(B, L, I)$ and the weight $(D, I)$, writes $(B, L, D)$: $2 (BLI + DI + BLD)$ bytes.

# %% nbgrader={"grade": false, "grade_id": "mlp_io_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
def calc_mlp_io(B, L, D, I):
    """Bytes read plus written by the Gemma-3 MLP in bfloat16 (2 bytes per element), one kernel per operation.

    Args:
        B (int): batch size.
        L (int): tokens per sequence.
        D (int): hidden size.
        I (int): intermediate (MLP) size.

    Returns:
        int: bytes moved between memory and the compute units.
    """
    bytes_per_element = 2
    gate_proj = bytes_per_element * (B * L * D + D * I + B * L * I)
    up_x = bytes_per_element * (B * L * D + D * I + B * L * I)
    act_fn = bytes_per_element * 2 * B * L * I
    gate_up = bytes_per_element * 3 * B * L * I
    down_proj = bytes_per_element * (B * L * I + D * I + B * L * D)
    return gate_proj + up_x + act_fn + gate_up + down_proj


# %% [markdown]
# #### Question 3.2 (5 points)
#
# Write `calc_attn_io(B, H, L_q, L_kv, D_h)`: the bytes read and written by **your** attention of Question 3.1.1
# without a mask, all tensors in **`float32`** (4 bytes per element), as a whole number (a Python `int`). Count three steps:
# 1. `scores = q @ k^T` (with the scaling folded in): read `q` and `k`, write the scores $(B, H, L_q, L_{kv})$;
# 2. the softmax: count it as **5 passes** over the $(B, H, L_q, L_{kv})$ scores, i.e.
#    $5 \cdot B H L_q L_{kv} \cdot 4$ bytes: an unfused, numerically stable softmax in three kernels reads the
#    scores 3 times and writes 2 tensors of their size: (i) read the scores for the row maximum; (ii) read them
#    again and write $e^{s - \max}$, summing each row on the way; (iii) read the exponentials and write them
#    divided by the row sums (the probabilities). (This is the course handout's count of a softmax written as
#    separate kernels. PyTorch's `torch.softmax` fuses them into one kernel that reads the scores once and writes
#    the probabilities once, 2 passes: Section 3.5 and Part 5, which measure attention built on it, count that.)
# 3. `out = probs @ v`: read the probabilities and `v`, write the output $(B, H, L_q, D_h)$.

# %% nbgrader={"grade": false, "grade_id": "q3_2_attn_io", "locked": false, "schema_version": 3, "solution": true, "task": false}
def calc_attn_io(B, H, L_q, L_kv, D_h):
    """Bytes moved by standard attention in float32: q @ k^T, a 5-pass softmax, probs @ v.

    Args:
        B (int): batch size.
        H (int): number of attention heads.
        L_q (int): query length.
        L_kv (int): key/value length.
        D_h (int): head dimension.

    Returns:
        int: bytes read plus written, 4 bytes per element.
    """
    bytes_per_element = 4
    ### BEGIN SOLUTION
    qk = B * H * L_q * D_h + B * H * L_kv * D_h + B * H * L_q * L_kv  # read q, k; write scores
    softmax = 5 * B * H * L_q * L_kv  # the handout's convention for an unfused softmax
    attn_v = B * H * L_q * L_kv + B * H * L_kv * D_h + B * H * L_q * D_h  # read probs, v; write out
    return int((qk + softmax + attn_v) * bytes_per_element)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_2_attn_io_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
with check("calc_attn_io(1, 2, 3, 4, 5)", weight=2):
    assert_integer(calc_attn_io(1, 2, 3, 4, 5), 1232, "calc_attn_io(1, 2, 3, 4, 5) (bytes)")
### BEGIN HIDDEN TESTS
def _q3_2_hidden_tests():
    def assert_bytes(cases):
        for case in cases:
            B, H, L_q, L_kv, D = case
            assert_integer(calc_attn_io(*case),
                           4 * ((B * H * L_q * D + B * H * L_kv * D + B * H * L_q * L_kv) + 5 * B * H * L_q * L_kv
                                + (B * H * L_q * L_kv + B * H * L_kv * D + B * H * L_q * D)),
                           f"calc_attn_io{case} (bytes)",
                           formula="4 x [(q + k read, scores written) + 5 x scores (softmax) + (probs + v read, out "
                                   "written)]")

    with check("the three steps' bytes for other sizes", weight=2):
        assert_bytes([(1, 1, 1, 1, 1), (4, 8, 16, 32, 64), (2, 6, 3, 5, 7), (1, 12, 100, 100, 64)])

    with check("a decode step (L_q = 1, many keys): q and the output have L_q rows, k and v L_kv", weight=1):
        assert_bytes([(3, 4, 1, 257, 32), (2, 2, 1, 9, 16)])

    # For Bonus 3.2: calc_attn_io as graded here, for the attention of each prefill that bonus tests.
    keep_attention_counts("calc_attn_io", lambda *shape: calc_attn_io(*shape),  # None if calc_attn_io is missing
                          {attention_of(cfg, B, S, S) for modules in bonus_3_2_modules() for cfg, B, S in modules})


_q3_2_hidden_tests()
del _q3_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.2")

# %% [markdown]
# #### Bonus 3.2 (5 points)
#
# Write `calc_attn_module_io(batch_size, query_len, kv_len, gemma_config)`: the bytes moved by one **prefill**
# call of the whole `Gemma3Attention` module (so `query_len == kv_len`, written `S` below), all tensors in
# **`bfloat16`** (2 bytes per element), one kernel per step, with `n_h` query heads, `n_kv` key/value heads of
# size `d` and hidden size `H`:
# 1. `q_proj`: read $x$ $(B, S, H)$ and $W_q$ $(n_h d, H)$, write $q$ $(B, S, n_h d)$;
# 2. `k_proj` and `v_proj`: each reads $x$ and its weight $(n_{kv} d, H)$ and writes $(B, S, n_{kv} d)$;
# 3. `q_norm` and `k_norm`: each reads and writes its tensor ($q$, resp. $k$); ignore their small weights;
# 4. RoPE: reads and writes $q$ and $k$ once each; ignore the cos/sin tables;
# 5. attention: your `calc_attn_io` steps (scores, 5-pass softmax, probs @ v) with `n_h` heads, `S` queries
#    and `S` keys, at 2 bytes per element: every query head reads its keys and values (as if they were
#    repeated for each head in the group);
# 6. `o_proj`: read the attention output $(B, S, n_h d)$ and $W_o$ $(H, n_h d)$, write $(B, S, H)$.
#
# Return a whole number (a Python `int`).

# %% nbgrader={"grade": false, "grade_id": "b3_2_attn_module_io", "locked": false, "schema_version": 3, "solution": true, "task": false}
def calc_attn_module_io(batch_size, query_len, kv_len, gemma_config):
    """Bytes moved by one prefill call of Gemma3Attention in bfloat16, one kernel per step.

    Args:
        batch_size (int): batch size B.
        query_len (int): tokens per sequence, S (prefill).
        kv_len (int): keys per sequence; equals query_len in prefill.
        gemma_config (Gemma3TextConfig): hidden_size, num_attention_heads, num_key_value_heads, head_dim.

    Returns:
        int: bytes read plus written, 2 bytes per element.
    """
    B = batch_size
    S_q = query_len
    S_kv = kv_len
    H = gemma_config.hidden_size
    n_h = gemma_config.num_attention_heads
    n_kv = gemma_config.num_key_value_heads
    d = gemma_config.head_dim
    bytes_per_elem = 2
    ### BEGIN SOLUTION
    q_elems, k_elems = B * S_q * n_h * d, B * S_kv * n_kv * d
    q_proj = B * S_q * H + n_h * d * H + q_elems
    k_proj = B * S_kv * H + n_kv * d * H + k_elems
    v_proj = B * S_kv * H + n_kv * d * H + k_elems
    norms = 2 * q_elems + 2 * k_elems
    rope = 2 * q_elems + 2 * k_elems
    scores = B * n_h * S_q * S_kv
    attention = (q_elems + B * n_h * S_kv * d + scores) + 5 * scores + (scores + B * n_h * S_kv * d + q_elems)
    o_proj = q_elems + H * n_h * d + B * S_q * H
    return int((q_proj + k_proj + v_proj + norms + rope + attention + o_proj) * bytes_per_elem)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b3_2_attn_module_io_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# The tests of this bonus are hidden: check your function on inputs of your own.
### BEGIN HIDDEN TESTS
def _b3_2_hidden_tests():
    own_bytes = kept_carried("calc_attn_io")  # your calc_attn_io as Question 3.2 graded it (carry-forward)
    checks_modules = bonus_3_2_modules()

    def assert_module_bytes(cases):
        for cfg, B, S in cases:
            H, n_h, n_kv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
            x, q, kv = B * S * H, B * S * n_h * d, B * S * n_kv * d
            s = B * n_h * S * S
            kv_per_head = B * n_h * S * d
            others = ((x + n_h * d * H + q) + 2 * (x + n_kv * d * H + kv)  # projections
                      + (2 * q + 2 * kv) + (2 * q + 2 * kv)  # q/k norms, RoPE
                      + (q + H * n_h * d + x))  # o_proj
            attention = (q + kv_per_head + s) + 5 * s + (s + kv_per_head + q)
            what = (f"calc_attn_module_io(B={B}, query_len=kv_len={S}) with hidden={H}, heads={n_h}, kv_heads={n_kv}, "
                    f"head_dim={d} (bytes)")
            formula = "2 bytes x (projections, norms, RoPE, attention with the 5-pass softmax, o_proj)"

            def compare(accepted):
                got = as_integer(calc_attn_module_io(B, S, S, cfg), what)
                assert got in accepted, f"{what} must be {formula} = {min(accepted):,}, got {got:,}"

            # Carry-forward: the attention step from your calc_attn_io (float32 bytes), halved for bf16.
            own = carried(lambda: own_bytes[attention_of(cfg, B, S, S)])
            assert_or_carried(compare, {2 * (others + attention)},
                              carried(lambda: {2 * others + own // 4 * 2, 2 * others + own // 2}),
                              carried_from="your calc_attn_io")

    with check("a prefill of the Gemma-3 270M configuration", weight=2):
        assert_module_bytes(checks_modules[0])

    with check("prefills of other configurations (grouped-query heads, head_dim != hidden_size / heads)", weight=2):
        assert_module_bytes(checks_modules[1])

    with check("multi-head attention (num_key_value_heads == num_attention_heads)", weight=1):
        assert_module_bytes(checks_modules[2])


_b3_2_hidden_tests()
del _b3_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Bonus 3.2")

# %% [markdown]
# ## 3.3 Latency of prefill and decode
#
# LLM inference has two stages:
# - **prefill** processes the whole prompt at once (all `L` tokens of each sequence in parallel) and stores
#   every layer's keys and values: the **KV cache** (see this [introduction to KV caching](https://huggingface.co/blog/not-lain/kv-caching));
# - **decode** then generates one token at a time. With the KV cache, a decode step computes keys and values
#   for the new token only and attends over the cached ones; without it, it recomputes the keys and values of
#   all earlier tokens at every step.
#
# The cells below time the three cases for a Gemma-3-shaped model (`GEMMA3_PESUDO_CONFIG`: hidden size 1152,
# 26 layers), applying one decoder layer object once per layer. At teaching scale the sizes are those of the
# course (batch 8, 4096-token prompts, all 26 layers; this fits on a 16 GB GPU such as a T4: about 7 GB of
# it is the KV cache). At cpu scale one 512-token prompt goes through 2 layers, which still shows a decode step's
# cost per token against the prefill's and what the KV cache saves; at quick scale the sizes are tiny. On a CPU
# the model runs in `float32` because CPUs are slow at `bfloat16`. There is no question in this section, but read the
# numbers (and the comments after them) carefully: they set up Section 3.4 and Part 4.

# %%
MODEL_DTYPE = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
prefill_batch_size, prefill_seq_len = at_scale(teaching=(8, 4096), quick=(1, 16), cpu=(1, 512))
num_layers = at_scale(teaching=GEMMA3_PESUDO_CONFIG.num_hidden_layers, quick=2, cpu=2)
timing_warmup, timing_repeat = at_scale(teaching=(3, 10), quick=(1, 2), cpu=(1, 2))
hidden_size = GEMMA3_PESUDO_CONFIG.hidden_size
torch.manual_seed(0)
layer = Gemma3DecoderLayer(GEMMA3_PESUDO_CONFIG, layer_idx=5).to(device=DEVICE, dtype=MODEL_DTYPE).eval()
rotary_emb = Gemma3RotaryEmbedding(GEMMA3_PESUDO_CONFIG, device=DEVICE, layer_type="full_attention")
print(f"{num_layers} layers, batch {prefill_batch_size}, prompt {prefill_seq_len} tokens, {MODEL_DTYPE}, {DEVICE}")

# %%
# Prefill: afterwards the KV cache of every layer is in past_key_values.
prefill_input, prefill_position_ids = create_prefill_inputs(
    prefill_batch_size, prefill_seq_len, hidden_size, dtype=MODEL_DTYPE, device=DEVICE)
prefill_position_embeddings = get_position_embeddings(prefill_input, prefill_position_ids, rotary_emb)
# The cache holds the prompt and the one token each sequence decodes below.
past_key_values = initialize_kv_cache(config=GEMMA3_PESUDO_CONFIG, max_cache_len=prefill_seq_len + 1)
prefill_kwargs = dict(layer=layer, hidden_states=prefill_input, position_ids=prefill_position_ids,
                      position_embeddings=prefill_position_embeddings, past_key_values=past_key_values)
prefill_latency_s = None
with uses_answers("Question 1.2"):
    prefill_latency_s = latency(multi_layer_prefill_forward, num_layers, **prefill_kwargs,
                                warmup=timing_warmup, repeat=timing_repeat)
    print(f"prefill ({prefill_seq_len} tokens x {prefill_batch_size} sequences): {prefill_latency_s * 1e3:.2f} ms")
if prefill_latency_s is None:  # not timed: fill the cache all the same for the decode steps below
    multi_layer_prefill_forward(num_layers, **prefill_kwargs)

# %% [markdown]
# A decode step launches many small kernels (about 90 per layer here). Launched one by one from Python
# ("eager"), the CPU's launch work can take longer than the GPU's work, and then the measured time says more
# about the CPU than about the step. So we time each decode step twice: eagerly, and replayed as a **CUDA
# graph** (`capture_cuda_graph` records the step's kernels once; a replay launches all of them with one call,
# see Section 4.4). The graph time is what the GPU needs for the step: the number to hold against the roofline.
# On a CPU there are no CUDA graphs and both columns show the eager time.

# %%
# One decode step without a KV cache: keys and values of all earlier tokens are recomputed.
decode_input, decode_position_ids, prefill_hidden_states = create_decode_inputs_without_cache(
    prefill_batch_size, prefill_seq_len, hidden_size, dtype=MODEL_DTYPE, device=DEVICE)
decode_position_embeddings = get_position_embeddings(decode_input, decode_position_ids, rotary_emb)
decode_no_cache_ms = benchmark_eager_and_graphed(
    multi_layer_decode_forward, num_layers, layer=layer, hidden_states=decode_input,
    position_ids=decode_position_ids, position_embeddings=decode_position_embeddings, past_key_values=None,
    cache_positions=None, use_kv_cache=False, prefill_hidden_states=prefill_hidden_states,
    n_warmup=timing_warmup, n_repeat=timing_repeat)
decode_no_cache_latency_s = decode_no_cache_ms["measured_ms"] / 1e3


def show_decode_times(name, launched_ms, graph_ms, launched="eager   "):
    graph = "no CUDA graphs on a CPU" if graph_ms is None else f"CUDA graph {graph_ms:8.2f} ms"
    print(f"decode step {name}: {launched} {launched_ms:8.2f} ms, {graph}")


show_decode_times("without KV cache", decode_no_cache_ms["eager_ms"], decode_no_cache_ms["graph_ms"])

# %%
# One decode step with the KV cache filled by the prefill above: the new token's key and value are written
# into the cache in place (position prefill_seq_len), and attention reads the whole cache once.
decode_input, decode_position_ids, decode_cache_positions = create_decode_inputs_with_cache(
    prefill_batch_size, prefill_seq_len, hidden_size, dtype=MODEL_DTYPE, device=DEVICE)
decode_position_embeddings = get_position_embeddings(decode_input, decode_position_ids, rotary_emb)
decode_cache_kwargs = dict(
    layer=layer, hidden_states=decode_input, position_ids=decode_position_ids,
    position_embeddings=decode_position_embeddings, past_key_values=past_key_values,
    cache_positions=decode_cache_positions, use_kv_cache=True, prefill_hidden_states=None)
decode_cache_ms = benchmark_eager_and_graphed(
    multi_layer_decode_forward, num_layers, **decode_cache_kwargs, n_warmup=timing_warmup, n_repeat=timing_repeat)
decode_cache_latency_s = decode_cache_ms["measured_ms"] / 1e3
show_decode_times("with KV cache   ", decode_cache_ms["eager_ms"], decode_cache_ms["graph_ms"])

# %% [markdown]
# Even replayed as a graph, the cached step runs about 86 kernels per layer, most of them tiny elementwise
# passes (RMSNorms in `float32`, RoPE, residuals, GeLU) that each cost a few microseconds of GPU time however
# they are launched. `torch.compile` fuses such chains of operations into a few generated kernels (Section
# 4.3 shows it on GeLU). The next cell compiles the whole multi-layer step once (about a minute on a GPU), then
# times the compiled step launched from Python and replayed as a CUDA graph
# (`benchmark_compiled_and_graphed`), and counts the kernels one step launches (`count_kernels_per_call`).
# The compile only runs on a GPU at teaching scale: on a CPU it takes minutes (Section 4.4 compiles something
# smaller on a CPU), and at quick scale (as the notebook is graded) it would cost more than the whole tiny step
# teaches. Without a GPU, read its numbers in `measured_runs.md` beside this notebook (this cell's output in the
# H200 run).

# %%
decode_kernels = {"eager": count_kernels_per_call(multi_layer_decode_forward, num_layers, **decode_cache_kwargs)["total"]}
if at_scale(teaching=DEVICE.type == "cuda", quick=False, cpu=False):
    print("compiling the multi-layer decode step (about a minute on a GPU, once)")
    decode_compiled_ms = benchmark_compiled_and_graphed(
        multi_layer_decode_forward, num_layers, **decode_cache_kwargs, n_warmup=timing_warmup, n_repeat=timing_repeat)
    decode_kernels["compiled"] = decode_compiled_ms["kernels"]["total"]
    print(f"torch.compile of the {num_layers}-layer step: {decode_compiled_ms['compile_s']:.0f} s (first call, once)")
    show_decode_times("compiled        ", decode_compiled_ms["compiled_ms"], decode_compiled_ms["graph_ms"],
                      launched="compiled")
else:
    decode_compiled_ms = None
    print(f"torch.compile of the decode step: skipped {'on a CPU' if DEVICE.type == 'cpu' else 'at quick scale'} "
          "(it runs on a GPU at teaching scale; the H200 numbers are in measured_runs.md beside this notebook)")
print("kernels per decode step with the KV cache:", ", ".join(f"{name} {count}" for name, count in decode_kernels.items()),
      "(operator calls on a CPU)" if DEVICE.type == "cpu" else "")

# %%
kv_width = GEMMA3_PESUDO_CONFIG.num_key_value_heads * GEMMA3_PESUDO_CONFIG.head_dim
prompt_tokens = prefill_batch_size * prefill_seq_len
element_bytes = torch.finfo(MODEL_DTYPE).bits / 8
kv_recompute_gflop = num_layers * 2 * (2 * prompt_tokens * hidden_size * kv_width) / 1e9  # k_proj and v_proj
kv_cache_gb = num_layers * 2 * prompt_tokens * kv_width * element_bytes / 1e9
weights_gb = num_layers * sum(p.numel() for p in layer.parameters()) * element_bytes / 1e9
# Roofline of the cached step: read every weight and the whole cache once. Without the cache the step must
# also recompute the keys and values of every prompt token (compute-bound at this size).
predicted_cache_ms = (weights_gb + kv_cache_gb) / peak_bandwidth_tb_s
# (GFLOP / (TFLOP/s) and GB / (TB/s) are both milliseconds.) The recomputed keys and values are as large as the
# cache and attention reads them too, so the step without the cache moves at least as many bytes.
predicted_no_cache_ms = max(kv_recompute_gflop / peak_bf16_tflops, predicted_cache_ms)
if prefill_latency_s is not None:
    print(f"prefill: {prefill_latency_s / prompt_tokens * 1e6:10.2f} us per token")
print(f"decode:  {decode_cache_latency_s / prefill_batch_size * 1e6:10.2f} us per token (with the KV cache)")
print(f"the KV cache holds {kv_cache_gb:.3g} GB and saves {kv_recompute_gflop:.4g} GFLOP of key/value "
      f"projections per decode step")
print(f"roofline on {gpu_name}: with the cache >= {predicted_cache_ms:.2f} ms (read {weights_gb:.2f} GB of weights "
      f"and {kv_cache_gb:.2f} GB of cache), without >= {predicted_no_cache_ms:.2f} ms")
print(f"KV-cache speedup: predicted {predicted_no_cache_ms / predicted_cache_ms:.1f}x, measured "
      f"{decode_no_cache_latency_s / decode_cache_latency_s:.1f}x (CUDA graphs where available), "
      f"eager {decode_no_cache_ms['eager_ms'] / decode_cache_ms['eager_ms']:.1f}x")
cached_steps_ms = {"eager": decode_cache_ms["eager_ms"], "CUDA graph": decode_cache_ms["graph_ms"],
                   "compiled + CUDA graph": None if decode_compiled_ms is None else decode_compiled_ms["graph_ms"]}
print("cached step, measured / roofline:", ", ".join(
    f"{name} {ms / predicted_cache_ms:.1f}x" for name, ms in cached_steps_ms.items() if ms is not None))

# %% [markdown]
# What the numbers say (one H200 at teaching scale: the printed output of these cells in `measured_runs.md` beside
# this notebook; yours will differ). The roofline of the last cell is the datasheet's (4.8 TB/s): 1.82 ms for the
# cached step. At cpu scale (one 512-token prompt, 2 layers, `float32`) the same two effects show in your own
# output: a decode step costs far more per token than the prefill (in the course's cpu-scale run, also in
# `measured_runs.md`, 16348 µs against 934 µs per token), and the step without the cache is several times slower
# than the cached one (5.3x there). There is no CUDA graph on a CPU, and an operator costs microseconds of dispatch
# rather than a kernel launch.
# - **Per token, decode is far more expensive than prefill** (8.43 µs per prompt token against 937 µs per
#   generated token). Prefill works on 32768 tokens at once: large GEMMs that keep the GPU busy. A decode
#   step works on 8 tokens: tiny GEMVs, and 86 kernels per layer that each do almost nothing. Section 3.4
#   explains this with the roofline; Part 4 shows the kernels.
# - **The KV cache** saves recomputing the keys and values of every earlier token: about 8 TFLOP per decode
#   step here (8040 GFLOP), a cost that grows with the context length, paid with memory (7 GB of cache). Replayed as
#   a CUDA graph the cached step took 7.50 ms against a roofline of 1.82 ms (reading 1.73 GB of weights and 6.98 GB
#   of cache once): 4.1x its roofline. It was 8.7x faster than the step without the cache (predicted: 4.5x; the
#   step without the cache took 65.60 ms against 8.13 ms predicted, because its RMSNorm in float32 and its RoPE make
#   several extra passes over the recomputed keys of all 32768 tokens).
# - **Why 7.5 ms and not 1.8**: attention over the cache needs at least 7 GB / 26 layers / 4.8 TB/s = 0.06 ms
#   per layer (it reads the layer's 0.27 GB of cache once), but each of the other 85 kernels of a layer costs a
#   few microseconds even when nothing launches it from Python: 26 x 86 = 2236 kernels at about 3.4 µs on
#   average.
# - **Fewer kernels close the gap**: compiled with `torch.compile`, the same cached step runs 391 kernels instead
#   of 2236 (each layer's norms, RoPE, residuals and GeLU fused into a few generated kernels: of the 2236, 1820 are
#   elementwise, of the 391, 52) and, replayed as a CUDA graph, takes 3.86 ms: 2.1x its roofline, where the graph
#   of the uncompiled step was 4.1x. What is left is mostly reading the weights and the cache (the 1.82 ms of the
#   roofline) plus a few microseconds for each of the remaining kernels. The compile took 28 s, once, on its first
#   call (11.8 s in another measurement of the same step on the same machine: how long a compile takes depends on
#   its caches and on what else the machine runs).
# - **Launch overhead**: run eagerly, the same cached step took 60.90 ms: the CPU needs longer to launch 2236
#   kernels from Python than the GPU needs to run them, so the eager time measures the CPU, and the cache looks
#   nearly useless (eager speedup 1.1x, against 8.7x as CUDA graphs). Even compiled, launched from Python it takes
#   6.65 ms, well above the graph's 3.86 ms. Times that measure the CPU vary from run to run: another run of the
#   course on the same machine took 42.2 ms eagerly and 7.49 ms compiled from Python (and, against the ceilings
#   it measured on that GPU, a roofline of 2.04 ms: the graphs at 3.72x and 1.89x of it). This is why
#   inference engines compile decode steps and replay them as CUDA graphs, and why we hold the graph times against
#   the roofline.

# %%
del prefill_input, prefill_position_ids, prefill_position_embeddings, prefill_hidden_states, prefill_kwargs
del decode_input, decode_position_ids, decode_position_embeddings, decode_cache_positions, decode_cache_kwargs
if DEVICE.type == "cuda":
    torch.cuda.empty_cache()

# %% [markdown]
# ## 3.4 Prefill and decode on the roofline
#
# Now we place the MLP on the roofline, using the FLOP and byte counts of Sections 3.1 and 3.2 for the
# Gemma-3 270M configuration with batch 8 and 2048-token prompts. The model runs in `bfloat16`, so the roof
# is the bf16 (tensor-core) peak of your GPU.

# %%
mlp_D = GEMMA3_270M_CONFIG.hidden_size
mlp_I = GEMMA3_270M_CONFIG.intermediate_size
mlp_B, mlp_L = 8, 2048
mlp_stage_intensity = {
    "MLP prefill (B=8, L=2048)": calc_mlp_flops(mlp_B, mlp_L, mlp_D, mlp_I) / calc_mlp_io(mlp_B, mlp_L, mlp_D, mlp_I),
    "MLP decode (B=8, 1 token)": calc_mlp_flops(mlp_B, 1, mlp_D, mlp_I) / calc_mlp_io(mlp_B, 1, mlp_D, mlp_I),
}
print({name: round(ai, 1) for name, ai in mlp_stage_intensity.items()})
plot_roofline(gpu_name, peak_bf16_tflops, peak_bandwidth_tb_s, mlp_stage_intensity,
              title=f"Gemma-3 270M MLP, bf16, on {gpu_name}")
plt.show()

# %% [markdown]
# The bottleneck of the MLP differs between the two stages: in prefill the MLP sits near or right of the ridge
# point, in decode far left of it. This is not special to the MLP: prefill is usually compute-bound and
# decode memory-bound, and the two need different optimisations.
#
# #### Question 3.4.1 (5 points)
#
# Explain in words why the bottleneck of the MLP differs between prefill and decode. (Hint: think about the
# shape of the input in each stage, and about GEMM versus GEMV from Part 2.)

# %% [markdown] nbgrader={"grade": true, "grade_id": "q3_4_1_answer", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# In prefill the MLP's input holds all prompt tokens, $B \cdot L$ rows ($8 \cdot 2048 = 16384$ here), so each
# linear layer is a large GEMM: its $D \times I$ weight is read from memory once and reused for every one of the
# $B L$ tokens. FLOPs grow with $B L D I$ while the weight bytes stay $D I$, so the arithmetic intensity is high
# (about 213 FLOP/byte here, bounded by the intermediate activations that also grow with $BL$): compute-bound,
# or close to the ridge.
# In decode each sequence contributes a single new token, so the input has only $B$ rows (8 here): each linear
# layer is a thin matrix times a few vectors, essentially a GEMV. The whole weight matrix must still be read
# for just $B$ multiply-adds per weight, so the bytes are dominated by the weights and the intensity is about
# $B$ FLOP/byte (about 8 here): far below the ridge, memory-bound. The GPU spends its time loading weights,
# not computing.
# === BEGIN MARK SCHEME ===
# 5 points in total:
# - 2 points: prefill processes B x L tokens at once: GEMM, weights reused across many tokens, high
#   arithmetic intensity -> compute-bound (or near the ridge).
# - 2 points: decode processes one token per sequence: (thin) GEMV, every weight read for only B uses,
#   bytes dominated by weight reads, low intensity -> memory-bound.
# - 1 point: explicitly ties the difference to intensity relative to the ridge point (FLOPs scale with tokens,
#   weight bytes do not).
# === END MARK SCHEME ===

# %% [markdown]
# #### Question 3.4.2 (3 points)
#
# Vary the batch size `B` of the decode stage (one new token per sequence, `L = 1`).
#
# **(a) Code, 1 point.** Fill `decode_mlp_intensity_by_batch`: `B` -> arithmetic intensity (FLOP/byte) of the
# Gemma-3 270M MLP for one decode step, for every `B` in `decode_batch_sizes` (`calc_mlp_flops` and
# `calc_mlp_io` give the FLOPs and the bytes). Values are accepted to a relative `1e-5` (float32 arithmetic is fine).

# %% nbgrader={"grade": false, "grade_id": "q3_4_2_intensity", "locked": false, "schema_version": 3, "solution": true, "task": false}
decode_batch_sizes = [1, 4, 16, 64]
D = GEMMA3_270M_CONFIG.hidden_size
I = GEMMA3_270M_CONFIG.intermediate_size
decode_mlp_intensity_by_batch = {}
### BEGIN SOLUTION
for b in decode_batch_sizes:
    decode_mlp_intensity_by_batch[b] = calc_mlp_flops(b, 1, D, I) / calc_mlp_io(b, 1, D, I)
### END SOLUTION
print({b: round(ai, 2) for b, ai in decode_mlp_intensity_by_batch.items()})

# %% nbgrader={"grade": true, "grade_id": "q3_4_2_intensity_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# The keys the question gives earn nothing by themselves: without them the cell scores zero (outside any check).
assert set(as_dict(decode_mlp_intensity_by_batch, "decode_mlp_intensity_by_batch")) == {1, 4, 16, 64}, (
    f"decode_mlp_intensity_by_batch must have the keys 1, 4, 16, 64, got {list(decode_mlp_intensity_by_batch)}")
### BEGIN HIDDEN TESTS
def _q3_4_2_hidden_tests():
    d, i = GEMMA3_270M_CONFIG.hidden_size, GEMMA3_270M_CONFIG.intermediate_size
    expected = {}
    for b in (1, 4, 16, 64):
        flops = 6 * b * d * i + 9 * b * i  # three projections (2 FLOPs per MAC), GeLU (8) and product (1)
        io = 2 * (3 * b * d + 3 * d * i + 8 * b * i)  # bf16: x twice, three weights, out, and 8 x (B, 1, I)
        expected[b] = flops / io
    with check("each value is calc_mlp_flops(B, 1, D, I) / calc_mlp_io(B, 1, D, I) FLOP/byte (to a relative 1e-5)",
               weight=2):
        assert_reals_by_key(decode_mlp_intensity_by_batch, expected, "decode_mlp_intensity_by_batch",
                            formula="calc_mlp_flops(B, 1, D, I) / calc_mlp_io(B, 1, D, I) FLOP/byte (270M config)")


_q3_4_2_hidden_tests()
del _q3_4_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.4.2")

# %% [markdown]
# **(b) Plot, 1 point.** Plot the four decode steps on the bf16 roofline of your GPU.

# %% nbgrader={"grade": true, "grade_id": "q3_4_2_plot", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 3.4.2 (b)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 1 point: the four decode steps (B = 1, 4, 16, 64) from decode_mlp_intensity_by_batch on the bf16 roofline of
    # the GPU in use (peak_bf16_tflops, its bandwidth), labelled and shown. An fp32 roof costs the point.
    # === END MARK SCHEME ===
    plot_roofline(gpu_name, peak_bf16_tflops, peak_bandwidth_tb_s,
                  {f"MLP decode B={b}": ai for b, ai in decode_mlp_intensity_by_batch.items()},
                  title=f"Gemma-3 270M MLP decode step vs batch size, bf16, on {gpu_name}")
    plt.show()
    ### END SOLUTION

# %% [markdown]
# **(c) Written, 1 point.** Describe your findings in two or three sentences.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q3_4_2_answer", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# The intensity grows almost linearly with the batch size: about 1, 3.9, 15 and 49 FLOP/byte for B = 1, 4, 16,
# 64. In a decode step the bytes are dominated by the weights ($3DI$ elements), which are read once whatever
# $B$ is, while the FLOPs grow with $B$: batching more sequences reuses every loaded weight for more tokens.
# All four points are still left of the bf16 ridge (about 200 FLOP/byte on an A6000, 206 on the H200), so the
# decode MLP stays memory-bound; its latency barely grows with $B$ until the ridge, which is why serving
# systems batch many requests to raise throughput. The growth flattens for large $B$ (the $(B, 1, I)$
# activations grow with $B$ too), towards about 215 FLOP/byte. (Attention in decode would not benefit the same
# way: each sequence reads its own KV cache, so its bytes grow with $B$ as fast as its FLOPs.)
# === BEGIN MARK SCHEME ===
# 1 point in total:
# - 0.5 point: intensity grows (roughly linearly) with B, with the reason: weights are read once and reused by
#   all B tokens, FLOPs scale with B.
# - 0.5 point: even B = 64 stays memory-bound (left of the bf16 ridge) for this model/GPU; batching improves
#   utilisation/throughput. Accept equivalent statements using the plotted GPU's ridge point.
# === END MARK SCHEME ===

# %% [markdown]
# #### Question 3.4.3 (3 points)
#
# Now vary the prompt length `L` of the prefill stage, with batch size 32.
#
# **(a) Code, 1 point.** Fill `prefill_mlp_intensity_by_len`: `L` -> arithmetic intensity (FLOP/byte) of the
# Gemma-3 270M MLP for a prefill of `B = 32` sequences of `L` tokens, for every `L` in `prefill_lengths`
# (accepted to a relative `1e-5`).

# %% nbgrader={"grade": false, "grade_id": "q3_4_3_intensity", "locked": false, "schema_version": 3, "solution": true, "task": false}
prefill_sweep_batch = 32
prefill_lengths = [64, 256, 1024, 4096]
D = GEMMA3_270M_CONFIG.hidden_size
I = GEMMA3_270M_CONFIG.intermediate_size
prefill_mlp_intensity_by_len = {}
### BEGIN SOLUTION
for length in prefill_lengths:
    prefill_mlp_intensity_by_len[length] = (calc_mlp_flops(prefill_sweep_batch, length, D, I)
                                            / calc_mlp_io(prefill_sweep_batch, length, D, I))
### END SOLUTION
print({length: round(ai, 2) for length, ai in prefill_mlp_intensity_by_len.items()})

# %% nbgrader={"grade": true, "grade_id": "q3_4_3_intensity_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
# The keys the question gives earn nothing by themselves: without them the cell scores zero (outside any check).
assert set(as_dict(prefill_mlp_intensity_by_len, "prefill_mlp_intensity_by_len")) == {64, 256, 1024, 4096}, (
    f"prefill_mlp_intensity_by_len must have the keys 64, 256, 1024, 4096, got {list(prefill_mlp_intensity_by_len)}")
### BEGIN HIDDEN TESTS
def _q3_4_3_hidden_tests():
    d, i, b = GEMMA3_270M_CONFIG.hidden_size, GEMMA3_270M_CONFIG.intermediate_size, 32
    expected = {}
    for length in (64, 256, 1024, 4096):
        tokens = b * length
        flops = 6 * tokens * d * i + 9 * tokens * i
        io = 2 * (3 * tokens * d + 3 * d * i + 8 * tokens * i)
        expected[length] = flops / io
    with check("each value is calc_mlp_flops(32, L, D, I) / calc_mlp_io(32, L, D, I) FLOP/byte (to a relative 1e-5)",
               weight=2):
        assert_reals_by_key(prefill_mlp_intensity_by_len, expected, "prefill_mlp_intensity_by_len",
                            formula="calc_mlp_flops(32, L, D, I) / calc_mlp_io(32, L, D, I) FLOP/byte (270M config)")


_q3_4_3_hidden_tests()
del _q3_4_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.4.3")

# %% [markdown]
# **(b) Plot, 1 point.** Plot the four prefills on the bf16 roofline of your GPU.

# %% nbgrader={"grade": true, "grade_id": "q3_4_3_plot", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 3.4.3 (b)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 1 point: the four prefills (L = 64..4096) from prefill_mlp_intensity_by_len on the bf16 roofline of the GPU in
    # use (peak_bf16_tflops, its bandwidth), labelled and shown. An fp32 roof costs the point.
    # === END MARK SCHEME ===
    plot_roofline(gpu_name, peak_bf16_tflops, peak_bandwidth_tb_s,
                  {f"MLP prefill L={length}": ai for length, ai in prefill_mlp_intensity_by_len.items()},
                  title=f"Gemma-3 270M MLP prefill (B=32) vs prompt length, bf16, on {gpu_name}")
    plt.show()
    ### END SOLUTION

# %% [markdown]
# **(c) Written, 1 point.** Describe your findings in two or three sentences.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q3_4_3_answer", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# The intensity hardly changes: about 195, 210, 214 and 215 FLOP/byte for L = 64 to 4096. With $B = 32$ even
# the shortest prompt gives $B L = 2048$ tokens, already enough to amortise the weights; beyond that, FLOPs and
# bytes both grow in proportion to the number of tokens (the $(B, L, I)$ intermediate tensors dominate the
# bytes), so their ratio saturates at $(6D + 9) I / (2 (3D + 8I)) \approx 215.3$ FLOP/byte (the $6DI$ FLOPs of the
# projections plus the $9I$ of the GeLU and the product, per token, over the bytes of its activations). The points sit around the bf16
# ridge: on the H200 (datasheet ridge about 206 FLOP/byte) and on an A6000 (about 202) L = 64 is just left of it
# and the longer prompts just right; against the H200's measured ceilings (ridge about 187, Section 3.5) all four
# are right of it. On a GPU whose ridge lies above 215 FLOP/byte all four would be left of it. With this
# unfused, one-kernel-per-operation I/O model the MLP cannot become more compute-bound by making prompts
# longer. What moves it right is fewer bytes per FLOP: fusing the GeLU and the product into the projections
# (Part 4) so the intermediates never go to memory.
# === BEGIN MARK SCHEME ===
# 1 point in total:
# - 0.5 point: intensity is high and nearly constant in L (saturates), because FLOPs and activation bytes both
#   scale with B x L once the weights are amortised. A limit is not required; if one is given, it is
#   (6D + 9) I / (2 (3D + 8I)) = 215.3 FLOP/byte; 3DI / (3D + 8I) = 214.8 (which drops the 9I elementwise
#   FLOPs) is accepted too.
# - 0.5 point: places the points relative to the plotted GPU's bf16 ridge (around/at the ridge, compute-bound
#   or close to it), and/or notes that only reducing bytes (fusion) raises the ceiling (Section 3.5 measures it).
# === END MARK SCHEME ===

# %% [markdown]
# ## 3.5 Every operator, measured, on your roofline
#
# Section 3.4 placed the MLP as **one** point, from counted FLOPs and bytes, under a roof drawn from datasheet
# peaks. Two assumptions hide in that picture: that the datasheet's peaks can be reached, and that one intensity
# describes the whole MLP. Eager PyTorch runs the MLP as five separate kernels (three projections, the GeLU, the
# product), one after the other, and each is limited by *its own* intensity. Here you measure both: the ceilings
# this machine really reaches, and every operator of the MLP and of attention, timed one by one.
#
# **Measured ceilings.** `measure_roofline` (in `utils.py`) times a large copy (its bytes read plus written over
# its time: the memory ceiling, TB/s) and a large square matmul (`2 n^3` FLOPs over its time: the compute
# ceiling, TFLOP/s), in the dtype the model runs in (`MODEL_DTYPE`: bfloat16 on a GPU, float32 on a CPU). On a GPU
# that `GPU_SPECS` knows you see them beside the datasheet's figures (the measured ones are usually lower:
# clocks under load, the memory system's overheads, a real kernel's efficiency). Without a GPU there is no datasheet to compare with
# (`GPU_SPECS` holds GPUs only): your roofline is your CPU's, as measured (the copy runs over tens of MB, more than
# a CPU's caches hold, so it measures the CPU's main memory).

# %%
roofline_size, roofline_copy_mb = at_scale(teaching=(None, None), quick=(256, 8), cpu=(None, None))  # None: default
measured_roofline = measure_roofline(dtypes=(MODEL_DTYPE,), size=roofline_size, copy_mb=roofline_copy_mb)
measured_peak_tflops = measured_roofline["matmul_tflops"][str(MODEL_DTYPE).replace("torch.", "")]
measured_bandwidth_tb_s = measured_roofline["bandwidth_tb_s"]
print(f"measured on {measured_roofline['device_name']} ({DEVICE.type}, {MODEL_DTYPE}): "
      f"matmul {measured_peak_tflops:.4g} TFLOP/s (n = {measured_roofline['matmul_n']}), "
      f"copy {measured_bandwidth_tb_s:.4g} TB/s ({measured_roofline['copy_mb']} MB), "
      f"ridge {measured_peak_tflops / measured_bandwidth_tb_s:.1f} FLOP/byte")
if measured_roofline["datasheet_tflops"] is not None:
    datasheet_tflops = peak_bf16_tflops if MODEL_DTYPE == torch.bfloat16 else peak_fp32_tflops
    print(f"datasheet of the {gpu_name}: {datasheet_tflops} TFLOP/s, {peak_bandwidth_tb_s} TB/s, ridge "
          f"{datasheet_tflops / peak_bandwidth_tb_s:.1f} FLOP/byte; measured: "
          f"{measured_peak_tflops / datasheet_tflops:.0%} of the compute, "
          f"{measured_bandwidth_tb_s / peak_bandwidth_tb_s:.0%} of the bandwidth")
else:
    datasheet_tflops = None
    print("no datasheet for this device in GPU_SPECS: the roofline below is the measured one alone")

# %% [markdown]
# #### Question 3.5.1 (2 points)
#
# A measured operation becomes a point on the roofline: its arithmetic intensity (x) and the performance it
# achieved (y). Write `roofline_point(flops, bytes_moved, latency_s)`:
# - `flops`: the FLOPs of one call; `bytes_moved`: the bytes it reads plus writes in one call; `latency_s`: the
#   measured time of one call, in **seconds** (what your `latency` returns);
# - return a pair `(intensity, achieved_tflops)`: the arithmetic intensity in **FLOP/byte** and the achieved
#   performance in **TFLOP/s** (1 TFLOP/s = $10^{12}$ FLOP/s), as numbers (Python floats are simplest; a tuple or
#   a list of two).
#
# Values are accepted to a relative `1e-5` (`REL_TOL`).

# %% nbgrader={"grade": false, "grade_id": "q3_5_1_roofline_point", "locked": false, "schema_version": 3, "solution": true, "task": false}
def roofline_point(flops, bytes_moved, latency_s):
    """Place one measured operation on the roofline.

    Args:
        flops (int | float): floating-point operations of one call.
        bytes_moved (int | float): bytes read plus written by one call.
        latency_s (float): measured time of one call, in seconds.

    Returns:
        tuple[float, float]: (arithmetic intensity in FLOP/byte, achieved performance in TFLOP/s).
    """
    ### BEGIN SOLUTION
    intensity = flops / bytes_moved  # FLOP/byte
    achieved_tflops = flops / latency_s / 1e12  # FLOP/s -> TFLOP/s
    return float(intensity), float(achieved_tflops)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_5_1_roofline_point_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def _assert_point(args, intensity, tflops):
    """roofline_point(*args) must be (intensity FLOP/byte, tflops TFLOP/s), each to REL_TOL."""
    what = f"roofline_point{args}"
    got = as_tuple(roofline_point(*args), 2, what)
    assert_close(got[0], intensity, f"{what}[0], the intensity", formula="flops / bytes_moved (FLOP/byte)")
    assert_close(got[1], tflops, f"{what}[1], the achieved performance",
                 formula="flops / latency_s / 1e12 (TFLOP/s, latency in seconds)")


with check("roofline_point(2e9, 1e9, 0.01) == (2.0, 0.2): 2 FLOP/byte, 0.2 TFLOP/s", weight=2):
    _assert_point((2e9, 1e9, 0.01), 2.0, 0.2)
### BEGIN HIDDEN TESTS
def _q3_5_1_hidden_tests():
    with check("other operations: intensity = FLOPs / bytes (FLOP/byte), performance = FLOPs / seconds / 1e12 "
               "(TFLOP/s), with integer and float arguments", weight=2):
        for flops, bytes_moved, seconds in [(42_949_672_960, 90_701_824, 1.25e-4), (671_088_640, 7_995_392, 0.0123),
                                            (3 * 10 ** 12, 2 * 10 ** 10, 2.5)]:
            _assert_point((flops, bytes_moved, seconds), flops / bytes_moved, flops / seconds / 1e12)

    with check("a memory-bound operation that moves more bytes than it computes FLOPs (intensity below 1) and runs "
               "in microseconds", weight=1):
        for flops, bytes_moved, seconds in [(268_435_456, 134_217_728 * 8, 4.1e-4), (1000, 12_000, 2.5e-6)]:
            _assert_point((flops, bytes_moved, seconds), flops / bytes_moved, flops / seconds / 1e12)


_q3_5_1_hidden_tests()
del _q3_5_1_hidden_tests
### END HIDDEN TESTS
del _assert_point
finish_checks("Question 3.5.1")

# %% [markdown]
# **Every operator, timed.** The cell below builds the MLP and the attention of the Gemma-3 270M configuration
# (random weights, `MODEL_DTYPE`) for a prefill of `op_batch` sequences of `op_len` tokens, and times each operator
# by itself with **your** `latency` (Question 1.2). FLOPs and bytes follow the conventions of Sections 3.1 and 3.2
# (each operator reads its inputs and writes its output once, a linear layer reads its weight), with these
# additions:
# - attention uses grouped-query heads (4 query heads share 1 key/value head): `k_proj` and `v_proj` are narrow;
#   for the attention itself the keys and values are repeated to every query head, as the Hugging Face eager
#   path does, and there is no mask;
# - `softmax` is PyTorch's fused kernel (`torch.softmax`): it reads the scores once and writes the probabilities
#   once, 2 passes over the $(B, H, L, L)$ scores; we count 4 FLOPs per score (row maximum, subtract, row sum,
#   divide; the `exp`, like GeLU's `tanh`, is not counted);
# - two points are aggregates, as in Section 3.4: the whole MLP (`Gemma3MLP`, its FLOPs and bytes from
#   `calc_mlp_flops` and `calc_mlp_io`, which counts bf16: its bytes are doubled for float32), and **your**
#   `scaled_dot_product_attention` of Question 3.1.1 (scores, scaling, softmax and `probs @ v`: FLOPs
#   $4BHL^2d + 5BHL^2$; bytes those of the three rows `q @ k^T`, `softmax` and `probs @ v` together: `q`, `k`, `v`
#   read and the output written once, and **4 passes** over the scores: `q @ k^T` writes them, the softmax reads
#   them and writes the probabilities, `probs @ v` reads those, with the scaling folded into `q @ k^T`).
#
#   This count of what attention moves (a 2-pass softmax, 4 passes in all) is the one this lab uses wherever it
#   measures attention: here and in Part 5, whose roofline predictions of attention (Question 5.2) count the same.
#   Question 3.2's 5-pass softmax is another thing: the handout's count of a softmax written as three separate
#   kernels, which `torch.softmax` is not. An attention that scales the scores in a kernel of its own (two more
#   passes) or writes its softmax operation by operation moves more than 4 passes, and its point sits further
#   under its roof;
# - one more point is a **decode** step of `gate_proj`: `op_batch` sequences of one new token each, the GEMV of
#   Part 2 in disguise.
#
# The table gives each operator's time, intensity and achieved TFLOP/s (from your `roofline_point`), the share of
# the roof (the measured one) it reached at its intensity, and, for the operators of the MLP, their share of the
# MLP's FLOPs and of its time. At cpu scale it takes a few seconds.

# %%
op_batch, op_len = at_scale(teaching=(8, 2048), quick=(1, 16), cpu=(1, 256))
op_warmup, op_repeat = at_scale(teaching=(5, 20), quick=(1, 2), cpu=(2, 5))
op_config = GEMMA3_270M_CONFIG
op_D, op_I = op_config.hidden_size, op_config.intermediate_size
op_heads, op_kv_heads, op_head_dim = op_config.num_attention_heads, op_config.num_key_value_heads, op_config.head_dim
op_tokens = op_batch * op_len
op_element_bytes = torch.finfo(MODEL_DTYPE).bits // 8
torch.manual_seed(0)
op_mlp = Gemma3MLP(op_config).to(device=DEVICE, dtype=MODEL_DTYPE).eval()
op_attn = Gemma3Attention(op_config, layer_idx=0).to(device=DEVICE, dtype=MODEL_DTYPE).eval()  # its projections


def linear_cost(tokens, in_features, out_features):
    """(FLOPs, bytes) of a linear layer on `tokens` rows: 2 FLOPs per MAC; read x and W, write y."""
    flops = 2 * tokens * in_features * out_features
    return flops, op_element_bytes * (tokens * in_features + in_features * out_features + tokens * out_features)


def random_input(*shape):
    return torch.randn(*shape, device=DEVICE, dtype=MODEL_DTYPE)


with torch.no_grad():
    op_x = random_input(op_batch, op_len, op_D)
    op_gate, op_up = random_input(op_batch, op_len, op_I), random_input(op_batch, op_len, op_I)
    op_q = random_input(op_batch, op_heads, op_len, op_head_dim)
    op_k = random_input(op_batch, op_kv_heads, op_len, op_head_dim).repeat_interleave(op_heads // op_kv_heads, dim=1)
    op_v = random_input(op_batch, op_kv_heads, op_len, op_head_dim).repeat_interleave(op_heads // op_kv_heads, dim=1)
    op_scores = random_input(op_batch, op_heads, op_len, op_len)
    op_attn_out = random_input(op_batch, op_len, op_heads * op_head_dim)
    op_decode_x = random_input(op_batch, 1, op_D)
    scores_elements = op_batch * op_heads * op_len * op_len  # B H L^2
    qkv_elements = op_batch * op_heads * op_len * op_head_dim  # B H L d
    elementwise = op_tokens * op_I  # B L I
    # name -> (function, arguments, FLOPs, bytes), in the order of the forward pass
    operators = {
        "q_proj": (op_attn.q_proj, (op_x,), *linear_cost(op_tokens, op_D, op_heads * op_head_dim)),
        "k_proj": (op_attn.k_proj, (op_x,), *linear_cost(op_tokens, op_D, op_kv_heads * op_head_dim)),
        "v_proj": (op_attn.v_proj, (op_x,), *linear_cost(op_tokens, op_D, op_kv_heads * op_head_dim)),
        "q @ k^T": (torch.matmul, (op_q, op_k.transpose(-2, -1)), 2 * scores_elements * op_head_dim,
                    op_element_bytes * (2 * qkv_elements + scores_elements)),
        "softmax": (functools.partial(torch.softmax, dim=-1), (op_scores,), 4 * scores_elements,
                    op_element_bytes * 2 * scores_elements),
        "probs @ v": (torch.matmul, (op_scores, op_v), 2 * scores_elements * op_head_dim,
                      op_element_bytes * (scores_elements + 2 * qkv_elements)),
        "o_proj": (op_attn.o_proj, (op_attn_out,), *linear_cost(op_tokens, op_heads * op_head_dim, op_D)),
        "attention (your 3.1.1)": (scaled_dot_product_attention, (op_q, op_k, op_v),  # the three rows above
                                   4 * scores_elements * op_head_dim + 5 * scores_elements,  # plus the scaling
                                   op_element_bytes * (4 * qkv_elements + 4 * scores_elements)),
        "gate_proj": (op_mlp.gate_proj, (op_x,), *linear_cost(op_tokens, op_D, op_I)),
        "up_proj": (op_mlp.up_proj, (op_x,), *linear_cost(op_tokens, op_D, op_I)),
        "GeLU": (functools.partial(F.gelu, approximate="tanh"), (op_gate,), 8 * elementwise,
                 op_element_bytes * 2 * elementwise),
        "gelu * up": (torch.mul, (op_gate, op_up), elementwise, op_element_bytes * 3 * elementwise),
        "down_proj": (op_mlp.down_proj, (op_gate,), *linear_cost(op_tokens, op_I, op_D)),
        "MLP (whole)": (op_mlp, (op_x,), calc_mlp_flops(op_batch, op_len, op_D, op_I),
                        calc_mlp_io(op_batch, op_len, op_D, op_I) // 2 * op_element_bytes),  # it counts bf16
        "gate_proj, decode": (op_mlp.gate_proj, (op_decode_x,), *linear_cost(op_batch, op_D, op_I)),
    }
    operator_latency_s = {}  # an operator whose answer is not written yet is left out
    for name in progress(list(operators), "operators"):
        fn, args, _, _ = operators[name]
        with uses_answers("Question 1.2"):
            operator_latency_s[name] = latency(fn, *args, warmup=op_warmup, repeat=op_repeat)

measured_points = {}
with uses_answers("Question 3.5.1"):
    for name, seconds in operator_latency_s.items():
        intensity, achieved_tflops = roofline_point(*operators[name][2:], seconds)
        measured_points[name] = (float(intensity), float(achieved_tflops))

mlp_parts = ["gate_proj", "up_proj", "GeLU", "gelu * up", "down_proj"]
mlp_timed = all(name in operator_latency_s for name in mlp_parts)
mlp_parts_s = sum(operator_latency_s[name] for name in mlp_parts) if mlp_timed else None
mlp_parts_flops = sum(operators[name][2] for name in mlp_parts)
print(f"prefill of {op_batch} x {op_len} tokens, Gemma-3 270M shapes, {MODEL_DTYPE}, {DEVICE}; measured ridge "
      f"{measured_peak_tflops / measured_bandwidth_tb_s:.1f} FLOP/byte")
print(f"{'operator':24s} {'time ms':>9s} {'FLOP/byte':>10s} {'TFLOP/s':>9s} {'of roof':>8s} {'MLP FLOPs':>10s} "
      f"{'MLP time':>9s}")
for name, (intensity, achieved_tflops) in measured_points.items():
    roof_tflops = min(measured_peak_tflops, measured_bandwidth_tb_s * intensity)
    shares = (f"{operators[name][2] / mlp_parts_flops:10.1%} {operator_latency_s[name] / mlp_parts_s:9.1%}"
              if name in mlp_parts and mlp_timed else "")
    print(f"{name:24s} {operator_latency_s[name] * 1e3:9.4f} {intensity:10.3g} {achieved_tflops:9.3g} "
          f"{achieved_tflops / roof_tflops:8.0%} {shares}")

# %% [markdown]
# #### Question 3.5.2 (2 points)
#
# **Plot, 2 points.** Place every operator of the table, measured, as its own point on a roofline drawn from
# the **measured** ceilings: `plot_roofline(name, peak_tflops, peak_bandwidth_tb_s, operations, title=...,
# measured_tflops=..., measured_bandwidth_tb_s=..., measured_label=..., measured_only=True)`, where `operations`
# maps each name to `(intensity, achieved TFLOP/s)` (that is `measured_points`) and `measured_only=True` draws each
# operator at its measured point only. On a GPU that `GPU_SPECS` knows, give the datasheet's peaks of `MODEL_DTYPE`
# as `peak_tflops` and `peak_bandwidth_tb_s` and the measured ceilings as `measured_*`: both roofs are drawn, side
# by side. On a CPU (`datasheet_tflops is None`) there is no datasheet: give the measured ceilings as the peaks and
# leave `measured_*` out.

# %% nbgrader={"grade": true, "grade_id": "q3_5_2_plot", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 3.5.2"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 2 points in total:
    # - 1 point: every operator of the table (projections, q @ k^T, softmax, probs @ v, GeLU, the product, the two
    #   aggregates and the decode gate_proj) placed at its measured point, from measured_points (achieved TFLOP/s
    #   against FLOP/byte), not on the roof: measured_only=True, or an equivalent plot of their own.
    # - 1 point: the roof drawn from the measured ceilings (measured_peak_tflops, measured_bandwidth_tb_s) of
    #   MODEL_DTYPE, and, on a GPU that GPU_SPECS knows, the datasheet's roof of the same dtype beside it (bf16 on a
    #   GPU: an fp32 datasheet roof costs this point). On a CPU the measured roof alone earns it; a CPU run plotted
    #   against the A6000's datasheet roof does not (the CPU's points against a GPU's roof say nothing).
    # A wrong roofline_point (Question 3.5.1) is not charged again: judge the plot against the student's own table.
    # === END MARK SCHEME ===
    if datasheet_tflops is not None:
        plot_roofline(gpu_name, datasheet_tflops, peak_bandwidth_tb_s, measured_points,
                      measured_tflops=measured_peak_tflops, measured_bandwidth_tb_s=measured_bandwidth_tb_s,
                      measured_label=f"measured on this {gpu_name}", measured_only=True,
                      title=f"Gemma-3 270M prefill, every operator measured, {MODEL_DTYPE}, on {gpu_name}")
    else:
        plot_roofline(f"this {DEVICE.type.upper()} (measured)", measured_peak_tflops, measured_bandwidth_tb_s,
                      measured_points, measured_only=True,
                      title=f"Gemma-3 270M prefill, every operator measured, {MODEL_DTYPE}, "
                            f"on this {DEVICE.type.upper()}")
    plt.show()
    ### END SOLUTION

# %% [markdown]
# #### Question 3.5.3 (3 points)
#
# **Written, 3 points.** From your table and plot: which operators are compute-bound, and which memory-bound, and
# why (name what sets their intensity)? Some points may sit far under their roof whatever their size: what limits
# those (what does your `latency` measure when one call's work on the device takes a few microseconds)? Then explain
# why the one-point view of the MLP in Section 3.4 misled: what does one aggregate intensity hide about where the
# MLP's time goes, and what would you optimise because of it? Quote your own numbers (intensities, the measured
# ridge, times, shares of the MLP's time). On a CPU answer from your CPU's table. Its measured ceilings are rough:
# small tensors may fit in the CPU's caches (the copy ran over more memory than they hold), and on a machine busy
# with other work the ceilings measured at one moment can be lower than what the operators reach at another, so
# points may sit above the roof (in the course's cpu-scale run in `measured_runs.md` the product `gelu * up` and
# the decode `gate_proj` did, at 490% and 145%); say so where you see it, and compare the operators with one another.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q3_5_3_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# (Numbers from the course's H200 run, the Section 3.5 table of `measured_runs.md`: bf16, $B L = 16384$ tokens,
# measured ridge 186.6 FLOP/byte.)
# **Compute-bound, and measured so**: the MLP's projections of the prefill (`gate_proj`, `up_proj`, `down_proj`).
# Each is a GEMM whose weight is read once and reused by every one of the $BL$ tokens, so its intensity is high
# (474 FLOP/byte in bf16; at cpu scale in float32, 84): right of the ridge, and they reach 642 to 704 TFLOP/s, 81 to
# 89% of the measured matmul ceiling (788.9 TFLOP/s). `q_proj` and `o_proj` (385 FLOP/byte) are compute-bound too,
# at 555 and 620 TFLOP/s (70 and 79%).
# **Near the ridge**: `q @ k^T` and `probs @ v` are GEMMs as well, with intensity $Ld / (2d + L)$ in bf16
# (205 FLOP/byte at $L = 2048$, $d = 256$): on the H200 that lies between its two ridges, right of the measured one
# (186.6) and just left of the datasheet's (206). They ran at 548 and 650 TFLOP/s, 69 and 82% of the measured
# roof. Longer sequences move them further right: the intensity grows towards $d = 256$ FLOP/byte, right of both
# ridges of the H200 (on a GPU whose bf16 ridge lies above $d$ it would stay left of the ridge at any length).
# **Memory-bound**: `GeLU` (8 FLOPs per element read and written: 2 FLOP/byte in bf16, 1 in float32), the
# product `gelu * up` (1 FLOP per 3 elements: 0.167 FLOP/byte in bf16) and `softmax` (4 FLOPs per score read and
# written: 1 FLOP/byte in bf16): far left of the ridge, each streams whole tensors through memory and runs at best
# at bandwidth x intensity; GeLU and the product reached 78 and 96% of that roof, the softmax 43%. Your attention
# of Question 3.1.1 is left of the ridge as well (114 FLOP/byte): its 4 passes over the scores dominate its bytes. It
# took 0.6553 ms, more than its three rows (0.1254, 0.2934 and 0.1058 ms) together: the reference's scaling
# `/ math.sqrt(d)` is a kernel of its own, two more passes over the scores that the count leaves out.
# **Bound by neither roof: the cost of one call.** `k_proj`, `v_proj` and the decode `gate_proj` all took 0.0192 to
# 0.0202 ms, although their FLOPs differ by a factor of 256 (`k_proj` against the decode step) and their intensities
# from 7.87 to 181 FLOP/byte: they reached only 3 to 35% of their roofs. The same time for 256 times the work: neither
# FLOPs nor bytes set it. `latency` calls the operator back to back from Python and divides the elapsed time by the
# number of calls, so it can never report less than the CPU's work for one call: the Python call of the `nn.Linear`
# module, PyTorch's dispatch (`aten::linear`, `aten::matmul`, `aten::mm`) and the kernel launch. When the device
# finishes a call's work sooner, it waits for the CPU, and the time measures the CPU: in the profile of Section 4.2
# on the same machine (also in `measured_runs.md`), one `aten::linear` took about 56 µs of CPU time (with the
# profiler's own overhead) for a GEMM kernel of 17 to 19 µs. So the decode `gate_proj`, whose intensity (7.87
# FLOP/byte, the GEMV of Part 2) says memory-bound, is not limited by memory here: its weight takes under a
# microsecond to read at 4.227 TB/s, and the 3% of its roof is the per-call floor. The same floor holds the narrow
# `k_proj` and `v_proj` (35%: at their roof they would need about a third of that time); `q_proj` and `o_proj`, with
# four times their work, already sit above it. To measure such small operators one needs less CPU work per call
# (CUDA graphs, Part 4), or more work per call.
# **Why the aggregate misled**: the whole MLP's intensity (213 FLOP/byte at this shape in bf16; 59 at cpu scale in
# float32) is total FLOPs over total bytes, but the MLP never runs at that intensity: it runs five kernels one after
# another, each at its own, and its time is the sum of the five times. The elementwise kernels do 0.2% of the MLP's
# FLOPs but move 55% of its bytes in bf16 at this shape (30% at cpu scale in float32: their $(B, L, I)$ tensors), and
# take a share of its time many times their share of FLOPs (14.3% and 17.4% of the MLP's time on the H200, nearly a
# third together; 3.1% and 0.3% in the course's cpu-scale run, whose float32 GEMMs are slow: its measured ridge is
# 5.6 FLOP/byte, so there even the elementwise share is small and fusing it would save little). One point near or
# right of the ridge says the whole MLP is compute-bound or "about balanced", so that a faster GEMM or a bigger
# batch would help; in fact the GEMMs already run
# near the compute roof and the rest of the time is pure memory traffic that no faster matmul touches. What helps is
# removing bytes: fusing the GeLU and the product (into one kernel, or into the `gate_proj`/`up_proj` epilogue, Part 4)
# so the $(B, L, I)$ intermediates never go to memory. (The measured roof is also lower than the datasheet's: 788.9
# TFLOP/s and 4.227 TB/s measured, 80% and 88% of the datasheet's 989.4 TFLOP/s and 4.8 TB/s, so the ridge moves from
# 206 to 187 FLOP/byte, and `q @ k^T` and `probs @ v` change sides; against the datasheet every point looks further
# from its roof than it is.)
# === BEGIN MARK SCHEME ===
# 3 points in total. Judge against the student's own table and plot (a wrong roofline_point is charged in
# Question 3.5.1 only; their own numbers, used correctly, earn full marks), GPU or CPU alike:
# - 1 point: places the operators by intensity against the measured ridge with the reason: the large projections
#   right of it (weight reuse across the B x L tokens, a GEMM) and GeLU, the product and softmax far left of it
#   (a few FLOPs per element streamed); q @ k^T / probs @ v near the ridge (their intensity, 205 FLOP/byte at
#   L = 2048, approaches d = 256 from below: on the H200 right of the measured ridge, 187, and just left of the
#   datasheet's, 206; either side is right when read off the ridge they plotted). "q @ k^T moves right of the
#   ridge with longer sequences" is right on a GPU whose bf16 ridge lies below d = 256 (the H200, an A6000) and
#   wrong only on one whose ridge lies above it; it does not cost the point alone. On a CPU, points above the
#   measured roof explained by the caches, or by ceilings measured low on a busy machine, are fine; the placing then
#   rests on the intensities and on the times relative to one another.
# - 1 point: explains the points far under both roofs (on a GPU the smallest operators, all near one time per call
#   whatever their work: in the course's H200 run k_proj, v_proj and the decode gate_proj) by the per-call cost that latency measures when the device's
#   work is shorter than the CPU's work per call (Python, dispatch, launch), not by memory or compute; or, where
#   their table shows no such floor, explains correctly why an operator sits under its roof. Calling the decode
#   gate_proj memory-bound from its intensity is fine only if the answer does not say memory limits its measured
#   time. A point at a few percent of its roof explained by "memory-bound" or "too few tiles" alone does not earn
#   this point when their times show the common floor.
# - 1 point: the aggregate misleads because the MLP runs as separate kernels, each limited by its own intensity:
#   its time is the sum of per-kernel times, not its FLOPs at one blended intensity; quotes the evidence (the
#   elementwise operators' share of the MLP's time far above their share of its FLOPs, from their table) and draws
#   the consequence: the memory-bound elementwise part is removed by fusion (fewer bytes), not by faster compute or
#   bigger batches (or: the datasheet roof overstates what is reachable, when tied to their measured ceilings).
# === END MARK SCHEME ===

# %% [markdown]
# # Part 4: Profiling with the PyTorch profiler
#
# The [PyTorch profiler](https://pytorch.org/docs/stable/profiler.html) records what your code really runs:
# every PyTorch operator on the CPU (`aten::mm`, `aten::mul`, ...) and, on a GPU, every **kernel** (a
# function launched on the GPU) with its duration. Three things to know:
# - `activities` says what to record: `ProfilerActivity.CPU` (operators) and, on a GPU,
#   `ProfilerActivity.CUDA` (kernels). On a CPU-only machine there are no kernels: each operator runs on the CPU.
# - `schedule=default_schedule` (from `utils`) skips the first iterations of a 10-step loop and records 5:
#   call `prof.step()` once per iteration. Warm-up iterations are not representative (Part 1).
# - `prof.key_averages().table(sort_by=...)` summarises the recorded steps: sort by `"cuda_time_total"`
#   on a GPU and by `"cpu_time_total"` on a CPU.

# %%
PROFILER_ACTIVITIES = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])
PROFILER_SORT_KEY = "cuda_time_total" if DEVICE.type == "cuda" else "cpu_time_total"
print(f"profiling {[a.name for a in PROFILER_ACTIVITIES]}, tables sorted by {PROFILER_SORT_KEY}")

# %% [markdown]
# ## 4.1 Basic profiling
#
# We profile a small matrix multiplication (this section has no question: the next one is Bonus 4.2).

# %%
a_prof = torch.randn(128, 128, dtype=MODEL_DTYPE, device=DEVICE)
b_prof = torch.randn(128, 128, dtype=MODEL_DTYPE, device=DEVICE)
with profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof:
    for _ in range(10):
        y_prof = torch.matmul(a_prof, b_prof)
        prof.step()
    synchronize_device()
print(prof.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=10))

# %% [markdown]
# On a GPU, the table lists the CUDA kernels that ran, besides the operators that launched them. Kernel names
# reveal the implementation: on an H200 or H100, `torch.matmul` in bf16 runs an NVIDIA cuBLAS kernel whose name
# starts with `nvjet` (the tile shape follows in the name, e.g. `nvjet_sm90_tst_64x8_64x16_2x4_h_bz_NNT`); on an
# A100 or A6000 you will see names such as `ampere_bf16_s16816gemm_...` or `cutlass_...`. On a CPU you see
# `aten::mm`, which calls a BLAS library.
#
# ## 4.2 Profiling the MLP
#
# Something more complex: the Gemma-3 270M MLP. The `record_function` labels of `Gemma3MLP` (`gate_proj`,
# `up_proj`, `act_fn`, `down_proj`) show up as rows too.

# %%
mlp_batch_size, mlp_seq_len = at_scale(teaching=(4, 1024), quick=(1, 32), cpu=(1, 256))
mlp_hidden_size = GEMMA3_270M_CONFIG.hidden_size
torch.manual_seed(0)
x_mlp = torch.randn(mlp_batch_size, mlp_seq_len, mlp_hidden_size, dtype=MODEL_DTYPE, device=DEVICE)
mlp = Gemma3MLP(GEMMA3_270M_CONFIG).to(device=DEVICE, dtype=MODEL_DTYPE).eval()

with torch.no_grad(), profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_mlp:
    for _ in range(10):
        _ = mlp(x_mlp)
        prof_mlp.step()
    synchronize_device()
print(prof_mlp.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=20))
eager_mlp_kernels = count_cuda_kernels(prof_mlp, per_step=True)
print(f"per MLP call: {eager_mlp_kernels}")

# %% [markdown]
# More kernels this time: five per call on a GPU (three GEMMs, the GeLU and the product), each launched by a
# chain of CPU-side operators. A table loses the *order* and the *gaps* between them; a timeline shows both.
# `prof.export_chrome_trace("trace_mlp.json")` writes the trace in the Chrome trace format, which you can open in
# [Perfetto](https://ui.perfetto.dev) (or `chrome://tracing` in Chrome). `plot_trace_timeline` draws the same
# timeline here: one row per GPU stream (kernels) and per CPU thread (operators and your `record_function`
# labels, nested by depth), dotted lines between profiler steps.

# %%
prof_mlp.export_chrome_trace("trace_mlp.json")
plot_trace_timeline("trace_mlp.json", title="Eager Gemma-3 270M MLP: 5 profiled steps")
plt.show()

# %% [markdown]
# #### Bonus 4.2 (5 points)
#
# Profile **one decode step (with the KV cache) of the full decoder layer** `layer` of Section 3.3 and show its
# timeline with `plot_trace_timeline`. Use `multi_layer_decode_forward` with `num_layers=1` and the cache
# `past_key_values` that the prefill of Section 3.3 filled, print the profiler table and the kernel counts
# (`count_cuda_kernels`), and point out in a comment or a printed line which part of the layer takes the most
# time.

# %% nbgrader={"grade": true, "grade_id": "b4_2_profile_decode", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Bonus 4.2"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 5 points in total:
    # - 1 point: one decode step with the KV cache (multi_layer_decode_forward with num_layers=1, use_kv_cache=True,
    #   the past_key_values filled by the prefill of Section 3.3), not a prefill and not the MLP alone.
    # - 1 point: profiled over 10 steps with default_schedule and prof.step(), synchronised before leaving.
    # - 1 point: the table (sorted by the device's time column) and count_cuda_kernels(..., per_step=True) printed.
    # - 1 point: the timeline shown with plot_trace_timeline.
    # - 1 point: names the part that takes the most time, consistent with their table (on a GPU typically attention
    #   over the cache, or the many small elementwise kernels taken together; on a CPU whatever their table puts first),
    #   and/or notes the launch gaps. The cache is preallocated and the new key/value written into it in place
    #   (utils.KVCacheLayer): there is no aten::cat of the cache to name; a student who names a copy must show it in
    #   their own table.
    # === END MARK SCHEME ===
    step_input, step_position_ids, step_cache_positions = create_decode_inputs_with_cache(
        prefill_batch_size, prefill_seq_len, hidden_size, dtype=MODEL_DTYPE, device=DEVICE)
    step_position_embeddings = get_position_embeddings(step_input, step_position_ids, rotary_emb)
    with profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_decode:
        for _ in range(10):
            multi_layer_decode_forward(1, layer, hidden_states=step_input, position_ids=step_position_ids,
                                       position_embeddings=step_position_embeddings, past_key_values=past_key_values,
                                       cache_positions=step_cache_positions, use_kv_cache=True,
                                       prefill_hidden_states=None)
            prof_decode.step()
        synchronize_device()
    print(prof_decode.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=15))
    print(f"per decode step of one layer: {count_cuda_kernels(prof_decode, per_step=True)}")
    plot_trace_timeline(prof_decode, title="One decode step of the Gemma-3 decoder layer (KV cache)")
    plt.show()
    # Reading it (H200, teaching scale; reports/h200/lab1_executed.ipynb, and the per-step numbers of
    # reports/lab1-h200.md divided by its 26 layers): one decode step of one layer launches 86 kernels (2236 / 26),
    # 70 of them elementwise (1820 / 26: RMSNorms in float32, RoPE, residual additions). On the GPU the largest single
    # part is attention over the KV cache (one fused attention kernel, 88.562 µs per step in the profile): it reads
    # the layer's whole cache (8 x 4097 tokens, 0.27 GB) once, at least 0.06 ms at 4.8 TB/s. The new token's key and
    # value are written into the preallocated cache in place, so nothing copies the cache. The projections of 8
    # tokens take little, and the elementwise kernels each do almost nothing, yet together they take most of the
    # rest. Launched from Python the step takes 1.6 to 2.3 ms per layer (42.2 to 60.90 ms / 26 in the report's two
    # runs), its GPU work about 0.3 ms (the CUDA graph's 7.50 ms / 26; 1.285 ms of kernels in the 5 recorded steps):
    # the GPU idles between tiny kernels while Python launches the next one. The decode step is launch-bound and
    # memory-bound, not compute-bound.
    # On a CPU (cpu scale) the table lists operators instead of kernels, with their CPU times: in the course's
    # cpu-scale run the projections (aten::mm, 83.03% of the step's CPU time, most of it the MLP's) took most of it,
    # attention over the cache of one 512-token sequence (aten::_scaled_dot_product_flash_attention_for_cpu) only
    # 4.08%; nothing copies the cache there either.
    ### END SOLUTION

# %%
# The decoder layer and its KV cache (7 GB at teaching scale) are not needed any more: free the memory.
del layer, past_key_values
if DEVICE.type == "cuda":
    torch.cuda.empty_cache()

# %% [markdown]
# ## 4.3 Kernel fusion
#
# The profiles show that even a simple layer launches many kernels. Each launch has a fixed cost (a few
# microseconds of CPU work and GPU scheduling), and, worse, each kernel reads its inputs from memory and writes
# its output back. **Kernel fusion** merges several operations into one kernel, saving both the launches and
# the memory round trips. Horace He's blog post [Making Deep Learning Go Brrrr From First
# Principles](https://horace.io/brrr_intro.html) explains it with a factory analogy, which we follow here.
#
# Think of the compute units as a **factory** and of the GPU's main memory (HBM) as a **warehouse**: the factory
# is fast but small, the warehouse is big but far away, and the road between them (memory bandwidth) is
# narrow.
#
# ![The factory and the warehouse](assets/kernel_fusion_1.png)
#
# A unary operation such as `torch.cos` ships every element from the warehouse to the factory, does one tiny
# computation on it and ships the result back. Nearly all the time is spent on the road: the operation is
# **memory-bound** (intensity far below the ridge point, like the GEMV of Part 2).
#
# A sequence of such operations, run one kernel at a time, is worse still: every intermediate result makes the
# round trip.
#
# ![Three unfused kernels](assets/kernel_fusion_2.png)
#
# Fusion keeps the data in the factory for the whole sequence: one trip in, one trip out.
#
# ![One fused kernel](assets/kernel_fusion_3.png)
#
# Let us measure what fusion buys on the GeLU activation of the MLP.
#
# #### Question 4.3.1 (3 points)
#
# The GeLU activation with the tanh approximation is
#
# $$\text{GELU}(x) \approx 0.5\,x\left[1 + \tanh\left(\sqrt{\frac{2}{\pi}}\left(x + 0.044715\,x^3\right)\right)\right].$$
#
# Implement it with elementwise PyTorch operations: `torch.tanh`, powers, multiplications, additions,
# `math.sqrt`/`math.pi` for the constant. Do not call a GeLU implementation (`F.gelu`, `nn.GELU`, ...: an answer
# that calls one earns at most a quarter of the points). The
# output has the input's shape, dtype and device, and matches the formula computed in float64 to
# `2e-6 + 1e-5 * |expected|` per element for `float32` inputs and `1e-12 * (1 + |expected|)` for `float64` ones.

# %% nbgrader={"grade": false, "grade_id": "q4_3_1_gelu", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gelu_tanh_python(input):
    """GeLU, tanh approximation, written as separate elementwise operations.

    Args:
        input (torch.Tensor): any shape, floating dtype.

    Returns:
        torch.Tensor: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), same shape, dtype and device as input.
    """
    ### BEGIN SOLUTION
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_3_1_gelu_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_x = torch.linspace(-4, 4, 101, device="cpu")  # CPU on every grader; the device rule is a hidden check of its own
with check("matches the formula (computed in float64) on 101 float32 points in [-4, 4], with the input's shape and "
           "dtype", weight=2):
    _x64 = _x.cpu().double()
    _expected = 0.5 * _x64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (_x64 + 0.044715 * _x64 ** 3)))
    assert_tensor_close(gelu_tanh_python(_x), _expected, "gelu_tanh_python(x) for x = linspace(-4, 4, 101)",
                        rtol=1e-5, atol=2e-6, dtype=_x.dtype)
del _x, _x64, _expected
### BEGIN HIDDEN TESTS
def _q4_3_1_hidden_tests():
    def reference(x):
        x = x.detach().to("cpu", torch.float64)
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    gen = torch.Generator().manual_seed(43)
    inputs = [  # CPU tensors on every grader
        (torch.randn(10_000, generator=gen, dtype=torch.float64) * 3).to(torch.float32),
        torch.randn(37, 53, generator=gen, dtype=torch.float64).to(torch.float32),
        (torch.randn(3, 17, 29, generator=gen, dtype=torch.float64) * 2).to(torch.float64),
        torch.linspace(-12, 12, 2401, dtype=torch.float64).to(torch.float32),
    ]

    @kernel_side
    def gelu_recorded(x):
        """In the kernel: gelu_tanh_python(x) and the sorted names of the torch functions it called (best effort)."""
        with record_torch_calls() as called:
            out = gelu_tanh_python(x)
        return out, sorted(called)

    with check("matches the formula computed in float64 to 2e-6 + 1e-5 |expected| (float32) and 1e-12 (1 + |expected|) "
               "(float64), for other shapes and values in [-12, 12]", weight=3):
        for x in inputs:
            float32 = x.dtype == torch.float32
            assert_tensor_close(gelu_tanh_python(x), reference(x),
                                f"gelu_tanh_python(x) for an input of shape {tuple(x.shape)} and dtype {x.dtype} "
                                "(0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))",
                                rtol=1e-5 if float32 else 1e-12, atol=2e-6 if float32 else 1e-12, dtype=x.dtype)

    with check("returns its result on the input's device (device rule, also for tensors it creates; input on DEVICE)",
               weight=1):
        x = inputs[1].to(DEVICE)
        assert_on_input_device(gelu_tanh_python, (x,), x.device, "gelu_tanh_python(x)")

    # The method of the question: when it fails the cell earns at most a quarter (checks.SKIPPED_METHOD_SHARE).
    with check("written from elementwise operations (no F.gelu, nn.GELU or other GeLU routine), computing its output "
               "from the input", weight=2, method=True):
        outputs = []
        for x in inputs[1:3]:
            out, called = gelu_recorded(x)
            outputs.append(out)
            assert_calls(called, "gelu_tanh_python (write GeLU from elementwise operations)",
                         forbidden=sorted(n for n in called if "gelu" in n.lower()))
        # Code that computes nothing is not the method: the output must change when the input changes.
        assert not torch.equal(as_tensor(outputs[0], "gelu_tanh_python(x)"),
                               as_tensor(gelu_tanh_python(inputs[1] + 1), "gelu_tanh_python(x + 1)")), (
            "gelu_tanh_python must compute its output from the input: it did not change when the input changed")


_q4_3_1_hidden_tests()
del _q4_3_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 4.3.1")

# %% [markdown] deletable=false editable=false tags=["measure"]
# *Timed after grading, for no points:* the grading GPU times your `gelu_tanh_python` in float32 on 16M and 64M
# elements, and your feedback shows the bandwidth it reached beside the reference solution's.
#
# ```measure
# {
#     # FLOP: about 8 per element (the polynomial and the tanh counted as one). Fewest bytes: x read once and the
#     # output written once (the separate elementwise operations read and write N elements each; a fused kernel
#     # would not).
#     "name": "gelu",
#     "function": "gelu_tanh_python",
#     "kind": "gelu_tanh",
#     "cells": ["q4_3_1_gelu"],
#     "tests": ["q4_3_1_gelu_tests"],
#     "dtype": "float32",
#     "flops": "8 * N",
#     "bytes": "2 * N * element_bytes",
#     "metric": "gbps",
#     "tolerance": 1e-4,
#     "warmup": 3,
#     "repeat": 10,
#     "timeout_s": 60.0,
#     "shapes": [{"N": 16777216}, {"N": 67108864}],
#     "tiny_shapes": [{"N": 1000}],
# }
# ```

# %% [markdown]
# #### Question 4.3.2 (2 points)
#
# Measure the latency of your `gelu_tanh_python` and of PyTorch's fused GeLU,
# `F.gelu(x, approximate="tanh")`, on `x_gelu` with your `latency` function, and store them **in milliseconds** in
# `python_gelu_latency_ms` and `pytorch_gelu_latency_ms`.
#
# `x_gelu` is large on purpose: $2^{28}$ float32 elements (1 GiB) at teaching scale, a million at cpu scale. Each
# pass over it then takes far longer than launching a kernel, so what you measure is the memory traffic, which is
# what fusion saves. (At small sizes something else sets the time: Section 4.4 measures both.)

# %% nbgrader={"grade": true, "grade_id": "q4_3_2_gelu_latency", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
x_gelu = torch.randn(at_scale(teaching=2**28, quick=100_000, cpu=1_000_000), device=DEVICE)
with uses_answers("Question 4.3.2"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 2 points in total:
    # - 1 point: both latencies measured with the student's latency() on x_gelu (not typed, not another tensor),
    #   gelu_tanh_python against F.gelu(x_gelu, approximate="tanh") (the tanh variant, not the default erf one).
    # - 1 point: stored in milliseconds (latency returns seconds: x 1e3) in python_gelu_latency_ms and
    #   pytorch_gelu_latency_ms; the printed ratio is plausible (Python slower: about 9x on a GPU at teaching scale,
    #   where the time is memory traffic, 18 passes against 2; on a CPU it depends on the machine, 2.6x in the
    #   course's cpu-scale run, reports/cpu-2core/lab1-cpu_executed.ipynb: judge it against the student's own run).
    # === END MARK SCHEME ===
    python_gelu_latency_ms = latency(gelu_tanh_python, x_gelu) * 1e3
    pytorch_gelu_latency_ms = latency(F.gelu, x_gelu, approximate="tanh") * 1e3
    ### END SOLUTION
    print(f"Python GeLU latency:  {python_gelu_latency_ms:.4f} ms")
    print(f"PyTorch GeLU latency: {pytorch_gelu_latency_ms:.4f} ms "
          f"({python_gelu_latency_ms / pytorch_gelu_latency_ms:.1f}x faster)")

# %% [markdown]
# #### Question 4.3.3 (2 points)
#
# Describe your findings: which is faster, by how much, and why?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q4_3_3_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# PyTorch's GeLU is about 9x faster at teaching scale: on the course's H200, $2^{28}$ elements took 4.51 ms with the
# Python version against 0.507 ms with `F.gelu` (reports/lab1-h200.md, GeLU table; 8.9x in the notebook's run,
# reports/h200/lab1_executed.ipynb). GeLU is elementwise, a
# few FLOPs per 8 bytes moved: memory-bound. The Python version runs each operation as its own kernel, `pow`,
# four multiplications, two additions and `tanh` (8 kernels), and each streams whole tensors through memory: six
# of them read one tensor and write one (2 passes each), two (`x + ...` and the final product) read two and write
# one (3 passes each), so $6 \cdot 2 + 2 \cdot 3 = 18$ passes, plus seven temporary allocations. `F.gelu` is one
# fused kernel that reads `x` once, keeps every intermediate in registers and writes the result once: 2 passes.
# $18 / 2 = 9$ is the measured ratio: at this size the time is the memory traffic, and the fused kernel runs at
# the copy bandwidth (0.507 ms for 2 GiB moved, 4.23 TB/s in the report). At small sizes the story changes: for a
# million elements on the H200 the memory needs under 3 µs, yet the Python version took 0.08 to 0.10 ms and `F.gelu`
# 0.009 to 0.02 ms (report, GeLU table, and the printed output of Section 4.4's `torch.compile` cell in
# reports/h200/lab1_executed.ipynb): there the time is the CPU's work of launching kernels from Python, which
# dominates the memory traffic (Section 4.4 shows it).
# (At cpu scale the ratio is the student's own, 2.6x in the course's cpu-scale run: the same passes and
# temporaries, on the CPU's memory bandwidth and caches, plus 8 operator calls instead of 1.)
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: reports that the fused PyTorch GeLU is faster, with the ratio they measured (GPU or CPU).
# - 1 point: explains it: GeLU is memory-bound; the Python version runs one kernel (on a CPU, one operator) per
#   operation, each reading and writing whole tensors, so it moves several times the bytes (18 passes against 2
#   if counted; "about 8 or 9 times the traffic" is fine); F.gelu is a single fused kernel. Naming launch
#   overhead as the main cause at teaching scale is wrong (it dominates only at small sizes, Section 4.4); it
#   costs the point only if it is the whole explanation.
# === END MARK SCHEME ===

# %% [markdown]
# #### Question 4.3.4 (3 points)
#
# **(a) Code, 2 points.** Use the profiler to show where the difference comes from: profile both GeLUs on
# `x_gelu` (10 steps each with `default_schedule`), print both tables and the kernel counts
# (`count_cuda_kernels`).

# %% nbgrader={"grade": true, "grade_id": "q4_3_4_profile", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 4.3.4 (a)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 2 points in total:
    # - 1 point: both GeLUs profiled on x_gelu, 10 steps each with default_schedule and prof.step(), synchronised.
    # - 1 point: both tables and both kernel counts (count_cuda_kernels, per step) printed; the tables show 8
    #   elementwise operators per call for the Python version and one aten::gelu (on a CPU: operators instead of
    #   kernels). The printed kernel count may be larger than 8 at teaching scale on a GPU: the course's H200 run
    #   printed 13 (reports/h200/lab1_executed.ipynb), its table 64 kernel executions in the 5 recorded steps for 40
    #   operator calls, because kernels queued by the unrecorded steps were still running when recording started
    #   (Question 4.3.4 (b)). That is what this code measures: it costs nothing here.
    # === END MARK SCHEME ===
    with profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_python_gelu:
        for _ in range(10):
            _ = gelu_tanh_python(x_gelu)
            prof_python_gelu.step()
        synchronize_device()
    with profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_torch_gelu:
        for _ in range(10):
            _ = F.gelu(x_gelu, approximate="tanh")
            prof_torch_gelu.step()
        synchronize_device()
    print("Python GeLU:")
    print(prof_python_gelu.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=12))
    print("PyTorch GeLU:")
    print(prof_torch_gelu.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=6))
    print(f"kernels per call: Python GeLU {count_cuda_kernels(prof_python_gelu, per_step=True)['total']}, "
          f"PyTorch GeLU {count_cuda_kernels(prof_torch_gelu, per_step=True)['total']}")
    ### END SOLUTION

# %% [markdown]
# **(b) Written, 1 point.** What do the profiles show? Compare the kernels per call that `count_cuda_kernels`
# printed with the operators' `# of Calls` in the tables (over the 5 recorded steps); if they disagree, say why.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q4_3_4_answer", "locked": false, "points": 1, "schema_version": 3, "solution": true, "task": false}
# The Python GeLU runs eight separate elementwise operators per call, one kernel each: in the 5 recorded steps the
# table lists `aten::pow` 5 times, `aten::mul` 20, `aten::add` 10 and `aten::tanh` 5, against 5 calls of
# `aten::gelu` for `F.gelu`. Each kernel streams whole tensors through memory: those that read one tensor take about
# as long as the single `gelu` kernel (0.504 ms each on the course's H200 at $2^{28}$ elements,
# reports/h200/lab1_executed.ipynb), the two that read two tensors (`x + 0.044715 x^3` and the final product)
# about 1.5 times as long (0.738 ms), so the Python version's GPU time per call is about 9 times `F.gelu`'s (4.5 ms
# against 0.504 ms), and it makes eight times the CPU launch work (`cudaLaunchKernel`). The slowdown is the number
# of memory passes, not the arithmetic.
# The printed count says 13 kernels per call for the Python version, not 8, because the table holds 64 kernel executions
# in the 5 recorded steps (one elementwise kernel 24 times, three per call, and five others 8 times each: 8 calls'
# worth) where the steps' own 40 operator calls launch 40. The CPU queues a call's 8 kernels in well under a
# millisecond, while the GPU needs 4.5 ms to run them, so the loop runs ahead of the GPU; when recording starts, the GPU
# is still running the kernels queued by the unrecorded steps before it, and the profiler records them as they run.
# `F.gelu` shows the same (6 kernel executions in 5 steps, which rounds to 1 per step). The operators' calls are the
# count per call: 8 against 1. (A `synchronize_device()` before each `prof.step()` would keep each step's kernels inside
# its own step.) On a CPU the table shows the same eight operators against one `aten::gelu`, with CPU times instead of
# kernels, and no such difference: an operator there finishes before the next one starts.
# === BEGIN MARK SCHEME ===
# 1 point in total:
# - 0.5 point: names the evidence: 8 elementwise operators/kernels per call for the Python version against one
#   gelu kernel, each of similar duration (the two-input ones longer), so the total time scales with the number of
#   kernels / memory passes. A CPU profile (8 operators against one aten::gelu, with their CPU times) earns it.
# - 0.5 point: the count per call read consistently with their tables: 8 against 1 from the operators' calls, and
#   where the printed kernel count is larger (13 in the course's H200 run at teaching scale), a correct reason
#   (kernels queued before the recorded steps, still running and recorded inside them; the GPU lags the CPU).
#   "The Python GeLU launches 13 kernels per call" taken at face value does not earn this half. On a CPU, or
#   where their count shows 8, reading 8 against 1 earns it.
# === END MARK SCHEME ===

# %% [markdown]
# ## 4.4 `torch.compile` and CUDA Graphs
#
# [`torch.compile`](https://pytorch.org/docs/stable/torch.compiler.html) turns eager PyTorch code into optimised
# kernels: it traces the operations of your function (TorchDynamo), fuses neighbouring operations where it can
# and generates kernels for them (TorchInductor: Triton kernels on a GPU, C++ on a CPU). Fewer, larger kernels
# mean fewer launches and fewer memory round trips.
#
# Compiling takes tens of seconds the first time (up to a minute or two on a CPU), so the cells of this section
# run at teaching and cpu scale and print one line and move on at quick scale. Each says so before a long
# compile. We first compile your GeLU, profile it, and time the three versions at two sizes: `x_gelu` and a small
# tensor (a million elements on a GPU, a thousand on a CPU).

# %%
if SCALE in ("teaching", "cpu"):
    with uses_answers("Question 4.3.1", "Question 1.2"):
        print("compiling gelu_tanh_python with torch.compile: 20 s to a minute the first time, longer on a busy CPU")
        compiled_gelu = torch.compile(gelu_tanh_python)
        x_gelu_small = torch.randn(at_scale(teaching=1_000_000, quick=1_000, cpu=1_000), device=DEVICE)
        for x in (x_gelu, x_gelu_small):
            for _ in range(3):  # the first call of each size compiles
                compiled_gelu(x)
        with profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_compiled_gelu:
            for _ in range(10):
                _ = compiled_gelu(x_gelu)
                prof_compiled_gelu.step()
            synchronize_device()
        print(prof_compiled_gelu.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=10))
        if DEVICE.type == "cuda":
            print(f"compiled GeLU: {count_cuda_kernels(prof_compiled_gelu, per_step=True)['total']} kernel(s) per call")
        else:
            print("compiled GeLU: one generated C++ loop per call, run inside the CompiledFxGraph call of the table "
                  "(no aten operators left to count)")
        gelu_versions = {"Python (8 ops)": gelu_tanh_python, "F.gelu": functools.partial(F.gelu, approximate="tanh"),
                         "compiled": compiled_gelu}
        for x in progress((x_gelu_small, x_gelu), "GeLU sizes"):
            repeat = 100 if DEVICE.type == "cuda" or x.numel() <= 10_000 else 20
            gelu_ms = {name: latency(fn, x, repeat=repeat) * 1e3 for name, fn in gelu_versions.items()}
            print(f"{x.numel():>11,} elements: " + ", ".join(f"{name} {ms:.4f} ms" for name, ms in gelu_ms.items())
                  + f"; Python / F.gelu {gelu_ms['Python (8 ops)'] / gelu_ms['F.gelu']:.1f}x")
else:
    print("torch.compile of GeLU: skipped at quick scale (it runs at teaching and cpu scale)")

# %% [markdown]
# Two regimes show in these numbers (on the course's H200: this cell's printed output in `measured_runs.md` beside
# this notebook):
# - **Large tensors ($2^{28}$ elements): memory traffic.** The compiled GeLU is one generated kernel, close to
#   `F.gelu` (0.5902 and 0.5057 ms; 2 GiB moved, so `F.gelu` runs at about 4.2 TB/s, the copy bandwidth), and the
#   Python version is 8.9x slower than `F.gelu` (4.5140 ms): 18 memory passes against 2. Fusion pays by the passes
#   it saves.
# - **Small tensors (a million elements): launch overhead.** The memory needs under 3 µs, yet the Python version
#   took 0.0806 ms, the compiled one 0.0488 ms and `F.gelu` 0.0088 ms. The GPU finishes each kernel in a few
#   microseconds and waits for the CPU: for the Python version, eight kernel launches from Python; for the compiled
#   one, a single kernel but the work of the compiled wrapper around it in every call (Dynamo's guard checks, the
#   call into the generated code), so it costs several times `F.gelu`, between it and the Python version (another
#   run of the course on the same machine measured 0.0956, 0.0711 and 0.0204 ms for the three, in the same order).
#   Fusion saves no memory time here; what counts is the CPU's
#   work per call.
#
# On a CPU (cpu scale) look for the same two regimes in your own numbers, with operator calls instead of kernel
# launches. In the course's cpu-scale run (`measured_runs.md`), at a thousand elements every call costs
# microseconds of dispatch whatever it computes: the eight Python operators took 0.0164 ms, the compiled GeLU nearly
# as much (0.0143 ms: its wrapper) and the single `F.gelu` call 0.0022 ms. At a million elements the work counts:
# the Python version took 1.4439 ms, `F.gelu` 0.6046 ms and the compiled one 1.2116 ms, nearer the Python version
# than `F.gelu` (how the two fused versions compare depends on how well each kernel is vectorised and threaded on
# your CPU, and on what else runs on it).

# Now the MLP, compiled with `mode="max-autotune-no-cudagraphs"`, which does not use CUDA Graphs but autotunes:
# while it compiles, Inductor benchmarks several candidate kernels for each GEMM (cuBLAS and its own Triton
# templates, some with neighbouring elementwise work fused in) and keeps the one that was fastest in that
# benchmark. That is the fastest of the candidates it tried, under the benchmark's conditions (each candidate
# timed alone, a few runs each, once): candidates a few microseconds apart are told apart partly by noise, and the
# winner need not be the fastest once it runs inside the compiled program, next to the other kernels and with
# whatever work was fused into it. Question 4.4.1 shows a case.
#
# **Without a GPU** (cpu scale) the MLP is compiled for your CPU (Inductor writes C++ kernels instead of Triton
# ones; the compile takes tens of seconds), and you answer Question 4.4.1 from that profile. At quick scale set
# `compile_mlp_on_cpu = True` in the first cell below to compile anyway. The grader never compiles, whatever you
# leave in this cell.

# %%
compile_mlp_on_cpu = SCALE == "cpu"  # True compiles the MLP on a CPU at any scale (see above)

# %% nbgrader={"grade": false, "grade_id": "compile_mlp", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Locked: the grader never compiles (NBGRADER_EXECUTION is set while nbgrader runs the notebook).
if SCALE == "teaching" or (compile_mlp_on_cpu and not os.environ.get("NBGRADER_EXECUTION")):
    print(f"compiling the MLP for {DEVICE.type}"
          + (" with max-autotune (about a minute: Inductor benchmarks GEMM candidates)" if DEVICE.type == "cuda"
             else " (tens of seconds)"))
    # Dynamo drops the record_function labels (Question 4.4.1 asks you to notice it); its warning says only that.
    logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(
        lambda record: "Profiler record function" not in record.getMessage())
    compiled_mlp = torch.compile(mlp, mode="max-autotune-no-cudagraphs" if DEVICE.type == "cuda" else None)
    with torch.no_grad():
        for _ in range(3):  # compile and autotune
            compiled_mlp(x_mlp)
    print(f"compiled the MLP for {DEVICE.type}")
else:
    compiled_mlp = None
    print("torch.compile of the MLP: skipped at quick scale (it runs at teaching and cpu scale; set "
          "compile_mlp_on_cpu = True above to compile on a CPU anyway)")

# %% [markdown]
# #### Question 4.4.1 (5 points)
#
# **(a) Code, 2 points.** Profile `compiled_mlp` on `x_mlp` as we profiled the eager `mlp` in Section 4.2
# (table, kernel counts, timeline). Keep the cell working at quick scale, where `compiled_mlp` is `None`: print
# one line and move on.
#
# **Without a GPU:** compile on your CPU (cpu scale does it; at quick scale set `compile_mlp_on_cpu = True`
# above), profile that, and answer (b) from your CPU profile against the eager one of Section 4.2: the profiler
# then shows CPU operators instead of GPU kernels. Inductor's generated C++ code runs inside the `CompiledFxGraph`
# call (its self time), so look for which operators of the eager profile are gone into it and which remain as calls
# of their own (in the course's cpu-scale run the three `aten::mm` remained: 3 operators per call instead of 5 in
# eager mode). The marks are for the same observations as on a GPU: what was fused, what remains, what the CPU
# side shows.

# %% nbgrader={"grade": true, "grade_id": "q4_4_1_profile", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Question 4.4.1 (a)"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 2 points in total:
    # - 1 point: compiled_mlp profiled on x_mlp like the eager MLP (10 steps, default_schedule, prof.step(),
    #   synchronised, under torch.no_grad()), with the table, the kernel counts and the timeline.
    # - 1 point: the cell still runs where compiled_mlp is None (prints one line, does not raise). A CPU-only
    #   student who compiled on the CPU (compile_mlp_on_cpu = True) and profiled operators earns full marks.
    # === END MARK SCHEME ===
    if compiled_mlp is not None:
        with torch.no_grad(), profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_compiled_mlp:
            for _ in range(10):
                _ = compiled_mlp(x_mlp)
                prof_compiled_mlp.step()
            synchronize_device()
        print(prof_compiled_mlp.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=20))
        print(f"kernels per call: eager {eager_mlp_kernels['total']}, "
              f"compiled {count_cuda_kernels(prof_compiled_mlp, per_step=True)['total']}")
        with torch.no_grad():
            print(f"latency: eager {latency(mlp, x_mlp) * 1e3:.3f} ms, "
                  f"compiled {latency(compiled_mlp, x_mlp) * 1e3:.3f} ms")
        plot_trace_timeline(prof_compiled_mlp, title="Compiled Gemma-3 270M MLP (max-autotune-no-cudagraphs)")
        plt.show()
    else:
        print("profiling the compiled MLP: skipped at quick scale")
    ### END SOLUTION

# %% [markdown]
# **(b) Written, 3 points.** Describe the differences from the eager MLP of Section 4.2.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q4_4_1_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# The compiled MLP launches fewer kernels (on the course's H200: 4 per call instead of 5), yet its GPU time grew:
# the profiles in reports/h200/lab1_executed.ipynb show about 76 µs of kernels per eager call and 87 µs per
# compiled one. Fusion saved a little: the GeLU and the elementwise product, two kernels in eager mode
# (`aten::gelu` and `aten::mul`, 10.7 and 10.9 µs, each reading and writing $(B, L, I)$ tensors), became one
# generated Triton kernel (`triton_poi_fused__unsafe_view_gelu_mul_1`, 14 µs), one kernel and two of the five passes
# over $(B, L, I)$ tensors fewer. The GEMMs lost more: autotuning chose Inductor's Triton templates
# (`triton_tem_fused_...`) for all three, and inside the compiled MLP each took 24 µs, where eager's cuBLAS kernels
# (`nvjet...`) took 19 µs for `gate_proj` and `up_proj` and 17 µs for `down_proj`.
# Autotuning keeps the candidate that was fastest in its own benchmark while compiling: the fastest of the
# candidates it tried, each timed alone for a few runs, once. For GEMMs of about 20 µs the candidates lie a few
# microseconds apart, so the choice is partly noise, and the benchmark does not time the kernel where it finally
# runs, between the others (the template chosen for `down_proj` also carries the GeLU and the product in its
# name: work fused into it that the cuBLAS GEMM does not do). So the compiled MLP is not faster on the GPU. It
# measured faster all the same, 0.122 ms against 0.189 ms eager (reports/lab1-h200.md, MLP table; 0.097 against
# 0.132 ms in the notebook's own run), and the eager times lie far above the eager GPU time (1.7 to 2.5 times it):
# at this size an eager call is bound by the CPU's work per call, and the compiled call, with less CPU work per
# call, comes closer to its own kernels' time. That is where the difference comes from, not from fusion. Even
# a perfect fusion could save little here: the three GEMMs do almost all the FLOPs and take most of the GPU time,
# and with $B L = 4096$ tokens the saved elementwise passes are about 34 MB, roughly 7 µs at the H200's 4.8 TB/s
# (the fused kernel's 14 µs against the two eager ones' 21.6), under a tenth of the call's GPU time. (For the GeLU alone, Section 4.3, the same fusion gave 9x, because there
# the elementwise passes were the whole cost.) The `record_function` labels disappear (Dynamo ignores them; the
# call shows up as a `Torch-Compiled Region` with a `CompiledFxGraph`), and new CPU work appears
# (`TorchDynamo Cache Lookup`, guards). The CPU still launches every remaining kernel one by one.
# === BEGIN MARK SCHEME ===
# 3 points in total:
# - 1 point: fewer kernels; the activation and the product are fused into one (Triton) kernel.
# - 1 point: the GEMMs remain (cuBLAS or autotuned Triton templates) and dominate the time; fusion only saves
#   the elementwise part's traffic, so the GPU time does not drop much, and may grow (in the H200 run's profiles
#   about 76 µs eager and 87 µs compiled per call, the autotuned templates slower there than eager's cuBLAS: an
#   explanation by autotuning keeping what was fastest in its own compile-time benchmark, timing noise or fused
#   work is right; "autotuning always picks the fastest kernel" is not); a faster compiled latency (the H200 run
#   measured 0.122 ms compiled against 0.189 ms eager, reports/lab1-h200.md; 0.097 against 0.132 ms in its
#   executed notebook) comes from less CPU work per call, not from fusion.
#   "Compiled is faster" earns the point when their own numbers show it, with numbers from their profile.
# - 1 point: another correct observation from their profile: record_function labels replaced by a compiled
#   region, kernels still launched one by one from the CPU (launch gaps remain), different kernel names.
# A CPU-only student answers from a CPU profile (compile_mlp_on_cpu = True): the same three points, read off CPU
# operators and judged against their own eager and compiled profiles (the GeLU and the product gone into the
# generated code inside the CompiledFxGraph call, the three aten::mm left: 3 operators per call instead of 5 in the
# course's cpu-scale run, reports/cpu-2core/lab1-cpu_executed.ipynb; a compiled region in place of the labels).
# CPU latencies are accepted, judged against the student's own eager and compiled times (that run measured the two
# about equal, 13.033 ms compiled against 13.417 ms eager: the three aten::mm take nearly all of it, so a large
# "compiled is faster" is not expected on a CPU, and a few percent either way is within the noise).
# === END MARK SCHEME ===

# %% [markdown]
# `torch.compile` reduces the number of kernels, but the CPU still launches each remaining kernel one by one at
# every forward pass. A **CUDA Graph** records the whole sequence of launches once and then replays it with a
# single call: the CPU's launch work almost disappears, which matters most when kernels are short (small
# batches, decode). `mode="max-autotune"` autotunes like the previous mode *and* wraps the compiled function in
# CUDA Graphs. CUDA Graphs exist on NVIDIA GPUs only, so this cell needs a GPU at teaching scale; without one,
# read what CUDA graphs did to the decode step of Section 3.3 in `measured_runs.md` beside this notebook (eager
# against CUDA graph).

# %%
if DEVICE.type == "cuda" and SCALE == "teaching":
    print("compiling the MLP with max-autotune and CUDA Graphs (about a minute: autotuning, then graph capture)")
    torch.manual_seed(0)
    mlp_cudagraph = torch.compile(Gemma3MLP(GEMMA3_270M_CONFIG).to(device=DEVICE, dtype=MODEL_DTYPE).eval(),
                                  mode="max-autotune")
    with torch.no_grad():
        for _ in range(3):  # compile, autotune, then record the CUDA graph
            _ = mlp_cudagraph(x_mlp)
    print("compiled the MLP with CUDA Graphs")
else:
    mlp_cudagraph = None
    print("CUDA Graphs: skipped (they need an NVIDIA GPU at teaching scale); what they did to the decode step on the "
          "course's H200 is in measured_runs.md beside this notebook (Section 3.3)")

# %% [markdown]
# #### Bonus 4.4.2 (5 points)
#
# Profile `mlp_cudagraph` (10 steps with `default_schedule`), print the table and the kernel counts, and show
# the timeline. Compare it with the eager and compiled timelines: what happened to the CPU side, and to the
# gaps between kernels? Keep the cell working where `mlp_cudagraph` is `None` (print one line).

# %% nbgrader={"grade": true, "grade_id": "b4_4_2_profile_cudagraph", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
with uses_answers("Bonus 4.4.2"):  # your code goes in this block (unwritten, it says so and Run All goes on)
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 5 points in total:
    # - 1 point: mlp_cudagraph profiled on x_mlp over 10 steps with default_schedule and prof.step(), under
    #   torch.no_grad(), synchronised.
    # - 1 point: table and count_cuda_kernels(..., per_step=True) printed; timeline shown.
    # - 2 points: the comparison: on the CPU side one cudaGraphLaunch per step replaces the per-kernel launches,
    #   and the kernels run back to back (gaps between kernels gone or much smaller).
    # - 1 point: a correct conclusion about latency from their numbers: no gain, or a loss, for a 4-kernel MLP whose
    #   kernels are long (the H200 report measured 0.215 ms with graphs against 0.122 ms compiled without, and the
    #   executed notebook of that report 0.101 against 0.097 ms: no gain in either; each call
    #   still copies the input into the graph's static buffer and runs the graph wrapper's checks on the CPU, while
    #   there was little launch work to save); graphs pay off when many short kernels are launched (decode). A
    #   student whose own numbers show graphs faster, and says so, earns the point.
    # - The cell runs where mlp_cudagraph is None (one printed line). Without a GPU the bonus cannot be earned by
    #   profiling; a student who says so and answers the comparison from measured_runs.md beside the notebook (the
    #   H200 run's decode step of Section 3.3, eager against CUDA graph, and its kernel counts) earns at most 2
    #   points.
    # === END MARK SCHEME ===
    if mlp_cudagraph is not None:
        with torch.no_grad(), profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_cudagraph:
            for _ in range(10):
                _ = mlp_cudagraph(x_mlp)
                prof_cudagraph.step()
            synchronize_device()
        print(prof_cudagraph.key_averages().table(sort_by=PROFILER_SORT_KEY, row_limit=15))
        print(f"kernels per call: {count_cuda_kernels(prof_cudagraph, per_step=True)}")
        with torch.no_grad():
            print(f"latency with CUDA Graphs: {latency(mlp_cudagraph, x_mlp) * 1e3:.3f} ms")
        plot_trace_timeline(prof_cudagraph, title="Gemma-3 270M MLP compiled with CUDA Graphs (max-autotune)")
        plt.show()
        # The kernels are those of max-autotune-no-cudagraphs plus one copy of the input into the graph's static
        # buffer (5 per call in the H200 report: the copy is the `multi_tensor` kernel of `aten::_foreach_copy_`). On
        # the CPU side the per-kernel launch calls are replaced by a single `cudaGraphLaunch` per step, and the kernels
        # run back to back on the GPU. Yet for this MLP (4 x 1024 tokens) the graph gains nothing: 0.215 ms against
        # 0.122 ms compiled without graphs on the course's H200 (reports/lab1-h200.md, MLP table), and 0.101 against
        # 0.097 ms in this cell's run there (reports/h200/lab1_executed.ipynb). Four kernels of 14 to 24 µs each leave
        # little launch work to save (in the compiled MLP's profile, 4 `cuLaunchKernel` calls of about 5 µs, a small
        # part of the call's CPU work of guards and wrappers), while every call adds the input copy and the CPU
        # work of the graph wrapper (checking that the inputs and the recorded graph still match, managing its
        # memory pool). CUDA Graphs pay off when a call launches many short kernels: the decode step of Section 3.3
        # (2236 kernels) took 42.2 to 60.90 ms launched from Python and 7.5 ms replayed as a CUDA graph (same runs).
    else:
        print("profiling the CUDA-Graph MLP: skipped (it needs an NVIDIA GPU at teaching scale)")
    ### END SOLUTION

# %% [markdown]
# # Part 5: FlashAttention
#
# In this part we see what limits standard attention, and how FlashAttention removes the limit.
#
# ## 5.1 The limits of standard attention
#
# Your `scaled_dot_product_attention` materialises the full score matrix $QK^\top$ of shape
# $(B, H, L, L)$ (and the probabilities, of the same shape). The cell below measures its peak memory for
# growing sequence lengths (batch 1, 16 heads, head dimension 128; `float16` on a GPU, `float32` on a CPU)
# until it runs out of memory: an out-of-memory error is reported as a row of the table, not as a crash, and
# the sweep stops there (longer sequences would fail too). At cpu scale the sweep stops at 2048 tokens (under a
# GB), enough to see how the memory grows; a CPU would swap long before it reported running out.

# %%
attn_batch, attn_heads, attn_head_dim = 1, 16, 128
ATTN_DTYPE = torch.float16 if DEVICE.type == "cuda" else torch.float32
attn_bytes_per_element = torch.finfo(ATTN_DTYPE).bits // 8
memory_seq_lens = at_scale(teaching=[512, 1024, 2048, 4096, 8192, 16384, 32768, 65536], quick=[128, 256, 512],
                           cpu=[256, 512, 1024, 2048])


def random_qkv(seq_len, layout="bhsd"):
    """Random q, k, v of shape (B, H, S, D) ("bhsd", SDPA's layout) or (B, S, H, D) ("bshd", flash-attn's)."""
    shape = (attn_batch, attn_heads, seq_len, attn_head_dim) if layout == "bhsd" else \
        (attn_batch, seq_len, attn_heads, attn_head_dim)
    return tuple(torch.randn(*shape, dtype=ATTN_DTYPE, device=DEVICE) for _ in range(3))


def sdpa_peak_memory_gb(seq_len):
    """Peak memory (GB) of scaled_dot_product_attention above its inputs, for one sequence length."""
    q, k, v = random_qkv(seq_len)
    peak_gb, _ = benchmark_memory(scaled_dot_product_attention, q, k, v, n_warmup=1, n_repeat=3)
    return peak_gb


sdpa_memory_rows = []
with uses_answers("Question 3.1.1"):
    for seq_len in progress(memory_seq_lens, "sequence lengths"):
        status, peak_gb = run_oom_safe(sdpa_peak_memory_gb, seq_len)
        scores_gb = attn_batch * attn_heads * seq_len ** 2 * attn_bytes_per_element / 1e9  # one (B, H, L, L) tensor
        sdpa_memory_rows.append({"seq_len": seq_len, "status": status, "peak_gb": peak_gb,
                                 "scores_matrix_gb": scores_gb})
        if status == "oom":
            break
    sdpa_memory_df = pd.DataFrame(sdpa_memory_rows)
    print(mark_oom(sdpa_memory_df, float_format=lambda v: f"{v:.4f}").to_string(index=False))

# %% [markdown]
# #### Question 5.1 (10 points)
#
# 1. What is the memory complexity of standard attention in the sequence length $L$? Use the table. (3 points)
# 2. From which sequence length does it become a problem on your GPU, and why there? (If you ran on a CPU,
#    answer for the course's 141 GB H200 in `float16`: extrapolate your table's growth (yours is in `float32`,
#    twice the bytes), and compare with the table of this cell that the course measured on it, in
#    `measured_runs.md` beside this notebook.) (3 points)
# 3. What is the main memory overhead of standard attention, and in which LLM scenarios is it a serious
#    problem? (4 points)

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_1_complexity_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# **1.** $O(L^2)$ (more precisely $O(B H L^2)$ for the scores and probabilities, plus $O(B H L d)$ for $Q, K, V$
# and the output). The table shows it: every doubling of $L$ multiplies the peak memory by about 4, and the
# peak tracks a small multiple (about 2 on a GPU) of the size of one $(B, H, L, L)$ score matrix.
# === BEGIN MARK SCHEME ===
# 3 points: O(L^2) (or O(B H L^2)) memory, 2 points; supported by the table (x4 per doubling, peak proportional
# to the L x L score matrix), 1 point.
# === END MARK SCHEME ===

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_1_problem_length_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# **2.** On the course's 141 GB H200 in `float16`, one score matrix is $16 L^2 \cdot 2$ bytes: 2.1 GB at
# $L = 8192$, 8.6 GB at 16384, 34 GB at 32768 and 137 GB at 65536. Our implementation holds about two such tensors
# at its peak (the scores and the probabilities): the H200 measured 17 GB at 16384 and 69 GB at 32768
# (`measured_runs.md`), which fits in half its memory, while 65536 (about 275 GB) runs out of memory: one score
# matrix alone nearly fills the GPU. In practice it is a problem well before the OOM: from about 16384 tokens a
# single attention call of one layer and one sequence needs tens of GB of temporary memory, which competes with
# the weights, the KV cache and other requests (on an 80 GB GPU 32768 barely fits; on a 24 GB or 48 GB GPU it
# already fails).
# (The exact length depends on the GPU's memory and on what else it holds; any answer read correctly off the
# table is right.)
# === BEGIN MARK SCHEME ===
# 3 points: the length where their table shows OOM (or where the peak approaches the GPU's memory), 1 point;
# explained by the L^2 growth of the score matrices (with a size estimate, e.g. B x H x L^2 x bytes), 2 points.
# CPU runs: a reasoned estimate for the 141 GB H200 (or another GPU they name, with its memory) from their own
# table's x4 growth, or read off the H200 table of measured_runs.md (this cell's H200 table: 32768 fits at about
# 69 GB, 65536 fails at about 275 GB), earns full marks.
# === END MARK SCHEME ===

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_1_overhead_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# **3.** The main overhead is materialising the $L \times L$ attention matrices (scores, then probabilities, plus
# temporaries of the softmax and the mask) in HBM: memory that grows quadratically, is written and read back
# several times (so it also costs bandwidth and time), and is only an intermediate. It is a serious problem for
# long contexts: long-document or code-base prompts, long chat histories, retrieval-augmented generation with
# many passages, many-shot prompting, and in particular the prefill of such prompts, with batches of several
# long requests on one GPU. In training it is worse still, since the probabilities are kept for the backward
# pass.
# === BEGIN MARK SCHEME ===
# 4 points in total:
# - 2 points: the L x L score/probability matrices materialised in GPU memory (intermediates, quadratic).
# - 2 points: a fitting scenario: long-context inputs (long prompts/documents, long conversations, RAG,
#   long-context prefill, large batches of long sequences, training on long sequences).
# === END MARK SCHEME ===

# %% [markdown]
# ## 5.2 FlashAttention
#
# FlashAttention ([Dao et al., 2022](https://arxiv.org/abs/2205.14135)) computes **exact** attention, faster and
# with much less memory than the standard implementation.
#
# **Standard attention** computes $\text{softmax}(QK^\top / \sqrt{d})\,V$ in separate kernels: it writes the
# $L \times L$ matrix $S = QK^\top / \sqrt d$ to HBM, reads it back for the softmax, writes the probabilities
# $P$, and reads them again for $PV$: 4 passes over $L \times L$ matrices, the count of Section 3.5 (a scaling
# done as a kernel of its own adds two). For long sequences this $O(L^2)$ traffic dominates the time and the
# memory.
#
# **FlashAttention** never writes $S$ or $P$ to HBM. It splits $Q$ into row blocks and $K, V$ into column
# blocks small enough for the on-chip SRAM (shared memory), and processes one pair of blocks at a time inside a
# single fused kernel. The softmax needs a whole row of $S$, which is never available at once, so it is
# computed **online**: for each row it keeps the running maximum $m$ and the running sum $\ell$ of
# exponentials, and rescales the partial output whenever the maximum grows. The result is exactly the softmax.
#
# ![FlashAttention tiling](assets/flash_attn_tiling.png)
#
# **Algorithm (FlashAttention forward pass, one head).** Inputs $Q, K, V \in \mathbb{R}^{L \times d}$ in HBM;
# block sizes $B_r$ (rows of $Q$) and $B_c$ (rows of $K, V$) chosen so that the blocks fit in SRAM.
# 1. Split $Q$ into $T_r = \lceil L / B_r \rceil$ blocks $Q_1, \dots, Q_{T_r}$ and $K, V$ into
#    $T_c = \lceil L / B_c \rceil$ blocks $K_1, \dots, K_{T_c}$ and $V_1, \dots, V_{T_c}$.
# 2. For each $i = 1, \dots, T_r$ (in parallel across thread blocks):
#    1. load $Q_i$ into SRAM; set $O_i = 0 \in \mathbb{R}^{B_r \times d}$, $\ell_i = 0 \in \mathbb{R}^{B_r}$,
#       $m_i = -\infty \in \mathbb{R}^{B_r}$ (all in SRAM/registers);
#    2. for each $j = 1, \dots, T_c$:
#       1. load $K_j, V_j$ into SRAM;
#       2. $S_{ij} = Q_i K_j^\top / \sqrt{d} \in \mathbb{R}^{B_r \times B_c}$ (on chip);
#       3. $m_i^{\text{new}} = \max\left(m_i, \text{rowmax}(S_{ij})\right)$;
#          $\tilde P_{ij} = \exp\left(S_{ij} - m_i^{\text{new}}\right)$;
#       4. $\ell_i \leftarrow e^{m_i - m_i^{\text{new}}} \ell_i + \text{rowsum}(\tilde P_{ij})$;
#          $O_i \leftarrow \text{diag}\left(e^{m_i - m_i^{\text{new}}}\right) O_i + \tilde P_{ij} V_j$;
#          $m_i \leftarrow m_i^{\text{new}}$;
#    3. write $O_i \leftarrow \text{diag}(\ell_i)^{-1} O_i$ to HBM (and $m_i + \log \ell_i$, which the backward
#       pass uses to recompute $P$ instead of storing it).
#
# HBM traffic falls from $O(L^2 + L d)$ to about reading $Q, K, V$ and writing $O$ once; the FLOPs stay the
# same. Memory falls from $O(L^2)$ to $O(L)$. "About once" needs a word: each of the $T_r$ row blocks reads all
# of $K$ and $V$. Were those reads to come from HBM, the kernel would do $4 B_r B_c d$ FLOPs for every
# $2 B_c d$ elements of $K_j, V_j$ it loads, $B_r$ FLOP/byte in 16-bit floats: 128 for $B_r = 128$, left of the
# fp16 ridge of the H200 (about 206) or an A6000 (about 202), so memory-bound. They mostly do not: the thread
# blocks of one head's row blocks run at the same time on different SMs and walk through $K_1, V_1, K_2, \dots$ in
# the same order, so a tile one block has just loaded is still in the L2 cache (60 MB on the H200, 6 MB on an
# A6000) when the others ask for it. HBM sees roughly one read of $Q, K, V$ and one write of $O$: about
# $4 L d \cdot 2$ bytes for $4 L^2 d$ FLOPs per head, $L / 2$ FLOP/byte (2048 at $L = 4096$), far right of the
# ridge. If you know some CUDA or Triton, read the
# [FlashAttention code](https://github.com/Dao-AILab/flash-attention).
#
# `flash_attn_func` (from `utils`) uses the `flash-attn` package when it is installed and otherwise PyTorch's
# own FlashAttention-2 kernel (on a CPU, PyTorch's reference path, which materialises the scores like yours:
# the comparison below is only meaningful on a GPU, so at cpu scale the cell points to the H200 numbers of
# `measured_runs.md` instead). It takes tensors in the layout `(B, L, H, d)`, while SDPA uses `(B, H, L, d)`.
# At teaching scale the sweep runs from 256 to 16384 tokens; the longest needs about 17 GB for standard
# attention, and on a smaller GPU it shows as OOM.

# %%
# At cpu scale: no sweep (both sides would run the same kind of CPU code); quick scale runs tiny sizes.
flash_seq_lens = at_scale(teaching=[256, 512, 1024, 2048, 4096, 8192, 16384], quick=[64, 128, 256], cpu=[])
flash_warmup, flash_repeat = at_scale(teaching=(3, 10), quick=(1, 3), cpu=(1, 3))
flash_rows = []
with uses_answers("Question 3.1.1"):
    for seq_len in progress(flash_seq_lens, "sequence lengths"):
        q_sdpa, k_sdpa, v_sdpa = random_qkv(seq_len, layout="bhsd")
        q_flash, k_flash, v_flash = (t.transpose(1, 2).contiguous() for t in (q_sdpa, k_sdpa, v_sdpa))
        sdpa_status, sdpa_ms = run_oom_safe(benchmark_latency, scaled_dot_product_attention, q_sdpa, k_sdpa, v_sdpa,
                                            n_warmup=flash_warmup, n_repeat=flash_repeat)
        _, sdpa_mem = run_oom_safe(benchmark_memory, scaled_dot_product_attention, q_sdpa, k_sdpa, v_sdpa,
                                   n_warmup=1, n_repeat=flash_repeat)
        flash_status, flash_ms = run_oom_safe(benchmark_latency, flash_attn_func, q_flash, k_flash, v_flash,
                                              n_warmup=flash_warmup, n_repeat=flash_repeat)
        _, flash_mem = run_oom_safe(benchmark_memory, flash_attn_func, q_flash, k_flash, v_flash, n_warmup=1,
                                    n_repeat=flash_repeat)
        max_abs_diff = None
        if sdpa_status == flash_status == "ok":  # same numbers, computed differently
            max_abs_diff = (scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa).transpose(1, 2)
                            - flash_attn_func(q_flash, k_flash, v_flash)).abs().max().item()
        flash_rows.append({
            "seq_len": seq_len,
            "sdpa_ms": sdpa_ms,
            "flash_ms": flash_ms,
            "speedup": sdpa_ms / flash_ms if sdpa_ms is not None and flash_ms else None,
            "sdpa_mem_gb": sdpa_mem[0] if sdpa_mem is not None else None,
            "flash_mem_gb": flash_mem[0] if flash_mem is not None else None,
            "max_abs_diff": max_abs_diff,
        })
        del q_sdpa, k_sdpa, v_sdpa, q_flash, k_flash, v_flash
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()

flash_df = pd.DataFrame(flash_rows)
if flash_rows:
    print(flash_df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    plot_flash_attn_improvement(flash_df, title=f"FlashAttention ({flash_attn_func.last_backend}) vs standard attention",
                                latency_cols=("sdpa_ms", "flash_ms"), memory_cols=("sdpa_mem_gb", "flash_mem_gb"),
                                seq_len_col="seq_len", annotate_speedup=True, annotate_mem_reduction=True)
    plt.show()
elif not flash_seq_lens:
    print("FlashAttention vs standard attention: skipped without a GPU; read the course's H200 sweep (this cell's "
          "table) in measured_runs.md beside this notebook")

# %% [markdown]
# Let us count kernels with the profiler: your attention against PyTorch's FlashAttention kernel (through
# `F.scaled_dot_product_attention` restricted to its flash backend, which profiles more reliably than the
# `flash-attn` package). The helper transposes flash-attn's `(B, L, H, d)` layout to SDPA's `(B, H, L, d)` and
# back.

# %%
from torch.nn.attention import SDPBackend, sdpa_kernel


def torch_flash_attn(q, k, v):
    """PyTorch's FlashAttention kernel on (B, L, H, d) tensors.

    Args:
        q (torch.Tensor): queries (B, L_q, H, d).
        k (torch.Tensor): keys (B, L_kv, H, d).
        v (torch.Tensor): values (B, L_kv, H, d).

    Returns:
        torch.Tensor: attention output (B, L_q, H, d).
    """
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


kernel_seq_len = at_scale(teaching=1024, quick=128, cpu=512)
q_sdpa, k_sdpa, v_sdpa = random_qkv(kernel_seq_len, layout="bhsd")
q_flash, k_flash, v_flash = (t.transpose(1, 2).contiguous() for t in (q_sdpa, k_sdpa, v_sdpa))
with uses_answers("Question 3.1.1"):
    with torch.no_grad(), profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_sdpa:
        for _ in range(10):
            _ = scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa)
            prof_sdpa.step()
        synchronize_device()
    with torch.no_grad(), profile(activities=PROFILER_ACTIVITIES, schedule=default_schedule) as prof_flash:
        for _ in range(10):
            _ = torch_flash_attn(q_flash, k_flash, v_flash)
            prof_flash.step()
        synchronize_device()
    sdpa_kernels = count_cuda_kernels(prof_sdpa, per_step=True)
    flash_kernels = count_cuda_kernels(prof_flash, per_step=True)
    unit = "kernels" if sdpa_kernels["device"] == "cuda" else "CPU operators (no GPU: roughly one kernel each)"
    print(f"standard attention: {sdpa_kernels['total']} {unit} per call: {sdpa_kernels}")
    print(f"FlashAttention:     {flash_kernels['total']} {unit} per call: {flash_kernels}")
    print(f"fusion saves {sdpa_kernels['total'] - flash_kernels['total']} launches per call")

# %% [markdown]
# #### Question 5.2 (10 points)
#
# Based on the measurements and the analysis above (without a GPU, on the course's H200 run of the sweep and of
# the kernel count above, in `measured_runs.md` beside this notebook; the roofline predictions you need follow from
# the counts of this part and the H200's ceilings in that run's Section 3.5):
# 1. Why is standard attention memory-bound? (3 points)
# 2. How does FlashAttention make attention compute-bound? (4 points)
# 3. How does the speedup change with the sequence length, and why? Explain both ends of the table: the short
#    sequences, where FlashAttention may be no faster than standard attention or even slower, and the long ones.
#    (3 points)

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_2_memory_bound_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# **1.** Its softmax, scaling and masking are elementwise or row-wise operations on the $L \times L$ score
# matrix: each element is read and written with only a handful of FLOPs, an arithmetic intensity of about 1
# FLOP/byte, far below the ridge point. Counted as in Section 3.5, standard attention moves the $L \times L$
# matrices 4 times ($QK^\top$ writes $S$, the softmax reads $S$ and writes $P$, $PV$ reads $P$), and the two
# matrix products do $4 L^2 d$ FLOPs for those $4 L^2$ elements per head: in `float16`, as Part 5 runs on a GPU,
# $4 L^2 d / (4 \cdot 2 L^2) = d/2$ FLOP/byte, which is 64 for $d = 128$ ($d/4$ in `float32`, as on a CPU). A real
# implementation moves more: a scaling done as a kernel of its own adds two passes (6 in all, $d/3$), a softmax
# written operation by operation more still (Question 3.2's count of a three-kernel softmax gives 7 passes,
# $2d/7$). Every one of these is far left of the fp16 ridge (about 206 FLOP/byte on the H200, 202 on an A6000),
# so the time goes into moving the $L \times L$ intermediates through HBM, one kernel at a time.
# === BEGIN MARK SCHEME ===
# 3 points: the L x L intermediates (scores, probabilities) are written to and read from HBM several times by
# separate kernels, 2 points; the elementwise/softmax steps have very low arithmetic intensity (below the
# ridge), so memory traffic, not FLOPs, sets the time, 1 point. An overall intensity is not required; if given,
# it follows from the passes the student counts, stated: 4 passes d/2 FLOP/byte (64 for d = 128 in fp16), 6 passes
# (separate scaling) d/3, Question 3.2's 7 passes 2d/7 (about 37); half of each in fp32. All are far below the
# ridge: any of them is right when the count and the dtype are stated.
# === END MARK SCHEME ===

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_2_compute_bound_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# **2.** It fuses the whole computation (both matrix products, scaling, masking and softmax) into one kernel
# and tiles it: blocks of $Q$, $K$ and $V$ are loaded into SRAM, the block $S_{ij}$ and its probabilities are
# computed and consumed on chip, and the online softmax (running max and sum, with rescaling) makes it
# unnecessary to ever see a whole row. The $L \times L$ matrices never touch HBM, while the FLOPs are unchanged.
# Each row block still reads all of $K$ and $V$: against those reads alone the intensity is $B_r$ FLOP/byte in
# fp16 (128 for $B_r = 128$), which is below the ridge of the H200 (206, or about 179 against its measured
# ceilings) or an A6000 (202). What makes it
# compute-bound is that the row blocks of a head run concurrently and read the same $K_j, V_j$ tiles at about the
# same time, so after the first read they come from the L2 cache, not HBM: HBM traffic is close to one read of
# $Q, K, V$ and one write of $O$, an intensity of about $L/2$ FLOP/byte (2048 at $L = 4096$), far right of the
# ridge, and the kernel is limited by its arithmetic (the matrix products on the tensor cores and the softmax's
# exponentials), not by HBM. (The H200 run, `measured_runs.md`, shows its time growing 4x per doubling of $L$ from
# 4096 tokens on, with its FLOPs, at about twice its compute-bound prediction: PyTorch's FlashAttention-2 kernel
# reaches about half the measured fp16 matmul rate.) It also launches one kernel instead of several, and in the
# backward pass recomputes $S$ and $P$ from $Q, K$ and the saved statistics rather than storing them: trading
# cheap FLOPs for expensive bytes.
# === BEGIN MARK SCHEME ===
# 4 points in total:
# - 1 point: tiling Q, K, V into blocks that fit in SRAM.
# - 1 point: kernel fusion: S and P are computed and used on chip, never written to HBM (one kernel).
# - 1 point: online softmax (running max/sum with rescaling) makes the tiling exact.
# - 1 point: same FLOPs, far fewer HBM bytes -> higher arithmetic intensity -> compute-bound (optionally:
#   recomputation in the backward pass). The HBM bytes must be about one read of Q, K, V and one write of O
#   (intensity growing with L), or the K/V re-reads served by the L2 cache / on chip. "Intensity about B_r,
#   hence past the ridge" alone does not earn this point: in fp16 with B_r = 128 that is below the ridge of the
#   H200 (206 datasheet, about 179 measured) and the A6000 (202).
# === END MARK SCHEME ===

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_2_speedup_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# **3.** At short sequences (256 and 512 tokens on the course's H200) FlashAttention is not reliably faster, and can
# be slower (0.898x and 0.913x at 256 and 512 tokens in the table of reports/lab1-h200.md; in the printed sweep of the
# notebook, `measured_runs.md`, 0.793x at 256 tokens but 1.335x at 512; at 1024 tokens 1.25x and 1.513x): both
# versions take about 0.08 to 0.13 ms, far above their roofline predictions of one to tens of microseconds (the
# report's "SDPA predicted" and "Flash predicted" columns). Neither is bound by compute or memory there: the time is
# fixed per-call work, Python and PyTorch's dispatch, the `flash_attn_func` wrapper (checks, layout, choosing a
# backend), kernel launches (5 against 1), and too little work to fill the GPU (at 256 tokens, 16 heads make only 32
# row blocks of 128 queries for 132 SMs), and the wrapper adds to FlashAttention's side. Where the margin is small,
# which side wins is noise from run to run. As $L$ grows, standard attention's $O(L^2)$ memory-bound traffic takes
# over and the gap opens: 3x at 2048 tokens, 3.6x at 4096 and 4.1x at 8192. For long sequences it falls back and
# levels off (2.7x and 2.6x at 16384 and 32768 in the report, 2.6x at 16384 in the notebook's sweep), because both
# times now grow as $L^2$: standard attention's with the bytes of the $L \times L$ matrices, FlashAttention's with its
# $4 L^2 d$ FLOPs. The ratio tends to a constant, (bytes per score element / bandwidth) / (FLOPs per score element /
# matmul rate): with the 4 passes of the count in fp16, $(8 / 4.27) / (4 \cdot 128 / 762)$ at the H200's measured
# ceilings, about 2.8, as the table's predictions give at 32768 tokens ("SDPA predicted" 32.3 against "Flash
# predicted" 11.5; Section 3.5's bf16 ceilings, $(8 / 4.227) / (512 / 788.9)$, give about 2.9). The measured ratio
# is lower still, because FlashAttention's kernel is further from its roof than standard attention is from its own.
# FlashAttention took 25.8 ms against the 11.5 predicted at 32768 tokens (6.06 against 2.89 at 16384), about half
# the measured fp16 matmul rate (the exponentials and the rescaling between its two matrix products are work the
# FLOP count leaves out). Standard attention took 66.6 ms against a 4-pass prediction of 32.3, but the from-scratch
# attention scales the scores in a kernel of its own, so it makes 6 passes, and it ran at about three quarters of
# that 6-pass roof (6/4 of the prediction). (At 8192 tokens it ran further from its roof, 6.23 ms against 2.05
# predicted, about as far as FlashAttention from its own: that is where the speedup peaks.) Its memory advantage
# keeps growing: $O(L)$ against $O(L^2)$.
# === BEGIN MARK SCHEME ===
# 3 points in total:
# - 1 point: short sequences: both are dominated by fixed per-call costs (Python, dispatch, the wrapper, kernel
#   launches) or low occupancy, not by compute or memory, so FlashAttention need not be faster there (their own
#   table, or the H200 table of measured_runs.md, may show it slower).
# - 1 point: the gap opens with L because standard attention's quadratic, memory-bound traffic takes over.
# - 1 point: for long sequences the speedup levels off (both times grow as L^2, one with bytes, the other with
#   FLOPs, so the ratio tends to a constant); a plain "the speedup keeps growing with L" earns this point only if
#   their own table shows it and the answer says why. On the H200 it peaks at 8192 and falls back to about 2.6
#   from 16384 on: "it peaks, then levels off" with that reason is right. A limit is not required; if given, it
#   follows from the passes counted (about 2.8 to 2.9 with 4 passes at the H200's measured ceilings, 1.5 times
#   that with 6, more with more passes). Why the measured ratio stays below it is not required either; if given,
#   it is FlashAttention's kernel running further from its compute roof (about half of it) than standard attention
#   from its memory roof once its real passes are counted (about three quarters of it at 16384 and 32768 on the
#   H200): "neither kernel reaches its roof" alone does not explain it.
# A CPU-only student answers from the H200 run of the sweep in measured_runs.md beside the notebook (256 to 16384
# tokens, times and memory, without the report's predictions and its 32768 row): the same three points.
# === END MARK SCHEME ===

# %% [markdown]
# # Summary
#
# In this lab you learned:
# 1. **latency, MACs/FLOPs and I/O**: how to measure the first correctly (warm-up, repetitions, synchronisation)
#    and how to count the other two for an operator and for a whole layer;
# 2. **the roofline model**: arithmetic intensity against the ridge point tells whether an operation is limited
#    by compute or by memory (GEMM vs GEMV, prefill vs decode, batch size); measured ceilings are below the
#    datasheet's, and a layer is judged operator by operator, not by one aggregate intensity;
# 3. **profiling**: reading the operators and kernels that really run, and their timeline;
# 4. **kernel-level optimisation**: fusion, `torch.compile` and CUDA Graphs cut memory traffic and launch
#    overhead;
# 5. **FlashAttention**: tiling, fusion and the online softmax turn a memory-bound $O(L^2)$-memory operation
#    into a compute-bound, $O(L)$-memory one.
