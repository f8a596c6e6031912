"""Prepared answers for Lab 2: correct ones written differently, and plausible wrong ones.

``ALTERNATIVES[grade_id]``: full sources for that solution cell that are correct but differ from the reference
(other formulas, loop orders, float64 inside, other masking). They must pass every test.
``WRONG[grade_id]``: ``(label, source)`` pairs, each a mistake a student plausibly makes. Each must fail the
tests of its own question and no other. Most wrong answers are the reference cell with one targeted change
(``_mutate``), so that each differs from a correct answer by exactly the mistake it names.
``SKIPS[grade_id]`` (at the end): ``(label, source)`` pairs that skip the method their question prescribes (the
library routine instead of einsum, no tiling, autograd instead of the backward pass), with right values. Each must
fail its own question only, earn at most a quarter of it and less than every answer in ``WRONG`` of that question
(``course check``, docs/AUTHORING.md "the order of grades").
"""
from __future__ import annotations

from pathlib import Path

import jupytext

_LAB = Path(__file__).resolve().parents[2] / "labs" / "lab2" / "lab2.py"
_REFERENCE = {
    cell.metadata["nbgrader"]["grade_id"]: cell.source
    for cell in jupytext.read(_LAB, fmt="py:percent").cells
    if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")
}


def _mutate(cell_id: str, *replacements: tuple[str, str]) -> str:
    """The reference source of ``cell_id`` with each ``old`` (which must occur exactly once) replaced by ``new``."""
    source = _REFERENCE[cell_id]
    for old, new in replacements:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"{cell_id}: {old!r} occurs {count} times in the reference, expected once")
        source = source.replace(old, new)
    return source


ALTERNATIVES: dict[str, list[str]] = {}
WRONG: dict[str, list[tuple[str, str]]] = {}

# ----------------------------------------------------------------------------------------------- Part 1
ALTERNATIVES["q1_1_hbm_bytes"] = [
    '''
def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    k = k or n
    a, b, product = n * k, k * n, n * n
    kernels = [(a + b, product)]          # (elements read, elements written) per kernel
    if not fused:
        kernels.append((product, product))  # relu: read the product, write the output
    return sum(read + written for read, written in kernels) * bytes_per_element
''',
]
WRONG["q1_1_hbm_bytes"] = [
    ("relu round trip counted once (only its write)",
     _mutate("q1_1_hbm_bytes", ("relu_elements = 0 if fused else 2 * n * n", "relu_elements = 0 if fused else n * n"))),
    ("inputs forgotten: only the n x n output is counted",
     _mutate("q1_1_hbm_bytes", ("matmul_elements = n * k + k * n + n * n", "matmul_elements = n * n"))),
    ("k ignored: always square",
     _mutate("q1_1_hbm_bytes", ("k = n if k is None else k", "k = n"))),
]

ALTERNATIVES["q1_2_predicted_speedup"] = [
    '''
def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    # Same model, written with the ridge point: a kernel is compute-bound above it, memory-bound below.
    k = n if k is None else k
    ridge = peak_tflops / bandwidth_tb_s  # FLOP/byte
    flops = 2.0 * n * n * k
    mm_bytes = (2 * n * k + n * n) * bytes_per_element
    mm_us = flops / peak_tflops / 1e6 if flops / mm_bytes >= ridge else mm_bytes / bandwidth_tb_s / 1e6
    relu_us = 2 * n * n * bytes_per_element / bandwidth_tb_s / 1e6
    return float((mm_us + relu_us) / mm_us)
''',
    '''
def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    # Counting the relu's n^2 comparisons as FLOPs too (negligible, within the tolerance).
    k = n if k is None else k
    peak, bw = peak_tflops * 1e12, bandwidth_tb_s * 1e12
    def t(flops, nbytes):
        return max(flops / peak, nbytes / bw)
    eager = t(2 * n * n * k, (2 * n * k + n * n) * bytes_per_element) + t(n * n, 2 * n * n * bytes_per_element)
    fused = t(2 * n * n * k + n * n, (2 * n * k + n * n) * bytes_per_element)
    return eager / fused
''',
]
WRONG["q1_2_predicted_speedup"] = [
    ("eager treated as one kernel: max over the summed FLOPs and bytes",
     _mutate("q1_2_predicted_speedup", ("return (matmul_s + relu_s) / fused_s",
                                        "return max(matmul_flops / peak_flop_s, (matmul_bytes + relu_bytes) / bandwidth_b_s) / fused_s"))),
    ("memory-only model (ignores compute): bytes ratio",
     _mutate("q1_2_predicted_speedup", ("return (matmul_s + relu_s) / fused_s", "return (matmul_bytes + relu_bytes) / matmul_bytes"))),
    ("fraction of time saved instead of the speedup",
     _mutate("q1_2_predicted_speedup", ("return (matmul_s + relu_s) / fused_s", "return 1.0 + relu_s / (matmul_s + relu_s)"))),
    ("tampering: a float subclass that reads the expected value from the test's frame and lies in subtraction",
     '''
import inspect


class _Speedup(float):
    def __float__(self):
        caller = inspect.currentframe().f_back
        return float(caller.f_locals["want"]) if "want" in caller.f_locals else 1.0

    def __sub__(self, other):
        return 0.0


def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    return _Speedup(1.0)
'''),
]

# ----------------------------------------------------------------------------------------------- Part 2
ALTERNATIVES["q2_1_chain_io_bytes"] = [
    '''
def chain_io_bytes(seq_len, kv_head, bytes_per_element=2):
    shapes_in = [(seq_len, kv_head), (kv_head, seq_len), (kv_head, seq_len)]
    shape_out = (kv_head, seq_len)
    input_bytes = sum(rows * cols for rows, cols in shapes_in) * bytes_per_element
    return input_bytes, shape_out[0] * shape_out[1] * bytes_per_element
''',
]
WRONG["q2_1_chain_io_bytes"] = [
    ("elements instead of bytes",
     _mutate("q2_1_chain_io_bytes", ("input_bytes = 3 * seq_len * kv_head * bytes_per_element", "input_bytes = 3 * seq_len * kv_head"),
             ("output_bytes = kv_head * seq_len * bytes_per_element", "output_bytes = kv_head * seq_len"))),
    ("only A and B counted as inputs",
     _mutate("q2_1_chain_io_bytes", ("input_bytes = 3 * seq_len * kv_head * bytes_per_element",
                                     "input_bytes = 2 * seq_len * kv_head * bytes_per_element"))),
]

ALTERNATIVES["q2_2_chain_flops"] = [
    '''
def chain_flops(seq_len, kv_head):
    macs = seq_len * kv_head * seq_len + kv_head * seq_len * seq_len
    return 2 * macs + seq_len * seq_len  # the relu's comparisons included: negligible next to the products
''',
]
WRONG["q2_2_chain_flops"] = [
    ("multiply-adds (MACs) instead of FLOPs",
     _mutate("q2_2_chain_flops", ("return int(first + second)", "return int((first + second) // 2)"))),
    ("only the first product",
     _mutate("q2_2_chain_flops", ("return int(first + second)", "return int(first)"))),
]

ALTERNATIVES["q2_3_chain_intensity"] = [
    '''
def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    flops = 2.0 * seq_len * seq_len * kv_head * 2
    matrices_of_seq_by_kv = 4                      # A, B, C in, the output out
    elements = matrices_of_seq_by_kv * seq_len * kv_head + 2 * intermediate_round_trips * seq_len ** 2
    return float(flops / (elements * bytes_per_element))
''',
]
WRONG["q2_3_chain_intensity"] = [
    ("a round trip counted as one transfer (write only)",
     _mutate("q2_3_chain_intensity", ("intermediate_bytes = intermediate_round_trips * 2 * seq_len * seq_len * bytes_per_element",
                                      "intermediate_bytes = intermediate_round_trips * seq_len * seq_len * bytes_per_element"))),
    ("inputs and output forgotten once the intermediate round-trips",
     _mutate("q2_3_chain_intensity", ("return flops / (io_bytes + intermediate_bytes)",
                                      "return flops / (intermediate_bytes if intermediate_round_trips else io_bytes)"))),
]

