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
# # Lab 2: Attention, Fusion and FlashAttention
#
# Lab 1 measured what things cost. This lab asks where the bytes go, and how to stop moving them: first for a
# matrix product followed by a `relu`, then for a chain of two products with a large intermediate, then for
# attention itself, which has exactly that shape. You will end by writing FlashAttention twice, once in PyTorch
# and once as a Triton kernel, and by benchmarking it against what PyTorch and `torch.compile` give you.
#
# ## Learning objectives
# By the end of this lab you will be able to:
# 1. **count the HBM traffic** of a computation kernel by kernel, and predict from the roofline model what
#    **kernel fusion** (`torch.compile`) can gain, and when the prediction fails;
# 2. explain why a **materialized intermediate** (an $S \times S$ matrix written to memory and read back) caps
#    the arithmetic intensity of attention at about the head dimension, whatever the sequence length;
# 3. write **attention from scratch** with `einsum`, with a **causal** mask (bonus: the mask of **packed
#    sequences**), and count its cost;
# 4. derive the **online softmax** and use it to write a **tiled attention** that never stores the
#    $S \times S$ matrix, in PyTorch and as a **Triton kernel**, returning the log-sum-exp that the backward pass
#    needs (bonus: the backward pass itself);
# 5. **benchmark** attention (latency, backward, peak memory, out-of-memory) and `torch.compile` on whole
#    Transformers, explain the results, and place your own attention kernels, measured, on the **roofline** at the
#    intensities you predicted.
#
# ## How this notebook works
# - Run it top to bottom. `utils.at_scale(teaching=..., quick=..., cpu=...)` picks the sizes of every cell that
#   measures, by the scale in effect (the environment report prints it): *teaching* on a GPU (the sizes the
#   questions discuss; under 3 minutes for the whole notebook on an H200, most of it compiling), *cpu* on a
#   machine without a GPU (smaller sizes at which a laptop still shows each effect: what the relu's round trip
#   costs, the materialized `S x S` matrix against a tiled attention, the roofline's two regimes, what
#   `torch.compile` does to a small Transformer; under a minute of cells on a busy 2-core machine, most of it
#   in Part 5), and *quick* (tiny sizes that only check that the code runs: the autograder uses it).
#   What only a GPU shows (`max-autotune`'s fused matmul, your Triton kernel's speed, bf16 tensor cores) is in the
#   course's measured runs, `measured_runs.md` beside this notebook (an H200 at teaching scale, and a CPU run); the
#   cells and questions that need it say so.
# - Write code where it says `YOUR CODE HERE` and written answers where it says `YOUR ANSWER HERE`. Keep the
#   names and signatures: the tests call them.
# - Test cells show a few public checks; the grader runs hidden tests on inputs you have not seen, against
#   references it computes itself. Passing the public checks is necessary, not sufficient.
# - Question 4.3 needs Triton (`pip install triton`, Linux). On a machine without CUDA the setup cell switches
#   on Triton's interpreter, which runs kernels on the CPU: that is how the autograder grades your kernel.
# - Units are in the names: `_ms` milliseconds, `_gb` gigabytes (1e9 bytes), `_tflops` TFLOP/s, `_tb_s` TB/s,
#   bytes and FLOPs as plain counts.
#
# ## Points and time
# Autograded questions have one right answer (a function, a formula, a number); written answers are graded by
# a TA. Each part's row says how long a student typically spends on it (reading, writing, debugging and the
# written answers; the lab as a whole takes about 13 hours, the bonus questions about 3.5 more) and how long its
# cells run at cpu scale on a 2-core CPU (a busy shared machine: a laptop is faster; `measured_runs.md` beside this
# notebook has the run); at teaching scale on an H200 the whole notebook ran in 161 s, most of it in Parts 1 and
# 5.
#
# | Question | Topic | Points |
# | --- | --- | --- |
# | **Part 1** | about 1.5 hours of work; its cells run about 4 s at cpu scale | |
# | Question 1.1 | HBM bytes of `relu(A @ B)`, fused and unfused | 4 |
# | Question 1.2 | predicted speedup of fusion (roofline) | 4 |
# | Question 1.3 | measured vs predicted speedup of `torch.compile` (written) | 5 |
# | **Part 2** | about 1.5 hours (the bonus 45 min more); runs a few seconds | |
# | Question 2.1 | input and output bytes of `C @ relu(A @ B)` | 3 |
# | Question 2.2 | FLOPs of `C @ relu(A @ B)` | 3 |
# | Question 2.3 | arithmetic intensity, with and without the intermediate | 4 |
# | Question 2.4 | measured TFLOP/s on the roofline, and the road to FlashAttention (written) | 5 |
# | Bonus 2.5 | reassociation: `(C @ A) @ B` | 5 |
# | **Part 3** | about 1.5 hours (the bonus 30 min more; an optional, ungraded exercise 30 min); under a second | |
# | Question 3.1 | attention with `einsum`, with masks | 8 |
# | Question 3.2 | FLOPs, bytes and intensity of attention | 4 |
# | Question 3.3 | causal mask | 3 |
# | Bonus 3.4 | packed sequences: the segment mask | 3 |
# | **Part 4** | about 5 hours (the Triton kernel half of it; the bonus 2 hours more); runs about 3 s | |
# | Question 4.1.1 | online softmax update | 3 |
# | Question 4.1.2 | blockwise log-sum-exp | 3 |
# | Question 4.2 | tiled attention forward in PyTorch | 10 |
# | Question 4.3 | FlashAttention forward in Triton | 10 |
# | Bonus 4.4 | backward pass by recomputation | 8 |
# | **Part 5** | about 3.5 hours; runs about 37 s at cpu scale (compiling included) | |
# | Question 5.1 | attention benchmark harness | 6 |
# | Question 5.2 | attention benchmark analysis (written) | 8 |
# | Question 5.3 | `torch.compile` on whole Transformers (written) | 8 |
# | Question 5.4 | your attention kernels on the roofline (written) | 9 |
# | **Total** | | **100 + 16 bonus** |

# %% nbgrader={"grade": false, "grade_id": "setup_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import gc
import math
import os
import statistics
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

# Triton compiles the kernel of Question 4.3 for the GPU. Without CUDA, Triton's interpreter runs kernels on the
# CPU with NumPy (slowly, but exactly enough to test them). The interpreter is switched on by the environment
# variable TRITON_INTERPRET=1, which Triton reads when a kernel is defined; we set it here, before triton is even
# imported, which is the one place that works with every Triton version.
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

TRITON_MISSING = ("Triton is not installed, so Question 4.3 cannot run here. On Linux: `pip install triton` "
                  "(CPU-only machines included: the kernel then runs in Triton's interpreter), then restart the "
                  "kernel. Triton publishes no wheels for macOS or Windows: use a Linux machine, WSL or a hosted GPU.")
try:
    import triton
    import triton.language as tl

    TRITON_AVAILABLE = True
except ImportError:
    TRITON_AVAILABLE = False

    class _TritonMissing:
        """Stands in for `triton` and `triton.language` so that the rest of the lab runs without Triton."""

        constexpr = None  # kernel signatures annotate their compile-time arguments with tl.constexpr

        def jit(self, fn=None, **options):
            return self  # a "kernel" that explains what is missing when it is launched

        def __getitem__(self, grid):
            raise ImportError(TRITON_MISSING)

        def __getattr__(self, name):
            raise ImportError(TRITON_MISSING)

    triton = tl = _TritonMissing()

from utils import *
from checks import *

quiet_library_messages()  # hide library messages you cannot act on (profiler start/stop lines, benign autotuning)
print_environment_report("lab2")


class quiet_autotuning:
    """`with quiet_autotuning():` hides the AUTOTUNE tables that `torch.compile(mode="max-autotune...")` writes to
    stderr while it compiles (every candidate matmul kernel and its time, pages of them): the kernel counts show
    what won. Only around the cells that compile; the setting is restored afterwards."""

    def __enter__(self):
        from torch._inductor import select_algorithm  # imported only when a cell compiles

        self.module, self.saved = select_algorithm, select_algorithm.PRINT_AUTOTUNE
        select_algorithm.PRINT_AUTOTUNE = False
        return self

    def __exit__(self, *exc_info):
        self.module.PRINT_AUTOTUNE = self.saved
        return False


