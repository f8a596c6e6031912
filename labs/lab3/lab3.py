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
# # Lab 3: LLM Inference: FLOPs, Bytes, KV Cache and Speculative Decoding
#
# A language model generates text one token at a time, and every token costs a full pass through the network.
# In this lab you work out, with pen and paper turned into code, what such a pass costs: how many floating-point
# operations (FLOPs) it performs and how many bytes it moves between memory and the compute units. You use
# these counts to predict whether inference is limited by compute or by memory bandwidth, check the prediction
# against measurements on your own machine, and then implement the two ideas that make generation fast in
# practice: the **KV cache** and **speculative decoding**.
#
# ## Learning objectives
# By the end of this lab you will be able to:
# 1. implement **causal self-attention** and explain what its mask is for, and why recalling a fact from the
#    context needs (at least) two attention layers;
# 2. **count the FLOPs and bytes** of every operation in a Transformer layer under stated conventions, and
#    combine them into the cost of a whole model (GPT-2 XL);
# 3. use the **roofline model** to decide whether a forward pass is compute-bound or memory-bound, and predict
#    its latency from a GPU's datasheet;
# 4. explain what a **KV cache** stores, how big it is, and how it changes the FLOPs, the bytes and the
#    arithmetic intensity of decoding, and **implement** one (preallocated, written in place) with the cached
#    decode step of a GPT-2 model;
# 5. measure your cached and uncached decoding across sequence lengths, **plot them against your roofline
#    predictions** and explain the gaps;
# 6. explain why decoding one sequence at a time is bound by **reading the weights**, and implement
#    **speculative sampling**, whose output has exactly the target model's distribution.
#
# ## How this notebook works
# - Run it top to bottom. `utils.at_scale` picks the sizes of every cell that measures, by the scale in effect
#   (the environment report prints it): *teaching* on a GPU (the sizes the questions discuss), *cpu* on a machine
#   without a GPU (smaller sizes at which a laptop still shows each effect: recall needing two layers, the KV
#   cache's speedup growing with the length, a decode step of 8 sequences costing far less than 8 steps of one,
#   speculative decoding's tokens per pass and its output following the target, not the draft), and *quick* (tiny
#   sizes, which only check that the code runs: the autograder uses it). What only a GPU shows (CUDA graphs, GPT-2
#   XL in fp16) was measured on the course's H200: what that run printed is in `measured_runs.md` beside this
#   notebook, with the course's cpu-scale run; the questions that need it say so.
# - Write your code where it says `YOUR CODE HERE` and your written answers where it says `YOUR ANSWER HERE`.
#   Keep the names and signatures we give you: the tests call them.
# - Cells that check your code show a few public tests; the grader runs more (hidden) tests on inputs you have
#   not seen. Passing the public tests is necessary, not sufficient.
# - Units are in the names: `_s` seconds, `_ms` milliseconds, `_flops_per_s` FLOP/s, `_bytes_per_s` bytes/s.
#
# ## Points and time
# Autograded questions have one right answer (a function, a formula, a number). Written answers and plots are
# graded by a TA. Each part's row gives our estimate of a student's time for it, reading, coding and running
# included, and how long its cells ran at cpu scale in the course's run (`measured_runs.md` beside this notebook: 2
# cores of a virtual machine shared with other work (load average 2.4 to 3.09 while it ran), one PyTorch thread,
# compile caches cold as on a first run): 33 s for every cell. An idle machine is faster, a busier one slower. At
# teaching scale on the course's H200 every cell took 160 s, Parts 1 and 5 about a minute each. The whole lab: about
# 7 hours, plus about 45 minutes for the two bonus questions.
#
# | Question | Topic | Points |
# | --- | --- | --- |
# | **Part 1** | about 60 min (15 reading, 25 coding, 20 writing); its cells ran 6.7 s at cpu scale (training) | |
# | Question 1.1 | `causal_self_attention` | 6 |
# | Question 1.2 | why the causal mask (written) | 2 |
# | Question 1.3 | how many layers does recall need? (written) | 4 |
# | **Part 2** | about 75 min (20 reading the rules, 40 counting, 15 writing); runs in under a second | |
# | Question 2.1 | FLOPs and bytes of a matmul | 4 |
# | Question 2.2 | `layer_costs`: every operation of a layer, one table | 12 |
# | Question 2.3 | `roofline_estimate` | 3 |
# | Question 2.4 | MHA vs MLP on an A100 (written) | 3 |
# | **Part 3** | about 40 min; runs in under a second | |
# | Question 3.1 | GPT-2 XL forward pass without a cache | 6 |
# | Question 3.2 | `roofline_table` | 3 |
# | Question 3.3 | the four T4 cases (written) | 3 |
# | **Part 4** | about 110 min (Questions 4.1 to 4.3: 50; your KV cache, Question 4.5: 60); runs in under a second | |
# | Question 4.1 | KV cache size | 4 |
# | Question 4.2 | decoding with a KV cache: FLOPs and bytes | 8 |
# | Question 4.3 | the cache and arithmetic intensity (written) | 3 |
# | Bonus 4.4 | grouped-query attention and how many sequences fit (about 20 min) | 4 |
# | Question 4.5 | `StaticKVCache` and `gpt2_step`: your cache and cached decode step | 12 |
# | **Part 5** | about 50 min (10 coding, 15 plotting, 25 writing); its measurements ran 14.8 s at cpu scale | |
# | Question 5.1 | predicted latencies (code) | 2 |
# | Question 5.2 | your cached and uncached decode against the roofline: plot and answer | 6 |
# | **Part 6** | about 90 min; its cells ran 4.3 s at cpu scale | |
# | Question 6.1 | where a batch-1 decode step spends its time | 4 |
# | Question 6.2 | the bottleneck and speculative decoding (written) | 2 |
# | Question 6.3 | expected tokens per target pass | 2 |
# | Question 6.4 | `speculative_step` | 8 |
# | Question 6.5 | speculative decoding of the recall models (written) | 3 |
# | Bonus 6.6 | the best draft length (about 25 min) | 6 |
# | **Total** | | **100 + 10 bonus** |

# %% nbgrader={"grade": false, "grade_id": "setup_imports", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools
import math
import sys
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, ".")  # utils.py sits beside the notebook (and at the repository root when run as a script)
from utils import *
from checks import *

quiet_library_messages()  # hide library messages you cannot act on (profiler start/stop lines)
print_environment_report("lab3")
if SCALE == "cpu":
    # One thread per operator. This lab's cpu-scale operators are small: a second thread gains little on an idle machine,
    # and on a busy one (a laptop with a browser open, a shared server) every multi-threaded operator waits for its
    # slowest thread, which made the course's 2-core run many times slower and its timings erratic.
    torch.set_num_threads(1)
    print("cpu scale: PyTorch runs each operator on one thread (torch.set_num_threads(1)).")

# Your functions and classes that later cells use, and the question of each.
YOUR_FUNCTIONS = {
    "causal_self_attention": "Question 1.1", "matmul_flops": "Question 2.1", "matmul_bytes": "Question 2.1",
    "layer_costs": "Question 2.2", "roofline_estimate": "Question 2.3", "gpt2_forward_flops": "Question 3.1",
    "gpt2_forward_bytes": "Question 3.1", "roofline_table": "Question 3.2", "kv_cache_bytes_per_layer": "Question 4.1",
    "kv_cache_bytes_total": "Question 4.1", "gpt2_decode_flops": "Question 4.2", "gpt2_decode_bytes": "Question 4.2",
    "StaticKVCache": "Question 4.5", "gpt2_step": "Question 4.5", "predict_gpt2_latencies_ms": "Question 5.1",
    "plot_decode_against_roofline": "Question 5.2's plot", "decode_time_breakdown_s": "Question 6.1",
    "expected_tokens_per_pass": "Question 6.3", "speculative_step": "Question 6.4",
}


uses_answers = functools.partial(uses_answers, your_functions=YOUR_FUNCTIONS)  # utils: names your unwritten function

# %% nbgrader={"grade": false, "grade_id": "test_helpers", "locked": true, "schema_version": 3, "solution": false, "task": false} tags=["test-helpers"]
def _assert_count(fn, args, expected, hint=""):
    """Test helper: ``fn(*args)`` must be the whole number ``expected`` (checks.assert_integer: a Python int, a NumPy
    integer or a float without a fractional part); a wrong count's message adds ``hint``, the rules to re-read.

    Args:
        fn: the function under test (a FLOP or byte count).
        args: its positional arguments.
        expected (int): the right answer.
        hint (str): which counting rules to re-read when the answer is wrong.
    """
    try:
        assert_integer(fn(*args), expected, f"{fn.__name__}{tuple(args)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}. {hint}".strip()) from None


def _own_count(fn, *args):
    """Test helper: the whole number the student's function ``fn`` gives for ``args`` (checks.as_integer), for a check
    of the same test cell."""
    return as_integer(fn(*args), f"{fn.__name__}{args}")


def _keep_answers(name, fn, calls):
    """Test helper: carry an answer forward as it was graded (a mistake is charged once, in its own question). The
    test of the question that asks for ``fn`` keeps ``fn(*args)`` for every ``args`` of ``calls`` (None where it
    raises) under ``name``, with what was kept there before (checks.keep_carried); the later questions' tests read
    these values (``_kept_answer``) and never call the student's earlier function again."""
    def table():
        kept = dict(kept_carried(name) or {})
        kept.update({tuple(args): carried(fn, *args) for args in dict.fromkeys(tuple(args) for args in calls)})
        return kept

    keep_carried(name, table)


def _kept_answer(name, *args):
    """Test helper: what the student's function ``name`` gave for ``args`` when its own question was graded (kept by
    ``_keep_answers``). Raises LookupError when nothing was kept for them (``carried`` then gives None, and only the
    test's own expected value is accepted)."""
    value = (kept_carried(name) or {}).get(tuple(args))
    if value is None:
        raise LookupError(f"no kept value of {name}{tuple(args)}")
    return value


def _kept_count(name, *args):
    """Test helper: ``_kept_answer(name, *args)`` as a whole number (checks.as_integer)."""
    return as_integer(_kept_answer(name, *args), f"{name}{args}")


def _kept_real(name, *args):
    """Test helper: ``_kept_answer(name, *args)`` as a number (checks.as_real)."""
    return as_real(_kept_answer(name, *args), f"{name}{args}")


_LAYER_OPS = ("qkv_projection", "scores", "mask", "softmax", "attention_value", "output_projection", "mlp")


def _reference_layer_costs(B, N, D, H, n):
    """Test helper: the grader's layer_costs (Question 2.2): operation -> (flops, bytes) under the rules of Part 2."""
    d = D // H
    return {
        "qkv_projection": (6 * B * N * D * D, n * (6 * B * N * D + 3 * D * D)),
        "scores": (H * (2 * B * N * N * d + B * N * N), n * H * (2 * B * N * d + B * N * N)),
        "mask": (H * B * N * N, 2 * n * H * B * N * N),
        "softmax": (3 * H * B * N * N, 2 * n * H * B * N * N),
        "attention_value": (2 * H * B * N * N * d, n * H * (B * N * N + 2 * B * N * d)),
        "output_projection": (2 * B * N * D * D, n * (2 * B * N * D + D * D)),
        "mlp": (16 * B * N * D * D + 5 * B * N * D, n * (10 * B * N * D + 8 * D * D + 5 * D)),
    }


def _layer_rows(value, B, N, D, H, n):
    """Test helper: ``value``, what layer_costs(B, N, D, H, n) (Question 2.2) returned, as operation -> (flops, bytes)
    of Python ints (raises AssertionError when it is outside the contract: other keys, not pairs, not whole
    numbers)."""
    what = f"layer_costs{(B, N, D, H, n)}"
    table = as_dict(value, what)
    assert set(table) == set(_LAYER_OPS), (
        f"{what} must have exactly the keys {list(_LAYER_OPS)}, got {sorted(table, key=str)}")
    rows = {}
    for op in _LAYER_OPS:
        flops, nbytes = as_tuple(table[op], 2, f"{what}[{op!r}]")
        rows[op] = (as_integer(flops, f"{what}[{op!r}] flops"), as_integer(nbytes, f"{what}[{op!r}] bytes"))
    return rows


def _kept_layer_costs(B, N, D, H, n):
    """Test helper: the student's layer_costs(B, N, D, H, n) as Question 2.2's test kept it, as _layer_rows."""
    return _layer_rows(_kept_answer("layer_costs", B, N, D, H, n), B, N, D, H, n)


def _layer_matmuls(B, N, D, H):
    """Test helper: the (M, K, N) of every matmul of a layer (Question 2.2's rows): the projections, one head's
    scores and A V, the two MLP matmuls."""
    d, tokens = D // H, B * N
    return [(tokens, D, D), (N, d, N), (N, N, d), (tokens, D, 4 * D), (tokens, 4 * D, D)]


def _keep_matmul_answers(flops_fn, bytes_fn, layer_sizes):
    """Test helper: Question 2.1's test keeps the student's matmul_flops (``flops_fn``) and matmul_bytes
    (``bytes_fn``) of every matmul of layer_costs(B, N, D, H, n) for the ``layer_sizes`` (B, N, D, H, n) that Question
    2.2's tests use, so that they accept rows built from them."""
    _keep_answers("matmul_flops", flops_fn, [mnk for B, N, D, H, n in layer_sizes for mnk in _layer_matmuls(B, N, D, H)])
    _keep_answers("matmul_bytes", bytes_fn,
                  [(*mnk, n) for B, N, D, H, n in layer_sizes for mnk in _layer_matmuls(B, N, D, H)])


def _layer_costs_from_matmul(B, N, D, H, n):
    """Test helper: the rows of layer_costs that contain matmuls, built from the student's own matmul_flops and
    matmul_bytes as Question 2.1's test kept them, to carry that answer forward."""
    d, tokens = D // H, B * N

    def mf(M, K, N_):
        return _kept_count("matmul_flops", M, K, N_)

    def mb(M, K, N_):
        return _kept_count("matmul_bytes", M, K, N_, n)

    return {
        "qkv_projection": (3 * mf(tokens, D, D), 3 * mb(tokens, D, D)),
        "scores": (H * B * mf(N, d, N) + H * B * N * N, H * B * mb(N, d, N)),
        "attention_value": (H * B * mf(N, N, d), H * B * mb(N, N, d)),
        "output_projection": (mf(tokens, D, D), mb(tokens, D, D)),
        "mlp": (mf(tokens, D, 4 * D) + mf(tokens, 4 * D, D) + 5 * tokens * D,
                mb(tokens, D, 4 * D) + mb(tokens, 4 * D, D) + 5 * n * D),
    }


def _gpt2_for_tests(n_layer, n_embd, n_head, vocab_size, seed):
    """Test helper: a small GPT2LMHeadModel in float32 with random weights drawn from ``seed`` (the global RNG is left
    as it was), eval mode, on the CPU."""
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, n_positions=64,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config).eval()


def _test_tokens(batch, length, vocab_size, seed):
    """Test helper: int64 tokens (batch, length) drawn from their own generator."""
    return torch.randint(vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def _uncached_logits(model, tokens):
    """Test helper: the logits of a float64 copy of ``model`` over all of ``tokens`` (B, S) -> (B, S, vocab): the
    model without a cache."""
    import copy

    with torch.no_grad():
        return copy.deepcopy(model).double()(tokens).logits


def _uncached_greedy(model, prompt, steps):
    """Test helper: greedy decoding without a cache, in float64: (prompt logits (B, S, V), the ``steps`` tokens chosen
    (each (B, 1)), the logits of each step (each (B, 1, V)), every step a forward pass over all tokens so far)."""
    import copy

    model64, tokens, chosen, step_logits = copy.deepcopy(model).double(), prompt, [], []
    with torch.no_grad():
        logits = prefill = model64(tokens).logits
        for _ in range(steps):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            chosen.append(token)
            tokens = torch.cat([tokens, token], dim=1)
            logits = model64(tokens).logits
            step_logits.append(logits[:, -1:])
    return prefill, chosen, step_logits


def _prompt_keys_values(model, prompt):
    """Test helper: the keys and values every layer of ``model`` computes for ``prompt`` (B, S), as (L, B, H, S, d)
    tensors in the model's dtype (what a prefill writes into a cache)."""
    import copy

    model = copy.deepcopy(model)  # output_hidden_states leaves hooks on the model that cannot be pickled
    body, config = model.transformer, model.config
    batch, length = prompt.shape
    heads, width = config.n_head, config.n_embd
    keys, values = [], []
    with torch.no_grad():
        hidden = model(prompt, output_hidden_states=True).hidden_states  # hidden[i]: the input of block i
        for i, block in enumerate(body.h):
            _, key, value = block.attn.c_attn(block.ln_1(hidden[i])).split(width, dim=2)
            keys.append(key.view(batch, length, heads, width // heads).transpose(1, 2))
            values.append(value.view(batch, length, heads, width // heads).transpose(1, 2))
    return torch.stack(keys), torch.stack(values)


def _kept_estimate(flops, nbytes, peak_flops_per_s, bandwidth_bytes_per_s, key):
    """Test helper: ``key`` of the student's roofline_estimate(flops, nbytes, peak, bandwidth) as Question 2.3's test
    kept it (a number; the bound as a label); raises when it was not kept or is outside the contract."""
    args = (flops, nbytes, peak_flops_per_s, bandwidth_bytes_per_s)
    what = f"roofline_estimate({flops}, {nbytes}, {peak_flops_per_s:g}, {bandwidth_bytes_per_s:g})"
    value = as_dict(_kept_answer("roofline_estimate", *args), what)[key]
    return as_label(value, f"{what}[{key!r}]") if key == "bound" else as_real(value, f"{what}[{key!r}]")


def _roofline_times_s(counts, peak_flops_per_s, bandwidth_bytes_per_s):
    """Test helper: the roofline times, in seconds, that a later answer may have: max(FLOPs / peak, bytes / bandwidth)
    of each ``(flops, bytes)`` pair in ``counts`` (None entries skipped; the first pair is the grader's reference),
    then the same pairs' ``t_roofline_s`` from the student's own roofline_estimate (Question 2.3), as its test kept
    them (for the pairs it knew: the correct counts).

    Returns:
        list[float]: the reference time first.
    """
    pairs = [pair for pair in counts if pair is not None]
    times = [max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s) for flops, nbytes in pairs]
    for flops, nbytes in pairs:
        times.append(carried(_kept_estimate, flops, nbytes, peak_flops_per_s, bandwidth_bytes_per_s, "t_roofline_s"))
    return [time for time in times if time is not None]


def _polynomial(terms):
    """Test helper: the function ``(B, N) -> sum(c * B**i * N**j for c, i, j in terms)`` (exact for ints).

    Tests describe the FLOP and byte functions they give a student's function by their terms, so that the same
    function can be built by the grader (for the expected values) and next to the student's code (to call it).
    """
    terms = [tuple(term) for term in terms]
    return lambda B, N: sum(c * B ** i * N ** j for c, i, j in terms)

# %% [markdown]
# # Part 1: Causal self-attention and associative recall
#
# A decoder-only language model predicts token $t+1$ from tokens $1, \dots, t$. During training we feed a whole
# sequence at once and ask for *every* next-token prediction in parallel, so the model must be prevented from
# looking at the answer: position $i$ may only attend to positions $j \le i$. That is the job of the **causal
# mask**.
#
# For one head with queries, keys and values $Q, K, V \in \mathbb{R}^{N \times d}$:
# $$\text{scores} = \frac{Q K^T}{\sqrt{d}}, \qquad
#   \text{scores}_{ij} \leftarrow -\infty \text{ where } j > i, \qquad
#   \text{out} = \text{softmax}_{\text{row}}(\text{scores})\, V .$$
# Setting a score to $-\infty$ makes its weight $e^{-\infty} = 0$ after the softmax, and the softmax of each
# row still sums to one over the allowed positions.
#
# #### Question 1.1 (6 points)
#
# Write `causal_self_attention(q, k, v)`.
# - `q`, `k`, `v` have the same shape `(..., N, d)`: any number of leading dimensions (batch, heads), then the
#   sequence length `N` and the head width `d`.
# - Return a tensor of the same shape, dtype and device, where output row `i` attends to rows `j <= i` only,
#   with scores scaled by $1/\sqrt{d}$.
# - Build the mask and the softmax yourself: that is the point of the question. An answer that calls
#   `F.scaled_dot_product_attention` or `nn.MultiheadAttention` earns at most a quarter of the points.
# - Your softmax must be numerically stable: large scores of either sign must not give `inf` or `NaN`, for
#   any floating dtype (the tests use scores in the hundreds in float32 and in the thousands in float64;
#   `torch.softmax` is stable).
# - Precision: the tests compare with a float64 reference to float32's tolerance (relative $10^{-4}$, absolute
#   $10^{-5}$) for float32 and float64 inputs alike, so computing inside in float32 (a softmax in float32, say) is
#   fine.
# - Device: create every tensor you need, the mask included, on the device of `q` (`device=q.device`): on a GPU,
#   a mask made on the CPU cannot be combined with the scores. The tests also run your function on inputs on
#   another device.

# %% nbgrader={"grade": false, "grade_id": "q1_1_causal_attention", "locked": false, "schema_version": 3, "solution": true, "task": false}
def causal_self_attention(q, k, v):
    """Causal scaled dot-product attention.

    Args:
        q (torch.Tensor): queries, shape (..., N, d), floating dtype.
        k (torch.Tensor): keys, same shape, dtype and device as q.
        v (torch.Tensor): values, same shape, dtype and device as q.

    Returns:
        torch.Tensor: shape (..., N, d), dtype and device of q; row i is
        softmax(q_i k_j / sqrt(d) over j <= i) weighted sum of the v_j.
    """
    ### BEGIN SOLUTION
    seq_len, head_dim = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)  # (..., N, N)
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()  # j <= i
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q1_1_causal_attention_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
with check("public: a (3, 2) example keeps its shape; row 0 attends to itself only, row 1 to rows 0 and 1", weight=2):
    _q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], device="cpu")  # CPU on every grader (the device rule:
    _v = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device="cpu")  # a hidden check of its own)
    _out = as_tensor(causal_self_attention(_q, _q, _v), "causal_self_attention(q, k, v)")
    assert tuple(_out.shape) == (3, 2), (
        f"causal_self_attention of (3, 2) inputs must return a (3, 2) tensor, got shape {tuple(_out.shape)}")
    _w = torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64) / math.sqrt(2.0), dim=0)
    _v64 = _v.cpu().double()
    assert_tensor_close(_out[0], _v64[0], "row 0 of the output (it may only attend to itself, so it must equal v[0])")
    assert_tensor_close(_out[1], _w[0] * _v64[0] + _w[1] * _v64[1],
                        "row 1 of the output (weights softmax([0, 1] / sqrt(2)) on v[0] and v[1])")
    del _q, _v, _out, _w, _v64