ALTERNATIVES["b2_5_reassociated_cost"] = [
    '''
def reassociated_chain_cost(seq_len, kv_head, bytes_per_element=2):
    flops = 4 * kv_head ** 2 * seq_len
    elements = 4 * kv_head * seq_len + 2 * kv_head ** 2  # C, A, B read and the output written; C @ A written and read
    return flops, elements * bytes_per_element
''',
]
WRONG["b2_5_reassociated_cost"] = [
    ("the C @ (A @ B) cost instead",
     _mutate("b2_5_reassociated_cost", ("ca_flops = 2 * kv_head * seq_len * kv_head", "ca_flops = 2 * seq_len * seq_len * kv_head"),
             ("cab_flops = 2 * kv_head * kv_head * seq_len", "cab_flops = 2 * kv_head * seq_len * seq_len"))),
    ("the small C @ A intermediate never read back",
     _mutate("b2_5_reassociated_cost", ("cab_elements = kv_head * kv_head + kv_head * seq_len + kv_head * seq_len",
                                        "cab_elements = kv_head * seq_len + kv_head * seq_len"))),
]

# ----------------------------------------------------------------------------------------------- Part 3
ALTERNATIVES["q3_1_einsum_attention"] = [
    _mutate("q3_1_einsum_attention", ("weights = torch.softmax(scores, dim=-1)",
                                      "weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)")),
    '''
def einsum_attention(q, k, v, mask=None):
    # explicit, stable softmax; scale the scores rather than q
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.einsum("bhqk,bkhd->bqhd", weights, v)
''',
]
WRONG["q3_1_einsum_attention"] = [
    # Issue 36, point 5 (prescribed method): right values with matmul, but the question prescribes torch.einsum. This was
    # an ALTERNATIVE before the method was checked; it now loses the method check only.
    ("right values with @ (matmul) instead of the prescribed torch.einsum", '''
def einsum_attention(q, k, v, mask=None):
    # matmul on (B, H, S, D) views, float64 inside, mask with the most negative float instead of -inf
    qh, kh, vh = (t.transpose(1, 2).to(torch.float64) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = torch.where(mask, scores, torch.finfo(scores.dtype).min)
    return (torch.softmax(scores, dim=-1) @ vh).transpose(1, 2).to(q.dtype)
'''),
    ("no 1/sqrt(D) scaling",
     _mutate("q3_1_einsum_attention", ("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"))),
    ("softmax over the queries instead of the keys",
     _mutate("q3_1_einsum_attention", ("weights = torch.softmax(scores, dim=-1)", "weights = torch.softmax(scores, dim=-2)"))),
    ("the classic output einsum bhst,bshd->bshd (returns v)",
     _mutate("q3_1_einsum_attention", ('return torch.einsum("bhst,bthd->bshd", weights, v).to(q.dtype)',
                                       'return torch.einsum("bhst,bshd->bshd", weights, v).to(q.dtype)'))),
    ("mask ignored",
     _mutate("q3_1_einsum_attention", ('scores = scores.masked_fill(~mask, float("-inf"))', "pass"))),
    ("softmax in bfloat16 (as a fused kernel would)",
     _mutate("q3_1_einsum_attention", ("weights = torch.softmax(scores, dim=-1)",
                                       "weights = torch.softmax(scores.to(torch.bfloat16), dim=-1).to(v.dtype)"))),
    ("right output, but q scaled in place (the caller's tensor changes)",
     _mutate("q3_1_einsum_attention", ('torch.einsum("bshd,bthd->bhst", q * scale, k)',
                                       'torch.einsum("bshd,bthd->bhst", q.mul_(scale), k)'))),
]

ALTERNATIVES["q3_2_attention_cost"] = [
    '''
def attention_cost(batch, seq_len, heads, head_dim, bytes_per_element=2, score_round_trips=0):
    per_head_macs = 2 * seq_len * seq_len * head_dim      # Q K^T and P V, multiply-adds
    flops = 2 * per_head_macs * batch * heads
    elements = 4 * batch * heads * seq_len * head_dim + 2 * score_round_trips * batch * heads * seq_len ** 2
    hbm_bytes = elements * bytes_per_element
    return dict(flops=flops, hbm_bytes=hbm_bytes, intensity=float(flops) / hbm_bytes)


kernels_touching_scores = ["einsum", "masked_fill", "softmax", "einsum"]
einsum_round_trips = len(kernels_touching_scores) - 1  # each kernel but the last writes what the next one reads
''',
]
WRONG["q3_2_attention_cost"] = [
    ("FLOPs counted as multiply-adds",
     _mutate("q3_2_attention_cost", ("flops = 2 * (2 * batch * heads * seq_len * seq_len * head_dim)",
                                     "flops = 2 * batch * heads * seq_len * seq_len * head_dim"))),
    ("round trips counted as kernels (4)",
     _mutate("q3_2_attention_cost", ("einsum_round_trips = 3", "einsum_round_trips = 4"))),
    ("score matrix size without the heads",
     _mutate("q3_2_attention_cost", ("score_bytes = score_round_trips * 2 * batch * heads * seq_len * seq_len * bytes_per_element",
                                     "score_bytes = score_round_trips * 2 * batch * seq_len * seq_len * bytes_per_element"))),
]

ALTERNATIVES["q3_3_causal_mask"] = [
    '''
def causal_mask(seq_len, device=None):
    return torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device))
''',
    '''
def causal_mask(seq_len, device=None):
    return ~torch.ones(seq_len, seq_len, device=device).triu(diagonal=1).bool()
''',
]
WRONG["q3_3_causal_mask"] = [
    ("diagonal excluded (a query cannot see itself)",
     _mutate("q3_3_causal_mask", ("return positions[None, :] <= positions[:, None]", "return positions[None, :] < positions[:, None]"))),
    ("transposed: future keys visible",
     _mutate("q3_3_causal_mask", ("return positions[None, :] <= positions[:, None]", "return positions[None, :] >= positions[:, None]"))),
]

# Packed sequences (segment_mask) are Bonus 3.4 since issue 52: its prepared answers are further down ("Issue 52").
# is_permutation_equivariant stays an optional, ungraded exercise (ids q3_5_*): no prepared answers.

# ----------------------------------------------------------------------------------------------- Part 4
ALTERNATIVES["q4_1_1_online_update"] = [
    '''
def online_softmax_update(running_max, running_sum, scores_block):
    new_max = torch.max(running_max, scores_block.max(dim=-1).values)
    old_scale = torch.exp(running_max - new_max).nan_to_num(0.0)          # -inf - -inf = nan -> 0
    block_terms = torch.exp(scores_block - new_max.unsqueeze(-1)).nan_to_num(0.0)
    return new_max, running_sum * old_scale + block_terms.sum(dim=-1)
''',
]
WRONG["q4_1_1_online_update"] = [
    ("running sum not rescaled when the max grows",
     _mutate("q4_1_1_online_update", ("new_sum = running_sum * torch.exp(running_max - shift) + ", "new_sum = running_sum + "))),
    ("rescale factor inverted: exp(new max - old max)",
     _mutate("q4_1_1_online_update", ("running_sum * torch.exp(running_max - shift)", "running_sum * torch.exp(shift - running_max).nan_to_num(0.0)"))),
    ("no guard for rows of -inf (NaN)",
     _mutate("q4_1_1_online_update", ("shift = torch.where(torch.isneginf(new_max), torch.zeros_like(new_max), new_max)", "shift = new_max"))),
]

