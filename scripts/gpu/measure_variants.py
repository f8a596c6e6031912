"""Prepared submissions for the GPU report of ``course measure`` (scripts/gpu/run_measure.sh): per lab, four variants
of the measured cells, made from the instructor's solution by text replacement (so they follow the lab's edits). Each
would pass the lab's tests, which run at small sizes; they differ at the declared shapes:

- ``slow``: correct, slower (float32 work instead of half precision, or no causal tile skipping);
- ``wrong``: wrong only at the larger shapes (keys past 2048 ignored, a changed scale): must not be timed there;
- ``hang``: never returns at the larger shapes (a Python loop, or a GPU kernel that spins);
- ``fault``: a CUDA fault at the larger shapes (an out-of-range index: a device-side assert; an illegal address
  at Lab 2's last shape).
"""
from __future__ import annotations

from pathlib import Path

from course.common.notebooks import cells_by_grade_id, read_notebook


def _edit(source: str, old: str, new: str, what: str) -> str:
    if old not in source:
        raise KeyError(f"{what}: the solution no longer holds {old[:60]!r}")
    return source.replace(old, new, 1)


def lab1(cells: dict[str, str]) -> dict[str, dict[str, str]]:
    attention, gelu = cells["q3_1_1_sdpa"], cells["q4_3_1_gelu"]
    start = "    ### BEGIN SOLUTION\n"
    return {
        "slow": {
            "q3_1_1_sdpa": _edit(attention, "    scores = torch.matmul(q, k.transpose(-2, -1))",
                                 "    q, k, v, dtype = q.float(), k.float(), v.float(), q.dtype  # float32 work\n"
                                 "    scores = torch.matmul(q, k.transpose(-2, -1))", "slow attention")
            .replace("    return torch.matmul(probs, v)", "    return torch.matmul(probs, v).to(dtype)"),
            "q4_3_1_gelu": _edit(gelu, "    return 0.5 * input", "    out = input.double()\n"
                                 "    return (0.5 * out * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (out + 0.044715 * "
                                 "torch.pow(out, 3.0))))).to(input.dtype)\n    return 0.5 * input", "slow gelu"),
        },
        "wrong": {
            "q3_1_1_sdpa": _edit(attention, "/ math.sqrt(q.shape[-1])",
                                 "/ (math.sqrt(q.shape[-1]) if q.shape[-2] <= 2048 else q.shape[-1])",
                                 "wrong attention"),
        },
        "hang": {
            "q3_1_1_sdpa": _edit(attention, start, start + "    while q.shape[-2] >= 1024:\n        pass\n",
                                 "hanging attention"),
        },
        "fault": {
            "q3_1_1_sdpa": _edit(attention, start, start + "    if q.shape[-2] >= 1024 and q.is_cuda:\n"
                                 "        q = q + q.reshape(-1)[torch.full((1,), q.numel() * 1000, device=q.device)]\n",
                                 "faulting attention"),
        },
    }


def lab2(cells: dict[str, str]) -> dict[str, dict[str, str]]:
    kernel = cells["q4_3_triton_forward"]
    return {
        "slow": {"q4_3_triton_forward": _edit(
            _edit(kernel, "        end_n = tl.minimum(seq_len_kv, (pid_m + 1) * BLOCK_M)\n",
                  "        end_n = seq_len_kv  # every key tile, masked: no causal skipping\n", "slow kernel"),
            "tl.dot(p.to(v.dtype), v)", "tl.dot(p, v.to(tl.float32))", "slow kernel")},
        "wrong": {"q4_3_triton_forward": _edit(kernel, "    for start_n in range(0, end_n, BLOCK_N):",
                                               "    for start_n in range(0, tl.minimum(end_n, 2048), BLOCK_N):",
                                               "wrong kernel")},
        "hang": {"q4_3_triton_forward": _edit(kernel, "    out = acc / l_i[:, None]\n",
                                              "    spin = seq_len_q\n    while spin > 10000:  # spins at S = 16k\n"
                                              "        tl.store(LSE + b * stride_lb + h * stride_lh + offs_m * stride_ls,"
                                              " m_i, mask=offs_m < seq_len_q)\n"
                                              "    out = acc / l_i[:, None]\n", "hanging kernel")},
        "fault": {"q4_3_triton_forward": _edit(kernel, "    out = acc / l_i[:, None]\n",
                                               "    if CAUSAL:  # an illegal address at S = 16k, D = 128, causal\n"
                                               "        if seq_len_q * head_dim > 2000000:\n"
                                               "            tl.store(O + 35184372088832 + offs_m, m_i)\n"
                                               "    out = acc / l_i[:, None]\n", "faulting kernel")},
    }


def lab3(cells: dict[str, str]) -> dict[str, dict[str, str]]:
    step = cells["q4_6_gpt2_step"]
    return {
        "slow": {"q4_6_gpt2_step": _edit(
            step, "        scores = (query @ keys.transpose(-1, -2)) / math.sqrt(head_dim)",
            "        keys, values = keys.float(), values.float()  # float32 copies of the whole cache\n"
            "        scores = (query.float() @ keys.transpose(-1, -2)) / math.sqrt(head_dim)", "slow step")
            .replace("        attended = torch.softmax(scores, dim=-1) @ values",
                     "        attended = (torch.softmax(scores, dim=-1) @ values).to(x.dtype)")},
        "wrong": {"q4_6_gpt2_step": _edit(
            step, "        keys, values = cache.update(layer, key, value)\n",
            "        keys, values = cache.update(layer, key, value)\n"
            "        keys, values = keys[:, :, -512:], values[:, :, -512:]  # only the last 512 positions\n",
            "wrong step")},
        "hang": {"q4_6_gpt2_step": _edit(step, "    body, start = model.transformer, cache.length\n",
                                         "    body, start = model.transformer, cache.length\n"
                                         "    while input_ids.shape[0] >= 64:\n        pass\n", "hanging step")},
        "fault": {"q4_6_gpt2_step": _edit(step, "    body, start = model.transformer, cache.length\n",
                                          "    body, start = model.transformer, cache.length\n"
                                          "    if input_ids.shape[0] >= 64 and input_ids.is_cuda:\n"
                                          "        input_ids = input_ids + model.config.vocab_size  # out of range\n",
                                          "faulting step")},
    }


def variants(source_root: Path, lab: str) -> dict[str, dict[str, str]]:
    """student -> {grade id: source} of ``lab``'s prepared submissions (the instructor's cells edited)."""
    cells = {gid: cell.source for gid, cell in
             cells_by_grade_id(read_notebook(source_root / lab / f"{lab}.ipynb")).items()}
    return {"lab1": lab1, "lab2": lab2, "lab3": lab3}[lab](cells)
