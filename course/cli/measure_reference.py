"""The measuring process's verdict on a measured output: which outputs it samples, the reference it computes itself
on the very inputs the kernel made (``measure_probe``'s generators, same seed), and the comparison.

The kernel sends only sampled values (rows of an attention output, elements of GeLU's, rows of the logits) as plain
data; the reference is computed here, in float64 (attention, GeLU) or float32 (GPT-2), never in the kernel.
"""
from __future__ import annotations

import base64
import functools
import json
import math
import random
import threading

import numpy as np
import torch

from ..common.measure_spec import Piece
from ..kernel import measure_probe as probe

MAX_ATTENTION_ROWS = 256
MAX_ELEMENTS = 4096
MAX_LOGIT_ROWS = 4


def sample(piece: Piece, shape: dict, seed: int) -> list:
    """What the kernel returns of the output at ``shape``: [b, s, h] / [b, h, s] rows of an attention output (the
    first and last query of the first and last head among them, where bugs at tile edges show), element indices of
    GeLU's, batch rows of the logits."""
    rng = random.Random(seed)
    if piece.kind in probe.ATTENTION_KINDS:
        b, s, h = (int(shape[k]) for k in ("B", "S", "H"))
        rows = {(0, 0, 0), (b - 1, s - 1, h - 1), (0, s - 1, 0), (b - 1, 0, h - 1)}
        if b * s * h <= MAX_ATTENTION_ROWS:
            rows = {(i, j, k) for i in range(b) for j in range(s) for k in range(h)}
        while len(rows) < min(MAX_ATTENTION_ROWS, b * s * h):
            rows.add((rng.randrange(b), rng.randrange(s), rng.randrange(h)))
        ordered = sorted(rows)
        if piece.kind == "attention_bhsd":
            return [[i, k, j] for i, j, k in ordered]
        return [[i, j, k] for i, j, k in ordered]
    if piece.kind == "gelu_tanh":
        n = int(shape["N"])
        return sorted({0, n - 1, *rng.sample(range(n), min(n, MAX_ELEMENTS) - 2)}) if n > 2 else list(range(n))
    batch = int(shape["B"])
    return sorted({0, batch - 1, *rng.sample(range(batch), min(batch, MAX_LOGIT_ROWS))})[:MAX_LOGIT_ROWS]


def _attention_rows(piece: Piece, shape: dict, seed: int, rows: list, device: str) -> torch.Tensor:
    """Reference rows (n, D), float64, of attention on the kernel's inputs (``causal`` masks keys after the query)."""
    q, k, v = probe.attention_inputs(piece.kind, shape, probe.dtype_of(piece.dtype), seed, device)
    if piece.kind == "attention_bhsd":  # to (B, S, H, D)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    causal = bool(shape.get("causal", False))
    scale = 1.0 / math.sqrt(int(shape["D"]))
    out = []
    for row in rows:
        b, s, h = (row[0], row[2], row[1]) if piece.kind == "attention_bhsd" else row  # bhsd rows are [b, h, s]
        keys = k[b, :, h].double() if not causal else k[b, : s + 1, h].double()
        values = v[b, :, h].double() if not causal else v[b, : s + 1, h].double()
        weights = torch.softmax(keys @ q[b, s, h].double() * scale, dim=0)
        out.append(weights @ values)
    return torch.stack(out).cpu()


def _gelu_elements(piece: Piece, shape: dict, seed: int, index: list, device: str) -> torch.Tensor:
    x = probe.gelu_input(shape, probe.dtype_of(piece.dtype), seed, device)
    x = x[torch.tensor(index, device=device)].double().cpu()
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


# `--workers N` measures N submissions from threads of one process; transformers' first import of a model class is not
# thread-safe (two threads at once: "cannot import name 'GPT2LMHeadModel'"), and each model is built once.
_BUILDING = threading.Lock()


def _float_gpt2(model_json: str, dtype: str, model_seed: int, device: str):
    """The kernel's GPT-2 (weights rounded to ``dtype``) in float32, built once per run and device."""
    with _BUILDING:
        return _built_gpt2(model_json, dtype, model_seed, device)


@functools.lru_cache(maxsize=8)  # one model per GPU of the run
def _built_gpt2(model_json: str, dtype: str, model_seed: int, device: str):
    return probe.gpt2_model(json.loads(model_json), probe.dtype_of(dtype), model_seed, device).float()