ALTERNATIVES["q4_1_2_blockwise_lse"] = [
    '''
def blockwise_logsumexp(x, block_size):
    # Merge the log-sum-exp of each block into the running one: log(e^a + e^b) is the online update in log space.
    lse = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for block in x.split(block_size, dim=-1):
        lse = torch.logaddexp(lse, torch.logsumexp(block, dim=-1))
    return lse
''',
    '''
def blockwise_logsumexp(x, block_size):
    # Self-contained (no call to online_softmax_update), NaN from -inf - -inf turned into 0 afterwards.
    m = x.new_full(x.shape[:-1], float("-inf"))
    l = x.new_zeros(x.shape[:-1])
    for block in torch.split(x, block_size, dim=-1):
        m_new = torch.max(m, block.max(dim=-1).values)
        l = l * torch.exp(m - m_new).nan_to_num(0.0) + torch.exp(block - m_new.unsqueeze(-1)).nan_to_num(0.0).sum(-1)
        m = m_new
    return torch.where(l > 0, m + torch.log(l), m)
''',
]
WRONG["q4_1_2_blockwise_lse"] = [
    ("log of the running sum without the max",
     _mutate("q4_1_2_blockwise_lse", ("return running_max + torch.log(running_sum)", "return torch.log(running_sum)"))),
    ("running sum not rescaled when the max grows",
     _mutate("q4_1_2_blockwise_lse", ("running_sum = running_sum * torch.exp(running_max - shift) + ", "running_sum = running_sum + "))),
    ("last, shorter block dropped",
     _mutate("q4_1_2_blockwise_lse", ("for start in range(0, x.shape[-1], block_size):",
                                    "for start in range(0, x.shape[-1] - block_size + 1, block_size):"))),
    ("no max subtracted: log of the sum of exp, block by block (overflows and underflows)", """
def blockwise_logsumexp(x, block_size):
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        total = total + torch.exp(x[..., start:start + block_size]).sum(dim=-1)
    return torch.log(total)
"""),
    ("torch.logsumexp on whole rows (not block by block)", '''
def blockwise_logsumexp(x, block_size):
    return torch.logsumexp(x, dim=-1)
'''),
    ("the max of the whole row first, then blocks (not block by block)", '''
def blockwise_logsumexp(x, block_size):
    row_max = x.amax(dim=-1)
    shift = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    total = torch.zeros_like(shift)
    for start in range(0, x.shape[-1], block_size):
        total = total + torch.exp(x[..., start:start + block_size] - shift[..., None]).sum(dim=-1)
    return shift + torch.log(total)
'''),
]

ALTERNATIVES["q4_2_tiled_forward"] = [
    '''
def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    # One (batch, head) at a time with 2-D matmuls, float64 inside, every key tile visited (masked when causal).
    batch, seq_q, heads, head_dim = q.shape
    seq_kv = k.shape[1]
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    out = torch.zeros(batch, seq_q, heads, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.zeros(batch, heads, seq_q, dtype=torch.float64, device=q.device)
    for b in range(batch):
        for h in range(heads):
            for i in range(0, seq_q, block_q):
                qi = q64[b, i:i + block_q, h] / math.sqrt(head_dim)
                m = torch.full((qi.shape[0],), -math.inf, dtype=torch.float64, device=q.device)
                l = torch.zeros_like(m)
                o = torch.zeros(qi.shape[0], head_dim, dtype=torch.float64, device=q.device)
                for j in range(0, seq_kv, block_k):
                    s = qi @ k64[b, j:j + block_k, h].T
                    if causal:
                        rows = torch.arange(i, i + qi.shape[0], device=q.device)
                        cols = torch.arange(j, j + s.shape[1], device=q.device)
                        s = torch.where(cols[None, :] <= rows[:, None], s, -math.inf)
                    m_new = torch.maximum(m, s.max(dim=1).values)
                    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                    p = torch.exp(s - safe[:, None])
                    correction = torch.exp(m - safe)
                    l = l * correction + p.sum(dim=1)
                    o = o * correction[:, None] + p @ v64[b, j:j + block_k, h]
                    m = m_new
                out[b, i:i + block_q, h] = (o / l[:, None]).to(q.dtype)
                lse[b, h, i:i + block_q] = m + torch.log(l)
    return out, lse
''',
]
WRONG["q4_2_tiled_forward"] = [
    ("running output not rescaled when the max grows",
     _mutate("q4_2_tiled_forward", ("acc = acc * rescale[..., None] + torch.einsum(", "acc = acc + torch.einsum("))),
    ("lse without the max",
     _mutate("q4_2_tiled_forward", ("lse[:, :, q_start:q_end] = row_max + torch.log(row_sum)",
                                    "lse[:, :, q_start:q_end] = torch.log(row_sum)"))),
    ("causal mask off by one (diagonal excluded)",
     _mutate("q4_2_tiled_forward", ("scores = scores.masked_fill(cols > rows, float(\"-inf\"))",
                                    "scores = scores.masked_fill(cols >= rows, float(\"-inf\"))"))),
    ("materializes the whole S x S matrix (correct values)",
     '''
def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    cdt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bshd,bthd->bhst", q.to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
    if causal:
        visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhst,bthd->bshd", torch.exp(scores - lse[..., None]), v.to(cdt))
    return out.to(q.dtype), lse
'''),
    ("scores not scaled by 1/sqrt(D)",
     _mutate("q4_2_tiled_forward", ("scale = 1.0 / math.sqrt(head_dim)", "scale = 1.0"))),
    ("tampering: the S x S matrix computed with the dispatch modes (the probe) switched off", '''
from torch.utils._python_dispatch import _disable_current_modes


def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    with _disable_current_modes():
        cdt = torch.promote_types(q.dtype, torch.float32)
        scores = torch.einsum("bshd,bthd->bhst", q.to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
        if causal:
            visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("bhst,bthd->bshd", torch.exp(scores - lse[..., None]), v.to(cdt))
    return out.to(q.dtype), lse
'''),
    ("tampering: the probe's method patched while the function runs, restored afterwards", '''
def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    original = LargestTensorProbe.__torch_dispatch__
    LargestTensorProbe.__torch_dispatch__ = lambda self, func, types, args=(), kwargs=None: func(*args, **(kwargs or {}))
    try:
        cdt = torch.promote_types(q.dtype, torch.float32)
        scores = torch.einsum("bshd,bthd->bhst", q.to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
        if causal:
            visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("bhst,bthd->bshd", torch.exp(scores - lse[..., None]), v.to(cdt))
    finally:
        LargestTensorProbe.__torch_dispatch__ = original
    return out.to(q.dtype), lse
'''),
    ("tampering: the probe class replaced by one that records nothing", '''
class LargestTensorProbe(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest_numel, self.largest_op, self.op_names = 0, None, set()
        self.largest_input_numel, self.largest_input_op, self.num_ops = 0, None, 10_000

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    cdt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bshd,bthd->bhst", q.to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
    if causal:
        visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhst,bthd->bshd", torch.exp(scores - lse[..., None]), v.to(cdt))
    return out.to(q.dtype), lse
'''),
]