### BEGIN HIDDEN TESTS
def _q1_1_hidden_tests():
    @kernel_side
    def torch_calls(q, k, v):
        """Names of the torch functions one call causal_self_attention(q, k, v) makes (best effort: measured where
        the student's code runs)."""
        with record_torch_calls() as called:
            causal_self_attention(q, k, v)
        return sorted(called)

    @kernel_side
    def device_of_meta_result(shape, dtype):
        """causal_self_attention on q, k, v made on the meta device (a device without data, like a GPU seen from
        the CPU) next to the student's code: the device of its result, or the error it raised (best effort)."""
        q, k, v = (torch.zeros(shape, dtype=dtype, device="meta") for _ in range(3))
        try:
            out = causal_self_attention(q, k, v)
        except Exception as exc:  # noqa: BLE001 - reported to the grader as text
            return f"{type(exc).__name__}: {exc}"
        return str(out.device) if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"

    def reference(q, k, v):
        q, k, v = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
        n = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v

    def inputs(shape, dtype, seed, scale=1.0):
        gen = torch.Generator().manual_seed(seed)
        q = (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)  # CPU, on every grader
        k = (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
        v = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
        where = f"inputs of shape {tuple(shape)}, {dtype}" + (f", scores scaled x{scale ** 2:g}" if scale > 1 else "")
        return q, k, v, where

    # The question states float32's tolerance for every input dtype: a softmax computed in float32 passes.
    rtol, atol = 1e-4, 1e-5

    def case(shape, dtype, seed, scale=1.0):
        """causal_self_attention on one CPU input: shape, dtype and values (float32's tolerance)."""
        q, k, v, where = inputs(shape, dtype, seed, scale)
        out = assert_tensor_close(causal_self_attention(q, k, v), reference(q, k, v),
                                  f"causal_self_attention(q, k, v) for {where} (row i = softmax(q_i k_j / sqrt(d), "
                                  f"j <= i) v, same shape and dtype as q)", rtol=rtol, atol=atol, dtype=dtype)
        return q, k, v, out

    with check("matches float64 causal attention on hidden inputs (2 to 4 dimensions, float32 and float64), with "
               "q's shape and dtype", weight=3):
        case((5, 4), torch.float64, 11)
        case((2, 3, 7, 8), torch.float32, 12)
        case((3, 9, 16), torch.float64, 13)
        case((1, 1, 1, 4), torch.float32, 14)
    with check("the last position, which attends to every position, is softmax(q_N k^T / sqrt(d)) v"):
        for shape, dtype, seed in (((2, 3, 7, 8), torch.float32, 20), ((6, 5), torch.float64, 21)):
            q, k, v, where = inputs(shape, dtype, seed)
            out = as_tensor(causal_self_attention(q, k, v), "causal_self_attention(q, k, v)")
            assert tuple(out.shape) == tuple(shape), f"causal_self_attention must keep q's shape {shape}, got {tuple(out.shape)}"
            assert_tensor_close(out[..., -1, :], reference(q, k, v)[..., -1, :],
                                f"the last output row for {where} (it attends to every key: scores scaled by "
                                f"1/sqrt(d), a softmax over the row, the weighted sum of v)", rtol=rtol, atol=atol)
    with check("causal: keys and values after position t do not change the outputs at positions <= t"):
        q, k, v, _ = inputs((2, 2, 10, 4), torch.float64, 16)
        t = 4
        k2, v2 = k.clone(), v.clone()
        k2[..., t + 1:, :] += 3.0
        v2[..., t + 1:, :] -= 5.0
        out = as_tensor(causal_self_attention(q, k, v), "causal_self_attention(q, k, v)")
        out2 = as_tensor(causal_self_attention(q, k2, v2), "causal_self_attention(q, k2, v2)")
        assert tuple(out.shape) == tuple(out2.shape) == (2, 2, 10, 4), (
            f"causal_self_attention must keep q's shape (2, 2, 10, 4), got {tuple(out.shape)}")
        assert_tensor_close(out2[..., : t + 1, :], out[..., : t + 1, :].double(),
                            "outputs at positions <= 4 after changing the keys and values at positions > 4 (the mask "
                            "must hide the future)", rtol=rtol, atol=atol)
    with check("each row's weights sum to one over the positions it sees: when every value row is the same vector, "
               "every output row is that vector"):
        q, k, _, where = inputs((3, 8, 5), torch.float64, 22)
        same = torch.tensor([1.0, -2.0, 0.5, 3.0, 4.0], dtype=torch.float64)
        assert_tensor_close(causal_self_attention(q, k, same.expand(3, 8, 5).clone()), same.expand(3, 8, 5),
                            f"causal_self_attention(q, k, v) for {where} with every row of v equal to "
                            f"{same.tolist()} (softmax weights over j <= i sum to 1)", rtol=rtol, atol=atol)
    # Stability: exp overflows float32 beyond 88.7 and float64 beyond 709.8. Here the largest scores reach 255 in
    # float32 (and one row's largest score is -208, where exp underflows to 0) and 1,759 in float64.
    with check("numerically stable: scores up to 255 in float32 and 1,759 in float64 give the right finite output"):
        case((2, 6, 8), torch.float32, 15, scale=12.0)
        case((3, 5, 16), torch.float64, 17, scale=30.0)
    with check("returns its result on the device of q, every tensor it makes (the mask included) on q's device "
               "(inputs on DEVICE; with PyTorch's default device set to meta; inputs on the meta device)"):
        q, k, v, where = inputs((2, 5, 8), torch.float32, 18)
        q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
        assert_on_input_device(causal_self_attention, (q, k, v), q.device, "causal_self_attention(q, k, v)")
        # A tensor made without device= (a mask from torch.ones(n, n).tril()) lands on the CPU, where it cannot be
        # combined with inputs on another device: the same mistake a GPU grader sees, on every grader. An answer
        # that needs its inputs' values there (.item()) cannot be run without data: then the checks above decide.
        got = device_of_meta_result((2, 5, 8), torch.float32)
        mixed = "device" in got and ("expected" in got or "same" in got)
        assert got == "meta" or not mixed and got.startswith(("RuntimeError", "NotImplementedError")), (
            "causal_self_attention(q, k, v) with q, k, v on another device (meta, a device without data) must return "
            f"its result there; it gave {got}: create every tensor on q's device (device=q.device), the mask included")
    with check("builds the mask and the softmax itself: no F.scaled_dot_product_attention or nn.MultiheadAttention "
               "(call recorder)", weight=2, method=True):
        q, k, v, where = inputs((2, 3, 7, 8), torch.float32, 19)
        assert_calls(torch_calls(q, k, v), f"causal_self_attention(q, k, v) for {where} (build the mask yourself)",
                     forbidden=("scaled_dot_product_attention", "multi_head_attention_forward"))


_q1_1_hidden_tests()
del _q1_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 1.1")


# %% [markdown]
# #### Question 1.2 (2 points)
#
# In one to three sentences: what is the causal mask for, why is it needed when training on whole sequences,
# and how is it applied?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q1_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# In training the whole sequence is processed at once and each position is trained to predict the *next*
# token, so without a mask position $i$ could simply attend to token $i+1$ and copy the answer; the model would
# then fail at generation time, when future tokens do not exist yet. The mask keeps training consistent with
# left-to-right generation: before the softmax, every score $s_{ij}$ with $j > i$ (the upper triangle of
# $QK^T$) is set to $-\infty$, so its attention weight becomes exactly zero and each row is normalised over the
# positions $j \le i$ only.
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: purpose: position i must not see tokens after i (no peeking at the token it has to predict);
#   mentions that training processes all positions in parallel / consistency with autoregressive generation.
# - 1 point: mechanism: scores of future positions (j > i, upper triangle) set to -inf (or a very large
#   negative number) before the softmax, so their weights are 0. Adding -inf *after* the softmax, or zeroing
#   scores (0 instead of -inf), is wrong.
# === END MARK SCHEME ===

# %% [markdown]
# ## Associative recall
#
# A classic probe of what attention can do is **associative recall**. Each sequence first lists key-value
# pairs, then asks for some of the keys again; after each repeated key the model must output the value that
# was paired with it earlier:
# ```
#   k1 v1  k2 v2  k3 v3  k4 v4  |  k3 ?  k1 ?  ...
# ```
# Keys and values are random tokens, so the answer cannot be memorised: it has to be looked up in the context.
# Keys come from one set of token ids and values from another, keys within a sequence are distinct, and a query
# picks one of the listed keys at random. The model is trained as a language model on the query half of the
# sequence: it predicts each query key (one of the listed keys, uniformly at random) and each answer (fully
# determined by the context). We measure the **accuracy on the answers**.
#
# The cells below generate the data, define a small Transformer (learned positional embeddings, pre-norm
# blocks of your `causal_self_attention` and a 4x MLP) and train it with 1, 2, ... layers.

# %%
# cpu scale: a smaller task (6 pairs, 24 keys and values) and model that a CPU trains in a few minutes, still
# showing that one layer cannot recall and two can; a third layer would need several times more steps there.
RECALL_TASK = dict(
    num_pairs=at_scale(teaching=8, quick=4, cpu=6),     # key-value pairs listed in the context
    num_queries=at_scale(teaching=8, quick=4, cpu=6),   # keys asked again, each followed by its value
    num_keys=at_scale(teaching=32, quick=16, cpu=24),   # key tokens are ids 0 .. num_keys - 1
    num_values=at_scale(teaching=32, quick=16, cpu=24),  # value tokens are ids num_keys .. num_keys + num_values - 1
)
RECALL_TRAINING = dict(
    d_model=at_scale(teaching=64, quick=32, cpu=32),
    num_heads=at_scale(teaching=4, quick=2, cpu=2),
    steps=at_scale(teaching=2000, quick=40, cpu=500),
    batch_size=at_scale(teaching=128, quick=32, cpu=64),
    lr=3e-3,
)
RECALL_LAYER_COUNTS = at_scale(teaching=[1, 2, 3, 4], quick=[1, 2], cpu=[1, 2])

def make_recall_batch(batch_size, num_pairs, num_queries, num_keys, num_values, generator, device=DEVICE):
    """A batch of associative-recall sequences.

    Args:
        batch_size (int): number of sequences B.
        num_pairs (int): key-value pairs P in the context (P <= num_keys; keys are distinct).
        num_queries (int): queries Q; each repeats a random context key and is followed by its value.
        num_keys (int): size of the key vocabulary (ids 0 .. num_keys - 1).
        num_values (int): size of the value vocabulary (ids num_keys .. num_keys + num_values - 1).
        generator (torch.Generator): source of randomness, on ``device``.
        device: where the tokens are created.

    Returns:
        torch.Tensor: int64 tokens of shape (B, 2 P + 2 Q): k1 v1 ... kP vP q1 a1 ... qQ aQ.
    """
    keys = torch.rand(batch_size, num_keys, generator=generator, device=device).argsort(dim=1)[:, :num_pairs]
    values = num_keys + torch.randint(num_values, (batch_size, num_pairs), generator=generator, device=device)
    context = torch.stack([keys, values], dim=2).reshape(batch_size, 2 * num_pairs)
    picked = torch.randint(num_pairs, (batch_size, num_queries), generator=generator, device=device)
    queries = torch.stack([keys.gather(1, picked), values.gather(1, picked)], dim=2)
    return torch.cat([context, queries.reshape(batch_size, 2 * num_queries)], dim=1)


def recall_positions(num_pairs, num_queries, device=DEVICE):
    """Which input positions the loss and the accuracy use (the model sees tokens[:, :-1]).

    Returns:
        tuple: (loss_positions, answer_positions), boolean masks of shape (2 P + 2 Q - 1,): the positions
        whose next token lies in the query half, and the positions whose next token is an answer.
    """
    pos = torch.arange(2 * num_pairs + 2 * num_queries - 1, device=device)
    loss_positions = pos >= 2 * num_pairs - 1
    answer_positions = (pos >= 2 * num_pairs) & ((pos - 2 * num_pairs) % 2 == 0)
    return loss_positions, answer_positions


_example = make_recall_batch(2, **RECALL_TASK, generator=torch.Generator(device=DEVICE).manual_seed(0))
print("two example sequences (keys < "
      f"{RECALL_TASK['num_keys']} <= values):\n{_example.cpu().numpy()}")


# %%
class RecallBlock(nn.Module):
    """Pre-norm Transformer block: x + attention(LN(x)), then x + MLP(LN(x)), with your causal attention."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        batch, seq_len, d_model = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, seq_len, 3, self.num_heads, d_model // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, heads, N, d_head)
        attended = causal_self_attention(q, k, v).transpose(1, 2).reshape(batch, seq_len, d_model)
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class RecallTransformer(nn.Module):
    """A small decoder-only Transformer: token + learned position embeddings, blocks, final norm, LM head.

    forward(tokens (B, S) int64) -> logits (B, S, vocab_size) float32, S <= max_len.
    """

    def __init__(self, vocab_size, max_len, d_model, num_heads, num_layers):
        super().__init__()
        self.max_len = max_len
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(RecallBlock(d_model, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train_recall_model(num_layers, task=RECALL_TASK, training=RECALL_TRAINING, seed=0, device=DEVICE):
    """Train a RecallTransformer with ``num_layers`` blocks on fresh random batches.

    Returns:
        tuple: (model in eval mode, list of training losses).
    """
    torch.manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    seq_len = 2 * task["num_pairs"] + 2 * task["num_queries"]
    vocab_size = task["num_keys"] + task["num_values"]
    model = RecallTransformer(vocab_size, seq_len, training["d_model"], training["num_heads"], num_layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training["lr"], weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=training["lr"], total_steps=training["steps"],
                                                   pct_start=0.1)
    loss_positions, _ = recall_positions(task["num_pairs"], task["num_queries"], device)
    losses = []
    model.train()
    for _ in progress(range(training["steps"]), f"training {num_layers} layer(s)"):
        tokens = make_recall_batch(training["batch_size"], **task, generator=gen, device=device)
        logits = model(tokens[:, :-1])[:, loss_positions]
        loss = F.cross_entropy(logits.reshape(-1, vocab_size), tokens[:, 1:][:, loss_positions].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def recall_accuracy(model, task=RECALL_TASK, num_sequences=1024, seed=1234, device=DEVICE):
    """Fraction of answers the model predicts correctly (argmax) on fresh sequences."""
    tokens = make_recall_batch(num_sequences, **task, generator=torch.Generator(device=device).manual_seed(seed),
                               device=device)
    _, answer_positions = recall_positions(task["num_pairs"], task["num_queries"], device)
    predicted = model(tokens[:, :-1]).argmax(dim=-1)
    return (predicted[:, answer_positions] == tokens[:, 1:][:, answer_positions]).float().mean().item()


# %%
recall_models, recall_results = {}, []
if SCALE != "quick":
    print(f"Training {len(RECALL_LAYER_COUNTS)} models of {RECALL_LAYER_COUNTS} layers for {RECALL_TRAINING['steps']} "
          f"steps each: seconds on idle CPU cores at cpu scale, minutes on busy ones, about 1 minute on an H200 at "
          f"teaching scale (each model's time is printed below).")
with uses_answers("Question 1.1"):  # the models attend with your causal_self_attention
    for num_layers in RECALL_LAYER_COUNTS:
        start_s = time.perf_counter()
        recall_models[num_layers], losses = train_recall_model(num_layers)
        accuracy = recall_accuracy(recall_models[num_layers])
        recall_results.append({"layers": num_layers, "answer_accuracy": accuracy,
                               "final_loss": float(np.mean(losses[-20:])), "train_s": time.perf_counter() - start_s})
        print(f"{num_layers} layer(s): answer accuracy {accuracy:6.1%}   "
              f"({time.perf_counter() - start_s:.1f} s, {RECALL_TRAINING['steps']} steps)")
    recall_results = pd.DataFrame(recall_results)
    chance = 1 / RECALL_TASK["num_values"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(recall_results["layers"], recall_results["answer_accuracy"], marker="o")
    ax.axhline(0.9, color="gray", linestyle="--", label="90 %")
    ax.axhline(chance, color="gray", linestyle=":", label=f"chance (1/{RECALL_TASK['num_values']})")
    ax.set_xticks(recall_results["layers"])
    ax.set_xlabel("Transformer layers")
    ax.set_ylabel("Answer accuracy")
    ax.set_ylim(0, 1.02)
    ax.set_title("Associative recall vs depth")
    ax.legend()
    plt.show()
    if SCALE == "quick":
        print("Quick scale: the models train for a few dozen steps only, so these accuracies mean nothing; "
              "run at cpu or teaching scale to answer Question 1.3.")
    elif SCALE == "cpu":
        print("cpu scale: a smaller task and 1- and 2-layer models only; the teaching-scale run (1 to 4 layers) of the "
              "course's H200 is in measured_runs.md beside this notebook.")

# %% [markdown]
# #### Question 1.3 (4 points)
#
# Run the experiment at teaching scale, or at cpu scale on a machine without a GPU (a smaller task, 1 and 2
# layers; the teaching-scale accuracies of 1 to 4 layers on the course's H200 are in `measured_runs.md` beside this
# notebook, Part 1, and you may quote them). What is the smallest number of layers that reaches 90 % answer accuracy? Explain why fewer layers cannot solve the task: what must the first attention layer compute, and
# what does the next one do with it? (Think of where the information "this value belongs to key $k$" lives in
# the sequence, and which position needs it.)

# %% [markdown] nbgrader={"grade": true, "grade_id": "q1_3_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# Two layers. With one layer the answer accuracy stays far below 90 % (20.2 % in the course's teaching-scale run on
# the H200, `measured_runs.md`: above the 1/32 of a random value and the 1/8 of a random pick among the 8 values
# listed in the context, so it uses the context a little, but it cannot pick the right value), while two or more
# layers reach nearly 100 % (100.0 % for 2, 3 and 4 layers there). At cpu scale the same holds: 22.3 % with 1 layer,
# 99.1 % with 2 in the course's cpu-scale run.
#
# At the query position the model sees the key $k$ and must output the token that *followed* $k$ earlier. A
# single attention layer can find the earlier occurrence of $k$ by content (query $k$ matches key $k$), but
# what it reads there is the key token itself, not the value next to it; and it cannot find the value by
# content, because a value token's own representation says nothing about which key preceded it. Two layers
# solve this by composition (an "induction head"): the first layer lets every position attend to its
# *previous* position (a positional pattern), so the representation of each value $v_i$ now also carries the
# identity of its key $k_i$. The second layer, from the query position, attends to the position whose
# "previous token" is $k$, which is exactly $v_i$, and copies that value to the output. Each layer moves
# information one hop; recall needs two hops (key to its neighbour, then query to that neighbour), so two
# layers are the minimum; more layers do not hurt but are not needed.
# === BEGIN MARK SCHEME ===
# 4 points in total:
# - 1 point: answer "2 layers" (consistent with their own run, teaching or cpu scale, or with the H200 accuracies of
#   measured_runs.md that a CPU-only student may quote; 1 layer stays far below 90 %). A CPU-only answer from
#   the cpu-scale run (1 and 2 layers) or from measured_runs.md is marked exactly like a teaching-scale one; an
#   answer from quick-scale accuracies (which mean nothing) earns this point only if it says so and uses the
#   measured_runs.md accuracies instead.
# - 1 point: a single layer can match the query key to the earlier key by content but cannot retrieve the
#   token next to it / value tokens do not know their key.
# - 2 points: mechanism of two layers: layer 1 copies the previous token's identity (the key) into each value
#   position (previous-token head); layer 2 matches the query against that copied key and reads the value
#   (induction head / two-step composition). Partial credit (1) for "layer 1 builds key-value associations,
#   layer 2 looks them up" without saying how.
# === END MARK SCHEME ===

# %% [markdown]
# # Part 2: Counting FLOPs and bytes
#
# We now count what one Transformer layer costs. The counts depend on conventions, so here are ours. The tests
# check exactly these rules; when your count differs, re-read them first.
#
# **Shapes.** Batch size $B$, sequence length $N$, model width $D$, $H$ heads of width $D/H$ ($D$ is a multiple
# of $H$). The input of a layer is $X \in \mathbb{R}^{B \times N \times D}$. Every element takes $n$ bytes
# (`bytes_per_element`: 2 for fp16/bf16, 4 for fp32).
#
# **FLOPs.**
#
# 1. One FLOP is one scalar addition, subtraction, multiplication, division, exponential or comparison.
# 2. A matrix product $(M \times K)(K \times N)$ costs $2MKN$ FLOPs: each of the $MN$ outputs takes $K$
#    multiplications and $K$ additions (we count the first addition into a zero accumulator, so the exact
#    $MN(2K-1)$ becomes the usual $2MKN$). A batched product costs the batch size times as much.
# 3. Adding a bias costs 1 FLOP per output element. Scaling the scores by $1/\sqrt{d}$ costs 1 FLOP per score
#    ($\sqrt{d}$ is given for free).
# 4. The causal mask costs 1 FLOP per score: the comparison that decides whether the entry is masked
#    (selecting $-\infty$ or the score costs nothing more).
# 5. The softmax costs 3 FLOPs per element: one exponential, one addition into its row's sum (the sum is
#    computed once per row) and one division. We do not count the subtraction of the row maximum.
# 6. The MLP's activation (GELU), layer norms, residual additions, embeddings and the final LM head are not
#    counted (neither FLOPs nor bytes): the activation is applied inside the first MLP matmul before its
#    result is written, and the rest is small next to the matmuls.
#
# **Bytes.**
#
# 7. Each operation reads every input tensor from memory once and writes its output once, $n$ bytes per
#    element. Nothing stays on chip between two operations: if three operations need $X$, $X$ is read three
#    times. Weights and biases are inputs like any other; constants ($\sqrt{d}$, $-\infty$) are free; a
#    transpose is free (it only changes metadata).
# 8. These operations are separate (each writes its result and the next reads it back): the Q, K and V
#    projections (three matmuls); the scores $QK^T/\sqrt{d}$ (the scaling is fused into the product: scores
#    are written once, already scaled); the mask; the softmax; $A V$; the output projection; the first MLP
#    matmul (bias and activation fused into it); the second MLP matmul (bias fused).
#
# **Parameters.** The Q, K, V and output projections are $D \times D$ matrices without biases. The MLP is
# $Y = \text{GELU}(X W_1 + b_1) W_2 + b_2$ with $W_1 \in \mathbb{R}^{D \times 4D}$, $b_1 \in \mathbb{R}^{4D}$,
# $W_2 \in \mathbb{R}^{4D \times D}$, $b_2 \in \mathbb{R}^{D}$.
#
# Every count below is a whole number: a Python `int` (a NumPy integer, or a float without a fractional part such
# as `48.0`, is accepted too). Divide integers with `//` (for example `D // H`), never `/`. Where a count is built
# from your earlier functions, the tests also accept the count your own earlier functions give, so a mistake is
# charged once, in its own question.

# %% [markdown]
# #### Question 2.1 (4 points)
#
# $C = AB$ with $A \in \mathbb{R}^{M \times K}$ and $B \in \mathbb{R}^{K \times N}$. Write `matmul_flops(M, K, N)`
# and `matmul_bytes(M, K, N, bytes_per_element)`.

# %% nbgrader={"grade": false, "grade_id": "q2_1_matmul_flops", "locked": false, "schema_version": 3, "solution": true, "task": false}
def matmul_flops(M, K, N):
    """FLOPs of C = A B for A (M, K) and B (K, N).

    Returns:
        int: number of floating-point operations.
    """
    ### BEGIN SOLUTION
    return 2 * M * K * N
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q2_1_matmul_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def matmul_bytes(M, K, N, bytes_per_element):
    """Bytes read and written by C = A B for A (M, K) and B (K, N): read A and B once, write C once.

    Returns:
        int: bytes moved to and from memory.
    """
    ### BEGIN SOLUTION
    return bytes_per_element * (M * K + K * N + M * N)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_1_matmul_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
with check("public: matmul_flops(2, 3, 4)"):
    _assert_count(matmul_flops, (2, 3, 4), 48, "A multiply-add is 2 FLOPs (rule 2).")
with check("public: matmul_bytes(2, 3, 4, 4)"):
    _assert_count(matmul_bytes, (2, 3, 4, 4), 104, "Read A and B once, write C once (rule 7).")
# Question 2.2's tests accept rows built from these answers, as graded here (a mistake is charged once).
_keep_matmul_answers(matmul_flops, matmul_bytes, [(1, 2, 4, 2, 2)])
### BEGIN HIDDEN TESTS
def _q2_1_hidden_tests():
    sizes = [(7, 11, 13), (1, 1600, 6400), (4096, 3, 1), (65536, 4096, 4096)]
    with check("matmul_flops = 2 M K N on hidden sizes", weight=2):
        for M, K, N in sizes:
            _assert_count(matmul_flops, (M, K, N), 2 * M * K * N, "A multiply-add is 2 FLOPs (rule 2).")
    with check("matmul_bytes = n (M K + K N + M N) on hidden sizes, fp16 and fp32", weight=2):
        for M, K, N in sizes:
            for n in (2, 4):
                _assert_count(matmul_bytes, (M, K, N, n), n * (M * K + K * N + M * N),
                              "Read A (M x K) and B (K x N) once, write C (M x N) once (rule 7).")
    # Question 2.2's hidden sizes
    _keep_matmul_answers(matmul_flops, matmul_bytes, [(3, 7, 20, 4, 2), (16, 16384, 4096, 16, 2), (2, 5, 1600, 25, 4),
                                                      (1, 1, 64, 1, 4), (4, 9, 12, 12, 2)])


_q2_1_hidden_tests()
del _q2_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 2.1")


# %% [markdown]
# #### Question 2.2 (12 points)
#
# One Transformer layer, operation by operation, as one table. Write `layer_costs(B, N, D, H, bytes_per_element)`
# returning a dict with exactly these seven keys, each mapped to a pair `(flops, bytes)` of whole numbers (a tuple;
# a list of two is accepted too). The attention operations cover **all $H$ heads**, each of width $d = D/H$ (so the
# attention matrices have shape $B \times H \times N \times N$):
#
# | key | operation |
# | --- | --- |
# | `"qkv_projection"` | $Q = XW_Q$, $K = XW_K$, $V = XW_V$: three separate matmuls of $X \in \mathbb{R}^{B \times N \times D}$ by $D \times D$ weights, no biases |
# | `"scores"` | $S = QK^T/\sqrt{d}$ per head, the scaling fused into the product (rules 3, 8) |
# | `"mask"` | the causal mask over the scores: one comparison per score, the masked scores written as a new tensor (rule 4) |
# | `"softmax"` | the row-wise softmax of the masked scores, all $N^2$ entries of each head, masked or not (rule 5) |
# | `"attention_value"` | $O = AV$ per head, probabilities $A$ and values $V$ of width $d$ |
# | `"output_projection"` | the concatenated heads $O \in \mathbb{R}^{B \times N \times D}$ times $W_O \in \mathbb{R}^{D \times D}$, no bias |
# | `"mlp"` | $Z = \text{GELU}(XW_1 + b_1)$ written, then read back for $Y = ZW_2 + b_2$ (biases counted, activation not: rules 3, 6, 7, 8) |
#
# Build the matmuls from your `matmul_flops` and `matmul_bytes` if you like (a batched product over $B$ sequences
# and $H$ heads costs $BH$ times one product). Multi-head attention, used from Question 2.4 on, is the sum of the
# four rows `scores`, `mask`, `softmax` and `attention_value`. (Check: the public test below gives one case in full.)

# %% nbgrader={"grade": false, "grade_id": "q2_2_layer_costs", "locked": false, "schema_version": 3, "solution": true, "task": false}
def layer_costs(B, N, D, H, bytes_per_element):
    """FLOPs and bytes of every operation of one Transformer layer (B sequences of N tokens, width D, H heads).

    Args:
        B (int): batch size. N (int): sequence length. D (int): model width, a multiple of H.
        H (int): attention heads, each of width D // H.
        bytes_per_element (int): 2 for fp16/bf16, 4 for fp32.

    Returns:
        dict: operation name -> (flops, bytes), whole numbers, for "qkv_projection", "scores", "mask", "softmax",
        "attention_value" (all heads), "output_projection" and "mlp".
    """
    ### BEGIN SOLUTION
    n, d = bytes_per_element, D // H
    tokens, scores = B * N, H * B * N * N  # rows of X; elements of the attention matrices of all heads
    return {
        "qkv_projection": (3 * 2 * tokens * D * D, 3 * n * (tokens * D + D * D + tokens * D)),
        "scores": (2 * scores * d + scores, n * (2 * H * B * N * d + scores)),  # scaling fused: S written once
        "mask": (scores, 2 * n * scores),
        "softmax": (3 * scores, 2 * n * scores),
        "attention_value": (2 * scores * d, n * (scores + 2 * H * B * N * d)),
        "output_projection": (2 * tokens * D * D, n * (2 * tokens * D + D * D)),
        "mlp": (2 * tokens * D * 4 * D + tokens * 4 * D + 2 * tokens * 4 * D * D + tokens * D,  # matmuls and biases
                n * ((tokens * D + D * 4 * D + 4 * D + tokens * 4 * D) + (tokens * 4 * D + 4 * D * D + D + tokens * D))),
    }
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_2_layer_costs_tests", "locked": true, "points": 12, "schema_version": 3, "solution": false, "task": false}
# A mistake in Question 2.1 is charged once: rows built from your own matmul_flops / matmul_bytes are accepted too.
_LAYER_HINTS = {
    "qkv_projection": "three (B N x D)(D x D) matmuls; X is read once per projection (rules 2, 7, 8)",
    "scores": "B H products (N x d)(d x N) with d = D // H, plus 1 FLOP per score to scale; read Q and K, write S "
              "once (rules 2, 3, 8)",
    "mask": "one comparison per score (rule 4); read every score once and write every masked score once (rule 7)",
    "softmax": "3 FLOPs per score (rule 5); read the masked scores once, write the probabilities once (rule 7)",
    "attention_value": "B H products (N x N)(N x d); read A and V, write O once (rules 2, 7)",
    "output_projection": "one (B N x D)(D x D) matmul; read O and W_O, write the result (rules 2, 7)",
    "mlp": "two matmuls (D -> 4D -> D) plus one FLOP per bias addition; X, W_1, b_1 read and Z written, then Z, W_2, "
           "b_2 read and Y written (rules 2, 3, 7, 8)",
}


def _layer_rows_match(sizes, ops):
    """layer_costs(B, N, D, H, n)[op] for every size and op: (flops, bytes) equal to the reference or to the same
    row built from the student's own matmul_flops / matmul_bytes (Question 2.1, as its test kept them)."""
    for B, N, D, H, n in sizes:
        got = _layer_rows(layer_costs(B, N, D, H, n), B, N, D, H, n)
        reference = _reference_layer_costs(B, N, D, H, n)
        own = carried(_layer_costs_from_matmul, B, N, D, H, n)
        for op in ops:
            for index, unit in enumerate(("flops", "bytes")):
                what = f"layer_costs{(B, N, D, H, n)}[{op!r}] {unit}"
                assert_or_carried(lambda want: assert_integer(got[op][index], want, what, formula=_LAYER_HINTS[op]),
                                  reference[op][index], None if own is None or op not in own else own[op][index],
                                  carried_from="your matmul_flops / matmul_bytes")


with check("public: layer_costs(1, 2, 4, 2, 2), all seven rows"):
    _layer_rows_match([(1, 2, 4, 2, 2)], _LAYER_OPS)
# Questions 3.1 and 4.2 accept counts built from your layer_costs, as graded here.
_keep_answers("layer_costs", layer_costs, [(1, 2, 4, 2, 2), (1, 1, 4, 2, 2)])
### BEGIN HIDDEN TESTS
def _q2_2_hidden_tests():
    sizes = [(3, 7, 20, 4, 2), (16, 16384, 4096, 16, 2), (2, 5, 1600, 25, 4), (1, 1, 64, 1, 4), (4, 9, 12, 12, 2)]
    with check("qkv_projection and output_projection on hidden sizes, fp16 and fp32", weight=2):
        _layer_rows_match(sizes, ("qkv_projection", "output_projection"))
    with check("scores and attention_value over H heads of width D // H", weight=2):
        _layer_rows_match(sizes, ("scores", "attention_value"))
    with check("mask and softmax over the B H N^2 scores"):
        _layer_rows_match(sizes, ("mask", "softmax"))
    with check("mlp: two matmuls, both biases, Z written and read back", weight=2):
        _layer_rows_match(sizes, ("mlp",))
    # Questions 3.1 and 4.2's hidden sizes (B, N, D, H, L, n): their forward pass (fp16 FLOPs, n bytes) and decode step
    later = [(B, N, 1600, 25, 48, 2) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024), (3, 7)]] + [
        (3, 7, 20, 4, 5, 4), (2, 11, 768, 12, 12, 2), (5, 1, 36, 3, 2, 2), (1, 9, 64, 64, 3, 4)]
    _keep_answers("layer_costs", layer_costs,
                  [(B, tokens, D, H, m) for B, N, D, H, L, n in later for tokens in (N, 1) for m in (2, n)])


_q2_2_hidden_tests()
del _q2_2_hidden_tests
### END HIDDEN TESTS
del _layer_rows_match, _LAYER_HINTS
finish_checks("Question 2.2")


# %% [markdown]
# ## The roofline model
#
# A GPU with peak compute $P$ (FLOP/s) and memory bandwidth $W$ (bytes/s) needs at least
# $T_\text{compute} = \text{FLOPs}/P$ to do the arithmetic and at least $T_\text{memory} = \text{bytes}/W$ to
# move the data. When both overlap perfectly, the operation takes $\max(T_\text{compute}, T_\text{memory})$: it
# is **compute-bound** if $T_\text{compute} > T_\text{memory}$ and **memory-bound** otherwise. Equivalently,
# compare the **arithmetic intensity** $I = \text{FLOPs}/\text{bytes}$ with the **ridge point** $P/W$.
#
# #### Question 2.3 (3 points) <!-- grade ids q2_7_* -->
#
# Write `roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s)` returning a dict with
# the float keys `"intensity_flop_per_byte"`, `"ridge_flop_per_byte"`, `"t_compute_s"`, `"t_memory_s"`,
# `"t_roofline_s"` (the larger of the two times) and the key `"bound"`: the string `"compute"` when
# $T_\text{compute} > T_\text{memory}$, else `"memory"`.

# %% nbgrader={"grade": false, "grade_id": "q2_7_roofline_estimate", "locked": false, "schema_version": 3, "solution": true, "task": false}
def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    """Roofline estimate of one operation on one device.

    Args:
        flops (float): floating-point operations.
        bytes_moved (float): bytes read plus written.
        peak_flops_per_s (float): the device's peak compute in FLOP/s.
        bandwidth_bytes_per_s (float): the device's memory bandwidth in bytes/s.

    Returns:
        dict: intensity_flop_per_byte, ridge_flop_per_byte, t_compute_s, t_memory_s, t_roofline_s (floats)
        and bound ("compute" or "memory").
    """
    ### BEGIN SOLUTION
    t_compute_s = flops / peak_flops_per_s
    t_memory_s = bytes_moved / bandwidth_bytes_per_s
    return {
        "intensity_flop_per_byte": flops / bytes_moved,
        "ridge_flop_per_byte": peak_flops_per_s / bandwidth_bytes_per_s,
        "t_compute_s": t_compute_s,
        "t_memory_s": t_memory_s,
        "t_roofline_s": max(t_compute_s, t_memory_s),
        "bound": "compute" if t_compute_s > t_memory_s else "memory",
    }
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q2_7_roofline_estimate_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
with check("public: roofline_estimate(4e12, 1e10, 100e12, 2e12): the two times and the bound"):
    _est = as_dict(roofline_estimate(4e12, 1e10, 100e12, 2e12), "roofline_estimate(4e12, 1e10, 100e12, 2e12)")
    assert_close(_est.get("t_compute_s"), 0.04, "t_compute_s for 4e12 FLOPs at 100e12 FLOP/s")
    assert_close(_est.get("t_memory_s"), 0.005, "t_memory_s for 1e10 bytes at 2e12 bytes/s")
    assert_label(_est.get("bound"), "compute", "bound when T_compute > T_memory", choices=["compute", "memory"])
    del _est
# Questions 3.2 and 5.1 accept times and bounds from your roofline_estimate, as graded here (their public cases).
_keep_answers("roofline_estimate", roofline_estimate,
              [(60, 5, 100.0, 10.0), (912, 872, 1000.0, 100.0), (452, 648, 1000.0, 100.0)])