def your_answer(question, fn, *args, **kwargs):
    """fn(*args, **kwargs) for a function of yours (the answer of `question`, e.g. "Question 1.1"), or NaN while it
    is not written yet (its stub raises NotImplementedError): a cell that only uses an answer never stops on an
    unwritten one; it says so once per cell and leaves what needs the answer empty (NaN), and the answer's own test
    cell says what is missing. Any other error is your code's, and is raised as it is."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        shell = globals().get("get_ipython", lambda: None)()
        said = (question, getattr(shell, "execution_count", None))
        if said not in _NOT_WRITTEN_SAID:
            _NOT_WRITTEN_SAID.add(said)
            print(f"{question} is not written yet: what this cell needs from it is left empty (NaN)")
        return float("nan")


_NOT_WRITTEN_SAID = set()


def plot_roofline_measured(gpu_name, peak_tflops, bandwidth_tb_s, operations, title=None, ax=None):
    """`plot_roofline` with measured points whose labels never overprint one another.

    Each operation is drawn on the roof at its intensity (a filled marker with its name: the model's prediction).
    An operation given as (intensity, measured TFLOP/s) also gets a hollow marker at the measured TFLOP/s, a dotted
    line up to the roof and its TFLOP/s written beside it, right or left of the point in turn, so that operations at
    one intensity (eager and compiled, say) keep their labels apart. A measurement that is not a positive number
    (NaN: out of memory, or not written yet) draws nothing below the roof; an intensity that is not a positive
    number (an answer not written yet) leaves the operation out. The legend sits under the plot.

    Returns:
        tuple: (fig, ax).
    """
    def intensity_of(value):
        return float(value[0] if isinstance(value, (tuple, list)) else value)

    operations = {name: value for name, value in operations.items()
                  if math.isfinite(intensity_of(value)) and intensity_of(value) > 0}
    fig, ax = plot_roofline(gpu_name, peak_tflops, bandwidth_tb_s,
                            {name: intensity_of(value) for name, value in operations.items()}, title=title, ax=ax)
    # Names: beside their point on the roof, on the empty side of it (above and left of a sloped roof, above a flat
    # one, below and right where the measurement lies above the roof), stacked where operations share an intensity.
    stacked = {}
    for label in ax.texts:
        value = operations.get(label.get_text())
        if not hasattr(label, "xyann") or value is None:
            continue
        intensity = intensity_of(value)
        nth = stacked.setdefault(intensity, 0)
        stacked[intensity] += 1
        above_roof = isinstance(value, (tuple, list)) and float(value[1]) > min(peak_tflops, bandwidth_tb_s * intensity)
        sloped = intensity < peak_tflops / bandwidth_tb_s
        label.xyann = ((8 if above_roof else -6 if sloped else 0), (-1 if above_roof else 1) * (8 + 11 * nth))
        label.set_horizontalalignment("left" if above_roof else "right" if sloped else "center")
        label.set_verticalalignment("top" if above_roof else "bottom")
    measured = [(index, intensity_of(value), float(value[1])) for index, value in enumerate(operations.values())
                if isinstance(value, (tuple, list)) and math.isfinite(float(value[1])) and float(value[1]) > 0]
    placed = {}  # intensity -> labels placed there so far
    for index, intensity, tflops in sorted(measured, key=lambda m: (m[1], m[2])):
        color = plt.cm.tab10(index % 10)  # the colour and marker plot_roofline gave this operation on the roof
        ax.plot([intensity, intensity], [tflops, min(peak_tflops, bandwidth_tb_s * intensity)], color=color,
                ls=":", lw=1)
        ax.plot([intensity], [tflops], marker="osD^vP"[index % 6], ms=8, mfc="none", color=color, ls="none", zorder=6)
        right = placed.setdefault(intensity, 0) % 2 == 0
        placed[intensity] += 1
        ax.annotate(f"{tflops:.3g}", (intensity, tflops), textcoords="offset points", xytext=(8 if right else -8, -3),
                    ha="left" if right else "right", fontsize=8, color=color)
    if measured:
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, min(m[2] for m in measured) / 3), high)
        ax.plot([], [], marker="o", mfc="none", color="gray", ls="none", label="hollow: measured (its TFLOP/s beside it)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=7)
    return fig, ax


if TRITON_AVAILABLE:
    mode = "compiled for the GPU" if torch.cuda.is_available() else "interpreter on the CPU (TRITON_INTERPRET=1)"
    print(f"Triton {triton.__version__}: kernels run {mode}")
else:
    print(TRITON_MISSING)

# %% nbgrader={"grade": false, "grade_id": "lab2_test_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["test-helpers"]
# Helpers of this lab's tests. Every comparison goes through checks.py (with its as_tuple, as_truth, carried,
# assert_or_carried and assert_on_input_device); these only accept NaN where a question asks for it, recompute a
# dependent answer from the student's own earlier answers as they were graded (a mistake is charged once: the
# earlier question's test keeps them with keep_carried, the later one builds on them) and take a benchmark's dict
# apart.


def assert_nan(got, what):
    """``got`` must be NaN, as a number in any form ``checks.as_real`` takes (which refuses NaN, so ask it)."""
    try:
        value = as_real(got, what)
    except AssertionError as exc:
        if str(exc) == f"{what} must be a number, got NaN":
            return
        raise
    raise AssertionError(f"{what} must be NaN (float('nan')), got {value!r}")


def keep_your_answers(name, compute, answer, cases):
    """In an earlier question's test: keep compute(answer, *case) for each case (the student's function ``answer`` as
    graded now) under (name, case), with checks.keep_carried (None where it raises), for a later question's
    carry-forward. The test passes the student's function itself: a helper reads only the grader's names."""
    for case in cases:
        keep_carried(f"{name}{tuple(case)!r}", compute, answer, *case)


def your_kept_answer(name, *case):
    """What keep_your_answers kept under (name, case); raises LookupError when nothing was kept (so that
    checks.carried gives None and only the test's own value is accepted)."""
    value = kept_carried(f"{name}{tuple(case)!r}")
    if value is None:
        raise LookupError(f"no kept answer {name}{case!r}")
    return value


def your_hbm_bytes(relu_matmul_hbm_bytes, n, k, bytes_per_element):
    """(fused, unfused) from your relu_matmul_hbm_bytes (Question 1.1), as whole numbers."""
    return tuple(as_integer(relu_matmul_hbm_bytes(n, k=k, bytes_per_element=bytes_per_element, fused=fused),
                            "relu_matmul_hbm_bytes") for fused in (True, False))


def speedup_from_your_bytes(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    """Question 1.2's model on the bytes your relu_matmul_hbm_bytes (Question 1.1) gave when Question 1.1 was graded."""
    kk = n if k is None else k
    fused, unfused = your_kept_answer("relu_matmul_hbm_bytes", n, k, bytes_per_element)
    matmul_s = max(2.0 * n * n * kk / (peak_tflops * 1e12), fused / (bandwidth_tb_s * 1e12))
    return (matmul_s + (unfused - fused) / (bandwidth_tb_s * 1e12)) / matmul_s


def your_chain_flops(chain_flops, seq_len, kv_head):
    """Your chain_flops (Question 2.2), as a real number."""
    return as_real(chain_flops(seq_len, kv_head), "chain_flops")


def your_chain_io_bytes(chain_io_bytes, seq_len, kv_head, bytes_per_element):
    """Your chain_io_bytes (Question 2.1), inputs and output together, as a real number."""
    return sum(as_real(x, "chain_io_bytes")
               for x in as_tuple(chain_io_bytes(seq_len, kv_head, bytes_per_element), 2, "chain_io_bytes"))


def intensity_from_your_counts(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    """Question 2.3's formula on your chain_flops and chain_io_bytes (Questions 2.1 and 2.2) as they were graded."""
    flops = your_kept_answer("chain_flops", seq_len, kv_head)
    io_bytes = your_kept_answer("chain_io_bytes", seq_len, kv_head, bytes_per_element)
    return flops / (io_bytes + intermediate_round_trips * 2.0 * seq_len * seq_len * bytes_per_element)


def lse_with_your_update(online_softmax_update, x, block_size):
    """The log-sum-exp of x (on the CPU) computed block by block with your online_softmax_update (Question 4.1.1),
    as float64 on the CPU. Question 4.1.1's test keeps it for Question 4.1.2's inputs (blockwise_lse_inputs)."""
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=DEVICE)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=DEVICE)
    for start in range(0, x.shape[-1], block_size):
        m, l = (as_tensor(t, "online_softmax_update").to(DEVICE) for t in
                as_tuple(online_softmax_update(m, l, x[..., start:start + block_size].to(DEVICE)), 2,
                         "online_softmax_update"))
    return (m + torch.log(l)).cpu().double()


def blockwise_lse_public_input():
    """The scores of Question 4.1.2's public check (blocks of 2)."""
    return torch.tensor([[0.5, -1.0, 2.0, 0.0, 3.0], [1.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)


def keep_lse_with_your_update(online_softmax_update, cases):
    """In Question 4.1.1's test: keep lse_with_your_update(online_softmax_update, x, block) for each (name, x, block)
    of Question 4.1.2, under ("lse_with_your_update", name, block)."""
    for name, x, block in cases:
        keep_carried(f"lse_with_your_update{(name, block)!r}", lse_with_your_update, online_softmax_update, x, block)


def blockwise_lse_inputs(gen):
    """Question 4.1.2's scores and block sizes, drawn from ``gen``: [(name, x, block_size)]. Question 4.1.1's test
    keeps what your online_softmax_update makes of them (lse_with_your_update) with the same generator's seed."""
    x = torch.randn(2, 3, 37, generator=gen, dtype=torch.float64) * 3
    big = torch.randn(2, 3, 37, generator=gen, dtype=torch.float64) * 1000  # exp overflows beyond ~709
    big[0, 1] = -3000 + torch.randn(37, generator=gen, dtype=torch.float64)  # exp underflows: every term is 0
    x32 = torch.randn(4, 10, generator=gen) * 60  # float32's exp overflows beyond ~88.7
    x32[3] -= 400  # ...and underflows
    masked = torch.randn(2, 3, 37, generator=gen, dtype=torch.float64) * 1000
    masked[0, 0] = float("-inf")
    masked[1, 2, ::2] = float("-inf")
    masked[1, 0, :9] = float("-inf")  # the first blocks of this row are fully masked
    return ([("moderate", x, block) for block in (1, 5, 8, 36, 37, 100)]
            + [("large", big, block) for block in (5, 8)] + [("float32", x32, 3)]
            + [("masked", masked, block) for block in (4, 8)])


def benchmark_attention_result(result, what):
    """The dict ``benchmark_attention`` returned (Question 5.1), with its four keys."""
    result = as_dict(result, what)
    missing = sorted({"status", "forward_ms", "backward_ms", "peak_memory_gb"} - set(result))
    assert not missing, (f"{what} must return a dict with keys status, forward_ms, backward_ms, peak_memory_gb; "
                         f"missing {missing}")
    return result


# %% [markdown]
# # Part 1: Fusion by arithmetic
#
# Take $f(A, B) = \mathrm{relu}(A B)$ for bf16 matrices. Eager PyTorch runs it as **two kernels**: a matmul
# kernel computes $C = AB$ and writes $C$ to HBM (the GPU's main memory); then a relu kernel reads $C$ back,
# clamps it and writes the output. A compiler can **fuse** the two: the matmul kernel applies the relu to each
# tile of results while they are still in registers, just before storing them (an *epilogue*), so $C$ never
# makes the round trip through HBM.
#
# How much can that save? We answer with arithmetic first, then measure.
#
# **The cost model of this lab.** Each kernel reads each of its inputs from HBM once and writes its output to
# HBM once; inside a kernel, reuse is perfect (the on-chip memory is big enough); between two kernels nothing
# stays on chip. Matrices are dense; bf16 takes 2 bytes per number, fp32 4.

# %% [markdown]
# #### Question 1.1 (4 points)
#
# Write `relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True)`: the bytes that `relu(A @ B)` moves
# to and from HBM under the cost model above, for `A` of shape `(n, k)` and `B` of shape `(k, n)` (so the
# product and the output are `(n, n)`); `k=None` means square matrices, `k = n`.
# - `fused=True`: one kernel that computes the product and applies the relu before storing it;
# - `fused=False`: eager PyTorch, a matmul kernel followed by a relu kernel.
#
# Return an `int` (a number of bytes).

# %% nbgrader={"grade": false, "grade_id": "q1_1_hbm_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    """HBM traffic of relu(A @ B) under the kernel cost model (inputs read once, outputs written once).

    Args:
        n (int): A is (n, k) and B is (k, n); the product and the output are (n, n).
        k (int | None): Inner dimension of the product; None means k = n (square matrices).
        bytes_per_element (int): Bytes per number (2 for bf16/fp16, 4 for fp32).
        fused (bool): True for one fused kernel (matmul with a relu epilogue), False for eager PyTorch (a
            matmul kernel, then a relu kernel).

    Returns:
        int: Bytes read from and written to HBM.
    """
    ### BEGIN SOLUTION
    k = n if k is None else k
    matmul_elements = n * k + k * n + n * n  # read A and B, write the (n, n) result
    relu_elements = 0 if fused else 2 * n * n  # eager: the relu kernel reads the product back, writes the output
    return int((matmul_elements + relu_elements) * bytes_per_element)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_1_hbm_bytes_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _q1_1_public_tests():
    with check("public: fused moves fewer bytes than eager, every term grows as n^2, fp32 doubles it, k=None is k = n",
               weight=2):
        fused = as_integer(relu_matmul_hbm_bytes(1024), "relu_matmul_hbm_bytes(1024)")
        unfused = as_integer(relu_matmul_hbm_bytes(1024, fused=False), "relu_matmul_hbm_bytes(1024, fused=False)")
        assert 0 < fused < unfused, (
            f"fusing the relu into the matmul must move fewer bytes than eager: got fused {fused:,}, unfused {unfused:,}")
        assert_integer(relu_matmul_hbm_bytes(2048), 4 * fused, "relu_matmul_hbm_bytes(2048)",
                       formula="4 x relu_matmul_hbm_bytes(1024) (for square matrices every term grows as n^2)")
        assert_integer(relu_matmul_hbm_bytes(1024, bytes_per_element=4), 2 * fused,
                       "relu_matmul_hbm_bytes(1024, bytes_per_element=4)", formula="2 x the bf16 bytes")
        assert_integer(relu_matmul_hbm_bytes(1024, k=1024), fused, "relu_matmul_hbm_bytes(1024, k=1024)",
                       formula="relu_matmul_hbm_bytes(1024) (k=None means k = n)")


_q1_1_public_tests()
del _q1_1_public_tests
# Question 1.2 builds on these bytes: kept as graded here (a mistake is charged once)
keep_your_answers("relu_matmul_hbm_bytes", your_hbm_bytes, relu_matmul_hbm_bytes, [(64, None, 2)])
### BEGIN HIDDEN TESTS
def _q1_1_hidden_tests():
    def grade_cases(cases):
        for n, k, b in cases:
            kk = n if k is None else k
            io_elements = 2 * n * kk + n * n
            where = f"n={n}, k={k}, bytes_per_element={b}"
            assert_integer(relu_matmul_hbm_bytes(n, k=k, bytes_per_element=b, fused=True), io_elements * b,
                           f"relu_matmul_hbm_bytes({where}, fused=True)",
                           formula="(A (n x k) read + B (k x n) read + the (n x n) output written) x bytes_per_element")
            assert_integer(relu_matmul_hbm_bytes(n, k=k, bytes_per_element=b, fused=False),
                           (io_elements + 2 * n * n) * b, f"relu_matmul_hbm_bytes({where}, fused=False)",
                           formula="the matmul's bytes + the relu kernel's read of the (n x n) product and write of "
                                   "its output")

    with check("square matrices (k=None), fused and eager, bf16 and fp32", weight=2):
        grade_cases([(1024, None, 2), (1000, None, 4), (8192, None, 2), (5, None, 1)])
    with check("rectangular matrices: k != n", weight=1):
        grade_cases([(4096, 64, 2), (300, 7, 4), (16384, 128, 2), (5, 3, 1)])
    with check("k is the second positional argument", weight=1):
        for fused in (True, False):
            assert_integer(relu_matmul_hbm_bytes(64, 16, 2, fused), (2 * 64 * 16 + 64 * 64 + (0 if fused else 2 * 64 * 64)) * 2,
                           f"relu_matmul_hbm_bytes(64, 16, 2, {fused}) (positional: n, k, bytes_per_element, fused)",
                           formula="the bytes for n=64, k=16, bf16")


_q1_1_hidden_tests()
del _q1_1_hidden_tests
keep_your_answers("relu_matmul_hbm_bytes", your_hbm_bytes, relu_matmul_hbm_bytes,  # Question 1.2's hidden cases
                  [(n, None, 2) for n in (128, 700, 2048, 8192)] + [(1000, None, 4), (20000, 128, 2), (8192, 64, 2),
                                                                    (4096, 200, 4)])
### END HIDDEN TESTS
finish_checks("Question 1.1")


# %% [markdown]
# #### Question 1.2 (4 points)
#
# The **roofline model** gives the time of one kernel as
# $t = \max\left(\frac{\text{FLOPs}}{\text{peak FLOP/s}}, \frac{\text{bytes}}{\text{bandwidth}}\right)$: the
# kernel is limited either by arithmetic or by memory traffic. Kernels run one after the other, so their times
# add up.
#
# Write `predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2)`, the predicted
# ratio $t_\text{eager} / t_\text{fused}$ for `relu(A @ B)` (shapes as in Question 1.1):
# - eager: the matmul kernel, then the relu kernel; fused: one kernel;
# - the matmul does $2nkn$ FLOPs (one multiply and one add per multiply-add); count the relu's comparisons as
#   zero FLOPs (they are negligible);
# - `peak_tflops` in TFLOP/s ($10^{12}$ FLOP/s) and `bandwidth_tb_s` in TB/s ($10^{12}$ bytes/s).
#
# A note on the wording of the classic version of this problem: "if memory-bound, the compiled function is 40%
# faster" mixes two things. When fusion moves 6 bytes where eager moves 10, the fused kernel takes 40% *less
# time*, which is a speedup of $10/6 \approx 1.67\times$, i.e. 67% *faster*. Return the ratio (1.67 here), a
# number; the tests accept a relative difference of 1% from the exact value of this model.

# %% nbgrader={"grade": false, "grade_id": "q1_2_predicted_speedup", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    """Roofline prediction of t_eager / t_fused for relu(A @ B).

    Args:
        n (int): A is (n, k), B is (k, n).
        peak_tflops (float): Peak compute of the GPU for this dtype, in TFLOP/s.
        bandwidth_tb_s (float): Peak HBM bandwidth, in TB/s.
        k (int | None): Inner dimension; None means k = n.
        bytes_per_element (int): Bytes per number (2 for bf16).

    Returns:
        float: Predicted speedup of the fused kernel over eager PyTorch (> 1 means fused is faster).
    """
    ### BEGIN SOLUTION
    k = n if k is None else k
    peak_flop_s = peak_tflops * 1e12
    bandwidth_b_s = bandwidth_tb_s * 1e12
    matmul_flops = 2 * n * k * n
    matmul_bytes = (2 * n * k + n * n) * bytes_per_element
    relu_bytes = 2 * n * n * bytes_per_element
    matmul_s = max(matmul_flops / peak_flop_s, matmul_bytes / bandwidth_b_s)
    relu_s = relu_bytes / bandwidth_b_s  # zero FLOPs: the relu kernel is pure memory traffic
    fused_s = max(matmul_flops / peak_flop_s, matmul_bytes / bandwidth_b_s)  # same FLOPs and bytes as the matmul
    return (matmul_s + relu_s) / fused_s
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_2_predicted_speedup_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _q1_2_public_tests():
    h100 = GPU_SPECS["H100-SXM"]
    with check("public: a small square relu(A @ B) is memory-bound (5/3); a large one approaches 1", weight=2):
        small = predicted_compile_speedup(64, h100["bf16_tflops"], h100["memory_bandwidth_tb_s"])
        assert_or_carried(
            lambda want: assert_close(small, want, "predicted_compile_speedup(64, H100 bf16 peak, H100 bandwidth)",
                                      rel_tol=1e-2, formula="5 n^2 / 3 n^2 (a small product is memory-bound: eager "
                                                            "moves 5 n^2 numbers, fused 3 n^2)"),
            5 / 3, carried(speedup_from_your_bytes, 64, h100["bf16_tflops"], h100["memory_bandwidth_tb_s"]),
            carried_from="relu_matmul_hbm_bytes (Question 1.1)")
        large = as_real(predicted_compile_speedup(16384, h100["bf16_tflops"], h100["memory_bandwidth_tb_s"]),
                        "predicted_compile_speedup(16384, H100 bf16 peak, H100 bandwidth)")
        assert 1.0 <= large < 1.1, (
            f"a large square matmul is compute-bound: the relu round trip becomes a small fraction of the time, so the "
            f"speedup must approach 1 (between 1.0 and 1.1 at n=16384 on an H100), got {large!r}")


_q1_2_public_tests()
del _q1_2_public_tests
### BEGIN HIDDEN TESTS
def _q1_2_hidden_tests():
    def expected(n, peak, bw, k, b):
        kk = n if k is None else k
        flops = 2.0 * n * n * kk
        matmul_bytes = (2 * n * kk + n * n) * b
        relu_bytes = 2 * n * n * b
        mm_s = max(flops / (peak * 1e12), matmul_bytes / (bw * 1e12))
        return (mm_s + relu_bytes / (bw * 1e12)) / mm_s

    def grade_cases(gpus, cases):
        for peak, bw in gpus:
            for n, k, b in cases:
                where = (f"predicted_compile_speedup(n={n}, peak_tflops={peak}, bandwidth_tb_s={bw}, k={k}, "
                         f"bytes_per_element={b})")
                got = predicted_compile_speedup(n, peak, bw, k=k, bytes_per_element=b)
                def compare(want):
                    return assert_close(got, want, where, rel_tol=1e-2, formula="(t_matmul + t_relu) / t_fused with "
                                        "t = max(FLOPs / peak, bytes / bandwidth) per kernel")

                assert_or_carried(compare, expected(n, peak, bw, k, b),
                                  carried(speedup_from_your_bytes, n, peak, bw, k, b),
                                  carried_from="Question 1.1's relu_matmul_hbm_bytes")

    gpus = [(989.4, 3.35), (312.0, 2.039), (65.0, 0.32), (121.0, 0.3), (19.5, 1.555)]
    with check("square matrices, memory-bound and compute-bound, on five GPUs", weight=2):
        grade_cases(gpus, [(128, None, 2), (700, None, 2), (2048, None, 2), (8192, None, 2)])
    with check("the roofline's max per kernel near and above the ridge point (large and fp32 products)", weight=1):
        grade_cases(gpus, [(1000, None, 4), (20000, 128, 2)])
    with check("rectangular products: k != n", weight=1):
        grade_cases(gpus, [(8192, 64, 2), (4096, 200, 4)])


_q1_2_hidden_tests()
del _q1_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.2")


# %% [markdown]
# ### Measuring it
#
# The cell below times `relu(A @ B)` in bf16 three ways: eager PyTorch; `torch.compile` with its default
# settings; and `torch.compile(mode="max-autotune-no-cudagraphs")`, which lets the compiler (Inductor) benchmark
# its own Triton matmul kernels, which can host an epilogue, against cuBLAS and keep the fastest (the kernel
# counts after the table show which won). Square sizes go from small to 8192; two extra rows use a skinny inner
# dimension `k = 64`, where the product has few FLOPs per byte. It also times the matmul alone (`a @ b`): a
# kernel with the relu fused into its epilogue does the same work, so `eager_ms / matmul_only_ms` is what
# fusion could gain at most on this machine, measured. Predictions use your two functions and the peaks of the
# GPU found here (an H100 stands in on a CPU).
#
# `torch.compile` runs at teaching scale on a GPU only. On a CPU the cell times eager and the matmul alone at
# sizes where a laptop shows both regimes (seconds): Inductor's CPU code keeps the matmul a library call with the
# relu as a separate loop, so compiling there would show no fusion. The compiled GPU numbers are in
# `measured_runs.md` beside this notebook. On a GPU, the first run of this cell compiles and autotunes every size
# (a minute or two); it says so before it starts.

# %%
def relu_matmul(a, b):
    """relu(a @ b): in eager PyTorch, a matmul kernel, then a relu kernel."""
    return torch.relu(a @ b)


def relu_matmul_for_autotune(a, b):
    """The same function once more: torch.compile keeps one compiled cache per Python function, so compiling
    with a second mode needs a second function."""
    return torch.relu(a @ b)


roofline_gpu = detect_gpu(default="H100-SXM")
roofline_specs = GPU_SPECS[roofline_gpu]
peak_bf16_tflops, bandwidth_tb_s = roofline_specs["bf16_tflops"], roofline_specs["memory_bandwidth_tb_s"]
print(f"Roofline of {roofline_gpu}: {peak_bf16_tflops:g} TFLOP/s (bf16), {bandwidth_tb_s:g} TB/s, ridge point "
      f"{get_ridge_point(roofline_gpu, torch.bfloat16):.0f} FLOP/byte"
      + ("" if DEVICE.type == "cuda" else " (no GPU here: an H100 stands in for the predictions)"))

def matmul_only(a, b):
    """a @ b alone: the work of a matmul kernel with the relu fused into its epilogue (the relu costs nothing)."""
    return a @ b


fusion_shapes = at_scale(
    teaching=[(256, None), (2048, None), (8192, None), (4096, 64), (16384, 64)],
    quick=[(64, None), (128, None), (256, 32)],
    cpu=[(256, None), (1024, None), (1024, 64), (4096, 64)],
)
fusion_warmup, fusion_repeat = at_scale(teaching=(10, 50), quick=(2, 5), cpu=(2, 5))
run_compiled = SCALE == "teaching" and DEVICE.type == "cuda"
measure_dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32  # CPUs are slow at bf16 matmuls
if run_compiled:
    relu_matmul_compiled = torch.compile(relu_matmul, dynamic=False)
    relu_matmul_autotuned = torch.compile(relu_matmul_for_autotune, mode="max-autotune-no-cudagraphs", dynamic=False)
    print(f"Compiling and autotuning {len(fusion_shapes)} sizes on the first run (a minute or two; seconds once "
          "Inductor's cache is warm)...")
else:
    print("torch.compile runs on a GPU at teaching scale only (on a CPU it would keep the matmul and the relu apart): "
          "eager and the matmul alone here; the compiled GPU numbers are in measured_runs.md beside this notebook.")

fusion_rows = []
with quiet_autotuning():
    for n, k in progress(fusion_shapes, "matrix sizes"):
        inner = n if k is None else k
        a = torch.randn(n, inner, device=DEVICE, dtype=measure_dtype)
        b = torch.randn(inner, n, device=DEVICE, dtype=measure_dtype)
        row = {
            "n": n,
            "k": inner,
            "eager_MB": your_answer("Question 1.1", relu_matmul_hbm_bytes, n, k, 2, fused=False) / 1e6,
            "fused_MB": your_answer("Question 1.1", relu_matmul_hbm_bytes, n, k, 2, fused=True) / 1e6,
            "predicted_speedup": your_answer("Question 1.2", predicted_compile_speedup, n, peak_bf16_tflops,
                                             bandwidth_tb_s, k=k),
            "eager_ms": benchmark_latency(relu_matmul, a, b, n_warmup=fusion_warmup, n_repeat=fusion_repeat),
            "matmul_only_ms": benchmark_latency(matmul_only, a, b, n_warmup=fusion_warmup, n_repeat=fusion_repeat),
        }
        row["speedup_if_fused"] = row["eager_ms"] / row["matmul_only_ms"]
        if run_compiled:
            row["compiled_ms"] = benchmark_latency(relu_matmul_compiled, a, b, n_warmup=fusion_warmup,
                                                   n_repeat=fusion_repeat)
            row["autotuned_ms"] = benchmark_latency(relu_matmul_autotuned, a, b, n_warmup=fusion_warmup,
                                                    n_repeat=fusion_repeat)
            row["speedup_compiled"] = row["eager_ms"] / row["compiled_ms"]
            row["speedup_autotuned"] = row["eager_ms"] / row["autotuned_ms"]
        fusion_rows.append(row)
        del a, b
fusion_df = pd.DataFrame(fusion_rows)
if DEVICE.type != "cuda":
    print("(float32 on this CPU; the MB and predicted columns are for bf16 on the GPU named above)")
print(fusion_df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))

# %% [markdown]
# How many kernels does each version launch? On a GPU the profiler answers directly (`count_cuda_kernels` from
# `utils`), here for the skinny `n = 16384, k = 64` shape. Look for the relu's elementwise kernel: a version that
# fused the relu has none. Count every kernel, not just the relu's (eager may also launch a memset or a copy
# beside the matmul, and a fused version need not), so compare the lists, not only the totals.

# %%
if run_compiled and DEVICE.type == "cuda":
    a = torch.randn(16384, 64, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(64, 16384, device=DEVICE, dtype=torch.bfloat16)
    for name, fn in [("eager", relu_matmul), ("torch.compile", relu_matmul_compiled),
                     ("max-autotune", relu_matmul_autotuned)]:
        fn(a, b)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(a, b)
            torch.cuda.synchronize()
        counts = count_cuda_kernels(prof)
        print(f"{name:>14}: {counts['total']} kernel(s): "
              + ", ".join(f"{category} {counts[category]}" for category in
                          ("gemm", "attention", "elementwise", "reduction", "memcpy/memset", "other") if counts[category]))
    del a, b
else:
    print("Kernel counts of the compiled versions need a GPU at teaching scale: see measured_runs.md beside this "
          "notebook.")

# %%
if run_compiled:
    square = fusion_df[fusion_df["k"] == fusion_df["n"]]
    fig, ax = plot_latency_vs_size(
        square["n"].tolist(),
        {"predicted (roofline, your function)": square["predicted_speedup"].tolist(),
         "eager / matmul alone (the most fusion could gain)": square["speedup_if_fused"].tolist(),
         "torch.compile (default)": square["speedup_compiled"].tolist(),
         "torch.compile (max-autotune)": square["speedup_autotuned"].tolist()},
        xlabel="n (square bf16 matrices)", ylabel="speedup over eager (x)",
        title=f"relu(A @ B): fusion speedup on {roofline_gpu}", logy=False, logx=True)
    ax.axhline(1.0, color="gray", lw=1)
    plt.show()
else:
    square = fusion_df[fusion_df["k"] == fusion_df["n"]]
    fig, ax = plot_latency_vs_size(
        square["n"].tolist(),
        {"predicted for bf16 on the GPU above (your function)": square["predicted_speedup"].tolist(),
         "measured here: eager / matmul alone": square["speedup_if_fused"].tolist()},
        xlabel="n (square matrices)", ylabel="speedup over eager (x)",
        title="relu(A @ B): the most fusion could gain on this machine", logy=False, logx=True)
    ax.axhline(1.0, color="gray", lw=1)
    plt.show()

# %% [markdown]
# #### Question 1.3 (5 points)
#
# Compare the measured speedups with your predictions (`predicted_speedup` in the table), for the square sizes
# and for the two skinny rows. Where does the prediction hold, and where does it break? Explain each case with
# the roofline (memory- vs compute-bound) and with what the model leaves out (kernel launch and Python/compiler
# overhead, caches, what the compiler actually fused: see the kernel counts). Quote numbers from your table.
# Without a GPU, answer from two sources and say which number comes from where: your own table (eager against
# the matmul alone: what fusion could gain at most on your CPU, in each regime) and the compiled H200 rows and
# kernel counts in `measured_runs.md` beside this notebook. Your `predicted_speedup` column is then for the H100
# that stands in for a GPU; for the H200's predictions, call your function with `GPU_SPECS["H200"]`.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q1_3_answer", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# (Numbers from the H200 run in `measured_runs.md` (the course's `reports/lab2-h200.md`), bf16; another GPU gives
# other values and the same reasoning.)
#
# **Square matrices.** The prediction falls from 1.667x (n = 256) through 1.201x (n = 2048) to 1.050x (n = 8192).
# Measured, `torch.compile` does not reach it anywhere: at n = 256 and 2048 both compiled versions are *slower*
# than eager (0.288-0.854x), and at n = 8192 neither gains: default compile is at 0.936x and max-autotune at
# 0.998x (the prediction is 1.050x). The matmul's intensity is about n/3 FLOP/byte (2n^3 FLOPs over 6n^2 bytes),
# against the H200's ridge point of ~206: at n = 256, where n/3 is about 85, the model calls the product
# **memory-bound** (hence the full 5/3); from n of about 620 it is **compute-bound**, already at n = 2048, where
# n/3 is about 680, and the relu's round trip (4n^2 bytes, a memory-bound kernel of its own) is then a shrinking
# fraction of the time: 1.201x at 2048, 1.050x at 8192 (at 8192 the relu's bytes at full bandwidth take about a
# twentieth of the matmul's time at peak). Where the model fails is the small sizes, whatever their regime: the
# data (0.655 MB at 256, 41.943 MB at 2048) fits in the H200's 60 MB L2 cache and each kernel runs for microseconds
# (eager 0.046 and 0.033 ms a call, the larger product no slower than the smaller), so the time is mostly
# **launch and CPU overhead**, not HBM traffic or FLOPs, which the model leaves out. The compiled function adds
# Dynamo's guard checks and Inductor's wrapper to every call (default compile took 0.103 and 0.114 ms a call
# against eager's 0.046 and 0.033), so it is slower than eager there (CUDA Graphs, `mode="reduce-overhead"`,
# would remove most of that overhead). The matmul-alone column bounds what any fusion could gain: at n = 8192
# eager was even faster than the matmul alone (0.901x): two timings of the same matmul differ by a tenth in this
# run (the GPU's clocks, other work on the host), more than the twentieth the relu could add, so no fused kernel
# can be shown faster than eager there. At n = 256 and 2048 eager is 1.133-1.206x slower than the matmul alone
# (the relu kernel's launch and bytes, about 5 microseconds at both sizes; at 2048 the ratio happens to equal the
# prediction, 1.201x, but this table cannot tell the relu's bytes from its launch), and the compiled wrappers cost
# more than that.
#
# **What was fused.** The kernel counts (16384 x 64) show it: default `torch.compile` launches the same kernels
# as eager (a cuBLAS matmul, a separate relu kernel and a memset/copy: 3 each), because an external library
# matmul cannot take an epilogue, so it gains nothing wherever overhead does not dominate. Only `max-autotune`
# considers Inductor's Triton matmul templates with the relu fused in, and keeps them where they beat cuBLAS:
# it launched a single matmul kernel, and the relu kernel is gone (2 kernels fewer, not 1: the extra
# memset/copy went too).
#
# **Skinny k = 64.** Here the product is genuinely **memory-bound** (intensity about k = 64 FLOP/byte, far below
# the ridge): eager writes the n x n result, reads it back and writes it again, the fused kernel writes it once, so
# the prediction is ~2.9-3x (2.939x at 4096, 2.984x at 16384). At n = 16384 (a 0.5 GB output) max-autotune
# measured 2.226x, while default compile stayed at 1.002x. What fusion could gain at most here is eager over the
# matmul alone, 2.458x, already below the prediction: the model moves every byte at one bandwidth, but eager's
# relu kernel (read and write, the difference between eager's 0.425 ms and the matmul's 0.173 ms) moved its bytes
# about a third faster than the matmul wrote its output, so removing the relu saves less than the model says; the
# fused Triton template was also a little slower than cuBLAS's matmul alone (0.191 against 0.173 ms). At n = 4096 (about 0.04 ms per call) overhead dominates again and both compiled versions are slower
# than eager (0.370-0.609x). So the prediction holds (within what the matmul alone allows) when (1) the operation
# is memory-bound, (2) it is large enough that bandwidth, not launch overhead, sets the time, and (3) the compiler
# really fuses.
#
# (On a CPU: the course's cpu-scale run, on a loaded 2-core machine (`measured_runs.md`), measured eager over the
# matmul alone at 1.500x, 1.250x and 1.499x for 256 x 256, 1024 x 1024 and 1024 x 64, and 2.314x for 4096 x 64: no
# pattern of regimes. The six times of the three smaller shapes are 16, 24, 32 or 40 ms to a few hundredths of a
# millisecond (the 1024 x 64 matmul alone, under a millisecond of work, took 15.997 ms): steps set by the other
# work the scheduler ran on the shared cores, not by the operations. At these sizes, on a shared machine, a median
# of five timings is mostly noise; a CPU-only
# answer reads the regimes from the intensities, says what its own column shows and how far to trust it, and takes
# the fusion itself from the compiled H200 rows.)
# === BEGIN MARK SCHEME ===
# 5 points:
# - 1: compares measured with predicted speedups for both square and skinny shapes, quoting numbers (own table
#   or measured_runs.md, saying which).
# - 1: large square n: compute-bound (intensity ~n/3 above the ridge), the relu round trip is a small fraction,
#   so the speedup tends to 1. The regime is read from the intensity against the ridge: on an H200 (ridge ~206),
#   n = 2048 (n/3 about 680) is already compute-bound, and only n = 256 is memory-bound; an answer that explains
#   n = 2048 as memory-bound (on a GPU whose ridge is below ~680) earns half of this point. At n = 8192 an answer
#   that reads the measured 0.9-1.0x as the run's noise around a predicted 1.05x is right.
# - 1: small n: launch / CPU (Dynamo guard, wrapper) overhead and caches dominate, not HBM bandwidth, so the
#   compiled version can even be slower.
# - 1: what was actually fused: default Inductor keeps cuBLAS plus a separate relu kernel (no gain);
#   max-autotune can fuse the relu as an epilogue (the kernel counts as evidence: the relu kernel disappears).
# - 1: skinny shapes are memory-bound and large, the regime where the prediction (about 3x) is approached. Any
#   physically right reason for the gap at 16384 x 64 (max-autotune 2.226x against 2.984x predicted) earns it:
#   eager over the matmul alone (2.458x) caps any fusion; the relu kernel streams at a higher bandwidth than the
#   matmul writes its output (the model takes one bandwidth for both); the fused template is slower than cuBLAS.
# A CPU-only answer gets full marks when it takes the compiled speedups and kernel counts from measured_runs.md
# (saying so), reads the regimes from the intensities, and says what its own eager / matmul-alone column shows,
# noise included (the course's loaded 2-core run showed 1.250x to 2.314x with no pattern, its smaller shapes' times
# in steps set by the scheduler: an answer that calls such numbers noise is right); an answer that quotes GPU
# numbers it did not take from measured_runs.md or measure loses the "quoting numbers" point. Accept other GPUs'
# numbers reasoned correctly (the H100's ridge, ~295, puts the crossover near n = 900; the reasoning is the same).
# === END MARK SCHEME ===

# %% [markdown]
# # Part 2: The materialized intermediate
#
# Now chain two products around the relu: $C\,\mathrm{relu}(A B)$ with
# - `A` of shape `[SEQ, KV_HEAD]`, `B` and `C` of shape `[KV_HEAD, SEQ]`,
# - so `A @ B` is `[SEQ, SEQ]` and `C @ relu(A @ B)` is `[KV_HEAD, SEQ]`,
# - with `KV_HEAD = 128`, `SEQ = 10_000`, bf16 (2 bytes per number).
#
# The inputs and the output are small (`SEQ x KV_HEAD`), but the intermediate `relu(A @ B)` is `SEQ x SEQ`:
# 10^8 numbers, 200 MB in bf16. Whether that intermediate goes to HBM and back decides how fast this can be.
# This is attention in disguise (Part 3), transposed: with `A` the keys $K$, `B` the transposed queries
# $Q^\top$, `C` the transposed values $V^\top$ and the relu replaced by a softmax over each *column* of
# $AB = KQ^\top$ (over the keys), the chain computes $V^\top P^\top = (PV)^\top = O^\top$ with
# $P = \mathrm{softmax}(QK^\top)$ row by row. (Mapping `A` to $Q$ and `B` to $K^\top$ instead gives $V^\top P$,
# which is not attention; the shapes and costs are the same either way, SEQ the sequence length and KV_HEAD the
# head dimension.)

# %% [markdown]
# #### Question 2.1 (3 points)
#
# Write `chain_io_bytes(seq_len, kv_head, bytes_per_element=2)`: the bytes of the three inputs together and of
# the output of `C @ relu(A @ B)`, as a tuple `(input_bytes, output_bytes)` of ints.

# %% nbgrader={"grade": false, "grade_id": "q2_1_chain_io_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def chain_io_bytes(seq_len, kv_head, bytes_per_element=2):
    """Bytes of the inputs and of the output of C @ relu(A @ B).

    Args:
        seq_len (int): SEQ; A is (SEQ, KV_HEAD), B and C are (KV_HEAD, SEQ).
        kv_head (int): KV_HEAD.
        bytes_per_element (int): Bytes per number (2 for bf16).

    Returns:
        tuple[int, int]: (input_bytes of A, B and C together, output_bytes of the (KV_HEAD, SEQ) result).
    """
    ### BEGIN SOLUTION
    input_bytes = 3 * seq_len * kv_head * bytes_per_element  # A, B and C hold SEQ * KV_HEAD numbers each
    output_bytes = kv_head * seq_len * bytes_per_element
    return int(input_bytes), int(output_bytes)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_1_chain_io_bytes_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _q2_1_public_tests():
    with check("public: a pair (input_bytes, output_bytes) that grows linearly with SEQ; inputs outweigh the output",
               weight=1):
        inputs, output = (as_integer(x, "chain_io_bytes(10_000, 128)") for x in
                          as_tuple(chain_io_bytes(10_000, 128), 2, "chain_io_bytes(10_000, 128)"))
        doubled = [as_integer(x, "chain_io_bytes(20_000, 128)") for x in
                   as_tuple(chain_io_bytes(20_000, 128), 2, "chain_io_bytes(20_000, 128)")]
        assert doubled == [2 * inputs, 2 * output], (
            f"inputs and output grow linearly with SEQ: chain_io_bytes(20_000, 128) must be {(2 * inputs, 2 * output)}, "
            f"got {tuple(doubled)}")
        assert inputs > output > 0, "three inputs of SEQ x KV_HEAD outweigh one output of KV_HEAD x SEQ"


_q2_1_public_tests()
del _q2_1_public_tests
# Question 2.3 builds on these bytes: kept as graded here (a mistake is charged once)
keep_your_answers("chain_io_bytes", your_chain_io_bytes, chain_io_bytes, [(10_000, 128, 2)])
### BEGIN HIDDEN TESTS
def _q2_1_hidden_tests():
    def grade_cases(cases):
        for seq, kv, b in cases:
            where = f"chain_io_bytes(seq_len={seq}, kv_head={kv}, bytes_per_element={b})"
            got_in, got_out = as_tuple(chain_io_bytes(seq, kv, b), 2, where)
            assert_integer(got_in, 3 * seq * kv * b, f"{where}[0] (input_bytes)",
                           formula="3 x SEQ x KV_HEAD x bytes_per_element (A, B and C)")
            assert_integer(got_out, seq * kv * b, f"{where}[1] (output_bytes)",
                           formula="KV_HEAD x SEQ x bytes_per_element")

    with check("bf16 inputs and output of several sizes", weight=2):
        grade_cases([(10_000, 128, 2), (333, 17, 2), (65536, 256, 2)])
    with check("other bytes_per_element (4 and 1)", weight=1):
        grade_cases([(4096, 64, 4), (1, 1, 1)])


_q2_1_hidden_tests()
del _q2_1_hidden_tests
keep_your_answers("chain_io_bytes", your_chain_io_bytes, chain_io_bytes,  # the cases of Question 2.3's hidden tests
                  [(1000, 32, 4), (65536, 128, 2), (4096, 64, 4), (2048, 256, 2), (500, 500, 1)])
### END HIDDEN TESTS
finish_checks("Question 2.1")


# %% [markdown]
# #### Question 2.2 (3 points)
#
# Write `chain_flops(seq_len, kv_head)`: the FLOPs of the two matrix products (2 FLOPs per multiply-add; the
# relu's comparisons count as zero). Return an `int`; the tests accept a relative difference of 1%.

# %% nbgrader={"grade": false, "grade_id": "q2_2_chain_flops", "locked": false, "schema_version": 3, "solution": true, "task": false}
def chain_flops(seq_len, kv_head):
    """FLOPs of C @ relu(A @ B).

    Args:
        seq_len (int): SEQ.
        kv_head (int): KV_HEAD.

    Returns:
        int: FLOPs of both products (2 per multiply-add).
    """
    ### BEGIN SOLUTION
    first = 2 * seq_len * seq_len * kv_head  # A @ B: SEQ x SEQ outputs, KV_HEAD multiply-adds each
    second = 2 * kv_head * seq_len * seq_len  # C @ relu(A @ B): KV_HEAD x SEQ outputs, SEQ multiply-adds each
    return int(first + second)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_2_chain_flops_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _q2_2_public_tests():
    with check("public: both products grow as SEQ^2 and linearly with KV_HEAD", weight=1):
        flops = as_real(chain_flops(10_000, 128), "chain_flops(10_000, 128)")
        assert_close(chain_flops(20_000, 128), 4 * flops, "chain_flops(20_000, 128)", rel_tol=1e-3,
                     formula="4 x chain_flops(10_000, 128) (both products grow as SEQ^2)")
        assert_close(chain_flops(10_000, 256), 2 * flops, "chain_flops(10_000, 256)", rel_tol=1e-3,
                     formula="2 x chain_flops(10_000, 128) (both products grow linearly with KV_HEAD)")


_q2_2_public_tests()
del _q2_2_public_tests
# Question 2.3 builds on these FLOPs: kept as graded here (a mistake is charged once)
keep_your_answers("chain_flops", your_chain_flops, chain_flops, [(10_000, 128)])
### BEGIN HIDDEN TESTS
def _q2_2_hidden_tests():
    with check("the FLOPs of A @ B and of C @ relu(A @ B) for several sizes (1% tolerance)", weight=2):
        for seq, kv in [(10_000, 128), (4096, 64), (1000, 300), (65536, 128), (777, 96)]:
            assert_close(chain_flops(seq, kv), 4 * kv * seq * seq, f"chain_flops(seq_len={seq}, kv_head={kv})",
                         rel_tol=1e-2, formula="2 FLOPs x (SEQ x SEQ x KV_HEAD + KV_HEAD x SEQ x SEQ) multiply-adds")


_q2_2_hidden_tests()
del _q2_2_hidden_tests
keep_your_answers("chain_flops", your_chain_flops, chain_flops,  # the cases of Question 2.3's hidden tests
                  [(1000, 32), (65536, 128), (4096, 64), (2048, 256), (500, 500)])
### END HIDDEN TESTS
finish_checks("Question 2.2")


# %% [markdown]
# #### Question 2.3 (4 points)
#
# Write `chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0)`, the arithmetic
# intensity (FLOPs per byte of HBM traffic) of `C @ relu(A @ B)`:
# - the HBM traffic is the inputs and the output (Question 2.1), plus `intermediate_round_trips` round trips of
#   a `SEQ x SEQ` matrix, where **one round trip** is one write of the whole matrix to HBM and one read back;
# - `intermediate_round_trips=0` is the ideal: the intermediate never leaves the chip (you should find SEQ/2 in
#   bf16);
# - `1` is the relu fused into the first product (the product's result is written, then read by the second
#   product); `2` is eager PyTorch (the product's result is written and read by the relu kernel, whose output is
#   written and read by the second product). You should find about `KV_HEAD` FLOP/byte for one round trip.
#
# Return a `float`; the tests accept a relative difference of 0.5%.

# %% nbgrader={"grade": false, "grade_id": "q2_3_chain_intensity", "locked": false, "schema_version": 3, "solution": true, "task": false}
def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    """Arithmetic intensity of C @ relu(A @ B) in FLOP/byte.

    Args:
        seq_len (int): SEQ.
        kv_head (int): KV_HEAD.
        bytes_per_element (int): Bytes per number (2 for bf16).
        intermediate_round_trips (int): How many times a SEQ x SEQ matrix is written to HBM and read back.

    Returns:
        float: FLOPs divided by HBM bytes.
    """
    ### BEGIN SOLUTION
    flops = 4 * kv_head * seq_len * seq_len
    io_bytes = 4 * seq_len * kv_head * bytes_per_element  # three inputs and one output of SEQ * KV_HEAD numbers
    intermediate_bytes = intermediate_round_trips * 2 * seq_len * seq_len * bytes_per_element  # write + read
    return flops / (io_bytes + intermediate_bytes)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_3_chain_intensity_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _q2_3_public_tests():
    with check("public: SEQ/2 FLOP/byte ideally in bf16, just under KV_HEAD with one round trip", weight=1):
        ideal = chain_intensity(10_000, 128)
        assert_or_carried(lambda want: assert_close(ideal, want, "chain_intensity(10_000, 128)", rel_tol=1e-3,
                                                    formula="SEQ / 2 (the ideal intensity in bf16)"),
                          10_000 / 2, carried(intensity_from_your_counts, 10_000, 128),
                          carried_from="chain_flops and chain_io_bytes (Questions 2.1 and 2.2)")
        one_trip = as_real(chain_intensity(10_000, 128, intermediate_round_trips=1),
                           "chain_intensity(10_000, 128, intermediate_round_trips=1)")
        if not 0.9 * 128 < one_trip < 128:  # else, a mistake of Question 2.1 or 2.2 is charged there only
            assert_close(one_trip, carried(intensity_from_your_counts, 10_000, 128, 2, 1) or 0.95 * 128,
                         "chain_intensity(10_000, 128, intermediate_round_trips=1)", rel_tol=5e-3,
                         formula="just under KV_HEAD = 128 (with one round trip of the SEQ x SEQ intermediate)")


_q2_3_public_tests()
del _q2_3_public_tests
### BEGIN HIDDEN TESTS
def _q2_3_hidden_tests():
    def grade_cases(cases):
        for seq, kv, b, trips in cases:
            want = 4.0 * kv * seq * seq / (4.0 * seq * kv * b + trips * 2.0 * seq * seq * b)
            where = (f"chain_intensity(seq_len={seq}, kv_head={kv}, bytes_per_element={b}, "
                     f"intermediate_round_trips={trips})")
            got = chain_intensity(seq, kv, bytes_per_element=b, intermediate_round_trips=trips)
            def compare(expected):
                return assert_close(got, expected, where, rel_tol=5e-3, formula="4 KV_HEAD SEQ^2 FLOPs / (inputs + "
                                    "output + trips x (write + read) of SEQ x SEQ) bytes")

            assert_or_carried(compare, want, carried(intensity_from_your_counts, seq, kv, b, trips),
                              carried_from="chain_flops and chain_io_bytes of Questions 2.1 and 2.2")

    with check("no round trip of the intermediate (the ideal), bf16 and fp32", weight=1):
        grade_cases([(10_000, 128, 2, 0), (1000, 32, 4, 0), (65536, 128, 2, 0)])
    with check("round trips of the SEQ x SEQ intermediate (a write and a read each)", weight=1):
        grade_cases([(10_000, 128, 2, 1), (10_000, 128, 2, 2), (4096, 64, 4, 1), (2048, 256, 2, 3),
                     (65536, 128, 2, 2), (500, 500, 1, 1)])


_q2_3_hidden_tests()
del _q2_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 2.3")


# %% [markdown]
# ### Measuring it on the roofline
#
# The cell below times three versions in bf16 and turns each time into TFLOP/s (your `chain_flops` divided by
# the time): eager, `torch.compile` (default) and `torch.compile(mode="max-autotune-no-cudagraphs")`. It then
# places them on the roofline of the GPU found here at the intensity your `chain_intensity` gives for the
# number of round trips each version makes (eager 2; default compile, which keeps cuBLAS, also 2; max-autotune,
# which can fuse the relu into the first product, 1), next to the ideal (0 round trips).

# %%
def chain(a, b, c):
    """C @ relu(A @ B)."""
    return c @ torch.relu(a @ b)


def chain_for_autotune(a, b, c):
    """The same function once more, to compile it with a second mode."""
    return c @ torch.relu(a @ b)


SEQ, KV_HEAD = at_scale(teaching=(10_000, 128), quick=(512, 32), cpu=(4096, 64))
chain_a = torch.randn(SEQ, KV_HEAD, device=DEVICE, dtype=measure_dtype)
chain_b = torch.randn(KV_HEAD, SEQ, device=DEVICE, dtype=measure_dtype)
chain_c = torch.randn(KV_HEAD, SEQ, device=DEVICE, dtype=measure_dtype)
chain_warmup, chain_repeat = at_scale(teaching=(10, 50), quick=(1, 3), cpu=(1, 3))

chain_versions = {"eager (2 round trips)": (chain, 2)}
if run_compiled:
    chain_versions["torch.compile (2 round trips)"] = (torch.compile(chain), 2)
    chain_versions["max-autotune (1 round trip)"] = (
        torch.compile(chain_for_autotune, mode="max-autotune-no-cudagraphs"), 1)
    print("Compiling and autotuning (under half a minute on the first run)...")
else:
    print("torch.compile runs on a GPU at teaching scale only: eager here; the compiled GPU rows are in "
          "measured_runs.md beside this notebook.")

chain_rows = []
with quiet_autotuning():
    for name, (fn, trips) in progress(chain_versions.items(), "versions"):
        latency_ms = benchmark_latency(fn, chain_a, chain_b, chain_c, n_warmup=chain_warmup, n_repeat=chain_repeat)
        chain_rows.append({
            "version": name,
            "latency_ms": latency_ms,
            "tflops": your_answer("Question 2.2", chain_flops, SEQ, KV_HEAD) / (latency_ms * 1e-3) / 1e12,
            "intensity_flop_per_byte": your_answer("Question 2.3", chain_intensity, SEQ, KV_HEAD, 2, trips),
        })
chain_df = pd.DataFrame(chain_rows)
print(f"SEQ={SEQ}, KV_HEAD={KV_HEAD}, {'bf16' if measure_dtype == torch.bfloat16 else 'float32 (intensities for bf16)'}; "
      f"{your_answer('Question 2.2', chain_flops, SEQ, KV_HEAD) / 1e9:.1f} GFLOP per call")
print(chain_df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))

chain_operations = {}
for row in chain_rows:
    if DEVICE.type == "cuda":
        chain_operations[row["version"]] = (row["intensity_flop_per_byte"], row["tflops"])
    else:  # CPU timings on a GPU's roofline would mean nothing: show the intensities only
        chain_operations[row["version"]] = row["intensity_flop_per_byte"]
chain_operations["ideal (0 round trips)"] = your_answer("Question 2.3", chain_intensity, SEQ, KV_HEAD, 2, 0)
fig, ax = plot_roofline_measured(roofline_gpu, peak_bf16_tflops, bandwidth_tb_s, chain_operations,
                                 title=f"C @ relu(A @ B), SEQ={SEQ}, KV_HEAD={KV_HEAD}, on {roofline_gpu}")
plt.show()

# %% [markdown]
# #### Question 2.4 (5 points)
#
# (a) Where do the measured points fall relative to the roof at their intensity, and relative to the ideal?
# Which version is fastest, and does the ranking match the number of round trips? Quote your numbers. Without a
# GPU, answer (a) from the H200 rows in `measured_runs.md` beside this notebook (say so), against the H200's roof
# (989.4 TFLOP/s, 4.8 TB/s; the cell draws the H100 that stands in for a GPU); your CPU table still shows what the
# chain costs there.
#
# (b) Why can't a compiler simply keep the `SEQ x SEQ` intermediate on chip and reach the ideal intensity? What
# would a kernel have to do instead (think of tiles)? Then make the link to attention explicit: what plays the
# role of `A`, `B`, `C` and the relu (mind the transposes: the chain must produce the output of attention, or
# its transpose), and what is harder about a softmax than a relu for such a kernel?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q2_4_answer", "locked": false, "points": 5, "schema_version": 3, "solution": true, "task": false}
# (a) (H200, SEQ = 10 000, numbers from `measured_runs.md`.) Eager and default `torch.compile` took about
# 0.23-0.24 ms (~220 and ~213 TFLOP/s), max-autotune 0.184 ms (~278 TFLOP/s). Eager sits at an intensity of about
# 63 FLOP/byte (two round trips of the 200 MB intermediate), where the roof is 63 x 4.8 TB/s, about 300 TFLOP/s:
# it is memory-bound and reaches about three quarters of its roof. Default compile is the same (a little slower),
# because it runs the same kernels (cuBLAS, a relu kernel, cuBLAS). Max-autotune fuses the relu into the first
# product, so one round trip remains (about 125 FLOP/byte, a roof of 125 x 4.8 TB/s, about twice eager's): it is
# the fastest, as halving the intermediate traffic predicts, though it reaches under half of its roof: with half
# of eager's bytes it took four fifths of eager's time, not half (the two products are still separate kernels,
# with their own launches and tails, and the fused kernel moves its bytes more slowly than eager's). The ideal
# point (5000 FLOP/byte, far right of the ridge of ~206) is compute-bound at 989.4 TFLOP/s, about four times
# everything measured. The ranking follows the round trips.
#
# (b) A matrix of 200 MB does not fit in on-chip memory (an H200 has ~256 KB of shared memory/L1 per SM, about
# 33 MB in total, plus a 60 MB L2), and the second product needs *all* of `relu(A @ B)`'s row or column, so two
# separate matmul kernels must pass it through HBM. To avoid that, one kernel must compute the chain **tile by
# tile**: for a block of output it loops over blocks of the SEQ dimension, computes a tile of `A @ B`, applies
# the relu, multiplies it with the matching block of `C` and accumulates; the tile lives in registers/SRAM and is
# thrown away. HBM then never sees the SEQ x SEQ matrix, only the output and the inputs (re-read once per
# output tile that needs them): close to the ideal intensity when the tiles are large. Attention is this chain,
# transposed: `A` is the keys K, `B` the transposed queries Q^T, `C` the transposed values V^T, and the relu
# becomes a softmax over each column of `A @ B` = K Q^T (over the keys), so that the chain gives
# V^T P^T = (P V)^T = O^T, with SEQ the sequence length and KV_HEAD the head dimension (equivalently, O = P V
# is the chain read from the right). The difficulty is that softmax is not elementwise: each score is divided by
# a sum over all the keys of its query (and shifted by their max for stability), known only after all tiles of
# those keys were seen. FlashAttention solves that with the online softmax (Part 4): keep a running max and sum
# per query and rescale the partial results when the max changes.
# === BEGIN MARK SCHEME ===
# 5 points:
# - 1: places the measured points correctly (memory-bound, under the roof at their intensity) with numbers.
# - 1: ranking explained by round trips (default compile = eager kernels; max-autotune fuses the relu: 1 trip).
# - 1: the SEQ x SEQ matrix is far larger than on-chip memory and the second product needs whole rows/columns,
#   so separate kernels must go through HBM.
# - 1: a tiled/fused kernel (loop over SEQ blocks, keep tiles on chip, accumulate) approaches the ideal intensity.
# - 1: maps attention onto the chain so that it computes O or O^T (A = K, B = Q^T, C = V^T with the softmax over
#   the keys, or the same chain read as P V), and names the normalisation over all keys of a query (max and
#   sum) as what makes softmax harder than relu; mentions online softmax / FlashAttention. The mapping A = Q,
#   B = K^T, C = V^T computes V^T P, not attention: half of this point.
# A CPU-only answer to (a) that places the H200 rows of measured_runs.md (saying so) on the H200's roofline
# earns the (a) points in full; one that places CPU timings on the GPU's roofline does not earn the first point.
# Numbers from another GPU, reasoned from its own roofline, are fine.
# === END MARK SCHEME ===

# %% [markdown]
# #### Bonus 2.5 (5 points)
#
# Remove the relu. Then $C(AB) = (CA)B$, and the order matters a lot: `C @ A` is only `KV_HEAD x KV_HEAD`.
#
# **(a) Code, 3 points.** Write `reassociated_chain_cost(seq_len, kv_head, bytes_per_element=2)` returning
# `(flops, hbm_bytes)` for `(C @ A) @ B` computed as two kernels under the cost model of Part 1 (each kernel
# reads its inputs once and writes its output once; 2 FLOPs per multiply-add). Both ints.
#
# **(b) Written, 2 points.** Run the cell after the tests. Without a compiler, is `C @ (A @ B)` or
# `(C @ A) @ B` faster, by how much, and is that the ratio of their FLOPs? Does `torch.compile` change the order
# for you? Why is this rewrite impossible with the relu (or a softmax) in the middle, and which family of
# attention variants is built on exactly this rewrite?

# %% nbgrader={"grade": false, "grade_id": "b2_5_reassociated_cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
def reassociated_chain_cost(seq_len, kv_head, bytes_per_element=2):
    """FLOPs and HBM bytes of (C @ A) @ B as two kernels.

    Args:
        seq_len (int): SEQ; A is (SEQ, KV_HEAD), B and C are (KV_HEAD, SEQ).
        kv_head (int): KV_HEAD.
        bytes_per_element (int): Bytes per number (2 for bf16).

    Returns:
        tuple[int, int]: (FLOPs, HBM bytes) of both kernels together.
    """
    ### BEGIN SOLUTION
    ca_flops = 2 * kv_head * seq_len * kv_head  # (KV_HEAD, SEQ) @ (SEQ, KV_HEAD)
    cab_flops = 2 * kv_head * kv_head * seq_len  # (KV_HEAD, KV_HEAD) @ (KV_HEAD, SEQ)
    ca_elements = kv_head * seq_len + seq_len * kv_head + kv_head * kv_head  # read C and A, write C @ A
    cab_elements = kv_head * kv_head + kv_head * seq_len + kv_head * seq_len  # read C @ A and B, write the output
    return int(ca_flops + cab_flops), int((ca_elements + cab_elements) * bytes_per_element)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b2_5_reassociated_cost_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _b2_5_public_tests():
    with check("public: (flops, hbm_bytes): the FLOPs grow linearly with SEQ (C @ A is only KV_HEAD x KV_HEAD) and do "
               "not depend on bytes_per_element; fp32 doubles the bytes", weight=1):
        def cost(seq, bytes_per_element=2):
            where = f"reassociated_chain_cost({seq}, 128, {bytes_per_element})"
            return [as_integer(x, f"{where}[{i}]") for i, x in
                    enumerate(as_tuple(reassociated_chain_cost(seq, 128, bytes_per_element), 2, where))]

        flops, hbm_bytes = cost(10_000)
        assert_integer(cost(20_000)[0], 2 * flops, "reassociated_chain_cost(20_000, 128)[0] (flops)",
                       formula="2 x the FLOPs at SEQ = 10_000 (no SEQ x SEQ product any more)")
        assert_integer(cost(10_000, 4)[0], flops, "reassociated_chain_cost(10_000, 128, 4)[0] (flops)",
                       formula="the FLOPs in bf16 (FLOPs do not depend on the dtype's size)")
        assert_integer(cost(10_000, 4)[1], 2 * hbm_bytes, "reassociated_chain_cost(10_000, 128, 4)[1] (hbm_bytes)",
                       formula="2 x the bf16 bytes")
        assert flops > 0 and hbm_bytes > 0, f"FLOPs and bytes must be positive, got {(flops, hbm_bytes)}"


_b2_5_public_tests()
del _b2_5_public_tests
### BEGIN HIDDEN TESTS
def _b2_5_hidden_tests():
    cases = [(10_000, 128, 2), (4096, 64, 4), (999, 33, 2), (1, 1, 1), (65536, 256, 2)]
    results = {}
    for seq, kv, b in cases:
        where = f"reassociated_chain_cost(seq_len={seq}, kv_head={kv}, bytes_per_element={b})"
        results[seq, kv, b] = (where, as_tuple(reassociated_chain_cost(seq, kv, b), 2, where))
    with check("FLOPs of (C @ A) @ B", weight=2):
        for (seq, kv, b), (where, (flops, _)) in results.items():
            assert_integer(flops, 4 * kv * kv * seq, f"{where}[0] (flops)",
                           formula="2 KV_HEAD^2 SEQ for C @ A + as much again for (C @ A) @ B")
    with check("HBM bytes of the two kernels", weight=2):
        for (seq, kv, b), (where, (_, hbm_bytes)) in results.items():
            assert_integer(hbm_bytes, (4 * kv * seq + 2 * kv * kv) * b, f"{where}[1] (hbm_bytes)",
                           formula="(C, A read + KV_HEAD x KV_HEAD written; that read + B read + KV_HEAD x SEQ written) "
                                   "x bytes_per_element")


_b2_5_hidden_tests()
del _b2_5_hidden_tests
### END HIDDEN TESTS
finish_checks("Bonus 2.5")


# %%
def chain_no_relu_right(a, b, c):
    """C @ (A @ B): builds the SEQ x SEQ product."""
    return c @ (a @ b)


def chain_no_relu_left(a, b, c):
    """(C @ A) @ B: never builds anything larger than the output."""
    return (c @ a) @ b


reassociation_rows = []
for name, fn in [("C @ (A @ B)", chain_no_relu_right), ("(C @ A) @ B", chain_no_relu_left)]:
    row = {"order": name,
           "eager_ms": benchmark_latency(fn, chain_a, chain_b, chain_c, n_warmup=chain_warmup, n_repeat=chain_repeat)}
    if run_compiled:
        row["compiled_ms"] = benchmark_latency(torch.compile(fn), chain_a, chain_b, chain_c,
                                               n_warmup=chain_warmup, n_repeat=chain_repeat)
    reassociation_rows.append(row)
print(f"FLOPs: C @ (A @ B) {your_answer('Question 2.2', chain_flops, SEQ, KV_HEAD) / 1e9:.2f} GFLOP; (C @ A) @ B: "
      "see reassociated_chain_cost")
print(pd.DataFrame(reassociation_rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
if not run_compiled:
    print("torch.compile runs on a GPU at teaching scale only: eager timings here; the compiled GPU timings are in "
          "measured_runs.md beside this notebook.")

# %% [markdown] nbgrader={"grade": true, "grade_id": "b2_5_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# `(C @ A) @ B` needs 4 KV_HEAD^2 SEQ FLOPs instead of 4 KV_HEAD SEQ^2, SEQ/KV_HEAD = 78x fewer at SEQ = 10 000,
# KV_HEAD = 128, and never builds the 200 MB intermediate. On the H200 (`measured_runs.md`) eager
# `(C @ A) @ B` took 0.0862 ms against 0.1383 ms for `C @ (A @ B)`, a speedup of 0.1383 / 0.0862, about 1.6: far
# from 78x, because the
# reassociated version is tiny (0.66 GFLOP and 10 MB of traffic, a few microseconds at the roofline) and its
# time is set by launch overhead and by `C @ A`, a long reduction (K = SEQ = 10 000) with a small 128 x 128
# output that keeps few SMs busy. `torch.compile` does not reassociate: it keeps the order written
# (floating-point products are not associative, so the result would change); compiled, both orders took about
# the same time (0.1792 and 0.1775 ms), both slower than eager: compiled `(C @ A) @ B` took about twice eager's
# time (Inductor's wrapper and other kernels cost more than such a small computation), and compiled
# `C @ (A @ B)` lost about 0.04 ms to the same per-call overhead. With a relu or a softmax between the products the
# rewrite is impossible: relu(AB) (and softmax(AB)) is not a product of A and B that can be regrouped. Linear
# attention (e.g. Katharopoulos et al., 2020, "Transformers are RNNs") replaces softmax(QK^T) by a feature map
# phi(Q) phi(K)^T precisely so that phi(Q) (phi(K)^T V) can be computed in time linear in the sequence length.
# === BEGIN MARK SCHEME ===
# 2 points:
# - 1: (C @ A) @ B is faster, with the FLOP ratio SEQ/KV_HEAD and the reason the measured gain is smaller
#   (tiny, launch/latency-bound work); torch.compile keeps the written order (no reassociation). A CPU-only
#   answer quotes its own eager timings and takes the compiled behaviour from measured_runs.md (saying so),
#   or reasons that a compiler may not change the rounding of a float computation: full marks.
# - 1: the relu/softmax blocks reassociation (not bilinear); names linear attention (kernelised feature maps).
# === END MARK SCHEME ===

# %% [markdown]
# # Part 3: Attention from scratch
#
# Attention for one head maps queries $Q \in \mathbb{R}^{S_q \times D}$, keys $K$ and values
# $V \in \mathbb{R}^{S_{kv} \times D}$ to
# $$O = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{D}}\right) V,$$
# where the softmax runs along each row, over the keys. The $1/\sqrt{D}$ keeps the scores' spread independent
# of the head dimension (without it, softmax saturates for large $D$).
#
# We use the layout **(batch, seq, heads, head_dim)**, written `bshd`, the layout of flash-attn and of the
# `utils.flash_attn_func` you will benchmark in Part 5 (PyTorch's `F.scaled_dot_product_attention` uses
# `bhsd` instead: transpose dimensions 1 and 2 to go between them).
#
# **einsum.** `torch.einsum` names every axis with a letter: letters shared by the inputs and absent from the
# output are summed over. `torch.einsum("ik,kj->ij", a, b)` is `a @ b`; `"bshd,bthd->bhst"` multiplies the
# query at position `s` with the key at position `t` for every batch `b` and head `h`, summing over `d`: the
# score matrix, one `S_q x S_kv` block per (batch, head). Use `s` for query positions and `t` for key positions.
#
# **Masks.** A boolean mask says which key each query may attend to (`True`: allowed), as in
# `F.scaled_dot_product_attention`. Masked scores are set to $-\infty$ before the softmax, so they get weight
# exactly 0. Every query must keep at least one key (a row of $-\infty$ has no softmax).

# %% [markdown]
# #### Question 3.1 (8 points)
#
# Write `einsum_attention(q, k, v, mask=None)` with `torch.einsum`:
# - `q` of shape `(B, S_q, H, D)`, `k` and `v` of shape `(B, S_kv, H, D)` (`S_q` may differ from `S_kv`);
# - scores scaled by $1/\sqrt{D}$, softmax over the keys;
# - `mask`: `None`, or a boolean tensor that broadcasts to `(B, H, S_q, S_kv)` (for example `(S_q, S_kv)` or
#   `(B, 1, S_q, S_kv)`), `True` where the query may attend to the key;
# - return `(B, S_q, H, D)` in the dtype of `q`; do not modify the inputs;
# - compute the scores ($QK^\top$) and the output ($PV$) each with `torch.einsum` (not `@`, `torch.matmul` or a
#   sum of broadcast products), not with a fused attention (`F.scaled_dot_product_attention`, `flash_attn_func`,
#   `nn.MultiheadAttention`): the tests record which torch functions your code calls and what each einsum reads and
#   returns (an answer that skips einsum earns at most a quarter of the points), and Part 5 times this function as
#   the *eager* baseline;
# - precision: the tests compare with a float64 reference to a maximum absolute difference of 1e-5 for float64
#   inputs and 1e-4 for float32 inputs, so computing in float32 is fine (for example
#   `weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)`: the softmax in float32, the weights
#   cast back to the dtype of `v` so that the second einsum gets two tensors of one dtype); half precision (bf16,
#   fp16) inside is not.
#
# (The classic version of this code has a subtle bug: it computes the output with
# `einsum("bhst,bshd->bshd", weights, v)`. What does that return, given that each row of `weights` sums to 1?)

# %% nbgrader={"grade": false, "grade_id": "q3_1_einsum_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def einsum_attention(q, k, v, mask=None):
    """Scaled dot-product attention with einsum, (batch, seq, heads, head_dim) layout.

    Args:
        q (torch.Tensor): Queries, (B, S_q, H, D).
        k (torch.Tensor): Keys, (B, S_kv, H, D).
        v (torch.Tensor): Values, (B, S_kv, H, D).
        mask (torch.Tensor | None): Boolean, broadcastable to (B, H, S_q, S_kv); True where attending is allowed.

    Returns:
        torch.Tensor: (B, S_q, H, D), dtype of q: softmax(q k^T / sqrt(D)) v per batch and head.
    """
    ### BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bshd,bthd->bhst", q * scale, k)  # (B, H, S_q, S_kv); scaling q is cheaper than scores
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # over the keys t
    return torch.einsum("bhst,bthd->bshd", weights, v).to(q.dtype)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_1_einsum_attention_tests", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
def _q3_1_public_tests():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 3, 4, generator=gen) for _ in range(3))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()

    def reference(mask=None):  # F.scaled_dot_product_attention in float64, in its (B, H, S, D) layout
        q64, k64, v64 = (t.double().transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q64, k64, v64, attn_mask=mask).transpose(1, 2)

    want, want_masked = reference(), reference(mask)  # computed first; the function gets copies (t.clone())
    with check("public: equals F.scaled_dot_product_attention (float32 q, k, v of shape (2, 5, 3, 4)), without and "
               "with a (S, S) boolean mask", weight=2):
        assert_tensor_close(einsum_attention(*(t.clone().to(DEVICE) for t in (q, k, v))), want,
                            "einsum_attention(q, k, v) for float32 (2, 5, 3, 4) inputs", rtol=0, atol=1e-4,
                            dtype=torch.float32)
        assert_tensor_close(einsum_attention(*(t.clone().to(DEVICE) for t in (q, k, v)), mask=mask.clone().to(DEVICE)),
                            want_masked, "einsum_attention(q, k, v, mask) with a (5, 5) causal boolean mask "
                            "(True = may attend)", rtol=0, atol=1e-4, dtype=torch.float32)


_q3_1_public_tests()
del _q3_1_public_tests
### BEGIN HIDDEN TESTS
def _q3_1_hidden_tests():
    def reference(q, k, v, mask=None):
        q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask.cpu(), float("-inf"))
        return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)

    gen = torch.Generator().manual_seed(3_1)

    @kernel_side
    def call_keeping_inputs(fn, *args, **kwargs):
        """fn(*args, **kwargs) in the kernel; (its result, whether every tensor argument kept its values)."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        copies = [t.clone() for t in tensors]
        result = fn(*args, **kwargs)
        return result, all(torch.equal(t, c) for t, c in zip(tensors, copies))

    @kernel_side
    def einsum_calls_of(fn, *args, **kwargs):
        """fn(*args, **kwargs) run in the kernel: (the names of the torch functions it called, from record_torch_calls;
        the shapes each torch.einsum call read and returned, [(operand shapes, result shape)])."""
        from torch.overrides import TorchFunctionMode
        from torch.utils._pytree import tree_leaves

        class EinsumShapes(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.calls = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if getattr(func, "__name__", "") == "einsum":
                    operands = [t for t in tree_leaves((args, kwargs or {})) if isinstance(t, torch.Tensor)]
                    self.calls.append(([list(t.shape) for t in operands],
                                       list(out.shape) if isinstance(out, torch.Tensor) else []))
                return out

        with record_torch_calls() as called:
            with EinsumShapes() as shapes:
                fn(*args, **kwargs)
        return sorted(called), shapes.calls

    def inputs(b, s_q, s_kv, h, d, scale=1.0, mask_shape=None):
        q = torch.randn(b, s_q, h, d, generator=gen, dtype=torch.float64) * scale
        k = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64) * scale
        v = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64)
        mask = None
        if mask_shape is not None:
            mask = torch.rand(*mask_shape, generator=gen) < 0.6
            mask[..., 0] = True  # every query keeps at least one key
        return q, k, v, mask

    unchanged_flags = []  # (whether the call kept its inputs, whether its output was right) per call

    def grade_case(b, s_q, s_kv, h, d, dtype, mask_shape=None, scale=1.0, noncontiguous=False):
        q, k, v, mask = inputs(b, s_q, s_kv, h, d, scale, mask_shape)
        want = reference(q, k, v, mask)  # from the test's own tensors, before the call; the function gets copies
        if noncontiguous:  # same values, stored as (B, H, S, D) and viewed as (B, S, H, D)
            qd, kd, vd = (t.transpose(1, 2).clone(memory_format=torch.contiguous_format).to(DEVICE, dtype)
                          .transpose(1, 2) for t in (q, k, v))
        else:
            qd, kd, vd = (t.clone().to(DEVICE, dtype) for t in (q, k, v))
        out, unchanged = call_keeping_inputs(einsum_attention, qd, kd, vd,
                                             mask=None if mask is None else mask.clone().to(DEVICE))
        unchanged_flags.append([unchanged, False])
        where = (f"einsum_attention for q {tuple(q.shape)}, k/v {tuple(k.shape)}, {dtype}, mask "
                 f"{'None' if mask is None else tuple(mask.shape)} (softmax(q k^T / sqrt(D)) over the keys, times v)")
        tol = 1e-5 if dtype == torch.float64 else 1e-4
        assert_tensor_close(out, want, where, rtol=0, atol=tol, dtype=dtype)
        unchanged_flags[-1][1] = True

    with check("float64 inputs: self- and cross-attention (S_q != S_kv), head_dim 1, large scores", weight=3):
        grade_case(1, 7, 7, 1, 8, torch.float64)
        grade_case(3, 6, 11, 2, 5, torch.float64)  # cross-attention: S_q != S_kv
        grade_case(2, 9, 4, 3, 1, torch.float64)  # head_dim 1
        grade_case(2, 8, 8, 2, 16, torch.float64, scale=3.0)  # large scores: the 1/sqrt(D) matters
    with check("float32 inputs, also stored in another layout (transposed views)", weight=1):
        grade_case(2, 10, 10, 4, 6, torch.float32, noncontiguous=True)
        grade_case(3, 8, 8, 1, 32, torch.float32, mask_shape=(8, 8))
    with check("masks that broadcast: (B, 1, S_q, S_kv), (B, H, S_q, S_kv), (S_q, S_kv)", weight=1):
        grade_case(2, 6, 9, 3, 4, torch.float64, mask_shape=(2, 1, 6, 9))
        grade_case(2, 7, 7, 3, 4, torch.float64, mask_shape=(2, 3, 7, 7))
        grade_case(1, 5, 12, 2, 7, torch.float64, mask_shape=(5, 12))
    with check("q, k, v and the mask are not modified by the calls that compute attention", weight=1):
        try:
            grade_case(2, 6, 6, 2, 4, torch.float64, mask_shape=(6, 6))
        except AssertionError:
            pass  # a wrong value is charged above; this check reads the calls whose value was right
        right = [kept for kept, correct in unchanged_flags if correct]
        assert right, "no call of einsum_attention returned attention, so whether it keeps its inputs was not checked"
        assert all(kept is True for kept in right), (
            f"einsum_attention must not modify q, k, v or the mask in place: {right.count(False)} of {len(right)} "
            f"calls changed an argument")
    # The method, which gates this question: the scores and the output each come from a torch.einsum. Sizes that differ
    # (B=2, S=7, H=5, D=3) tell the tensors apart by shape: scores hold S twice, the output S once and D.
    with check("computed with torch.einsum: the scores (from q and k) and the output (from the weights and v), not with "
               "@, matmul or a fused attention (scaled_dot_product_attention, flash_attn_func, nn.MultiheadAttention)",
               weight=3, method=True):
        b, s, h, d = 2, 7, 5, 3
        q, k, v, mask = inputs(b, s, s, h, d, mask_shape=(s, s))
        for args in ((q, k, v), (q, k, v, mask)):
            what = f"einsum_attention for q, k, v of shape {(b, s, h, d)}" + (" and a mask" if len(args) == 4 else "")
            called, einsums = einsum_calls_of(einsum_attention, *(t.clone().to(DEVICE) for t in args))
            assert_calls(called, f"{what} (the question prescribes torch.einsum)", required=("einsum",),
                         forbidden=("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                                    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                    "_scaled_dot_product_flash_attention_for_cpu", "multi_head_attention_forward",
                                    "flash_attn_func"))
            shapes = [([list(map(int, shape)) for shape in operands], list(map(int, result)))
                      for operands, result in einsums]

            def holds(shape, size, times=1):
                return shape.count(size) >= times

            scores = [result for operands, result in shapes if holds(result, s, 2) and len(operands) >= 2
                      and sum(holds(o, s) and holds(o, d) and not holds(o, s, 2) for o in operands) >= 2]
            outputs = [result for operands, result in shapes if holds(result, s) and holds(result, d)
                       and not holds(result, s, 2) and any(holds(o, s, 2) for o in operands)
                       and any(holds(o, s) and holds(o, d) and not holds(o, s, 2) for o in operands)]
            assert scores, (f"{what} must compute the scores q k^T with torch.einsum (an einsum that reads q and k and "
                            f"returns the S x S scores); its einsum calls read and returned {shapes or 'nothing'}")
            assert outputs, (f"{what} must compute the output P v with torch.einsum (an einsum that reads the S x S "
                             f"weights and v); its einsum calls read and returned {shapes or 'nothing'}")


_q3_1_hidden_tests()
del _q3_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.1")


# %% [markdown]
# The classic buggy output line, for the record: with `"bhst,bshd->bshd"` the value index is tied to the
# *query* position `s`, so $O_{s} = \sum_t w_{st} V_{s} = V_s$: the function returns `v` unchanged (for
# `S_q = S_kv`), whatever the queries and keys. A test against a reference catches it at once.

# %%
demo_q, demo_k, demo_v = (torch.randn(1, 6, 2, 4, device=DEVICE) for _ in range(3))
with uses_answers("Question 3.1"):
    print("output shape:", tuple(einsum_attention(demo_q, demo_k, demo_v).shape))
print("buggy version returns v unchanged:",
      torch.allclose(torch.einsum("bhst,bshd->bshd",
                                  torch.softmax(torch.randn(1, 2, 6, 6, device=DEVICE), dim=-1), demo_v), demo_v))

# %% [markdown]
# #### Question 3.2 (4 points)
#
# Count the cost of attention for `batch` sequences of `seq_len` tokens, `heads` heads of `head_dim`
# (self-attention: `S_q = S_kv = seq_len`). Write
# `attention_cost(batch, seq_len, heads, head_dim, bytes_per_element=2, score_round_trips=0)` returning a dict
# with three keys:
# - `"flops"`: the two products $QK^\top$ and $PV$ (2 FLOPs per multiply-add; scaling, masking and softmax
#   count as zero);
# - `"hbm_bytes"`: reading Q, K, V and writing O, plus `score_round_trips` round trips (one write and one read)
#   of the `(batch, heads, seq_len, seq_len)` score or probability matrix;
# - `"intensity"`: FLOPs per byte.
#
# With `score_round_trips=0` (the ideal: Q, K and V read once, O written once; FlashAttention comes close, as
# Part 4 shows) you should find an intensity of `seq_len / 2` in bf16: the same as Question 2.3.
#
# In the same cell, set `einsum_round_trips` (an `int`) to the number of round trips of the `(B, H, S, S)`
# matrix made by an `einsum_attention` with a mask that runs these four kernels, each reading its inputs once
# and writing its output once: the first einsum writes the scores; `masked_fill` reads them and writes the
# masked scores; the softmax reads those and writes the probabilities; the second einsum reads the
# probabilities. (Scaling the scores after the product instead of scaling `q` before it would add a fifth
# kernel, and one more round trip. Question 3.1's float32 hint adds more on bf16 inputs: PyTorch casts the scores
# to float32 (a kernel of its own), the softmax reads and writes float32 matrices, twice the bytes of bf16 ones,
# and a cast kernel reads the float32 probabilities and writes the bf16 copy the second einsum reads.
# `einsum_round_trips` counts the four kernels listed here; Part 5 counts what your own code moves.)

# %% nbgrader={"grade": false, "grade_id": "q3_2_attention_cost", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_cost(batch, seq_len, heads, head_dim, bytes_per_element=2, score_round_trips=0):
    """FLOPs, HBM bytes and arithmetic intensity of self-attention.

    Args:
        batch (int): B.
        seq_len (int): S (queries and keys).
        heads (int): H.
        head_dim (int): D.
        bytes_per_element (int): Bytes per number (2 for bf16).
        score_round_trips (int): Round trips (write + read) of the (B, H, S, S) matrix through HBM.

    Returns:
        dict: {"flops": int, "hbm_bytes": int, "intensity": float (FLOP/byte)}.
    """
    ### BEGIN SOLUTION
    flops = 2 * (2 * batch * heads * seq_len * seq_len * head_dim)  # Q K^T and P V
    qkvo_bytes = 4 * batch * seq_len * heads * head_dim * bytes_per_element  # read Q, K, V; write O
    score_bytes = score_round_trips * 2 * batch * heads * seq_len * seq_len * bytes_per_element  # write + read
    hbm_bytes = qkvo_bytes + score_bytes
    return {"flops": int(flops), "hbm_bytes": int(hbm_bytes), "intensity": flops / hbm_bytes}
    ### END SOLUTION


einsum_round_trips = None  # round trips of the S x S matrix (an int)
### BEGIN SOLUTION
einsum_round_trips = 3  # einsum -> masked_fill, masked_fill -> softmax, softmax -> einsum: one write + one read each
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_2_attention_cost_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
def _q3_2_public_tests():
    with check("public: a dict with flops, hbm_bytes and intensity = flops / hbm_bytes; seq_len / 2 without round "
               "trips; below head_dim with them; einsum_round_trips a whole number", weight=1):
        cost = as_dict(attention_cost(8, 4096, 16, 64), "attention_cost(8, 4096, 16, 64)")
        missing = sorted({"flops", "hbm_bytes", "intensity"} - set(cost))
        assert not missing, f"attention_cost must return a dict with keys 'flops', 'hbm_bytes', 'intensity'; missing {missing}"
        flops = as_integer(cost["flops"], "attention_cost(8, 4096, 16, 64)['flops']")
        hbm_bytes = as_integer(cost["hbm_bytes"], "attention_cost(8, 4096, 16, 64)['hbm_bytes']")
        assert_close(cost["intensity"], flops / hbm_bytes, "attention_cost(8, 4096, 16, 64)['intensity']",
                     formula="flops / hbm_bytes")
        assert_close(cost["intensity"], 4096 / 2, "attention_cost(8, 4096, 16, 64)['intensity']",
                     formula="seq_len / 2 (bf16, no score round trips)")
        tripped = as_dict(attention_cost(8, 4096, 16, 64, score_round_trips=2), "attention_cost(..., score_round_trips=2)")
        assert as_real(tripped.get("intensity"), "attention_cost(8, 4096, 16, 64, score_round_trips=2)['intensity']") < 64, (
            "with the S x S matrix going through HBM the intensity falls below head_dim")
        as_integer(einsum_round_trips, "einsum_round_trips")


_q3_2_public_tests()
del _q3_2_public_tests
### BEGIN HIDDEN TESTS
def _q3_2_hidden_tests():
    cases = [(8, 4096, 16, 64, 2, 0), (1, 1000, 1, 128, 2, 1), (4, 2048, 8, 32, 4, 2), (2, 300, 3, 7, 2, 3),
             (16, 512, 12, 64, 1, 1), (1, 65536, 32, 128, 2, 2)]
    results = []
    for b, s, h, d, nb, trips in cases:
        where = (f"attention_cost(batch={b}, seq_len={s}, heads={h}, head_dim={d}, bytes_per_element={nb}, "
                 f"score_round_trips={trips})")
        got = as_dict(attention_cost(b, s, h, d, bytes_per_element=nb, score_round_trips=trips), where)
        results.append((where, got, 4 * b * h * s * s * d, 4 * b * s * h * d * nb + trips * 2 * b * h * s * s * nb))
    with check("flops: Q K^T and P V", weight=1):
        for where, got, flops, _ in results:
            assert_integer(got.get("flops"), flops, f"{where}['flops']", formula="2 x (2 B H S^2 D)")
    with check("hbm_bytes: Q, K, V read, O written, plus the round trips of the (B, H, S, S) matrix", weight=1):
        for where, got, _, hbm in results:
            assert_integer(got.get("hbm_bytes"), hbm, f"{where}['hbm_bytes']",
                           formula="4 B S H D numbers + trips x (write + read) of B H S^2 numbers, x bytes_per_element")
    with check("intensity: flops / hbm_bytes (of your own flops and hbm_bytes, at least one of them right)", weight=1):
        def right(value, want, what):
            try:
                assert_integer(value, want, what)
            except AssertionError:
                return False
            return True

        for where, got, flops, hbm in results:  # each mistake is charged once: the ratio of the dict's own numbers
            own_flops = as_real(got.get("flops"), f"{where}['flops']")
            own_bytes = as_real(got.get("hbm_bytes"), f"{where}['hbm_bytes']")
            assert right(own_flops, flops, "flops") or right(own_bytes, hbm, "hbm_bytes"), (  # made-up numbers earn nothing
                f"{where}: the intensity is checked as flops / hbm_bytes of the same dict when at least one of them is "
                f"right; flops must be {flops:,} or hbm_bytes {hbm:,}, got {got.get('flops')!r} and {got.get('hbm_bytes')!r}")
            assert_close(got.get("intensity"), own_flops / own_bytes, f"{where}['intensity']", rel_tol=1e-6,
                         formula="flops / hbm_bytes of the same dict")
    with check("einsum_round_trips: the round trips of the masked einsum attention", weight=1):
        assert_integer(einsum_round_trips, 3, "einsum_round_trips",
                       formula="einsum -> masked_fill, masked_fill -> softmax, softmax -> einsum: one write and one "
                               "read of the S x S matrix each")


_q3_2_hidden_tests()
del _q3_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.2")


# %% [markdown]
# #### Question 3.3 (3 points)
#
# A decoder predicts token $i+1$ from tokens $0..i$, so query $i$ may only attend to keys $j \le i$ (itself
# included). Write `causal_mask(seq_len, device=None)`: a boolean `(seq_len, seq_len)` tensor created on
# `device` (`None`: PyTorch's default device, as for `torch.ones(..., device=None)`), `True` where key `j` (column)
# is visible to query `i` (row). The tests check the device even on a CPU: pass `device=` to what creates the mask.
#
# (Compare with the classic JAX version, which subtracts `1e6 * triu(ones, 1)` from the scores: it works, but
# only because 1e6 dwarfs the scores, and it builds the mask from a global `SEQ_LEN` instead of the input's
# length. A boolean mask with $-\infty$ is exact.)

# %% nbgrader={"grade": false, "grade_id": "q3_3_causal_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_mask(seq_len, device=None):
    """Causal attention mask.

    Args:
        seq_len (int): S.
        device (torch.device | str | None): Where to create the mask (None: PyTorch's default device).

    Returns:
        torch.Tensor: Boolean (S, S); entry [i, j] is True when key j <= query i.
    """
    ### BEGIN SOLUTION
    positions = torch.arange(seq_len, device=device)
    return positions[None, :] <= positions[:, None]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_3_causal_mask_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _q3_3_public_tests():
    with check("public: causal_mask(4) is a (4, 4) boolean tensor whose row 0 sees key 0 only", weight=1):
        want = torch.tensor([[j <= i for j in range(4)] for i in range(4)])
        got = assert_tensor_close(causal_mask(4), want, "causal_mask(4)", dtype=torch.bool)
        assert got[0].tolist() == [True, False, False, False], (
            f"row 0 (the first query) may attend to key 0 only, got {got[0].tolist()}")


_q3_3_public_tests()
del _q3_3_public_tests
### BEGIN HIDDEN TESTS
def _q3_3_hidden_tests():
    with check("causal_mask(s)[i, j] is True exactly when j <= i, boolean (s, s), for s from 1 to 64", weight=2):
        for s in (1, 2, 5, 17, 64):
            want = torch.tensor([[j <= i for j in range(s)] for i in range(s)], dtype=torch.bool)
            assert_tensor_close(causal_mask(s, device="cpu"), want,
                                f"causal_mask({s}, device='cpu') (True exactly when key j <= query i)", dtype=torch.bool)
    with check("the mask is created on the device asked for (device=None: PyTorch's default device)", weight=1):
        assert_on_input_device(causal_mask, (6, DEVICE), DEVICE, f"causal_mask(6, device={DEVICE})")
        on_device = as_tensor(causal_mask(6, DEVICE), f"causal_mask(6, device={DEVICE})")
        assert tuple(on_device.shape) == (6, 6) and on_device.dtype == torch.bool and 0 < int(on_device.sum()) < 36, (
            f"causal_mask(6, device={DEVICE}) must be a (6, 6) boolean mask with some keys visible and some not (this "
            f"check is about where a real mask is made), got {tuple(on_device.shape)} {on_device.dtype} with "
            f"{int(on_device.sum()) if on_device.dtype == torch.bool else 'no'} True entries")
        probe = kernel_side(output_devices_with_meta_default)  # PyTorch's default device is `meta` during the call
        for args, want in (((6,), "meta"),):
            devices = probe(causal_mask, *args)
            where = f"causal_mask{args}" if len(args) > 1 else "causal_mask(6) (device=None)"
            assert devices is None or [torch.device(d).type for d in devices] == [want], (
                f"{where} must create the mask on {want}" + (" (PyTorch's default device, meta during this check)"
                                                             if want == "meta" else "")
                + f": with PyTorch's default device set to meta it returned tensors on {devices}; pass device= to "
                  f"the function that creates the mask")


_q3_3_hidden_tests()
del _q3_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 3.3")


# %% [markdown] nbgrader={"grade": false, "grade_id": "q3_4_segment_mask", "locked": true, "schema_version": 3, "solution": false, "task": false}
# #### Bonus 3.4 (3 points)
#
# **Packing.** Training on many short sequences wastes compute on padding. Instead, several sequences are
# *packed* one after the other into one row of the batch, and a **segment id** per token says which sequence it
# belongs to, e.g. `[0, 0, 0, 1, 1, 2, 2, 2]`. A token must then attend only to tokens of its own segment,
# and, in a decoder, only to earlier ones: the result must be exactly what attention would give on each sequence
# separately. Masks, causal masks and packing are the three features an attention for training has to support
# (flash-attn's `flash_attn_varlen_func` takes the sequences' boundaries instead of a mask).
#
# Write `segment_mask(segment_ids, causal=False)`: for `segment_ids` of shape `(B, S)` (integers; tokens with
# equal ids belong together, whether or not they are next to each other), return a boolean `(B, 1, S, S)` mask
# (the `1` broadcasts over heads), `True` where query `i` and key `j` have the same segment id and, if `causal`,
# `j <= i`, on the device of `segment_ids` (create every tensor you need with `device=segment_ids.device`). The
# tests check the mask on batches you have not seen, with `causal` off and on, and where it is created.

# %% nbgrader={"grade": false, "grade_id": "b3_4_segment_mask", "locked": false, "schema_version": 3, "solution": true, "task": false}
def segment_mask(segment_ids, causal=False):
    """Attention mask for packed sequences.

    Args:
        segment_ids (torch.Tensor): Integer (B, S); tokens with equal ids belong to the same sequence.
        causal (bool): Also require key position j <= query position i.

    Returns:
        torch.Tensor: Boolean (B, 1, S, S), on the device of segment_ids; True where query i may attend to key j.
    """
    ### BEGIN SOLUTION
    allowed = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, S_query, S_key)
    if causal:
        positions = torch.arange(segment_ids.shape[1], device=segment_ids.device)
        allowed = allowed & (positions[None, :] <= positions[:, None])
    return allowed[:, None]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b3_4_segment_mask_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _b3_4_public_tests():
    ids = torch.tensor([[0, 0, 1, 1, 1], [4, 4, 4, 4, 9]])
    same = (ids[:, :, None] == ids[:, None, :])[:, None]
    with check("public: segment_mask(ids) is True exactly where the segment ids are equal, boolean (B, 1, S, S), "
               "and with causal=True also requires key j <= query i", weight=1):
        assert_tensor_close(segment_mask(ids.clone()), same, "segment_mask(ids (2, 5))", dtype=torch.bool)
        assert_tensor_close(segment_mask(ids.clone(), causal=True),
                            same & torch.ones(5, 5, dtype=torch.bool).tril(), "segment_mask(ids (2, 5), causal=True)",
                            dtype=torch.bool)


_b3_4_public_tests()
del _b3_4_public_tests
### BEGIN HIDDEN TESTS
def _b3_4_hidden_tests():
    gen = torch.Generator().manual_seed(3_4)

    def expected(ids, causal):
        allowed = ids[:, :, None] == ids[:, None, :]
        if causal:
            allowed = allowed & torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()
        return allowed[:, None]

    def cases():
        random_ids = torch.randint(0, 3, (3, 9), generator=gen)  # equal ids that are not next to each other
        packed = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 5, 5]])  # one row holds one sequence
        negative = torch.tensor([[-7, -7, 3, 3, 3, -7]], dtype=torch.int32)  # any integers, another integer dtype
        return [("random ids (3, 9)", random_ids), ("packed ids (2, 8)", packed),
                ("int32 ids (1, 6) with a repeated id", negative), ("one token (1, 1)", torch.tensor([[2]]))]

    def grade(causal):
        for name, ids in cases():
            assert_tensor_close(segment_mask(ids.clone(), causal=causal), expected(ids, causal),
                                f"segment_mask({name}, causal={causal}) (True where the segment ids of query i and key "
                                f"j are equal" + (" and j <= i" if causal else "") + ")", dtype=torch.bool)

    with check("causal=False: True exactly where the ids are equal, also for equal ids apart, any integer ids",
               weight=2):
        grade(False)
    with check("causal=True: the same segments and key j <= query i", weight=1):
        grade(True)
    @kernel_side
    def default_device_error(fn, *args):
        """fn(*args) with PyTorch's default device set to meta and its inputs elsewhere: the error text when the call
        combined its inputs with a tensor it created on the default device (it names meta), else None."""
        import torch

        try:
            with torch.device("meta"):
                fn(*args)
        except RuntimeError as exc:
            return str(exc)[:200] if "meta" in str(exc) else None
        return None

    with check("the mask is on the device of segment_ids: every tensor created with device=segment_ids.device",
               weight=1):
        ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
        for causal in (False, True):
            assert_on_input_device(segment_mask, (ids.to(DEVICE), causal), DEVICE,
                                   f"segment_mask(ids on {DEVICE}, {causal})")
            mixed = default_device_error(segment_mask, ids.clone(), causal)
            assert mixed is None, (
                f"segment_mask(ids, causal={causal}) creates a tensor on PyTorch's default device instead of the device "
                f"of segment_ids (with the default device set to meta and ids on the CPU it raised: {mixed}); create "
                f"it with device=segment_ids.device")