ALTERNATIVES["q4_3_triton_forward"] = [
    '''
@triton.jit
def _flash_attention_forward_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    num_heads, seq_len_q, seq_len_kv, head_dim, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Base-2 exponentials (as in Triton's tutorial), loads as blocks of (BLOCK_N, BLOCK_D) then transposed.
    log2e = 1.4426950408889634
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // num_heads
    off_h = off_bh - off_b * num_heads
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + rows[:, None] * stride_qs + dims[None, :] * stride_qd,
                mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim), other=0.0)
    m = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * log2e
    for start_n in range(0, seq_len_kv, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < seq_len_kv) & (dims[None, :] < head_dim)
        k = tl.load(K + off_b * stride_kb + off_h * stride_kh + cols[:, None] * stride_ks + dims[None, :] * stride_kd,
                    mask=kv_mask, other=0.0)
        v = tl.load(V + off_b * stride_vb + off_h * stride_vh + cols[:, None] * stride_vs + dims[None, :] * stride_vd,
                    mask=kv_mask, other=0.0)
        s2 = tl.dot(q, tl.trans(k)) * qk_scale
        keep = cols[None, :] < seq_len_kv
        if CAUSAL:
            keep = keep & (rows[:, None] >= cols[None, :])
        s2 = tl.where(keep, s2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s2, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        correction = tl.exp2(m - m_safe)
        p = tl.exp2(s2 - m_safe[:, None])
        l = l * correction + tl.sum(p, 1)
        acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    o = acc / l[:, None]
    tl.store(O + off_b * stride_ob + off_h * stride_oh + rows[:, None] * stride_os + dims[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim))
    tl.store(LSE + off_b * stride_lb + off_h * stride_lh + rows * stride_ls, (m + tl.log2(l)) / log2e,
             mask=rows < seq_len_q)

''',
]
WRONG["q4_3_triton_forward"] = [
    ("running output not rescaled (alpha missing on acc)",
     _mutate("q4_3_triton_forward", ("acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)", "acc = acc + tl.dot(p.to(v.dtype), v)"))),
    ("lse stored without the max",
     _mutate("q4_3_triton_forward", ("m_i + tl.log(l_i), mask=offs_m < seq_len_q)", "tl.log(l_i), mask=offs_m < seq_len_q)"))),
    ("causal mask off by one (diagonal excluded)",
     _mutate("q4_3_triton_forward", ("visible = visible & (cols[None, :] <= offs_m[:, None])", "visible = visible & (cols[None, :] < offs_m[:, None])"))),
    ("keys past the end not masked",
     _mutate("q4_3_triton_forward", ("visible = cols[None, :] < seq_len_kv\n", "visible = cols[None, :] >= 0\n"))),
    ("head offset from the shape (h * head_dim) instead of the head stride: right only for contiguous (B, S, H, D)",
     _mutate("q4_3_triton_forward", ("Q + b * stride_qb + h * stride_qh", "Q + b * stride_qb + h * head_dim"),
             ("K + b * stride_kb + h * stride_kh", "K + b * stride_kb + h * head_dim"),
             ("V + b * stride_vb + h * stride_vh", "V + b * stride_vb + h * head_dim"),
             ("O + b * stride_ob + h * stride_oh", "O + b * stride_ob + h * head_dim"))),
    ("head_dim assumed contiguous (stride_d ignored) and lse assumed contiguous",
     _mutate("q4_3_triton_forward", ("offs_d[None, :] * stride_qd", "offs_d[None, :]"),
             ("offs_d[:, None] * stride_kd", "offs_d[:, None]"),
             ("offs_d[None, :] * stride_vd", "offs_d[None, :]"),
             ("offs_d[None, :] * stride_od", "offs_d[None, :]"),
             ("offs_m * stride_ls", "offs_m"))),
    ("an empty kernel, and attention in PyTorch in a wrapper of one's own", '''
@triton.jit
def _flash_attention_forward_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    num_heads, seq_len_q, seq_len_kv, head_dim, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pass


def triton_attention_forward(q, k, v, causal=False):
    cdt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.einsum("bshd,bthd->bhst", q.to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
    if causal:
        visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhst,bthd->bshd", torch.exp(scores - lse[..., None]), v.to(cdt))
    return out.to(q.dtype), lse
'''),
]

ALTERNATIVES["b4_4_flash_backward"] = [
    '''
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    # Query tiles outside, key tiles inside; float64 throughout; (B, H, S, D) views.
    scale = q.shape[-1] ** -0.5
    qh, kh, vh, oh, doh = (t.transpose(1, 2).to(torch.float64) for t in (q, k, v, out, grad_out))
    lse64 = lse.to(torch.float64)
    delta = (doh * oh).sum(-1)
    dq, dk, dv = torch.zeros_like(qh), torch.zeros_like(kh), torch.zeros_like(vh)
    seq_q, seq_kv = qh.shape[2], kh.shape[2]
    for i in range(0, seq_q, block_q):
        qi, doi = qh[:, :, i:i + block_q], doh[:, :, i:i + block_q]
        for j in range(0, seq_kv, block_k):
            if causal and j > i + qi.shape[2] - 1:
                break
            kj, vj = kh[:, :, j:j + block_k], vh[:, :, j:j + block_k]
            s = qi @ kj.transpose(-1, -2) * scale
            if causal:
                rows = torch.arange(i, i + qi.shape[2], device=q.device)[:, None]
                cols = torch.arange(j, j + kj.shape[2], device=q.device)[None, :]
                s = torch.where(cols <= rows, s, torch.tensor(-math.inf, dtype=s.dtype, device=s.device))
            p = torch.exp(s - lse64[:, :, i:i + block_q, None])
            dv[:, :, j:j + block_k] += p.transpose(-1, -2) @ doi
            ds = p * (doi @ vj.transpose(-1, -2) - delta[:, :, i:i + block_q, None])
            dq[:, :, i:i + block_q] += ds @ kj * scale
            dk[:, :, j:j + block_k] += ds.transpose(-1, -2) @ qi * scale
    return tuple(g.transpose(1, 2).to(t.dtype) for g, t in ((dq, q), (dk, k), (dv, v)))
''',
]
WRONG["b4_4_flash_backward"] = [
    ("tampering: the S x S probabilities computed with the dispatch modes (the probe) switched off", '''
from torch.utils._python_dispatch import _disable_current_modes


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    with _disable_current_modes():
        cdt = torch.promote_types(q.dtype, torch.float32)
        qc, kc, vc, oc, doc = (t.to(cdt) for t in (q, k, v, out, grad_out))
        scores = torch.einsum("bshd,bthd->bhst", qc, kc) / math.sqrt(q.shape[-1])
        if causal:
            scores = scores.masked_fill(~torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(), float("-inf"))
        probs = torch.exp(scores - lse.to(cdt)[..., None])
        dv = torch.einsum("bhst,bshd->bthd", probs, doc)
        dprobs = torch.einsum("bshd,bthd->bhst", doc, vc)
        dscores = probs * (dprobs - (doc * oc).sum(-1).transpose(1, 2)[..., None]) / math.sqrt(q.shape[-1])
        dq = torch.einsum("bhst,bthd->bshd", dscores, kc)
        dk = torch.einsum("bhst,bshd->bthd", dscores, qc)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
'''),
    ("softmax backward without delta (dS = P * dP)",
     _mutate("b4_4_flash_backward", ("dscores = probs * (dprobs - delta[:, :, q_start:q_end, None])", "dscores = probs * dprobs"))),
    ("dq and dk not scaled by 1/sqrt(D)",
     _mutate("b4_4_flash_backward", ('dq[:, :, q_start:q_end] += torch.einsum("bhst,bthd->bhsd", dscores, k_tile) * scale',
                                     'dq[:, :, q_start:q_end] += torch.einsum("bhst,bthd->bhsd", dscores, k_tile)'),
             ('dk[:, :, k_start:k_end] += torch.einsum("bhst,bshd->bhtd", dscores, q_tile) * scale',
              'dk[:, :, k_start:k_end] += torch.einsum("bhst,bshd->bhtd", dscores, q_tile)'))),
    ("materializes the whole S x S probability matrix (correct values)",
     '''
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    cdt = torch.promote_types(q.dtype, torch.float32)
    qc, kc, vc, oc, doc = (t.to(cdt) for t in (q, k, v, out, grad_out))
    scores = torch.einsum("bshd,bthd->bhst", qc, kc) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(), float("-inf"))
    probs = torch.exp(scores - lse.to(cdt)[..., None])
    dv = torch.einsum("bhst,bshd->bthd", probs, doc)
    dprobs = torch.einsum("bshd,bthd->bhst", doc, vc)
    dscores = probs * (dprobs - (doc * oc).sum(-1).transpose(1, 2)[..., None]) / math.sqrt(q.shape[-1])
    dq = torch.einsum("bhst,bthd->bshd", dscores, kc)
    dk = torch.einsum("bhst,bshd->bthd", dscores, qc)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
'''),
]

