"""What ``course measure`` runs on both sides of the grading boundary: the inputs of each kind of measured piece,
made from a seed, and the timing harness.

The measuring process imports this module to make the very inputs the kernel made (same seed, same device type, same
PyTorch: the same numbers) and computes its reference on them. The kernel runs this file's source in a namespace of
its own (``measure_session.install_probe``) and calls ``probe(request_json)``, whose answer is plain data: a JSON
string of numbers, strings and base64 bytes. Standard library and torch only (transformers for ``gpt2_decode``).

Kinds (the ``kind`` a lab's declaration gives a piece):
    attention_bshd: ``fn(q, k, v, causal=causal)``, q, k, v of shape (B, S, H, D); the output is the result, or its
        first element when it is a tuple (Lab 2's ``(out, lse)``): (B, S, H, D).
    attention_bhsd: ``fn(q, k, v)``, q, k, v of shape (B, H, S, D); output (B, H, S, D).
    gelu_tanh: ``fn(x)``, x of shape (N,); output (N,).
    gpt2_decode: ``fn(model, token, cache)`` of a GPT-2 model with seeded weights, a cache of the lab's class holding
        N seeded positions (``cache.length`` set back to N before every call) and tokens (B, 1); output the logits
        (B, 1, vocab).
"""
from __future__ import annotations

import base64
import json
import time
import traceback

import torch

ATTENTION_KINDS = ("attention_bshd", "attention_bhsd")
KINDS = (*ATTENTION_KINDS, "gelu_tanh", "gpt2_decode")
MAX_ERROR_CHARS = 400
CUDA_FAULT_WORDS = ("CUDA error", "device-side assert", "illegal memory access", "illegal instruction",
                    "unspecified launch failure", "CUBLAS_STATUS", "cudaError")