_b3_4_hidden_tests()
del _b3_4_hidden_tests
### END HIDDEN TESTS
finish_checks("Bonus 3.4")


# %% nbgrader={"grade": false, "grade_id": "q3_4_segment_mask_tests", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Packing at work: attention over a packed row, with your segment mask, equals attention over each sequence alone.
# (Runs once segment_mask (Bonus 3.4) and einsum_attention (Question 3.1) are written; it never stops the notebook.)
def _packing_demo():
    lengths = [3, 2, 3]
    packed_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None].to(DEVICE)
    print("segment ids:", packed_ids.tolist()[0])
    mask = segment_mask(packed_ids, causal=True)
    print("segment mask, causal (1 = may attend):")
    print(mask[0, 0].int().cpu())
    q, k, v = (torch.randn(1, sum(lengths), 2, 4, device=DEVICE) for _ in range(3))
    packed = einsum_attention(q, k, v, mask=mask)
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    alone = torch.cat([einsum_attention(q[:, s:s + n], k[:, s:s + n], v[:, s:s + n],
                                        mask=causal_mask(n, device=DEVICE)) for s, n in zip(starts, lengths)], dim=1)
    print("packed attention equals attention on each sequence alone:",
          torch.allclose(packed, alone, atol=1e-5))


try:
    with uses_answers("Bonus 3.4", "Question 3.1", "Question 3.3"):
        _packing_demo()