### BEGIN HIDDEN TESTS
def _q2_7_hidden_tests():
    keys = {"intensity_flop_per_byte", "ridge_flop_per_byte", "t_compute_s", "t_memory_s", "t_roofline_s", "bound"}

    def estimate(flops, nbytes, peak, bw):
        what = f"roofline_estimate({flops:g}, {nbytes:g}, {peak:g}, {bw:g})"
        est = as_dict(roofline_estimate(flops, nbytes, peak, bw), what)
        assert keys <= set(est), f"{what} must have the keys {sorted(keys)}; missing {sorted(keys - set(est))}"
        return est, what

    cases = [(3.1e9, 2.9e9, 65e12, 300e9), (7.0e13, 8.3e11, 312e12, 2.039e12), (1.2e15, 2.1e12, 989e12, 3.35e12),
             (5.0, 7.0, 11.0, 13.0), (2.0e6, 1.0e3, 1.0e9, 1.0e9)]
    with check("intensity, ridge point and the three times on hidden cases", weight=2):
        for flops, nbytes, peak, bw in cases:
            est, what = estimate(flops, nbytes, peak, bw)
            t_c, t_m = flops / peak, nbytes / bw
            assert_close(est["intensity_flop_per_byte"], flops / nbytes, f"{what}['intensity_flop_per_byte']",
                         formula="FLOPs / bytes")
            assert_close(est["ridge_flop_per_byte"], peak / bw, f"{what}['ridge_flop_per_byte']",
                         formula="peak FLOP/s / bytes/s")
            assert_close(est["t_compute_s"], t_c, f"{what}['t_compute_s']", formula="FLOPs / peak")
            assert_close(est["t_memory_s"], t_m, f"{what}['t_memory_s']", formula="bytes / bandwidth")
            assert_close(est["t_roofline_s"], max(t_c, t_m), f"{what}['t_roofline_s']",
                         formula="the larger of the two times")
    with check("bound on hidden cases (compute- and memory-bound)"):
        for flops, nbytes, peak, bw in cases:
            est, what = estimate(flops, nbytes, peak, bw)
            t_c, t_m = flops / peak, nbytes / bw
            assert_label(est["bound"], "compute" if t_c > t_m else "memory",
                         f"{what}['bound'] (T_compute {t_c!r} s, T_memory {t_m!r} s)", choices=("compute", "memory"))
    with check("a tie, T_compute == T_memory, is 'memory' (compute-bound only when T_compute > T_memory, as just "
               "above the tie)"):
        est, what = estimate(8.0, 4.0, 2.0, 1.0)
        assert_label(est["bound"], "memory", f"{what}['bound'] (T_compute = T_memory = 4.0 s)",
                     choices=("compute", "memory"))
        est, what = estimate(9.0, 4.0, 2.0, 1.0)  # a constant label cannot pass this check
        assert_label(est["bound"], "compute", f"{what}['bound'] (T_compute 4.5 s > T_memory 4.0 s)",
                     choices=("compute", "memory"))

    # What Questions 3.2 and 5.1's hidden tests evaluate: Question 3.2's rows (functions as terms (c, i, j) of
    # c B^i N^j, cases, peak, bandwidth) ...
    D, H, L, n = 1600, 25, 48, 2
    tables = [([(1, 5), (7, 2), (3, 3), (40, 1)], [(3, 1, 2), (11, 1, 0)], [(2, 1, 0), (5, 0, 2)], 50.0, 20.0),
              ([(2, 9), (9, 2)], [(1, 3, 1)], [(1, 1, 3)], 1e3, 1e3),
              ([(1, 32), (1, 1024), (64, 32), (64, 1024)], [(L * (24 * D * D + 5 * D), 1, 1), (L * (4 * D + 5 * H), 1, 2)],
               [(L * n * 22 * D, 1, 1), (L * n * (12 * D * D + 5 * D), 0, 0), (L * n * 6 * H, 1, 2)], 65e12, 300e9),
              ([(1, 4), (2, 2)], [(8, 1, 1)], [(2, 1, 1)], 4.0, 1.0), ([(1, 4)], [(9, 1, 1)], [(2, 1, 1)], 4.0, 1.0)]
    calls = [(_polynomial(flops_terms)(B, N), _polynomial(bytes_terms)(B, N), peak, bw)
             for cases, flops_terms, bytes_terms, peak, bw in tables for B, N in cases]
    # ... and Question 5.1's correct counts of a forward pass and of a decode step (B, N, D, H, L, n, peak, bandwidth)
    predictions = ([(B, N, 1600, 25, 48, 2, 65e12, 300e9) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024)]]
                   + [(B, N, 1600, 25, 48, 2, 989e12, 3.35e12) for B, N in [(1, 32), (64, 1024)]]
                   + [(4, 64, 128, 4, 2, 4, 1.2e12, 4e10), (3, 7, 20, 4, 5, 4, 1e6, 1e5), (2, 100, 64, 8, 2, 2, 1e3, 1e4)])
    for B, N, D, H, L, n, peak, bw in predictions:
        calls.append((L * (24 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D),
                      L * n * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D), peak, bw))
        calls.append((L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D),
                      L * n * (20 * B * D + 12 * D * D + 2 * B * N * D + 4 * B * H * N + 5 * D), peak, bw))
    _keep_answers("roofline_estimate", roofline_estimate, calls)


_q2_7_hidden_tests()
del _q2_7_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 2.3")


# %% [markdown]
# #### Question 2.4 (3 points) <!-- grade ids q2_8_* -->
#
# The cell below applies your functions to one layer with $B = 16$, $D = 4096$, $N = 16384$, $H = 16$ in fp16
# on an A100 80GB SXM (312 TFLOP/s dense fp16 tensor cores, 2.039 TB/s; NVIDIA A100 datasheet). Run it, then
# explain: which of multi-head attention and the MLP is memory-bound and which compute-bound, and *why*,
# in terms of what each one's bytes are made of and how the FLOPs and the bytes grow with $N$.

# %%
A100_PEAK_FLOPS_PER_S, A100_BANDWIDTH_BYTES_PER_S = 312e12, 2.039e12
a100_case = dict(B=16, N=16384, D=4096, H=16, bytes_per_element=2)
with uses_answers("Question 2.2", "Question 2.3"):
    _costs = layer_costs(**a100_case)
    _mha = [sum(_costs[op][i] for op in ("scores", "mask", "softmax", "attention_value")) for i in (0, 1)]
    a100_rows = {
        "multi-head attention": roofline_estimate(*_mha, A100_PEAK_FLOPS_PER_S, A100_BANDWIDTH_BYTES_PER_S),
        "MLP": roofline_estimate(*_costs["mlp"], A100_PEAK_FLOPS_PER_S, A100_BANDWIDTH_BYTES_PER_S),
    }
    print(pd.DataFrame(a100_rows).T.to_string(float_format=lambda x: f"{x:.4g}"))
    plot_roofline("A100-80GB (fp16)", A100_PEAK_FLOPS_PER_S / 1e12, A100_BANDWIDTH_BYTES_PER_S / 1e12,
                  {name: row["intensity_flop_per_byte"] for name, row in a100_rows.items()})
    plt.show()

# %% [markdown] nbgrader={"grade": true, "grade_id": "q2_8_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# The ridge point of the A100 is $312/2.039 \approx 153$ FLOP/byte. Multi-head attention has an arithmetic
# intensity of about 85 FLOP/byte, below the ridge: it is **memory-bound**. The MLP has about 3,200 FLOP/byte,
# far above it: **compute-bound**.
#
# Why: MHA's bytes are dominated by the attention matrices. Each of the $H$ heads writes and reads an
# $N \times N$ matrix several times (scores, mask, softmax, $AV$: $6HBN^2$ elements), while its FLOPs are
# $4BN^2D + 5HBN^2$. Both grow as $N^2$, so the intensity tends to a constant,
# $\approx 4D / (6Hn) = 4 \cdot 4096 / (6 \cdot 16 \cdot 2) \approx 85$, no matter how long the sequence:
# every score is moved several times (six elements of traffic) but used in only $\approx 4D/H = 1024$ FLOPs
# ($D/H = 256$). The MLP instead moves $O(BND)$ activations plus $O(D^2)$ weights while doing $O(BND^2)$ FLOPs;
# its intensity is about $16D/(10n) \approx 3{,}300$ because every weight is reused for all $BN$ tokens. (This is
# why fused attention kernels such as FlashAttention, which never write the $N \times N$ matrices to memory, help
# so much.)
# === BEGIN MARK SCHEME ===
# 3 points in total:
# - 1 point: MHA memory-bound (intensity ~85 < ridge ~153) and MLP compute-bound (~3,200 > ridge), with the
#   numbers or the comparison to the ridge point.
# - 1 point: MHA's traffic is dominated by the H per-head N x N score/probability matrices, which grow with
#   N^2 just like its FLOPs, so its intensity stays bounded (~4D/(6Hn)) whatever N.
# - 1 point: the MLP reuses each weight for all B*N tokens: FLOPs ~ B N D^2 vs bytes ~ B N D + D^2, so its
#   intensity grows with D (and with B N until the weights stop mattering).
# Carry-forward: judge the numbers against the student's own table (Questions 2.2, 2.3); a mistake there is
# charged in its own question only, so a correct argument from the student's own numbers earns full marks.
# === END MARK SCHEME ===

# %% [markdown]
# # Part 3: GPT-2 XL without a KV cache
#
# GPT-2 XL has $L = 48$ layers, width $D = 1600$, $H = 25$ heads (of width 64), an MLP of width $4D = 6400$ and a
# vocabulary of 50,257 tokens. Each layer is: Q/K/V projections, causal multi-head attention, output projection,
# MLP. We keep the conventions of Part 2 (embeddings, layer norms, residuals and the LM head are left out) and
# use fp16 ($n = 2$).
#
# Without a cache, generating the next token of $B$ sequences of length $N$ means running the whole model on
# all $B \times N$ tokens again.
#
# #### Question 3.1 (6 points)
#
# Write `gpt2_forward_flops(B, N, D, H, num_layers)` and
# `gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element)`: the FLOPs and bytes of a forward pass over
# $B \times N$ tokens through `num_layers` such layers. (Your `layer_costs` of Part 2 is the building block: a
# correct answer has the form $L(c_1 BND^2 + c_2 BN^2D + c_3 HBN^2 + c_4 BND)$ FLOPs and
# $nL(c_5 BND + c_6 D^2 + c_7 HBN^2 + c_8 D)$ bytes. The tests also accept `num_layers` times the sum of the rows
# of your own `layer_costs`.)

# %%
GPT2_XL = dict(D=1600, H=25, num_layers=48)  # n_embd, n_head, n_layer of GPT-2 XL
FP16_BYTES = 2
# The T4 numbers used throughout Parts 3, 4 and 6 (NVIDIA T4 datasheet: 65 TFLOP/s fp16 with tensor cores; the
# datasheet lists 320 GB/s, we use a round 300 GB/s).
T4_PEAK_FLOPS_PER_S, T4_BANDWIDTH_BYTES_PER_S = 65e12, 300e9
T4_CASES = [(1, 32), (1, 1024), (64, 32), (64, 1024)]  # (B, N)


# %% nbgrader={"grade": false, "grade_id": "q3_1_gpt2_forward_flops", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt2_forward_flops(B, N, D, H, num_layers):
    """FLOPs of a forward pass of B sequences of N tokens through num_layers GPT-2 layers (no cache).

    Returns:
        int: FLOPs (projections, causal MHA, output projection and MLP of every layer).
    """
    ### BEGIN SOLUTION
    # Per layer: L (24 B N D^2 + 4 B N^2 D + 5 H B N^2 + 5 B N D) in all.
    return num_layers * sum(flops for flops, _ in layer_costs(B, N, D, H, 2).values())
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q3_1_gpt2_forward_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):
    """Bytes of a forward pass of B sequences of N tokens through num_layers GPT-2 layers (no cache).

    Returns:
        int: bytes read plus written under the rules of Part 2.
    """
    ### BEGIN SOLUTION
    # Per layer: n L (22 B N D + 12 D^2 + 6 H B N^2 + 5 D) in all.
    return num_layers * sum(nbytes for _, nbytes in layer_costs(B, N, D, H, bytes_per_element).values())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_1_gpt2_forward_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# A mistake in Part 2 is charged once: num_layers times the sum of the rows of your own layer_costs (Question 2.2,
# as its test kept them) is accepted too.
def _forward_flops_carried(B, N, D, H, L):
    return carried(lambda: L * sum(flops for flops, _ in _kept_layer_costs(B, N, D, H, 2).values()))


def _forward_bytes_carried(B, N, D, H, L, n):
    return carried(lambda: L * sum(nbytes for _, nbytes in _kept_layer_costs(B, N, D, H, n).values()))


with check("public: gpt2_forward_flops(1, 2, 4, 2, 1)"):
    assert_or_carried(
        lambda want, got=gpt2_forward_flops(1, 2, 4, 2, 1): assert_integer(
            got, want, "gpt2_forward_flops(1, 2, 4, 2, 1)",
            formula="One layer: projections, MHA, output projection, MLP."),
        912, _forward_flops_carried(1, 2, 4, 2, 1))
with check("public: gpt2_forward_bytes(1, 2, 4, 2, 1, 2)"):
    assert_or_carried(
        lambda want, got=gpt2_forward_bytes(1, 2, 4, 2, 1, 2): assert_integer(
            got, want, "gpt2_forward_bytes(1, 2, 4, 2, 1, 2)",
            formula="One layer: projections, MHA, output projection, MLP."),
        872, _forward_bytes_carried(1, 2, 4, 2, 1, 2))
# Question 5.1 accepts predictions built from your counts, as graded here.
_keep_answers("gpt2_forward_flops", gpt2_forward_flops, [(1, 2, 4, 2, 1)])
_keep_answers("gpt2_forward_bytes", gpt2_forward_bytes, [(1, 2, 4, 2, 1, 2)])
### BEGIN HIDDEN TESTS
def _q3_1_hidden_tests():
    def flops(B, N, D, H, L):
        return L * (24 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D)

    def nbytes(B, N, D, H, L, n):
        return L * n * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D)

    hint = ("Per layer: Q/K/V projections + MHA (H heads of width D // H) + output projection + MLP, times "
            "num_layers; check each part against Part 2.")
    gpt2_xl = [(B, N, 1600, 25, 48, 2) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024), (3, 7)]]
    other = [(3, 7, 20, 4, 5, 4), (2, 11, 768, 12, 12, 2), (5, 1, 36, 3, 2, 2), (1, 9, 64, 64, 3, 4)]
    with check("gpt2_forward_flops on GPT-2 XL and other shapes",
               weight=2):
        for B, N, D, H, L, n in gpt2_xl + other:
            assert_or_carried(
                lambda want, got=gpt2_forward_flops(B, N, D, H, L): assert_integer(
                    got, want, f"gpt2_forward_flops{(B, N, D, H, L)}",
                    formula=hint),
                flops(B, N, D, H, L), _forward_flops_carried(B, N, D, H, L))
    with check("gpt2_forward_bytes on GPT-2 XL and other shapes",
               weight=2):
        for B, N, D, H, L, n in gpt2_xl + other:
            assert_or_carried(
                lambda want, got=gpt2_forward_bytes(B, N, D, H, L, n): assert_integer(
                    got, want, f"gpt2_forward_bytes{(B, N, D, H, L, n)}",
                    formula=hint),
                nbytes(B, N, D, H, L, n), _forward_bytes_carried(B, N, D, H, L, n))
    # Question 5.1's hidden cases (B, N, D, H, L, n)
    later = [(B, N, 1600, 25, 48, 2) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024)]] + [
        (4, 64, 128, 4, 2, 4), (3, 7, 20, 4, 5, 4), (2, 100, 64, 8, 2, 2)]
    _keep_answers("gpt2_forward_flops", gpt2_forward_flops, [case[:5] for case in later])
    _keep_answers("gpt2_forward_bytes", gpt2_forward_bytes, later)


_q3_1_hidden_tests()
del _q3_1_hidden_tests
### END HIDDEN TESTS
del _forward_flops_carried, _forward_bytes_carried
finish_checks("Question 3.1")


# %% [markdown]
# #### Question 3.2 (3 points)
#
# Write `roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s)`. For every
# `(B, N)` in `cases` it evaluates `flops_fn(B, N)` and `bytes_fn(B, N)` and returns a dict mapping the tuple
# `(B, N)` to a dict with the keys `"flops"`, `"bytes"`, `"t_compute_s"`, `"t_memory_s"` and `"bound"`
# (`"compute"` when $T_\text{compute} > T_\text{memory}$, else `"memory"`). We use it for the T4 cases now and
# with the KV cache in Part 4.

# %% nbgrader={"grade": false, "grade_id": "q3_2_roofline_table", "locked": false, "schema_version": 3, "solution": true, "task": false}
def roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s):
    """Roofline numbers for several (B, N) cases.

    Args:
        cases (list[tuple[int, int]]): (B, N) pairs.
        flops_fn (callable): (B, N) -> FLOPs.
        bytes_fn (callable): (B, N) -> bytes.
        peak_flops_per_s (float): peak compute in FLOP/s.
        bandwidth_bytes_per_s (float): memory bandwidth in bytes/s.

    Returns:
        dict: (B, N) -> {"flops", "bytes", "t_compute_s", "t_memory_s", "bound"}.
    """
    ### BEGIN SOLUTION
    table = {}
    for B, N in cases:
        flops, nbytes = flops_fn(B, N), bytes_fn(B, N)
        t_compute_s, t_memory_s = flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s
        table[(B, N)] = {"flops": flops, "bytes": nbytes, "t_compute_s": t_compute_s, "t_memory_s": t_memory_s,
                         "bound": "compute" if t_compute_s > t_memory_s else "memory"}
    return table
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q3_2_roofline_table_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
@kernel_side
def _roofline_table_of_polynomials(cases, flops_terms, bytes_terms, peak_flops_per_s, bandwidth_bytes_per_s):
    """roofline_table(cases, flops_fn, bytes_fn, ...) where flops_fn and bytes_fn are the polynomials in (B, N) of
    the given terms (see _polynomial); the functions are built next to your code, which calls them."""
    return roofline_table(cases, _polynomial(flops_terms), _polynomial(bytes_terms), peak_flops_per_s,
                          bandwidth_bytes_per_s)


def _roofline_row(table, B, N, where):
    """Row (B, N) of a roofline_table result, with its five keys."""
    row = as_dict(as_dict(table, "roofline_table(...)").get((B, N)), f"{where}: the row of key ({B}, {N})")
    assert {"flops", "bytes", "t_compute_s", "t_memory_s", "bound"} <= set(row), (
        f"{where} must have the keys flops, bytes, t_compute_s, t_memory_s, bound; got {sorted(row)}")
    return row


# A mistake in Question 2.3 is charged once: a row built with your own roofline_estimate (as its test kept it) is
# accepted too.
def _estimated(flops, nbytes, peak, bw, key):
    """What your own roofline_estimate gave for ``key`` (a number; the bound as a label) when Question 2.3 was graded,
    or None."""
    return carried(_kept_estimate, flops, nbytes, peak, bw, key)


# flops_fn(B, N) = 10 B N, bytes_fn(B, N) = B + N
with check("public: roofline_table([(2, 3)], ...) with flops_fn = 10 B N, bytes_fn = B + N, 100 FLOP/s, 10 bytes/s"):
    _table = as_dict(_roofline_table_of_polynomials([(2, 3)], [(10, 1, 1)], [(1, 1, 0), (1, 0, 1)], 100.0, 10.0),
                     "roofline_table([(2, 3)], ...)")
    assert set(_table) == {(2, 3)}, f"roofline_table must return a dict keyed by the (B, N) tuples, got keys {list(_table)}"
    _row = _roofline_row(_table, 2, 3, "roofline_table row (2, 3)")
    assert_or_carried(
        lambda want, got=_row["t_compute_s"]: assert_close(
            got, want, "t_compute_s of 60 FLOPs at 100 FLOP/s"),
        0.6, _estimated(60, 5, 100.0, 10.0, "t_compute_s"))
    assert_label(_row["bound"], "compute", "bound of 0.6 s of compute against 0.5 s of memory traffic",
                 choices=["compute", "memory"])
    del _table, _row
### BEGIN HIDDEN TESTS
def _q3_2_hidden_tests():
    def table_of(cases, flops_terms, bytes_terms, peak, bw):
        table = as_dict(_roofline_table_of_polynomials(cases, flops_terms, bytes_terms, peak, bw),
                        f"roofline_table({cases}, ...)")
        assert set(table) == set(cases), (
            f"roofline_table must map each (B, N) tuple in {cases} to its row; got keys {list(table)}")
        return table

    def values_of(cases, flops_terms, bytes_terms, peak, bw):
        table, flops_fn, bytes_fn = table_of(cases, flops_terms, bytes_terms, peak, bw), _polynomial(flops_terms), _polynomial(bytes_terms)
        for B, N in cases:
            where = f"roofline_table row ({B}, {N}) with peak {peak:g} FLOP/s and {bw:g} bytes/s"
            row, flops, nbytes = _roofline_row(table, B, N, where), flops_fn(B, N), bytes_fn(B, N)
            assert_close(row["flops"], flops, f"{where}: flops", formula="flops_fn(B, N)")
            assert_close(row["bytes"], nbytes, f"{where}: bytes", formula="bytes_fn(B, N)")
            assert_or_carried(
                lambda want, got=row["t_compute_s"]: assert_close(
                    got, want, f"{where}: t_compute_s",
                    formula="flops / peak"),
                flops / peak, _estimated(flops, nbytes, peak, bw, "t_compute_s"))
            assert_or_carried(
                lambda want, got=row["t_memory_s"]: assert_close(
                    got, want, f"{where}: t_memory_s",
                    formula="bytes / bandwidth"),
                nbytes / bw, _estimated(flops, nbytes, peak, bw, "t_memory_s"))

    def bounds_of(cases, flops_terms, bytes_terms, peak, bw):
        table, flops_fn, bytes_fn = table_of(cases, flops_terms, bytes_terms, peak, bw), _polynomial(flops_terms), _polynomial(bytes_terms)
        for B, N in cases:
            where = f"roofline_table row ({B}, {N}) with peak {peak:g} FLOP/s and {bw:g} bytes/s"
            flops, nbytes = flops_fn(B, N), bytes_fn(B, N)
            expected = "compute" if flops / peak > nbytes / bw else "memory"
            got = _roofline_row(table, B, N, where)["bound"]
            own = _estimated(flops, nbytes, peak, bw, "bound")
            if own is not None and as_label(got, f"{where}: bound") == own:
                continue  # the bound your own roofline_estimate gives (Question 2.3 is charged for it)
            assert_label(got, expected, f"{where}: bound (T_compute {flops / peak!r} s, T_memory {nbytes / bw!r} s)",
                         choices=("compute", "memory"))

    # Functions as terms (c, i, j) of c B^i N^j. Asymmetric in B and N, so swapped arguments are caught.
    polynomial_cases = [([(1, 5), (7, 2), (3, 3), (40, 1)], [(3, 1, 2), (11, 1, 0)], [(2, 1, 0), (5, 0, 2)], 50.0, 20.0),
                        ([(2, 9), (9, 2)], [(1, 3, 1)], [(1, 1, 3)], 1e3, 1e3)]
    # GPT-2 XL (D = 1600, H = 25, L = 48, fp16) without a cache on the T4:
    # FLOPs L (24 B N D^2 + 4 B N^2 D + 5 H B N^2 + 5 B N D), bytes L n (22 B N D + 12 D^2 + 6 H B N^2 + 5 D).
    D, H, L, n = 1600, 25, 48, 2
    gpt2_xl = ([(1, 32), (1, 1024), (64, 32), (64, 1024)],
               [(L * (24 * D * D + 5 * D), 1, 1), (L * (4 * D + 5 * H), 1, 2)],
               [(L * n * 22 * D, 1, 1), (L * n * (12 * D * D + 5 * D), 0, 0), (L * n * 6 * H, 1, 2)], 65e12, 300e9)
    with check("flops, bytes and the two times of every (B, N) row, keyed by the tuple (B, N)", weight=2):
        for case in polynomial_cases + [gpt2_xl]:
            values_of(*case)
    with check("bound of every row, GPT-2 XL on the T4 included"):
        for case in polynomial_cases + [gpt2_xl]:
            bounds_of(*case)
    with check("a tie, T_compute == T_memory, is 'memory' (and just above the tie, 'compute')"):
        bounds_of([(1, 4), (2, 2)], [(8, 1, 1)], [(2, 1, 1)], 4.0, 1.0)
        bounds_of([(1, 4)], [(9, 1, 1)], [(2, 1, 1)], 4.0, 1.0)  # a constant label cannot pass this check


_q3_2_hidden_tests()
del _q3_2_hidden_tests
### END HIDDEN TESTS
del _roofline_row, _estimated
finish_checks("Question 3.2")


# %% [markdown]
# Your table for GPT-2 XL on the T4:


# %%
def show_roofline_table(table, title):
    """Print a roofline_table result with readable units (GFLOP, GB, ms, FLOP/byte)."""
    rows = [{"B": B, "N": N, "GFLOP": row["flops"] / 1e9, "GB": row["bytes"] / 1e9,
             "FLOP/byte": row["flops"] / row["bytes"], "t_compute_ms": row["t_compute_s"] * 1e3,
             "t_memory_ms": row["t_memory_s"] * 1e3, "bound": row["bound"]} for (B, N), row in table.items()]
    print(title)
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:,.4g}"))


t4_no_cache = None  # the table of Part 3, which Part 4 compares with
with uses_answers("Question 3.1", "Question 3.2"):
    t4_no_cache = roofline_table(
        T4_CASES,
        lambda B, N: gpt2_forward_flops(B, N, **GPT2_XL),
        lambda B, N: gpt2_forward_bytes(B, N, **GPT2_XL, bytes_per_element=FP16_BYTES),
        T4_PEAK_FLOPS_PER_S, T4_BANDWIDTH_BYTES_PER_S)
    show_roofline_table(t4_no_cache, "GPT-2 XL forward pass without a KV cache, T4 (65 TFLOP/s, 300 GB/s):")

# %% [markdown]
# #### Question 3.3 (3 points)
#
# For the four cases: which are compute-bound and which memory-bound? Explain the pattern: why does going from
# $B = 1$ to $B = 64$ at $N = 32$ change the answer, and why does $N = 1024$ stay (or become) memory-bound even at
# $B = 64$? Name the term of your formulas that dominates the bytes in each case.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q3_3_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# Only $(B, N) = (64, 32)$ is compute-bound; $(1, 32)$, $(1, 1024)$ and $(64, 1024)$ are memory-bound.
#
# At $(1, 32)$ the bytes are almost all weights ($576 D^2 n \approx 2.95$ GB for 48 layers) and each weight is
# used for only $BN = 32$ tokens: about 31 FLOP/byte, far below the T4's ridge point of $65\text{e}12 / 300\text{e}9
# \approx 217$. Raising $B$ to 64 multiplies the tokens that share each weight by 64 ($BN = 2048$), so the
# $BND^2$ FLOPs grow 64x while the weight bytes stay the same: the intensity rises above the ridge and the pass
# becomes compute-bound (93 ms of compute against 36 ms of traffic).
#
# At $N = 1024$ the attention matrices take over: $6HBN^2$ elements per layer ($288 HBN^2 n$ bytes in total)
# grow with $N^2$ and are used for only about $4D/H$ FLOPs per element, so their intensity is bounded (about
# 21 FLOP/byte for $D/H = 64$ in fp16) whatever $B$ is. At $(1, 1024)$ they are already ~15 GB of the 21 GB
# moved; at $(64, 1024)$ they are ~970 GB of 1,190 GB, and the pass is memory-bound even though the matmuls
# alone would be compute-bound.
# === BEGIN MARK SCHEME ===
# 3 points in total:
# - 1 point: correct classification: only (64, 32) compute-bound, the other three memory-bound.
# - 1 point: small B*N: weight bytes (12 D^2 per layer) dominate, each weight reused for only B*N tokens;
#   larger B raises reuse (intensity ~ B N) past the ridge (~217 FLOP/byte).
# - 1 point: large N: the H*B*N^2 attention-matrix traffic dominates and has low intensity (~4D/(6Hn)),
#   independent of B, so (64, 1024) is memory-bound again.
# Carry-forward: judge the classification against the student's own table (Questions 3.1, 3.2); a mistake there is
# charged in its own question only, so a correct argument from the student's own numbers earns full marks.
# === END MARK SCHEME ===

# %% [markdown]
# # Part 4: Decoding with a KV cache
#
# Recomputing the keys and values of all earlier tokens for every new token is wasteful: they do not change.
# A **KV cache** keeps, for every layer, the keys and values of all tokens seen so far, so that a decode step
# only processes the new token. Setting for this part (the same as a real decode step):
# - The cache already holds the keys and values of $N - 1$ tokens for each of the $B$ sequences, in fp16.
# - We decode **one new token per sequence**: the layer input is $X \in \mathbb{R}^{B \times 1 \times D}$.
# - The Q/K/V projections process the new token only; the K and V they write *are* the new cache entries
#   (they are not stored anywhere else). Attention then reads all $N$ keys and values (the $N - 1$ old ones and
#   the new one) from the cache: the keys once, by $QK^T$, and the values once, by $AV$.
# - There is **no mask**: the single query may attend to every cached position. Everything else follows the
#   rules of Part 2.
#
# You first count what a cached step costs (Questions 4.1 to 4.3), then build the cache and the cached decode step
# yourself (Question 4.5); Part 5 times your implementation.
#
# #### Question 4.1 (4 points)
#
# Write `kv_cache_bytes_per_layer(B, N, D, bytes_per_element)` and
# `kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element)`: the size of the cache of one layer, and of the
# whole model, holding the keys and values of $N$ tokens for each of $B$ sequences (all heads together).

# %% nbgrader={"grade": false, "grade_id": "q4_1_kv_cache_bytes_per_layer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kv_cache_bytes_per_layer(B, N, D, bytes_per_element):
    """Bytes of one layer's KV cache: keys and values of N tokens for B sequences, all heads.

    Returns:
        int: bytes.
    """
    ### BEGIN SOLUTION
    return 2 * B * N * D * bytes_per_element
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q4_1_kv_cache_bytes_total", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):
    """Bytes of the KV cache of the whole model (num_layers layers).

    Returns:
        int: bytes.
    """
    ### BEGIN SOLUTION
    return num_layers * kv_cache_bytes_per_layer(B, N, D, bytes_per_element)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_1_kv_cache_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# A mistake in the per-layer size is charged once: num_layers times your own kv_cache_bytes_per_layer is accepted
# as the total.
with check("public: kv_cache_bytes_per_layer(1, 3, 4, 2)"):
    _assert_count(kv_cache_bytes_per_layer, (1, 3, 4, 2), 48, "Keys and values, N tokens, D numbers per token, n bytes each.")