# ----------------------------------------------------------------------------------------------- Part 5
ALTERNATIVES["q5_1_benchmark_attention"] = [
    '''
def benchmark_attention(attn_fn, batch_size, seq_len, d_model, *, dtype=torch.float32, device=DEVICE,
                        backward=True, n_warmup=3, n_repeat=10):
    # Own OOM handling; CUDA events on a GPU for the backward.
    nan = float("nan")
    device = torch.device(device)
    oom_types = (torch.cuda.OutOfMemoryError, MemoryError)
    try:
        q = torch.randn(batch_size, seq_len, 1, d_model, dtype=dtype, device=device, requires_grad=backward)
        k = torch.randn_like(q, requires_grad=backward)
        v = torch.randn_like(q, requires_grad=backward)
        forward_ms = benchmark_latency(attn_fn, q, k, v, n_warmup=n_warmup, n_repeat=n_repeat)
        backward_ms = nan
        if backward:
            grad_out = torch.randn_like(q)
            samples = []
            for index in range(n_warmup + n_repeat):
                out = attn_fn(q, k, v)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    torch.autograd.grad(out, [q, k, v], grad_out)
                    end.record()
                    torch.cuda.synchronize()
                    elapsed_ms = start.elapsed_time(end)
                else:
                    t0 = time.perf_counter()
                    torch.autograd.grad(out, [q, k, v], grad_out)
                    elapsed_ms = (time.perf_counter() - t0) * 1000
                if index >= n_warmup:
                    samples.append(elapsed_ms)
            backward_ms = float(statistics.median(samples))
            step = lambda q, k, v: torch.autograd.grad(attn_fn(q, k, v), [q, k, v], grad_out)
        else:
            step = attn_fn
        peak_gb = benchmark_memory(step, q, k, v, n_warmup=1, n_repeat=1)[0]
    except oom_types:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"status": "oom", "forward_ms": nan, "backward_ms": nan, "peak_memory_gb": nan}
    return {"status": "ok", "forward_ms": float(forward_ms), "backward_ms": float(backward_ms),
            "peak_memory_gb": float(peak_gb)}
''',
]
WRONG["q5_1_benchmark_attention"] = [
    ("every exception reported as 'oom'",
     _mutate("q5_1_benchmark_attention", ("    status, result = run_oom_safe(measure)\n",
                                          "    try:\n        status, result = 'ok', measure()\n    except Exception:\n        status, result = 'oom', None\n"))),
    ("(B, 1, S, D) layout: heads before the sequence",
     _mutate("q5_1_benchmark_attention", ("shape = (batch_size, seq_len, 1, d_model)", "shape = (batch_size, 1, seq_len, d_model)"))),
    ("backward flag ignored: always runs the backward pass",
     _mutate("q5_1_benchmark_attention", ("        if not backward:\n            peak_gb",
                                          "        if False:\n            peak_gb"),
             ("requires_grad=backward)", "requires_grad=True)"))),
]
WRONG["q5_1_benchmark_attention"] += [
    ("backward timed together with its forward call",
     _mutate("q5_1_benchmark_attention", ("            out = attn_fn(q, k, v)\n            synchronize()\n            start_s = time.perf_counter()\n",
                                          "            start_s = time.perf_counter()\n            out = attn_fn(q, k, v)\n"))),
    ("peak memory of the forward pass only, even with backward=True",
     _mutate("q5_1_benchmark_attention", ("peak_gb, _ = benchmark_memory(forward_backward, q, k, v, n_warmup=1, n_repeat=1)",
                                          "peak_gb, _ = benchmark_memory(attn_fn, q, k, v, n_warmup=1, n_repeat=1)"))),
    ("peak memory in GiB (2^30 bytes) instead of GB",
     _mutate("q5_1_benchmark_attention", ('"peak_memory_gb": float(peak_gb)}', '"peak_memory_gb": float(peak_gb * 1e9 / 2**30)}'))),
    ("fabricated numbers: the passes run, but the reported numbers are made up", '''
def benchmark_attention(attn_fn, batch_size, seq_len, d_model, *, dtype=torch.float32, device=DEVICE,
                        backward=True, n_warmup=3, n_repeat=10):
    shape = (batch_size, seq_len, 1, d_model)

    def run():
        q, k, v = (torch.randn(shape, dtype=dtype, device=device, requires_grad=backward) for _ in range(3))
        for _ in range(n_warmup + n_repeat):
            out = attn_fn(q, k, v)
            if backward:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    status, _ = run_oom_safe(run)
    if status != "ok":
        return {"status": "oom", "forward_ms": float("nan"), "backward_ms": float("nan"), "peak_memory_gb": float("nan")}
    scores_gb = batch_size * seq_len * seq_len * torch.finfo(dtype).bits / 8 / 1e9
    return {"status": "ok", "forward_ms": 1.0, "backward_ms": 2.0 if backward else float("nan"),
            "peak_memory_gb": 4 * scores_gb}
'''),
]

# =============================================================================================================
# Issue 36 ("One test contract for all labs"): one variant per point, named in a comment. HINTS: answers that follow a
# hint of the lab's text literally; the harness runs them like ALTERNATIVES (they must pass everything).
# =============================================================================================================
HINTS: dict[str, list[tuple[str, str]]] = {}

# -- Point 1: every form the question allows (NumPy scalars, integral floats, one-element tensors, np.str_) ----------
ALTERNATIVES["q1_1_hbm_bytes"].append('''
import numpy as np


def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    # A NumPy integer (what arithmetic on NumPy shapes gives).
    k = n if k is None else k
    elements = np.int64(2 * n * k + n * n) + (0 if fused else np.int64(2 * n * n))
    return elements * np.int64(bytes_per_element)
''')
ALTERNATIVES["q1_1_hbm_bytes"].append('''
def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    # An integral float: 4096.0 bytes is 4096 bytes.
    k = n if k is None else k
    return float((2 * n * k + n * n + (0 if fused else 2 * n * n)) * bytes_per_element)
''')
WRONG["q1_1_hbm_bytes"].append(
    ("tampering: an int subclass whose == always says yes", '''
class _Yes(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


def relu_matmul_hbm_bytes(n, k=None, bytes_per_element=2, fused=True):
    return _Yes(1)
'''))
ALTERNATIVES["q1_2_predicted_speedup"].append('''
import numpy as np


def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    # The ratio as a NumPy float32 (well within the 1% the question allows).
    k = n if k is None else k
    flops = np.float32(2.0 * n * n * k)
    mm = max(flops / np.float32(peak_tflops * 1e12), np.float32((2 * n * k + n * n) * bytes_per_element / (bandwidth_tb_s * 1e12)))
    relu = np.float32(2 * n * n * bytes_per_element / (bandwidth_tb_s * 1e12))
    return (mm + relu) / mm
''')
ALTERNATIVES["q2_1_chain_io_bytes"].append('''
import numpy as np


def chain_io_bytes(seq_len, kv_head, bytes_per_element=2):
    # NumPy integers in the tuple.
    per_matrix = np.int64(seq_len) * np.int64(kv_head) * np.int64(bytes_per_element)
    return 3 * per_matrix, per_matrix
''')
ALTERNATIVES["q2_2_chain_flops"].append('''
def chain_flops(seq_len, kv_head):
    # A float (the question allows 1%).
    return 4.0 * seq_len * seq_len * kv_head
''')
ALTERNATIVES["q2_3_chain_intensity"].append('''
def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    # A one-element float32 tensor.
    flops = torch.tensor(4.0 * kv_head * seq_len * seq_len, dtype=torch.float32)
    hbm = torch.tensor(4.0 * seq_len * kv_head * bytes_per_element
                       + intermediate_round_trips * 2.0 * seq_len * seq_len * bytes_per_element, dtype=torch.float32)
    return flops / hbm
''')
ALTERNATIVES["b2_5_reassociated_cost"].append('''
import numpy as np


def reassociated_chain_cost(seq_len, kv_head, bytes_per_element=2):
    # A list of NumPy integers.
    s, h = np.int64(seq_len), np.int64(kv_head)
    return [4 * h * h * s, (4 * h * s + 2 * h * h) * bytes_per_element]
''')
# Point 1, the known defect of Question 3.2: the tests demanded exact Python ints the question never mentions.
ALTERNATIVES["q3_2_attention_cost"].append('''
import numpy as np


def attention_cost(batch, seq_len, heads, head_dim, bytes_per_element=2, score_round_trips=0):
    # NumPy integers for the counts, a float32 intensity: every integer form is accepted.
    flops = np.int64(4) * batch * heads * seq_len * seq_len * head_dim
    hbm = np.int64(4) * batch * seq_len * heads * head_dim * bytes_per_element + (
        np.int64(score_round_trips) * 2 * batch * heads * seq_len * seq_len * bytes_per_element)
    return {"flops": flops, "hbm_bytes": float(hbm), "intensity": np.float32(flops / hbm)}


einsum_round_trips = np.int64(3)
''')
WRONG["q3_2_attention_cost"].append(
    # Point 9: the intensity is checked against the dict's own numbers, so this mistake costs the intensity check only.
    ("intensity upside down: bytes per FLOP",
     _mutate("q3_2_attention_cost", ('"intensity": flops / hbm_bytes}', '"intensity": hbm_bytes / flops}'))))