except Exception as exc:  # noqa: BLE001 - a demonstration: a wrong answer is its test cell's to report
    print(f"The packing demonstration stopped: {type(exc).__name__}: {exc} (Bonus 3.4's test cell says what is wrong)")
del _packing_demo

# %% [markdown]
# ### Optional, not graded: permutation equivariance
#
# A short exercise on what attention does without a mask. It carries no points and nothing later in the lab uses
# it: do it if you have time (about 30 minutes), skip it if not. Its self-check cell says whether your code works,
# and never stops the notebook.
#
# **Permutation equivariance.** Attention without a mask treats its input as a *set*: permute the tokens (the
# same permutation for queries, keys and values) and the outputs come out permuted the same way. A function $f$
# with $f(Px) = P f(x)$ for every permutation $P$ is **permutation-equivariant**. This is why Transformers need
# positional encodings, and a causal mask breaks the symmetry because it is tied to positions.
#
# Write `is_permutation_equivariant(attn_fn, q, k, v, perm, atol=1e-5)`: `attn_fn` takes and returns
# `(B, S, H, D)` tensors (as `einsum_attention` does); `perm` is a permutation of `range(S)` (a `LongTensor`).
# Return `True` if permuting the sequence axis of `q`, `k` and `v` by `perm` permutes the output of `attn_fn`
# the same way, up to a maximum absolute difference of `atol`, and `False` otherwise.

# %% nbgrader={"grade": false, "grade_id": "q3_5_permutation_check", "locked": false, "schema_version": 3, "solution": true, "task": false}
def is_permutation_equivariant(attn_fn, q, k, v, perm, atol=1e-5):
    """Check attn_fn(P q, P k, P v) == P attn_fn(q, k, v) along the sequence axis.

    Args:
        attn_fn (Callable): Takes q, k, v of shape (B, S, H, D) and returns (B, S, H, D).
        q (torch.Tensor): Queries, (B, S, H, D).
        k (torch.Tensor): Keys, (B, S, H, D).
        v (torch.Tensor): Values, (B, S, H, D).
        perm (torch.Tensor): Long (S,), a permutation of range(S).
        atol (float): Largest absolute difference still counted as equal.

    Returns:
        bool: True when the outputs agree within atol.
    """
    ### BEGIN SOLUTION
    perm = perm.to(q.device)
    out = attn_fn(q, k, v)
    out_of_permuted = attn_fn(q[:, perm], k[:, perm], v[:, perm])
    return bool((out_of_permuted - out[:, perm]).abs().max().item() <= atol)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q3_5_permutation_check_tests", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Self-check of the optional is_permutation_equivariant (not graded; skipped while the function is not written; it
# prints what failed and never stops the notebook).
def _permutation_self_check():
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 6, 2, 4, generator=gen).to(DEVICE) for _ in range(3))
    perm = torch.tensor([3, 0, 5, 1, 4, 2], device=DEVICE)
    causal = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()

    def attention(q, k, v, mask=None):  # a reference attention, so that this check does not depend on Question 3.1
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)

    cases = [(lambda q, k, v: attention(q, k, v), True, "attention without a mask"),
             (lambda q, k, v: attention(q, k, v, mask=causal), False, "causal attention"),
             (lambda q, k, v: torch.cumsum(v, dim=1), False, "a running sum over the sequence")]
    failed = []
    for fn, expected, name in cases:
        try:
            got = as_truth(is_permutation_equivariant(fn, q, k, v, perm), f"is_permutation_equivariant({name})")
            if got is not expected:
                failed.append(f"{name}: expected {expected}, got {got!r}")
        except Exception as exc:  # noqa: BLE001 - an optional exercise: report, never stop the notebook
            failed.append(f"{name}: raised {type(exc).__name__}: {exc}")
    if failed:
        print(f"Optional: is_permutation_equivariant (not graded): {len(failed)} of {len(cases)} self-checks failed:\n"
              + "\n".join(failed))
        return
    print(f"Optional: is_permutation_equivariant (not graded): all {len(cases)} self-checks passed")
    perm_demo = torch.arange(demo_q.shape[1]).roll(1)  # a fixed permutation that moves every token
    with uses_answers("Question 3.1", "Question 3.3"):
        print("einsum_attention equivariant:",
              is_permutation_equivariant(einsum_attention, demo_q, demo_k, demo_v, perm_demo))
        causal_demo = causal_mask(demo_q.shape[1], device=DEVICE)
        print("causal einsum_attention equivariant:", is_permutation_equivariant(
            lambda q, k, v: einsum_attention(q, k, v, mask=causal_demo), demo_q, demo_k, demo_v, perm_demo))


try:
    is_permutation_equivariant(lambda q, k, v: v, *(torch.zeros(1, 2, 1, 1) for _ in range(3)), torch.tensor([1, 0]))
except NotImplementedError:
    print("is_permutation_equivariant is not written (optional, not graded): self-check skipped")
except Exception as exc:  # noqa: BLE001 - an optional exercise never stops the notebook
    print(f"is_permutation_equivariant raised {type(exc).__name__}: {exc} (optional, not graded): self-check skipped")
else:
    try:
        _permutation_self_check()
    except Exception as exc:  # noqa: BLE001 - a demonstration built on your answers: report, never stop
        print(f"The permutation demonstration stopped: {type(exc).__name__}: {exc}")
del _permutation_self_check

# %% [markdown]
# # Part 4: FlashAttention from first principles
#
# Part 2 showed what a fast attention kernel must do: walk over the keys **tile by tile**, keep each tile of
# scores on chip, and never write the $S \times S$ matrix to HBM. The obstacle is the softmax: the weight of
# key $j$ for query $i$ is $e^{s_{ij} - m_i} / \ell_i$ with the row max $m_i = \max_j s_{ij}$ (subtracted so
# that nothing overflows) and the row sum $\ell_i = \sum_j e^{s_{ij} - m_i}$, and both need the whole row.
#
# ## The online softmax
#
# Process a row in blocks and keep two numbers, the max $m$ of the scores seen so far and the sum
# $\ell = \sum e^{s - m}$ over them. A new block $X$ updates them as
# $$m' = \max\big(m, \max_{x \in X} x\big), \qquad \ell' = \ell\, e^{m - m'} + \sum_{x \in X} e^{x - m'}.$$
# The factor $e^{m - m'}$ **rescales** the old sum to the new max (it is 1 when the max did not change). Start
# from $m = -\infty$, $\ell = 0$. After the last block, the **log-sum-exp** $\mathrm{lse} = \log \sum_j e^{s_j}
# = m + \log \ell$ gives every softmax weight as $e^{s_j - \mathrm{lse}}$.
#
# In attention the same rescaling applies to the running output: $o' = o\,e^{m - m'} + \sum_{x} e^{x - m'} v_x$,
# divided by $\ell$ at the end. That is the whole trick of FlashAttention (Dao et al., 2022; Milakov and
# Gimelshein, 2018 for the online softmax).

# %% [markdown]
# #### Question 4.1.1 (3 points)
#
# Write `online_softmax_update(running_max, running_sum, scores_block)`: one step of the update above, for
# many rows at once. `running_max` and `running_sum` have shape `(...)`, `scores_block` has shape `(..., n)` (a
# block of `n` scores per row); return `(new_max, new_sum)`, both of shape `(...)`. Scores may be $-\infty$
# (masked). A row that has seen only $-\infty$ so far must keep `(-inf, 0)`, not NaN: $-\infty - (-\infty)$
# is NaN, so handle it. Compute in the dtype of the inputs: the tests use float64 inputs and compare with a
# float64 reference, the max exactly and the sum to a relative 1e-9.

# %% nbgrader={"grade": false, "grade_id": "q4_1_1_online_update", "locked": false, "schema_version": 3, "solution": true, "task": false}
def online_softmax_update(running_max, running_sum, scores_block):
    """One step of the online softmax.

    Args:
        running_max (torch.Tensor): (...), max of the scores seen so far (-inf before any).
        running_sum (torch.Tensor): (...), sum of exp(score - running_max) over the scores seen so far.
        scores_block (torch.Tensor): (..., n), the next block of scores of every row (-inf = masked).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: (new_max, new_sum), each (...), with the block included.
    """
    ### BEGIN SOLUTION
    new_max = torch.maximum(running_max, scores_block.amax(dim=-1))
    # A row that has seen only -inf has new_max = -inf: shift by 0 instead, so that no -inf - (-inf) = NaN appears.
    shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)
    new_sum = running_sum * torch.exp(running_max - shift) + torch.exp(scores_block - shift[..., None]).sum(dim=-1)
    return new_max, new_sum
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_1_1_online_update_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _q4_1_1_public_tests():
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0, 4.0, 5.0]], dtype=torch.float64, device=DEVICE)
    start = (torch.full((1,), float("-inf"), dtype=torch.float64, device=DEVICE),
             torch.zeros(1, dtype=torch.float64, device=DEVICE))
    with check("public: [1, 2, 3] from (-inf, 0), then [6, 4, 5]: the old sum is rescaled to the new max", weight=1):
        m, l = as_tuple(online_softmax_update(*start, x[:, :3]), 2, "online_softmax_update(-inf, 0, [1, 2, 3])")
        want = torch.tensor([math.exp(-2) + math.exp(-1) + 1], dtype=torch.float64)
        assert_tensor_close(m, torch.tensor([3.0], dtype=torch.float64), "new_max after the block [1, 2, 3]", rtol=0, atol=0)
        assert_tensor_close(l, want, "new_sum after the block [1, 2, 3] (e^-2 + e^-1 + e^0)", rtol=1e-12, atol=0)
        m, l = as_tuple(online_softmax_update(m.to(DEVICE), l.to(DEVICE), x[:, 3:]), 2,
                        "online_softmax_update(3, e^-2 + e^-1 + 1, [6, 4, 5])")
        want = torch.tensor([sum(math.exp(value - 6.0) for value in [1, 2, 3, 6, 4, 5])], dtype=torch.float64)
        assert_tensor_close(m, torch.tensor([6.0], dtype=torch.float64), "new_max after [1, 2, 3] then [6, 4, 5]",
                            rtol=0, atol=0)
        assert_tensor_close(l, want, "new_sum after [1, 2, 3] then [6, 4, 5] (the OLD sum rescaled by exp(3 - 6) plus "
                                     "the new terms)", rtol=1e-12, atol=0)
    with check("public: a row that has seen only -inf stays (-inf, 0), no NaN", weight=1):
        m, l = as_tuple(online_softmax_update(*start, torch.full((1, 4), float("-inf"), dtype=torch.float64,
                                                                  device=DEVICE)), 2, "online_softmax_update")
        assert_tensor_close(m, torch.tensor([float("-inf")], dtype=torch.float64), "new_max of a row of -inf", rtol=0, atol=0)
        assert_tensor_close(l, torch.zeros(1, dtype=torch.float64), "new_sum of a row of -inf", rtol=0, atol=0)


_q4_1_1_public_tests()
del _q4_1_1_public_tests
# Question 4.1.2 may build on your update: what it makes of Question 4.1.2's scores, kept as graded here
keep_lse_with_your_update(online_softmax_update, [("public", blockwise_lse_public_input(), 2)])
### BEGIN HIDDEN TESTS
def _q4_1_1_hidden_tests():
    gen = torch.Generator().manual_seed(4_1)

    def grade_blocks(x, bounds):
        m = torch.full(x.shape[:-1], float("-inf"), dtype=torch.float64)
        l = torch.zeros(x.shape[:-1], dtype=torch.float64)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            where = f"online_softmax_update after the scores [:{stop}] of a {tuple(x.shape)} float64 tensor"
            m, l = (as_tensor(t, where).cpu() for t in
                    as_tuple(online_softmax_update(m.to(DEVICE), l.to(DEVICE), x[..., start:stop].to(DEVICE)), 2, where))
            seen = x[..., :stop]
            want_m = seen.amax(dim=-1)
            safe = torch.where(torch.isneginf(want_m), torch.zeros_like(want_m), want_m)
            assert_tensor_close(m, want_m, f"{where}: new_max (the max of the scores so far, exactly)", rtol=0, atol=0,
                                dtype=torch.float64)
            assert_tensor_close(l, torch.exp(seen - safe[..., None]).sum(dim=-1),
                                f"{where}: new_sum (sum of exp(score - running max); when the max grows, the old sum "
                                f"is multiplied by exp(old max - new max))", rtol=1e-9, atol=0, dtype=torch.float64)

    with check("a sequence of blocks of widths 6, 1, 6 and 10 with scores up to +-100, from (-inf, 0)", weight=2):
        grade_blocks(torch.randn(3, 4, 23, generator=gen, dtype=torch.float64) * 30, [0, 6, 7, 13, 23])
    with check("masked scores: some -inf, and a row whose first block is all -inf stays (-inf, 0), no NaN", weight=1):
        x = torch.randn(3, 4, 23, generator=gen, dtype=torch.float64) * 30
        x[0, 1, 5:9] = float("-inf")
        x[2, 3, :6] = float("-inf")  # the first block of this row is fully masked
        x[1, 2, :] = float("-inf")  # every block of this row
        grade_blocks(x, [0, 6, 7, 13, 23])
    with check("an arbitrary state in: m' = max(m, max X) and l' = l exp(m - m') + sum exp(X - m')", weight=1):
        m0 = torch.randn(5, generator=gen, dtype=torch.float64) * 3
        l0 = torch.rand(5, generator=gen, dtype=torch.float64) * 4 + 0.5
        block = torch.randn(5, 3, generator=gen, dtype=torch.float64) * 3
        m1, l1 = as_tuple(online_softmax_update(m0.to(DEVICE), l0.to(DEVICE), block.to(DEVICE)), 2, "online_softmax_update")
        want_m = torch.maximum(m0, block.amax(-1))
        assert_tensor_close(m1, want_m, "online_softmax_update(m, l, X)'s new_max = max(m, max X)", rtol=0, atol=0)
        assert_tensor_close(l1, l0 * torch.exp(m0 - want_m) + torch.exp(block - want_m[:, None]).sum(-1),
                            "online_softmax_update(m, l, X)'s new_sum = l exp(m - m') + sum exp(X - m')", rtol=1e-9, atol=0)


_q4_1_1_hidden_tests()
del _q4_1_1_hidden_tests
keep_lse_with_your_update(online_softmax_update, blockwise_lse_inputs(torch.Generator().manual_seed(4_11)))
### END HIDDEN TESTS
finish_checks("Question 4.1.1")


# %% [markdown]
# ### Checking how a function computes
#
# Some questions prescribe *how* to compute, not only what: block by block, one tile at a time. How can a test
# check that? Every PyTorch operation goes through PyTorch's *dispatcher*; a `TorchDispatchMode` sees each
# operation, the tensors it reads and the tensors it creates. The probe below records, inside a `with` block, the
# largest tensor an operation creates and the largest one an operation reads (views such as slices and
# transposes share memory and count as neither; allocations such as `new_zeros` or `empty_like` read no values),
# and how many operations ran. `run_with_probe(fn, *args, **kwargs)` calls `fn` inside a new probe and returns
# `(fn's result, probe)`; the tests of Questions 4.1.2, 4.2 and Bonus 4.4 use it.
# `run_with_probe_watching(x, fn, *args)` also records which elements of the tensor `x` each operation reads, and
# so whether `fn` made one pass over `x` (Question 4.1.2) and whether it read all of `x` (Questions 4.2 and 4.4). Use it yourself to see what your
# code allocates. (It refuses to measure when the probe was changed or switched off during the call: such a
# measurement could not be trusted.)