with check("public: kv_cache_bytes_total(1, 3, 4, 5, 2)"):
    assert_or_carried(
        lambda want, got=kv_cache_bytes_total(1, 3, 4, 5, 2): assert_integer(
            got, want, "kv_cache_bytes_total(1, 3, 4, 5, 2)",
            formula="Every layer has its own cache."),
        240, carried(lambda: 5 * _own_count(kv_cache_bytes_per_layer, 1, 3, 4, 2)))
### BEGIN HIDDEN TESTS
def _q4_1_hidden_tests():
    sizes = [(1, 1024, 1600, 48, 2), (64, 1024, 1600, 48, 2), (3, 7, 20, 5, 4), (7, 1, 12, 1, 2)]
    with check("kv_cache_bytes_per_layer = 2 B N D n on hidden sizes", weight=2):
        for B, N, D, L, n in sizes:
            _assert_count(kv_cache_bytes_per_layer, (B, N, D, n), 2 * B * N * D * n,
                          "K and V (2), for B sequences of N tokens, D = H x (D/H) numbers per token, n bytes.")
    with check("kv_cache_bytes_total = 2 L B N D n on hidden sizes", weight=2):
        for B, N, D, L, n in sizes:
            assert_or_carried(
                lambda want, got=kv_cache_bytes_total(B, N, D, L, n): assert_integer(
                    got, want, f"kv_cache_bytes_total{(B, N, D, L, n)}",
                    formula="num_layers times the per-layer cache."),
                2 * L * B * N * D * n, carried(lambda: L * _own_count(kv_cache_bytes_per_layer, B, N, D, n)))


_q4_1_hidden_tests()
del _q4_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 4.1")


# %% [markdown]
# #### Question 4.2 (8 points)
#
# Write `gpt2_decode_flops(B, N, D, H, num_layers)` and
# `gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element)`: the cost of one decode step (one new token for
# each of $B$ sequences whose cache holds $N - 1$ tokens) through `num_layers` layers. Go operation by operation
# as in Part 2: what are the shapes of $Q$, of the cached $K$ and $V$, of the scores of each head? (Your answer
# has the form FLOPs $= L(c_1 B + c_2 BN + \dots)$ and bytes $= nL(c_3 + c_4 B + c_5 BN + \dots)$; note
# which terms still carry an $H$.)

# %% nbgrader={"grade": false, "grade_id": "q4_2_gpt2_decode_flops", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt2_decode_flops(B, N, D, H, num_layers):
    """FLOPs of one decode step with a KV cache: B new tokens attending to N cached positions each.

    Returns:
        int: FLOPs of all layers.
    """
    ### BEGIN SOLUTION
    d_head = D // H
    projections = 2 * B * D * (3 * D) + 2 * B * D * D
    scores = H * (2 * B * N * d_head + B * N)  # one query row per head, scaled
    softmax = 3 * B * H * N
    attention_value = H * 2 * B * N * d_head
    mlp = 16 * B * D * D + 5 * B * D
    return num_layers * (projections + scores + softmax + attention_value + mlp)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q4_2_gpt2_decode_bytes", "locked": false, "schema_version": 3, "solution": true, "task": false}
def gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element):
    """Bytes of one decode step with a KV cache (weights, cache reads, activations).

    Returns:
        int: bytes of all layers.
    """
    ### BEGIN SOLUTION
    projections = 3 * (B * D + D * D + B * D)  # read x and a weight, write q / new k / new v
    scores = B * D + B * N * D + B * H * N  # read q and the N cached keys, write the scores
    softmax = 2 * B * H * N
    attention_value = B * H * N + B * N * D + B * D  # read probabilities and N cached values, write output
    output_projection = 2 * B * D + D * D
    mlp = 10 * B * D + 8 * D * D + 5 * D
    per_layer = projections + scores + softmax + attention_value + output_projection + mlp
    return num_layers * bytes_per_element * per_layer
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_2_gpt2_decode_tests", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
# A mistake in Part 2 is charged once: the projections, output projection and MLP of your own layer_costs
# (Question 2.2, as its test kept them) for one token (N = 1), plus the attention over the N cached positions, are
# accepted.
def _one_token_rows(B, D, H, n, index):
    """The projections, output projection and MLP of your own layer_costs for one token per sequence (N = 1)."""
    rows = _kept_layer_costs(B, 1, D, H, n)
    return sum(rows[op][index] for op in ("qkv_projection", "output_projection", "mlp"))


def _decode_flops_carried(B, N, D, H, L):
    return carried(lambda: L * (_one_token_rows(B, D, H, 2, 0) + 4 * B * N * D + 4 * B * H * N))


def _decode_bytes_carried(B, N, D, H, L, n):
    return carried(lambda: L * (_one_token_rows(B, D, H, n, 1) + n * (2 * B * D + 2 * B * N * D + 4 * B * H * N)))


with check("public: gpt2_decode_flops(1, 2, 4, 2, 1)"):
    assert_or_carried(
        lambda want, got=gpt2_decode_flops(1, 2, 4, 2, 1): assert_integer(
            got, want, "gpt2_decode_flops(1, 2, 4, 2, 1)",
            formula="One layer, one new token attending to N = 2 positions."),
        452, _decode_flops_carried(1, 2, 4, 2, 1))
with check("public: gpt2_decode_bytes(1, 2, 4, 2, 1, 2)"):
    assert_or_carried(
        lambda want, got=gpt2_decode_bytes(1, 2, 4, 2, 1, 2): assert_integer(
            got, want, "gpt2_decode_bytes(1, 2, 4, 2, 1, 2)",
            formula="One layer, one new token attending to N = 2 positions."),
        648, _decode_bytes_carried(1, 2, 4, 2, 1, 2))
# Questions 5.1 and 6.1 accept values built from your counts, as graded here.
_keep_answers("gpt2_decode_flops", gpt2_decode_flops, [(1, 2, 4, 2, 1)])
_keep_answers("gpt2_decode_bytes", gpt2_decode_bytes, [(1, 2, 4, 2, 1, 2)])
### BEGIN HIDDEN TESTS
def _q4_2_hidden_tests():
    def flops(B, N, D, H, L):
        return L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D)

    def nbytes(B, N, D, H, L, n):
        return L * n * (20 * B * D + 12 * D * D + 2 * B * N * D + 4 * B * H * N + 5 * D)

    hint = ("Per layer with one new token per sequence: projections and MLP with N = 1; per head one query row "
            "against N cached keys (scale: 1 FLOP per score; softmax: 3 per score; no mask); the cache is read "
            "once by Q K^T and once by A V; score traffic: write S, read+write softmax, read A.")
    gpt2_xl = [(B, N, 1600, 25, 48, 2) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024), (3, 7)]]
    other = [(3, 7, 20, 4, 5, 4), (2, 11, 768, 12, 12, 2), (5, 1, 36, 3, 2, 2), (1, 9, 64, 64, 3, 4)]
    with check("gpt2_decode_flops on GPT-2 XL and other shapes", weight=2):
        for B, N, D, H, L, n in gpt2_xl + other:
            assert_or_carried(
                lambda want, got=gpt2_decode_flops(B, N, D, H, L): assert_integer(
                    got, want, f"gpt2_decode_flops{(B, N, D, H, L)}",
                    formula=hint),
                flops(B, N, D, H, L), _decode_flops_carried(B, N, D, H, L))
    with check("gpt2_decode_bytes on GPT-2 XL and other shapes",
               weight=2):
        for B, N, D, H, L, n in gpt2_xl + other:
            assert_or_carried(
                lambda want, got=gpt2_decode_bytes(B, N, D, H, L, n): assert_integer(
                    got, want, f"gpt2_decode_bytes{(B, N, D, H, L, n)}",
                    formula=hint),
                nbytes(B, N, D, H, L, n), _decode_bytes_carried(B, N, D, H, L, n))
    # Questions 5.1 and 6.1's hidden cases (B, N, D, H, L, n)
    later = [(B, N, 1600, 25, 48, 2) for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024)]] + [
        (4, 64, 128, 4, 2, 4), (3, 7, 20, 4, 5, 4), (2, 100, 64, 8, 2, 2), (2, 9, 36, 3, 2, 2)]
    _keep_answers("gpt2_decode_flops", gpt2_decode_flops, [case[:5] for case in later])
    _keep_answers("gpt2_decode_bytes", gpt2_decode_bytes, later)


_q4_2_hidden_tests()
del _q4_2_hidden_tests
### END HIDDEN TESTS
del _decode_flops_carried, _decode_bytes_carried
finish_checks("Question 4.2")


# %% [markdown]
# The expected speedup of the cache is the roofline time of producing the next token **without** it (a forward pass
# over all $N$ tokens, your table of Part 3) divided by the roofline time **with** it (one decode step, your table
# below): $\max(T_\text{compute}, T_\text{memory})$ of each.

# %%
with uses_answers("Question 3.2", "Question 4.2"):
    t4_cached = roofline_table(
        T4_CASES,
        lambda B, N: gpt2_decode_flops(B, N, **GPT2_XL),
        lambda B, N: gpt2_decode_bytes(B, N, **GPT2_XL, bytes_per_element=FP16_BYTES),
        T4_PEAK_FLOPS_PER_S, T4_BANDWIDTH_BYTES_PER_S)
    show_roofline_table(t4_cached, "GPT-2 XL decode step with a KV cache, T4:")
    if t4_no_cache is None:
        print("Not run yet: the expected speedups need the table of Part 3 above (Questions 3.1 and 3.2).")
    else:
        for B, N in T4_CASES:
            without, with_cache = t4_no_cache[(B, N)], t4_cached[(B, N)]
            speedup = (max(without["t_compute_s"], without["t_memory_s"])
                       / max(with_cache["t_compute_s"], with_cache["t_memory_s"]))
            cache_gb = kv_cache_bytes_total(B, N, GPT2_XL["D"], GPT2_XL["num_layers"], FP16_BYTES) / 1e9
            print(f"B = {B:2d}, N = {N:4d}: expected speedup {speedup:6.1f}x, KV cache {cache_gb:6.2f} GB")

# %% [markdown]
# #### Question 4.3 (3 points) <!-- grade ids q4_4_* -->
#
# How does the KV cache change the FLOPs and the bytes of producing one token, and why? What happens to the
# arithmetic intensity: does decoding with a cache become more compute-bound or more memory-bound? Use your
# table (the four cases and the expected speedups) to support your answer.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q4_4_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# The cache removes the recomputation of the $N - 1$ old tokens: every term that carried a factor $N$
# (projections, MLP: $24BND^2 \to 24BD^2$) or $N^2$ (attention: $4BN^2D \to 4BND$) loses one factor of $N$, so
# the FLOPs drop by roughly $N$ times. The bytes drop much less: the weights ($12D^2$ per layer, about 2.95 GB
# for GPT-2 XL) must still be read in full for every step, and the cache itself ($2BND$ per layer) must be
# read; only the activations and the $N^2$ attention matrices shrink.
#
# Hence the arithmetic intensity falls sharply: with a cache each weight is used for only $B$ tokens, so the
# intensity is about $B$ FLOP/byte for small $N$ (about 1 at $B = 1$, about 50 at $B = 64, N = 32$) and it
# drops further as $N$ grows, because reading the cache costs $2BND$ elements for $4BND$ FLOPs (1 FLOP/byte in
# fp16). All four cases are memory-bound with the cache, even $(64, 32)$ which was compute-bound without it.
# The step is still much faster, because it does far less of both: the expected speedups of the table are 1.0x at
# $(1, 32)$ (both are dominated by reading the same weights), 6.6x at $(1, 1024)$, 7.4x at $(64, 32)$ and 49.8x
# at $(64, 1024)$. Decoding with a cache is memory-bound: its speed is set by how fast weights and cache can be
# read, which motivates batching, smaller (quantised) weights and caches, and speculative decoding.
# === BEGIN MARK SCHEME ===
# 3 points in total:
# - 1 point: FLOPs fall by about a factor N (no recomputation of the N-1 old tokens; N^2 terms become N).
# - 1 point: bytes fall much less: weights still read every step, plus the cache read (2BND per layer).
# - 1 point: arithmetic intensity falls (about B FLOP/byte, lower at large N), so decoding with a cache is more
#   memory-bound (all four cases memory-bound), while still faster overall; cites the expected speedups.
# Carry-forward: judge the numbers against the student's own table (Questions 4.1 and 4.2); a mistake there is
# charged in its own question only, so a correct argument from the student's own numbers earns full marks.
# === END MARK SCHEME ===

# %% [markdown]
# #### Bonus 4.4 (4 points) <!-- grade ids b4_5_* -->
#
# Modern models shrink the cache with **grouped-query attention** (GQA): the $H$ query heads share
# `num_kv_heads` key/value heads ($H$ a multiple of `num_kv_heads`; each head still has width $D/H$).
# Write `kv_cache_bytes_gqa(B, N, D, H, num_kv_heads, num_layers, bytes_per_element)` (the whole model's
# cache) and `max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes,
# weight_bytes)`: the largest number of sequences of $N$ tokens whose cache fits in `memory_bytes` next to the
# weights (a whole number, 0 if not even one fits; ignore activations).

