# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: nbgrader,deletable,editable,tags,-all
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
# 2. use the **roofline model** to tell whether a computation is limited by compute or by memory;
# 3. **profile** PyTorch code and read which kernels run on the device, and for how long;
# 4. explain **kernel launch overhead** and the tools that reduce it: kernel fusion, `torch.compile`, CUDA Graphs;
# 5. explain **why FlashAttention is faster** and lighter on memory than standard attention.
#
# ## How this notebook works
# - Run it top to bottom. It runs on a GPU (the *teaching* scale: the sizes of the course) and on a CPU (a
#   *quick* scale with small sizes, which is also what the autograder uses). `utils.at_scale` picks the sizes.
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
# | Question 2.1.1 | gemm arithmetic intensity and roofline | 5 |
# | Question 2.1.2 | when does gemm become compute-bound? | 5 |
# | Question 2.2 | gemv arithmetic intensity and roofline | 5 |
# | Question 3.1 | attention from scratch and its MACs | 10 |
# | Bonus 3.1 | MACs of the whole attention module | 5 |
# | Question 3.2 | I/O of attention | 5 |
# | Bonus 3.2 | I/O of the whole attention module (prefill, bf16) | 5 |
# | Question 3.4.1 | prefill vs decode bottleneck (written) | 5 |
# | Question 3.4.2 | decode batch-size sweep on the roofline | 5 |
# | Question 3.4.3 | prefill-length sweep on the roofline | 5 |
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

# %% nbgrader={"grade": false, "grade_id": "setup_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools
import math
import time
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from utils import *

print_environment_report("lab1")

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
# - the result has shape `(N, M)` and the same `dtype` and `device` as `A`.
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
_A = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=DEVICE)
_B = torch.tensor([[1.0, 0.0, 2.0], [0.0, 1.0, 3.0]], device=DEVICE)
_C = gemm(_A, _B)
assert isinstance(_C, torch.Tensor), f"gemm must return a torch.Tensor, got {type(_C).__name__}"
assert tuple(_C.shape) == (3, 3), f"gemm of (3, 2) and (2, 3) must have shape (3, 3), got {tuple(_C.shape)}"
assert _C.dtype == _A.dtype and _C.device == _A.device, (
    f"gemm must return A's dtype and device ({_A.dtype}, {_A.device}), got ({_C.dtype}, {_C.device})")
torch.testing.assert_close(
    _C.cpu(), torch.tensor([[1.0, 2.0, 8.0], [3.0, 4.0, 18.0], [5.0, 6.0, 28.0]]),
    msg=lambda m: f"gemm(A, B) must equal the matrix product for a (3, 2) @ (2, 3) example: {m}")