# %% nbgrader={"grade": false, "grade_id": "memory_probe", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["test-helpers"]
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LargestTensorProbe(TorchDispatchMode):
    """Record what PyTorch operations create and read inside a `with LargestTensorProbe() as probe:`.

    Attributes:
        largest_numel (int): Element count of the largest tensor an operation created (views excluded).
        largest_op (str | None): The operation that created it, and its shape.
        largest_input_numel (int): Element count of the largest tensor an operation read (views excluded, and
            allocations that read only their input's dtype and device: `new_zeros`, `empty_like`, ...).
        largest_input_op (str | None): That operation, and the shape of the input.
        num_ops (int): Number of operations seen, views excluded.
        op_names (set[str]): Names of all operations seen (e.g. "aten::bmm").
        watched_reads (int): With `watched` (a tensor) given: how many operations read elements of it.
        most_open_elements (int): With `watched`: the largest number of its elements that, at one operation, had
            been read before and were read again later (a single pass over `watched`, block by block, keeps this to
            the block being worked on; a second pass over it makes it every element).
        most_open_op (str | None): The operation where that happened.
        watched_elements_read (int): With `watched`: how many of its elements some operation read.
    """

    VALUE_FREE_OPS = frozenset({"aten::new_empty", "aten::new_empty_strided", "aten::new_zeros", "aten::new_ones",
                                "aten::new_full", "aten::empty_like", "aten::zeros_like", "aten::ones_like",
                                "aten::full_like"})

    def __init__(self, watched=None):
        super().__init__()
        self.largest_numel, self.largest_op = 0, None
        self.largest_input_numel, self.largest_input_op = 0, None
        self.num_ops, self.op_names = 0, set()
        self.watched, self._reads = watched, []  # (operation index, description, storage indices it read)

    @property
    def watched_reads(self):
        return len(self._reads)

    def _open_elements(self):
        """(most elements of `watched` read before and again after one operation, that operation)."""
        if not self._reads:
            return 0, None
        size = max(int(indices.max()) for _, _, indices in self._reads) + 1
        first = torch.full((size,), len(self._reads) + self.num_ops + 1, dtype=torch.long)
        last = torch.full((size,), -1, dtype=torch.long)
        for index, _, indices in self._reads:
            first[indices] = torch.minimum(first[indices], torch.tensor(index))
            last[indices] = torch.maximum(last[indices], torch.tensor(index))
        most, where = 0, None
        for index, description, _ in self._reads:
            open_now = int(((first <= index) & (last >= index)).sum())
            if open_now > most:
                most, where = open_now, description
        return most, where

    def summary(self):
        """What the probe saw, as plain data: a dict of the attributes above."""
        seen = {name: getattr(self, name) for name in ("largest_numel", "largest_op", "largest_input_numel",
                                                       "largest_input_op", "num_ops", "op_names", "watched_reads")}
        seen["most_open_elements"], seen["most_open_op"] = self._open_elements()
        seen["watched_elements_read"] = (int(torch.cat([indices for _, _, indices in self._reads]).unique().numel())
                                         if self._reads else 0)
        return seen

    def _record_reads(self, name, args, kwargs):
        """Which elements of `watched` (as indices into its storage) the operation `name` read."""
        storage = self.watched.untyped_storage()
        for tensor in tree_leaves((args, kwargs)):
            if (torch.is_tensor(tensor) and tensor.numel() and tensor.device == self.watched.device
                    and tensor.untyped_storage().data_ptr() == storage.data_ptr()):
                numel = storage.nbytes() // tensor.element_size()
                indices = torch.arange(numel).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
                self._reads.append((self.num_ops, f"{name} read {tuple(tensor.shape)} of it",
                                    indices.reshape(-1).clone()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name()
        self.op_names.add(name)
        if func.is_view:  # views share their input's memory
            return out
        self.num_ops += 1
        if self.watched is not None and name.split(".")[0] not in self.VALUE_FREE_OPS:
            self._record_reads(name, args, kwargs)
        for tensor in tree_leaves(out):
            if torch.is_tensor(tensor) and tensor.numel() > self.largest_numel:
                self.largest_numel, self.largest_op = tensor.numel(), f"{name} -> {tuple(tensor.shape)}"
        if name.split(".")[0] not in self.VALUE_FREE_OPS:
            for tensor in tree_leaves((args, kwargs)):
                if torch.is_tensor(tensor) and tensor.numel() > self.largest_input_numel:
                    self.largest_input_numel, self.largest_input_op = tensor.numel(), f"{name} <- {tuple(tensor.shape)}"
        return out


def _make_run_with_probe(probe_class):
    """Build `run_with_probe` around `probe_class` as it is now: a class later bound to the same name, or a
    change to its methods or to TorchDispatchMode's, is detected instead of trusted."""
    watched = [(probe_class, dict(vars(probe_class))),
               (TorchDispatchMode, {name: vars(TorchDispatchMode)[name] for name in ("__enter__", "__exit__")})]

    def run_with_probe(fn, *args, **kwargs):
        """Call fn(*args, **kwargs) inside a new LargestTensorProbe.

        Args:
            fn (Callable): The function to observe.
            *args: Positional arguments for fn.
            **kwargs: Keyword arguments for fn.

        Returns:
            tuple: (fn's result, the probe); probe.num_ops counts fn's operations only.

        Raises:
            AssertionError: The probe cannot be trusted: its class or TorchDispatchMode was changed, or the probe
                did not see operations before and after fn ran (fn switched it off).
        """
        return run_watching(None, fn, *args, **kwargs)

    def run_watching(tensor, fn, *args, **kwargs):
        """run_with_probe, the probe also recording which elements of `tensor` each operation reads."""
        for owner, attributes in watched:
            changed = sorted(name for name, value in attributes.items() if vars(owner).get(name) is not value)
            changed += sorted(set(vars(owner)) - set(attributes)) if owner is probe_class else []
            assert not changed, (f"{owner.__name__} was changed ({', '.join(changed)}): the memory probe cannot be "
                                 f"trusted, so this test cannot pass")
        with probe_class(tensor) as probe:
            torch.zeros(1)  # a sentinel operation the probe must see before fn runs...
            seen_before = probe.num_ops
            result = fn(*args, **kwargs)
            seen_by_fn = probe.num_ops - seen_before
            torch.zeros(1)  # ...and after it returns
            alive = seen_before == 1 and probe.num_ops == seen_before + seen_by_fn + 1
        assert alive, ("the memory probe stopped seeing PyTorch operations while the function ran (a dispatch mode "
                       "was switched off or removed): its memory use cannot be measured, so this test cannot pass")
        probe.num_ops = seen_by_fn
        return result, probe

    return run_with_probe, run_watching


run_with_probe, run_with_probe_watching = _make_run_with_probe(LargestTensorProbe)

# %% [markdown]
# #### Question 4.1.2 (3 points)
#
# Write `blockwise_logsumexp(x, block_size)`: the log-sum-exp of `x` over its last dimension, computed block by
# block with the online update in **one pass** over `x` (blocks of `block_size` along the last dimension; the last
# block may be shorter). Call your `online_softmax_update` or write the update inline. Return $-\infty$ for a row of
# $-\infty$, like `torch.logsumexp`. What the tests check:
# - **stability**: scores lie far outside the range where `exp` is finite (it overflows above about 709 in
#   float64 and 88.7 in float32, and underflows to 0 below about -745 and -104): the tests use scores in the
#   thousands, of either sign;
# - **block by block**: no operation may read or create more than two blocks' worth of every row, i.e. more
#   than `2 * x[..., :block_size].numel()` elements (views such as slices do not count). The tests run your
#   function with `run_with_probe` (above) at small block sizes, so `torch.logsumexp(x, -1)` or `x.amax(-1)` on
#   whole rows, or a padded copy of `x`, fail. This is the method the question asks for: an answer that is not
#   block by block earns at most a quarter of the points, however right its values;
# - **one pass**: each block is read when its turn comes and never again once the function has moved on to the next
#   block (that is what makes the update *online*). The tests run your function with `run_with_probe_watching`,
#   which records which elements of `x` each operation reads: a first pass over the blocks for the max and a second
#   one for the sum fails;
# - **precision**: compute in the dtype of `x`; the result must match `torch.logsumexp` in float64 to a relative
#   1e-9 for float64 inputs and 1e-5 for float32 inputs (relative to `max(1, |lse|)`).

# %% nbgrader={"grade": false, "grade_id": "q4_1_2_blockwise_lse", "locked": false, "schema_version": 3, "solution": true, "task": false}
def blockwise_logsumexp(x, block_size):
    """log(sum(exp(x))) over the last dimension, computed block by block with the online softmax update.

    Args:
        x (torch.Tensor): (..., n) scores (may contain -inf).
        block_size (int): Block length along the last dimension (the last block may be shorter).

    Returns:
        torch.Tensor: (...), the log-sum-exp of every row (-inf for a row of -inf).
    """
    ### BEGIN SOLUTION
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        new_max = torch.maximum(running_max, block.amax(dim=-1))
        shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)  # rows of -inf so far
        running_sum = running_sum * torch.exp(running_max - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        running_max = new_max
    return running_max + torch.log(running_sum)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_1_2_blockwise_lse_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
def _q4_1_2_public_tests():
    x = blockwise_lse_public_input()
    with check("public: blockwise_logsumexp(x, 2) equals torch.logsumexp(x, -1) for x (2, 5) in float64", weight=2):
        got = blockwise_logsumexp(x.to(DEVICE), 2)
        assert_or_carried(lambda want: assert_tensor_close(got, want, "blockwise_logsumexp(x (2, 5), 2)", rtol=1e-9,
                                                           atol=0, dtype=torch.float64),
                          torch.logsumexp(x, dim=-1), carried(your_kept_answer, "lse_with_your_update", "public", 2),
                          carried_from="online_softmax_update (Question 4.1.1) as it was graded")


_q4_1_2_public_tests()
del _q4_1_2_public_tests
### BEGIN HIDDEN TESTS
def _q4_1_2_hidden_tests():
    gen = torch.Generator().manual_seed(4_11)

    @kernel_side
    def probed(fn, x, *args):
        """fn(x, *args) in the kernel inside run_with_probe, watching the reads of x: (fn's result, what the probe saw,
        as a dict)."""
        result, probe = run_with_probe_watching(x, fn, x, *args)
        return result, probe.summary()

    def grade_value(name, x, block, tol):
        largest = x[torch.isfinite(x)].abs().max().item()
        where = (f"blockwise_logsumexp(x {tuple(x.shape)} {x.dtype} with |scores| up to {largest:.0f}, block_size={block}) "
                 f"(torch.logsumexp(x, -1) over all {x.shape[-1]} scores, the last block may be shorter; relative to "
                 f"max(1, |lse|))")
        got = as_tensor(blockwise_logsumexp(x.to(DEVICE), block), where)
        assert got.dtype == x.dtype and tuple(got.shape) == tuple(x.shape[:-1]), (
            f"{where} must return shape {tuple(x.shape[:-1])} and dtype {x.dtype}, got {tuple(got.shape)}, {got.dtype}")
        want = torch.logsumexp(x.double(), dim=-1)  # float64, and stable
        scale = want.abs().clamp_min(1.0)  # errors relative to max(1, |lse|)
        scale[torch.isinf(want)] = 1.0
        other = carried(your_kept_answer, "lse_with_your_update", name, block)  # calling your update, as graded
        def compare(expected):
            return assert_tensor_close(got.cpu().double() / scale, expected, where, rtol=0, atol=tol)

        assert_or_carried(compare, want / scale, None if other is None else other / scale,
                          carried_from="your online_softmax_update of Question 4.1.1, as it was graded")

    def run_probe(x, block):
        rows = x[..., 0].numel()
        limit = 2 * rows * min(block, x.shape[-1])
        where = f"blockwise_logsumexp(x {tuple(x.shape)} {x.dtype}, block_size={block})"
        _, seen = probed(blockwise_logsumexp, x.to(DEVICE), block)
        blocks = -(-x.shape[-1] // block)
        # Honest code either runs an operation per block or reads or creates a tensor over the limit (then the checks
        # below fail on their own); neither means the probe was bypassed: that costs the whole question.
        assert seen["num_ops"] >= blocks or max(seen["largest_numel"], seen["largest_input_numel"]) > limit, (
            f"{where}: the probe saw {seen['num_ops']} PyTorch operations for {blocks} blocks and no tensor over the "
            f"limit: the work ran where the probe cannot see it (its dispatch mode switched off, or outside PyTorch), "
            f"so how it was computed cannot be checked and this question cannot be graded")
        return x, block, rows, limit, where, seen

    def grade_probe(probe_run, rule):
        x, block, rows, limit, where, seen = probe_run
        if rule == "memory":
            blocks = -(-x.shape[-1] // block)
            assert seen["num_ops"] >= blocks, (
                f"{where}: the probe saw {seen['num_ops']} PyTorch operations for {blocks} blocks; compute every block "
                f"with PyTorch operations")
            worst_numel, worst_op = max((seen["largest_input_numel"], seen["largest_input_op"]),
                                        (seen["largest_numel"], seen["largest_op"]))
            assert worst_numel <= limit, (
                f"{where} must work block by block: no operation may read or create more than 2 x {rows} rows x "
                f"{block} = {limit} elements, but {worst_op} has {worst_numel}")
        else:
            assert seen["watched_reads"] > 0, f"{where}: the probe saw no PyTorch operation read x"
            assert seen["most_open_elements"] <= limit, (
                f"{where} must make one pass over x: once it has moved on from a block, it may not read that block "
                f"again (a first pass for the max and a second for the sum is two passes). At one point "
                f"{seen['most_open_elements']} elements of x had been read and were still to be read again (at most "
                f"{limit}, two blocks of every row); {seen['most_open_op']}")

    cases = blockwise_lse_inputs(gen)  # Question 4.1.1's test kept what your update makes of the same inputs

    def grade_values(kind):
        for name, x, block in cases:
            if name in kind:
                grade_value(name, x, block, 1e-5 if x.dtype == torch.float32 else 1e-9)

    with check("float64 scores of moderate size, block sizes that do and do not divide the row (1 to 100)", weight=4):
        grade_values(("moderate",))
    with check("stability: scores in the thousands of either sign (float64), and beyond float32's exp range", weight=1):
        grade_values(("large", "float32"))
    with check("-inf scores: a row of -inf gives -inf, masked scores count as 0", weight=1):
        grade_values(("masked",))
    x = cases[0][1]
    probe_runs = [run_probe(x, 3), run_probe(x, 8), run_probe(torch.randn(4, 10, generator=gen) * 60, 4)]
    # The method, which gates this question: block by block (no whole row read or created at once).
    with check("block by block: no operation reads or creates more than two blocks' worth of every row", weight=2,
               method=True):
        for probe_run in probe_runs:
            grade_probe(probe_run, "memory")
    with check("one pass: each block is read once and not again after the next one (online, not two passes)", weight=1):
        for probe_run in probe_runs:
            grade_probe(probe_run, "one pass")


_q4_1_2_hidden_tests()
del _q4_1_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 4.1.2")


# %%
scores_demo = torch.randn(3, 10) * 5
with uses_answers("Question 4.1.2"):
    lse_demo = blockwise_logsumexp(scores_demo, block_size=4)
    print("softmax from the blockwise log-sum-exp equals torch.softmax:",
          torch.allclose(torch.exp(scores_demo - lse_demo[:, None]), torch.softmax(scores_demo, dim=-1), atol=1e-6))

# %% [markdown]
# ## Tiled attention
#
# ![FlashAttention's tiling: Q, K and V blocks stream through on-chip memory; S and P never reach HBM](assets/flash_attn_tiling.png)
#
# For each tile of `block_q` queries: start with $m = -\infty$, $\ell = 0$, $o = 0$; for each tile of `block_k`
# keys and values, compute the `block_q x block_k` scores, update $m$ and $\ell$, rescale $o$ and add the tile's
# weights times the values; finally divide $o$ by $\ell$ and keep $\mathrm{lse} = m + \log \ell$ per query.
# The log-sum-exp is what the backward pass needs to rebuild any tile of the softmax without a second pass
# (Bonus 4.4); FlashAttention returns it too.
#
# The tests of Question 4.2 check the memory rule with `run_with_probe` (before Question 4.1.2); the cell below
# shows what `einsum_attention` creates.

# %%
probe_q = torch.randn(1, at_scale(teaching=1024, quick=256, cpu=1024), 2, 16, device=DEVICE)
with uses_answers("Question 3.1"):
    with LargestTensorProbe() as probe:
        einsum_attention(probe_q, probe_q, probe_q)
    print(f"einsum_attention, S={probe_q.shape[1]}: largest tensor {probe.largest_numel:,} elements "
          f"({probe.largest_op})")

# %% [markdown]
# #### Question 4.2 (10 points)
#
# Write `tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64)` in PyTorch:
# - `q` of shape `(B, S_q, H, D)`, `k` and `v` of shape `(B, S_kv, H, D)` (the layout of Part 3); sequence
#   lengths need not be multiples of the block sizes;
# - `causal`: query `i` sees keys `j <= i` (positions counted from 0 for both, as `causal_mask`; tests use
#   `S_q == S_kv` with `causal=True`);
# - return `(out, lse)`: `out` of shape `(B, S_q, H, D)` in the dtype of `q`, equal to attention; `lse` of shape
#   `(B, H, S_q)`, the natural log of $\sum_j \exp(q_i \cdot k_j / \sqrt{D})$ over the visible keys;
# - compute in at least float32 (float64 inputs: float64): the tests compare with a float64 reference to 1e-9
#   for float64 inputs and 2e-5 for float32 inputs (max absolute difference; ten times that for `lse`);
# - **memory**: hold at most one `block_q x block_k` tile of scores per (batch, head) at a time: loop over query
#   tiles and, inside, over key tiles, with the online softmax. The tests run your function with
#   `run_with_probe` and fail it if it creates any tensor with more than twice the elements of `q` or of
#   `B x H x block_q x block_k`, whichever is larger (exactly twice passes; so no `S x S` matrix, no full row of
#   scores, no `S x S` mask), if the probe sees fewer PyTorch operations than there are (query tile, key tile)
#   pairs with a visible key or no operation reading every key, or if it calls `scaled_dot_product_attention`.
#   Tiling is the method this question asks for: an answer that breaks this rule earns at most a quarter of the
#   points, however right its values.
#
# `einsum` on tiles is fine. Python loops over tiles are slow but clear: Question 4.3 makes them fast.

# %% nbgrader={"grade": false, "grade_id": "q4_2_tiled_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    """Attention forward pass over tiles with the online softmax; never stores an S x S matrix.

    Args:
        q (torch.Tensor): Queries, (B, S_q, H, D).
        k (torch.Tensor): Keys, (B, S_kv, H, D).
        v (torch.Tensor): Values, (B, S_kv, H, D).
        causal (bool): Query i sees keys j <= i.
        block_q (int): Queries per tile.
        block_k (int): Keys per tile.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: out (B, S_q, H, D) in q's dtype, and lse (B, H, S_q) in float32
        (float64 for float64 inputs): log of the sum over visible keys of exp(q_i . k_j / sqrt(D)).
    """
    ### BEGIN SOLUTION
    batch, seq_q, heads, head_dim = q.shape
    seq_kv = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim)
    compute_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_q, dtype=compute_dtype, device=q.device)
    for q_start in range(0, seq_q, block_q):
        q_end = min(q_start + block_q, seq_q)
        q_tile = q[:, q_start:q_end].to(compute_dtype) * scale  # (B, bq, H, D)
        row_max = torch.full((batch, heads, q_end - q_start), float("-inf"), dtype=compute_dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros(batch, heads, q_end - q_start, head_dim, dtype=compute_dtype, device=q.device)
        kv_stop = min(seq_kv, q_end) if causal else seq_kv  # causal: later keys are masked for the whole tile
        for k_start in range(0, kv_stop, block_k):
            k_end = min(k_start + block_k, seq_kv)
            scores = torch.einsum("bshd,bthd->bhst", q_tile, k[:, k_start:k_end].to(compute_dtype))
            if causal:
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1))  # finite: key 0 is in the first tile
            probs = torch.exp(scores - new_max[..., None])
            rescale = torch.exp(row_max - new_max)  # 0 for the first tile, 1 when the max did not change
            row_sum = row_sum * rescale + probs.sum(dim=-1)
            acc = acc * rescale[..., None] + torch.einsum("bhst,bthd->bhsd", probs, v[:, k_start:k_end].to(compute_dtype))
            row_max = new_max
        out[:, q_start:q_end] = (acc / row_sum[..., None]).transpose(1, 2).to(q.dtype)
        lse[:, :, q_start:q_end] = row_max + torch.log(row_sum)
    return out, lse
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_2_tiled_forward_tests", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _run_with_probe(fn, *args, **kwargs):
    """run_with_probe in the kernel, next to the student's code: (fn's result, what the probe saw, as a dict)."""
    result, probe = run_with_probe(fn, *args, **kwargs)
    return result, probe.summary()


@kernel_side
def _run_with_probe_watching_keys(fn, q, k, v, **kwargs):
    """fn(q, k, v, **kwargs) in the kernel inside run_with_probe_watching(k, ...): (fn's result, what the probe saw,
    as a dict, with which elements of k were read)."""
    result, probe = run_with_probe_watching(k, fn, q, k, v, **kwargs)
    return result, probe.summary()


def _q4_2_public_tests():
    gen = torch.Generator().manual_seed(42)
    q, k, v = (torch.randn(2, 70, 3, 16, generator=gen) for _ in range(3))
    with check("public: out and lse for q, k, v (2, 70, 3, 16) in float32, tiles 32 x 16, causal off and on", weight=1):
        for causal in (False, True):
            result = tiled_attention_forward(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), causal=causal, block_q=32,
                                             block_k=16)
            out, lse = as_tuple(result, 2, f"tiled_attention_forward(causal={causal})")
            q64, k64, v64 = (t.double().transpose(1, 2) for t in (q, k, v))
            want = F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal).transpose(1, 2)
            assert_tensor_close(out, want, f"tiled_attention_forward(causal={causal})'s out (attention, as "
                                           f"F.scaled_dot_product_attention computes it)", rtol=0, atol=2e-5,
                                dtype=torch.float32)
            scores = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) / math.sqrt(16)
            if causal:
                scores = scores.masked_fill(~torch.ones(70, 70, dtype=torch.bool).tril(), float("-inf"))
            assert_tensor_close(lse, torch.logsumexp(scores, dim=-1), f"tiled_attention_forward(causal={causal})'s lse "
                                "(the log-sum-exp of the scaled scores over the visible keys)", rtol=0, atol=2e-4)
    with check("public: memory: q (1, 128, 2, 4) with 32 x 32 tiles holds at most one tile of scores", weight=1,
               method=True):
        q = torch.randn(1, 128, 2, 4, generator=gen).to(device=DEVICE)
        _, probe = _run_with_probe(tiled_attention_forward, q, q, q, causal=False, block_q=32, block_k=32)
        limit = 2 * max(q.numel(), 1 * 2 * 32 * 32)
        assert limit >= probe["largest_numel"], (
            f"tiled_attention_forward must never hold more than one block_q x block_k tile of scores per (batch, "
            f"head): for q (1, 128, 2, 4) with 32 x 32 tiles the largest tensor may have at most {limit:,} elements, "
            f"but it created one of {probe['largest_numel']:,} ({probe['largest_op']}). Loop over query tiles and, "
            f"inside, key tiles.")


_q4_2_public_tests()
del _q4_2_public_tests
### BEGIN HIDDEN TESTS
def _q4_2_hidden_tests():
    gen = torch.Generator().manual_seed(4_2)

    def reference(q, k, v, causal):
        q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        if causal:
            visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v), torch.logsumexp(scores, dim=-1)

    lse_cases = []

    def grade_case(b, s_q, s_kv, h, d, causal, block_q, block_k, dtype, scale=1.0):
        q = torch.randn(b, s_q, h, d, generator=gen, dtype=torch.float64) * scale
        k = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64) * scale
        v = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64)
        want_out, want_lse = reference(q, k, v, causal)
        where = (f"q {(b, s_q, h, d)}, k/v {(b, s_kv, h, d)}, causal={causal}, block_q={block_q}, "
                 f"block_k={block_k}, {dtype}")
        result = tiled_attention_forward(q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype),
                                         causal=causal, block_q=block_q, block_k=block_k)
        out, lse = as_tuple(result, 2, f"tiled_attention_forward for {where}")
        tol = 1e-9 if dtype == torch.float64 else 2e-5
        lse_cases.append((lse, want_lse, where, 10 * tol))
        assert_tensor_close(out, want_out, f"tiled_attention_forward's out for {where} (attention; rescale the running "
                                           f"sum AND the running output when the max grows)", rtol=0, atol=tol, dtype=dtype)

    with check("out: self- and cross-attention, float64 and float32, sequence lengths not multiples of the tiles",
               weight=4):
        grade_case(1, 77, 77, 2, 8, False, 16, 32, torch.float64)
        grade_case(2, 50, 90, 2, 5, False, 24, 20, torch.float64)  # cross-attention
        grade_case(1, 40, 40, 1, 6, False, 64, 64, torch.float64, scale=4.0)  # one tile, large scores
        grade_case(2, 40, 40, 2, 16, False, 16, 16, torch.float32)
    with check("out with causal=True (query i sees keys j <= i), several tile shapes", weight=1):
        grade_case(2, 77, 77, 3, 8, True, 16, 32, torch.float64)
        grade_case(1, 64, 64, 1, 16, True, 32, 16, torch.float64, scale=4.0)  # large scores: the max matters
        grade_case(1, 33, 33, 2, 7, True, 64, 64, torch.float64)  # one tile
        grade_case(1, 45, 45, 1, 12, True, 8, 8, torch.float64)
    with check("lse: log of the sum over visible keys of exp(q_i . k_j / sqrt(D)), shape (B, H, S_q)", weight=1):
        assert lse_cases, "no case returned an lse"
        for lse, want_lse, where, tol in lse_cases:
            assert_tensor_close(lse, want_lse, f"tiled_attention_forward's lse for {where} (running max + log(running "
                                               f"sum))", rtol=0, atol=tol)

    probes = []
    for causal, block_q, block_k in [(True, 32, 32), (False, 16, 64)]:
        q, k, v = (torch.randn(1, 128, 2, 4, generator=gen).to(DEVICE) for _ in range(3))
        _, probe = _run_with_probe_watching_keys(tiled_attention_forward, q, k, v, causal=causal, block_q=block_q,
                                                 block_k=block_k)
        probes.append((causal, block_q, block_k, probe))
        pairs = sum(1 for i in range(0, 128, block_q) for j in range(0, 128, block_k) if not causal or j < i + block_q)
        # Honest code either runs an operation per tile pair or creates a tensor over the limit (then the checks below
        # fail on their own); neither means the probe was bypassed: that costs the whole question.
        assert probe["num_ops"] >= pairs or probe["largest_numel"] > 2 * max(128 * 2 * 4, 2 * block_q * block_k), (
            f"tiled_attention_forward(causal={causal}, block_q={block_q}, block_k={block_k}) on q (1, 128, 2, 4): "
            f"the probe saw {probe['num_ops']} PyTorch operations for {pairs} (query tile, key tile) pairs and no tensor "
            f"over the limit: the work ran where the probe cannot see it (its dispatch mode switched off, or outside "
            f"PyTorch), so how it was computed cannot be checked and this question cannot be graded")
    # The method, which gates this question: tiles (no S x S matrix, row or mask), each computed with PyTorch.
    with check("memory: at most one tile of scores per (batch, head) at a time (no S x S matrix, row or mask)", weight=2,
               method=True):
        for causal, block_q, block_k, probe in probes:
            limit = 2 * max(128 * 2 * 4, 2 * block_q * block_k)
            assert probe["largest_numel"] <= limit, (
                f"tiled_attention_forward(causal={causal}, block_q={block_q}, block_k={block_k}) on q (1, 128, 2, 4) "
                f"must hold at most one tile of scores per (batch, head): it created a tensor of "
                f"{probe['largest_numel']:,} elements ({probe['largest_op']}); the limit is {limit:,}")
    with check("tile by tile: the tiles are computed with PyTorch operations that read every key, not "
               "scaled_dot_product_attention", weight=1, method=True):
        for causal, block_q, block_k, probe in probes:
            pairs = sum(1 for i in range(0, 128, block_q) for j in range(0, 128, block_k) if not causal or j < i + block_q)
            assert not any("scaled_dot_product" in name for name in probe["op_names"]), (
                "tiled_attention_forward must not call scaled_dot_product_attention")
            assert probe["num_ops"] >= pairs, (
                f"tiled_attention_forward(causal={causal}, block_q={block_q}, block_k={block_k}) on q (1, 128, 2, 4): "
                f"the probe saw {probe['num_ops']} PyTorch operations for {pairs} (query tile, key tile) pairs; "
                f"compute every tile with PyTorch operations")
            assert probe["watched_elements_read"] == 128 * 2 * 4, (
                f"tiled_attention_forward(causal={causal}, block_q={block_q}, block_k={block_k}) on q, k, v (1, 128, 2, 4): "
                f"PyTorch operations read {probe['watched_elements_read']} of the {128 * 2 * 4} elements of k; every key "
                f"takes part in attention")


_q4_2_hidden_tests()
del _q4_2_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 4.2")


# %%
with uses_answers("Question 4.2", "Question 3.1"):
    with LargestTensorProbe() as probe:
        tiled_out, tiled_lse = tiled_attention_forward(probe_q, probe_q, probe_q)
    print(f"tiled_attention_forward, S={probe_q.shape[1]}: largest tensor {probe.largest_numel:,} elements "
          f"({probe.largest_op})")
    print("max |tiled - einsum|:", (tiled_out - einsum_attention(probe_q, probe_q, probe_q)).abs().max().item())

# %% [markdown]
# ## FlashAttention in Triton
#
# Triton writes GPU kernels in Python at the level of **blocks**: you program one
# *program instance*, which handles a block of data, and launch a grid of them. Inside a kernel:
# - `tl.program_id(axis)` says which instance this is; `tl.arange(0, BLOCK)` is a vector of offsets (`BLOCK` a
#   power of two, a compile-time `tl.constexpr`);
# - tensors arrive as pointers; the address of element `[i, j]` is `ptr + i * stride_0 + j * stride_1`, and a
#   block of addresses built by broadcasting (`offs_m[:, None] * stride_s + offs_d[None, :] * stride_d`) loads a
#   whole tile with `tl.load(ptrs, mask=..., other=0.0)` (the mask skips addresses past the end);
# - `tl.dot(a, b)` multiplies two tiles (on tensor cores: tile sides of at least 16), `tl.max`, `tl.sum`,
#   `tl.exp`, `tl.log`, `tl.where`, `tl.maximum` work on tiles, and `tl.store(ptrs, values, mask=...)` writes.
#
# Our kernel: one program per (tile of `BLOCK_M` queries, batch x head). It loads its query tile once, loops over
# key/value tiles of `BLOCK_N` with the online softmax in registers (`m_i`, `l_i`, `acc`), and writes `O` and
# `lse` once. So the kernel reads Q once and writes O once, but **reads K and V once per query tile**: each of
# the $\lceil S_q / \texttt{BLOCK\_M} \rceil$ programs of a (batch, head) loads all of K and V, since programs
# share no on-chip memory. The $S \times S$ scores never reach HBM, which is what matters: for long sequences
# those loads are about $2 S^2 D / \texttt{BLOCK\_M}$ numbers per (batch, head) instead of a multiple of
# $S^2$, so larger query tiles mean fewer loads, up to what fits in registers and shared memory. If every load
# came from HBM, the kernel's intensity would be about `BLOCK_M` FLOP/byte in bf16 ($4 S^2 D$ FLOPs over
# $2 S^2 D / \texttt{BLOCK\_M}$ numbers of 2 bytes), 64 with the launcher's `BLOCK_M = 64`, whatever $S$:
# below an H200's ridge point (about 206). That count is the most HBM can see. Between the SMs and HBM sits the
# L2 cache (60 MB on an H200, 50 MB on an H100), and the launcher's grid puts the query tiles of one (batch, head)
# side by side (grid axis 0, which varies fastest), so the programs running at one time mostly belong to one head
# and load the same K and V tiles at about the same time: all but the first load of a tile can come from L2 (K and
# V of one head at $S$ = 16384, $D$ = 64 in bf16 are 4 MB, which fits). With that reuse HBM sees little more than
# Q, K and V read once and O written once: the ideal of Question 3.2, $S/2$ FLOP/byte. Part 5 places your kernel
# at both intensities, and its measured speed says which is closer. The head dimension is padded to `BLOCK_D`, a
# power of two of at least 16, with masked loads (padded entries are 0 and change nothing).
#
# The launcher `launch_flash_attention_forward` and the wrapper `triton_attention_forward` are given, in the
# locked cell after yours: the launcher computes the grid and passes the strides of every tensor (so inputs and
# outputs of any layout work), the wrapper allocates the outputs. **Write the kernel body.** Without CUDA, the
# kernel runs in Triton's interpreter (set up in the first cell), on CPU tensors: same code, same results,
# slower.

# %% [markdown]
# #### Question 4.3 (10 points)
#
# Write the body of `_flash_attention_forward_kernel` so that `triton_attention_forward(q, k, v, causal=False)`
# returns `(out, lse)` with the same contract as `tiled_attention_forward` (out in the dtype of `q`, lse in
# float32). Accumulate in float32 (`tl.zeros(..., dtype=tl.float32)`). The tests launch your kernel through
# `launch_flash_attention_forward` into output buffers they fill with NaN, with block sizes from 16 to 64, on
# shapes whose sequence lengths are not multiples of the block sizes, with `causal` on and off, several heads,
# and inputs and outputs in other layouts than contiguous `(B, S, H, D)` (transposed views, padded rows): use
# every stride the kernel receives. They compare with a float64 reference with a tolerance of 2e-2 (on a GPU,
# `tl.dot` on float32 tiles uses TF32, which rounds inputs to 10 bits of mantissa).
#
# **The method.** Loop over the key/value tiles (`BLOCK_N` keys at a time) with the online softmax, and multiply
# tiles with `tl.dot` inside that loop: that is FlashAttention, and what this question asks for. The tests read your
# kernel's source for a loop that calls `tl.dot`; a kernel without one (all keys of a row loaded at once, a plain
# softmax) earns at most a quarter of the points, however right its values.
#
# **What the grader's Triton supports.** The autograder runs your kernel on a CPU in Triton's interpreter
# (`TRITON_INTERPRET=1`, Triton 3.9), which does not implement everything a GPU compiles. Use these, which it runs
# and the tests grade: `tl.program_id`, `tl.arange`, pointer arithmetic with the strides and
# `tl.load(ptrs, mask=..., other=...)` / `tl.store(ptrs, values, mask=...)`, `tl.dot` (also with `acc=`), `tl.trans`
# (or `.T`), `tl.zeros`, `tl.full`, `tl.where`, `tl.max`, `tl.sum`, `tl.maximum`, `tl.minimum`, `tl.exp`, `tl.exp2`,
# `tl.log`, `tl.log2`, `.to(dtype)`, and Python loops (`for ... in range(...)`, `tl.range`, `tl.static_range`) and
# `if` on a `tl.constexpr`. Do **not** use block pointers (`tl.make_block_ptr`, `tl.advance`), which some versions
# of Triton's FlashAttention tutorial use: Triton 3.9's interpreter refuses them ("Block pointers have been removed
# in favor of the tensor descriptor API"), so such a kernel fails every test even if it runs on your GPU. Tensor
# descriptors (`tl.make_tensor_descriptor`) run in the interpreter only when the last dimension has stride 1, which
# the tests' layouts (`head_dim` strided by `H`) do not have: address tiles with pointers and strides.

# %% nbgrader={"grade": false, "grade_id": "q4_3_triton_forward", "locked": false, "schema_version": 3, "solution": true, "task": false}
@triton.jit
def _flash_attention_forward_kernel(
    Q, K, V, O, LSE,  # pointers to q, k, v, out: (B, S, H, D); lse: (B, H, S_q)
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    num_heads, seq_len_q, seq_len_kv, head_dim, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program instance: the queries [pid_m * BLOCK_M, (pid_m + 1) * BLOCK_M) of one (batch, head).

    Program ids: axis 0 is the query tile pid_m, axis 1 is batch * num_heads + head. Steps:
    1. offsets of this tile's queries, of the keys in a tile (BLOCK_N) and of the head dimension (BLOCK_D);
    2. load the query tile (BLOCK_M, BLOCK_D), masked past seq_len_q and head_dim (other=0.0);
    3. m_i = -inf, l_i = 0 (BLOCK_M,) and acc = 0 (BLOCK_M, BLOCK_D), all float32;
    4. for each key tile (with CAUSAL, only up to this tile's last query): load K^T (BLOCK_D, BLOCK_N) and
       V (BLOCK_N, BLOCK_D) masked, s = tl.dot(q, K^T) * scale, set invalid keys (past seq_len_kv or, with
       CAUSAL, after the query) to -inf, then the online-softmax update of m_i, l_i and acc;
    5. store acc / l_i into O (cast to O's dtype) and m_i + log(l_i) into LSE, masked past seq_len_q.
    """
    ### BEGIN SOLUTION
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions of this tile
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < seq_len_q) & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max per query
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running (unnormalised) output

    end_n = seq_len_kv
    if CAUSAL:  # keys after the tile's last query are masked for every query of the tile
        end_n = tl.minimum(seq_len_kv, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        cols = start_n + offs_n
        kt_ptrs = K + b * stride_kb + h * stride_kh + cols[None, :] * stride_ks + offs_d[:, None] * stride_kd
        kt = tl.load(kt_ptrs, mask=(cols[None, :] < seq_len_kv) & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N)
        s = tl.dot(q, kt) * scale  # (BLOCK_M, BLOCK_N) scores, in float32
        visible = cols[None, :] < seq_len_kv
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: key 0 is in the first tile
        alpha = tl.exp(m_i - m_new)  # rescales the old sum and output
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vs + offs_d[None, :] * stride_vd
        v = tl.load(v_ptrs, mask=(cols[:, None] < seq_len_kv) & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    out = acc / l_i[:, None]
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m[:, None] < seq_len_q) & d_ok[None, :])
    tl.store(LSE + b * stride_lb + h * stride_lh + offs_m * stride_ls, m_i + tl.log(l_i), mask=offs_m < seq_len_q)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "triton_launcher", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["test-helpers"]
def launch_flash_attention_forward(q, k, v, out, lse, causal=False, block_m=64, block_n=64):
    """Launch `_flash_attention_forward_kernel` over a grid of (query tiles, batch x heads); writes out and lse.

    Args:
        q (torch.Tensor): Queries, (B, S_q, H, D), any strides.
        k (torch.Tensor): Keys, (B, S_kv, H, D), any strides.
        v (torch.Tensor): Values, (B, S_kv, H, D), any strides.
        out (torch.Tensor): Output buffer, (B, S_q, H, D), any strides.
        lse (torch.Tensor): float32 buffer for the log-sum-exp, (B, H, S_q), any strides.
        causal (bool): Query i sees keys j <= i.
        block_m (int): Queries per program (a power of two, at least 16).
        block_n (int): Keys per step of the kernel's loop (a power of two, at least 16).
    """
    batch, seq_q, heads, head_dim = q.shape
    block_d = max(16, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(seq_q, block_m), batch * heads)
    launch_options = {"num_warps": 4, "num_stages": 2} if q.is_cuda else {}
    _flash_attention_forward_kernel[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        heads, seq_q, k.shape[1], head_dim, 1.0 / math.sqrt(head_dim),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, **launch_options,
    )


def triton_attention_forward(q, k, v, causal=False):
    """FlashAttention forward pass with the Triton kernel of Question 4.3.

    Args:
        q (torch.Tensor): Queries, (B, S_q, H, D), on the GPU (on the CPU under Triton's interpreter).
        k (torch.Tensor): Keys, (B, S_kv, H, D).
        v (torch.Tensor): Values, (B, S_kv, H, D).
        causal (bool): Query i sees keys j <= i.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: out (B, S_q, H, D) in q's dtype, lse (B, H, S_q) in float32.
    """
    batch, seq_q, heads, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_q, device=q.device, dtype=torch.float32)
    launch_flash_attention_forward(q, k, v, out, lse, causal=causal)
    return out, lse


# %% nbgrader={"grade": true, "grade_id": "q4_3_triton_forward_tests", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _triton_attention_forward(q, k, v, causal=False):
    """triton_attention_forward, run in the kernel (where the Triton kernel is); without Triton it raises ImportError."""
    return triton_attention_forward(q, k, v, causal=causal)


@kernel_side
def _notebook_triton_sources():
    """[(name, source)] of every @triton.jit kernel among the notebook's globals, read in the kernel (best effort)."""
    import inspect

    try:
        import triton

        kernel_type = triton.runtime.jit.KernelInterface  # JITFunction on a GPU, InterpretedFunction on a CPU
    except Exception:  # noqa: BLE001 - no Triton: no kernel to read
        return []
    found = []
    for name, value in list(globals().items()):
        if not isinstance(value, kernel_type):
            continue
        source = getattr(value, "src", None)
        try:
            source = source if isinstance(source, str) else inspect.getsource(value.fn)
        except Exception:  # noqa: BLE001 - best effort
            source = ""
        found.append((str(name), source))
    return found


def _block_pointer_calls(source):
    """The block-pointer calls (make_block_ptr, advance) in a kernel's code, read from its syntax tree: calls only, so a
    comment or a string that mentions them changes nothing. Empty when the source does not parse (the checks that
    run the kernel then decide)."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return set()
    class BlockPointerCalls(ast.NodeVisitor):
        """Collects the calls `<module>.make_block_ptr(...)`, `<module>.advance(...)` (or the bare names)."""

        def __init__(self):
            self.found = set()

        def visit_Call(self, node):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in ("make_block_ptr", "advance"):
                self.found.add(ast.unparse(node.func))
            self.generic_visit(node)

    finder = BlockPointerCalls()
    finder.visit(tree)
    return finder.found


def _assert_supported_triton():
    """Before a check runs the kernel: the notebook's Triton kernels must not use what the grader's interpreter
    refuses (block pointers), so that such a kernel scores the same on a CPU and on a GPU grader."""
    try:
        sources = _notebook_triton_sources()
    except Exception:  # noqa: BLE001 - best effort: the checks that run the kernel decide
        return
    used = sorted({f"{construct} (in {name})" for name, source in sources
                   for construct in _block_pointer_calls(source)})
    assert not used, (
        f"your Triton kernel uses {', '.join(used)}: block pointers are not supported by the grader's Triton "
        f"(Question 4.3 lists what it runs; Triton 3.9's interpreter refuses them), on a CPU and on a GPU grader "
        f"alike: address tiles with pointers and strides (tl.load(ptrs, mask=..., other=...))")


def _assert_tiled_kernel():
    """The method of Question 4.3, read from the kernel's source (best effort: the same on a CPU and on a GPU grader):
    _flash_attention_forward_kernel has a loop (over key tiles) that multiplies tiles with tl.dot."""
    import ast
    import textwrap

    sources = [source for name, source in _notebook_triton_sources() if name == "_flash_attention_forward_kernel"]
    assert sources and sources[0], "the source of your @triton.jit kernel _flash_attention_forward_kernel was not found"
    try:
        tree = ast.parse(textwrap.dedent(sources[0]))
    except SyntaxError as exc:
        raise AssertionError(f"the source of _flash_attention_forward_kernel does not parse: {exc}") from None
    class LoopsWithDot(ast.NodeVisitor):
        """Finds a call of `<module>.dot(...)` (tl.dot) inside a for or while loop."""

        def __init__(self):
            self.depth, self.found = 0, False

        def inside_loop(self, node):
            self.depth += 1
            self.generic_visit(node)
            self.depth -= 1

        def visit_For(self, node):
            self.inside_loop(node)

        def visit_While(self, node):
            self.inside_loop(node)

        def visit_Call(self, node):
            self.found = self.found or (self.depth > 0 and getattr(node.func, "attr", None) == "dot")
            self.generic_visit(node)

    finder = LoopsWithDot()
    finder.visit(tree)
    assert finder.found, (
        "_flash_attention_forward_kernel must loop over the key/value tiles (BLOCK_N keys at a time) and multiply "
        "tiles with tl.dot inside that loop (the online softmax of FlashAttention): its source has no loop that calls "
        "tl.dot")


def _q4_3_public_tests():
    gen = torch.Generator().manual_seed(43)
    q, k, v = (torch.randn(1, 37, 2, 16, generator=gen) for _ in range(3))
    with check("public: triton_attention_forward(q, k, v) equals attention for q, k, v (1, 37, 2, 16)", weight=2):
        _assert_supported_triton()
        out, lse = as_tuple(_triton_attention_forward(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)), 2,
                            "triton_attention_forward(q, k, v)")
        q64, k64, v64 = (t.double().transpose(1, 2) for t in (q, k, v))
        assert_tensor_close(out, F.scaled_dot_product_attention(q64, k64, v64).transpose(1, 2),
                            "triton_attention_forward(q, k, v)'s out for q, k, v (1, 37, 2, 16)", rtol=0, atol=2e-2)
        scores = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) / math.sqrt(16)
        assert_tensor_close(lse, torch.logsumexp(scores, dim=-1), "triton_attention_forward(q, k, v)'s lse", rtol=0,
                            atol=2e-2)


_q4_3_public_tests()
del _q4_3_public_tests
### BEGIN HIDDEN TESTS
def _q4_3_hidden_tests():
    @kernel_side
    def triton_kernel_type(kernel):
        """(whether kernel is a @triton.jit kernel, the name of its type), looked at in the kernel."""
        import triton

        kind = type(kernel)
        return (isinstance(kernel, triton.runtime.jit.KernelInterface) and kind.__module__.startswith("triton."),
                f"{kind.__module__}.{kind.__qualname__}")

    is_jit, kind = triton_kernel_type(_flash_attention_forward_kernel)
    assert is_jit is True, f"_flash_attention_forward_kernel must be a @triton.jit kernel, got {kind}"
    gen = torch.Generator().manual_seed(4_3)

    def reference(q, k, v, causal):
        q, k, v = (t.to(torch.float64) for t in (q, k, v))
        scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
        if causal:
            visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v), torch.logsumexp(scores, dim=-1)

    @kernel_side
    def launch_in_layouts(q, k, v, layouts, causal, block_m, block_n):
        """Launch the kernel through launch_flash_attention_forward on q, k, v and into an output stored in the
        layouts named (q, k, v, out), out and lse filled with NaN first; returns (out, lse)."""
        def stored_as(t, layout):
            """The values of t (B, S, H, D) in a tensor of another memory layout, viewed as (B, S, H, D)."""
            if layout == "bhsd":  # heads before the sequence
                return t.transpose(1, 2).contiguous().transpose(1, 2)
            if layout == "bsdh":  # head_dim strided by H
                return t.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)
            if layout == "sbhd":  # batch strided by H x D
                return t.permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)
            if layout == "padded":  # rows longer than head_dim
                wide = torch.zeros(*t.shape[:-1], t.shape[-1] + 5, dtype=t.dtype, device=t.device)
                wide[..., :t.shape[-1]] = t
                return wide[..., :t.shape[-1]]
            return t.contiguous()

        # Layouts are made on DEVICE: copying a strided tensor to another device may make it contiguous.
        qd, kd, vd = (stored_as(t.to(DEVICE), layout) for t, layout in zip((q, k, v), layouts))
        b, s_q, h, _ = q.shape
        out = stored_as(torch.full(q.shape, float("nan"), device=DEVICE), layouts[3])
        lse = torch.full((b, s_q, h), float("nan"), device=DEVICE).permute(0, 2, 1)  # (B, H, S_q), stride H along S_q
        launch_flash_attention_forward(qd, kd, vd, out, lse, causal=causal, block_m=block_m, block_n=block_n)
        return out, lse

    lse_cases = []

    def grade_case(b, s_q, s_kv, h, d, causal, block_m, block_n, layouts=("bshd",) * 4, scale=1.0, lse_too=False):
        q = torch.randn(b, s_q, h, d, generator=gen) * scale
        k = torch.randn(b, s_kv, h, d, generator=gen) * scale
        v = torch.randn(b, s_kv, h, d, generator=gen)
        want_out, want_lse = reference(q, k, v, causal)
        _assert_supported_triton()  # before each launch: block pointers fail on every grader
        out, lse = launch_in_layouts(q, k, v, layouts, causal, block_m, block_n)
        where = (f"q {(b, s_q, h, d)}, k/v {(b, s_kv, h, d)}, causal={causal}, BLOCK_M={block_m}, BLOCK_N={block_n}, "
                 f"layouts of q, k, v, out: {', '.join(layouts)}")
        lse_cases.append((lse, want_lse, where))
        assert_tensor_close(out, want_out, f"your kernel's O for {where} (attention against a float64 reference: "
                                           f"address every tensor with its strides; scale by 1/sqrt(D); mask keys past "
                                           f"the end and, if causal, keys after the query; rescale l_i and acc by "
                                           f"exp(m_old - m_new); every element written, none left NaN)",
                            rtol=0, atol=2e-2)
        if lse_too:
            assert_tensor_close(lse, want_lse, f"your kernel's LSE for {where} (m_i + log(l_i))", rtol=0, atol=2e-2)

    with check("O, contiguous (B, S, H, D): cross-attention, head_dim padded to BLOCK_D, tiles of 16 to 64", weight=3):
        grade_case(1, 45, 70, 2, 24, False, 64, 64)  # head_dim padded to 32, cross-attention
        grade_case(2, 50, 50, 1, 16, False, 16, 32)
    with check("O with causal=True", weight=1):
        grade_case(1, 50, 50, 2, 32, True, 16, 32)
        grade_case(2, 80, 80, 1, 16, True, 32, 16, scale=2.0)
    with check("LSE: m_i + log(l_i), the log-sum-exp of the scaled scores over the visible keys", weight=1):
        assert lse_cases, "no launch returned an LSE"
        for lse, want_lse, where in lse_cases:
            assert_tensor_close(lse, want_lse, f"your kernel's LSE for {where} (m_i + log(l_i), every element written)",
                                rtol=0, atol=2e-2)
    with check("inputs and outputs in other layouts (transposed views, head_dim strided, padded rows): every stride",
               weight=1):
        grade_case(2, 40, 40, 3, 16, False, 16, 16, layouts=("bhsd", "bhsd", "bhsd", "bhsd"))
        grade_case(2, 37, 37, 2, 16, True, 16, 16, layouts=("padded", "bsdh", "sbhd", "bhsd"))
    # The method, which gates this question: the kernel loops over key tiles and multiplies them with tl.dot.
    with check("the kernel loops over key tiles and multiplies tiles with tl.dot (FlashAttention's online softmax, not "
               "a whole row of keys at once)", weight=4, method=True):
        _assert_tiled_kernel()


_q4_3_hidden_tests()
del _q4_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 4.3")


# %% [markdown] deletable=false editable=false tags=["measure"]
# *Timed after grading, for no points:* on the course's grading GPU, `python -m course measure` times your kernel
# through `triton_attention_forward` in bf16 at S = 1k, 4k and 16k tokens (16k tokens per call), head dimension 64
# and 128, causal and not, checks its output on those inputs, and your feedback shows where it lands on that GPU's
# roofline, beside the reference solution and the class's quartiles.
#
# ```measure
# {
#     # FLOP: 4 B H S^2 D (two matmuls of 2 S^2 D per head; half of it with the causal mask). Fewest bytes: q, k, v
#     # read once and the output written once, plus the float32 log-sum-exp.
#     "name": "triton_forward",
#     "function": "triton_attention_forward",
#     "kind": "attention_bshd",
#     "cells": ["q4_3_triton_forward", "triton_launcher"],
#     "tests": ["q4_3_triton_forward_tests"],
#     "dtype": "bfloat16",
#     "tiny_dtype": "float32",  # Triton's CPU interpreter has no bf16
#     "flops": "4 * B * H * S * S * D * (0.5 if causal else 1)",
#     "bytes": "4 * B * S * H * D * element_bytes + 4 * B * H * S",
#     "metric": "tflops",
#     "tolerance": 2e-2,
#     "warmup": 3,
#     "repeat": 10,
#     "timeout_s": 60.0,
#     "shapes": [
#         {"B": 16, "S": 1024, "H": 16, "D": 64, "causal": False},
#         {"B": 16, "S": 1024, "H": 16, "D": 64, "causal": True},
#         {"B": 16, "S": 1024, "H": 16, "D": 128, "causal": False},
#         {"B": 16, "S": 1024, "H": 16, "D": 128, "causal": True},
#         {"B": 4, "S": 4096, "H": 16, "D": 64, "causal": False},
#         {"B": 4, "S": 4096, "H": 16, "D": 64, "causal": True},
#         {"B": 4, "S": 4096, "H": 16, "D": 128, "causal": False},
#         {"B": 4, "S": 4096, "H": 16, "D": 128, "causal": True},
#         {"B": 1, "S": 16384, "H": 16, "D": 64, "causal": False},
#         {"B": 1, "S": 16384, "H": 16, "D": 64, "causal": True},
#         {"B": 1, "S": 16384, "H": 16, "D": 128, "causal": False},
#         {"B": 1, "S": 16384, "H": 16, "D": 128, "causal": True},
#     ],
#     "tiny_shapes": [
#         {"B": 1, "S": 40, "H": 2, "D": 16, "causal": False},
#         {"B": 1, "S": 40, "H": 2, "D": 16, "causal": True},
#     ],
# }
# ```

# %%
def _triton_demo():
    triton_q = torch.randn(2, at_scale(teaching=1024, quick=64, cpu=256), 2, 64, device=DEVICE)
    triton_out, _ = triton_attention_forward(triton_q, triton_q, triton_q, causal=True)
    causal_reference = einsum_attention(triton_q, triton_q, triton_q,
                                        mask=causal_mask(triton_q.shape[1], device=DEVICE))
    print("max |Triton - einsum| (causal):", (triton_out - causal_reference).abs().max().item(),
          "(on a GPU, tl.dot rounds float32 tiles to TF32, 10 bits of mantissa: errors up to about 1e-2 are "
          "expected, within the tests' 2e-2; in the CPU interpreter, float32 rounding only)")
    if DEVICE.type == "cuda":
        bench_q = torch.randn(8, 4096, 8, 64, device=DEVICE, dtype=torch.bfloat16)
        triton_ms = benchmark_latency(lambda: triton_attention_forward(bench_q, bench_q, bench_q), n_warmup=5, n_repeat=20)
        flash_ms = benchmark_latency(lambda: flash_attn_func(bench_q, bench_q, bench_q), n_warmup=5, n_repeat=20)
        print(f"(8, 4096, 8, 64) bf16: Triton {triton_ms:.3f} ms, flash_attn_func {flash_ms:.3f} ms "
              f"({ATTENTION_BACKEND})")
    else:
        print("Timing the kernel needs a GPU (the interpreter's speed means nothing): the H200's Triton and "
              "flash_attn_func timings are in measured_runs.md beside this notebook.")


if TRITON_AVAILABLE:
    try:
        with uses_answers("Question 4.3", "Question 3.1"):
            _triton_demo()
    except Exception as exc:  # noqa: BLE001 - on a GPU an unwritten kernel fails to compile: Question 4.3's tests say why
        print(f"Your Triton kernel did not run: {type(exc).__name__}: {str(exc)[:300]} (Question 4.3's test cell says "
              "what is wrong)")
else:
    print(TRITON_MISSING)

# %% [markdown]
# #### Bonus 4.4 (8 points)
#
# **The backward pass by recomputation.** Training needs $dQ$, $dK$, $dV$ given $dO$. Standard attention saves
# the $S \times S$ probabilities $P$ for that; FlashAttention saves only `out` and `lse` and **recomputes** each
# tile of $P$ in the backward pass: $P_{ij} = \exp(s_{ij} - \mathrm{lse}_i)$ with $s_{ij} = q_i \cdot k_j /
# \sqrt{D}$, exact without any max or sum. With $\delta_i = \sum_d dO_{id}\, O_{id}$ (one number per query),
# per tile:
# $$dV_j \mathrel{+}= \sum_i P_{ij}\, dO_i, \qquad dP_{ij} = dO_i \cdot v_j, \qquad
#   dS_{ij} = P_{ij}\,(dP_{ij} - \delta_i),$$
# $$dQ_i \mathrel{+}= \tfrac{1}{\sqrt{D}} \sum_j dS_{ij}\, k_j, \qquad dK_j \mathrel{+}= \tfrac{1}{\sqrt{D}}
#   \sum_i dS_{ij}\, q_i.$$
# ($dS = P \circ (dP - \delta)$ is the softmax backward: $\delta_i = \sum_j P_{ij}\, dP_{ij} = dO_i \cdot O_i$.)
#
# Write `flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64)` in PyTorch
# returning `(dq, dk, dv)` (shapes and dtypes of `q`, `k`, `v`), tile by tile: the same memory rule as
# Question 4.2 applies, checked the same way (no tensor with more than twice the elements of `q` or of
# `B x H x block_q x block_k`, and at least one PyTorch operation per (query tile, key tile) pair with a visible
# key). Write the backward pass yourself from the formulas above: no autograd (`torch.autograd.grad`, `.backward()`,
# tensors that require gradients), which the tests check by recording the torch functions your code calls. The
# backward pass by recomputation, tile by tile, is what this question asks for: an answer that breaks either rule
# earns at most a quarter of its points, however right its gradients. The tests give you `out` and `lse` computed by a reference and compare your gradients with autograd's on
# a float64 reference: to 1e-8 for float64 inputs (compute in float64 then) and 1e-3 for float32 inputs.
# The cell after the tests wraps your forward (Question 4.2) and backward in a `torch.autograd.Function`.

# %% nbgrader={"grade": false, "grade_id": "b4_4_flash_backward", "locked": false, "schema_version": 3, "solution": true, "task": false}
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    """Gradients of attention, recomputing the softmax tile by tile from lse.

    Args:
        q (torch.Tensor): Queries, (B, S_q, H, D).
        k (torch.Tensor): Keys, (B, S_kv, H, D).
        v (torch.Tensor): Values, (B, S_kv, H, D).
        out (torch.Tensor): The forward output, (B, S_q, H, D).
        lse (torch.Tensor): The forward log-sum-exp, (B, H, S_q).
        grad_out (torch.Tensor): dLoss/dout, (B, S_q, H, D).
        causal (bool): Query i sees keys j <= i.
        block_q (int): Queries per tile.
        block_k (int): Keys per tile.

    Returns:
        tuple[torch.Tensor, torch.Tensor, torch.Tensor]: dq, dk, dv with the shapes and dtypes of q, k, v.
    """
    ### BEGIN SOLUTION
    batch, seq_q, heads, head_dim = q.shape
    seq_kv = k.shape[1]
    scale = 1.0 / math.sqrt(head_dim)
    cdt = torch.promote_types(q.dtype, torch.float32)
    delta = (grad_out.to(cdt) * out.to(cdt)).sum(dim=-1).transpose(1, 2)  # (B, H, S_q)
    lse = lse.to(cdt)
    dq = torch.zeros(batch, heads, seq_q, head_dim, dtype=cdt, device=q.device)
    dk = torch.zeros(batch, heads, seq_kv, head_dim, dtype=cdt, device=q.device)
    dv = torch.zeros(batch, heads, seq_kv, head_dim, dtype=cdt, device=q.device)
    for k_start in range(0, seq_kv, block_k):
        k_end = min(k_start + block_k, seq_kv)
        k_tile = k[:, k_start:k_end].to(cdt)  # (B, bk, H, D)
        v_tile = v[:, k_start:k_end].to(cdt)
        first_q = (k_start // block_q) * block_q if causal else 0  # earlier query tiles cannot see these keys
        for q_start in range(first_q, seq_q, block_q):
            q_end = min(q_start + block_q, seq_q)
            q_tile = q[:, q_start:q_end].to(cdt)
            do_tile = grad_out[:, q_start:q_end].to(cdt)
            scores = torch.einsum("bshd,bthd->bhst", q_tile, k_tile) * scale  # (B, H, bq, bk)
            if causal:
                rows = torch.arange(q_start, q_end, device=q.device)[:, None]
                cols = torch.arange(k_start, k_end, device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, float("-inf"))
            probs = torch.exp(scores - lse[:, :, q_start:q_end, None])  # exact softmax weights of this tile
            dv[:, :, k_start:k_end] += torch.einsum("bhst,bshd->bhtd", probs, do_tile)
            dprobs = torch.einsum("bshd,bthd->bhst", do_tile, v_tile)
            dscores = probs * (dprobs - delta[:, :, q_start:q_end, None])
            dq[:, :, q_start:q_end] += torch.einsum("bhst,bthd->bhsd", dscores, k_tile) * scale
            dk[:, :, k_start:k_end] += torch.einsum("bhst,bshd->bhtd", dscores, q_tile) * scale
    return (dq.transpose(1, 2).to(q.dtype), dk.transpose(1, 2).to(k.dtype), dv.transpose(1, 2).to(v.dtype))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b4_4_flash_backward_tests", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
def _b4_4_reference_grads(q, k, v, grad_out, causal):
    q, k, v = (t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v))
    scores = torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril(), float("-inf"))
    out = torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)
    grads = torch.autograd.grad(out, (q, k, v), grad_out.to("cpu", torch.float64))
    return out.detach(), torch.logsumexp(scores, dim=-1).detach(), grads


def _b4_4_public_tests():
    gen = torch.Generator().manual_seed(44)
    q, k, v, do = (torch.randn(1, 20, 2, 8, generator=gen, dtype=torch.float64) for _ in range(4))
    out, lse, want = _b4_4_reference_grads(q, k, v, do, False)
    with check("public: dq, dk, dv equal autograd's for float64 q, k, v (1, 20, 2, 8), tiles 8 x 8", weight=2):
        got = as_tuple(flash_attention_backward(*(t.to(DEVICE) for t in (q, k, v, out, lse, do)), block_q=8, block_k=8),
                       3, "flash_attention_backward")
        for name, grad, want_grad in zip(("dq", "dk", "dv"), got, want):
            assert_tensor_close(grad, want_grad, f"flash_attention_backward's {name} (autograd's gradient of attention)", rtol=0,
                                atol=1e-8, dtype=torch.float64)


_b4_4_public_tests()
del _b4_4_public_tests
### BEGIN HIDDEN TESTS
def _b4_4_hidden_tests():
    gen = torch.Generator().manual_seed(4_4)

    @kernel_side
    def probed(fn, q, k, v, *args, **kwargs):
        """fn(q, k, v, *args, **kwargs) in the kernel inside run_with_probe_watching(k, ...): (fn's result, what the
        probe saw, as a dict, with which elements of k were read)."""
        result, probe = run_with_probe_watching(k, fn, q, k, v, *args, **kwargs)
        return result, probe.summary()

    @kernel_side
    def autograd_use_of(fn, *args, **kwargs):
        """fn(*args, **kwargs) in the kernel: (the names of the torch functions it called, from record_torch_calls; the
        first function whose result required gradients, or None)."""
        from torch.overrides import TorchFunctionMode
        from torch.utils._pytree import tree_leaves

        class GradientWatch(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.tracked = None

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if self.tracked is None and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_leaves(out)):
                    self.tracked = getattr(func, "__name__", repr(func))
                return out

        with record_torch_calls() as called:
            with GradientWatch() as watch:
                fn(*args, **kwargs)
        return sorted(called), watch.tracked

    def grade_case(b, s_q, s_kv, h, d, causal, block_q, block_k, dtype):
        q = torch.randn(b, s_q, h, d, generator=gen, dtype=torch.float64)
        k = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64)
        v = torch.randn(b, s_kv, h, d, generator=gen, dtype=torch.float64)
        do = torch.randn(b, s_q, h, d, generator=gen, dtype=torch.float64)
        out, lse, want = _b4_4_reference_grads(q, k, v, do, causal)
        lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        where = f"q {(b, s_q, h, d)}, k/v {(b, s_kv, h, d)}, causal={causal}, tiles {block_q}x{block_k}, {dtype}"
        got = as_tuple(flash_attention_backward(q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype),
                                                out.to(DEVICE, dtype), lse.to(DEVICE, lse_dtype), do.to(DEVICE, dtype),
                                                causal=causal, block_q=block_q, block_k=block_k),
                       3, f"flash_attention_backward for {where}")
        tol = 1e-8 if dtype == torch.float64 else 1e-3
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert_tensor_close(g, w, f"flash_attention_backward's {name} for {where} (autograd's gradient of "
                                      f"attention: P = exp(s - lse), dS = P (dP - rowsum(dO * O)), dQ and dK scaled by "
                                      f"1/sqrt(D))", rtol=0, atol=tol, dtype=dtype)

    with check("float64 gradients: cross-attention and tiles that do not divide the sequence", weight=3):
        grade_case(1, 30, 45, 3, 5, False, 16, 16, torch.float64)
        grade_case(2, 33, 33, 2, 8, False, 8, 16, torch.float64)
    with check("causal=True", weight=1):
        grade_case(2, 37, 37, 2, 8, True, 16, 8, torch.float64)
        grade_case(1, 50, 50, 1, 16, True, 64, 64, torch.float64)
    with check("float32 inputs: gradients in float32 to 1e-3", weight=1):
        grade_case(2, 24, 24, 2, 16, False, 8, 16, torch.float32)
    q, k, v = (torch.randn(1, 128, 2, 4, generator=gen) for _ in range(3))
    out, lse, _ = _b4_4_reference_grads(q, k, v, torch.ones_like(q), True)
    _, probe = probed(flash_attention_backward, *(t.to(DEVICE, torch.float32) for t in (q, k, v, out)),
                      lse.to(DEVICE, torch.float32), torch.ones_like(q).to(DEVICE), causal=True, block_q=32, block_k=32)
    limit = 2 * max(q.numel(), 2 * 32 * 32)
    pairs = 4 * 5 // 2  # causal 128 x 128 in 32 x 32 tiles: the tiles on and below the diagonal
    # Honest code either runs an operation per tile pair or creates a tensor over the limit (then the check below fails
    # on its own); neither means the probe was bypassed: that costs the whole question.
    assert probe["num_ops"] >= pairs or probe["largest_numel"] > limit, (
        f"flash_attention_backward(causal=True) on q (1, 128, 2, 4) with 32 x 32 tiles: the probe saw "
        f"{probe['num_ops']} PyTorch operations for {pairs} tile pairs and no tensor over the limit: the work ran where "
        f"the probe cannot see it (its dispatch mode switched off, or outside PyTorch), so how it was computed cannot "
        f"be checked and this question cannot be graded")
    # The method, which gates this question: the backward pass by recomputation, tile by tile, written out.
    with check("tile by tile: one tile of P at a time, every tile computed with PyTorch operations that read every key",
               weight=2, method=True):
        assert probe["num_ops"] >= pairs, (
            f"flash_attention_backward(causal=True) on q (1, 128, 2, 4) with 32 x 32 tiles: the probe saw "
            f"{probe['num_ops']} PyTorch operations for {pairs} tile pairs; compute every tile with PyTorch operations")
        assert probe["largest_numel"] <= limit, (
            f"flash_attention_backward must recompute one tile of P at a time: for q (1, 128, 2, 4) with 32 x 32 tiles "
            f"it created a tensor of {probe['largest_numel']:,} elements ({probe['largest_op']}); the limit is {limit:,}")
        assert probe["watched_elements_read"] == k.numel(), (
            f"flash_attention_backward on q, k, v (1, 128, 2, 4): PyTorch operations read {probe['watched_elements_read']} "
            f"of the {k.numel()} elements of k; every key takes part in the gradients")
    with check("the backward pass written out: no autograd (torch.autograd.grad, .backward(), tensors requiring "
               "gradients)", weight=1, method=True):
        q, k, v, do = (torch.randn(1, 24, 2, 8, generator=gen, dtype=torch.float64) for _ in range(4))
        out, lse, _ = _b4_4_reference_grads(q, k, v, do, False)
        called, tracked = autograd_use_of(flash_attention_backward, *(t.to(DEVICE) for t in (q, k, v, out, lse, do)),
                                          block_q=8, block_k=16)
        what = "flash_attention_backward (the question asks for the backward pass by recomputation, not autograd)"
        assert_calls(called, what, forbidden=("grad", "backward", "requires_grad_"))
        assert tracked is None, f"{what}: {tracked} returned a tensor that requires gradients (autograd records a graph)"


_b4_4_hidden_tests()
del _b4_4_hidden_tests
### END HIDDEN TESTS
finish_checks("Bonus 4.4")


# %%
class FlashAttention(torch.autograd.Function):
    """Attention whose forward saves only (q, k, v, out, lse) and whose backward recomputes the softmax."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):
        out, lse = tiled_attention_forward(q, k, v, causal=causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, causal=ctx.causal)
        return dq, dk, dv, None  # no gradient for `causal`


grad_q, grad_k, grad_v = (torch.randn(2, 100, 2, 16, device=DEVICE, dtype=torch.float64, requires_grad=True)
                          for _ in range(3))
with uses_answers("Bonus 4.4", "Question 4.2", "Question 3.1", "Question 3.3"):
    grad_mask = causal_mask(100, device=DEVICE)
    flash_grads = torch.autograd.grad(FlashAttention.apply(grad_q, grad_k, grad_v, True).sum(),
                                      (grad_q, grad_k, grad_v))
    eager_grads = torch.autograd.grad(einsum_attention(grad_q, grad_k, grad_v, mask=grad_mask).sum(),
                                      (grad_q, grad_k, grad_v))
    for name, mine, theirs in zip(("dq", "dk", "dv"), flash_grads, eager_grads):
        print(f"FlashAttention.apply vs autograd through einsum_attention, {name}: max |diff| "
              f"{(mine - theirs).abs().max().item():.2e}")

# %% [markdown]
# # Part 5: Benchmarks
#
# ## Attention: latency, backward and memory
#
# We benchmark one head of attention (`H = 1`, head dimension `d_model`) on a batch of 8 sequences, for
# `d_model` in {32, 64, 128} and sequence lengths {256, 1024, 4096, 8192, 16384}, in bf16, four ways:
# your `einsum_attention` (eager), the same compiled with `torch.compile`, FlashAttention (`flash_attn_func`
# from `utils`: the flash-attn package if installed, else PyTorch's FlashAttention-2 kernel) and your Triton
# kernel (forward only: it has no backward). On a CPU (cpu scale: `d_model` 32, sequences of 256 to 1024, in
# float32) the rows are eager, `flash_attn_func` (which runs PyTorch's math path there, an `S x S` matrix like
# eager) and your tiled PyTorch forward of Question 4.2 (forward only), which stands in for the kernels that
# never write the `S x S` matrix.
#
# Long sequences can run out of GPU memory. A benchmark must report that as a result (`"oom"`), not crash: the
# out-of-memory row says as much as a timing. `run_oom_safe(fn, ...)` from `utils` returns `("ok", result)` or
# `("oom", None)` and frees memory after an OOM; other errors still raise, as they should.

# %% [markdown]
# #### Question 5.1 (6 points)
#
# Write `benchmark_attention(attn_fn, batch_size, seq_len, d_model, *, dtype=torch.float32, device=DEVICE,
# backward=True, n_warmup=3, n_repeat=10)`. It returns a dict with four keys:
# - `"status"`: `"ok"`, or `"oom"` if any step ran out of memory (`torch.OutOfMemoryError`, which is
#   `torch.cuda.OutOfMemoryError`, or `MemoryError`); every other exception must propagate, a `RuntimeError` that
#   is not an out-of-memory error (a shape mismatch, say) included;
# - `"forward_ms"`: latency of `attn_fn(q, k, v)` in ms (`benchmark_latency`), with `q`, `k`, `v` random
#   tensors of shape `(batch_size, seq_len, 1, d_model)` of `dtype` on `device`, created with
#   `requires_grad=backward`;
# - `"backward_ms"`: latency of the backward pass alone, in ms: the median over `n_repeat` timed calls (after
#   `n_warmup` untimed ones) of `torch.autograd.grad(out, (q, k, v), grad_out)`, each on the output of a fresh
#   forward call made outside the timed region (synchronize the GPU around the timed region); `NaN` when
#   `backward=False`;
# - `"peak_memory_gb"`: peak memory in GB above what was allocated before, of one forward and backward pass
#   (forward only when `backward=False`), with `benchmark_memory`;
# - with status `"oom"`, the three numbers are `float("nan")`.
#
# Return the status as a string and the three numbers as floats. The hidden tests benchmark a function whose forward and backward
# passes take known times and allocate known amounts of memory (its backward allocates more than its forward; its
# first calls, the warm-up, are much slower than the later ones), and check each number you report against those,
# from below and from above: a latency per call of the timed calls only, the warm-up left out, a backward timed
# without its forward.

# %% nbgrader={"grade": false, "grade_id": "q5_1_benchmark_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def benchmark_attention(attn_fn, batch_size, seq_len, d_model, *, dtype=torch.float32, device=DEVICE,
                        backward=True, n_warmup=3, n_repeat=10):
    """Forward latency, backward latency and peak memory of one attention implementation.

    Args:
        attn_fn (Callable): Takes q, k, v of shape (batch_size, seq_len, 1, d_model) and returns the output.
        batch_size (int): Sequences per batch.
        seq_len (int): Tokens per sequence.
        d_model (int): Head dimension (one head).
        dtype (torch.dtype): dtype of q, k and v.
        device (torch.device): Where to run.
        backward (bool): Also time the backward pass (attn_fn must support autograd).
        n_warmup (int): Untimed calls before timing.
        n_repeat (int): Timed calls.

    Returns:
        dict: {"status": "ok" | "oom", "forward_ms": float, "backward_ms": float (NaN without backward),
        "peak_memory_gb": float}; all three numbers NaN when status is "oom".
    """
    ### BEGIN SOLUTION
    device = torch.device(device)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def measure():
        shape = (batch_size, seq_len, 1, d_model)
        q, k, v = (torch.randn(shape, dtype=dtype, device=device, requires_grad=backward) for _ in range(3))
        forward_ms = benchmark_latency(attn_fn, q, k, v, n_warmup=n_warmup, n_repeat=n_repeat)
        if not backward:
            peak_gb, _ = benchmark_memory(attn_fn, q, k, v, n_warmup=1, n_repeat=1)
            return forward_ms, float("nan"), peak_gb
        grad_out = torch.randn(shape, dtype=dtype, device=device)
        times_ms = []
        for call in range(n_warmup + n_repeat):
            out = attn_fn(q, k, v)
            synchronize()
            start_s = time.perf_counter()
            torch.autograd.grad(out, (q, k, v), grad_out)
            synchronize()
            if call >= n_warmup:
                times_ms.append((time.perf_counter() - start_s) * 1e3)
            del out

        def forward_backward(q, k, v):
            return torch.autograd.grad(attn_fn(q, k, v), (q, k, v), grad_out)

        peak_gb, _ = benchmark_memory(forward_backward, q, k, v, n_warmup=1, n_repeat=1)
        return forward_ms, statistics.median(times_ms), peak_gb

    status, result = run_oom_safe(measure)
    if status != "ok":
        return {"status": "oom", "forward_ms": float("nan"), "backward_ms": float("nan"), "peak_memory_gb": float("nan")}
    forward_ms, backward_ms, peak_gb = result
    return {"status": "ok", "forward_ms": float(forward_ms), "backward_ms": float(backward_ms),
            "peak_memory_gb": float(peak_gb)}
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q5_1_benchmark_attention_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _example_attention_functions():
    """Two attn_fn to benchmark (made in the kernel, where benchmark_attention calls them): a plain attention, and
    one that runs out of memory."""
    def toy_attention(q, k, v):
        weights = torch.softmax(torch.einsum("bshd,bthd->bhst", q, k) / math.sqrt(q.shape[-1]), dim=-1)
        return torch.einsum("bhst,bthd->bshd", weights, v)

    def oom_attention(q, k, v):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated by the test)")

    return toy_attention, oom_attention