# %% nbgrader={"grade": false, "grade_id": "b4_5_kv_cache_bytes_gqa", "locked": false, "schema_version": 3, "solution": true, "task": false}
def kv_cache_bytes_gqa(B, N, D, H, num_kv_heads, num_layers, bytes_per_element):
    """Bytes of the KV cache with grouped-query attention (num_kv_heads K/V heads of width D // H).

    Returns:
        int: bytes of all layers.
    """
    ### BEGIN SOLUTION
    return num_layers * 2 * B * N * num_kv_heads * (D // H) * bytes_per_element
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "b4_5_max_batch_in_memory", "locked": false, "schema_version": 3, "solution": true, "task": false}
def max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes, weight_bytes):
    """Largest B whose KV cache of N tokens per sequence fits in memory_bytes - weight_bytes.

    Returns:
        int: number of sequences (0 if none fits).
    """
    ### BEGIN SOLUTION
    per_sequence = kv_cache_bytes_gqa(1, N, D, H, num_kv_heads, num_layers, bytes_per_element)
    free = memory_bytes - weight_bytes
    return max(0, int(free // per_sequence))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b4_5_gqa_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# A mistake in kv_cache_bytes_gqa is charged once: the batch that fits by your own kv_cache_bytes_gqa of one
# sequence is accepted too.
def _max_batch_carried(N, D, H, G, L, n, mem, weights):
    return carried(lambda: max(0, int((mem - weights) // _own_count(kv_cache_bytes_gqa, 1, N, D, H, G, L, n))))


with check("public: kv_cache_bytes_gqa(1, 3, 8, 4, 2, 1, 2)"):
    _assert_count(kv_cache_bytes_gqa, (1, 3, 8, 4, 2, 1, 2), 48, "K and V of num_kv_heads heads of width D // H.")
with check("public: max_batch_in_memory(3, 8, 4, 2, 1, 2, 1000, 500)"):
    assert_or_carried(
        lambda want, got=max_batch_in_memory(3, 8, 4, 2, 1, 2, 1000, 500): assert_integer(
            got, want, "max_batch_in_memory(3, 8, 4, 2, 1, 2, 1000, 500)",
            formula="Whole sequences only (round down)."),
        10, _max_batch_carried(3, 8, 4, 2, 1, 2, 1000, 500))
### BEGIN HIDDEN TESTS
def _b4_5_hidden_tests():
    def cache(B, N, D, H, G, L, n):
        return L * 2 * B * N * G * (D // H) * n

    with check("kv_cache_bytes_gqa = 2 L B N num_kv_heads (D // H) n on hidden sizes", weight=2):
        for B, N, D, H, G, L, n in [(1, 1024, 1600, 25, 25, 48, 2), (4, 8192, 4096, 32, 8, 32, 2),
                                    (3, 7, 24, 6, 2, 5, 4), (2, 5, 64, 8, 1, 3, 2)]:
            _assert_count(kv_cache_bytes_gqa, (B, N, D, H, G, L, n), cache(B, N, D, H, G, L, n),
                          "2 (K and V) x B x N x num_kv_heads x (D // H) x n per layer, times num_layers.")

    def batches_of(cases):
        for N, D, H, G, L, n, mem, weights in cases:
            expected = max(0, int((mem - weights) // cache(1, N, D, H, G, L, n)))
            assert_or_carried(
                lambda want, got=max_batch_in_memory(N, D, H, G, L, n, mem, weights): assert_integer(
                    got, want, f"max_batch_in_memory{(N, D, H, G, L, n, mem, weights)}",
                    formula="floor((memory - weights) / cache bytes of one sequence)."),
                expected, _max_batch_carried(N, D, H, G, L, n, mem, weights))

    with check("max_batch_in_memory: whole sequences that fit next to the weights", weight=2):
        batches_of([(1024, 1600, 25, 25, 48, 2, 16e9, 3.1e9), (8192, 4096, 32, 8, 32, 2, 80e9, 16e9),
                       (7, 24, 6, 2, 5, 4, 10_000, 1_234)])
    with check("max_batch_in_memory: exactly filling the memory counts, and 0 when the weights do not fit"):
        batches_of([(4, 8, 4, 2, 1, 2, 128 * 3 + 64, 64), (5, 64, 8, 1, 3, 2, 100, 200)])


_b4_5_hidden_tests()
del _b4_5_hidden_tests
### END HIDDEN TESTS
del _max_batch_carried
finish_checks("Bonus 4.4")


# %% [markdown]
# #### Question 4.5 (12 points) <!-- grade ids q4_6_* -->
#
# Now build the cache. The model is the one Part 5 measures: a `GPT2LMHeadModel` from `transformers` (random
# weights). Its modules are `model.transformer.wte` (token embedding), `.wpe` (position embedding), `.h` (the
# blocks), `.ln_f` (final layer norm) and `model.lm_head`; block `i` computes
# $x \leftarrow x + \text{attn}(\text{ln\_1}(x))$, then $x \leftarrow x + \text{block.mlp}(\text{ln\_2}(x))$, where the
# attention projects with **one** matmul `block.attn.c_attn(h)` of width $3D$ (split it into $Q$, $K$, $V$ along the
# last dimension, each then viewed as $H$ heads of width $D/H$), scales the scores by $1/\sqrt{D/H}$, applies the
# softmax, multiplies by $V$, merges the heads back into width $D$ and applies `block.attn.c_proj`.
#
# 1. `StaticKVCache(num_layers, batch_size, num_heads, head_dim, max_len, dtype, device)` allocates, **once, in
#    `__init__`**, two tensors `keys` and `values` of shape `(num_layers, batch_size, num_heads, max_len, head_dim)`,
#    and sets the attribute `length` (an `int`: positions filled so far) to 0. Its memory is fixed by `max_len`:
#    $2 L B \cdot \text{max\_len} \cdot D \cdot n$ bytes, linear in the length (Question 4.1). Writing into it must
#    happen **in place** (slice assignment, `copy_`, `index_copy_`): never `torch.cat`, which copies the whole cache
#    at every step. The methods `update` and `advance` are a suggested structure.
# 2. `gpt2_step(model, input_ids, cache)` runs the tokens `input_ids` (int64, `(B, q)`) at positions
#    `cache.length .. cache.length + q - 1`: either a whole prompt on an empty cache (a **prefill**) or one new token
#    per sequence (a **decode step**, $q = 1$). In every layer it writes the new tokens' keys and values into the
#    cache and attends over positions `0 .. cache.length + q - 1` **read from the cache** (each new token sees only
#    positions up to its own: a causal mask among the new tokens; a single new token sees every position). At the
#    end it advances `cache.length` by `q` and returns the logits `(B, q, vocab_size)`. Write the attention yourself
#    or with `F.scaled_dot_product_attention`, from the modules named above; do not call `gpt2_decoder_forward` or
#    utils' `KVCache`, nor the forward of the model, of `model.transformer`, of a block or of `block.attn` (they run
#    the model's own attention and cache).
#
# The cache is the point of this question: a step that recomputes the earlier positions instead of reading them from
# your `keys` and `values`, or that hands them to the model library's own cache (`past_key_values`, transformers'
# `DynamicCache`), earns at most a quarter of the points.
#
# **Where it runs.** Part 5 times your `gpt2_step` on the GPU, in fp16, replayed as a CUDA graph, and sets
# `cache.length` back before each timed step (so may the tests). That needs three rules, which the tests check on
# the CPU too:
# - **dtype and device**: the buffers have the `dtype` and `device` given to `__init__`, and the step computes in the
#   model's dtype (the tests run it in float16 too: a float32 mask added to fp16 scores makes them float32);
# - **one device**: every tensor the step makes lives on the device of `input_ids` (`torch.arange(...,
#   device=input_ids.device)`): a tensor made on the CPU cannot be combined with the model's on the GPU (the tests
#   run a step with the model, the tokens and the cache on another device, PyTorch's `meta`);
# - **no host sync**: nothing in the step waits for the GPU's values: no `.item()`, `.tolist()`, `.cpu()`,
#   `.numpy()`, and no Python `if` on a tensor's value (a CUDA graph cannot contain them).
#
# The tests build small GPT-2 models in float32 and compare with the same model **without a cache** (a forward pass
# over all tokens so far, computed in float64): the logits of the prefill and of every greedy decode step must match
# to the float32 tolerance (relative $10^{-4}$, absolute $10^{-5}$: `checks.TENSOR_TOL`) and the greedy tokens must
# be the same. They use only the constructor, `keys`, `values`, `length` and `gpt2_step`, and they fill your own
# buffers in place. They check that a decode step reads the earlier positions from `cache.keys` and `cache.values`
# (its logits change when the test changes the cached keys or values in place, and equal the model without a cache
# when the test writes the keys and values of a prompt of its own there), that every call writes its new positions
# into `keys` and `values` and that they keep the same storage (`data_ptr()`) from the first call to the last, that no
# decode step copies the cached positions (`torch.cat` or `torch.stack` of them), and the three rules above.

# %% nbgrader={"grade": false, "grade_id": "q4_6_static_kv_cache", "locked": false, "schema_version": 3, "solution": true, "task": false}
class StaticKVCache:
    """A preallocated KV cache of a GPT-2-shaped model: the keys and values of every layer, written in place.

    Args:
        num_layers (int): decoder layers L.
        batch_size (int): sequences B.
        num_heads (int): attention heads H.
        head_dim (int): width of a head, D // H.
        max_len (int): positions the cache holds (the prompt plus every token to decode).
        dtype (torch.dtype): the model's dtype.
        device (torch.device): the model's device.

    Attributes:
        keys, values (torch.Tensor): (L, B, H, max_len, head_dim), allocated once in __init__.
        length (int): positions filled so far (0 when empty).
    """

    def __init__(self, num_layers, batch_size, num_heads, head_dim, max_len, dtype, device):
        ### BEGIN SOLUTION
        shape = (num_layers, batch_size, num_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        ### END SOLUTION

    def update(self, layer, key, value):
        """Write the q new tokens' key and value (B, H, q, head_dim) of ``layer`` at positions length .. length + q - 1,
        in place, and return (keys, values) of that layer for positions 0 .. length + q - 1: (B, H, length + q,
        head_dim) views of the buffers. ``length`` does not move here (``advance`` does, after the last layer)."""
        ### BEGIN SOLUTION
        end = self.length + key.shape[2]
        if end > self.keys.shape[3]:
            raise ValueError(f"the cache holds {self.keys.shape[3]} positions; {end} are needed")
        self.keys[layer, :, :, self.length:end] = key
        self.values[layer, :, :, self.length:end] = value
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        ### END SOLUTION

    def advance(self, num_tokens):
        """Commit ``num_tokens`` new positions (every layer has written them)."""
        ### BEGIN SOLUTION
        self.length += num_tokens
        ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "q4_6_gpt2_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
@torch.no_grad()
def gpt2_step(model, input_ids, cache):
    """A prefill or a decode step of a GPT2LMHeadModel through your StaticKVCache.

    Args:
        model: a transformers GPT2LMHeadModel (eval mode).
        input_ids (torch.Tensor): int64 (B, q), the tokens at positions cache.length .. cache.length + q - 1.
        cache (StaticKVCache): holds positions 0 .. cache.length - 1 of every layer; the new ones are written in place.

    Returns:
        torch.Tensor: logits (B, q, vocab_size) in the model's dtype; cache.length has grown by q.
    """
    ### BEGIN SOLUTION
    body, start = model.transformer, cache.length
    batch, new_tokens = input_ids.shape
    positions = torch.arange(start, start + new_tokens, device=input_ids.device)
    x = body.wte(input_ids) + body.wpe(positions)
    width, heads = x.shape[-1], model.config.n_head
    head_dim = width // heads
    # new token i (position start + i) sees the positions up to its own; a single new token sees them all
    future = torch.arange(start + new_tokens, device=x.device)[None, :] > positions[:, None]
    for layer, block in enumerate(body.h):
        qkv = block.attn.c_attn(block.ln_1(x)).split(width, dim=2)
        query, key, value = (t.view(batch, new_tokens, heads, head_dim).transpose(1, 2) for t in qkv)
        keys, values = cache.update(layer, key, value)
        scores = (query @ keys.transpose(-1, -2)) / math.sqrt(head_dim)
        if new_tokens > 1:
            scores = scores.masked_fill(future, float("-inf"))
        attended = torch.softmax(scores, dim=-1) @ values
        x = x + block.attn.c_proj(attended.transpose(1, 2).reshape(batch, new_tokens, width))
        x = x + block.mlp(block.ln_2(x))
    cache.advance(new_tokens)
    return model.lm_head(body.ln_f(x))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q4_6_kv_cache_tests", "locked": true, "points": 12, "schema_version": 3, "solution": false, "task": false}
# The tests use only the interface the question states (the constructor, keys, values, length, gpt2_step) and fill
# your own buffers in place. Reading the cache is the method this question asks for: when that check fails, the cell
# earns at most a quarter of its points.
@kernel_side
def _cached_generation(model, prompt, steps):
    """Greedy decoding with StaticKVCache and gpt2_step: a prefill of ``prompt`` (B, S), then ``steps`` decode steps
    of one token. Returns plain data: the logits of the prefill and of each step, the tokens chosen, cache.length and
    the data pointers of cache.keys / cache.values after each call, the bytes of the two buffers, and whether each
    call changed the keys and values of its new positions in every layer of the buffers."""
    config, (batch, prompt_len) = model.config, prompt.shape
    cache = StaticKVCache(config.n_layer, batch, config.n_head, config.n_embd // config.n_head, prompt_len + steps,
                          next(model.parameters()).dtype, prompt.device)
    record = {"bytes": [], "storage": [], "lengths": [], "tokens": [], "logits": [], "written": []}

    def note():
        record["storage"].append((cache.keys.data_ptr(), cache.values.data_ptr()))
        record["bytes"].append(cache.keys.numel() * cache.keys.element_size()
                               + cache.values.numel() * cache.values.element_size())

    def step(tokens):
        start, before = int(cache.length), (cache.keys.clone(), cache.values.clone())
        logits = gpt2_step(model, tokens, cache)
        new = slice(start, start + tokens.shape[1])
        record["written"].append(all(not torch.equal(old[layer, :, :, new], buffer[layer, :, :, new])
                                     for old, buffer in zip(before, (cache.keys, cache.values))
                                     for layer in range(config.n_layer)))
        record["lengths"].append(int(cache.length))
        note()
        return logits

    note()
    with torch.no_grad():
        logits = step(prompt)
        record["prefill"] = logits.detach().clone()
        for _ in range(steps):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            record["tokens"].append(token.clone())
            logits = step(token)
            record["logits"].append(logits.detach().clone())
    return record


def _generation(records, model, prompt, steps, what):
    """_cached_generation(model, prompt, steps) as a dict, run once per case (``what``) and kept in ``records`` for
    the next check of the same case; a call that raises is not kept, so every check that needs it fails."""
    if what not in records:
        records[what] = as_dict(_cached_generation(model, prompt, steps), what)
    return records[what]


def _generation_matches(records, model, prompt, steps, what):
    """Values: the prefill's logits and every greedy step's token and logits equal the model without a cache."""
    record = _generation(records, model, prompt, steps, what)
    prefill, tokens, step_logits = _uncached_greedy(model, prompt, steps)
    assert_tensor_close(record["prefill"], prefill, f"{what}: logits of the prefill gpt2_step(model, prompt, cache)")
    for step, (want_token, want_logits) in enumerate(zip(tokens, step_logits)):
        got_token = as_tensor(record["tokens"][step], f"{what}: token {step}")
        assert torch.equal(got_token.cpu(), want_token), (
            f"{what}: greedy token of decode step {step} must be {want_token.flatten().tolist()} (the model without a "
            f"cache), got {got_token.flatten().tolist()}")
        assert_tensor_close(record["logits"][step], want_logits, f"{what}: logits of decode step {step}")


def _cache_stays_in_place(records, model, prompt, steps, what):
    """Memory: keys/values allocated once (2 L B max_len D n bytes), every call writing its new positions into the
    same storage, and cache.length counting the tokens."""
    config, (batch, prompt_len) = model.config, prompt.shape
    record = _generation(records, model, prompt, steps, what)
    max_len, n = prompt_len + steps, next(model.parameters()).element_size()
    expected_bytes = 2 * config.n_layer * batch * max_len * config.n_embd * n
    assert_integer(record["bytes"][0], expected_bytes, f"{what}: bytes of keys and values right after __init__",
                   formula="2 L B max_len D n (allocated once, before the first token)")
    storage = [tuple(pointers) for pointers in record["storage"]]
    assert len(set(storage)) == 1, (
        f"{what}: cache.keys and cache.values must keep their storage from __init__ to the last step (written in "
        f"place, never replaced by torch.cat or a new tensor); their data_ptr() changed "
        f"{sum(a != b for a, b in zip(storage, storage[1:]))} times in {len(storage) - 1} calls")
    assert all(size == expected_bytes for size in record["bytes"]), (
        f"{what}: the cache must stay {expected_bytes} bytes, got sizes {record['bytes']}")
    assert all(record["written"]), (
        f"{what}: every call of gpt2_step must write the keys and values of its new positions into cache.keys and "
        f"cache.values, in every layer; calls {[i for i, w in enumerate(record['written']) if not w]} (0: the "
        f"prefill) left them unchanged in some layer")
    expected_lengths = [prompt_len + step for step in range(steps + 1)]
    assert [as_integer(length, f"{what}: cache.length") for length in record["lengths"]] == expected_lengths, (
        f"{what}: cache.length after the prefill and each step must be {expected_lengths}, got {record['lengths']}")


_model, _prompt = _gpt2_for_tests(n_layer=2, n_embd=32, n_head=4, vocab_size=50, seed=0), _test_tokens(1, 5, 50, 1)
_records = {}
with check("public: prefill of 5 tokens and 3 greedy decode steps (B = 1) equal the model without a cache"):
    _generation_matches(_records, _model, _prompt, 3, "public case")
with check("public: keys and values allocated once, every call writing its new positions in place"):
    _cache_stays_in_place(_records, _model, _prompt, 3, "public case")
del _model, _prompt, _records
### BEGIN HIDDEN TESTS
@kernel_side
def _decode_after_cache_changes(model, prompt, token, seed):
    """The method: three times, prefill ``prompt`` (B, S) with gpt2_step into a new StaticKVCache and decode ``token``
    (B, 1): once as it is, once after adding noise to cache.keys in place, once after adding noise to cache.values in
    place (between the prefill and the decode step). Returns the three decode steps' logits and which of the model's
    own modules (the model, model.transformer, the blocks, their attention) ran their forward during the calls (best
    effort: measured next to the student's code)."""
    shape = model.config  # L, H and D of the model
    watched = {id(model): "model", id(model.transformer): "model.transformer"}
    for i, block in enumerate(model.transformer.h):
        watched.update({id(block): f"model.transformer.h[{i}]", id(block.attn): f"model.transformer.h[{i}].attn"})
    classes = {type(model), type(model.transformer), *(type(b) for b in model.transformer.h),
               *(type(b.attn) for b in model.transformer.h)}
    own = {cls: cls.__dict__.get("forward") for cls in classes}  # None: inherited
    ran = []

    def watching(forward):
        def watched_forward(self, *args, **kwargs):
            if id(self) in watched:
                ran.append(watched[id(self)])
            return forward(self, *args, **kwargs)
        return watched_forward

    try:
        for cls in classes:
            cls.forward = watching(cls.forward)
        logits, gen = [], torch.Generator().manual_seed(seed)
        for changed in (None, "keys", "values"):
            cache = StaticKVCache(shape.n_layer, prompt.shape[0], shape.n_head, shape.n_embd // shape.n_head,
                                  prompt.shape[1] + 1, model.lm_head.weight.dtype, prompt.device)
            with torch.no_grad():
                gpt2_step(model, prompt, cache)
                if changed is not None:
                    buffer = getattr(cache, changed)
                    buffer.add_(10 * torch.randn(buffer.shape, generator=gen, dtype=torch.float64).to(buffer.dtype))
                logits.append(gpt2_step(model, token, cache).detach().clone())
    finally:
        for cls, forward in own.items():
            if forward is None:
                del cls.forward
            else:
                cls.forward = forward
    return {"logits": logits, "forwards": sorted(set(ran))}


@kernel_side
def _decode_on_filled_cache(model, decoy, keys, values, token):
    """Prefill ``decoy`` (B, S) with gpt2_step into a StaticKVCache of S + 1 positions, write the test's ``keys`` and
    ``values`` (L, B, H, S, d) in place over positions 0 .. S - 1 of cache.keys / cache.values, and decode ``token``
    (B, 1): its logits."""
    num_layers, batch, heads, prompt_len, head_dim = keys.shape
    cache = StaticKVCache(num_layers, batch, heads, head_dim, prompt_len + 1, keys.dtype, keys.device)
    with torch.no_grad():
        gpt2_step(model, decoy, cache)
        cache.keys[:, :, :, :prompt_len] = keys
        cache.values[:, :, :, :prompt_len] = values
        cache.length = prompt_len
        return gpt2_step(model, token, cache).detach().clone()


@kernel_side
def _decode_step_copies(model, prompt, token):
    """Prefill ``prompt`` (B, S), then one decode step of ``token`` (B, 1): the element count of every result of a
    concatenation or an out-of-place scatter it made (torch.cat, torch.stack, index_copy, ...), the torch functions
    it called (record_torch_calls, which notices when the recording is switched off), and whether it wrote into both
    cache.keys and cache.values."""
    from torch.overrides import TorchFunctionMode

    copying = {"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack", "row_stack",
               "index_copy", "index_put", "index_add", "scatter", "slice_scatter", "select_scatter", "masked_scatter"}
    copies = []

    class CopySizes(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") in copying and isinstance(out, torch.Tensor):
                copies.append((func.__name__, out.numel()))
            return out

    shape = model.config  # L, H and D of the model
    cache = StaticKVCache(shape.n_layer, prompt.shape[0], shape.n_head, shape.n_embd // shape.n_head,
                          prompt.shape[1] + 1, model.lm_head.weight.dtype, prompt.device)
    with torch.no_grad():
        gpt2_step(model, prompt, cache)
        before = (cache.keys.clone(), cache.values.clone())
        with record_torch_calls() as called:
            with CopySizes():
                gpt2_step(model, token, cache)
    wrote = all(not torch.equal(old, buffer) for old, buffer in zip(before, (cache.keys, cache.values)))
    return {"copies": copies, "called": sorted(called), "wrote": wrote}


@kernel_side
def _buffers_made(num_layers, batch, heads, head_dim, max_len, dtype, device):
    """StaticKVCache(num_layers, batch, heads, head_dim, max_len, dtype, device): dtype and device of keys and
    values."""
    cache = StaticKVCache(num_layers, batch, heads, head_dim, max_len, dtype, torch.device(device))
    return [[str(t.dtype), str(t.device)] for t in (cache.keys, cache.values)]


@kernel_side
def _step_on_meta(model, prompt):
    """Part 5's rules, next to the student's code: a StaticKVCache in float16 on the meta device (a device without
    data: a tensor made on the CPU cannot be combined with its tensors, and .item() cannot run there), a float16 copy
    of ``model`` and ``prompt`` (B, S) on it, a prefill and one decode step, and the torch functions the decode step
    called. float32 instead when the cache ignores its dtype; nothing runs when it ignores its device (the buffers'
    check charges both)."""
    import copy

    shape = model.config  # L, H and D of the model
    sizes = (shape.n_layer, prompt.shape[0], shape.n_head, shape.n_embd // shape.n_head, prompt.shape[1] + 1)
    dtype = torch.float16
    cache = StaticKVCache(*sizes, dtype, torch.device("meta"))
    if cache.keys.dtype != dtype or cache.values.dtype != dtype:
        dtype = torch.float32
        cache = StaticKVCache(*sizes, dtype, torch.device("meta"))
    if cache.keys.device.type != "meta" or cache.values.device.type != "meta":
        return {"ran": False}
    report, called = {"ran": True, "error": None, "dtype": str(dtype)}, set()
    meta_model, tokens = copy.deepcopy(model).to(device="meta", dtype=dtype), prompt.to("meta")
    try:
        with torch.no_grad():
            gpt2_step(meta_model, tokens, cache)
            with record_torch_calls() as called:
                logits = gpt2_step(meta_model, tokens[:, -1:], cache)
        report["logits"] = [str(logits.device), list(logits.shape)]
    except Exception as exc:  # noqa: BLE001 - reported to the grader as text
        report["error"] = f"{type(exc).__name__}: {exc}"
    report["called"] = sorted(called)
    return report


def _q4_6_hidden_tests():
    model = _gpt2_for_tests(n_layer=3, n_embd=48, n_head=3, vocab_size=61, seed=4)
    prompt, records, facts = _test_tokens(2, 7, 61, 5), {}, {}
    token = torch.tensor([[3], [17]])
    what = "B = 2, 3 layers"
    with check("prefill and 6 greedy decode steps (B = 2, 3 layers, 3 heads) equal the model without a cache",
               weight=3):
        _generation_matches(records, model, prompt, 6, what)
    with check("the method: a decode step reads the earlier positions from your cache.keys and cache.values (its "
               "logits change when the test changes them in place) and runs the layers itself (no forward of the "
               "model, its blocks or their attention, which run the library's own cache)", weight=2, method=True):
        probe = as_dict(_decode_after_cache_changes(model, prompt, token, 7), f"{what}: the decode-step probe")
        forwards = list(probe["forwards"])
        assert not forwards, (
            f"{what}: gpt2_step must run every layer itself from the modules the question names (wte, wpe, ln_1, "
            f"attn.c_attn, attn.c_proj, mlp, ln_2, ln_f, lm_head); it ran the forward of {forwards}, which computes "
            f"the attention with the library's own cache")
        base, *changed = (as_tensor(logits, f"{what}: logits of a decode step").double() for logits in probe["logits"])
        for logits, which in zip(changed, ("keys", "values")):
            assert tuple(logits.shape) == tuple(base.shape) == (2, 1, 61), (
                f"{what}: a decode step must return logits of shape (2, 1, 61), got {tuple(logits.shape)}")
            moved = (logits - base).abs().max().item()
            assert moved > 1e-4, (
                f"{what}: a decode step must read the earlier positions from cache.{which}: after the test added noise "
                f"to cache.{which} in place (between the prefill and the step), its logits changed by at most {moved!r}; "
                f"the step does not use your cache (it recomputes the earlier positions, or keeps them elsewhere)")
    with check("a decode step on your cache, where the test wrote the keys and values of its own 9-token prompt "
               "in place, equals the model without a cache on that prompt and the new token", weight=2):
        own_prompt, decoy = _test_tokens(2, 9, 61, 6), _test_tokens(2, 9, 61, 8)
        keys, values = _prompt_keys_values(model, own_prompt)
        got = _decode_on_filled_cache(model, decoy, keys, values, token)
        reference = _uncached_logits(model, torch.cat([own_prompt, token], dim=1))[:, -1:]
        assert_tensor_close(got, reference, f"{what}: logits of one decode step after the test wrote the keys and "
                                            f"values of its own 9-token prompt over positions 0 .. 8 of cache.keys / "
                                            f"cache.values (gpt2_step must attend over them)")
    with check("preallocated and written in place: every call writes its new positions into the same storage, "
               "2 L B max_len D n bytes", weight=2):
        _cache_stays_in_place(records, model, prompt, 6, what)
    with check("a decode step writes into the cache in place and copies none of the cached positions (no torch.cat / "
               "torch.stack of the cache, written back or not: that copies the whole cache at every step)"):
        long_prompt = _test_tokens(2, 16, 61, 9)
        ops = as_dict(_decode_step_copies(model, long_prompt, token), f"{what}: the copies probe")
        assert_calls(ops["called"], f"{what}: a decode step")
        assert as_truth(ops["wrote"], "wrote"), (
            f"{what}: a decode step must write its new key and value into cache.keys and cache.values in place (after "
            f"a 16-token prefill, it left the buffers unchanged)")
        facts["writes the cache"] = True
        cached = 2 * 16 * 48  # B x (H x head_dim) x the 16 cached positions: one layer's keys
        big = sorted({str(name) for name, size in ops["copies"] if as_integer(size, "a copy's size") >= cached})
        assert not big, (
            f"{what}: a decode step after a 16-token prefill made a copy of at least one layer's cached keys "
            f"({cached} elements) with {big}: write the new position in place (slice assignment, copy_, index_copy_) "
            f"and attend over views of the buffers, never torch.cat, which copies the whole cache at every step")
    with check("the buffers have the dtype and device asked for (float16, float64, bfloat16; the meta device)"):
        for dtype, device in ((torch.float16, "cpu"), (torch.float64, "meta"), (torch.bfloat16, "meta")):
            made = _buffers_made(3, 2, 4, 5, 11, dtype, device)  # their shape and size: the in-place check's
            for name, (got_dtype, got_device) in zip(("keys", "values"), made):
                assert (str(got_dtype), torch.device(str(got_device)).type) == (str(dtype), device), (
                    f"StaticKVCache(3, 2, 4, 5, 11, {dtype}, {device!r}).{name} must have dtype {dtype} and be on "
                    f"{device}; got {got_dtype} on {got_device} (the measurement runs the model in fp16 on the GPU: "
                    f"allocate with dtype=dtype, device=device)")
    with check("runs as Part 5 runs it (on the GPU, fp16, in a CUDA graph): a prefill and a decode step with the "
               "model, tokens and cache in float16 on another device (meta), every tensor on the input's device, no "
               "host sync (.item(), .tolist(), .cpu(), an if on a tensor)"):
        assert "writes the cache" in facts, (
            f"{what}: a decode step that writes nothing into the cache (the check above) cannot be checked here")
        report = as_dict(_step_on_meta(model, prompt), f"{what}: the meta-device probe")
        if report["ran"]:  # else the buffers ignore their device: charged by the buffers' check alone
            syncs = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__repr__",
                     "__format__", "nonzero", "argwhere", "masked_select", "unique", "synchronize")
            assert_calls(report["called"], f"{what}: a decode step (run in a CUDA graph: no host sync)",
                         forbidden=syncs)
            assert report["error"] is None, (
                f"{what}: a prefill and a decode step in {report['dtype']} with the model, the tokens and the cache on "
                f"another device (meta) raised {report['error']}: make every tensor on the device of input_ids "
                f"(device=input_ids.device) in the model's dtype, and read no tensor's value in Python (a host sync)")
            assert report["logits"][0] == "meta", (
                f"{what}: the decode step's logits must be on the input's device (meta here), got {report['logits'][0]}")


_q4_6_hidden_tests()
del _q4_6_hidden_tests, _decode_after_cache_changes, _decode_on_filled_cache, _decode_step_copies, _buffers_made
del _step_on_meta
### END HIDDEN TESTS
del _cached_generation, _generation, _generation_matches, _cache_stays_in_place
finish_checks("Question 4.5")


# %% [markdown] deletable=false editable=false tags=["measure"]
# *Timed after grading, for no points:* on the course's grading GPU, `python -m course measure` times one decode step
# of your `gpt2_step` with your `StaticKVCache` on a GPT-2 XL-shaped model in float16 (seeded random weights), for
# B = 1 and 64 sequences after N = 1024 cached positions, checks its logits, and your feedback shows where it lands on
# that GPU's roofline, beside the reference solution.
#
# ```measure
# {
#     # One new token per sequence after N cached positions, eager (no CUDA graph), cache.length set back to N before
#     # each call. FLOP: 2 B (12 L D^2 + V D) for the matmuls and 4 B L (N + 1) D for the attention. Fewest bytes:
#     # the weights read once and every layer's cached keys and values read once.
#     "name": "decode_step",
#     "function": "gpt2_step",
#     "kind": "gpt2_decode",
#     "cache_class": "StaticKVCache",
#     "cells": ["q4_6_static_kv_cache", "q4_6_gpt2_step"],
#     "tests": ["q4_6_kv_cache_tests"],
#     "dtype": "float16",
#     "flops": "2 * B * (12 * n_layer * n_embd ** 2 + vocab_size * n_embd) + 4 * B * n_layer * (N + 1) * n_embd",
#     "bytes": "(12 * n_layer * n_embd ** 2 + vocab_size * n_embd + 2 * n_layer * B * (N + 1) * n_embd) * element_bytes",
#     "metric": "gbps",
#     "tolerance": 2e-2,
#     "warmup": 3,
#     "repeat": 10,
#     "sets": 2,
#     "timeout_s": 90.0,
#     "model": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257},
#     "tiny_model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50},
#     "shapes": [{"B": 1, "N": 1024}, {"B": 64, "N": 1024}],
#     "tiny_shapes": [{"B": 1, "N": 8}, {"B": 3, "N": 8}],
# }
# ```

# %% [markdown]
# # Part 5: Predictions against measurements
#
# Time to check the counts on real hardware, with **your** cache. We build a GPT-2-shaped model from `GPT2Config`
# with random weights (nothing is downloaded; at quick and cpu scale the model is small) and time how long it takes
# to produce the logits of the next token, with and without the cache, for several lengths $N$. Both ways run the
# model's own weights with the attention written out kernel by kernel (no fused attention), which is close to what
# Part 2 counts but not the same; compare each difference with your counts:
# - Q, K and V come from **one** fused matmul of width $3D$ (GPT-2's `c_attn`), which reads $X$ once instead of
#   three times, and it adds **biases** (so does the output projection; Part 2 has none there);
# - the scores are written by $QK^T$ and then **scaled in a separate pass** that reads and writes them again
#   (Part 2 fuses the scaling into the product);
# - the causal mask (only in a pass over several new tokens), the softmax and $AV$ are separate kernels, as Part 2
#   counts them; the heads' outputs are then copied back into one $(B, N, D)$ tensor (a transpose that is not free);
# - GPT-2's GELU runs as several elementwise kernels over $(B, N, 4D)$ (Part 2 fuses it into the first MLP
#   matmul), and the layer norms, residual additions and embeddings (not counted in Part 2) run too;
# - both ways end with the LM head for one token per sequence ($BDV$ multiply-adds and a $D \times V$ weight read,
#   about 5 % of GPT-2 XL's weights), which Part 2 leaves out.
#
# The measurement runs it in two ways:
# - **without a cache**: a forward pass over all $N$ tokens of $B$ sequences (`gpt2_decoder_forward` from
#   `utils.py`, then the LM head on the last position; the pass over the $N$ tokens is also what *prefill* costs);
# - **with a cache**: your `gpt2_step` prefills $N - 1$ tokens into your `StaticKVCache` of $N$ positions, then we
#   time one decode step of one new token per sequence (`cached_decode_step`): it writes its key and value into the
#   cache in place and reads the $N$ cached keys and values once, as Part 4 assumes. Each timed call first sets
#   `cache.length` back to $N - 1$, so every timed step is the same step.
#
# A decode step of GPT-2 XL launches hundreds of small kernels. Launched one by one from Python ("eager"), the
# CPU's launch work takes longer than the GPU's work, and the time measures the CPU. So every case is timed
# twice: eagerly, and replayed as a **CUDA graph** (`benchmark_eager_and_graphed`: the kernels are recorded
# once and relaunched with a single call, as inference engines do for decoding). The graph time is the one to
# compare with the roofline; on a CPU there are no graphs and both are the eager time. At teaching scale the
# model is GPT-2 XL in fp16; a case that does not fit in your GPU's memory is reported as out of memory. At cpu
# scale it is a 4-layer model of width 512 in float32, predicted with the matmul rate and copy bandwidth measured on
# your CPU: it shows the cache's speedup growing with $N$, and a cached step of 8 sequences costing far less than 8
# steps of one sequence, since both read the same weights (the cell prints how much more it costs: 2.2x to 2.5x one
# step in the course's cpu-scale run, `measured_runs.md`).
# What only a GPU shows (CUDA graphs, GPT-2 XL) is in `measured_runs.md` beside this notebook, Part 5.

# %%
# cpu scale: 4 layers of width 512 in float32 (about 50 MB of weights, more than a CPU's caches hold, so a batch-1
# decode step streams them from memory as a GPU does) and lengths 32 to 256: the cache's speedup grows with N, and
# a cached step of 8 sequences costs far less than 8 steps of one sequence (they read the same weights).
GPT2_MEASURE = dict(
    shape=at_scale(teaching=dict(n_layer=48, n_embd=1600, n_head=25), quick=dict(n_layer=2, n_embd=128, n_head=4),
                   cpu=dict(n_layer=4, n_embd=512, n_head=8)),
    vocab_size=at_scale(teaching=50257, quick=1000, cpu=1000),
    cases=at_scale(teaching=[(1, 32), (1, 256), (1, 1024), (64, 32), (64, 256), (64, 1024)],
                   quick=[(1, 16), (1, 64), (4, 16), (4, 64)],
                   cpu=[(1, 32), (1, 128), (1, 256), (8, 32), (8, 128), (8, 256)]),
    n_warmup=at_scale(teaching=3, quick=1, cpu=3),
    n_repeat=at_scale(teaching=10, quick=3, cpu=5),
)
MEASURE_DTYPE = torch.float16 if DEVICE.type == "cuda" else torch.float32


def build_gpt2(n_layer, n_embd, n_head, vocab_size, dtype=MEASURE_DTYPE, device=DEVICE):
    """A GPT-2 LM with random weights (no download), eager attention, on ``device`` in ``dtype``."""
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size, n_positions=1024,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    with torch.device(device):
        model = GPT2LMHeadModel(config)
    return model.to(dtype).eval()


def uncached_next_logits(model, tokens):
    """Logits (B, 1, vocab) of the token after ``tokens`` (B, N) without a cache: a pass over all N tokens
    (``gpt2_decoder_forward``, eager attention), then the LM head on the last position."""
    return model.lm_head(gpt2_decoder_forward(model, tokens)[:, -1:])


def cached_decode_step(model, new_token, cache, cached_len):
    """One decode step through your cache, the same step at every call: ``cache.length`` goes back to
    ``cached_len``, then ``gpt2_step`` writes ``new_token``'s (B, 1) keys and values at that position."""
    cache.length = cached_len
    return gpt2_step(model, new_token, cache)


@torch.no_grad()
def measure_gpt2_ms(model, B, N, n_warmup, n_repeat):
    """Latency of the next token's logits without a cache, and of one cached decode step, eager and as CUDA graphs.

    Returns:
        tuple: (no_cache, cache), each a dict with ``eager_ms``, ``graph_ms`` (None on a CPU) and
        ``measured_ms`` (the graph time where there is one) in ms; ``cache`` times one new token per sequence
        with N - 1 cached tokens (your StaticKVCache and gpt2_step) and also holds ``kernels_per_step``, the kernels
        that step launches; it is empty when Question 4.5 is not answered yet.
    """
    tokens = torch.randint(model.config.vocab_size, (B, N), device=DEVICE,
                           generator=torch.Generator(device=DEVICE).manual_seed(0))
    repeats = dict(n_warmup=n_warmup, n_repeat=n_repeat)
    no_cache = benchmark_eager_and_graphed(uncached_next_logits, model, tokens, **repeats)
    config = model.config
    try:
        cache = StaticKVCache(config.n_layer, B, config.n_head, config.n_embd // config.n_head, N, MEASURE_DTYPE,
                              DEVICE)
        gpt2_step(model, tokens[:, :-1], cache)  # prefill N - 1 tokens
    except NotImplementedError:
        return no_cache, {}
    step_args = (model, tokens[:, -1:], cache, N - 1)
    cached = benchmark_eager_and_graphed(cached_decode_step, *step_args, **repeats)
    cached["kernels_per_step"] = kernels_per_call(cached_decode_step, *step_args)
    return no_cache, cached


def kernels_per_call(fn, *args):
    """Kernels one call of fn launches (on a CPU: operator calls, roughly one kernel each on a GPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, schedule=default_schedule) as prof:
        for _ in range(10):  # default_schedule records steps 4 to 8
            fn(*args)
            prof.step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
    return count_cuda_kernels(prof, per_step=True)["total"]


# %%
gpt2_model = build_gpt2(**GPT2_MEASURE["shape"], vocab_size=GPT2_MEASURE["vocab_size"])
MEASURED_SHAPE = dict(D=gpt2_model.config.n_embd, H=gpt2_model.config.n_head, num_layers=gpt2_model.config.n_layer)
MEASURED_BYTES_PER_ELEMENT = torch.finfo(MEASURE_DTYPE).bits // 8
print(f"GPT-2-shaped model: {MEASURED_SHAPE}, {MEASURE_DTYPE}, "
      f"{sum(p.numel() for p in gpt2_model.transformer.parameters()) / 1e6:.1f} M parameters in the decoder stack")

gpt2_measured = []
if SCALE != "quick":
    print(f"Timing {len(GPT2_MEASURE['cases'])} cases: under a minute at cpu scale, about a minute on an H200 at "
          "teaching scale (the CUDA graphs are captured first).")
for B, N in progress(GPT2_MEASURE["cases"], "batch sizes and lengths"):
    status, result = run_oom_safe(measure_gpt2_ms, gpt2_model, B, N, GPT2_MEASURE["n_warmup"], GPT2_MEASURE["n_repeat"])
    row = {"B": B, "N": N}
    for kind, times in zip(("no_cache", "cache"), result if status == "ok" else ({}, {})):
        row[f"measured_{kind}_ms"] = times.get("measured_ms", float("nan"))
        row[f"eager_{kind}_ms"] = times.get("eager_ms", float("nan"))
    row["kernels_cache"] = result[1].get("kernels_per_step") if status == "ok" else None
    gpt2_measured.append(row)
    print(f"B = {B:3d}, N = {N:5d}: without cache {row['measured_no_cache_ms']:9.3f} ms (eager {row['eager_no_cache_ms']:9.3f}), "
          f"one cached decode step {row['measured_cache_ms']:7.3f} ms (eager {row['eager_cache_ms']:7.3f}, "
          f"{row['kernels_cache']} kernels)" + ("" if status == "ok" else "  (out of memory)"))
gpt2_measured = pd.DataFrame(gpt2_measured)
if gpt2_measured["measured_cache_ms"].isna().all():
    print("No cached decode step was timed: answer Question 4.5 first (it uses your StaticKVCache and gpt2_step).")
print("measured = CUDA graph replay" if DEVICE.type == "cuda" else
      "measured = eager (no CUDA graphs on a CPU); GPT-2 XL in fp16 on an H200, eager and as CUDA graphs, is in "
      "measured_runs.md beside this notebook")
if SCALE == "cpu" and not gpt2_measured["measured_cache_ms"].isna().all():
    _steps = gpt2_measured.pivot(index="N", columns="B", values="measured_cache_ms")
    _small, _large = _steps.columns.min(), _steps.columns.max()
    print(f"A cached step of B = {_large} sequences costs "
          + ", ".join(f"{ratio:.2f}x (N = {N})" for N, ratio in (_steps[_large] / _steps[_small]).items())
          + f" one of B = {_small}: {_large} times the tokens for the same weights read")
_one_token = torch.zeros(1, 1, dtype=torch.long, device=DEVICE)
one_token_ms = benchmark_eager_and_graphed(uncached_next_logits, gpt2_model, _one_token,
                                           n_warmup=GPT2_MEASURE["n_warmup"], n_repeat=GPT2_MEASURE["n_repeat"])
print(f"A forward pass over a single token takes {one_token_ms['measured_ms']:.3f} ms "
      f"(eager {one_token_ms['eager_ms']:.3f} ms): a pass with almost nothing to compute, the weights read once and "
      "each kernel's fixed cost")

# The device's peaks: the datasheet when the GPU is in GPU_SPECS, otherwise measured on this machine.
_gpu_key = detect_gpu()
if _gpu_key is not None:
    _precision = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(MEASURE_DTYPE, "fp32")
    DEVICE_PEAK_FLOPS_PER_S = GPU_SPECS[_gpu_key][f"{_precision}_tflops"] * 1e12
    DEVICE_BANDWIDTH_BYTES_PER_S = GPU_SPECS[_gpu_key]["memory_bandwidth_tb_s"] * 1e12
    PEAKS_SOURCE = f"datasheet of {_gpu_key} ({_precision})"
else:
    _roof = measure_roofline(dtypes=(MEASURE_DTYPE,))
    DEVICE_PEAK_FLOPS_PER_S = next(iter(_roof["matmul_tflops"].values())) * 1e12
    DEVICE_BANDWIDTH_BYTES_PER_S = _roof["bandwidth_tb_s"] * 1e12
    PEAKS_SOURCE = f"measured on this {_roof['device']} (no datasheet entry)"
print(f"Peaks for the predictions: {DEVICE_PEAK_FLOPS_PER_S / 1e12:.3g} TFLOP/s, "
      f"{DEVICE_BANDWIDTH_BYTES_PER_S / 1e12:.3g} TB/s ({PEAKS_SOURCE})")

# %% [markdown]
# #### Question 5.1 (2 points)
#
# Predict the two latencies of a case with your own counts: write `predict_gpt2_latencies_ms(B, N, D, H,
# num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s)`, returning a dict with the float keys
# `"predicted_no_cache_ms"` and `"predicted_cache_ms"`: the roofline times ($\max(T_\text{compute},
# T_\text{memory})$, in **milliseconds**) of a forward pass without a cache (`gpt2_forward_*`, Question 3.1) and
# of one cached decode step (`gpt2_decode_*`, Question 4.2). The cell after its tests applies it to every measured
# case (the measured model's `MEASURED_SHAPE` and `MEASURED_BYTES_PER_ELEMENT`, at `DEVICE_PEAK_FLOPS_PER_S` and
# `DEVICE_BANDWIDTH_BYTES_PER_S`) and tabulates the predictions beside the measurements for your plot of
# Question 5.2. The tests accept, to a relative tolerance of $10^{-5}$, the roofline times of the correct counts and
# those of your own `gpt2_forward_*` and `gpt2_decode_*` (through your `roofline_estimate` too), so a mistake in
# Questions 2.3, 3.1 or 4.2 is not counted twice.

# %% nbgrader={"grade": false, "grade_id": "q5_1_predictions", "locked": false, "schema_version": 3, "solution": true, "task": false}
def predict_gpt2_latencies_ms(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    """Roofline latencies of GPT-2-shaped layers: a forward pass over B x N tokens, and one cached decode step.

    Returns:
        dict: predicted_no_cache_ms, predicted_cache_ms (floats, milliseconds).
    """
    ### BEGIN SOLUTION
    def roofline_ms(flops, nbytes):
        return max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s) * 1e3

    return {
        "predicted_no_cache_ms": roofline_ms(gpt2_forward_flops(B, N, D, H, num_layers),
                                             gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element)),
        "predicted_cache_ms": roofline_ms(gpt2_decode_flops(B, N, D, H, num_layers),
                                          gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element)),
    }
    ### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "q5_1_predictions_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# A mistake in Questions 2.3, 3.1 or 4.2 is charged once: the roofline times of your own gpt2_forward_* and
# gpt2_decode_* counts (and from your own roofline_estimate), as their tests kept them, are accepted too.
def _predictions_ms(B, N, D, H, L, n, peak, bw, reference_full=None, reference_step=None):
    """Accepted predictions, in ms, of each key: the reference (from the given reference counts, when known) first,
    then those built from the student's own counts and roofline_estimate."""
    own_full = carried(lambda: (_kept_count("gpt2_forward_flops", B, N, D, H, L),
                                _kept_count("gpt2_forward_bytes", B, N, D, H, L, n)))
    own_step = carried(lambda: (_kept_count("gpt2_decode_flops", B, N, D, H, L),
                                _kept_count("gpt2_decode_bytes", B, N, D, H, L, n)))
    return {"predicted_no_cache_ms": [t * 1e3 for t in _roofline_times_s([reference_full, own_full], peak, bw)],
            "predicted_cache_ms": [t * 1e3 for t in _roofline_times_s([reference_step, own_step], peak, bw)]}


def _predictions_case(args, expected_ms, reference_full=None, reference_step=None):
    what = f"predict_gpt2_latencies_ms{args}"
    got = as_dict(predict_gpt2_latencies_ms(*args), what)
    options = _predictions_ms(*args, reference_full, reference_step)
    for key in ("predicted_no_cache_ms", "predicted_cache_ms"):
        assert key in got, f"{what} must have the key {key!r}; got {sorted(got, key=str)}"
        assert_or_carried(
            lambda want, got=got[key]: assert_close(
                got, want, f"{what}[{key!r}]",
                formula="max(T_compute, T_memory) in milliseconds"),
            expected_ms[key] if expected_ms else options[key][0], *options[key] if expected_ms else options[key][1:])


with check("public: predict_gpt2_latencies_ms(1, 2, 4, 2, 1, 2, 1000.0, 100.0)"):
    _predictions_case((1, 2, 4, 2, 1, 2, 1000.0, 100.0), {"predicted_no_cache_ms": 8720.0, "predicted_cache_ms": 6480.0})
### BEGIN HIDDEN TESTS
def _q5_1_hidden_tests():
    def full_counts(B, N, D, H, L, n):
        return (L * (24 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D),
                L * n * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D))

    def step_counts(B, N, D, H, L, n):
        return (L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D),
                L * n * (20 * B * D + 12 * D * D + 2 * B * N * D + 4 * B * H * N + 5 * D))

    def case(B, N, D, H, L, n, peak, bw):
        _predictions_case((B, N, D, H, L, n, peak, bw), None, full_counts(B, N, D, H, L, n), step_counts(B, N, D, H, L, n))

    with check("GPT-2 XL on the T4 and the H100: both latencies in ms", weight=2):
        for B, N in [(1, 32), (1, 1024), (64, 32), (64, 1024)]:
            case(B, N, 1600, 25, 48, 2, 65e12, 300e9)
        for B, N in [(1, 32), (64, 1024)]:
            case(B, N, 1600, 25, 48, 2, 989e12, 3.35e12)
    with check("other shapes and devices (the quick-scale model, fp32)"):
        for args in [(4, 64, 128, 4, 2, 4, 1.2e12, 4e10), (3, 7, 20, 4, 5, 4, 1e6, 1e5), (2, 100, 64, 8, 2, 2, 1e3, 1e4)]:
            case(*args)


_q5_1_hidden_tests()
del _q5_1_hidden_tests
### END HIDDEN TESTS
del _predictions_ms, _predictions_case
finish_checks("Question 5.1")


# %%
comparison = None  # your predictions beside the measurements: the table of Question 5.2's plot
with uses_answers("Question 5.1"):
    gpt2_predicted = [  # one dict per measured case
        {"B": B, "N": N, **predict_gpt2_latencies_ms(
            B, N, **MEASURED_SHAPE, bytes_per_element=MEASURED_BYTES_PER_ELEMENT,
            peak_flops_per_s=DEVICE_PEAK_FLOPS_PER_S, bandwidth_bytes_per_s=DEVICE_BANDWIDTH_BYTES_PER_S)}
        for B, N in GPT2_MEASURE["cases"]
    ]
    comparison = pd.DataFrame(gpt2_predicted).merge(gpt2_measured, on=["B", "N"])
    for kind in ("no_cache", "cache"):
        comparison[f"measured/predicted {kind}"] = comparison[f"measured_{kind}_ms"] / comparison[f"predicted_{kind}_ms"]
    comparison["cache speedup predicted"] = comparison["predicted_no_cache_ms"] / comparison["predicted_cache_ms"]
    comparison["cache speedup measured"] = comparison["measured_no_cache_ms"] / comparison["measured_cache_ms"]
    comparison["cache speedup eager"] = comparison["eager_no_cache_ms"] / comparison["eager_cache_ms"]
    with pd.option_context("display.width", 250):
        print(comparison.to_string(index=False, float_format=lambda x: f"{x:,.4g}"))


# %% [markdown]
# #### Question 5.2 (6 points)
#
# **The plot (2 points).** Complete `plot_decode_against_roofline(comparison)` in the cell below: draw your
# measurements against your predictions as functions of $N$, from the table `comparison` (one row per measured
# $(B, N)$; the columns `N`, `B`, `measured_no_cache_ms`, `measured_cache_ms`, `predicted_no_cache_ms`,
# `predicted_cache_ms`, and the eager times `eager_*_ms`): one panel per batch size $B$, log-log axes, latency in ms
# against $N$; in each panel the measured time without the cache and the measured cached decode step as markers
# joined by lines, and the roofline prediction of each as a dashed line of the same colour; a horizontal line at the
# single-token floor `one_token_ms["measured_ms"]`; axis labels, a legend and a title that names the device and the
# dtype (`PEAKS_SOURCE`, `MEASURE_DTYPE`). On a CPU plot your cpu-scale run.
#
# **The answer (4 points).** Compare your predictions with the measurements: at teaching scale on a GPU, your own.
# Without a GPU, answer for the course's H200 and add what your cpu-scale run and its plot show. The H200's
# measurements are in `measured_runs.md` beside this notebook (Part 5: each case's time without the cache and of one
# cached decode step, CUDA graph and eager, the kernels per step, the pass over a single token), and your
# predictions for them come from your own function: `predict_gpt2_latencies_ms(B, N, 1600, 25, 48, 2,
# GPU_SPECS["H200"]["fp16_tflops"] * 1e12, GPU_SPECS["H200"]["memory_bandwidth_tb_s"] * 1e12)` (GPT-2 XL
# in fp16 at the H200's datasheet peaks, as that run predicted them). Which cases are predicted well and which are
# not, and by how much? Give at least three concrete reasons for the gaps, tied to specific cases: think about what
# the roofline assumes about overlap and peaks, what runs that Part 2 does not count (the list at the top of this
# part), how many kernels a step launches and what each one costs even inside a CUDA graph (the single-token line),
# and what the eager times add. How do the two curves grow with $N$, and does the cache deliver the speedups you
# predicted in Part 4?

# %% nbgrader={"grade": true, "grade_id": "q5_2_plot", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
def plot_decode_against_roofline(comparison):
    """Question 5.2's plot: the measured latencies of the table ``comparison`` (one row per measured (B, N)) against
    your roofline predictions, one panel per batch size B (see the question above)."""
    ### BEGIN SOLUTION
    # === BEGIN MARK SCHEME ===
    # 2 points in total (judge the plot of the student's own run: teaching scale on a GPU, cpu scale without one):
    # - 1 point: one panel per batch size, latency against N on log-log axes, measured without cache and measured cached
    #   step both present, axes labelled (ms, N), legend.
    # - 1 point: the roofline predictions of both drawn as lines distinguishable from the measurements (dashed, same
    #   colour or labelled), and the single-token floor; the measured uncached curve rises with N while the cached one is
    #   nearly flat at small N. A plot of a quick-scale run earns this point only if the student says its numbers mean
    #   nothing and why.
    # Plotting eager times instead of CUDA-graph times on a GPU costs nothing if they are labelled as such.
    # === END MARK SCHEME ===
    batch_sizes = sorted(comparison["B"].unique())
    fig, axes = plt.subplots(1, len(batch_sizes), figsize=(5.5 * len(batch_sizes), 4), sharey=True, squeeze=False)
    for ax, B in zip(axes[0], batch_sizes):
        rows = comparison[comparison["B"] == B].sort_values("N")
        for kind, label, color in (("no_cache", "without cache", "tab:red"), ("cache", "cached decode step", "tab:blue")):
            ax.plot(rows["N"], rows[f"measured_{kind}_ms"], "o-", color=color, label=f"{label}: measured")
            ax.plot(rows["N"], rows[f"predicted_{kind}_ms"], "--", color=color, label=f"{label}: roofline prediction")
        ax.axhline(one_token_ms["measured_ms"], color="gray", linestyle=":", label="measured: pass over one token")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (tokens in the sequence)")
        ax.set_title(f"B = {B}", fontsize=10)
    axes[0][0].set_ylabel("Latency of the next token (ms, log scale)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"GPT-2-shaped model ({MEASURED_SHAPE['num_layers']} layers, D = {MEASURED_SHAPE['D']}, "
                 f"{str(MEASURE_DTYPE).replace('torch.', '')}); peaks: {PEAKS_SOURCE}", fontsize=10)
    fig.tight_layout()
    ### END SOLUTION


if comparison is None:
    print("Not run yet: the plot needs the table above (your predictions of Question 5.1 beside the measurements).")
else:
    with uses_answers("Question 5.2's plot"):
        plot_decode_against_roofline(comparison)
        plt.show()

# %% [markdown] nbgrader={"grade": true, "grade_id": "q5_2_answer", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# (Model answer for the course's H200 run: GPT-2 XL in fp16, CUDA-graph times as `measured_runs.md` prints them; the
# predictions are the reference `predict_gpt2_latencies_ms` at the H200's datasheet peaks (989.4 TFLOP/s, 4.8 TB/s),
# and the ratios to them are those of the run's comparison table (`reports/h200/lab3_executed.ipynb`;
# `reports/lab3-h200.md`, Part 5, explains each one above 2x). Your numbers will differ, and on another GPU the
# per-kernel floor and the peaks differ too.) The cached decode step with the most bytes is predicted best: at
# $(64, 1024)$ it takes 9.44 ms, 1.9x its prediction of 4.98 ms (2.95 GB of weights and 20.1 GB of cache read at
# 4.8 TB/s). At $(64, 256)$ (5 GB of cache) it takes 6.20 ms against 1.74 ms (3.57x); the other cached steps take 3.5
# to 4.8 ms against 0.62 to 0.79 ms (5.6x to 6.1x), and the passes without a cache are 3.5x to 6.1x their predictions
# (6.06x at $(1, 32)$, 4.93x at $(64, 1024)$). At the H200's 4.8 TB/s the small cases are predicted to take under a
# millisecond; the fixed costs below do not shrink with bandwidth, so these cases sit furthest above their predictions.
#
# 1. **A floor per kernel.** A decode step launches 1,112 (B = 1) to 1,257 (B = 64) kernels, 23 to 26 per layer
#    over 48 layers. Even replayed as a CUDA graph each costs a few microseconds however little it does
#    (3.509 ms / 1,112 kernels = 3.2 µs at $(1, 32)$), so any pass costs about 3.4 ms (the single-token line:
#    3.434 ms) and the small steps, whose bytes would take 0.6 to 0.8 ms, sit on that floor, not on the bandwidth
#    roof.
# 2. **Launch overhead when run eagerly.** Launched one by one from Python, the cached steps take 19 to 30 ms
#    whatever $B$ and $N$, and the short passes without a cache 26 to 30 ms (the pass over a single token 29.0 ms):
#    the CPU needs tens of microseconds per kernel, the GPU waits, and the cache seems to do little (eager cache
#    speedups 0.93x to 1.33x at $B = 1$, 1.11x at $(64, 32)$). Only where the pass without a cache is itself long does
#    the cache show eagerly (7.7x at $(64, 256)$, 44x at $(64, 1024)$). CUDA graphs remove this. (These eager times
#    follow neither $B$ nor $N$: the cached step took 19.3 ms at $(1, 32)$ and 30.2 ms at $(1, 256)$, 26.8 ms at
#    $(64, 32)$ and 24.2 ms at $(64, 256)$, as the CPU's launch time varied from case to case; the host was running
#    other work, `measured_runs.md` gives its load average. So the eager speedups of the short cases, one of them
#    below 1x, show only that the CPU sets the time, nothing about the cache.)
# 3. **Work Part 2 does not count.** Per layer of the pass without a cache: a separate pass that scales the scores
#    (it reads and writes the $HBN^2$ scores once more: $2HBN^2$ elements on top of the $6HBN^2$ counted; the mask
#    pass is counted), GPT-2's GELU as eight elementwise kernels over $(B, N, 4D)$ (about $72BND$ elements read and
#    written, where Part 2 fuses it), and layer norms, residual additions and the copy of the heads into
#    $(B, N, D)$ (about $12BND$). The fused QKV matmul saves only $2BND$. At $(64, 1024)$ that is about as many
#    bytes again as the $22BND + 12D^2 + 6HBN^2$ counted: a factor of about 2 of the 4.9x; at decode time these terms
#    carry a factor $B$ instead of $BN$ and are small next to the weights and the cache. Both ways also run the LM
#    head (a $D \times V$ weight read, about 5 % more bytes than the decoder's weights), which Part 2 leaves out.
# 4. **Peaks are not reached and do not overlap perfectly**: kernels, elementwise ones especially, reach only
#    part of the datasheet's bandwidth and FLOP/s, and the roofline's $\max$ assumes perfect overlap (the cached step
#    at $(64, 1024)$, within a factor of two of its prediction, and the rest of the 4.9x without it: that pass moves
#    about twice the 1.19 TB counted in 1.22 s, under half of the datasheet's 4.8 TB/s).
#
# The cache delivers speedups of the predicted order: 1.11x at $(1, 32)$ (predicted 1.04x: both read the same
# weights), 1.49x at $(1, 256)$ (1.57x), 5.3x at $(1, 1024)$ (6.6x), 4.5x at $(64, 32)$ (7.7x), 30x at $(64, 256)$
# (29x) and 129x at $(64, 1024)$ (50x). A measured speedup is the predicted one times the pass's ratio to its
# prediction over the step's. At $(64, 1024)$ the pass without the cache is 4.9x its prediction (the uncounted passes
# over its $N \times N$ scores and $(B, N, 4D)$ activations) and the cached step only 1.9x: $49.8 \times 4.93 / 1.90
# \approx 129$, more than predicted. At $(64, 256)$ both are about 3.6x their predictions (3.74x and 3.57x), so the
# speedup is the predicted one: $28.9 \times 3.74 / 3.57 \approx 30$. At small $B N$ the cached step sits on the
# kernel floor (5.6x to 6.1x its prediction, more than the pass without the cache) and the speedup falls short of
# the prediction: 4.5x against 7.7x at $(64, 32)$, 5.3x against 6.6x at $(1, 1024)$.
#
# **Growth with $N$** (the plot): without the cache the time grows with $N$, as the roofline line does. At $B = 64$
# it grows about linearly from $N = 32$ to 256 (21.6 to 187 ms for 8 times the tokens: the $BN$ tokens' matmuls
# dominate) and faster from 256 to 1,024 (187 to 1,222 ms for 4 times the tokens) where the $HBN^2$ score traffic
# takes over; at $B = 1$ it starts on the floor of the weights and the kernels (3.88 ms at $N = 32$, 5.31 ms at
# $N = 256$) and rises only at $N = 1024$ (20.3 ms). The cached step is nearly flat at $B = 1$ (3.51, 3.57 and
# 3.84 ms at $N = 32$, 256 and 1,024): its bytes are the weights, and the cache of 1,024 tokens (0.31 GB) adds about a
# tenth. At $B = 64$ it rises with $N$ (4.81, 6.20 and 9.44 ms) as the $2LBND$ elements of cache read per step exceed
# the weights (about 5 GB at $N = 256$ and 20 GB at $N = 1024$, against 3 GB), the linear growth in $N$ that
# Question 4.1 predicts; at $N = 256$ the kernel floor still hides part of it (3.57x its prediction).
#
# At cpu scale (the course's run in `measured_runs.md`: float32, one thread, predictions from the CPU's measured peaks)
# the cache's speedup also grows with $N$: without the cache the pass takes 14.2, 44.5 and 86.8 ms at $B = 1$ for
# $N = 32$, 128 and 256 against 3.17 to 3.78 ms for a cached step (4.5x to 23x), and 77 to 759 ms at $B = 8$ against
# 7.6 to 9.6 ms (10x to 79x). A cached step of 8 sequences costs 2.2x to 2.5x one of a single sequence, far less than
# 8 times: both read the same weights. The passes without a cache are 1.2x to 1.8x their predictions, the cached
# steps 2.2x to 2.5x at $B = 1$ and 3.8x to 4.0x at $B = 8$: a step runs 96 to 100 operators, each with a fixed cost
# (Python and the dispatcher; there is no CUDA graph, so the eager time is the measurement), which plays the role of
# the GPU's per-kernel floor (the pass over a single token takes 2.69 ms, most of a cached step at $B = 1$), and the
# thin products of a decode step (1 or 8 rows) reach only part of the peaks measured on large ones. So the cache's
# measured speedups stay below the predicted ones (5.7x to 45x at $B = 1$, 32x to 231x at $B = 8$), as on the H200
# at small $B N$.
# === BEGIN MARK SCHEME ===
# 4 points in total (judge against the student's own table; a teaching-scale run on a GPU, or, without a GPU, the
# H200 measurements of measured_runs.md with the student's own predictions for them, plus the student's cpu-scale
# run):
# - 1 point: says which cases are close and which far off, with measured/predicted ratios (CUDA-graph times).
# - 2 points: at least three valid reasons tied to cases: a per-kernel cost (hundreds of kernels per step) that
#   dominates small steps even in a CUDA graph; launch overhead in the eager times; uncounted work (the separate
#   scale pass over the N x N scores, GELU as several kernels, layer norms, residuals, biases, the copy of the
#   heads); peaks not reached / imperfect overlap. (1 point for one or two reasons.) Naming the causal mask as
#   uncounted work is a slip (Part 2 counts it), not a reason: it does not count towards the three.
# - 1 point: compares the measured cache speedups with Part 4 (same order of magnitude with CUDA graphs) and
#   explains where and why they differ (or why the eager speedups are near 1x for the short cases); says how the two
#   curves of the plot grow with N (uncached rising with N, cached flat at B = 1 and rising at large B N once the
#   cache read rivals the weights). The eager times of the short cases are set by the CPU's launches and vary from
#   case to case, not with the work (19 to 30 ms on the course's H200, in no order of B or N): they show no property
#   of the cache, and an argument resting on their ratios (such as 0.93x at (1, 256), a cached step slower than the
#   pass without a cache) earns nothing for it; an answer that notes the scatter loses nothing. A speedup above the
#   prediction at large B N (129x against 50x at (64, 1024) on the H200) explained by the pass without the cache
#   being further above its prediction than the cached step is right; so is a speedup below it at small B N
#   explained by the kernel floor.
# A CPU-only student who answers from the H200 measurements of measured_runs.md and their own predictions for them
# (with or without their cpu-scale numbers) is marked exactly as above. An answer from the student's own cpu-scale
# run alone earns the first and last points when the ratios and speedups are read correctly from it, and the reasons
# point when it explains the CPU's gaps (eager per-operator cost for the small cases, uncounted work, peaks);
# GPU-only reasons it cannot observe (CUDA graphs) are not required then. A quick-scale run alone: at most 2 points
# unless the student explains why its numbers cannot show the effects.
# === END MARK SCHEME ===

# %% [markdown]
# # Part 6: Speculative decoding
#
# ## The bottleneck of decoding one sequence
#
# Serving a single user means decoding with $B = 1$ and a KV cache. Split the time of one decode step into
# parts, using your decode counts of Question 4.2:
# - **weights**: reading every weight and bias of every layer once;
# - **KV cache**: reading the cached keys and values (the reads of $K$ by $QK^T$ and of $V$ by $AV$);
# - **other memory traffic**: all the remaining bytes of your decode count (activations, scores and
#   probabilities, writing the new keys and values);
# - **compute**: the FLOPs of the step at the peak FLOP/s.
#
# #### Question 6.1 (4 points)
#
# Write `decode_time_breakdown_s(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s,
# bandwidth_bytes_per_s)` returning a dict with the float keys `"weights_s"`, `"kv_cache_s"`,
# `"other_memory_s"` and `"compute_s"` (seconds, each part on its own: bytes / bandwidth or FLOPs / peak). The
# three memory parts must add up to the bytes of Question 4.2. The tests accept `other_memory_s` and `compute_s`
# computed from the correct decode counts or from your own `gpt2_decode_bytes` and `gpt2_decode_flops`, so a
# mistake in Question 4.2 is charged once.

# %% nbgrader={"grade": false, "grade_id": "q6_1_decode_time_breakdown", "locked": false, "schema_version": 3, "solution": true, "task": false}
def decode_time_breakdown_s(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    """Time of one cached decode step, split into weight reads, cache reads, other traffic and compute.

    Returns:
        dict: weights_s, kv_cache_s, other_memory_s, compute_s (floats, seconds).
    """
    ### BEGIN SOLUTION
    L, n = num_layers, bytes_per_element
    weight_bytes = L * n * (12 * D * D + 5 * D)  # W_Q, W_K, W_V, W_O, W_1, W_2 and the MLP biases
    cache_bytes = L * n * 2 * B * N * D  # K read by Q K^T, V read by A V
    other_bytes = gpt2_decode_bytes(B, N, D, H, L, n) - weight_bytes - cache_bytes  # L n (20 B D + 4 B H N)
    return {
        "weights_s": weight_bytes / bandwidth_bytes_per_s,
        "kv_cache_s": cache_bytes / bandwidth_bytes_per_s,
        "other_memory_s": other_bytes / bandwidth_bytes_per_s,
        "compute_s": gpt2_decode_flops(B, N, D, H, L) / peak_flops_per_s,
    }
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q6_1_decode_time_breakdown_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# A mistake in Question 4.2 is charged once: other_memory_s and compute_s computed from your own gpt2_decode_bytes
# and gpt2_decode_flops (as Question 4.2's test kept them) are accepted too.
with check("public: weights_s of decode_time_breakdown_s(1, 2, 4, 2, 1, 2, 1000.0, 100.0)"):
    _parts = as_dict(decode_time_breakdown_s(1, 2, 4, 2, 1, 2, 1000.0, 100.0), "decode_time_breakdown_s(1, 2, 4, 2, 1, 2, 1000.0, 100.0)")
    assert {"weights_s", "kv_cache_s", "other_memory_s", "compute_s"} <= set(_parts), (
        f"decode_time_breakdown_s must return a dict with weights_s, kv_cache_s, other_memory_s, compute_s; got keys "
        f"{sorted(_parts, key=str)}")
    assert_close(_parts["weights_s"], 4.24, "weights_s for D = 4, one layer, fp16, 100 bytes/s",
                 formula="(12 D^2 + 5 D) elements x 2 bytes / 100 bytes/s")
    del _parts
### BEGIN HIDDEN TESTS
def _q6_1_hidden_tests():
    cases = [(1, 1024, 1600, 25, 48, 2, 65e12, 300e9), (64, 1024, 1600, 25, 48, 2, 65e12, 300e9),
             (3, 7, 20, 4, 5, 4, 1e6, 1e5), (2, 9, 36, 3, 2, 2, 7e3, 3e3)]

    def parts(B, N, D, H, L, n, peak, bw):
        what = f"decode_time_breakdown_s{(B, N, D, H, L, n, peak, bw)}"
        got = as_dict(decode_time_breakdown_s(B, N, D, H, L, n, peak, bw), what)
        missing = {"weights_s", "kv_cache_s", "other_memory_s", "compute_s"} - set(got)
        assert not missing, f"{what} must have the keys weights_s, kv_cache_s, other_memory_s, compute_s; missing {sorted(missing)}"
        return got, what

    with check("weights_s: every weight and bias of every layer read once"):
        for B, N, D, H, L, n, peak, bw in cases:
            got, what = parts(B, N, D, H, L, n, peak, bw)
            assert_close(got["weights_s"], L * n * (12 * D * D + 5 * D) / bw, f"{what}['weights_s']",
                         formula="4 D x D projections, W_1, W_2, b_1, b_2 of every layer, read once, / bandwidth")
    with check("kv_cache_s: the N cached keys and values read once each"):
        for B, N, D, H, L, n, peak, bw in cases:
            got, what = parts(B, N, D, H, L, n, peak, bw)
            assert_close(got["kv_cache_s"], L * n * 2 * B * N * D / bw, f"{what}['kv_cache_s']",
                         formula="the N cached keys and values of every head and sequence, read once each, / bandwidth")
    with check("other_memory_s: the rest of the decode bytes of Question 4.2"):
        for B, N, D, H, L, n, peak, bw in cases:
            got, what = parts(B, N, D, H, L, n, peak, bw)
            own = carried(lambda: (_kept_count("gpt2_decode_bytes", B, N, D, H, L, n) - L * n * (12 * D * D + 5 * D)
                                    - L * n * 2 * B * N * D) / bw)
            assert_or_carried(
                lambda want, got=got["other_memory_s"]: assert_close(
                    got, want, f"{what}['other_memory_s']",
                    formula="(decode bytes of Question 4.2 - weights - cache reads) / bandwidth"),
                L * n * (20 * B * D + 4 * B * H * N) / bw, own)
    with check("compute_s: the decode FLOPs of Question 4.2 at the peak"):
        for B, N, D, H, L, n, peak, bw in cases:
            got, what = parts(B, N, D, H, L, n, peak, bw)
            own = carried(lambda: _kept_count("gpt2_decode_flops", B, N, D, H, L) / peak)
            assert_or_carried(
                lambda want, got=got["compute_s"]: assert_close(
                    got, want, f"{what}['compute_s']",
                    formula="decode FLOPs of Question 4.2 / peak"),
                L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D) / peak, own)


_q6_1_hidden_tests()
del _q6_1_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 6.1")


# %%
with uses_answers("Question 6.1"):
    _rows = []
    for B, N in [(1, 32), (1, 1024), (64, 1024)]:
        parts = decode_time_breakdown_s(B, N, **GPT2_XL, bytes_per_element=FP16_BYTES,
                                        peak_flops_per_s=T4_PEAK_FLOPS_PER_S, bandwidth_bytes_per_s=T4_BANDWIDTH_BYTES_PER_S)
        _rows.append({"B": B, "N": N, **{key.replace("_s", "_ms"): value * 1e3 for key, value in parts.items()}})
    print("One GPT-2 XL decode step on the T4, split by what it waits for (ms):")
    print(pd.DataFrame(_rows).to_string(index=False, float_format=lambda x: f"{x:,.4g}"))

# %% [markdown]
# #### Question 6.2 (2 points)
#
# Decoding with $B = 1$ and a KV cache on the T4: which of the four parts dominates, and by how much? Why does
# that make it attractive to check *several* candidate tokens of the large model in one forward pass?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q6_2_answer", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# Reading the weights dominates: about 9.8 ms per step for GPT-2 XL (2.95 GB at 300 GB/s), against about 1 ms
# for the cache at $N = 1024$ (0.03 ms at $N = 32$), a few hundredths of a millisecond for all other traffic and
# about 0.05 ms of compute. The GPU spends more than 85 % of the step streaming weights and is idle
# arithmetically (intensity about 1 FLOP/byte). A forward pass over $k$ tokens of the same sequence reads the
# weights once, so it costs almost the same as a pass over one token as long as it stays memory-bound: checking
# $k$ candidate tokens in one pass of the large model is nearly free. Speculative decoding exploits this: a cheap
# draft model proposes several tokens and the large model verifies them all in one pass, so each weight read
# yields several tokens instead of one.
# === BEGIN MARK SCHEME ===
# 2 points in total:
# - 1 point: weight reads dominate (~9.8 ms vs ~1 ms cache at N = 1024, tiny other traffic and compute).
# - 1 point: a pass over several tokens re-uses the same weight read, so verifying several proposed tokens
#   costs about one pass; speculative decoding amortises the weight reads over several accepted tokens.
# Carry-forward: judge the numbers against the student's own breakdown (Question 6.1); a mistake there is charged
# in its own question only, so a correct argument from the student's own numbers earns full marks.
# === END MARK SCHEME ===

# %% [markdown]
# ## Speculative sampling
#
# A small **draft** model $q$ proposes $\gamma$ tokens, and the large **target** model $p$ checks them in one
# pass. Given a prefix:
# 1. **Draft.** Sample $x_1 \sim q(\cdot \mid \text{prefix})$, $x_2 \sim q(\cdot \mid \text{prefix}, x_1)$, ...,
#    up to $x_\gamma$, keeping the draft distributions $q_1, \dots, q_\gamma$ ($\gamma$ calls of the draft).
# 2. **Verify.** Run the target once on $\text{prefix}, x_1, \dots, x_\gamma$; its outputs at the last
#    $\gamma + 1$ positions are $p_1, \dots, p_{\gamma+1}$, where $p_i$ is the target's distribution of the token
#    at the position of $x_i$ (and $p_{\gamma+1}$ that of the token after $x_\gamma$).
# 3. **Accept or reject**, for $i = 1, \dots, \gamma$ in order: draw $u_i \sim U[0, 1)$ and accept $x_i$ if
#    $u_i < p_i(x_i) / q_i(x_i)$, i.e. with probability $\min(1, p_i(x_i)/q_i(x_i))$. At the first rejection,
#    replace $x_i$ by a token drawn from the **residual distribution**
#    $\text{norm}(\max(0, p_i - q_i))$ and stop.
# 4. If all $\gamma$ drafts were accepted, draw a **bonus token** from $p_{\gamma+1}$.
#
# Every step therefore emits between 1 and $\gamma + 1$ tokens for one target pass, and each emitted token has
# *exactly* the distribution the target alone would have sampled: rejection sampling keeps $\min(p_i, q_i)$ of
# the mass through acceptance and supplies the missing $\max(0, p_i - q_i)$ through the residual. If every
# draft token is accepted independently with the same probability
# $\alpha = \sum_x \min(p(x), q(x))$, the number of tokens per target pass has mean
# $$\mathbb{E}[\text{tokens per pass}] = 1 + \alpha + \alpha^2 + \dots + \alpha^\gamma
#   = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha}.$$
#
# #### Question 6.3 (2 points)
#
# Write `expected_tokens_per_pass(alpha, gamma)` (a float; it must also work for $\alpha = 1$).

# %% nbgrader={"grade": false, "grade_id": "q6_3_expected_tokens_per_pass", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expected_tokens_per_pass(alpha, gamma):
    """Mean number of tokens one speculative step emits, acceptance probability alpha, gamma drafts.

    Args:
        alpha (float): probability in [0, 1] that a draft token is accepted.
        gamma (int): number of draft tokens per step (>= 0).

    Returns:
        float: expected tokens per target pass, between 1 and gamma + 1.
    """
    ### BEGIN SOLUTION
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q6_3_expected_tokens_per_pass_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
with check("public: expected_tokens_per_pass(0.5, 2) and (0.0, 4)"):
    assert_close(expected_tokens_per_pass(0.5, 2), 1.75, "expected_tokens_per_pass(0.5, 2)", formula="1 + 0.5 + 0.25")
    assert_close(expected_tokens_per_pass(0.0, 4), 1.0, "expected_tokens_per_pass(0, 4) (every draft rejected, one token)")
# Bonus 6.6 accepts speedups built from your expected_tokens_per_pass, as graded here.
_keep_answers("expected_tokens_per_pass", expected_tokens_per_pass, [(0.5, 2)])
### BEGIN HIDDEN TESTS
def _q6_3_hidden_tests():
    with check("1 + alpha + ... + alpha^gamma for hidden alpha < 1 and gamma >= 0", weight=2):
        for alpha, gamma in [(0.8, 5), (0.3, 1), (0.95, 16), (0.6, 0), (0.999999, 3), (0.25, 7)]:
            assert_close(expected_tokens_per_pass(alpha, gamma), sum(alpha ** i for i in range(gamma + 1)),
                         f"expected_tokens_per_pass({alpha}, {gamma})", formula="1 + alpha + ... + alpha^gamma")
    with check("alpha = 1 works: every draft accepted plus the bonus token, gamma + 1 (and fewer when alpha < 1)"):
        for gamma in (1, 4, 9):
            assert_close(expected_tokens_per_pass(1.0, gamma), gamma + 1, f"expected_tokens_per_pass(1.0, {gamma})",
                         formula="gamma + 1 (every draft accepted plus the bonus token)")
            # gamma + 1 whatever alpha is is no expectation: a constant cannot pass this check
            fewer = as_real(expected_tokens_per_pass(0.5, gamma), f"expected_tokens_per_pass(0.5, {gamma})")
            assert fewer < gamma + 1, (
                f"expected_tokens_per_pass(0.5, {gamma}) must be below gamma + 1 = {gamma + 1} (a draft is rejected "
                f"with probability 1 - alpha); got {fewer!r}")
    # Bonus 6.6's hidden (alpha, gamma)
    _keep_answers("expected_tokens_per_pass", expected_tokens_per_pass,
                  [(0.8, 4), (0.6, 3), (0.3, 7), (0.999999, 2), (1.0, 5), (0.9, 0)])


_q6_3_hidden_tests()
del _q6_3_hidden_tests
### END HIDDEN TESTS
finish_checks("Question 6.3")


# %% [markdown]
# #### Question 6.4 (8 points)
#
# Implement one step of speculative sampling, `speculative_step(prefix, draft_model, target_model, gamma,
# generator)`, for a **batch** of independent sequences. The contract (the tests rely on every point):
# - `prefix`: int64 tensor `(B, T)`, $T \ge 1$: $B$ independent sequences of the same length.
# - `draft_model` and `target_model`: callables mapping int64 tokens `(B, S)` to probabilities `(B, S, V)`
#   (float, rows summing to 1), where `[b, s]` is the model's distribution of the token that follows
#   `tokens[b, :s + 1]`. Call `draft_model` exactly `gamma` times (on the prefix, then on the prefix with one
#   drafted token appended, and so on) and `target_model` exactly once, on the prefix followed by all `gamma`
#   drafted tokens.
# - `gamma`: number of draft tokens, $\ge 1$.
# - `generator`: a `torch.Generator` on the device of `prefix`. **All** randomness comes from it (e.g.
#   `torch.multinomial(probs, 1, generator=generator)`, `torch.rand(..., generator=generator,
#   device=prefix.device)`), never from the global random state: the same seed gives the same result.
# - Vectorised over the batch: no Python loop over the $B$ rows (the tests use $B = 100{,}000$). A loop over
#   the $\gamma$ positions is fine.
# - Returns `(new_tokens, num_new)`, both on the device of `prefix`: `num_new` is int64 `(B,)` with values in
#   $1 \dots \gamma + 1$ (accepted drafts plus the one replacement or bonus token), and `new_tokens` is int64
#   `(B, gamma + 1)` whose row `b` holds its `num_new[b]` new tokens first, then `-1` padding.
#
# The hidden tests drive your function with toy models whose distributions are known exactly and check that
# the emitted tokens have the target's distribution and that the mean of `num_new` matches
# `expected_tokens_per_pass`, with thresholds derived so that a correct implementation passes with probability
# above $1 - 10^{-6}$, whatever its order of random draws.
#
# Tip: to find the first rejection of every row at once, `accepted.long().cumprod(dim=1).sum(dim=1)` counts
# the leading accepted drafts.

# %% nbgrader={"grade": false, "grade_id": "q6_4_speculative_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def speculative_step(prefix, draft_model, target_model, gamma, generator):
    """One step of speculative sampling for a batch of sequences.

    Args:
        prefix (torch.Tensor): int64 (B, T), T >= 1.
        draft_model (callable): int64 (B, S) -> probabilities (B, S, V); called exactly gamma times.
        target_model (callable): int64 (B, S) -> probabilities (B, S, V); called exactly once.
        gamma (int): number of draft tokens (>= 1).
        generator (torch.Generator): the only source of randomness, on prefix.device.

    Returns:
        tuple: (new_tokens int64 (B, gamma + 1), -1 after each row's new tokens; num_new int64 (B,) in
        1 .. gamma + 1).
    """
    ### BEGIN SOLUTION
    batch, prefix_len = prefix.shape
    device = prefix.device
    tokens, draft_dists = prefix, []
    for _ in range(gamma):  # 1. draft gamma tokens
        q_next = draft_model(tokens)[:, -1, :]
        draft_dists.append(q_next)
        tokens = torch.cat([tokens, torch.multinomial(q_next, 1, generator=generator)], dim=1)
    drafted = tokens[:, prefix_len:]  # (B, gamma)
    q = torch.stack(draft_dists, dim=1).double()  # (B, gamma, V)
    p = target_model(tokens)[:, prefix_len - 1:, :].double()  # 2. verify: (B, gamma + 1, V)

    p_of_draft = p[:, :gamma].gather(2, drafted.unsqueeze(2)).squeeze(2)
    q_of_draft = q.gather(2, drafted.unsqueeze(2)).squeeze(2)  # > 0: the draft sampled these tokens
    u = torch.rand(batch, gamma, generator=generator, device=device, dtype=torch.float64)
    accepted = u * q_of_draft < p_of_draft  # 3. accept with probability min(1, p / q)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # leading accepted drafts, 0 .. gamma

    # 4. One more token: from the residual at the first rejection, or from p_{gamma+1} when all were accepted
    # (padding q with zeros at position gamma makes the "residual" there equal to p itself).
    rows = torch.arange(batch, device=device)
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    p_next = p[rows, num_accepted]
    residual = (p_next - q_padded[rows, num_accepted]).clamp_min(0)
    mass = residual.sum(dim=1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-300), p_next)  # guard against p == q
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)

    new_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)
    keep = torch.arange(gamma, device=device).unsqueeze(0) < num_accepted.unsqueeze(1)
    new_tokens[:, :gamma] = torch.where(keep, drafted, torch.full_like(drafted, -1))
    new_tokens[rows, num_accepted] = extra
    return new_tokens, num_accepted + 1
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "q6_4_speculative_step_tests", "locked": true, "points": 8, "schema_version": 3, "solution": false, "task": false}
def _toy_model(table):
    """Toy LM: the next-token distribution depends on the last token only: int64 (B, S) -> table[tokens] (B, S, V).

    A ``functools.partial`` (not a function of the test) so that the test can hand it to your code."""
    import functools
    import operator

    return functools.partial(operator.getitem, table)


@kernel_side
def _speculative_step_observed(prefix, draft_model, target_model, gamma, generator, global_seed=None):
    """speculative_step(prefix, draft_model, target_model, gamma, generator), run next to your code with what the
    tests check about how it ran (best effort).

    Returns:
        dict: ``out`` (what speculative_step returned), ``draft_calls`` and ``target_calls`` (the tokens of each
        model call, in order), ``global_states`` (the global random states before and after the call, after
        ``torch.manual_seed(global_seed)`` unless it is None) and ``generator_state`` (the generator's state after).
    """
    calls = {"draft": [], "target": []}

    def recorded(model, name):
        def call(tokens):
            calls[name].append(tokens.detach().clone())
            return model(tokens)
        return call

    def global_states():
        return [torch.get_rng_state()] + (torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])

    if global_seed is not None:
        torch.manual_seed(global_seed)
    before = global_states()
    out = speculative_step(prefix, recorded(draft_model, "draft"), recorded(target_model, "target"), gamma, generator)
    return {"out": out, "draft_calls": calls["draft"], "target_calls": calls["target"],
            "global_states": [before, global_states()], "generator_state": generator.get_state()}


def _speculative_format(prefix, out, gamma, vocab):
    """What speculative_step returned must be (new_tokens, num_new): int64 tensors of shapes (B, gamma + 1) and (B,),
    num_new in 1 .. gamma + 1, each row's num_new tokens (ids 0 .. V - 1) first, then -1. Returns the two tensors."""
    try:
        new_tokens, num_new = out
    except (TypeError, ValueError):
        raise AssertionError(f"speculative_step must return a tuple (new_tokens, num_new), got {type(out).__name__}") from None
    new_tokens, num_new = as_tensor(new_tokens, "new_tokens"), as_tensor(num_new, "num_new")
    B = prefix.shape[0]
    assert tuple(new_tokens.shape) == (B, gamma + 1), (
        f"new_tokens must be a (B, gamma + 1) = {(B, gamma + 1)} tensor, got shape {tuple(new_tokens.shape)}")
    assert tuple(num_new.shape) == (B,), f"num_new must have shape (B,) = ({B},), got {tuple(num_new.shape)}"
    assert new_tokens.dtype == torch.long and num_new.dtype == torch.long, (
        f"new_tokens and num_new must be int64, got {new_tokens.dtype} and {num_new.dtype}")
    assert bool((num_new.ge(1) & num_new.le(gamma + 1)).all()), "num_new must lie in 1 .. gamma + 1"
    filled = torch.arange(gamma + 1, device=new_tokens.device).unsqueeze(0) < num_new.unsqueeze(1)
    assert bool(new_tokens[~filled].eq(-1).all()), "new_tokens must be -1 after each row's num_new tokens"
    assert bool((new_tokens[filled].ge(0) & new_tokens[filled].lt(vocab)).all()), "emitted tokens must be ids 0 .. V - 1"
    return new_tokens, num_new


def _drafting_as_the_contract_says(run, prefix, gamma, draft_table, vocab, what, target=True):
    """The model calls of a run of speculative_step (_speculative_step_observed) must be the contract's drafting, with
    the tokens it computed: draft_model called gamma times, first on the prefix, then each time on the previous call's
    tokens with one token appended that the draft proposes (probability > 0 after the token before it, in the toy
    draft ``draft_table``); with ``target``, also target_model once, on the last draft call's tokens with the last
    drafted token appended, and each row's accepted drafts (its first num_new - 1 new tokens) its first drafts."""
    drafts = [as_tensor(tokens, f"{what}: tokens of draft call {i}").cpu() for i, tokens in enumerate(run["draft_calls"])]
    batch, length = prefix.shape
    assert [tuple(t.shape) for t in drafts] == [(batch, length + i) for i in range(gamma)], (
        f"{what}: draft_model must be called gamma = {gamma} times, on (B, T), (B, T + 1), ...; got draft calls on "
        f"{[tuple(t.shape) for t in drafts]}")
    calls = drafts
    if target:
        targets = [as_tensor(tokens, f"{what}: tokens of a target call").cpu() for tokens in run["target_calls"]]
        assert [tuple(t.shape) for t in targets] == [(batch, length + gamma)], (
            f"{what}: target_model must be called once, on (B, T + gamma) = {(batch, length + gamma)}; got target calls "
            f"on {[tuple(t.shape) for t in targets]}")
        calls = drafts + targets
    assert torch.equal(drafts[0], prefix.cpu()), f"{what}: draft_model's first call must be on the prefix"
    for i, (earlier, tokens) in enumerate(zip(calls, calls[1:])):
        assert torch.equal(tokens[:, :-1], earlier), (
            f"{what}: model call {i + 1} must be on the tokens of draft call {i} with the token it drafted appended")
    drafted, before = calls[-1][:, length:], calls[-1][:, length - 1:-1]
    assert bool((draft_table.cpu()[before, drafted] > 0).all()), (
        f"{what}: the drafted tokens must be drawn from draft_model's distributions (some have probability 0 there)")
    if target:
        new_tokens, num_new = _speculative_format(prefix, run["out"], gamma, vocab)
        accepted = torch.arange(gamma).unsqueeze(0) < (num_new.cpu() - 1).unsqueeze(1)
        assert torch.equal(new_tokens.cpu()[:, :gamma][accepted], drafted[accepted]), (
            f"{what}: each row's first num_new - 1 new tokens are its accepted drafts, its first drafted tokens in "
            f"order")


_gen = torch.Generator().manual_seed(0)
_P = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25], [0.0, 0.6, 0.0, 0.4]])
_prefix = torch.randint(4, (6, 3), generator=_gen)
with check("public: returns (new_tokens, num_new) as the contract says; draft_model called gamma times on the prefix and "
           "its drafts, target_model once on the prefix and all drafts"):
    _run = _speculative_step_observed(_prefix, _toy_model(_P.flip(1)), _toy_model(_P), 3, _gen)
    _drafting_as_the_contract_says(_run, _prefix, 3, _P.flip(1), 4, "public case")
    del _run
with check("public: when the draft equals the target every draft is accepted, plus the bonus token"):
    _new, _num = _speculative_format(_prefix, speculative_step(_prefix, _toy_model(_P), _toy_model(_P), 3, _gen), 3, 4)
    assert bool(_num.eq(4).all()), (
        f"when the draft equals the target every draft is accepted: num_new must be gamma + 1 = 4, got {_num.tolist()}")
    del _new, _num
del _gen, _P, _prefix
### BEGIN HIDDEN TESTS
def _q6_4_hidden_tests():
    """Hidden tests of speculative_step: format and calls, exact edge cases, then a statistical test.

    Every check but the device rule runs on the CPU (CPU prefixes, tables and generators) on every grader, so that a
    given implementation draws the same numbers and gets the same verdict on a CPU and on a GPU grader; the device
    rule alone uses DEVICE.

    Why a correct implementation fails the statistical test with probability below 1e-6, whatever the seed or
    the order of its random draws. Each check compares an empirical frequency (or the mean of num_new) over m
    independent rows with its exact value. By Hoeffding's inequality, the mean of m independent variables with
    range r deviates from its expectation by t or more with probability at most 2 exp(-2 m t^2 / r^2). Each
    check uses t = r sqrt(ln(2 K / delta) / (2 m)), where K is the number of checks (fixed below) and
    delta = 1e-6, so each check fails with probability at most delta / K and, by the union bound, any of
    them with probability at most delta. Conditional checks (the second token given the first, among rows that
    emitted two tokens) are valid because, given the selected rows, those tokens are independent draws from
    the conditional target distribution; m is then the observed count. The rows come from several calls (a
    result crossing the grading boundary has a size cap), each with its own generator, so they stay independent.
    On top of this, the generators' seeds are fixed, so a given implementation gets the same verdict on every
    run (on CPU). The wrong
    implementations this test is meant to catch (sampling the replacement from p or q instead of the residual,
    wrong acceptance ratio, no bonus token, a bonus token that is greedy, taken one position early or drawn
    from the draft, continuing after a rejection, greedy drafts, off-by-one target positions) deviate from the
    exact values by 3 to 50 times the thresholds.
    """
    V = 5  # vocabulary of the toy models
    # K: the first token (V frequencies), the mean of num_new, the bonus token (V); then each of the gamma + 1 = 4
    # positions of the Markov test given the token before it (V x V frequencies).
    delta, n_checks = 1e-6, V + 1 + V + 4 * V * V
    log_term = math.log(2 * n_checks / delta)

    def threshold(m, value_range=1.0):
        return value_range * math.sqrt(log_term / (2 * m))

    # --- 1. exact edge cases and the contract ---
    gen = torch.Generator().manual_seed(7)
    target = torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0]).expand(V, V)
    draft = torch.tensor([0.0, 0.0, 0.3, 0.3, 0.4]).expand(V, V)
    prefix = torch.randint(V, (2000, 2), generator=gen)
    with check("exact cases: every draft rejected when the target gives it probability 0, the replacement then drawn "
               "from norm(max(0, p - q)); every draft accepted plus the bonus token when draft == target (gamma = 1, 2, 6)"):
        new_tokens, num_new = _speculative_format(
            prefix, speculative_step(prefix, _toy_model(draft), _toy_model(target), 4, gen), 4, V)
        assert bool(num_new.eq(1).all()), (
            "when the target gives probability 0 to every token the draft can propose, every draft must be rejected "
            "(num_new == 1)")
        assert bool(new_tokens[:, 0].le(1).all()), (
            "after a rejection the replacement comes from norm(max(0, p - q)); here that is the target itself, "
            "which never emits tokens 2, 3, 4")
        for gamma in (1, 2, 6):
            _, num_new = _speculative_format(
                prefix[:50], speculative_step(prefix[:50], _toy_model(target), _toy_model(target), gamma, gen), gamma, V)
            assert bool(num_new.eq(gamma + 1).all()), (
                f"draft == target, gamma = {gamma}: all drafts accepted plus the bonus token (num_new == {gamma + 1})")

    # --- 2. the method: vectorised over the batch (no Python loop over the B rows) ---
    @kernel_side
    def python_lines(batch, vocab, draft_model, target_model):
        """Lines of Python run outside installed libraries (the student's code) by one call with B = batch
        (best effort: counted where the student's code runs)."""
        import os
        import site
        import sys

        library_dirs = tuple(os.path.realpath(path) + os.sep for path in
                             {sys.prefix, sys.base_prefix, sys.exec_prefix, *getattr(site, "getsitepackages", list)()})
        user_files, count = {}, [0]

        def count_lines(frame, event, arg):
            if event == "line":
                count[0] += 1
            return count_lines

        def on_call(frame, event, arg):
            filename = frame.f_code.co_filename
            if filename not in user_files:
                user_files[filename] = not os.path.realpath(filename).startswith(library_dirs)
            return count_lines if user_files[filename] else None

        small_prefix = torch.randint(vocab, (batch, 2), generator=torch.Generator().manual_seed(batch))
        previous = sys.gettrace()
        sys.settrace(on_call)
        try:
            speculative_step(small_prefix, draft_model, target_model, 3, torch.Generator().manual_seed(1))
        finally:
            sys.settrace(previous)
        return count[0]

    table = torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(3)), dim=1)
    # a draft that never proposes the token it follows (so the tests see drafts drawn from it)
    draft_table = table.flip(0).masked_fill(torch.eye(V, dtype=torch.bool), 0.0)
    draft_table = draft_table / draft_table.sum(dim=1, keepdim=True)
    vectorised = False

    def generator_in(state):
        generator = torch.Generator()
        generator.set_state(state)
        return generator

    def observe(state, global_seed):
        """speculative_step from a generator in ``state``, observed where it runs (see _speculative_step_observed)."""
        return _speculative_step_observed(prefix[:300], _toy_model(draft_table), _toy_model(table), 5,
                                          generator_in(state), global_seed)

    start_state = torch.Generator().manual_seed(99).get_state()
    # The checks of how the step runs (vectorised, the device rule) check a step that drafts as the contract says
    # (its draft calls; the target call is the calls check's): one that computes nothing earns nothing from them.
    with check("vectorised over the batch: no Python loop over the B rows (lines of Python run for B = 2 and 2,000; "
               "a step that drafts as the contract says)"):
        _drafting_as_the_contract_says(observe(start_state, 11), prefix[:300], 5, draft_table, V, "B = 300, gamma = 5",
                                       target=False)
        few_rows, many_rows = (python_lines(batch, V, _toy_model(draft_table), _toy_model(table)) for batch in (2, 2000))
        assert many_rows <= 2 * few_rows + 100, (
            f"speculative_step must be vectorised over the batch: it ran {few_rows} lines of Python for B = 2 and "
            f"{many_rows} for B = 2000. Replace the loop over the rows by tensor operations (a loop over the gamma "
            "positions is fine)")
        vectorised = True

    # --- 3. calls, and randomness from the generator only: the global random state stays untouched, the
    # generator advances, its state alone fixes the result, and a second call draws new numbers. The states are
    # read next to the student's code (the generator it gets there is a copy of the one built here) and compared
    # here ---
    with check("draft_model called gamma = 5 times on the prefix and the tokens it drafted, target_model once on the "
               "prefix and all gamma drafts; the accepted tokens are the drafts"):
        _drafting_as_the_contract_says(observe(start_state, 11), prefix[:300], 5, draft_table, V,
                                       "B = 300, gamma = 5")
    with check("all randomness from `generator`: the global random state is untouched, the generator advances, its "
               "state alone fixes the result, and a second call draws new tokens"):
        first = observe(start_state, 11)
        before, after = first["global_states"]
        assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after)), (
            "speculative_step changed the global random state (torch.manual_seed, or torch.rand / torch.multinomial "
            "without generator=...): all randomness must come from `generator`")
        assert not torch.equal(first["generator_state"], start_state), (
            "the generator did not advance: draw every random number from `generator`")
        first_tokens, first_num = _speculative_format(prefix[:300], first["out"], 5, V)
        replay_tokens, replay_num = _speculative_format(prefix[:300], observe(start_state, 12)["out"], 5, V)
        assert torch.equal(first_tokens, replay_tokens) and torch.equal(first_num, replay_num), (
            "a generator in the same state must give the same tokens, whatever the global seed: take all randomness "
            "from `generator`, from its current state (do not re-seed anything from it)")
        second_tokens, _ = _speculative_format(prefix[:300], observe(first["generator_state"], 11)["out"], 5, V)
        assert not torch.equal(first_tokens, second_tokens), (
            "a second call with the same generator (now advanced) returned the same 300 x 6 tokens: draw from the "
            "generator's current state, do not re-seed anything from its seed")
    with check("returns new_tokens and num_new on the device of prefix (prefix, models and generator on DEVICE; also "
               "with PyTorch's default device set to meta; a step that drafts as the contract says)"):
        small, device_gen = prefix[:50].to(DEVICE), torch.Generator(device=DEVICE).manual_seed(8)
        run = _speculative_step_observed(small, _toy_model(draft_table.to(DEVICE)), _toy_model(table.to(DEVICE)), 3,
                                         torch.Generator(device=DEVICE).manual_seed(9))
        _drafting_as_the_contract_says(run, small, 3, draft_table, V, "prefix on DEVICE", target=False)
        assert_on_input_device(speculative_step, (small, _toy_model(draft_table.to(DEVICE)), _toy_model(table.to(DEVICE)),
                                                  3, device_gen), small.device, "speculative_step", outputs=2)

    # --- 4. statistical test: context-independent toy models, known acceptance rate alpha ---
    # 100,000 rows; an implementation that loops over the rows (charged once, above) gets 5,000, to stay in time: the
    # thresholds follow the number of rows.
    M, CHUNK = (100_000, 25_000) if vectorised else (5_000, 5_000)

    def sample_rows(make_prefix, draft, target, gamma, seed):
        """M rows of speculative_step (draft and target: tables of toy models), in calls of CHUNK rows (a result
        crosses the grading boundary, which caps its size), each from its own seeded generator, so the rows stay
        independent. Returns the prefixes, new tokens and num_new of all rows, on the CPU."""
        prefixes, tokens, counts = [], [], []
        for start in range(0, M, CHUNK):
            gen = torch.Generator().manual_seed(seed + start)
            prefix = make_prefix(min(CHUNK, M - start), gen)
            new_tokens, num_new = _speculative_format(
                prefix, speculative_step(prefix, _toy_model(draft), _toy_model(target), gamma, gen), gamma, V)
            prefixes.append(prefix.cpu())
            tokens.append(new_tokens.cpu())
            counts.append(num_new.cpu())
        return torch.cat(prefixes), torch.cat(tokens), torch.cat(counts)

    p = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])
    alpha = torch.minimum(p, q).sum().item()  # 0.6
    gamma = 4
    sampled = {}
    not_sampled = "speculative_step failed on the statistical test's inputs (see the first failed check)"
    with check("statistical: the first emitted token is distributed as the target"):
        sampled["iid"] = sample_rows(lambda rows, gen: torch.zeros(rows, 3, dtype=torch.long),
                                     q.expand(V, V), p.expand(V, V), gamma, 2024)
        _, out_tokens, num_new = sampled["iid"]
        freq = torch.bincount(out_tokens[:, 0], minlength=V).double().cpu() / M
        worst = (freq - p.double().cpu()).abs().max().item()
        assert worst <= threshold(M), (
            f"the first emitted token must be distributed as the target p = {p.tolist()}; got frequencies "
            f"{[round(x, 4) for x in freq.tolist()]} (max deviation {worst:.4f} > {threshold(M):.4f}). Check the acceptance "
            f"rule u < p(x)/q(x) and that a rejected token is replaced from norm(max(0, p - q))")
    with check("statistical: the mean of num_new is (1 - alpha^(gamma+1)) / (1 - alpha)"):
        assert "iid" in sampled, not_sampled
        _, out_tokens, num_new = sampled["iid"]
        mean_new = num_new.double().mean().item()
        expected = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        assert abs(mean_new - expected) <= threshold(M, gamma), (
            f"with alpha = {alpha!r} and gamma = {gamma} the mean of num_new must be (1 - alpha^(gamma+1)) / (1 - alpha) "
            f"= {expected!r}; got {mean_new!r} (tolerance {threshold(M, gamma):.4f}). Stop at the first rejection and "
            f"add the bonus token when all drafts are accepted")
    with check("statistical: the bonus token (all drafts accepted) is sampled from the target after the last draft"):
        assert "iid" in sampled, not_sampled
        _, out_tokens, num_new = sampled["iid"]
        all_accepted = num_new.eq(gamma + 1)  # these rows end with the bonus token, drawn from p_{gamma+1} = p
        m = int(all_accepted.sum())
        freq = torch.bincount(out_tokens[all_accepted, gamma], minlength=V).double().cpu() / max(m, 1)
        worst = (freq - p.double().cpu()).abs().max().item()
        assert m > 0 and worst <= threshold(max(m, 1)), (
            f"when all {gamma} drafts are accepted the bonus token must be sampled from the target's distribution after "
            f"the last draft, here p = {p.tolist()}; got frequencies {[round(x, 4) for x in freq.tolist()]} over {m} rows "
            f"(max deviation {worst:.4f} > {threshold(max(m, 1)):.4f}): sample it (not argmax) from the target (not the draft)")

    # --- 5. statistical test: Markov toy models (the distribution depends on the last token) ---
    P = torch.tensor([[0.70, 0.10, 0.10, 0.05, 0.05],
                      [0.05, 0.05, 0.60, 0.25, 0.05],
                      [0.30, 0.30, 0.00, 0.20, 0.20],
                      [0.10, 0.50, 0.10, 0.10, 0.20],
                      [0.25, 0.00, 0.25, 0.00, 0.50]])
    Q = torch.tensor([[0.20, 0.20, 0.20, 0.20, 0.20],
                      [0.40, 0.05, 0.15, 0.10, 0.30],
                      [0.10, 0.60, 0.10, 0.10, 0.10],
                      [0.30, 0.10, 0.30, 0.10, 0.20],
                      [0.05, 0.30, 0.05, 0.30, 0.30]])
    with check("statistical: every emitted token, the bonus included, follows the Markov target given the token before it"):
        prefix, out_tokens, num_new = sample_rows(
            lambda rows, gen: torch.randint(V, (rows, 4), generator=gen), Q, P, 3, 2025)
        last, P_cpu = prefix[:, -1], P.double().cpu()
        # position k's token given the token before it (the prefix's last token for k = 0), among rows emitting it
        for k, previous in enumerate([last, out_tokens[:, 0], out_tokens[:, 1], out_tokens[:, 2]]):  # k = 3: bonus
            emitted = num_new.ge(k + 1)
            for a in range(V):
                rows = emitted & previous.eq(a)
                m = int(rows.sum())
                if m < 1:
                    continue
                freq = torch.bincount(out_tokens[rows, k], minlength=V).double() / m
                worst = (freq - P_cpu[a]).abs().max().item()
                assert worst <= threshold(m), (
                    f"Markov toy target: emitted token {k + 1} after token {a} must follow the target row {P_cpu[a].tolist()}; "
                    f"got {[round(x, 4) for x in freq.tolist()]} over {m} rows (max deviation {worst:.4f} > {threshold(m):.4f}). "
                    f"Are p_i taken at the right positions of the target output, do you stop after a rejection, and is the "
                    f"bonus token (position gamma + 1) sampled from the target's distribution after the last draft?")