del _A, _B, _C
### BEGIN HIDDEN TESTS
def _q1_1_hidden_tests():
    import ast
    import inspect
    import textwrap
    from torch.overrides import TorchFunctionMode

    forbidden = {
        "matmul", "mm", "bmm", "einsum", "tensordot", "addmm", "addmv", "addbmm", "baddbmm", "addr", "dot",
        "vdot", "inner", "outer", "ger", "mv", "linear", "bilinear", "chain_matmul", "multi_dot", "matrix_power",
        "__matmul__", "__rmatmul__", "__imatmul__", "_scaled_mm", "sum", "nansum",
    }
    # 1. Static check of gemm's own source.
    tree = ast.parse(textwrap.dedent(inspect.getsource(gemm)))
    for node in ast.walk(tree):
        assert not isinstance(node, (ast.MatMult,)), "gemm must not use the @ operator"
        if isinstance(node, ast.Attribute):
            assert node.attr not in forbidden, f"gemm must not use .{node.attr} (a library product or reduction)"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id in {"sum"} or node.func.id not in forbidden, f"gemm must not call {node.func.id}()"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert node.value not in forbidden, f"gemm must not look up {node.value!r} (getattr of a product routine)"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                assert alias.name.split(".")[-1] not in forbidden, f"gemm must not import {alias.name}"

    def loop_depth(node, depth=0):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            inner = max((loop_depth(child, depth + 1) for child in node.body), default=depth + 1)
            other = max((loop_depth(child, depth) for child in node.orelse), default=depth)
            return max(inner, other, loop_depth(node.iter if hasattr(node, "iter") else node.test, depth))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            n = len(node.generators)
            elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            best = max(loop_depth(e, depth + n) for e in elts)
            for index, gen in enumerate(node.generators):
                for part in [gen.iter, *gen.ifs]:
                    best = max(best, loop_depth(part, depth + index))
            return best
        return max((loop_depth(child, depth) for child in ast.iter_child_nodes(node)), default=depth)

    assert loop_depth(tree) >= 3, (
        "gemm must compute C with three nested loops (over i, j and k) written inside gemm; "
        f"found a loop nesting depth of {loop_depth(tree)}")

    # 2. Behavioural check: record every torch function gemm calls, however it reached it.
    class _Recorder(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.add(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    def check(shape_a, shape_b, dtype, seed, transpose_b=False):
        gen = torch.Generator().manual_seed(seed)
        A = torch.randn(*shape_a, generator=gen, dtype=torch.float64)
        B = torch.randn(*(shape_b[::-1] if transpose_b else shape_b), generator=gen, dtype=torch.float64)
        if transpose_b:
            B = B.t()  # a non-contiguous view
        expected = A @ B
        A_dev, B_dev = A.to(device=DEVICE, dtype=dtype), B.to(device=DEVICE, dtype=dtype)
        if transpose_b:
            B_dev = B.t().contiguous().to(device=DEVICE, dtype=dtype).t()
        with _Recorder() as recorder:
            out = gemm(A_dev, B_dev)
        used = sorted(recorder.names & forbidden)
        assert not used, f"gemm must not call library products or reductions; it called torch {used}"
        assert isinstance(out, torch.Tensor), f"gemm must return a torch.Tensor, got {type(out).__name__}"
        where = f"A {tuple(shape_a)}, B {tuple(shape_b)}, {dtype}"
        assert tuple(out.shape) == (shape_a[0], shape_b[1]), (
            f"gemm for {where} must return shape {(shape_a[0], shape_b[1])}, got {tuple(out.shape)}")
        assert out.dtype == dtype, f"gemm for {where} must return dtype {dtype}, got {out.dtype}"
        assert out.device == A_dev.device, f"gemm for {where} must return a tensor on {A_dev.device}, got {out.device}"
        err = (out.detach().to("cpu", torch.float64) - expected).abs().max().item()
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        assert err <= tol, f"gemm(A, B) must equal A @ B for {where}; max abs error {err:.3g} > {tol:g}"

    check((7, 11), (11, 5), torch.float32, 11)
    check((13, 9), (9, 6), torch.float32, 12)
    check((10, 8), (8, 1), torch.float32, 13)  # matrix-vector
    check((1, 1), (1, 1), torch.float32, 14)
    check((5, 6), (6, 4), torch.float64, 15)
    check((4, 9), (9, 5), torch.float32, 16, transpose_b=True)


_q1_1_hidden_tests()
del _q1_1_hidden_tests
### END HIDDEN TESTS

# %% [markdown]
# ## 1.1 Latency
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

# %%
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
# **(a) Written, 2 points.** Run the cell below: it times your `gemm` once, several times in a row, from a fresh
# start. Describe what you see, and explain why one single measurement is not a reliable latency.

# %%
one_shot_size = at_scale(teaching=64, quick=24)
a_one_shot = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
b_one_shot = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
for trial in range(5):
    gemm_one_shot_s = latency_one_time(gemm, a_one_shot, b_one_shot)
    matmul_one_shot_s = latency_one_time(torch.matmul, a_one_shot, b_one_shot)
    print(f"trial {trial}: gemm {gemm_one_shot_s * 1e3:9.3f} ms   torch.matmul {matmul_one_shot_s * 1e3:8.4f} ms")

# %% [markdown] nbgrader={"grade": true, "grade_id": "q1_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# The first call is clearly slower than the later ones (for `torch.matmul` often by 10x or more), and the later
# calls still differ from each other by several percent or more. The first call pays one-time costs: loading
# and initialising libraries (the cuBLAS handle, the CUDA context), the caching allocator reserving memory,
# cold CPU caches and Python's first-time lookups. Later calls vary because the machine is shared: the OS
# schedules other processes, CPU and GPU clocks change (boost, power and thermal limits), and for very short
# operations the timer's own overhead is a large part of the result. A single measurement therefore measures
# start-up effects and noise as much as the operation: warm up first, then repeat many times and report a
# mean or median (on a GPU, with proper synchronisation, otherwise you time only the kernel launch).
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: observes that the first call is much slower and that repeated one-shot times vary.
# - 1 point: a correct reason: one-time start-up costs (initialisation, allocation, caches; "warm-up") and/or
#   run-to-run noise (other processes, clock changes, timer overhead); concludes that one needs warm-up and
#   many repetitions (mean/median).
# === END MARK SCHEME ===

# %% [markdown]
# **(b) Code, 3 points.** The standard way to measure latency is therefore to *warm up* (run the function a few
# times without timing it) and then average many timed runs. Write `latency(fn, *args, warmup=10, repeat=100,
# **kwargs)`:
# - call `fn(*args, **kwargs)` `warmup` times untimed, then `repeat` times timed (exactly `warmup + repeat`
#   calls in total), passing the arguments through unchanged;
# - return the **mean** time of one timed call, in **seconds**, as a Python `float`;
# - on CUDA, time with CUDA events or synchronise before reading the clock; on CPU use `time.perf_counter()`.
#   Your function must work on both (use `DEVICE.type`, or `synchronize_device()` from above).

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
    synchronize_device()
    times_s = []
    for _ in range(repeat):
        if DEVICE.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args, **kwargs)
            end.record()
            torch.cuda.synchronize()
            times_s.append(start.elapsed_time(end) / 1e3)
        else:
            start_s = time.perf_counter()
            fn(*args, **kwargs)
            times_s.append(time.perf_counter() - start_s)
    return float(sum(times_s) / len(times_s))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_2_latency_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
_calls = []
_result = latency(lambda x, scale=1: _calls.append((x, scale)), 7, warmup=2, repeat=3, scale=5)
assert len(_calls) == 5, f"latency(fn, warmup=2, repeat=3) must call fn exactly 5 times, it called it {len(_calls)} times"
assert all(call == (7, 5) for call in _calls), "latency must pass *args and **kwargs through to fn unchanged"
assert isinstance(_result, (float, int)) and not isinstance(_result, bool), (
    f"latency must return a Python float (seconds), got {type(_result).__name__}")
del _calls, _result
### BEGIN HIDDEN TESTS
def _q1_2_hidden_tests():
    import numbers

    sleep_s = 0.01  # each timed call takes at least this long
    gpu_cycles = 0
    if DEVICE.type == "cuda":  # make the GPU busy for about sleep_s too, so that timing without sync is caught
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        torch.cuda.synchronize()
        gpu_cycles = int(1_000_000 * sleep_s * 1e3 / max(start.elapsed_time(end), 1e-3))
    calls = []

    def slow(tag, *, factor):
        calls.append((tag, factor))
        time.sleep(sleep_s)
        if gpu_cycles:
            torch.cuda._sleep(gpu_cycles)

    result = latency(slow, "t", warmup=3, repeat=10, factor=2.5)
    assert len(calls) == 13, f"latency(fn, warmup=3, repeat=10) must call fn exactly 13 times, it called it {len(calls)} times"
    assert all(call == ("t", 2.5) for call in calls), "latency must forward *args and **kwargs to fn unchanged"
    assert isinstance(result, numbers.Real) and not isinstance(result, bool), (
        f"latency must return a Python float in seconds, got {type(result).__name__}")
    assert 0.8 * sleep_s <= result <= 5 * sleep_s, (
        f"latency must return the mean time of ONE call in SECONDS: fn takes about {sleep_s} s per call, "
        f"latency returned {result!r} (milliseconds or the total of all calls would be far off)")

    calls.clear()
    latency(slow, "d", factor=1.0, repeat=2)
    assert len(calls) == 12, f"latency's default warmup must be 10: with repeat=2 expected 12 calls, got {len(calls)}"


_q1_2_hidden_tests()
del _q1_2_hidden_tests
### END HIDDEN TESTS

# %% [markdown]
# Now let us compare the latency of matrix-matrix (GEMM) and matrix-vector (GEMV) multiplication with your
# `gemm` (this can take a little while).

# %%
a_mat = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
b_mat = torch.randn(one_shot_size, one_shot_size, device=DEVICE)
v_vec = torch.randn(one_shot_size, 1, device=DEVICE)
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
gemm_sweep_sizes = at_scale(teaching=[16, 32, 64, 128], quick=[4, 8, 16])
gemm_sweep_latencies_s, matmul_sweep_latencies_s = [], []
for size in gemm_sweep_sizes:
    a_sweep = torch.randn(size, size, device=DEVICE)
    b_sweep = torch.randn(size, size, device=DEVICE)
    gemm_sweep_latencies_s.append(latency(gemm, a_sweep, b_sweep, warmup=1, repeat=3))
    matmul_sweep_latencies_s.append(latency(torch.matmul, a_sweep, b_sweep, warmup=5, repeat=20))
    print(f"N={size:4d}: gemm {gemm_sweep_latencies_s[-1] * 1e3:10.3f} ms   "
          f"torch.matmul {matmul_sweep_latencies_s[-1] * 1e3:8.4f} ms   "
          f"ratio {gemm_sweep_latencies_s[-1] / matmul_sweep_latencies_s[-1]:,.0f}x")
del a_sweep, b_sweep
plot_gemm_torch_matmul_latency(gemm_sweep_sizes, gemm_sweep_latencies_s, matmul_sweep_latencies_s)
plt.show()

# %% [markdown]
# ## 1.2 MACs and FLOPs
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
# shape `(K, M)`, as a Python `int`. It depends on the shapes only, not on the values, dtype or device.

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
assert gemm_mac(torch.empty(512, 512, device=DEVICE), torch.empty(512, 512, device=DEVICE)) == 134217728, (
    "gemm_mac of (512, 512) @ (512, 512) must be 134217728")
assert gemm_mac(torch.empty(512, 256, device=DEVICE), torch.empty(256, 512, device=DEVICE)) == 67108864, (
    "gemm_mac of (512, 256) @ (256, 512) must be 67108864")
### BEGIN HIDDEN TESTS
def _q1_3_hidden_tests():
    cases = [((3, 5), (5, 7), torch.float32), ((11, 2), (2, 13), torch.float32), ((6, 17), (17, 1), torch.float32),
             ((1, 9), (9, 4), torch.float16), ((8, 3), (3, 8), torch.bfloat16), ((257, 129), (129, 65), torch.float64)]
    for shape_x, shape_y, dtype in cases:
        x = torch.empty(*shape_x, device=DEVICE, dtype=dtype)
        y = torch.empty(*shape_y, device=DEVICE, dtype=dtype)
        expected = shape_x[0] * shape_x[1] * shape_y[1]
        out = gemm_mac(x, y)
        assert isinstance(out, int) and not isinstance(out, bool), (
            f"gemm_mac must return a Python int, got {type(out).__name__}")
        assert out == expected, (
            f"gemm_mac for x {shape_x} @ y {shape_y} ({dtype}) must be N*K*M = {expected}, got {out}")


_q1_3_hidden_tests()
del _q1_3_hidden_tests
### END HIDDEN TESTS

# %% [markdown]
# ## 1.3 I/O
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
# `(N, K)` and `B` of shape `(K, M)` of the same dtype; `C` has that dtype too. Return a Python `int`. Use the
# tensors' element size; do not assume `float32`.

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
assert gemm_io(torch.empty(512, 512, device=DEVICE), torch.empty(512, 512, device=DEVICE)) == 3145728, (
    "gemm_io of float32 (512, 512) @ (512, 512) must be 3145728 bytes")
assert gemm_io(torch.empty(512, 256, device=DEVICE), torch.empty(256, 512, device=DEVICE)) == 2097152, (
    "gemm_io of float32 (512, 256) @ (256, 512) must be 2097152 bytes")
assert gemm_io(torch.empty(128, 256, device=DEVICE), torch.empty(256, 512, device=DEVICE)) == 917504, (
    "gemm_io of float32 (128, 256) @ (256, 512) must be 917504 bytes")
### BEGIN HIDDEN TESTS
def _q1_4_hidden_tests():
    cases = [((16, 16), (16, 16), torch.float32), ((64, 128), (128, 32), torch.float32),
             ((10, 4), (4, 1), torch.float32), ((7, 3), (3, 5), torch.float16), ((5, 9), (9, 2), torch.bfloat16),
             ((6, 6), (6, 11), torch.float64)]
    for shape_a, shape_b, dtype in cases:
        A = torch.empty(*shape_a, device=DEVICE, dtype=dtype)
        B = torch.empty(*shape_b, device=DEVICE, dtype=dtype)
        n, k, m = shape_a[0], shape_a[1], shape_b[1]
        bytes_per_element = torch.finfo(dtype).bits // 8
        expected = bytes_per_element * (n * k + k * m + n * m)
        out = gemm_io(A, B)
        assert isinstance(out, int) and not isinstance(out, bool), f"gemm_io must return a Python int, got {type(out).__name__}"
        assert out == expected, (
            f"gemm_io for A {shape_a} @ B {shape_b} in {dtype} must be {bytes_per_element} bytes x (N*K + K*M + N*M) "
            f"= {expected} (read A and B once, write C once), got {out}")


_q1_4_hidden_tests()
del _q1_4_hidden_tests
### END HIDDEN TESTS