_toy_attention, _oom_attention = _example_attention_functions()


def _q5_1_public_tests():
    with check("public: a run that fits gives status 'ok' and positive latencies; an out-of-memory error gives 'oom' "
               "and NaN numbers", weight=2):
        result = benchmark_attention_result(benchmark_attention(_toy_attention, 2, 16, 8, n_warmup=1, n_repeat=2),
                                            "benchmark_attention(toy attention, 2, 16, 8)")
        assert_label(result["status"], "ok", "benchmark_attention(toy attention, 2, 16, 8)['status']", choices=("ok", "oom"))
        for name in ("forward_ms", "backward_ms"):
            assert as_real(result[name], f"benchmark_attention(toy attention, 2, 16, 8)['{name}']") > 0, (
                f"{name} must be a positive latency in ms, got {result[name]!r}")
        result = benchmark_attention_result(benchmark_attention(_oom_attention, 2, 16, 8, n_warmup=1, n_repeat=2),
                                            "benchmark_attention(an attention that runs out of memory, 2, 16, 8)")
        assert_label(result["status"], "oom", "benchmark_attention(an attention that runs out of memory, ...)['status']",
                     choices=("ok", "oom"))
        for name in ("forward_ms", "backward_ms", "peak_memory_gb"):
            assert_nan(result[name], f"benchmark_attention(an attention that runs out of memory, ...)['{name}']")