_q6_4_hidden_tests()
del _q6_4_hidden_tests
### END HIDDEN TESTS
del _toy_model, _speculative_format, _drafting_as_the_contract_says
finish_checks("Question 6.4")


# %% [markdown]
# ## Speculative decoding of the recall models
#
# Now use your `speculative_step` on the models of Part 1: the deepest one is the target, each shallower one
# serves as a draft (at cpu scale: the 2-layer target and the 1-layer draft). Every sequence starts from a fresh
# recall context plus its first query key, and we generate the rest of the query half (query keys and answers)
# one sequence at a time ($B = 1$, the latency setting), once with plain sampling from the target and once
# speculatively. Two tables come out.
#
# **Acceptance.** A step tests its drafts in order and stops at the first rejection: the drafts after it are never
# tested. So `accepted / drafted` is *not* the acceptance probability $\alpha$: with $\alpha = 0.5$ and $\gamma = 4$
# it comes out near $0.23$. Each *tested* draft is accepted or rejected, and a step has at most one rejection, so
# the estimate of $\alpha$ is `accepted / (accepted + rejections)`. The table also gives $\alpha_i$, the rate at
# draft position $i$ (the drafts at position $i$ that were tested, i.e. whose predecessors were all accepted), and
# the tokens per pass that $(1 - \alpha^{\gamma+1})/(1 - \alpha)$ predicts from the estimate $\alpha$. (The last
# step of a sequence drafts fewer than $\gamma$ tokens when fewer are left, which lowers the measured tokens per
# pass a little.)
#
# **Cost.** One speculative step costs a target pass, $\gamma$ draft passes and the loop's own work (drawing the
# draft tokens, concatenating them, the acceptance test, the residual draw and reading `num_new` back: many small
# operations, and on a GPU a synchronisation); plain sampling pays a target pass and a smaller overhead per token.
# The second table times one target pass and one draft pass on their own and splits the measured time per step.