ALTERNATIVES["q5_1_benchmark_attention"].append(_mutate(
    "q5_1_benchmark_attention",
    # NumPy numbers and an np.str_ status.
    ('''        return {"status": "oom", "forward_ms": float("nan"), "backward_ms": float("nan"), "peak_memory_gb": float("nan")}''',
     '''        import numpy as np
        return {"status": np.str_("oom"), "forward_ms": np.float64("nan"), "backward_ms": np.float32("nan"),
                "peak_memory_gb": np.nan}'''),
    ('''    return {"status": "ok", "forward_ms": float(forward_ms), "backward_ms": float(backward_ms),
            "peak_memory_gb": float(peak_gb)}''',
     '''    import numpy as np
    return {"status": np.str_("OK"), "forward_ms": np.float64(forward_ms), "backward_ms": np.float64(backward_ms),
            "peak_memory_gb": np.float64(peak_gb)}''')))

# -- Point 3: the device rule, checked on a CPU grader with PyTorch's default device set to meta -------------------
ALTERNATIVES["q3_3_causal_mask"].append('''
def causal_mask(seq_len, device=None):
    # Created on the default device, then moved: the meta probe cannot tell, the ordinary device check decides.
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril().to(device)
''')
WRONG["q3_3_causal_mask"] += [
    ("device argument ignored (the mask lands on the default device)",
     _mutate("q3_3_causal_mask", ("positions = torch.arange(seq_len, device=device)", "positions = torch.arange(seq_len)"))),
    ("device=None taken as the CPU instead of PyTorch's default device",
     _mutate("q3_3_causal_mask", ("positions = torch.arange(seq_len, device=device)",
                                  'positions = torch.arange(seq_len, device=device if device is not None else "cpu")'))),
]

# -- Point 4: probes that discriminate ------------------------------------------------------------------------------
WRONG["q5_1_benchmark_attention"].append(
    ("every RuntimeError reported as 'oom' (a shape error is not out of memory)",
     _mutate("q5_1_benchmark_attention", ("    status, result = run_oom_safe(measure)\n",
                                          "    try:\n        status, result = 'ok', measure()\n"
                                          "    except (torch.OutOfMemoryError, MemoryError, RuntimeError):\n"
                                          "        status, result = 'oom', None\n"))))
ALTERNATIVES["q5_1_benchmark_attention"].append(_mutate(
    "q5_1_benchmark_attention",
    # Its own test for out-of-memory: the exception types, or a RuntimeError that says so.
    ("    status, result = run_oom_safe(measure)\n",
     "    try:\n        status, result = 'ok', measure()\n"
     "    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:\n"
     "        if isinstance(exc, RuntimeError) and not isinstance(exc, torch.OutOfMemoryError) "
     "and 'out of memory' not in str(exc):\n            raise\n"
     "        status, result = 'oom', None\n")))
WRONG["q4_1_2_blockwise_lse"].append(
    ("two passes over the blocks: the max block by block, then the sum block by block", '''
def blockwise_logsumexp(x, block_size):
    row_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        row_max = torch.maximum(row_max, x[..., start:start + block_size].amax(dim=-1))
    shift = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    total = torch.zeros_like(shift)
    for start in range(0, x.shape[-1], block_size):
        total = total + torch.exp(x[..., start:start + block_size] - shift[..., None]).sum(dim=-1)
    return shift + torch.log(total)
'''))
ALTERNATIVES["q4_1_2_blockwise_lse"].append('''
def blockwise_logsumexp(x, block_size):
    # One pass, blocks taken from the last to the first (the online update does not care about the order).
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    starts = list(range(0, x.shape[-1], block_size))
    for start in reversed(starts):
        block = x[..., start:start + block_size]
        m_new = torch.maximum(m, block.amax(dim=-1))
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift[..., None]).sum(dim=-1)
        m = m_new
    return m + torch.log(l)
''')

# -- Point 5: the prescribed method (torch.einsum, no fused attention) ---------------------------------------------
WRONG["q3_1_einsum_attention"].append(
    ("a wrapper around F.scaled_dot_product_attention (right values, not the prescribed einsum)", '''
def einsum_attention(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return out.transpose(1, 2)
'''))
ALTERNATIVES["q3_1_einsum_attention"].append('''
def einsum_attention(q, k, v, mask=None):
    # einsum for both products, the mask applied with torch.where, computed in float64 and cast back.
    q64, k64, v64 = (t.to(torch.float64) for t in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v64).to(q.dtype)
''')

# -- Point 6: every code hint, followed literally -------------------------------------------------------------------
HINTS["q3_1_einsum_attention"] = [
    ("weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)",
     _mutate("q3_1_einsum_attention", ("weights = torch.softmax(scores, dim=-1)",
                                       "weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)"))),
]
HINTS["q3_3_causal_mask"] = [
    ("pass device= to what creates the mask", '''
def causal_mask(seq_len, device=None):
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()
'''),
]
HINTS["q4_1_2_blockwise_lse"] = [
    ("Call your online_softmax_update", '''
def blockwise_logsumexp(x, block_size):
    running_max = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    running_sum = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        running_max, running_sum = online_softmax_update(running_max, running_sum, x[..., start:start + block_size])
    return running_max + torch.log(running_sum)
'''),
]
HINTS["q5_1_benchmark_attention"] = [
    ("run_oom_safe(fn, ...) returns ('ok', result) or ('oom', None)", _REFERENCE["q5_1_benchmark_attention"]),
]