_q5_1_public_tests()
del _oom_attention, _q5_1_public_tests
### BEGIN HIDDEN TESTS
def _q5_1_hidden_tests():
    # A function whose costs are known: the forward sleeps forward_s and allocates forward_bytes for a moment; the
    # backward sleeps backward_s and allocates backward_bytes; the first `warmup_calls` forward calls and the first
    # `warmup_calls` backward calls (the warm-up of any correct benchmark, whatever it runs first) sleep warmup_s
    # instead. The kernel measures how long each call really took (on a loaded machine a sleep lasts longer than asked,
    # never shorter), and the bounds come from those durations, never from the clock's expectations: a latency per
    # timed call lies between the shortest and the longest later (not warm-up) call, plus a margin of half a call for
    # what runs around the calls; a mean that includes the warm-up (a third of a 0.6 s longer call more), a total of
    # two calls (one call more) or a backward timed with its forward (a forward more) lands above. A loaded machine
    # lengthens the calls themselves, which moves the bounds with them; it misgrades a correct answer only where it
    # stalls the code around a timed call by more than half a call (50 ms).
    # On a GPU each call's duration is read from CUDA events recorded at its start and end on the stream it runs
    # on, like benchmark_latency's: events around a timed call then enclose the call's own in stream order, and so
    # does a synchronised clock. (A CPU clock read inside the call is not enclosed: a GPU shared with other
    # processes may reach the timing's start event after the call began, and a correct forward_ms then fell a
    # fraction of a millisecond short.)
    forward_s, backward_s, warmup_s, forward_bytes, backward_bytes = 0.1, 0.1, 0.7, 4_000_000, 16_000_000

    @kernel_side
    def attention_functions(toy_attention, forward_s, backward_s, forward_bytes, backward_bytes, warmup_s=0.7,
                            warmup_calls=1):
        """The attn_fn to benchmark, made in the kernel (where benchmark_attention calls them); "recorded" returns
        what "recording" saw so far."""
        seen = {"forward": 0, "backward": 0, "shapes": set(), "requires_grad": set(), "dtypes": set()}

        def recording(q, k, v):
            seen["forward"] += 1
            seen["shapes"].add((tuple(q.shape), tuple(k.shape), tuple(v.shape)))
            seen["requires_grad"].add((q.requires_grad, k.requires_grad, v.requires_grad))
            seen["dtypes"].add(q.dtype)
            out = toy_attention(q, k, v)
            if out.requires_grad:
                out.register_hook(lambda grad: seen.__setitem__("backward", seen["backward"] + 1))
            return out

        spent = {"forward": [], "backward": []}  # (start, end) of every call of KnownCost, in order: see stamp

        def stamp(device):
            """Now, on the clock a timing of work on `device` reads: a CUDA event recorded on the current stream (in
            order with the call's GPU work) or, on the CPU, time.perf_counter()."""
            if device.type != "cuda":
                return time.perf_counter()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def seconds(began, ended):
            return ended - began if isinstance(began, float) else began.elapsed_time(ended) / 1e3

        def sleep_for(kind, usual_s):
            """Sleep as a call of `kind` does: warmup_s for the first warmup_calls calls of that kind, else usual_s."""
            time.sleep(warmup_s if len(spent[kind]) < warmup_calls else usual_s)

        class KnownCost(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                began = stamp(q.device)
                scratch = torch.ones(forward_bytes // 8, dtype=torch.float64, device=q.device)
                sleep_for("forward", forward_s)
                out = q + k + v * scratch[0].to(v.dtype)
                spent["forward"].append((began, stamp(q.device)))
                return out

            @staticmethod
            def backward(ctx, grad_out):
                began = stamp(grad_out.device)
                scratch = torch.ones(backward_bytes // 8, dtype=torch.float64, device=grad_out.device)
                sleep_for("backward", backward_s)
                grad = grad_out * scratch[0].to(grad_out.dtype)
                spent["backward"].append((began, stamp(grad_out.device)))
                return grad, grad, grad

        def known_cost(q, k, v):
            return KnownCost.apply(q, k, v)

        def benchmark_known_cost():
            """benchmark_attention(known_cost, 2, 16, 8, n_warmup=warmup_calls, n_repeat=2), with the duration of
            each forward and backward call it made, in order (seconds)."""
            spent["forward"].clear()
            spent["backward"].clear()
            result = benchmark_attention(known_cost, 2, 16, 8, n_warmup=warmup_calls, n_repeat=2)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # every event recorded
            return {"result": result, "forward_s": [seconds(*call) for call in spent["forward"]],
                    "backward_s": [seconds(*call) for call in spent["backward"]], "warmup_calls": warmup_calls}

        def oom_in_backward(q, k, v):
            out = toy_attention(q, k, v)

            def fail(grad):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory in backward (simulated by the test)")

            out.register_hook(fail)
            return out

        def host_out_of_memory(q, k, v):
            raise MemoryError("host out of memory (simulated by the test)")

        def broken(q, k, v):
            raise ValueError("a bug, not a lack of memory")

        def shape_error(q, k, v):  # a RuntimeError that is not an out-of-memory error
            return toy_attention(q, k[..., :-1], v)

        return {"recording": recording, "recorded": lambda: dict(seen), "benchmark_known_cost": benchmark_known_cost,
                "oom_in_backward": oom_in_backward, "host_out_of_memory": host_out_of_memory, "broken": broken,
                "shape_error": shape_error}

    fns = attention_functions(_toy_attention, forward_s, backward_s, forward_bytes, backward_bytes, warmup_s)
    with check("q, k, v of shape (batch_size, seq_len, 1, d_model), the requested dtype, requiring gradients; real "
               "backward passes; positive latencies; peak memory in GB of the forward and backward pass", weight=2):
        batch, seq, d = 3, 40, 8
        what = "benchmark_attention(attn_fn, 3, 40, 8, dtype=torch.float64)"
        result = benchmark_attention_result(
            benchmark_attention(fns["recording"], batch, seq, d, dtype=torch.float64, n_warmup=1, n_repeat=3), what)
        seen = fns["recorded"]()
        assert_label(result["status"], "ok", f"{what}['status']", choices=("ok", "oom"))
        assert seen["shapes"] == {((batch, seq, 1, d),) * 3}, (
            f"q, k and v must have shape (batch_size, seq_len, 1, d_model) = {(batch, seq, 1, d)}, got {seen['shapes']}")
        assert seen["dtypes"] == {torch.float64}, f"q, k, v must have the requested dtype float64, got {seen['dtypes']}"
        assert seen["requires_grad"] == {(True, True, True)}, (
            f"with backward=True, q, k and v must require gradients, got {seen['requires_grad']}")
        assert seen["backward"] >= 3, f"backward_ms must time real backward passes (>= n_repeat = 3), saw {seen['backward']}"
        for key in ("forward_ms", "backward_ms"):
            assert as_real(result[key], f"{what}['{key}']") > 0, f"{what}['{key}'] must be positive, got {result[key]!r}"
        scores_gb = batch * seq * seq * 8 / 1e9  # one float64 score matrix
        peak = as_real(result["peak_memory_gb"], f"{what}['peak_memory_gb']")
        assert peak >= scores_gb, (
            f"peak_memory_gb must measure the forward and backward pass (benchmark_memory), in GB: this attention holds "
            f"at least one {batch} x {seq} x {seq} float64 matrix ({scores_gb!r} GB), got {peak!r}")

    with check("backward=False: no backward pass, inputs without gradients, backward_ms NaN, the rest measured", weight=1):
        fns = attention_functions(_toy_attention, forward_s, backward_s, forward_bytes, backward_bytes, warmup_s)  # a new record
        what = "benchmark_attention(attn_fn, 2, 24, 4, backward=False)"
        result = benchmark_attention_result(
            benchmark_attention(fns["recording"], 2, 24, 4, backward=False, n_warmup=1, n_repeat=2), what)
        seen = fns["recorded"]()
        assert_label(result["status"], "ok", f"{what}['status']", choices=("ok", "oom"))
        assert seen["backward"] == 0, "with backward=False no backward pass may run"
        assert seen["requires_grad"] == {(False, False, False)}, "with backward=False, q, k, v must not require gradients"
        assert_nan(result["backward_ms"], f"{what}['backward_ms']")
        for key in ("forward_ms", "peak_memory_gb"):
            assert math.isfinite(as_real(result[key], f"{what}['{key}']")), f"{what}['{key}'] must be measured"

    what = (f"benchmark_attention(f, 2, 16, 8, n_warmup=1, n_repeat=2) of a function f whose forward takes "
            f"{forward_s * 1e3:g} ms and allocates {forward_bytes:,} bytes, and whose backward takes {backward_s * 1e3:g} "
            f"ms and allocates {backward_bytes:,} bytes, after a first (warm-up) call of each that takes {warmup_s * 1e3:g} ms")
    known = {}

    def timed_bounds(kind):
        """(low, high) in ms for a latency per timed call of `kind`: between the shortest later call and the longest
        one plus half the shortest (what runs around a call); the warm-up calls left out."""
        later = known[kind][known["warmup_calls"]:]
        assert later, f"{what}: benchmark_attention made no {kind} call after the warm-up"
        return min(later) * 1e3 * (1 - 1e-3), (max(later) + 0.5 * min(later)) * 1e3

    with check("forward_ms: the measured latency per forward call, the warm-up left out (known-cost function)", weight=1):
        run = as_dict(fns["benchmark_known_cost"](), what)
        known["result"] = result = benchmark_attention_result(run["result"], what)
        assert_label(result["status"], "ok", f"{what}['status']", choices=("ok", "oom"))
        known["forward"], known["backward"] = ([as_real(t, "a call's duration") for t in run[f"{key}_s"]]
                                               for key in ("forward", "backward"))
        known["warmup_calls"] = as_integer(run["warmup_calls"], "the known-cost function's warm-up calls")
        assert known["forward"] and known["backward"], (
            f"{what}: benchmark_attention must call f and run its backward pass; it made {len(known['forward'])} "
            f"forward and {len(known['backward'])} backward calls")
        low, high = timed_bounds("forward")
        forward_ms = as_real(result["forward_ms"], f"{what}['forward_ms']")
        assert low <= forward_ms < high, (
            f"{what}: forward_ms must be the measured latency per timed forward call in ms (the warm-up left out, not "
            f"a total): at least {low!r} (the shortest later call) and below {high!r}; got {forward_ms!r}")
    with check("backward_ms: the backward pass alone, per call, its forward call outside the timed region, the warm-up "
               "left out", weight=1):
        assert known, "the known-cost benchmark did not run (see the check above)"
        low, high = timed_bounds("backward")
        backward_ms = as_real(known["result"]["backward_ms"], f"{what}['backward_ms']")
        assert low <= backward_ms < high, (
            f"{what}: backward_ms must time the backward pass alone per timed call (its forward call outside the timed "
            f"region, the warm-up left out, not a total), in ms: at least {low!r} (the shortest later call) and below "
            f"{high!r}; got {backward_ms!r}")
    with check("peak_memory_gb: the peak of one forward and backward pass, in GB (1e9 bytes)", weight=1):
        assert known, "the known-cost benchmark did not run (see the checks above)"
        low, high = backward_bytes / 1e9, 2 * backward_bytes / 1e9
        peak = as_real(known["result"]["peak_memory_gb"], f"{what}['peak_memory_gb']")
        assert low <= peak < high, (
            f"{what}: peak_memory_gb must be the peak of one forward and backward pass in GB (1e9 bytes), between "
            f"{low!r} and {high!r}; got {peak!r}")
    with check("out of memory in the backward pass, and a host MemoryError: status 'oom' with NaN numbers", weight=1):
        for name, what in (("oom_in_backward", "an out-of-memory error in the backward pass"),
                           ("host_out_of_memory", "a MemoryError")):
            result = benchmark_attention_result(benchmark_attention(fns[name], 2, 16, 8, n_warmup=1, n_repeat=2),
                                                f"benchmark_attention for {what}")
            assert_label(result["status"], "oom", f"benchmark_attention for {what}: status", choices=("ok", "oom"))
            for key in ("forward_ms", "backward_ms", "peak_memory_gb"):
                assert_nan(result[key], f"benchmark_attention for {what}: {key}")
    with check("errors other than out-of-memory propagate: a ValueError, and a RuntimeError from a shape mismatch",
               weight=1):
        for name, error, what in (("broken", ValueError, "a ValueError"),
                                  ("shape_error", RuntimeError, "a RuntimeError from mismatched shapes in einsum")):
            try:
                result = benchmark_attention(fns[name], 2, 16, 8, n_warmup=1, n_repeat=2)
            except error:
                continue
            raise AssertionError(
                f"benchmark_attention must let errors other than out-of-memory propagate: an attn_fn that raises {what} "
                f"(not an out-of-memory error) must not be reported as {result!r}. Catch torch.OutOfMemoryError and "
                f"MemoryError (or use run_oom_safe), not every RuntimeError")


_q5_1_hidden_tests()
del _q5_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 5.1")


# %% [markdown]
# ### The sweep
#
# At teaching scale this runs the 15 configurations of the table for each implementation (about half a minute on an
# H200, compiling included); at cpu scale 3 configurations of three implementations (about 13 s on a 2-core
# machine). A configuration that runs out of memory is a result, shown as OOM in the tables and left out of the
# plots (their legend says where); an implementation whose answer is not written yet, or raises, leaves its rows
# empty and the sweep goes on.
# `scores_gb` is the size of one `batch x seq_len x seq_len` matrix in the dtype measured (bf16 on a GPU,
# float32 on a CPU), the unit in which to read the eager memory; `memory_ratio` is the peak divided by it.
# `forward_tflops` is the forward pass's achieved TFLOP/s: the FLOPs of your `attention_cost` (Question 3.2;
# one head, so `heads=1` and `head_dim=d_model`) divided by the measured `forward_ms`. The closing section of
# the lab places these points on the roofline.

# %%
attn_batch = 8
attn_d_models = at_scale(teaching=[32, 64, 128], quick=[16], cpu=[32])
attn_seq_lens = at_scale(teaching=[256, 1024, 4096, 8192, 16384], quick=[64, 128], cpu=[256, 512, 1024])
attn_dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
attn_bytes = torch.finfo(attn_dtype).bits // 8
attn_warmup, attn_repeat = at_scale(teaching=(2, 8), quick=(1, 2), cpu=(1, 3))

attention_impls = {"eager": (einsum_attention, True)}
if run_compiled:
    attention_impls["torch.compile"] = (torch.compile(einsum_attention), True)
else:
    print("torch.compile runs on a GPU at teaching scale only: no compiled rows here (measured_runs.md beside this "
          "notebook has the H200's).")
attention_impls["FlashAttention"] = (flash_attn_func, True)
if TRITON_AVAILABLE and DEVICE.type == "cuda":
    attention_impls["Triton (yours)"] = (lambda q, k, v: triton_attention_forward(q, k, v)[0], False)
else:
    attention_impls["tiled (yours, PyTorch)"] = (lambda q, k, v: tiled_attention_forward(q, k, v)[0], False)
    print("Triton rows need a GPU (the interpreter's timings would mean nothing; measured_runs.md beside this "
          "notebook has the H200's): your tiled PyTorch forward of Question 4.2 takes their place.")

attention_cases = [(d_model, seq_len, impl) for d_model in attn_d_models for seq_len in attn_seq_lens
                   for impl in attention_impls]
attention_rows, attention_failed = [], {}  # impl -> why it was not measured
for d_model, seq_len, impl in progress(attention_cases, "attention configurations"):
    fn, has_backward = attention_impls[impl]
    result = {"status": "not run", "forward_ms": math.nan, "backward_ms": math.nan, "peak_memory_gb": math.nan}
    if impl not in attention_failed:
        try:  # run_oom_safe: an out-of-memory error your benchmark_attention let through is still a result
            status, measured = run_oom_safe(benchmark_attention, fn, attn_batch, seq_len, d_model, dtype=attn_dtype,
                                            backward=has_backward, n_warmup=attn_warmup, n_repeat=attn_repeat)
            result = {**result, "status": "oom"} if status == "oom" else {**result, **dict(measured)}
        except Exception as exc:  # noqa: BLE001 - an answer not written yet, or one that raises: its rows stay empty
            attention_failed[impl] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(f"{impl}: not measured, benchmark_attention (Question 5.1) or the attention it times raised "
                  f"{attention_failed[impl]}; its rows stay empty")
    scores_gb = attn_batch * seq_len * seq_len * attn_bytes / 1e9
    forward_flops = your_answer("Question 3.2", lambda: attention_cost(attn_batch, seq_len, 1, d_model,
                                                                       attn_bytes)["flops"])
    attention_rows.append({"impl": impl, "d_model": d_model, "seq_len": seq_len, **result,
                           "scores_gb": scores_gb, "memory_ratio": result["peak_memory_gb"] / scores_gb,
                           "forward_tflops": forward_flops / (result["forward_ms"] * 1e-3) / 1e12})
attention_df = pd.DataFrame(attention_rows)
for column in ("forward_ms", "backward_ms", "peak_memory_gb", "memory_ratio", "forward_tflops"):
    digits = ".3g" if column == "forward_tflops" else ".3f"  # a CPU's TFLOP/s are small numbers
    print(f"\n{column} (rows: d_model, seq_len; OOM = out of memory, - = no backward)")
    print(mark_oom(attention_df, float_format=lambda x: f"{x:{digits}}")
          .pivot(index=["d_model", "seq_len"], columns="impl", values=column).to_string())
print("\nstatus:", attention_df.groupby(["impl", "status"]).size().to_dict())

# %%
plot_d_model = 64 if 64 in attn_d_models else attn_d_models[-1]
plot_rows = attention_df[attention_df["d_model"] == plot_d_model]


def series_label(impl):
    """The implementation's name, with the sequence lengths at which it ran out of memory (left out of the plot)."""
    oom = plot_rows[(plot_rows["impl"] == impl) & (plot_rows["status"].astype(str).str.lower() == "oom")]
    return impl + (f" (out of memory at S = {', '.join(map(str, oom['seq_len']))})" if len(oom) else "")


fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
for ax, column, label in zip(axes, ("forward_ms", "backward_ms", "peak_memory_gb"),
                             ("forward latency (ms)", "backward latency (ms)", "peak memory (GB)")):
    series = {series_label(impl): plot_rows[plot_rows["impl"] == impl][column].tolist() for impl in attention_impls}
    if column == "peak_memory_gb":
        series["one B x S x S matrix"] = [attn_batch * s * s * attn_bytes / 1e9 for s in attn_seq_lens]
    plot_latency_vs_size(attn_seq_lens, series, xlabel="sequence length (tokens)", ylabel=label,
                         title=f"attention, batch {attn_batch}, d_model {plot_d_model}", logx=True, ax=ax)
plt.show()

# %% [markdown]
# #### Question 5.2 (8 points)
#
# From your tables and plots:
# 1. How does the eager peak memory grow with `seq_len`, and with `d_model`? Check it against
#    `batch x seq_len^2 x bytes`: how many such matrices does eager attention hold at its peak, and why that
#    many (what does autograd save for the backward)? Did anything run out of memory? (A classic report on this
#    benchmark says "memory scales linearly with sequence length" next to a table that grows 4x per doubling:
#    check yours.)
# 2. What does `torch.compile` gain over eager, for forward and backward, and where does it come from (what can
#    it fuse, what can it not avoid)? How does its memory compare?
# 3. How does the memory of FlashAttention and your Triton kernel compare with eager and compiled, and why? How
#    does the backward's cost compare with the forward's, and why? (Their forward latency is the subject of
#    Question 5.4, on the roofline.)
#
# Without a GPU: answer 1 and the memory half of 3 from your own CPU table (eager against your tiled forward),
# and the rest (compiled rows, the backward of FlashAttention) from the H200 tables in `measured_runs.md` beside
# this notebook, saying which numbers come from where.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_2_answer", "locked": false, "points": 8, "schema_version": 3, "solution": true, "task": false}
# (Numbers from the H200 run in `measured_runs.md`: bf16, batch 8, one head; d = 64 unless said.)
# 1. Eager memory grows **quadratically** with `seq_len`: x4 per doubling (1.09 GB at 4096, 4.32 GB at 8192,
#    17.2 GB at 16384) and is almost independent of `d_model` (17.21 GB at d = 32, 17.28 GB at d = 128: the
#    `S x S` matrices do not depend on it, Q, K, V and O are small). The memory ratio is 4.0: eager holds four
#    `B x S x S` bf16 matrices at its peak. The forward leaves the probabilities P saved for the backward (the
#    softmax's backward needs its output and `P V`'s backward needs P); the scores are freed once the softmax
#    has run; the backward then creates dP (the gradient of P) and dS (the gradient of the scores) while P is
#    alive, plus the softmax's temporary. So "memory scales linearly with sequence length" is wrong: the numbers
#    grow as S^2 and match 4 x batch x S^2 x 2 bytes (17.18 GB at 16384) to within 1%. Nothing ran out of memory
#    on the 141 GB H200; on an H100 capped at 16 GB (the course's memory-cap run, `reports/memory-caps-h100.md`,
#    standing for a 16 GB card) eager ran out of memory at 16384 for every d, and `torch.compile` at d = 32 and
#    64.
# 2. `torch.compile` **halves the memory** (ratio 2.0: 8.7 GB at 16384) because it fuses the scaling, softmax and its
#    backward into Triton kernels that do not keep the extra `S x S` temporaries, but latency barely improves: the
#    backward is faster at 16384 by less than a tenth (9.929 vs 10.728 ms), and the forward is *slower* there by
#    nearly 2 ms at every d (7.997 vs 6.146 ms at d = 32, 8.107 vs 6.249 at 64, 8.150 vs 6.295 at 128). A gap
#    that stays the same while the matmuls' work doubles with d lies in the `S x S` part of the work, and its size
#    is about that of one more pass over the score matrix: 8 x 16384^2 x 2 bytes = 4.3 GB take about 1.6 ms at the
#    bandwidth eager reaches, 87.97 TFLOP/s over 31.88 FLOP/byte (about 2.76e12 bytes a second). So the generated
#    softmax moves more bytes than eager's or moves them more slowly, for instance a reduction over rows of 16384
#    that do not fit in registers, generated as a loop that reads each row twice (max and sum, then the
#    normalisation) where eager's kernel reads it once. The run did not profile the compiled kernels, so which it is
#    is not measured; what it is not is overhead: a compiled wrapper costs microseconds per call, and recompilation
#    happens in the warm-up calls, outside the timed ones. The slowdown belongs to the longest rows only: at
#    S = 8192 the compiled forward was *faster* at every d (1.942 vs 2.578 ms at d = 32, 2.530 vs 2.605 at 64,
#    2.158 vs 2.618 at 128), which fits a code generator that changes its reduction strategy with the row length;
#    and at short sequences (S = 256-1024, 0.14-0.54 ms a call) neither wins consistently: launch and wrapper
#    overhead and noise set those times. It cannot fuse the two matmuls with the softmax between them, so the score
#    matrix still goes to HBM and back and P is still saved: memory and time stay quadratic; eager was already close
#    to memory-bound on that traffic, so there is little to gain.
# 3. FlashAttention and the Triton kernel never write the `S x S` matrix: memory is **linear** in S (at 16384,
#    51-202 MB for FlashAttention with its backward, 9-34 MB for the forward-only Triton kernel, across d = 32-128;
#    ratio 0.002-0.05 at 16384, falling as S grows): what they keep is Q, K, V, O, the log-sum-exp per query and
#    the gradients, each B x S x d; a tile of scores lives on chip only while its block is processed. Backward
#    over forward is under 2x for eager (10.7 vs 6.2 ms) and about 3x for FlashAttention (5.0 vs 1.8 ms): the
#    backward does 2.5x the matmul FLOPs (dV, dP, dQ, dK, and FlashAttention also recomputes S), which sets
#    FlashAttention's compute-bound ratio, while eager's backward, memory-bound, is dominated by reading and writing
#    P, dP and dS, a few more passes over S x S matrices than the forward's four.
#    (On a CPU the same shapes show: in the course's cpu-scale run (`measured_runs.md`), eager's peak memory was
#    0.007, 0.027 and 0.104 GB at S = 256, 512 and 1024, 4x per doubling, with a memory ratio of 3.375 falling to
#    3.094, about three float32 `S x S` matrices; `flash_attn_func`, which runs PyTorch's math path there, the
#    same; the tiled forward's 0.001-0.002 GB, a ratio falling from 0.445 to 0.052: linear in S.)
# === BEGIN MARK SCHEME ===
# 8 points:
# - 2: memory quadratic in seq_len, ~independent of d_model, checked against B S^2 bytes with a count of the
#   matrices held and a correct reason (scores + P during softmax, P saved for backward, dP/dS in backward);
#   corrects the "linear" claim; reports OOM rows if any.
# - 2: torch.compile's effect quantified (memory roughly halved, small or no latency gain, possibly a loss),
#   explained by fusing the elementwise/softmax work but not the two matmuls: the S x S matrix still goes through
#   HBM, memory still quadratic. Accept a measured speedup if the student's numbers show one and it is explained.
#   A compiled forward slower than eager at long sequences is explained by the generated kernels' traffic or
#   speed (an extra pass over the S x S matrix, a less efficient reduction, a kernel generated for dynamic
#   shapes): full marks, measured or reasoned from the size of the gap. Per-call overhead or recompilation as
#   the cause of a gap of milliseconds is wrong (microseconds per call; recompiling happens in the warm-up) and
#   does not earn the explanation half of these points.
# - 2: FlashAttention/Triton: linear memory in S (a small, falling memory ratio), explained by tiling/online
#   softmax (no S x S in HBM; only B x S x d tensors and the log-sum-exp are kept). Their latency is Question
#   5.4's: an answer that discusses it here earns nothing extra and loses nothing.
# - 2: backward/forward ratio (under 2x for eager, about 3x for FlashAttention in the H200 run) with a FLOP and
#   memory-traffic explanation.
# A CPU-only answer earns full marks when items 1 and the memory of 3 come from its own CPU table (quadratic
# eager, linear tiled forward) and the compiled and GPU latencies from measured_runs.md, each number said to
# come from where; GPU numbers neither measured nor taken from measured_runs.md do not earn the quantified points.
# === END MARK SCHEME ===

# %% [markdown]
# ## `torch.compile` on whole Transformers
#
# Attention is one part of a Transformer. How much does `torch.compile` gain on a whole model? The model below
# is a standard pre-norm decoder (RMSNorm, attention with your `einsum_attention` and `causal_mask`, a GELU
# MLP) at four sizes of the GPT-2/GPT-3 family, from "small" (~0.1B parameters) to 2.7B; we time a forward
# pass (inference, `torch.no_grad`) and a full training step (forward, cross-entropy loss, backward, AdamW
# step) with bf16 autocast, eager and compiled. Each row also says how fast that was: the model's matmul FLOPs
# (`transformer_forward_flops`; a training step does three times the forward's) divided by the time, in TFLOP/s
# and as a share of the GPU's bf16 peak, the forward's time per layer, and how many kernels one forward pass
# launches, eager and compiled (`count_cuda_kernels`; on a CPU, ATen operator calls: see below).
#
# We compile every Transformer block (`block.compile()`), which covers all of the model's compute except the
# embedding lookup and the output projection, instead of the model object: all blocks share one compiled graph,
# so compiling takes seconds instead of minutes for 48 layers, with the same kernels (PyTorch calls this
# *regional compilation*). On a GPU the cell takes about half a minute. At cpu scale one small model (4 layers,
# width 256, batch 4 x 128 tokens, float32) runs eager and compiled: compiling its forward and its training step
# takes about a minute on a busy 2-core machine (the cell says so). At quick scale a tiny model runs eager only.
#
# On a GPU the kernel counts show what Inductor fused: the compiled forward launches fewer, fused kernels. On a
# CPU there are no kernels to count, and the profiler sees only ATen operator calls: the C++ loops Inductor
# generates for the fused glue are not ATen calls, so they vanish from the count instead of showing up as fewer
# kernels. The compiled count on a CPU is what stayed a library call (the matmuls, mostly), and the drop from eager
# to compiled is the work that moved into generated code, not a count of fused kernels.

# %%
class TransformerBlock(nn.Module):
    """Pre-norm decoder block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.num_heads = num_heads
        self.attn_norm = nn.RMSNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(d_model)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, seq_len, 3, self.num_heads, -1).unbind(dim=2)
        attn = einsum_attention(q, k, v, mask=causal_mask(seq_len, device=x.device))
        x = x + self.out_proj(attn.reshape(batch, seq_len, d_model))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TransformerLM(nn.Module):
    """Decoder-only language model (no positional encoding: it does not change the cost)."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, d_ff):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff) for _ in range(num_layers))
        self.norm = nn.RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm(x))


# (d_model, num_layers, num_heads, d_ff)
model_sizes = at_scale(
    teaching={"small": (768, 12, 12, 3072), "medium": (1024, 24, 16, 4096), "xl": (1600, 48, 25, 6400),
              "2.7B": (2560, 32, 32, 10240)},
    quick={"tiny": (64, 2, 2, 256)},
    cpu={"4 x 256": (256, 4, 4, 1024)},
)
lm_vocab, lm_batch, lm_context = at_scale(teaching=(10_000, 4, 512), quick=(1000, 2, 32), cpu=(1000, 4, 128))
lm_warmup, lm_repeat = at_scale(teaching=(2, 5), quick=(1, 2), cpu=(1, 3))
lm_compiled = run_compiled or SCALE == "cpu"  # on a CPU too at cpu scale: Inductor fuses the glue there as well


def transformer_forward_flops(d_model, num_layers, d_ff, vocab, batch, context):
    """Matmul FLOPs of one forward pass (2 per multiply-add; norms, GELU, softmax count as zero).

    Per token and layer: QKV 6 d^2, output projection 2 d^2, MLP 4 d d_ff, and attention 4 S d (Q K^T and P V
    over all S keys: einsum_attention also computes the masked half); plus the LM head, 2 d vocab per token.
    """
    tokens = batch * context
    per_layer = tokens * (8 * d_model**2 + 4 * d_model * d_ff + 4 * context * d_model)
    return num_layers * per_layer + tokens * 2 * d_model * vocab


def kernels_per_call(fn):
    """Kernels that one call of fn launches, counted by the profiler. On a CPU, ATen operator calls: code that
    torch.compile generated (C++ loops) makes none and is not counted."""
    fn()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
    return count_cuda_kernels(prof)["total"]


def benchmark_transformer(d_model, num_layers, num_heads, d_ff):
    """Eager and compiled latency (ms) of a forward pass and a training step; compile times in seconds."""
    with torch.device(DEVICE):
        model = TransformerLM(lm_vocab, d_model, num_layers, num_heads, d_ff)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(lm_vocab, (lm_batch, lm_context + 1), device=DEVICE)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    autocast = torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=DEVICE.type == "cuda")

    def forward_only():
        with torch.no_grad(), autocast:
            return model(inputs)

    def train_step():
        with autocast:
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def synchronize():
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()

    forward_flops = transformer_forward_flops(d_model, num_layers, d_ff, lm_vocab, lm_batch, lm_context)
    row = {"params_M": sum(p.numel() for p in model.parameters()) / 1e6,
           "forward_eager_ms": benchmark_latency(forward_only, n_warmup=lm_warmup, n_repeat=lm_repeat),
           "step_eager_ms": benchmark_latency(train_step, n_warmup=lm_warmup, n_repeat=lm_repeat),
           "kernels_eager": kernels_per_call(forward_only)}
    row["ms_per_layer_eager"] = row["forward_eager_ms"] / num_layers
    row["forward_tflops_eager"] = forward_flops / (row["forward_eager_ms"] * 1e-3) / 1e12
    row["step_tflops_eager"] = 3 * forward_flops / (row["step_eager_ms"] * 1e-3) / 1e12
    if lm_compiled:
        torch._dynamo.reset()
        for block in model.blocks:
            block.compile()
        for name, fn in (("forward", forward_only), ("step", train_step)):
            start_s = time.perf_counter()
            fn()
            synchronize()
            row[f"compile_{name}_s"] = time.perf_counter() - start_s
            row[f"{name}_compiled_ms"] = benchmark_latency(fn, n_warmup=lm_warmup, n_repeat=lm_repeat)
        row["kernels_compiled"] = kernels_per_call(forward_only)
        row["forward_tflops_compiled"] = forward_flops / (row["forward_compiled_ms"] * 1e-3) / 1e12
        row["step_tflops_compiled"] = 3 * forward_flops / (row["step_compiled_ms"] * 1e-3) / 1e12
        row["forward_speedup"] = row["forward_eager_ms"] / row["forward_compiled_ms"]
        row["step_speedup"] = row["step_eager_ms"] / row["step_compiled_ms"]
    if DEVICE.type == "cuda":
        row["forward_pct_of_peak_eager"] = 100 * row["forward_tflops_eager"] / peak_bf16_tflops
        if lm_compiled:
            row["forward_pct_of_peak_compiled"] = 100 * row["forward_tflops_compiled"] / peak_bf16_tflops
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
    return row


if SCALE == "cpu":
    print("Timing a small model eager and compiled on the CPU: compiling its forward and training step takes about "
          "a minute on a 2-core machine. The GPU sizes are in measured_runs.md beside this notebook.")
elif not lm_compiled:
    print("torch.compile runs at teaching and cpu scale only: eager timings of a tiny model.")
transformer_rows = []
for size, config in progress(model_sizes.items(), "model sizes"):
    if DEVICE.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        status, row = run_oom_safe(benchmark_transformer, *config)
    except NotImplementedError:  # the model attends with your einsum_attention and causal_mask
        status, row = "not run", None
        print(f"{size}: not run, the model needs einsum_attention (Question 3.1) and causal_mask (Question 3.3), "
              "not written yet")
    transformer_rows.append({"size": size, "d_model": config[0], "layers": config[1], "status": status, **(row or {})})
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    torch._dynamo.reset()
transformer_df = pd.DataFrame(transformer_rows).set_index("size")
print(f"batch {lm_batch} x context {lm_context}, vocab {lm_vocab}, "
      + ("bf16 autocast" if DEVICE.type == "cuda" else "float32 (CPU)"))
with pd.option_context("display.width", 250):
    print(mark_oom(transformer_df, float_format=lambda x: f"{x:.3f}").T.to_string())
if DEVICE.type != "cuda" and lm_compiled:
    print("(kernels_* on this CPU count ATen operator calls: the C++ code Inductor generated for the compiled model "
          "makes none, so kernels_compiled is what stayed a library call, not a number of fused kernels)")

# %%
if lm_compiled and "forward_compiled_ms" in transformer_df:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    sizes = transformer_df.index.tolist()
    for ax, kind, title in zip(axes, ("forward", "step"), ("forward pass (no_grad)", "training step")):
        eager = transformer_df[f"{kind}_eager_ms"].tolist()
        compiled = transformer_df[f"{kind}_compiled_ms"].tolist()
        positions = range(len(sizes))
        ax.bar([p - 0.2 for p in positions], eager, width=0.4, label="eager")
        ax.bar([p + 0.2 for p in positions], compiled, width=0.4, label="torch.compile")
        for p, e, c in zip(positions, eager, compiled):
            if math.isfinite(e) and math.isfinite(c) and c > 0:
                ax.annotate(f"{e / c:.2f}x", (p, max(e, c)), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(list(positions), sizes)
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"{title}, batch {lm_batch} x {lm_context} tokens")
        ax.legend()
    plt.show()
else:
    print("The eager vs compiled plot needs the compiled timings (teaching or cpu scale, with einsum_attention and "
          "causal_mask written).")

# %% [markdown]
# #### Question 5.3 (8 points)
#
# From the table and plots: how much does `torch.compile` speed up the forward pass and the training step at
# each size, and how does that compare with what it did for attention alone (Question 5.2)? Use the TFLOP/s,
# the time per layer and the kernel counts to explain: are the big matmuls running near the GPU's peak, or is
# something else setting the time? Which parts of a Transformer can fusion speed up, how should their shares
# change with `d_model`, and why can a training step gain a different amount than a forward pass? Is there a
# clear trend with size in your numbers (mind the noise of 5 timed repeats: run the cell a second time and compare
# before you claim a direction)? Finally, name two ways to get more out of the compiler or the model here (for
# instance something from Parts 4-5, or a compile mode).
# Without a GPU: answer from the H200 table in `measured_runs.md` beside this notebook (say so), and add what your
# cpu-scale table shows (whether compiling helped there, and what its ATen call counts can and cannot show).

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_3_answer", "locked": false, "points": 8, "schema_version": 3, "solution": true, "task": false}
# (Numbers from the H200 run in `measured_runs.md` (the course's `reports/lab2-h200.md`): batch 4 x 512 tokens,
# bf16 autocast; the TFLOP/s follow from `transformer_forward_flops` and the times. The only other committed run
# of this cell, `reports/memory-caps-h100.md`, ran it on an H100 capped at 16 GB with two other labs sharing the
# GPU, and timed the two smaller models only: the larger ones ran out of memory.)
# - **Speedups, and how far to trust them.** In the H200 teaching run compile changed the forward by 0.939x
#   (small), 0.847x (medium), 2.085x (xl) and 1.504x (2.7B), and the training step by 1.663x, 1.302x, 2.131x and
#   1.264x. Each number is one run of 5 timed repeats. The capped H100 run is another GPU, so not a repeat, but it
#   shows how far a loaded machine moves these numbers: it printed forward_speedup 1.028 (small) and 2.077
#   (medium), step_speedup 1.276 and 1.544, with medium's forward_eager_ms at 27.181 there against 14.600 on the
#   H200, for the same kernels. So for the forward of the small and medium models the run does not say whether
#   compiling helps (a little below 1 on the H200, at or above 1 on the loaded H100); their training step was
#   faster compiled in both runs (1.3-1.7x), a direction that holds that far; xl and 2.7B (1.3-2.1x faster
#   compiled, forward and step) were measured once, on one GPU. What does not depend on the noise is below: the
#   kernel counts and how far every forward is from the peak. Attention alone gained little or lost in Question
#   5.2 (memory halved), where the two matmuls around the softmax cannot be fused and eager was already
#   memory-bound on the S x S traffic; a whole block has more fusible glue per matmul.
# - **The matmuls are not running at their roof.** The forward's matmul FLOPs per layer take 0.03 ms (small) to 0.34 ms
#   (2.7B) at the bf16 peak, yet eager took 0.6-1.2 ms per layer, and the forward reached only about 5% (small) to 29%
#   (2.7B) of the 989.4 TFLOP/s peak. A time per layer that less than doubles from small to 2.7B while d_model^2 grows
#   elevenfold is not set by FLOPs or bytes: the GPU waits while Python and the dispatcher launch the layer's kernels
#   one by one (about 31 per layer in eager: 379 for the small model's 12 layers, from RMSNorm as several kernels, the
#   autocast casts of every weight, the causal mask rebuilt, masked_fill, softmax, GELU, residual adds). Eager is
#   **launch/CPU-bound**, most of all for the small model.
# - **What compile changes.** Inductor fuses the glue of a block (norms, casts, mask, softmax, GELU, adds) into a few
#   Triton kernels: the compiled forward launches about a third fewer kernels (247 against 379 for the small model, 487
#   against 751 for medium, the same in the capped H100 run; 711 against 1063 for 2.7B) and moves less data, with less
#   Python per layer; the matmuls stay cuBLAS calls. That is where a gain can come from, and it is not free: each call
#   of a compiled block also runs Dynamo's guard checks and Inductor's wrapper, which weigh most where a layer does
#   little work, so for the small and medium models the two effects are of a size that these runs cannot tell apart. The
#   compiled forward reached 29-43% of peak only at xl and 2.7B (22.110 ms for 48 layers and 25.081 ms for 32), where
#   the matmuls are big enough to fill part of that time.
# - **Shares with d_model.** Matmul FLOPs grow as d^2 per token (24 d^2 with d_ff = 4d, against 4 S d for
#   attention and O(d) for the glue), so with width the matmuls take a growing share and the fusible glue a
#   shrinking one: compile's relative gain should fall with size once the GPU, not the CPU, sets the time. The
#   H200 run does not show that fall: the forward gained nothing at small and medium and most at xl and 2.7B. That
#   fits the other effect: where a layer does little work, the compiled call's guards and wrapper cost about what
#   fusion saves, and only at xl and 2.7B is there enough work per layer for the saved launches and traffic to
#   show; the fall with d_model would come at widths beyond these. The small end is also where a loaded machine
#   (Python, the launch queue, other processes on the GPU) moves the time from call to call, by more than the
#   differences between sizes (the capped H100 run). One run of five repeats per number cannot separate a trend
#   from that; repeated runs, or CUDA Graphs to take the launches out, would.
# - **Training step vs forward.** The step adds the backward (twice the forward's matmul FLOPs, plus the fused
#   glue's backward), which gives the GPU more work per launch, and the AdamW update, a memory-bound pass over
#   all parameters and optimizer states that we did not compile: the step gains a different amount than the
#   forward (more where the forward was purely launch-bound, less where the uncompiled optimizer dominates).
# - **More from the compiler or the model:** CUDA Graphs (`mode="reduce-overhead"`) to remove the launch overhead
#   that dominates here; larger batches or longer contexts so each kernel does more work; replace
#   `einsum_attention` by a fused attention (`F.scaled_dot_product_attention`, FlashAttention, or the Triton
#   kernel) so the S x S matrix never reaches HBM; compile the optimizer step or use the fused AdamW
#   (`fused=True`); `mode="max-autotune"` for matmul templates with fused epilogues (GELU into the MLP's first
#   matmul).
#
# (On a CPU: in the course's cpu-scale run (`measured_runs.md`, a loaded 2-core machine) compiling made the small
# model faster, forward_speedup 1.299 and step_speedup 1.103 (one run of five repeats on a loaded machine), and its
# count fell from 87 to 27. Those counts are
# ATen calls: the 27 are what stayed library calls, and the glue moved into C++ loops that Inductor generated and
# the count does not see, so the drop is not a number of fused kernels.)
# === BEGIN MARK SCHEME ===
# 8 points:
# - 2: speedups quantified for forward and training step, by size, and compared with attention alone (Question 5.2).
# - 2: uses the achieved TFLOP/s (a small fraction of peak) and the time per layer (growing far less than
#   d_model^2) to conclude that eager is launch/CPU-bound, not limited by the matmuls' roof; the gain of compile
#   comes from fusing the memory-bound glue into fewer kernels (the kernel counts), while the matmuls stay
#   library calls. An answer that says the matmuls are compute-bound and near their roof, against the table,
#   does not earn these 2 points.
# - 2: expected trend with size (matmul share grows with d_model) and forward vs step (backward matmuls,
#   optimizer not compiled / memory-bound) explained; honest about noise where the numbers show no trend. Either
#   direction for the small and medium models' forward is accepted when the answer says how far it trusts it (the
#   H200 teaching run printed forward_speedup 0.939 and 0.847; the capped H100 run, another GPU shared with two
#   other labs, 1.028 and 2.077); a direction claimed firmly from one run of 5 repeats, without a second run or a
#   word on the noise, loses 1 of these 2 points. A rise of the gain from small to xl is explained either way
#   that is physically right (the per-call wrapper hidden by more work per layer; less launch-bound eager).
# - 2: two sensible improvements (CUDA graphs, batch size, fused attention, compiled/fused optimizer,
#   max-autotune epilogues, ...).
# A CPU-only answer takes the H200 numbers from measured_runs.md (saying so) and earns full marks with the same
# reasoning; its own cpu-scale table may add whether compiling helped on the CPU. Its kernel counts are ATen calls:
# reading the compiled count as fused kernels is a misreading (Inductor's C++ code is not counted) to correct in
# feedback, not a lost point. Accept numbers from other GPUs and explanations consistent with the student's own
# table.
# === END MARK SCHEME ===

# %% [markdown]
# ## Attention on the roofline
#
# Question 3.2 predicted where attention sits on the roofline; the sweep of Question 5.1 measured it. The cell
# below puts both on one picture, with no new timing: each implementation at the arithmetic intensity your
# `attention_cost` gives for the round trips of the `S x S` matrix it makes, and at the achieved TFLOP/s of its
# forward pass (`forward_tflops` in the sweep's table). The filled marker on the roof is what the model predicts
# at that intensity; the hollow marker below it, with its TFLOP/s, is what was measured. Panels: the longest and
# the shortest sequence of the sweep, at one `d_model`, and, when an implementation ran out of memory at the
# longest, also the longest sequence at which every implementation ran (an implementation without a measurement
# is drawn on the roof only, named with what happened).
#
# Round trips of the `(B, H, S, S)` matrix in each forward pass, in units of the sweep's dtype (bf16 on a GPU):
# - eager `einsum_attention`, `flash_attn_func` and your Triton kernel or tiled forward: **counted** on the PyTorch
#   operations each one runs, here, at a small size: the bytes they write to and read from tensors as large as the
#   `(B, H, S, S)` matrix, over one write and one read of that matrix. For eager, expect Question 3.2's four kernels
#   less the `masked_fill` the sweep does not run (it passes no mask). A softmax computed in float32 and cast back
#   (Question 3.1's hint) counts more in bf16: the scores are cast to float32 and the probabilities back, each cast
#   a kernel of its own, and the float32 matrices weigh twice as much as bf16 ones (on a CPU the sweep is in
#   float32 already, and the hint adds nothing). The kernels that never write the matrix count 0;
# - `torch.compile`: taken, not counted (its kernels are generated code, which the count cannot see): the two
#   products stay library matmuls, so the scores go to HBM and back and the probabilities too, and Inductor folds
#   the elementwise work on the scores (a scaling, a cast) and the softmax into one generated kernel between them,
#   assumed to read each row once;
# - at 0 round trips Question 3.2's ideal, $S/2$ FLOP/byte, holds only if each K and V tile comes from HBM once.
#   Your Triton kernel's programs read K and V once per query tile (Part 4), so its HBM traffic lies between that
#   ideal (every re-read served by the L2 cache) and Part 4's count without a cache (every re-read from HBM, about
#   `BLOCK_M` = 64 FLOP/byte). The cell draws your kernel at both: `Triton (yours), no cache` is the same
#   measurement placed at Part 4's count.
#
# On a CPU the cell draws the GPU's roofline (an H100 stands in, as in Part 1) with the predicted intensities
# only, since CPU timings under a GPU's roof would mean nothing, and prints this machine's achieved TFLOP/s; the
# H200's achieved TFLOP/s are in the sweep's tables of `measured_runs.md` beside this notebook (read them against
# the H200's roof, 989.4 TFLOP/s and 4.8 TB/s, not the stand-in's).

# %% nbgrader={"grade": false, "grade_id": "roofline_traffic", "locked": true, "schema_version": 3, "solution": false, "task": false}
# How many times the (B, H, S, S) matrix goes through memory, counted on the PyTorch operations an attention runs
# (definitions only: the next cell calls them on your implementations).
class SquareMatrixTraffic(TorchDispatchMode):  # TorchDispatchMode and tree_leaves: imported with the memory probe
    """`with SquareMatrixTraffic(numel) as traffic:` adds up the bytes that PyTorch operations inside the block read
    from and write to tensors of at least `numel` elements (`traffic.bytes`); views and allocations, which move no
    data, are left out. Code PyTorch does not run itself (a Triton kernel, generated code) is not seen."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.bytes = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name().split(".")[0]
        if not func.is_view and not name.startswith("aten::empty") and name not in LargestTensorProbe.VALUE_FREE_OPS:
            for tensor in tree_leaves((args, kwargs)) + tree_leaves(out):  # what it reads, then what it writes
                if torch.is_tensor(tensor) and tensor.numel() >= self.numel:
                    self.bytes += tensor.numel() * tensor.element_size()
        return out


def square_matrix_round_trips(attn_fn, head_dim, dtype, batch=2, seq_len=256):
    """Round trips of the (B, H, S, S) matrix that one call of attn_fn makes, counted on the PyTorch operations it
    runs for q, k, v of shape (batch, seq_len, 1, head_dim) in `dtype` on DEVICE: the bytes they move to and from
    tensors of batch x seq_len^2 elements or more, over one write and one read of such a matrix in `dtype`."""
    q, k, v = (torch.randn(batch, seq_len, 1, head_dim, device=DEVICE, dtype=dtype) for _ in range(3))
    with torch.no_grad(), SquareMatrixTraffic(batch * seq_len * seq_len) as traffic:
        attn_fn(q, k, v)
    return traffic.bytes / (2 * batch * seq_len * seq_len * torch.empty((), dtype=dtype).element_size())


def tiled_no_cache_bytes(batch, seq_len, head_dim, block_m=64, bytes_per_element=2):
    """HBM bytes of a tiled forward whose K/V re-reads all come from HBM (Part 4): Q read and O written once, K and V
    read once per query tile of block_m queries."""
    tiles = math.ceil(seq_len / block_m)
    return batch * (2 * seq_len * head_dim + 2 * seq_len * head_dim * tiles) * bytes_per_element


# %%
try:  # Question 3.2's count, less the masked_fill the sweep does not run
    eager_round_trips = einsum_round_trips - 1
    eager_round_trips = float(eager_round_trips)
except (TypeError, ValueError):
    eager_round_trips = math.nan
    print(f"einsum_round_trips (Question 3.2) is not a number yet ({einsum_round_trips!r})")
uncounted = {"torch.compile": 2, "eager": eager_round_trips,  # where the count cannot run: the text's numbers
             "FlashAttention": 0 if DEVICE.type == "cuda" else eager_round_trips}
attention_round_trips = {}
for impl, (fn, _) in attention_impls.items():
    if impl == "torch.compile":
        attention_round_trips[impl] = uncounted[impl]  # generated code: not counted (see the text above)
        continue
    try:
        attention_round_trips[impl] = square_matrix_round_trips(fn, plot_d_model, attn_dtype)
    except Exception as exc:  # noqa: BLE001 - an answer not written yet, or one that raises: the text's count instead
        attention_round_trips[impl] = uncounted.get(impl, 0)
        print(f"{impl}: its round trips could not be counted ({type(exc).__name__}: {str(exc)[:200]}); "
              f"taken as {attention_round_trips[impl]:g}")
print("round trips of the (B, H, S, S) matrix, counted on the operations each implementation runs (torch.compile: "
      "taken as 2): " + ", ".join(f"{impl} {trips:g}" for impl, trips in attention_round_trips.items()))
counted_eager = attention_round_trips.get("eager", math.nan)
if math.isfinite(eager_round_trips) and math.isfinite(counted_eager) and counted_eager != eager_round_trips:
    print(f"Your einsum_attention makes {counted_eager:g} round trips without a mask, where Question 3.2's four "
          f"kernels less the masked_fill make {eager_round_trips:g} (your einsum_round_trips less one): the picture "
          "uses what your code moves")

status_at = {(row.impl, row.seq_len): str(row.status).lower()
             for row in attention_df[attention_df["d_model"] == plot_d_model].itertuples()}
everything_ran = [s for s in attn_seq_lens if all(status_at.get((impl, s)) == "ok" for impl in attention_impls)]
roofline_seq_lens = [max(attn_seq_lens)]
if everything_ran and max(everything_ran) not in (max(attn_seq_lens), min(attn_seq_lens)):
    roofline_seq_lens.append(max(everything_ran))
    missing = [impl for impl in attention_impls if status_at.get((impl, max(attn_seq_lens))) != "ok"]
    print(f"At S = {max(attn_seq_lens)}, {', '.join(missing)} did not run "
          f"({', '.join(status_at.get((impl, max(attn_seq_lens)), '?') for impl in missing)}): the picture adds "
          f"S = {max(everything_ran)}, the longest sequence at which every implementation ran")
if min(attn_seq_lens) not in roofline_seq_lens:
    roofline_seq_lens.append(min(attn_seq_lens))

roofline_rows = []
for seq_len in roofline_seq_lens:
    placements = [(impl, impl, attention_round_trips[impl], None) for impl in attention_impls]
    if "Triton (yours)" in attention_impls:  # the same measurement at Part 4's count without a cache
        placements.append(("Triton (yours), no cache", "Triton (yours)", math.nan,
                           tiled_no_cache_bytes(attn_batch, seq_len, plot_d_model)))
    for name, impl, trips, hbm_bytes in placements:
        measured = attention_df[(attention_df["impl"] == impl) & (attention_df["d_model"] == plot_d_model)
                                & (attention_df["seq_len"] == seq_len)].iloc[0]
        flops = your_answer("Question 3.2", lambda: attention_cost(attn_batch, seq_len, 1, plot_d_model, 2)["flops"])
        if hbm_bytes is None:  # yours, Question 3.2, at the round trips counted above (bf16, the roofline's dtype)
            intensity = your_answer("Question 3.2", lambda: attention_cost(
                attn_batch, seq_len, 1, plot_d_model, 2, score_round_trips=trips)["intensity"]) \
                if math.isfinite(trips) else math.nan
        else:
            intensity = flops / hbm_bytes
        roof_tflops = min(peak_bf16_tflops, bandwidth_tb_s * intensity) if math.isfinite(intensity) else math.nan
        roofline_rows.append({"seq_len": seq_len, "impl": name, "status": measured["status"], "round_trips": trips,
                              "intensity_flop_per_byte": intensity, "roof_tflops": roof_tflops,
                              "forward_tflops": measured["forward_tflops"],
                              "pct_of_roof": (100 * measured["forward_tflops"] / roof_tflops
                                              if DEVICE.type == "cuda" else math.nan)})
roofline_df = pd.DataFrame(roofline_rows)
print(f"batch {attn_batch}, one head, d_model {plot_d_model}; roof of {roofline_gpu} (bf16): "
      f"{peak_bf16_tflops:g} TFLOP/s, {bandwidth_tb_s:g} TB/s"
      + ("" if DEVICE.type == "cuda" else "; forward_tflops measured on this CPU (float32), pct_of_roof only on a GPU"))
print(mark_oom(roofline_df, float_format=lambda x: f"{x:.4g}").to_string(index=False))

fig, axes = plt.subplots(1, len(roofline_seq_lens), figsize=(8 * len(roofline_seq_lens), 6.5), squeeze=False)
for ax, seq_len in zip(axes[0], roofline_seq_lens):
    operations = {}
    for row in roofline_df[roofline_df["seq_len"] == seq_len].itertuples():
        status = str(row.status).lower()
        name = row.impl if DEVICE.type == "cuda" or row.impl != "FlashAttention" else "FlashAttention (math path)"
        name = name if status == "ok" else f"{name} ({'out of memory' if status == 'oom' else status})"
        measured_here = DEVICE.type == "cuda" and status == "ok"
        operations[name] = (row.intensity_flop_per_byte, row.forward_tflops) if measured_here \
            else row.intensity_flop_per_byte
    plot_roofline_measured(roofline_gpu, peak_bf16_tflops, bandwidth_tb_s, operations, ax=ax,
                           title=f"attention forward, S = {seq_len}, d = {plot_d_model}, batch {attn_batch}, "
                                 f"on {roofline_gpu}")
plt.show()

# %% [markdown]
# #### Question 5.4 (9 points)
#
# Read the picture and its table, at the longest sequence (or, when eager or compiled ran out of memory there, at
# the longest sequence where everything ran; say what ran out of memory) and at the shortest:
# 1. Where does each implementation sit relative to the roof at its intensity? Quote the achieved TFLOP/s and the
#    share of the roof (`pct_of_roof`). Which are memory-bound and which compute-bound by the model, and do the
#    measurements agree?
# 2. Eager and `torch.compile` sit at the same intensity. Why does compiling not move the point to the right, and
#    what would? If the compiled point is lower than eager's, what can make code that makes the same round trips
#    slower?
# 3. Your Triton kernel is drawn twice: at the ideal ($S/2$) and at Part 4's count without a cache. Where is the
#    measured point relative to the roof at each, and what does that say about where its re-reads of K and V came
#    from? How much faster than eager did the model predict FlashAttention and your kernel to be (the ratio of the
#    roofs at their intensities), how much faster were they, and what keeps them below their roof?
# 4. At the shortest sequence, why is everything far below its roof, whatever its intensity?
#
# Without a GPU: take the H200's achieved TFLOP/s and times from the sweep's tables in `measured_runs.md` beside
# this notebook (`forward_tflops`, `forward_ms`; d_model 64), place them at the intensities your own cell computed,
# against the H200's roof (989.4 TFLOP/s, 4.8 TB/s; your cell drew the H100 that stands in for a GPU, 3.35 TB/s:
# say which roof you use), and add what your own table shows (the CPU's achieved TFLOP/s of eager against your
# tiled forward).

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_4_answer", "locked": false, "points": 9, "schema_version": 3, "solution": true, "task": false}
# (Numbers from the H200 run: the sweep's tables in `measured_runs.md` and the roofline table of the course's
# `reports/lab2-h200.md`: bf16, batch 8, one head, d = 64 unless said; the achieved TFLOP/s are 4 x 8 x S^2 x d
# FLOPs over the forward time; the roof is min(989.4 TFLOP/s, 4.8 TB/s x intensity). Nothing ran out of memory on
# the 141 GB H200.)
# 1. **S = 16384.** Eager and compiled make two round trips of the S x S matrix: about 32 FLOP/byte (31.88; d/2
#    once S >> d), far left of the ridge (206 FLOP/byte): memory-bound, with a roof of 153 TFLOP/s. Eager reached
#    87.97 TFLOP/s (6.249 ms, 57.5% of its roof), compiled 67.81 TFLOP/s (8.107 ms, 44%). FlashAttention and the
#    Triton kernel make none: at the ideal, S/2 = 8192 FLOP/byte, far right of the ridge, compute-bound by the
#    model, with the full 989.4 TFLOP/s as roof; they reached 308.2 and 308 TFLOP/s (1.784 and 1.785 ms), 31% of
#    it. The measurements agree with the regimes: eager reaches over half of its memory roof (no kernel streams at
#    the datasheet's bandwidth: Lab 1's copy reached under nine tenths of it, and kernels that write S x S matrices
#    from a product with a 64-long inner dimension do less well), so its time is the S x S traffic; the tiled
#    kernels run twice as fast as the memory roof of anything that moves the S x S matrix twice (308 against 153).
# 2. Compiling changes which kernels run between the two products, not the products: Inductor keeps both as library
#    matmuls and fuses the softmax (with any scaling or cast of the scores) into one generated kernel, which still
#    reads the scores from HBM and writes the probabilities. Same round trips, same intensity, same memory roof. Its
#    point is lower than eager's, by nearly 2 ms at every d at S = 16384 (Question 5.2; at S = 8192 compiled was the
#    faster): the same round trips can take longer when the generated kernel reads the matrix more than once (a
#    softmax over rows of 16384 generated as a loop that reads each row twice) or reads it less efficiently; the
#    model counts one read. Per-call overhead (microseconds) and recompilation (in the warm-up calls) are not in
#    these milliseconds. Only a kernel that computes the two products and the softmax tile by tile, with the online
#    softmax (Part 4), removes the round trips and moves the point right.
# 3. Part 4's count without a cache gives the Triton kernel an intensity of 64 S / (S + 64) (BLOCK_M = 64, whatever
#    d), 63.75 at S = 16384, where the roof is 4.8 x 63.75 = 306 TFLOP/s: the measured 308 TFLOP/s is on that roof
#    (100.7% of it). No kernel streams from HBM at the datasheet's bandwidth (Lab 1's copy reached under nine tenths
#    of it), and at d = 128, at the same per-tile intensity, the kernel reached 335 TFLOP/s, above the 306 that no
#    kernel can beat. So HBM cannot have served every re-read: some of the K and V re-reads came from the L2 cache,
#    where the query tiles of one head, launched side by side, find the K and V tiles their neighbours just loaded
#    (4 MB per head at d = 64, far less than the 60 MB L2). How many, this run cannot say: on the H200 the point sits at
#    the per-tile roof, not far above it, so the evidence is that the cache served at least about a tenth of the
#    re-reads, not that HBM saw only the ideal. The ideal S/2 and the per-tile count bound the kernel's HBM traffic
#    from both sides. The model predicted 989.4 / 153, about six and a half times over eager (the ratio of the roofs
#    at their intensities); measured, FlashAttention and Triton were about three and a half times faster (6.249
#    against 1.784 and 1.785 ms). They sit at about a third of the peak because the roofline counts only matmul FLOPs
#    and bytes: every score also needs an exponential, a max and a rescaling, which run on the GPU's ordinary units
#    at a small fraction of the tensor cores' rate; with d = 64 each score carries only 4 x 64 FLOPs of matmul work
#    against that softmax work; and a simple kernel waits for its loads instead of overlapping them with the products
#    (FlashAttention-3 overlaps loads, matmuls and the softmax with asynchronous copies and warp specialisation to
#    get much closer to the peak).
# 4. At S = 256 one call does 0.13 GFLOP: at eager's roof (25.6 FLOP/byte, 122.9 TFLOP/s) that is under 2
#    microseconds, yet every implementation took 0.10-0.22 ms (0.6035-1.3 TFLOP/s, under 1% of its roof). The
#    time is launch and CPU overhead (Python, the dispatcher, compiled wrappers, a few microseconds per kernel and
#    more per call), which the roofline leaves out; and even the ideal intensity S/2 = 128 lies below the ridge, so
#    at short sequences the model calls FlashAttention memory-bound too. Fusion and tiling pay where the work is
#    large.
# (On a GPU with 16 GB, eager and compiled run out of memory at S = 16384 (the course's H100 run capped at 16 GB:
# eager at every d, compiled at d = 32 and 64): the picture then adds S = 8192, where items 1-3 read the same way.
# On a CPU the picture has the intensities only: eager at about d/2, the tiled forward at S/2; the table shows the
# CPU's own TFLOP/s, where the tiled forward, a Python loop over tiles, need not beat eager.)
# === BEGIN MARK SCHEME ===
# 9 points:
# - 2: item 1 at the longest sequence (or the longest where everything ran, saying what ran out of memory): eager
#   and compiled at about d/2 FLOP/byte (two round trips), memory-bound, reaching a good share of their memory
#   roof; FlashAttention/Triton at S/2, compute-bound by the model, at a fraction (about a third on an H200) of
#   the peak; numbers quoted (achieved TFLOP/s and share of the roof). 1 of the 2 for correct placements without
#   numbers.
# - 2: item 2: compile keeps the two matmuls and the S x S round trips (same intensity, same roof); a lower point
#   at the same intensity is explained by what the generated kernels do (more passes over the matrix, slower
#   reduction, kernels generated for dynamic shapes: reasoned or measured), not by a new regime; only fusing the
#   products with the softmax, tile by tile with the online softmax, moves the point right. Blaming the gap of
#   milliseconds on per-call overhead or recompilation earns 1 of the 2.
# - 3: item 3: (1) where the measured Triton point reaches or passes the roof at Part 4's per-tile count (on the
#   H200: 100.7% of it at d = 64, and 335 TFLOP/s against 306 at d = 128), HBM cannot have served every K/V
#   re-read at a bandwidth no kernel reaches: the L2 cache served some (the query tiles of one head run together),
#   so HBM traffic lies between the per-tile count and the ideal; full marks also for saying that a point at the
#   roof shows cache reuse but not how much; (2) predicted speedup as the ratio of the roofs (about 6.5 times on
#   an H200, 9 on an H100) against the measured one (about 3.5 times on the H200), and two sound reasons for the
#   gap (softmax exponentials/rescaling off the tensor cores, small head dimension, loads not overlapped with
#   compute, ...). 1 point for (1), 2 for (2). On a GPU where the point lies below the per-tile roof, (1) is
#   earned by saying that the measurement cannot tell how many re-reads the cache served.
# - 2: item 4: short sequences take microseconds at any roof, so launch/CPU overhead sets the time (the model leaves
#   it out); noting that S/2 is below the ridge at short S (FlashAttention memory-bound there too) is part of it.
# The numbers are read from the student's own table (or measured_runs.md, said so), with their intensities from
# their own attention_cost and the round trips counted on their own code: a correct reading of a picture built on
# an earlier mistake (Question 3.2) earns full marks here. A CPU-only answer that takes the H200's forward_tflops
# and forward_ms from measured_runs.md (saying so) and places them at its own intensities against the H200's roof
# earns full marks (its pct_of_roof is its own arithmetic); one that reads them against the H100 roof its cell
# drew as a stand-in, saying so, loses 1 point (two cards mixed: the per-tile roof of item 3 is then 214, not 306
# TFLOP/s); one that reads CPU timings against the GPU's roof loses the first 2 points.
# Numbers from another GPU, read against its own roof, are fine.
# === END MARK SCHEME ===