# %%
SPEC_DEMO = dict(gamma=at_scale(teaching=4, quick=3, cpu=4), num_sequences=at_scale(teaching=64, quick=4, cpu=48))


def as_probabilities(model):
    """Wrap a RecallTransformer as a next-token distribution: int64 (B, S) -> float32 (B, S, V)."""
    @torch.no_grad()
    def probabilities(tokens):
        return torch.softmax(model(tokens).float(), dim=-1)
    return probabilities


def synchronize():
    """Wait for queued GPU work (a no-op on CPU), so that wall-clock times are honest."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def generate_plain(target, prefix, total_len, generator):
    """Sample from the target one token at a time until total_len tokens; returns (tokens, target passes)."""
    tokens, passes = prefix, 0
    while tokens.shape[1] < total_len:
        next_token = torch.multinomial(target(tokens)[:, -1], 1, generator=generator)
        tokens, passes = torch.cat([tokens, next_token], dim=1), passes + 1
    return tokens, passes


def generate_speculative(draft, target, prefix, total_len, gamma, generator, counts):
    """Speculative sampling until total_len tokens; returns (tokens, target passes).

    ``counts`` (a dict) is updated in place: ``drafted`` (draft tokens proposed), ``accepted``, ``rejected`` (steps
    that ended in a rejection: at most one per step), and the lists ``tested_at`` / ``accepted_at`` (per draft
    position i = 0 .. gamma - 1: how often draft i was tested, i.e. all drafts before it were accepted, and how
    often it was accepted).
    """
    tokens, passes = prefix, 0
    while tokens.shape[1] < total_len:
        step_gamma = min(gamma, total_len - tokens.shape[1])  # never run a model past its last position
        new_tokens, num_new = speculative_step(tokens, draft, target, step_gamma, generator)
        count = int(num_new[0])
        if not 1 <= count <= step_gamma + 1:
            raise ValueError(f"speculative_step returned num_new = {count}, outside 1 .. gamma + 1")
        tokens = torch.cat([tokens, new_tokens[:, :count]], dim=1)[:, :total_len]
        accepted = count - 1
        counts["drafted"] += step_gamma
        counts["accepted"] += accepted
        counts["rejected"] += int(accepted < step_gamma)
        for i in range(min(accepted + 1, step_gamma)):  # drafts 0 .. accepted were tested (the last one rejected)
            counts["tested_at"][i] += 1
            counts["accepted_at"][i] += int(i < accepted)
        passes += 1
    return tokens, passes


def answers_correct(tokens, num_pairs):
    """(correct answers, answers) in the generated query half: is each answer the value of its query key?"""
    context, queries = tokens[0, : 2 * num_pairs].tolist(), tokens[0, 2 * num_pairs:].tolist()
    value_of = dict(zip(context[0::2], context[1::2]))
    pairs = list(zip(queries[0::2], queries[1::2]))
    return sum(value_of.get(key) == answer for key, answer in pairs), len(pairs)


def pass_ms(model_probabilities, length, task=RECALL_TASK):
    """Median time of one pass (B = 1) over ``length`` tokens, in ms."""
    tokens = make_recall_batch(1, **task, generator=torch.Generator(device=DEVICE).manual_seed(3))[:, :length]
    return benchmark_latency(model_probabilities, tokens, n_warmup=3, n_repeat=20)


def run_speculative_demo(models, task=RECALL_TASK, gamma=SPEC_DEMO["gamma"], num_sequences=SPEC_DEMO["num_sequences"]):
    """Compare plain and speculative generation for every draft depth.

    Returns:
        tuple: (acceptance DataFrame, cost DataFrame), one row per way of generating.
    """
    target_layers = max(models)
    target = as_probabilities(models[target_layers])
    total_len = 2 * task["num_pairs"] + 2 * task["num_queries"]
    prompts = make_recall_batch(num_sequences, **task, generator=torch.Generator(device=DEVICE).manual_seed(77))
    prompts = prompts[:, : 2 * task["num_pairs"] + 1]  # context and the first query key
    typical_len = (prompts.shape[1] + total_len) // 2  # the passes' lengths range from the prompt's to total_len
    target_ms = pass_ms(target, typical_len, task)
    acceptance, cost = [], []
    for draft_layers in [None] + sorted(layers for layers in models if layers < target_layers):
        generator = torch.Generator(device=DEVICE).manual_seed(5)
        draft = None if draft_layers is None else as_probabilities(models[draft_layers])
        counts = dict(drafted=0, accepted=0, rejected=0, tested_at=[0] * gamma, accepted_at=[0] * gamma)
        passes = generated = correct = answers = 0
        synchronize()
        start_s = time.perf_counter()
        for index in progress(range(num_sequences), "plain sampling" if draft is None else f"{draft_layers}-layer draft"):
            prefix = prompts[index: index + 1]
            if draft is None:
                tokens, step_passes = generate_plain(target, prefix, total_len, generator)
            else:
                tokens, step_passes = generate_speculative(draft, target, prefix, total_len, gamma, generator, counts)
            passes, generated = passes + step_passes, generated + total_len - prefix.shape[1]
            good, total = answers_correct(tokens, task["num_pairs"])
            correct, answers = correct + good, answers + total
        synchronize()
        elapsed_ms = (time.perf_counter() - start_s) * 1e3
        name = "none (plain sampling)" if draft is None else f"{draft_layers} layer(s)"
        tested = counts["accepted"] + counts["rejected"]
        alpha = counts["accepted"] / tested if tested else float("nan")
        acceptance.append({
            "draft": name,
            "accepted/drafted": counts["accepted"] / counts["drafted"] if draft is not None else float("nan"),
            "alpha": alpha,
            "alpha by position": " ".join(f"{a / t:.2f}" if t else "-" for a, t in zip(counts["accepted_at"],
                                                                                     counts["tested_at"]))
                                 if draft is not None else "",
            "tokens/pass formula": expected_tokens_per_pass(alpha, gamma) if draft is not None else 1.0,
            "tokens/pass measured": generated / passes,
            "answer_accuracy": correct / answers,
        })
        draft_ms = 0.0 if draft is None else pass_ms(draft, typical_len, task)
        drafts_per_step = counts["drafted"] / passes
        step_ms = elapsed_ms / passes
        cost.append({"draft": name, "ms/token": elapsed_ms / generated, "ms/step": step_ms,
                     "target pass ms": target_ms, "draft passes ms": drafts_per_step * draft_ms,
                     "loop overhead ms": step_ms - target_ms - drafts_per_step * draft_ms,
                     "c = draft/target": draft_ms / target_ms})
    acceptance, cost = pd.DataFrame(acceptance), pd.DataFrame(cost)
    cost["speedup"] = cost["ms/token"].iloc[0] / cost["ms/token"]
    # What "tokens per pass / (1 + gamma c)" predicts: the passes alone, the loop's overhead left out.
    cost["speedup 1+gamma*c"] = acceptance["tokens/pass measured"] / (1 + gamma * cost["c = draft/target"])
    return acceptance, cost


spec_cost = None
if len(recall_models) < 2:
    print("Train the recall models of Part 1 first (they need your causal_self_attention, Question 1.1).")
else:
    with uses_answers("Question 6.3", "Question 6.4"):
        spec_acceptance, spec_cost = run_speculative_demo(recall_models)
        print(f"Target: {max(recall_models)}-layer recall model, gamma = {SPEC_DEMO['gamma']}, "
              f"{SPEC_DEMO['num_sequences']} sequences of batch size 1")
        with pd.option_context("display.width", 200):
            print(spec_acceptance.to_string(index=False, float_format=lambda x: f"{x:.3f}"))

# %%
if spec_cost is not None:
    print("Time per token and per step (one target pass, the draft passes, the loop's own work), and the speedup:")
    with pd.option_context("display.width", 200):
        print(spec_cost.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if SCALE == "cpu":
        print("The H200's tables (4-layer target, 1- to 3-layer drafts) are in measured_runs.md beside this notebook.")

# %% [markdown]
# **Whose output is it?** The answer accuracy of the first table comes from the few sequences that a timed loop of
# batch size 1 can afford: its standard error is a few points, as large as the differences it would show. The cell
# below samples many more sequences, all at once (a batch: the rows that have generated the fewest tokens so far take
# one step together, one call of your `speculative_step`), in three ways: from the target alone, speculatively with
# each draft, and from each draft alone. It prints the answer accuracy of each with its standard error (over the
# sequences), and each way's difference from the target alone on the same prompts (paired, with its standard error).

# %%
LOSSLESS_CHECK = dict(num_sequences=at_scale(teaching=2048, quick=16, cpu=2048), seed=11)


def generate_batched(target, prefixes, total_len, generator, draft=None, gamma=SPEC_DEMO["gamma"]):
    """Sample every row of ``prefixes`` (B, T) up to ``total_len`` tokens, each row an independent sequence: from
    ``target`` alone when ``draft`` is None (plain sampling), else speculatively with your speculative_step. A
    speculative step emits 1 to gamma + 1 tokens in each row, so the rows grow apart: each round, the rows with the
    fewest tokens so far take one step together.

    Returns:
        torch.Tensor: int64 (B, total_len).
    """
    batch, start = prefixes.shape
    tokens = torch.cat([prefixes, prefixes.new_full((batch, total_len - start), -1)], dim=1)
    lengths = torch.full((batch,), start, dtype=torch.long, device=prefixes.device)
    while bool((lengths < total_len).any()):
        length = int(lengths[lengths < total_len].min())
        rows = (lengths == length).nonzero().squeeze(1)
        if draft is None:
            new = torch.multinomial(target(tokens[rows, :length])[:, -1], 1, generator=generator)
            count = torch.ones(len(rows), dtype=torch.long, device=rows.device)
        else:  # never run a model past its last position; a bonus token beyond it is dropped
            step_gamma = min(gamma, total_len - length)
            new, count = speculative_step(tokens[rows, :length], draft, target, step_gamma, generator)
            count = count.clamp(max=total_len - length)
        for j in range(min(new.shape[1], total_len - length)):
            written = count > j
            tokens[rows[written], length + j] = new[written, j]
        lengths[rows] += count
    return tokens


def answer_accuracy_per_sequence(tokens, num_pairs):
    """Fraction of correct answers in the query half of each row of ``tokens`` (B, S): (B,) float."""
    keys, values = tokens[:, : 2 * num_pairs: 2], tokens[:, 1: 2 * num_pairs: 2]
    asked, answers = tokens[:, 2 * num_pairs:: 2], tokens[:, 2 * num_pairs + 1:: 2]
    listed = asked.unsqueeze(2) == keys.unsqueeze(1)  # (B, queries, pairs): where each asked key was listed
    expected = torch.where(listed, values.unsqueeze(1), torch.full_like(listed, -1, dtype=torch.long)).amax(dim=2)
    return (answers == expected).float().mean(dim=1)  # an asked token that is no listed key has no right answer


def lossless_check(models, task=RECALL_TASK, num_sequences=LOSSLESS_CHECK["num_sequences"]):
    """Answer accuracy of num_sequences sequences sampled from the target alone, speculatively with each draft, and
    from each draft alone (the same prompts for all): one row per way, with its standard error over the sequences,
    and its difference from the target alone, prompt by prompt, with that difference's standard error."""
    target_layers = max(models)
    target = as_probabilities(models[target_layers])
    total_len = 2 * task["num_pairs"] + 2 * task["num_queries"]
    prompts = make_recall_batch(num_sequences, **task, generator=torch.Generator(device=DEVICE).manual_seed(78))
    prompts = prompts[:, : 2 * task["num_pairs"] + 1]  # context and the first query key
    drafts = sorted(layers for layers in models if layers < target_layers)
    ways = ([(f"target ({target_layers} layers) alone", target, None)]
            + [(f"speculative, {layers}-layer draft", target, as_probabilities(models[layers])) for layers in drafts]
            + [(f"{layers}-layer draft alone", as_probabilities(models[layers]), None) for layers in drafts])
    accuracies = {}
    for name, model, draft in progress(ways, "ways of sampling"):
        generator = torch.Generator(device=DEVICE).manual_seed(LOSSLESS_CHECK["seed"])
        with torch.no_grad():
            tokens = generate_batched(model, prompts, total_len, generator, draft=draft)
        accuracies[name] = answer_accuracy_per_sequence(tokens, task["num_pairs"]).double().cpu()
    plain = accuracies[ways[0][0]]
    rows = []
    for name, accuracy in accuracies.items():
        difference = accuracy - plain
        rows.append({"sampled": name, "answer_accuracy": accuracy.mean().item(),
                     "accuracy_standard_error": accuracy.std().item() / math.sqrt(num_sequences),
                     "accuracy_minus_target_alone": difference.mean().item(),
                     "its_standard_error": difference.std().item() / math.sqrt(num_sequences)})
    return pd.DataFrame(rows)