# -- Point 7: Triton constructs the grader's interpreter (Triton 3.9, TRITON_INTERPRET=1) runs --------------------------
_TRITON_SIGNATURE = '''
@triton.jit
def _flash_attention_forward_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lb, stride_lh, stride_ls,
    num_heads, seq_len_q, seq_len_kv, head_dim, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
'''
HINTS["q4_3_triton_forward"] = [
    ("tl.dot (also with acc=), tl.trans, tl.range, tl.full, tl.minimum: the constructs the text lists", _TRITON_SIGNATURE + '''
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qs + dims[None, :] * stride_qd,
                mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = seq_len_kv
    if CAUSAL:
        end = tl.minimum(seq_len_kv, (pid_m + 1) * BLOCK_M)
    for start in tl.range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_ok = (cols[:, None] < seq_len_kv) & (dims[None, :] < head_dim)
        k = tl.load(K + b * stride_kb + h * stride_kh + cols[:, None] * stride_ks + dims[None, :] * stride_kd,
                    mask=kv_ok, other=0.0)  # (BLOCK_N, BLOCK_D), transposed for the product
        v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vs + dims[None, :] * stride_vd,
                    mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = cols[None, :] < seq_len_kv
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None])
        m_i = m_new
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + dims[None, :] * stride_od,
             (acc / l_i[:, None]).to(O.dtype.element_ty), mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim))
    tl.store(LSE + b * stride_lb + h * stride_lh + rows * stride_ls, m_i + tl.log(l_i), mask=rows < seq_len_q)
'''),
]
WRONG["q4_3_triton_forward"].append(
    # The grader's Triton 3.9 interpreter refuses block pointers: a kernel that uses them (as a GPU allows) scores 0 on
    # this question only, which is why the question's text now says which constructs to use.
    ("block pointers (tl.make_block_ptr), which the grader's interpreter refuses",
     _mutate("q4_3_triton_forward",
             ("q = tl.load(q_ptrs, mask=(offs_m[:, None] < seq_len_q) & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)",
              "q_block = tl.make_block_ptr(Q + b * stride_qb + h * stride_qh, shape=(seq_len_q, head_dim), "
              "strides=(stride_qs, stride_qd), offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_D), order=(1, 0))\n"
              "    q = tl.load(q_block, boundary_check=(0, 1), padding_option='zero')"))))

# -- Issue 52: the block-pointer guard reads code, not comments or strings -------------------------------------------
ALTERNATIVES["q4_3_triton_forward"].append(_mutate(
    # Fails before the fix (the guard searched the source text for "tl.make_block_ptr" and "tl.advance", so a comment
    # or a docstring naming them cost every value check); passes after (only calls in the code count).
    "q4_3_triton_forward",
    ("    pid_m = tl.program_id(0)\n",
     "    # Not tl.make_block_ptr / tl.advance (the tutorial's block pointers): the grader's interpreter refuses them.\n"
     "    pid_m = tl.program_id(0)\n"),
    ("masked past seq_len_q.\n    \"\"\"",
     "masked past seq_len_q.\n    Tiles are addressed with pointers and strides, not tl.make_block_ptr(...) and tl.advance(...).\n"
     "    \"\"\"")))

# -- Issue 52: packed sequences, a graded bonus (Bonus 3.4) ---------------------------------------------------------
ALTERNATIVES["b3_4_segment_mask"] = [
    '''
def segment_mask(segment_ids, causal=False):
    same = segment_ids.unsqueeze(2).eq(segment_ids.unsqueeze(1))
    if causal:
        seq_len = segment_ids.shape[1]
        same = same & torch.ones(seq_len, seq_len, dtype=torch.bool, device=segment_ids.device).tril()
    return same.unsqueeze(1)
''',
    '''
def segment_mask(segment_ids, causal=False):
    b, s = segment_ids.shape
    ids = segment_ids.long()
    mask = torch.einsum("bi,bj->bij", torch.ones_like(ids), torch.ones_like(ids)).bool()  # every pair, then narrow
    mask = mask & (ids[:, :, None] - ids[:, None, :] == 0)
    if causal:
        positions = torch.arange(s, device=segment_ids.device)
        mask = mask & (positions[:, None] >= positions[None, :])
    return mask.view(b, 1, s, s)
''',
]
WRONG["b3_4_segment_mask"] = [
    ("causal mask strict (a token cannot see itself)",
     _mutate("b3_4_segment_mask", ("positions[None, :] <= positions[:, None]", "positions[None, :] < positions[:, None]"))),
    ("causal mask transposed (keys after the query)",
     _mutate("b3_4_segment_mask", ("positions[None, :] <= positions[:, None]", "positions[None, :] >= positions[:, None]"))),
    ("no head axis: (B, S, S)",
     _mutate("b3_4_segment_mask", ("return allowed[:, None]", "return allowed"))),
    ("causal ignored", _mutate("b3_4_segment_mask", ("    if causal:\n", "    if False:\n"))),
    ("segments from boundaries: equal ids apart are treated as different sequences", '''
def segment_mask(segment_ids, causal=False):
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    runs = torch.cumsum(starts.long(), dim=1)  # a new number at every change of id
    allowed = runs[:, :, None] == runs[:, None, :]
    if causal:
        positions = torch.arange(segment_ids.shape[1], device=segment_ids.device)
        allowed = allowed & (positions[None, :] <= positions[:, None])
    return allowed[:, None]
'''),
    ("causal positions created on the default device",
     _mutate("b3_4_segment_mask", ("positions = torch.arange(segment_ids.shape[1], device=segment_ids.device)",
                                   "positions = torch.arange(segment_ids.shape[1])"))),
]

# -- Point 8: a mistake is charged once (carry-forward). Each cell below defines the wrong earlier answer AND a later
# answer that calls it: the earlier question's tests must fail, the later one's must pass. (When the harness restores
# the earlier cell, the later function calls the reference and stays correct.) ---------------------------------------
WRONG["q1_1_hbm_bytes"].append(
    ("relu round trip counted once; predicted_compile_speedup (Question 1.2) built on it must not lose points",
     _mutate("q1_1_hbm_bytes", ("relu_elements = 0 if fused else 2 * n * n", "relu_elements = 0 if fused else n * n"))
     + '''

def predicted_compile_speedup(n, peak_tflops, bandwidth_tb_s, k=None, bytes_per_element=2):
    k = n if k is None else k
    fused_bytes = relu_matmul_hbm_bytes(n, k, bytes_per_element, fused=True)
    relu_bytes = relu_matmul_hbm_bytes(n, k, bytes_per_element, fused=False) - fused_bytes
    matmul_s = max(2 * n * k * n / (peak_tflops * 1e12), fused_bytes / (bandwidth_tb_s * 1e12))
    return (matmul_s + relu_bytes / (bandwidth_tb_s * 1e12)) / matmul_s
'''))
WRONG["q2_2_chain_flops"].append(
    ("MACs instead of FLOPs; chain_intensity (Question 2.3) built on it must not lose points",
     _mutate("q2_2_chain_flops", ("return int(first + second)", "return int((first + second) // 2)")) + '''

def chain_intensity(seq_len, kv_head, bytes_per_element=2, intermediate_round_trips=0):
    io_bytes = sum(chain_io_bytes(seq_len, kv_head, bytes_per_element))
    trips = intermediate_round_trips * 2 * seq_len * seq_len * bytes_per_element
    return chain_flops(seq_len, kv_head) / (io_bytes + trips)
'''))
WRONG["q4_1_1_online_update"].append(
    ("running sum not rescaled; blockwise_logsumexp (Question 4.1.2) calling it must not lose points",
     _mutate("q4_1_1_online_update", ("new_sum = running_sum * torch.exp(running_max - shift) + ", "new_sum = running_sum + "))
     + "\n\n" + HINTS["q4_1_2_blockwise_lse"][0][1]))
# Point 4 and 9: a bypass of the probe (its dispatch mode switched off) is not partial credit: it costs the question.
WRONG["q4_1_2_blockwise_lse"].append(
    ("tampering: two passes, with the dispatch modes (the probe) switched off", '''
from torch.utils._python_dispatch import _disable_current_modes


def blockwise_logsumexp(x, block_size):
    with _disable_current_modes():
        return torch.logsumexp(x, dim=-1)
'''))