def generator(device: str, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (the same numbers in every process of this machine)."""
    return torch.Generator(device=device).manual_seed(int(seed) % (2 ** 63))


def randn(shape, seed: int, device: str, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Normal numbers of ``shape``, drawn in float32 on ``device`` and rounded to ``dtype``."""
    values = torch.randn(tuple(shape), generator=generator(device, seed), device=device, dtype=torch.float32)
    return (values * scale).to(dtype)


def set_seed(seed: int, set_index: int) -> int:
    """The seed of input set ``set_index`` of a measurement seeded ``seed``."""
    return int(seed) * 1009 + int(set_index) * 7919


def attention_inputs(kind: str, shape: dict, dtype: torch.dtype, seed: int, device: str) -> tuple:
    """q, k, v of an attention piece: (B, S, H, D) for ``attention_bshd``, (B, H, S, D) for ``attention_bhsd``."""
    b, s, h, d = (int(shape[key]) for key in ("B", "S", "H", "D"))
    dims = (b, s, h, d) if kind == "attention_bshd" else (b, h, s, d)
    return tuple(randn(dims, seed * 3 + i, device, dtype) for i in range(3))


def gelu_input(shape: dict, dtype: torch.dtype, seed: int, device: str) -> torch.Tensor:
    """x (N,), normal with standard deviation 3 (both tails of the tanh)."""
    return randn((int(shape["N"]),), seed, device, dtype, scale=3.0)


def gpt2_config(model: dict):
    """A transformers GPT2Config of the declaration's ``model`` (n_layer, n_embd, n_head, vocab_size)."""
    from transformers import GPT2Config

    return GPT2Config(n_layer=int(model["n_layer"]), n_embd=int(model["n_embd"]), n_head=int(model["n_head"]),
                      vocab_size=int(model["vocab_size"]), n_positions=int(model.get("n_positions", 2048)),
                      bos_token_id=0, eos_token_id=0, attn_implementation="eager")


@torch.no_grad()
def gpt2_model(model: dict, dtype: torch.dtype, seed: int, device: str):
    """A GPT2LMHeadModel whose every parameter is drawn from ``seed`` (in name order: the same in every process),
    rounded to ``dtype`` and, for the measuring process's float32 reference, kept in ``dtype``'s values."""
    from transformers import GPT2LMHeadModel

    with torch.device(device):
        net = GPT2LMHeadModel(gpt2_config(model))
    for index, (name, param) in enumerate(sorted(net.named_parameters())):
        is_norm = ".ln_" in name or name.startswith("transformer.ln_f")
        if is_norm and name.endswith("weight"):
            values = 1.0 + randn(param.shape, seed + index, device, torch.float32, 0.1)
        else:
            values = randn(param.shape, seed + index, device, torch.float32, 0.02)
        param.copy_(values.to(dtype))
    return net.to(dtype).eval()


def gpt2_cache_layer(model: dict, shape: dict, dtype: torch.dtype, seed: int, layer: int, which: int,
                     device: str) -> torch.Tensor:
    """Keys (``which`` 0) or values (1) of ``layer`` for the N cached positions: (B, H, N, n_embd // n_head)."""
    heads = int(model["n_head"])
    dims = (int(shape["B"]), heads, int(shape["N"]), int(model["n_embd"]) // heads)
    return randn(dims, seed * 131 + layer * 2 + which, device, dtype)


def gpt2_tokens(model: dict, shape: dict, seed: int, device: str) -> torch.Tensor:
    """The new tokens (B, 1), int64."""
    return torch.randint(int(model["vocab_size"]), (int(shape["B"]), 1), generator=generator(device, seed),
                         device=device)


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# -- the kernel's side ----------------------------------------------------------------------------------------
def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _output(result):
    """The measured output of a call: the result, or its first element (Lab 2's ``(out, lse)``)."""
    if isinstance(result, (tuple, list)) and result:
        result = result[0]
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"the piece returned {type(result).__name__}, not a tensor")
    return result


def _samples(kind: str, out: torch.Tensor, sample: list) -> dict:
    """The output's values at the measuring process's sample (rows of an attention output, elements of gelu's,
    rows of the logits), as float32 bytes."""
    out = out.detach()
    if kind in ATTENTION_KINDS:
        index = torch.tensor(sample, dtype=torch.long, device=out.device).reshape(-1, 3)
        picked = out[index[:, 0], index[:, 1], index[:, 2]]
    elif kind == "gelu_tanh":
        picked = out.reshape(-1)[torch.tensor(sample, dtype=torch.long, device=out.device)]
    else:
        picked = out[torch.tensor(sample, dtype=torch.long, device=out.device), -1]
    picked = picked.to("cpu", torch.float32).contiguous()
    return {"shape": list(picked.shape), "data": base64.b64encode(picked.numpy().tobytes()).decode("ascii"),
            "out_shape": list(out.shape), "out_dtype": str(out.dtype).replace("torch.", ""),
            "finite": bool(torch.isfinite(out).all().item())}


class _Piece:
    """The call of one measured piece on input set ``i`` (the namespace holds the student's definitions)."""

    def __init__(self, namespace: dict, request: dict):
        self.kind, self.device = request["kind"], request["device"]
        self.shape, self.seed = request["shape"], int(request["seed"])
        self.dtype = dtype_of(request["dtype"])
        self.fn = namespace[request["function"]]
        self.sets: dict[int, tuple] = {}
        self.model_request = request.get("model")
        if self.kind == "gpt2_decode":
            model = request["model"]
            self.model = gpt2_model(model, self.dtype, int(request["model_seed"]), self.device)
            heads, n = int(model["n_head"]), int(self.shape["N"])
            cache_class = namespace[request["cache_class"]]
            self.cache = cache_class(int(model["n_layer"]), int(self.shape["B"]), heads,
                                     int(model["n_embd"]) // heads, n + 1, self.dtype, torch.device(self.device))
            with torch.no_grad():
                for layer in range(int(model["n_layer"])):
                    for which, buffer in enumerate((self.cache.keys, self.cache.values)):
                        buffer[layer, :, :, :n] = gpt2_cache_layer(model, self.shape, self.dtype, self.seed, layer,
                                                                   which, self.device)

    def inputs(self, i: int) -> tuple:
        if i not in self.sets:
            seed = set_seed(self.seed, i)
            if self.kind in ATTENTION_KINDS:
                self.sets[i] = attention_inputs(self.kind, self.shape, self.dtype, seed, self.device)
            elif self.kind == "gelu_tanh":
                self.sets[i] = (gelu_input(self.shape, self.dtype, seed, self.device),)
            else:
                self.sets[i] = (gpt2_tokens(self.model_request, self.shape, seed, self.device),)
        return self.sets[i]

    def __call__(self, i: int):
        args = self.inputs(i)
        if self.kind == "attention_bshd":
            return self.fn(*args, causal=bool(self.shape.get("causal", False)))
        if self.kind == "gpt2_decode":
            self.cache.length = int(self.shape["N"])
            with torch.no_grad():
                return self.fn(self.model, args[0], self.cache)
        return self.fn(*args)


def _timed_ms(piece: _Piece, sets: int, repeat: int) -> list[float]:
    """Per-call times (ms) of ``repeat`` calls rotating over ``sets`` input sets: CUDA events on a GPU (the device
    synchronized once, after the last), perf_counter on a CPU."""
    if not piece.device.startswith("cuda"):
        times_ms = []
        for i in range(repeat):
            begin = time.perf_counter()
            piece(i % sets)
            times_ms.append((time.perf_counter() - begin) * 1e3)
        return times_ms
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    for i, (start, end) in enumerate(events):
        start.record()
        piece(i % sets)
        end.record()
    torch.cuda.synchronize()
    return [float(start.elapsed_time(end)) for start, end in events]


_kept: list = []  # [(key, _Piece)]: the last piece built, reused by the next request of the same shape


def _piece_for(namespace: dict, request: dict) -> _Piece:
    key = json.dumps({k: request.get(k) for k in ("function", "kind", "dtype", "shape", "seed", "device", "model",
                                                   "model_seed", "cache_class")}, sort_keys=True)
    if not _kept or _kept[0][0] != key:
        _kept.clear()
        _kept.append((key, _Piece(namespace, request)))
    return _kept[0][1]


def _run(namespace: dict, request: dict) -> dict:
    piece = _piece_for(namespace, request)
    answer = {}
    if request["mode"] == "time":
        sets = int(request["sets"])
        for i in range(sets):
            piece.inputs(i)
        for i in range(int(request["warmup"])):
            piece(i % sets)
        _synchronize(piece.device)
        wall_start = time.perf_counter()
        answer["ms"] = _timed_ms(piece, sets, int(request["repeat"]))
        answer["wall_ms"] = (time.perf_counter() - wall_start) * 1e3
    out = _output(piece(int(request["check_set"])))
    _synchronize(piece.device)
    answer.update(_samples(piece.kind, out, request["sample"]))
    return answer


def probe(namespace: dict, request_json: str) -> str:
    """Run one request of the measuring process in the kernel; its answer as a JSON string.

    Args:
        namespace: the kernel's user namespace (the student's definitions).
        request_json: ``{"mode": "check" | "time", "function", "kind", "dtype", "shape", "seed", "device",
            "check_set", "sample", "sets", "warmup", "repeat", ["model", "model_seed", "cache_class"]}``.

    Returns:
        str: JSON of ``{"status": "ok", "ms": [per-call ms] (time), "wall_ms", "shape", "data" (base64 float32 of the
        sampled values), "out_shape", "out_dtype", "finite"}`` or ``{"status": "error", "error": text,
        "cuda_fault": bool, "oom": bool}``.
    """
    try:
        answer = _run(namespace, json.loads(request_json))
        answer["status"] = "ok"
    except BaseException as exc:  # noqa: BLE001 - any failure of student code is this row's, reported as text
        _kept.clear()
        text = f"{type(exc).__name__}: {exc}"
        if not str(exc):
            text += " " + traceback.format_exc(limit=2)[-200:]
        answer = {"status": "error", "error": text[:MAX_ERROR_CHARS],
                  "oom": isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text,
                  "cuda_fault": any(word in text for word in CUDA_FAULT_WORDS),
                  "interrupted": isinstance(exc, KeyboardInterrupt)}
    return json.dumps(answer)