if len(recall_models) < 2:
    print("Train the recall models of Part 1 first (they need your causal_self_attention, Question 1.1).")
else:
    with uses_answers("Question 6.4"):
        lossless = lossless_check(recall_models)
        print(f"{LOSSLESS_CHECK['num_sequences']} sequences per way, the same prompts, {RECALL_TASK['num_queries']} "
              f"answers each; gamma = {SPEC_DEMO['gamma']}:")
        with pd.option_context("display.width", 200):
            print(lossless.to_string(index=False, float_format=lambda x: f"{x:.4f}"))

# %% [markdown]
# #### Question 6.5 (3 points)
#
# Run the demo at teaching scale (without a GPU: at cpu scale, which has one draft, and answer for the deeper
# drafts from the H200 tables in `measured_runs.md` beside this notebook, Part 6). Report the acceptance rate $\alpha$ and the tokens per
# target pass of each draft, and explain the differences between the drafts using what you know about the task
# (which tokens can a 1-layer model predict, and which can it not?). Why is `accepted/drafted` not $\alpha$? Does
# $(1 - \alpha^{\gamma+1})/(1 - \alpha)$ with the estimated $\alpha$ give the measured tokens per pass, although the
# rate depends on the draft position? Did speculative decoding make generation faster in wall-clock time? Explain
# with the cost table: how much does a draft pass cost compared with a target pass ($c$; these tiny models are bound
# by the fixed cost per layer and per pass you saw in Part 5), why does tokens per pass / $(1 + \gamma c)$ (Bonus
# 6.6's model) predict a larger speedup than measured, and what would a draft have to be like to help more?
# Finally, compare the answer accuracy of speculative sampling with that of plain sampling from the target and of each
# draft sampled alone, in the last table (with its standard errors; without a GPU, from your cpu-scale run, which has
# the 1-layer draft, and the H200's table in `measured_runs.md` for all three): what property of speculative sampling
# does it show?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q6_5_answer", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# (Model answer from the course's H200 run, whose tables `measured_runs.md` prints: 4-layer target, $\gamma = 4$, 64
# sequences, and 2,048 sequences per way in the lossless check. Re-read the tables: your numbers will differ, and
# timings of these tiny models vary from run to run.)
#
# **Acceptance.** The 1-layer draft's `accepted/drafted` is 0.258, but that is not $\alpha$: a step stops at its first
# rejection, so the drafts after it are counted as drafted without ever being tested. Counting only tested drafts,
# $\alpha$ = accepted / (accepted + rejections) is about twice as large (0.496), and with it
# $(1 - \alpha^5)/(1 - \alpha)$ = 1.93 gives the measured 1.94 tokens per pass (the old estimate, 0.258, would
# give $(1 - 0.258^5)/(1 - 0.258) = 1.35$). Its rate by position alternates, high at positions 1 and 3 (0.74 and 0.75)
# and low at 2 and 4 (0.17 and 0.12): a step usually starts at a query key (after an answer), and the 1-layer draft
# does well on query keys, where it only has to pick one of the listed keys at random as the target does, and badly on
# answers, which need recall (two layers, Question 1.3). Here the average over positions still predicts the tokens
# per pass well; the formula needs the right estimate of $\alpha$ more than equal rates. The 2- and 3-layer drafts can
# recall, agree with the target almost everywhere ($\alpha$ of 0.93 or more at every position) and give 4.32 and
# 4.40 tokens per pass, out of at most 5; the formula says more (4.56 and 4.67), because the last step of each
# sequence has fewer than $\gamma$ tokens left to draft.
#
# **Wall clock.** The 1-layer draft made generation slower (0.672x), the 2-layer draft a little faster (1.04x) and
# the 3-layer draft slower (0.764x). A speculative step costs (ms per token times tokens per pass) 7.9, 11.3 and
# 15.7 ms against 2.72 ms per plain token. Reading that as $1 + \gamma c$ target passes would put $c$ at
# $(1.943/0.672 - 1)/4 = 0.47$, $(4.324/1.043 - 1)/4 = 0.79$ and $(4.404/0.764 - 1)/4 = 1.19$: a 3-layer draft pass
# costing more than a 4-layer target pass is impossible, so the step pays for something besides the passes. The
# cost table splits it, as far as timings of these tiny models allow: bound by the fixed cost of launching each
# kernel (Part 5), they vary by tens of per cent from one measurement to the next on a busy machine. The plain
# token's loop overhead comes out negative (-0.32 ms: a whole plain step, 2.72 ms, took less than the target pass
# timed alone, 3.04 ms, though it does more), and so does the 1-layer draft's (-0.42 ms). The drafts' passes timed
# alone give $c$ = 0.46, 0.50 and 1.00, at or above the layer ratios 0.25, 0.5 and 0.75: a fixed cost per pass
# (embeddings, final norm, LM head and softmax, each a few kernels) that makes the 1-layer draft cost almost half a
# target pass, and for the 3-layer draft, timed as long as the target, that noise as well. The loop's own work per
# step (drawing $\gamma$ draft tokens one by one, concatenations, the acceptance test, the residual draw, reading
# `num_new` back to the CPU, which waits for the GPU) comes out at 2.4 ms with the 2-layer draft, almost a target
# pass, and 0.8 ms with the 3-layer one. So the speedup is tokens per pass
# $\times (t_T + o_\text{plain}) / (t_T + \gamma t_D + o_\text{step})$, below tokens per pass / $(1 + \gamma c)$ (1.04
# against 1.44 with the 2-layer draft, 0.76 against 0.88 with the 3-layer one; with the 1-layer draft, 0.67 against
# 0.68, the overhead is lost in the noise). Even the 3-layer draft, right almost always, loses: its pass costs nearly
# as much as the target's. Speculation pays when the draft is much cheaper ($c \ll 1$), usually right, and the
# step's overhead is small next to a target pass: a small LLM drafting for a large one whose decode steps are bound
# by reading its weights, with the sampling on the GPU, not these tiny models bound by fixed costs.
#
# **Accuracy.** In the first table the answer accuracy is about the same with every draft (98.6 % to 99.0 %) as with
# plain sampling from the target (99.2 %), but 64 sequences cannot tell apart differences of a point or two (at cpu
# scale, 48 sequences gave 57.6 % against 66.0 %, within their noise). The lossless check can: 2,048 sequences
# sampled speculatively answer 98.6 %, 98.7 % and 98.5 % correctly with the 1-, 2- and 3-layer drafts, the 4-layer
# target alone 98.3 % (each ± 0.1 %): on the same prompts, differences of a third of a point at most (0.23 ± 0.14,
# 0.34 ± 0.13 and 0.13 ± 0.13 points, all three against the same sample of the target alone). The 1-layer draft
# sampled alone answers 14.3 % ± 0.3 % correctly, 84 points below the target, yet speculative sampling with it
# answers like the target. The course's cpu-scale run shows the same with a 2-layer target: 60.5 % ± 0.5 %
# speculatively with the 1-layer draft, 60.2 % ± 0.5 % from the target alone, 7.4 % ± 0.2 % from the draft alone. The
# output follows the target, not the draft, even with a draft that cannot recall: speculative sampling is lossless,
# its output has exactly the target's distribution; the draft changes only the speed. (The 2- and 3-layer drafts
# alone answer about as well as the target, 98.1 % and 98.3 %, so only the 1-layer draft tells the two apart.)
# === BEGIN MARK SCHEME ===
# 3 points in total (judge against the student's own tables; without a GPU, the cpu-scale run (one draft) plus the
# H200 tables of measured_runs.md for the deeper drafts, marked exactly the same):
# - 1 point: reports alpha as accepted / (accepted + rejections) (or the table's alpha) and tokens per pass, and
#   explains the drafts: the 1-layer draft fails on the answers (recall needs 2 layers), its rate is high on query
#   keys and low on answers; deeper drafts are accepted almost always. Half of this point if the student plugs
#   accepted/drafted into the formula as alpha without saying why it underestimates alpha (untested drafts after the
#   first rejection). Saying that acceptance depends on the position is welcome but not required: with the right
#   alpha the formula matches the measured tokens per pass of the 1-layer draft within a few per cent here (the
#   deeper drafts' formula is under a tenth above, from the short last step of each sequence).
# - 1 point: the wall-clock speedup explained from the cost split: a step = one target pass + gamma draft passes +
#   the loop's own overhead, so tokens per pass / (1 + gamma c) over-predicts the speedup (or: c inferred from
#   1 + gamma c alone comes out too large, even above 1); c is at or above draft layers / target layers because of a
#   fixed cost per pass; speculation pays only with a much cheaper draft that is usually right and small per-step
#   overhead. Half of this point for tokens per pass / (1 + gamma c) without the overhead. Timings of these tiny
#   models are noisy: a student who reads a negative loop overhead, or a draft pass timed about as long as the
#   target's (the course's H200 run has both), as noise of the timings rather than a property of the step is right,
#   and one who takes them at face value, without saying they cannot be physical, loses nothing else for it.
# - 1 point: answer accuracy unchanged vs plain sampling, read from the lossless check (speculative within two to
#   three standard errors of the target alone, a fraction of a point, far from the 1-layer draft alone; on the
#   course's H200 run the three differences, 1.0 to 2.6 standard errors, share one sample of the target alone): the
#   output distribution equals the target's (lossless), whatever the draft. Noting that the 2- and 3-layer drafts
#   alone answer about as well as the target, so that only the 1-layer draft tests the property, is welcome. A
#   difference in the first table (48 or 64 sequences) is within its noise: an answer resting on it alone earns half
#   of this point.
# === END MARK SCHEME ===

# %% [markdown]
# #### Bonus 6.6 (6 points)
#
# Let a draft pass cost $c$ times a target pass (the cost ratio), and suppose each step costs $\gamma$ draft
# passes plus one target pass. Relative to plain decoding with the target (one token per target pass), the
# expected speedup is
# $$S(\alpha, \gamma, c) = \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}.$$
# Write `speculative_speedup(alpha, gamma, cost_ratio)` (a float; $\alpha = 1$ must work, and $\gamma = 0$ means
# plain decoding, speedup 1) and `best_gamma(alpha, cost_ratio, max_gamma)`: the $\gamma$ in
# $0, 1, \dots,$ `max_gamma` with the largest expected speedup (an integer; the smallest such $\gamma$ on a tie).
# Answers built from your own `expected_tokens_per_pass` (and `speculative_speedup`) are accepted as such.

# %% nbgrader={"grade": false, "grade_id": "b6_6_speculative_speedup", "locked": false, "schema_version": 3, "solution": true, "task": false}
def speculative_speedup(alpha, gamma, cost_ratio):
    """Expected speedup of speculative decoding over plain decoding with the target.

    Args:
        alpha (float): acceptance probability of a draft token, in [0, 1].
        gamma (int): draft tokens per step (>= 0).
        cost_ratio (float): time of one draft pass / time of one target pass (>= 0).

    Returns:
        float: expected tokens per step divided by the step's cost in target passes.
    """
    ### BEGIN SOLUTION
    tokens = float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost_ratio + 1)
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "b6_6_best_gamma", "locked": false, "schema_version": 3, "solution": true, "task": false}
def best_gamma(alpha, cost_ratio, max_gamma):
    """The number of draft tokens in 0 .. max_gamma with the largest expected speedup (smallest on a tie).

    Returns:
        int: the best gamma.
    """
    ### BEGIN SOLUTION
    best, best_speedup = 0, speculative_speedup(alpha, 0, cost_ratio)  # gamma = 0: plain decoding
    for gamma in range(1, max_gamma + 1):
        speedup = speculative_speedup(alpha, gamma, cost_ratio)
        if speedup > best_speedup:
            best, best_speedup = gamma, speedup
    return best
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "b6_6_speculative_speedup_tests", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# A mistake in Question 6.3 (or in speculative_speedup, for best_gamma) is charged once: answers built from your own
# expected_tokens_per_pass (as Question 6.3's test kept it) and speculative_speedup are accepted too.
def _best_gamma_of(speedups):
    """The first gamma whose speedup is the largest (to 1e-12: equal speedups computed two ways are a tie)."""
    return min(g for g in range(len(speedups)) if speedups[g] >= max(speedups) - 1e-12)


with check("public: speculative_speedup(0.5, 2, 0.25)"):
    assert_or_carried(
        lambda want, got=speculative_speedup(0.5, 2, 0.25): assert_close(
            got, want, "speculative_speedup(0.5, 2, 0.25)",
            formula="1.75 / 1.5"),
        1.75 / 1.5, carried(lambda: _kept_real("expected_tokens_per_pass", 0.5, 2) / 1.5))
with check("public: best_gamma(0.0, 0.1, 5) (with alpha = 0 every draft is wasted) and best_gamma(1.0, 0.5, 4) (with "
           "alpha = 1 every draft is accepted)"):
    assert_integer(best_gamma(0.0, 0.1, 5), 0, "best_gamma(0.0, 0.1, 5)")
    assert_or_carried(
        lambda want, got=best_gamma(1.0, 0.5, 4): assert_integer(
            got, want, "best_gamma(1.0, 0.5, 4)", formula="the speedups (gamma + 1) / (gamma / 2 + 1) grow with gamma"),
        4, carried(lambda: _best_gamma_of([as_real(speculative_speedup(1.0, g, 0.5), f"speculative_speedup(1.0, {g}, 0.5)")
                                           for g in range(5)])))
### BEGIN HIDDEN TESTS
def _b6_6_hidden_tests():
    def speedup(alpha, gamma, c):
        return sum(alpha ** i for i in range(gamma + 1)) / (gamma * c + 1)

    def speedups_of(cases):
        for alpha, gamma, c in cases:
            assert_or_carried(
                lambda want, got=speculative_speedup(alpha, gamma, c): assert_close(
                    got, want, f"speculative_speedup({alpha}, {gamma}, {c})",
                    formula="(1 + alpha + ... + alpha^gamma) / (gamma c + 1)"),
                speedup(alpha, gamma, c), carried(lambda: _kept_real("expected_tokens_per_pass", alpha, gamma) / (gamma * c + 1)))

    def best_of(cases):
        for alpha, c, max_gamma in cases:
            scores = [speedup(alpha, g, c) for g in range(max_gamma + 1)]
            own = carried(lambda: _best_gamma_of([as_real(speculative_speedup(alpha, g, c), f"speculative_speedup({alpha}, {g}, {c})")
                                                  for g in range(max_gamma + 1)]))
            assert_or_carried(
                lambda want, got=best_gamma(alpha, c, max_gamma): assert_integer(
                    got, want, f"best_gamma({alpha}, {c}, {max_gamma})",
                    formula=f"gamma ranges over 0 .. max_gamma; the expected speedups are "
                                                                f"{[round(s, 4) for s in scores]}; the smallest gamma wins a tie."),
                _best_gamma_of(scores), own)

    with check("speculative_speedup on hidden alpha, gamma and cost ratios", weight=2):
        speedups_of([(0.8, 4, 0.05), (0.6, 3, 0.5), (0.3, 7, 0.0), (0.999999, 2, 1.0)])
    with check("speculative_speedup at alpha = 1 and gamma = 0 (plain decoding, speedup 1)"):
        speedups_of([(1.0, 5, 0.1), (0.9, 0, 0.3)])
    with check("best_gamma on hidden alpha and cost ratios", weight=2):
        best_of([(0.8, 0.05, 20), (0.6, 0.5, 10), (0.9, 0.01, 40), (0.5, 1.0, 8), (1.0, 0.2, 12), (0.95, 0.2, 3),
                    (0.7, 0.0, 6)])
    with check("best_gamma considers gamma = 0 and takes the smallest gamma on a tie"):
        best_of([(0.0, 0.0, 4), (0.0, 0.1, 5), (0.2, 2.0, 6), (0.5, 0.25, 6)])  # the last: 1 (a constant cannot pass)


_b6_6_hidden_tests()
del _b6_6_hidden_tests
### END HIDDEN TESTS
del _best_gamma_of
finish_checks("Bonus 6.6")