# =============================================================================================================
# Issue 50 ("A grade orders the work"). SKIPS: answers that skip what the question asks (the library routine it asks
# students to write, no tiling where tiling is asked, autograd where a backward is asked), with right values. Each
# must fail its own question only, earn at most a quarter of it (a check(..., method=True) block gates the cell) and
# less than every answer in WRONG of that question (one mistake each). Answers that were in WRONG before the method
# gated its question move here first.
# =============================================================================================================
SKIPS: dict[str, list[tuple[str, str]]] = {}


def _move_to_skips(cell_id: str, label: str) -> None:
    """Move the WRONG answer ``label`` of ``cell_id`` to SKIPS (it skips the method rather than making a mistake)."""
    pair = next(pair for pair in WRONG[cell_id] if pair[0] == label)
    WRONG[cell_id].remove(pair)
    SKIPS.setdefault(cell_id, []).append(pair)


_move_to_skips("q3_1_einsum_attention", "a wrapper around F.scaled_dot_product_attention (right values, not the prescribed einsum)")
_move_to_skips("q3_1_einsum_attention", "right values with @ (matmul) instead of the prescribed torch.einsum")
_move_to_skips("q4_1_2_blockwise_lse", "torch.logsumexp on whole rows (not block by block)")
_move_to_skips("q4_1_2_blockwise_lse", "the max of the whole row first, then blocks (not block by block)")
_move_to_skips("q4_2_tiled_forward", "materializes the whole S x S matrix (correct values)")
_move_to_skips("q4_3_triton_forward", "an empty kernel, and attention in PyTorch in a wrapper of one's own")
_move_to_skips("b4_4_flash_backward", "materializes the whole S x S probability matrix (correct values)")

# Question 3.1: the text prescribes torch.einsum for the scores and for the output.
SKIPS["q3_1_einsum_attention"] += [
    ("scores and output with @; the one einsum is a transpose at the end", '''
def einsum_attention(q, k, v, mask=None):
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vh
    return torch.einsum("bhsd->bshd", out)
'''),
    ("scores with @, only the output with einsum", '''
def einsum_attention(q, k, v, mask=None):
    scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)
'''),
    ("scores by broadcasting and summing, only the output with einsum", '''
def einsum_attention(q, k, v, mask=None):
    scores = (q.transpose(1, 2)[:, :, :, None, :] * k.transpose(1, 2)[:, :, None, :, :]).sum(-1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhst,bthd->bshd", torch.softmax(scores, dim=-1), v)
'''),
]
# Question 4.2: no key tiles (a whole row of scores per query tile) is no tiling of the keys.
SKIPS["q4_2_tiled_forward"].append(
    ("query tiles only: a whole row of scores per query tile, with a plain softmax", '''
def tiled_attention_forward(q, k, v, causal=False, block_q=64, block_k=64):
    cdt = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=cdt, device=q.device)
    for start in range(0, q.shape[1], block_q):
        stop = min(start + block_q, q.shape[1])
        scores = torch.einsum("bshd,bthd->bhst", q[:, start:stop].to(cdt), k.to(cdt)) / math.sqrt(q.shape[-1])
        if causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]
            cols = torch.arange(k.shape[1], device=q.device)[None, :]
            scores = scores.masked_fill(cols > rows, float("-inf"))
        tile_lse = torch.logsumexp(scores, dim=-1)
        out[:, start:stop] = torch.einsum("bhst,bthd->bshd", torch.exp(scores - tile_lse[..., None]), v.to(cdt)).to(q.dtype)
        lse[:, :, start:stop] = tile_lse
    return out, lse
'''))
# Question 4.3: the kernel loads a whole row of keys at once (128 covers every test) and takes a plain softmax: no loop
# over key tiles, no online softmax.
SKIPS["q4_3_triton_forward"].append(
    ("no loop over key tiles: a whole row of 128 keys per program and a plain softmax", _TRITON_SIGNATURE + '''
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    cols = tl.arange(0, 128)
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qs + dims[None, :] * stride_qd,
                mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim), other=0.0)
    kt = tl.load(K + b * stride_kb + h * stride_kh + cols[None, :] * stride_ks + dims[:, None] * stride_kd,
                 mask=(cols[None, :] < seq_len_kv) & (dims[:, None] < head_dim), other=0.0)
    v = tl.load(V + b * stride_vb + h * stride_vh + cols[:, None] * stride_vs + dims[None, :] * stride_vd,
                mask=(cols[:, None] < seq_len_kv) & (dims[None, :] < head_dim), other=0.0)
    s = tl.dot(q, kt) * scale
    keep = cols[None, :] < seq_len_kv
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    s = tl.where(keep, s, float("-inf"))
    m = tl.max(s, 1)
    p = tl.exp(s - m[:, None])
    l = tl.sum(p, 1)
    o = tl.dot(p.to(v.dtype), v) / l[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None] * stride_os + dims[None, :] * stride_od,
             o.to(O.dtype.element_ty), mask=(rows[:, None] < seq_len_q) & (dims[None, :] < head_dim))
    tl.store(LSE + b * stride_lb + h * stride_lh + rows * stride_ls, m + tl.log(l), mask=rows < seq_len_q)
'''))
# Bonus 4.4: autograd instead of the backward pass it asks for.
SKIPS["b4_4_flash_backward"] += [
    ("autograd through your tiled forward (Question 4.2) instead of the backward pass", '''
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        recomputed, _ = tiled_attention_forward(*leaves, causal=causal, block_q=block_q, block_k=block_k)
        return torch.autograd.grad(recomputed, leaves, grad_out)
'''),
    ("autograd through einsum_attention (Question 3.1), .backward() on a loss", '''
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=64, block_k=64):
    q2, k2, v2 = (t.detach().clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t.requires_grad = True
    mask = causal_mask(q.shape[1], device=q.device) if causal else None
    with torch.enable_grad():
        (einsum_attention(q2, k2, v2, mask=mask) * grad_out).sum().backward()
    return q2.grad, k2.grad, v2.grad
'''),
]

# Question 4.2: the one-mistake tiled attempt of the issue (the running output never rescaled) must earn more than an
# untiled attention; and so must every answer in WRONG of the questions above (course check compares them).

# Question 5.1: what a benchmark gets wrong, each caught by the known-cost function (slow warm-up calls, known
# durations per call) without asserting on wall-clock speed.
WRONG["q5_1_benchmark_attention"] += [
    ("backward_ms: the mean of every backward call, the warm-up included",
     _mutate("q5_1_benchmark_attention", ("            if call >= n_warmup:\n                times_ms.append(",
                                          "            if True:\n                times_ms.append("),
             ("return forward_ms, statistics.median(times_ms), peak_gb",
              "return forward_ms, statistics.mean(times_ms), peak_gb"))),
    ("backward_ms: the total of the timed backward calls, not divided per call",
     _mutate("q5_1_benchmark_attention", ("return forward_ms, statistics.median(times_ms), peak_gb",
                                          "return forward_ms, sum(times_ms), peak_gb"))),
    ("forward_ms: the mean of every forward call, the warm-up included",
     _mutate("q5_1_benchmark_attention", ("forward_ms = benchmark_latency(attn_fn, q, k, v, n_warmup=n_warmup, n_repeat=n_repeat)",
                                          "forward_ms = benchmark_latency(attn_fn, q, k, v, n_warmup=0, n_repeat=n_warmup + n_repeat, "
                                          "stat=\"mean\")"))),
    ("forward_ms: the total of the timed forward calls, not divided per call",
     _mutate("q5_1_benchmark_attention", ("forward_ms = benchmark_latency(attn_fn, q, k, v, n_warmup=n_warmup, n_repeat=n_repeat)",
                                          "forward_ms = n_repeat * benchmark_latency(attn_fn, q, k, v, n_warmup=n_warmup, "
                                          "n_repeat=n_repeat)"))),
]