@torch.no_grad()
def _gpt2_rows(piece: Piece, shape: dict, seed: int, check_set: int, model_seed: int, rows: list, device: str):
    """Reference logits (n, vocab), float32, of one decode step for batch rows ``rows``: the model and the cache's
    keys and values as the kernel made them (rounded to the piece's dtype), computed in float32."""
    model_shape, dtype = piece.model, probe.dtype_of(piece.dtype)
    net = _float_gpt2(json.dumps(model_shape, sort_keys=True), piece.dtype, model_seed, device)
    body, heads = net.transformer, int(model_shape["n_head"])
    n, width = int(shape["N"]), int(model_shape["n_embd"])
    token = probe.gpt2_tokens(model_shape, shape, probe.set_seed(seed, check_set), device)[rows]
    x = body.wte(token) + body.wpe(torch.tensor([n], device=device))  # (n_rows, 1, D)
    for layer, block in enumerate(body.h):
        cached = [probe.gpt2_cache_layer(model_shape, shape, dtype, seed, layer, which, device)[rows].float()
                  for which in (0, 1)]  # (n_rows, H, N, hd)
        query, key, value = (t.view(len(rows), 1, heads, width // heads).transpose(1, 2)
                             for t in block.attn.c_attn(block.ln_1(x)).split(width, dim=2))
        keys, values = torch.cat([cached[0], key], dim=2), torch.cat([cached[1], value], dim=2)
        weights = torch.softmax(query @ keys.transpose(-1, -2) / math.sqrt(width // heads), dim=-1)
        x = x + block.attn.c_proj((weights @ values).transpose(1, 2).reshape(len(rows), 1, width))
        x = x + block.mlp(block.ln_2(x))
    return net.lm_head(body.ln_f(x))[:, -1].cpu()


CHECK_SETS = (100, 101)  # input sets of the check before timing and of the check after it (timing uses 0..sets-1)


def reference(piece: Piece, shape: dict, seed: int, check_set: int, rows: list, device: str,
              model_seed: int = 0) -> torch.Tensor:
    """The reference values of the sampled output of input set ``check_set`` (float64 or float32, on the CPU)."""
    set_seed = probe.set_seed(seed, check_set)
    if piece.kind in probe.ATTENTION_KINDS:
        return _attention_rows(piece, shape, set_seed, rows, device)
    if piece.kind == "gelu_tanh":
        return _gelu_elements(piece, shape, set_seed, rows, device)
    return _gpt2_rows(piece, shape, seed, check_set, model_seed, rows, device)


def decode_samples(answer: dict, expected_rows: int) -> torch.Tensor:
    """The kernel's sampled values as a float64 tensor (validated: base64 of exactly the announced float32 shape).

    Raises:
        ValueError: a malformed answer.
    """
    shape = [int(n) for n in answer["shape"]]
    raw = base64.b64decode(answer["data"], validate=True)
    if not shape or shape[0] != expected_rows or len(raw) != math.prod(shape) * 4:
        raise ValueError(f"sampled values of shape {shape} and {len(raw)} bytes, expected {expected_rows} rows")
    return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).reshape(shape).copy()).double()


def expected_output_shape(piece: Piece, shape: dict) -> list[int]:
    if piece.kind == "attention_bshd":
        return [int(shape[k]) for k in ("B", "S", "H", "D")]
    if piece.kind == "attention_bhsd":
        return [int(shape[k]) for k in ("B", "H", "S", "D")]
    if piece.kind == "gelu_tanh":
        return [int(shape["N"])]
    return [int(shape["B"]), 1, int(piece.model["vocab_size"])]


def verdict(piece: Piece, shape: dict, answer: dict, want: torch.Tensor) -> tuple[bool, float, str]:
    """(correct, relative error ||out - ref|| / ||ref|| on the sample, reason when not)."""
    out_shape = [int(n) for n in answer.get("out_shape", [])]
    if out_shape != expected_output_shape(piece, shape):
        return False, math.inf, f"output of shape {out_shape}, expected {expected_output_shape(piece, shape)}"
    if answer.get("out_dtype") != piece.dtype:
        return False, math.inf, f"output dtype {answer.get('out_dtype')}, expected {piece.dtype}"
    got = decode_samples(answer, want.shape[0])
    if got.shape != want.shape:
        return False, math.inf, f"sampled values of shape {list(got.shape)}, expected {list(want.shape)}"
    if not torch.isfinite(got).all() or answer.get("finite") is not True:
        return False, math.inf, "the output holds NaN or infinity"
    error = float(torch.linalg.vector_norm(got - want) / max(float(torch.linalg.vector_norm(want)), 1e-30))
    if error > piece.tolerance:
        return False, error, f"relative error {error:.3g} > {piece.tolerance:g} against the reference"
    return True, error, ""
