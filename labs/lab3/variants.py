"""Prepared answers for Lab 3 (format: .coord/common.md; used by tests/test_labs.py through tests/lab_harness.py).

ALTERNATIVES: solution cell grade id -> full replacement sources that are correct but written differently from
the reference (other formulas, float64 inside, other orders of random draws, composition of earlier answers).
The first alternative of every cell is self-contained (it does not call answers of other questions), because the
mixed-submission test pairs it with wrong answers elsewhere.

WRONG: solution cell grade id -> (label, full replacement source) pairs, each a plausible mistake; each must fail
the tests of its own question and nothing else.
"""

# --------------------------------------------------------------------------------------------------------------
# Part 1: causal self-attention
# --------------------------------------------------------------------------------------------------------------
_ATTENTION = '''
def causal_self_attention(q, k, v):
    seq_len, head_dim = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
    allowed = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
'''


def _attention(old: str, new: str) -> str:
    assert old in _ATTENTION, old
    return _ATTENTION.replace(old, new)


ALTERNATIVES: dict[str, list[str]] = {}
WRONG: dict[str, list[tuple[str, str]]] = {}

ALTERNATIVES["q1_1_causal_attention"] = [
    # float64 inside, einsum, hand-written stable softmax, mask built with triu
    '''
def causal_self_attention(q, k, v):
    n, d = q.shape[-2], q.shape[-1]
    scores = torch.einsum("...id,...jd->...ij", q.double(), k.double()) * d ** -0.5
    future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
    scores = scores.masked_fill(future, -math.inf)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    weights = scores.exp()
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights @ v.double()).to(q.dtype)
''',
    # additive -inf mask, scale applied to q first
    '''
def causal_self_attention(q, k, v):
    n = q.shape[-2]
    bias = torch.full((n, n), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    scores = (q / q.shape[-1] ** 0.5) @ k.transpose(-1, -2) + bias
    return F.softmax(scores, dim=-1) @ v
''',
]
WRONG["q1_1_causal_attention"] = [
    ("no mask", _attention('    scores = scores.masked_fill(~allowed, float("-inf"))\n', "")),
    ("mask keeps the future instead of the past", _attention(".tril()", ".triu()")),
    ("diagonal masked too (row 0 sees nothing)", _attention(".tril()", ".tril(-1)")),
    ("scores scaled by 1/d instead of 1/sqrt(d)", _attention("math.sqrt(head_dim)", "head_dim")),
    ("masked entries set to 0 instead of -inf", _attention('float("-inf")', "0.0")),
    ("mask applied after the softmax without renormalising",
     _attention('    scores = scores.masked_fill(~allowed, float("-inf"))\n    return torch.softmax(scores, dim=-1) @ v',
                "    return (torch.softmax(scores, dim=-1) * allowed) @ v")),
    ("softmax without subtracting the row maximum (exp overflows beyond 88.7 in float32)",
     _attention('    scores = scores.masked_fill(~allowed, float("-inf"))\n    return torch.softmax(scores, dim=-1) @ v',
                "    weights = scores.exp().masked_fill(~allowed, 0.0)\n"
                "    return (weights / weights.sum(dim=-1, keepdim=True)) @ v")),
    ("softmax without the row maximum, computed in float64 (overflows beyond 709.8)",
     _attention('    scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)\n', "    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(head_dim)\n")
     .replace('    scores = scores.masked_fill(~allowed, float("-inf"))\n    return torch.softmax(scores, dim=-1) @ v',
              "    weights = scores.exp().masked_fill(~allowed, 0.0)\n"
              "    return ((weights / weights.sum(dim=-1, keepdim=True)) @ v.double()).to(q.dtype)")),
    # right values, but the question forbids the library kernel: only the (kernel-side) call recorder catches it
    ("calls F.scaled_dot_product_attention instead of building the mask",
     "def causal_self_attention(q, k, v):\n    return F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"),
]

# --------------------------------------------------------------------------------------------------------------
# Part 2: counting
# --------------------------------------------------------------------------------------------------------------
ALTERNATIVES["q2_1_matmul_flops"] = ["def matmul_flops(M, K, N):\n    return M * N * (K + K)\n"]
ALTERNATIVES["q2_1_matmul_bytes"] = [
    "def matmul_bytes(M, K, N, bytes_per_element):\n"
    "    return sum(rows * cols * bytes_per_element for rows, cols in ((M, K), (K, N), (M, N)))\n"
]
WRONG["q2_1_matmul_flops"] = [
    ("forgets the factor 2", "def matmul_flops(M, K, N):\n    return M * K * N\n"),
    ("tampering: a wrong count as an int subclass whose == is always true",
     "class _LyingInt(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n\n\n"
     "def matmul_flops(M, K, N):\n    return _LyingInt(M * K * N)\n"),
    ("exact count MN(2K-1) instead of the stated convention", "def matmul_flops(M, K, N):\n    return M * N * (2 * K - 1)\n"),
]
WRONG["q2_1_matmul_bytes"] = [
    ("forgets writing C", "def matmul_bytes(M, K, N, bytes_per_element):\n    return bytes_per_element * (M * K + K * N)\n"),
    ("ignores bytes_per_element (fp16 hard-coded)", "def matmul_bytes(M, K, N, bytes_per_element):\n    return 2 * (M * K + K * N + M * N)\n"),
]

_LAYER_COSTS = '''
def layer_costs(B, N, D, H, bytes_per_element):
    n, d = bytes_per_element, D // H
    return {
        "qkv_projection": (6 * B * N * D * D, n * (6 * B * N * D + 3 * D * D)),
        "scores": (H * (2 * B * N * N * d + B * N * N), n * H * (2 * B * N * d + B * N * N)),
        "mask": (H * B * N * N, 2 * n * H * B * N * N),
        "softmax": (3 * H * B * N * N, 2 * n * H * B * N * N),
        "attention_value": (2 * H * B * N * N * d, n * H * (B * N * N + 2 * B * N * d)),
        "output_projection": (2 * B * N * D * D, n * (2 * B * N * D + D * D)),
        "mlp": (16 * B * N * D * D + 5 * B * N * D, n * (10 * B * N * D + 8 * D * D + 5 * D)),
    }
'''


def _layer(old: str, new: str) -> str:
    assert old in _LAYER_COSTS, old
    return _LAYER_COSTS.replace(old, new)


ALTERNATIVES["q2_2_layer_costs"] = [
    # the formulas written out (self-contained)
    _LAYER_COSTS,
    # built row by row from the four attention operations of one head, rows as lists, an OrderedDict
    '''
def layer_costs(B, N, D, H, bytes_per_element):
    import collections

    n, d, S = bytes_per_element, D // H, B * N * N
    head = {"scores": [2 * S * d + S, n * (2 * B * N * d + S)], "mask": [S, 2 * n * S], "softmax": [3 * S, 2 * n * S],
            "attention_value": [2 * S * d, n * (S + 2 * B * N * d)]}
    rows = collections.OrderedDict()
    rows["qkv_projection"] = [3 * matmul_flops(B * N, D, D), 3 * matmul_bytes(B * N, D, D, n)]
    for op, (flops, nbytes) in head.items():
        rows[op] = [H * flops, H * nbytes]
    rows["output_projection"] = [matmul_flops(B * N, D, D), matmul_bytes(B * N, D, D, n)]
    rows["mlp"] = [matmul_flops(B * N, D, 4 * D) + matmul_flops(B * N, 4 * D, D) + 5 * B * N * D,
                   matmul_bytes(B * N, D, 4 * D, n) + matmul_bytes(B * N, 4 * D, D, n) + 5 * D * n]
    return rows
''',
    # `/` instead of `//`: integral floats (a NumPy int64 count for the projections)
    _layer("n, d = bytes_per_element, D // H", "n, d = bytes_per_element, D / H")
    .replace('"qkv_projection": (6 * B * N * D * D,', '"qkv_projection": (np.int64(6) * B * N * D * D,'),
]
WRONG["q2_2_layer_costs"] = [
    ("one projection instead of three", _layer("(6 * B * N * D * D, n * (6 * B * N * D + 3 * D * D))",
                                               "(2 * B * N * D * D, n * (2 * B * N * D + D * D))")),
    ("X read once for all three projections", _layer("n * (6 * B * N * D + 3 * D * D)", "n * (4 * B * N * D + 3 * D * D)")),
    ("scaling of the scores not counted", _layer("H * (2 * B * N * N * d + B * N * N)", "H * 2 * B * N * N * d")),
    ("every head of width D instead of D / H", _layer("n, d = bytes_per_element, D // H", "n, d = bytes_per_element, D")),
    ("softmax's row sum not counted", _layer('"softmax": (3 * H * B * N * N,', '"softmax": (2 * H * B * N * N,')),
    ("N x N traffic of the mask counted for one head only", _layer("2 * n * H * B * N * N),\n        \"softmax\"",
                                                                   "2 * n * B * N * N),\n        \"softmax\"")),
    ("MLP biases not counted", _layer("16 * B * N * D * D + 5 * B * N * D,", "16 * B * N * D * D,")),
    ("intermediate Z neither written nor read (fused MLP)",
     _layer("n * (10 * B * N * D + 8 * D * D + 5 * D)", "n * (2 * B * N * D + 8 * D * D + 5 * D)")),
    ("(bytes, flops) instead of (flops, bytes)",
     _LAYER_COSTS.replace("    return {", "    rows = {").rstrip() + "\n    return {op: (b, f) for op, (f, b) in rows.items()}\n"),
    ("a row missing (the mask folded into the softmax)",
     _LAYER_COSTS.replace("    return {", "    rows = {").rstrip()
     + "\n    rows['softmax'] = tuple(a + b for a, b in zip(rows.pop('mask'), rows['softmax']))\n    return rows\n"),
]

_ROOFLINE = '''
def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
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
'''


def _roofline(old: str, new: str) -> str:
    assert old in _ROOFLINE, old
    return _ROOFLINE.replace(old, new)


ALTERNATIVES["q2_7_roofline_estimate"] = [
    '''
def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    intensity = float(flops) / float(bytes_moved)
    ridge = float(peak_flops_per_s) / float(bandwidth_bytes_per_s)
    times = {"t_compute_s": flops / peak_flops_per_s, "t_memory_s": bytes_moved / bandwidth_bytes_per_s}
    return dict(intensity_flop_per_byte=intensity, ridge_flop_per_byte=ridge, t_roofline_s=max(times.values()),
                bound="compute" if intensity > ridge else "memory", **times)
''',
]
WRONG["q2_7_roofline_estimate"] = [
    ("bound reversed", _roofline('"compute" if t_compute_s > t_memory_s else "memory"',
                                 '"memory" if t_compute_s > t_memory_s else "compute"')),
    ("times added instead of overlapped", _roofline("max(t_compute_s, t_memory_s)", "t_compute_s + t_memory_s")),
    ("intensity inverted (bytes per FLOP)", _roofline('"intensity_flop_per_byte": flops / bytes_moved',
                                                      '"intensity_flop_per_byte": bytes_moved / flops')),
    ("a tie (T_compute == T_memory) called compute-bound", _roofline("if t_compute_s > t_memory_s", "if t_compute_s >= t_memory_s")),
    ("tampering: bound as a str subclass that equals anything",
     "class _AnyLabel(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n\n"
     + _roofline('"compute" if t_compute_s > t_memory_s else "memory"', '_AnyLabel("memory")')),
]

# --------------------------------------------------------------------------------------------------------------
# Part 3: GPT-2 XL without a cache
# --------------------------------------------------------------------------------------------------------------
ALTERNATIVES["q3_1_gpt2_forward_flops"] = [
    "def gpt2_forward_flops(B, N, D, H, num_layers):\n"
    "    return num_layers * B * N * (24 * D * D + 4 * N * D + 5 * H * N + 5 * D)\n",
    "def gpt2_forward_flops(B, N, D, H, num_layers):\n"
    "    return num_layers * sum(row[0] for row in layer_costs(B, N, D, H, 2).values())\n",
]
ALTERNATIVES["q3_1_gpt2_forward_bytes"] = [
    "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
    "    total = 0\n"
    "    for _ in range(num_layers):\n"
    "        total += bytes_per_element * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D)\n"
    "    return total\n",
    "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
    "    costs = layer_costs(B, N, D, H, bytes_per_element)\n"
    "    return num_layers * sum(nbytes for _, nbytes in costs.values())\n",
]
WRONG["q3_1_gpt2_forward_flops"] = [
    ("N^2 elementwise FLOPs of one head only",
     "def gpt2_forward_flops(B, N, D, H, num_layers):\n"
     "    return num_layers * (24 * B * N * D * D + 4 * B * N * N * D + 5 * B * N * N + 5 * B * N * D)\n"),
    ("output projection forgotten",
     "def gpt2_forward_flops(B, N, D, H, num_layers):\n"
     "    return num_layers * (22 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D)\n"),
    ("48 layers hard-coded",
     "def gpt2_forward_flops(B, N, D, H, num_layers):\n"
     "    return 48 * (24 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D)\n"),
]
WRONG["q3_1_gpt2_forward_bytes"] = [
    ("N x N traffic of one head only",
     "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
     "    return num_layers * bytes_per_element * (22 * B * N * D + 12 * D * D + 6 * B * N * N + 5 * D)\n"),
    ("weights of only one layer read",
     "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
     "    return bytes_per_element * (num_layers * (22 * B * N * D + 6 * H * B * N * N + 5 * D) + 12 * D * D)\n"),
]

_TABLE = '''
def roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s):
    table = {}
    for B, N in cases:
        flops, nbytes = flops_fn(B, N), bytes_fn(B, N)
        t_compute_s, t_memory_s = flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s
        table[(B, N)] = {"flops": flops, "bytes": nbytes, "t_compute_s": t_compute_s, "t_memory_s": t_memory_s,
                         "bound": "compute" if t_compute_s > t_memory_s else "memory"}
    return table
'''


def _table(old: str, new: str) -> str:
    assert old in _TABLE, old
    return _TABLE.replace(old, new)


ALTERNATIVES["q3_2_roofline_table"] = [
    '''
def roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s):
    def row(B, N):
        flops, nbytes = float(flops_fn(B, N)), float(bytes_fn(B, N))
        intensity, ridge = flops / nbytes, peak_flops_per_s / bandwidth_bytes_per_s
        return dict(flops=flops, bytes=nbytes, t_compute_s=flops / peak_flops_per_s,
                    t_memory_s=nbytes / bandwidth_bytes_per_s, bound="compute" if intensity > ridge else "memory")
    return {(B, N): row(B, N) for B, N in cases}
''',
]
WRONG["q3_2_roofline_table"] = [
    ("B and N swapped in the calls", _table("flops_fn(B, N), bytes_fn(B, N)", "flops_fn(N, B), bytes_fn(N, B)")),
    ("bound reversed", _table('"compute" if t_compute_s > t_memory_s else "memory"', '"memory" if t_compute_s > t_memory_s else "compute"')),
    ("memory time divided by the peak FLOP/s", _table("nbytes / bandwidth_bytes_per_s", "nbytes / peak_flops_per_s")),
    ("a tie (T_compute == T_memory) called compute-bound", _table("if t_compute_s > t_memory_s", "if t_compute_s >= t_memory_s")),
]

# --------------------------------------------------------------------------------------------------------------
# Part 4: KV cache
# --------------------------------------------------------------------------------------------------------------
ALTERNATIVES["q4_1_kv_cache_bytes_per_layer"] = [
    "def kv_cache_bytes_per_layer(B, N, D, bytes_per_element):\n    keys = values = B * N * D * bytes_per_element\n    return keys + values\n"
]
ALTERNATIVES["q4_1_kv_cache_bytes_total"] = [
    "def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):\n    return 2 * num_layers * B * N * D * bytes_per_element\n",
    "def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):\n"
    "    return num_layers * kv_cache_bytes_per_layer(B, N, D, bytes_per_element)\n",
]
WRONG["q4_1_kv_cache_bytes_per_layer"] = [
    ("keys only", "def kv_cache_bytes_per_layer(B, N, D, bytes_per_element):\n    return B * N * D * bytes_per_element\n"),
]
WRONG["q4_1_kv_cache_bytes_total"] = [
    ("per-layer size returned", "def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):\n    return 2 * B * N * D * bytes_per_element\n"),
]

_CACHE = '''
class StaticKVCache:
    def __init__(self, num_layers, batch_size, num_heads, head_dim, max_len, dtype, device):
        shape = (num_layers, batch_size, num_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def update(self, layer, key, value):
        end = self.length + key.shape[2]
        self.keys[layer, :, :, self.length:end] = key
        self.values[layer, :, :, self.length:end] = value
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, num_tokens):
        self.length += num_tokens
'''

_STEP = '''
@torch.no_grad()
def gpt2_step(model, input_ids, cache):
    body, start = model.transformer, cache.length
    batch, new_tokens = input_ids.shape
    positions = torch.arange(start, start + new_tokens, device=input_ids.device)
    x = body.wte(input_ids) + body.wpe(positions)
    width, heads = x.shape[-1], model.config.n_head
    head_dim = width // heads
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
'''


def _cache(old: str, new: str) -> str:
    assert old in _CACHE, old
    return _CACHE.replace(old, new)


def _step(old: str, new: str) -> str:
    assert old in _STEP, old
    return _STEP.replace(old, new)


ALTERNATIVES["q4_6_static_kv_cache"] = [
    _CACHE,
    # torch.empty buffers, index_copy_ along the positions, a length check
    '''
class StaticKVCache:
    def __init__(self, num_layers, batch_size, num_heads, head_dim, max_len, dtype, device):
        self.keys = torch.empty(num_layers, batch_size, num_heads, max_len, head_dim, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0

    def update(self, layer, key, value):
        q = key.shape[2]
        if self.length + q > self.keys.shape[3]:
            raise ValueError("cache full")
        where = torch.arange(self.length, self.length + q, device=key.device)
        self.keys[layer].index_copy_(2, where, key)
        self.values[layer].index_copy_(2, where, value)
        return self.keys[layer, :, :, :self.length + q], self.values[layer, :, :, :self.length + q]

    def advance(self, num_tokens):
        self.length = self.length + int(num_tokens)
''',
]
ALTERNATIVES["q4_6_gpt2_step"] = [
    _STEP,
    # SDPA with a boolean mask, no update/advance methods used (writes the buffers itself with copy_), no decorator
    '''
def gpt2_step(model, input_ids, cache):
    with torch.no_grad():
        body = model.transformer
        B, q = input_ids.shape
        start, end = cache.length, cache.length + input_ids.shape[1]
        x = body.wte(input_ids) + body.wpe(torch.arange(start, end, device=input_ids.device))
        H = model.config.n_head
        D = x.shape[-1]
        mask = torch.ones(q, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
        for i, block in enumerate(body.h):
            q_, k_, v_ = block.attn.c_attn(block.ln_1(x)).view(B, q, 3, H, D // H).permute(2, 0, 3, 1, 4)
            cache.keys[i, :, :, start:end].copy_(k_)
            cache.values[i, :, :, start:end].copy_(v_)
            out = F.scaled_dot_product_attention(q_, cache.keys[i, :, :, :end], cache.values[i, :, :, :end],
                                                 attn_mask=mask)
            x = x + block.attn.c_proj(out.transpose(1, 2).reshape(B, q, D))
            x = x + block.mlp(block.ln_2(x))
        cache.length = end
        return model.lm_head(body.ln_f(x))
''',
]
WRONG["q4_6_static_kv_cache"] = [
    ("appends with torch.cat: the buffers grow (and are copied) at every step, not preallocated",
     _cache("        shape = (num_layers, batch_size, num_heads, max_len, head_dim)",
            "        shape = (num_layers, batch_size, num_heads, 0, head_dim)")
     .replace("        end = self.length + key.shape[2]\n",
              "        end = self.length + key.shape[2]\n"
              "        if layer == 0:  # grow every layer by the new positions\n"
              "            grow = key.new_zeros(self.keys.shape[:3] + key.shape[2:])\n"
              "            self.keys = torch.cat([self.keys[:, :, :, :self.length], grow], dim=3)\n"
              "            self.values = torch.cat([self.values[:, :, :, :self.length], grow], dim=3)\n")),
    ("new keys written one position too far (and read back from there)",
     _cache("        self.keys[layer, :, :, self.length:end] = key\n        self.values[layer, :, :, self.length:end] = value\n"
            "        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]",
            "        self.keys[layer, :, :, self.length + 1:end + 1] = key\n"
            "        self.values[layer, :, :, self.length + 1:end + 1] = value\n"
            "        return self.keys[layer, :, :, 1:end + 1], self.values[layer, :, :, 1:end + 1]")
     .replace("shape = (num_layers, batch_size, num_heads, max_len, head_dim)",
              "shape = (num_layers, batch_size, num_heads, max_len + 1, head_dim)")),
]
WRONG["q4_6_gpt2_step"] = [
    ("recomputes everything: keeps the tokens and runs the whole sequence again (the cache is never read)",
     '''
@torch.no_grad()
def gpt2_step(model, input_ids, cache):
    history = input_ids if cache.length == 0 else torch.cat([cache.tokens, input_ids], dim=1)
    cache.tokens = history
    logits = model(history, use_cache=False).logits[:, -input_ids.shape[1]:]
    cache.length += input_ids.shape[1]
    return logits
'''),
    ("position ids off by one (counted from 1)",
     _step("positions = torch.arange(start, start + new_tokens, device=input_ids.device)",
           "positions = torch.arange(start + 1, start + new_tokens + 1, device=input_ids.device)")),
    ("no mask among the new tokens (the prefill sees the future)",
     _step('        if new_tokens > 1:\n            scores = scores.masked_fill(future, float("-inf"))\n', "")),
]

_DECODE_FLOPS = '''
def gpt2_decode_flops(B, N, D, H, num_layers):
    d_head = D // H
    projections = 2 * B * D * (3 * D) + 2 * B * D * D
    scores = H * (2 * B * N * d_head + B * N)
    softmax = 3 * B * H * N
    attention_value = H * 2 * B * N * d_head
    mlp = 16 * B * D * D + 5 * B * D
    return num_layers * (projections + scores + softmax + attention_value + mlp)
'''
_DECODE_BYTES = '''
def gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element):
    projections = 3 * (B * D + D * D + B * D)
    scores = B * D + B * N * D + B * H * N
    softmax = 2 * B * H * N
    attention_value = B * H * N + B * N * D + B * D
    output_projection = 2 * B * D + D * D
    mlp = 10 * B * D + 8 * D * D + 5 * D
    per_layer = projections + scores + softmax + attention_value + output_projection + mlp
    return num_layers * bytes_per_element * per_layer
'''


def _sub(base: str, old: str, new: str) -> str:
    assert old in base, old
    return base.replace(old, new)


ALTERNATIVES["q4_2_gpt2_decode_flops"] = [
    "def gpt2_decode_flops(B, N, D, H, num_layers):\n"
    "    return num_layers * B * (24 * D * D + 4 * N * D + 4 * H * N + 5 * D)\n"
]
ALTERNATIVES["q4_2_gpt2_decode_bytes"] = [
    "def gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
    "    weights = 12 * D * D + 5 * D\n"
    "    cache_reads = 2 * B * N * D\n"
    "    activations = 20 * B * D + 4 * B * H * N\n"
    "    return num_layers * bytes_per_element * (weights + cache_reads + activations)\n"
]
WRONG["q4_2_gpt2_decode_flops"] = [
    ("scaling counted once per token instead of once per score", _sub(_DECODE_FLOPS, "H * (2 * B * N * d_head + B * N)", "H * 2 * B * N * d_head + B * N")),
    ("causal mask still applied", _sub(_DECODE_FLOPS, "softmax = 3 * B * H * N", "softmax = 4 * B * H * N")),
    ("all N tokens recomputed by the projections and MLP",
     _sub(_DECODE_FLOPS, "mlp = 16 * B * D * D + 5 * B * D", "mlp = 16 * B * N * D * D + 5 * B * N * D")),
]
WRONG["q4_2_gpt2_decode_bytes"] = [
    ("softmax traffic forgotten", _sub(_DECODE_BYTES, "softmax = 2 * B * H * N", "softmax = 0")),
    ("cache reads not counted", _sub(_DECODE_BYTES, "scores = B * D + B * N * D + B * H * N", "scores = B * D + B * H * N")),
    ("weights read once per sequence", _sub(_DECODE_BYTES, "mlp = 10 * B * D + 8 * D * D + 5 * D", "mlp = 10 * B * D + 8 * B * D * D + 5 * D")),
]


ALTERNATIVES["b4_5_kv_cache_bytes_gqa"] = [
    "def kv_cache_bytes_gqa(B, N, D, H, num_kv_heads, num_layers, bytes_per_element):\n"
    "    return 2 * num_layers * B * N * (num_kv_heads * D // H) * bytes_per_element\n"
]
ALTERNATIVES["b4_5_max_batch_in_memory"] = [
    "def max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes, weight_bytes):\n"
    "    per_sequence = 2 * num_layers * N * num_kv_heads * (D // H) * bytes_per_element\n"
    "    return max(0, math.floor((memory_bytes - weight_bytes) / per_sequence))\n",
]
WRONG["b4_5_kv_cache_bytes_gqa"] = [
    ("all H heads cached", "def kv_cache_bytes_gqa(B, N, D, H, num_kv_heads, num_layers, bytes_per_element):\n"
                           "    return 2 * num_layers * B * N * D * bytes_per_element\n"),
]
WRONG["b4_5_max_batch_in_memory"] = [
    ("negative when the weights do not fit",
     "def max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes, weight_bytes):\n"
     "    per_sequence = 2 * num_layers * N * num_kv_heads * (D // H) * bytes_per_element\n"
     "    return int((memory_bytes - weight_bytes) // per_sequence)\n"),
    ("weights forgotten",
     "def max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes, weight_bytes):\n"
     "    per_sequence = 2 * num_layers * N * num_kv_heads * (D // H) * bytes_per_element\n"
     "    return int(memory_bytes // per_sequence)\n"),
]

# --------------------------------------------------------------------------------------------------------------
# Part 5: predictions
# --------------------------------------------------------------------------------------------------------------
_PREDICT = '''
def predict_gpt2_latencies_ms(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    def roofline_ms(flops, nbytes):
        return max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s) * 1e3

    return {
        "predicted_no_cache_ms": roofline_ms(gpt2_forward_flops(B, N, D, H, num_layers),
                                             gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element)),
        "predicted_cache_ms": roofline_ms(gpt2_decode_flops(B, N, D, H, num_layers),
                                          gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element)),
    }
'''
ALTERNATIVES["q5_1_predictions"] = [
    # self-contained: the counts written out, times in seconds first, numpy for the maximum
    '''
def predict_gpt2_latencies_ms(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    L, n = num_layers, bytes_per_element
    seconds = {
        "predicted_no_cache_ms": (L * B * N * (24 * D * D + 4 * N * D + 5 * H * N + 5 * D),
                                  L * n * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D)),
        "predicted_cache_ms": (L * B * (24 * D * D + 4 * N * D + 4 * H * N + 5 * D),
                               L * n * (B * (20 * D + 2 * N * D + 4 * H * N) + 12 * D * D + 5 * D)),
    }
    return {key: float(np.max([flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s])) * 1000
            for key, (flops, nbytes) in seconds.items()}
''',
    # through roofline_estimate (Question 2.3) and the student's own counts
    '''
def predict_gpt2_latencies_ms(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    shape = dict(B=B, N=N, D=D, H=H, num_layers=num_layers)
    full = roofline_estimate(gpt2_forward_flops(**shape), gpt2_forward_bytes(**shape, bytes_per_element=bytes_per_element),
                             peak_flops_per_s, bandwidth_bytes_per_s)
    step = roofline_estimate(gpt2_decode_flops(**shape), gpt2_decode_bytes(**shape, bytes_per_element=bytes_per_element),
                             peak_flops_per_s, bandwidth_bytes_per_s)
    return dict(predicted_no_cache_ms=full["t_roofline_s"] / 1e-3, predicted_cache_ms=step["t_roofline_s"] / 1e-3)
''',
]
WRONG["q5_1_predictions"] = [
    ("seconds instead of milliseconds", _sub(_PREDICT, "nbytes / bandwidth_bytes_per_s) * 1e3", "nbytes / bandwidth_bytes_per_s)")),
    ("compute and memory times added instead of overlapped",
     _sub(_PREDICT, "max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s)", "(flops / peak_flops_per_s + nbytes / bandwidth_bytes_per_s)")),
    ("cached step priced as a forward pass over one token (cache reads left out)",
     _sub(_sub(_PREDICT, "gpt2_decode_flops(B, N, D, H, num_layers)", "gpt2_forward_flops(B, 1, D, H, num_layers)"),
          "gpt2_decode_bytes(B, N, D, H, num_layers, bytes_per_element)", "gpt2_forward_bytes(B, 1, D, H, num_layers, bytes_per_element)")),
]

# --------------------------------------------------------------------------------------------------------------
# Part 6: speculative decoding
# --------------------------------------------------------------------------------------------------------------
_BREAKDOWN = '''
def decode_time_breakdown_s(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    L, n = num_layers, bytes_per_element
    weight_bytes = L * n * (12 * D * D + 5 * D)
    cache_bytes = L * n * 2 * B * N * D
    other_bytes = L * n * (20 * B * D + 4 * B * H * N)
    flops = L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D)
    return {
        "weights_s": weight_bytes / bandwidth_bytes_per_s,
        "kv_cache_s": cache_bytes / bandwidth_bytes_per_s,
        "other_memory_s": other_bytes / bandwidth_bytes_per_s,
        "compute_s": flops / peak_flops_per_s,
    }
'''
ALTERNATIVES["q6_1_decode_time_breakdown"] = [
    '''
def decode_time_breakdown_s(B, N, D, H, num_layers, bytes_per_element, peak_flops_per_s, bandwidth_bytes_per_s):
    n, L = bytes_per_element, num_layers
    total_bytes = L * n * (20 * B * D + 12 * D * D + 2 * B * N * D + 4 * B * H * N + 5 * D)
    weights = L * n * (4 * D * D + 4 * D * D + 4 * D * D + 4 * D + D)
    cache = 2 * L * n * B * N * D
    return dict(weights_s=weights / bandwidth_bytes_per_s, kv_cache_s=cache / bandwidth_bytes_per_s,
                other_memory_s=(total_bytes - weights - cache) / bandwidth_bytes_per_s,
                compute_s=L * B * (24 * D * D + 4 * N * D + 4 * H * N + 5 * D) / peak_flops_per_s)
''',
]
WRONG["q6_1_decode_time_breakdown"] = [
    ("biases left out of the weights", _sub(_BREAKDOWN, "(12 * D * D + 5 * D)", "12 * D * D")),
    ("weights read once per sequence", _sub(_BREAKDOWN, "L * n * (12 * D * D + 5 * D)", "L * n * B * (12 * D * D + 5 * D)")),
    ("cache counted per head width", _sub(_BREAKDOWN, "L * n * 2 * B * N * D", "L * n * 2 * B * N * (D // H)")),
]

ALTERNATIVES["q6_3_expected_tokens_per_pass"] = [
    "def expected_tokens_per_pass(alpha, gamma):\n    return float(sum(alpha ** i for i in range(gamma + 1)))\n"
]
WRONG["q6_3_expected_tokens_per_pass"] = [
    ("bonus token forgotten", "def expected_tokens_per_pass(alpha, gamma):\n"
                              "    return float(gamma) if alpha == 1 else (1 - alpha ** gamma) / (1 - alpha)\n"),
    ("divides by zero at alpha = 1", "def expected_tokens_per_pass(alpha, gamma):\n    return (1 - alpha ** (gamma + 1)) / (1 - alpha)\n"),
]

_SPEC = '''
def speculative_step(prefix, draft_model, target_model, gamma, generator):
    batch, prefix_len = prefix.shape
    device = prefix.device
    tokens, draft_dists = prefix, []
    for _ in range(gamma):
        q_next = draft_model(tokens)[:, -1, :]
        draft_dists.append(q_next)
        tokens = torch.cat([tokens, torch.multinomial(q_next, 1, generator=generator)], dim=1)
    drafted = tokens[:, prefix_len:]
    q = torch.stack(draft_dists, dim=1).double()
    p = target_model(tokens)[:, prefix_len - 1:, :].double()

    p_of_draft = p[:, :gamma].gather(2, drafted.unsqueeze(2)).squeeze(2)
    q_of_draft = q.gather(2, drafted.unsqueeze(2)).squeeze(2)
    u = torch.rand(batch, gamma, generator=generator, device=device, dtype=torch.float64)
    accepted = u * q_of_draft < p_of_draft
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)

    rows = torch.arange(batch, device=device)
    q_padded = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
    p_next = p[rows, num_accepted]
    residual = (p_next - q_padded[rows, num_accepted]).clamp_min(0)
    mass = residual.sum(dim=1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-300), p_next)
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)

    new_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)
    keep = torch.arange(gamma, device=device).unsqueeze(0) < num_accepted.unsqueeze(1)
    new_tokens[:, :gamma] = torch.where(keep, drafted, torch.full_like(drafted, -1))
    new_tokens[rows, num_accepted] = extra
    return new_tokens, num_accepted + 1
'''


def _spec(*pairs: tuple[str, str]) -> str:
    source = _SPEC
    for old, new in pairs:
        assert old in source, old
        source = source.replace(old, new)
    return source


ALTERNATIVES["q6_4_speculative_step"] = [
    # all uniforms drawn up front, float32 throughout, an "alive" mask instead of cumprod, inverse-CDF sampling
    '''
def speculative_step(prefix, draft_model, target_model, gamma, generator):
    B, T = prefix.shape
    dev = prefix.device
    u_accept = torch.rand(B, gamma, generator=generator, device=dev)
    u_extra = torch.rand(B, 1, generator=generator, device=dev)

    def sample(probs, u):
        cdf = probs.cumsum(dim=-1)
        cdf = cdf / cdf[:, -1:]
        return torch.searchsorted(cdf, u).clamp_max(probs.shape[-1] - 1)

    seq, qs = prefix, []
    for i in range(gamma):
        q_i = draft_model(seq)[:, -1].float()
        qs.append(q_i)
        seq = torch.cat([seq, torch.multinomial(q_i, 1, generator=generator)], dim=1)
    p_all = target_model(seq)[:, T - 1:].float()
    out = torch.full((B, gamma + 1), -1, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    count = torch.zeros(B, dtype=torch.long, device=dev)
    next_dist = torch.zeros_like(p_all[:, 0])
    for i in range(gamma):
        x = seq[:, T + i]
        ratio = p_all[:, i].gather(1, x[:, None]).squeeze(1) / qs[i].gather(1, x[:, None]).squeeze(1)
        ok = alive & (u_accept[:, i] < torch.clamp(ratio, max=1.0))
        rejected_now = alive & ~ok
        out[ok, i] = x[ok]
        count += ok.long()
        resid = torch.clamp(p_all[:, i] - qs[i], min=0.0)
        resid_sum = resid.sum(dim=1, keepdim=True)
        resid = torch.where(resid_sum > 0, resid / resid_sum.clamp_min(1e-30), p_all[:, i])
        next_dist[rejected_now] = resid[rejected_now]
        alive = ok
    next_dist[alive] = p_all[alive, gamma]
    extra = sample(next_dist, u_extra).squeeze(1)
    out[torch.arange(B, device=dev), count] = extra
    return out, count + 1
''',
    # the reference with min(1, p / q) written out and the bonus drawn separately
    _spec(("accepted = u * q_of_draft < p_of_draft", "accepted = u < torch.minimum(torch.ones_like(p_of_draft), p_of_draft / q_of_draft)")),
]
WRONG["q6_4_speculative_step"] = [
    ("replacement drawn from the target p instead of the residual",
     _spec(("residual = (p_next - q_padded[rows, num_accepted]).clamp_min(0)", "residual = p_next.clone()"))),
    ("replacement drawn from the draft q",
     _spec(("residual = (p_next - q_padded[rows, num_accepted]).clamp_min(0)",
            "residual = torch.where((num_accepted < gamma).unsqueeze(1), q_padded[rows, num_accepted], p_next)"))),
    ("acceptance ratio inverted (q / p)", _spec(("accepted = u * q_of_draft < p_of_draft", "accepted = u * p_of_draft < q_of_draft"))),
    ("no bonus token when every draft is accepted",
     _spec(("    return new_tokens, num_accepted + 1",
            "    all_accepted = num_accepted == gamma\n"
            "    new_tokens[all_accepted, gamma] = -1\n"
            "    return new_tokens, num_accepted + 1 - all_accepted.long()"))),
    ("keeps counting accepted drafts after a rejection",
     _spec(("num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)", "num_accepted = accepted.long().sum(dim=1)"))),
    ("greedy drafts (argmax) with the sampling acceptance rule",
     _spec(("torch.multinomial(q_next, 1, generator=generator)", "q_next.argmax(dim=-1, keepdim=True)"))),
    ("target distributions taken one position too late",
     _spec(("p = target_model(tokens)[:, prefix_len - 1:, :].double()",
            "p = target_model(tokens)[:, prefix_len:, :].double()\n    p = torch.cat([p, p[:, -1:]], dim=1)"))),
    ("global random state instead of the generator",
     _spec(("u = torch.rand(batch, gamma, generator=generator, device=device, dtype=torch.float64)",
            "u = torch.rand(batch, gamma, device=device, dtype=torch.float64)"))),
    ("greedy bonus token (argmax of p_{gamma+1})",
     _spec(("    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)\n",
            "    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)\n"
            "    extra = torch.where(num_accepted == gamma, p_next.argmax(dim=1), extra)\n"))),
    ("bonus token drawn from p_gamma (one position early)",
     _spec(("p_next = p[rows, num_accepted]", "p_next = p[rows, num_accepted.clamp_max(gamma - 1)]"))),
    ("bonus token drawn from the draft's last distribution q_gamma",
     _spec(("    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)\n",
            "    residual = torch.where((num_accepted == gamma).unsqueeze(1), q[:, -1], residual)\n"
            "    extra = torch.multinomial(residual, 1, generator=generator).squeeze(1)\n"))),
    ("global random state re-seeded from the generator's seed",
     _spec(("    batch, prefix_len = prefix.shape\n", "    torch.manual_seed(generator.initial_seed())\n    batch, prefix_len = prefix.shape\n"),
           (", generator=generator", ""))),
    ("Python loop over the rows to count the accepted drafts",
     _spec(("    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)\n",
            "    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)\n"
            "    for row in range(batch):\n"
            "        while num_accepted[row] < gamma and accepted[row, num_accepted[row]]:\n"
            "            num_accepted[row] += 1\n"))),
    ("target called once per position",
     _spec(("p = target_model(tokens)[:, prefix_len - 1:, :].double()",
            "p = torch.stack([target_model(tokens[:, : prefix_len + i])[:, -1, :] for i in range(gamma + 1)], dim=1).double()"))),
]

_BEST = '''
def best_gamma(alpha, cost_ratio, max_gamma):
    best, best_speedup = 0, 1.0
    for gamma in range(1, max_gamma + 1):
        tokens = float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
        speedup = tokens / (gamma * cost_ratio + 1)
        if speedup > best_speedup:
            best, best_speedup = gamma, speedup
    return best
'''
ALTERNATIVES["b6_6_speculative_speedup"] = [
    "def speculative_speedup(alpha, gamma, cost_ratio):\n"
    "    return sum(alpha ** i for i in range(gamma + 1)) / (1 + gamma * cost_ratio)\n"
]
ALTERNATIVES["b6_6_best_gamma"] = [
    "def best_gamma(alpha, cost_ratio, max_gamma):\n"
    "    speedups = [sum(alpha ** i for i in range(g + 1)) / (1 + g * cost_ratio) for g in range(max_gamma + 1)]\n"
    "    return int(max(range(max_gamma + 1), key=lambda g: (speedups[g], -g)))\n",
    "def best_gamma(alpha, cost_ratio, max_gamma):\n"
    "    return max(range(max_gamma + 1), key=lambda g: (speculative_speedup(alpha, g, cost_ratio), -g))\n",
]
WRONG["b6_6_speculative_speedup"] = [
    ("target pass left out of the cost",
     "def speculative_speedup(alpha, gamma, cost_ratio):\n"
     "    tokens = float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)\n"
     "    return tokens / max(gamma * cost_ratio, 1e-12)\n"),
]
WRONG["b6_6_best_gamma"] = [
    ("gamma = 0 never considered", _sub(_BEST, "best, best_speedup = 0, 1.0", "best, best_speedup = 1, -1.0")),
    ("last maximum on ties", _sub(_BEST, "if speedup > best_speedup:", "if speedup >= best_speedup:")),
]

# ==============================================================================================================
# Issue 36, "One test contract for all labs": answers in every allowed form, the device rule, the prescribed method,
# a mistake charged once, and hints that work.
# ==============================================================================================================

# -- point 1: every form the question allows earns full marks (checks.py's contract) ---------------------------
ALTERNATIVES["q2_1_matmul_flops"] += [
    # a count as a NumPy integer
    "def matmul_flops(M, K, N):\n    return np.int64(2) * M * K * N\n",
    # a count as an integral float
    "def matmul_flops(M, K, N):\n    return float(2 * M * K * N)\n",
]
ALTERNATIVES["q4_1_kv_cache_bytes_total"] += [
    # a one-element tensor
    "def kv_cache_bytes_total(B, N, D, num_layers, bytes_per_element):\n"
    "    return torch.tensor(2 * num_layers * B * N * D * bytes_per_element)\n",
]
ALTERNATIVES["q2_7_roofline_estimate"] += [
    # times computed in float32 (np.float32 scalars), the bound as np.str_
    '''
def roofline_estimate(flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s):
    f, b, p, w = (np.float32(x) for x in (flops, bytes_moved, peak_flops_per_s, bandwidth_bytes_per_s))
    t_c, t_m = f / p, b / w
    return {"intensity_flop_per_byte": f / b, "ridge_flop_per_byte": p / w, "t_compute_s": t_c, "t_memory_s": t_m,
            "t_roofline_s": np.maximum(t_c, t_m), "bound": np.array(["memory", "compute"])[int(t_c > t_m)]}
''',
]
ALTERNATIVES["q3_2_roofline_table"] += [
    # NumPy floats and np.str_ labels
    '''
def roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s):
    table = {}
    for B, N in cases:
        flops, nbytes = np.float64(flops_fn(B, N)), np.float64(bytes_fn(B, N))
        t_c, t_m = flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s
        table[(B, N)] = {"flops": flops, "bytes": nbytes, "t_compute_s": t_c, "t_memory_s": t_m,
                         "bound": np.str_("compute" if t_c > t_m else "memory")}
    return table
''',
]
ALTERNATIVES["q5_1_predictions"] += [
    # float32 results
    _sub(_PREDICT, "return max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s) * 1e3",
         "return np.float32(max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s)) * np.float32(1e3)"),
]
ALTERNATIVES["q6_1_decode_time_breakdown"] += [
    # every part as a np.float32
    _sub(_BREAKDOWN, "    return {", "    return {key: np.float32(value) for key, value in {")
    .replace('        "compute_s": flops / peak_flops_per_s,\n    }', '        "compute_s": flops / peak_flops_per_s,\n    }.items()}'),
]
ALTERNATIVES["q6_3_expected_tokens_per_pass"] += [
    # a one-element float32 tensor
    "def expected_tokens_per_pass(alpha, gamma):\n"
    "    return torch.tensor(sum(alpha ** i for i in range(gamma + 1)), dtype=torch.float32)\n",
]
ALTERNATIVES["b4_5_max_batch_in_memory"] += [
    # an integral float (floor division of floats), no int()
    "def max_batch_in_memory(N, D, H, num_kv_heads, num_layers, bytes_per_element, memory_bytes, weight_bytes):\n"
    "    per_sequence = 2 * num_layers * N * num_kv_heads * (D // H) * bytes_per_element\n"
    "    return max(0.0, (memory_bytes - weight_bytes) // per_sequence)\n",
]
ALTERNATIVES["b6_6_best_gamma"] += [
    # np.argmax: a NumPy integer (the first maximum)
    "def best_gamma(alpha, cost_ratio, max_gamma):\n"
    "    return np.argmax([sum(alpha ** i for i in range(g + 1)) / (1 + g * cost_ratio) for g in range(max_gamma + 1)])\n",
]
ALTERNATIVES["q6_4_speculative_step"] += [
    # the two results as a list instead of a tuple
    _spec(("    return new_tokens, num_accepted + 1", "    return [new_tokens, num_accepted + 1]")),
]
WRONG["q2_1_matmul_flops"] += [
    # point 1: a count with a fractional part is still refused
    ("a bool instead of the count (refused by the contract)", "def matmul_flops(M, K, N):\n    return True\n"),
    ("true division leaves a fractional count", "def matmul_flops(M, K, N):\n    return M * K * N / 2 * 4 + 0.5\n"),
]

# -- point 3: the device rule, seen on a CPU grader through PyTorch's meta default device ------------------------
WRONG["q1_1_causal_attention"] += [
    ("output allocated without device= (on the default device, not q's)",
     _attention("    return torch.softmax(scores, dim=-1) @ v",
                "    out = torch.empty(q.shape, dtype=q.dtype)\n"
                "    out[...] = torch.softmax(scores, dim=-1) @ v\n"
                "    return out")),
]
WRONG["q6_4_speculative_step"] += [
    ("padding tensor created without device= (new_tokens on the default device, not prefix's)",
     _spec(("new_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)",
            "new_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long)"))),
]
ALTERNATIVES["q1_1_causal_attention"] += [
    # the mask made on the default device and moved (the meta probe cannot tell: the ordinary device check decides)
    _attention("torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()",
               "torch.ones(seq_len, seq_len, dtype=torch.bool).tril().to(q.device)"),
]

# -- point 4: the prescribed method (no SDPA) is its own check; since issue 50 it is a method check (a failed one caps
# the cell at a quarter), and the SDPA answer is in SKIPS (below).

# -- point 5: a mistake is charged once. The reference answers of Questions 3.1, 4.1 (total), 6.1, Bonus 4.4
# (max_batch_in_memory) and Bonus 6.6 (best_gamma) are built from the earlier functions, so each wrong earlier
# answer below flows into them; the later questions' tests accept the carried-forward values, and the mistake
# fails its own question only.
WRONG["q2_2_layer_costs"] += [
    ("bias b_1 not read (charged in Question 2.2 only; Questions 3.1 and 4.2 accept counts built from it)",
     _layer("n * (10 * B * N * D + 8 * D * D + 5 * D)", "n * (10 * B * N * D + 8 * D * D + D)")),
]
WRONG["q3_1_gpt2_forward_bytes"] += [
    ("softmax traffic forgotten (charged in Question 3.1 only; Question 5.1 carries it forward)",
     "def gpt2_forward_bytes(B, N, D, H, num_layers, bytes_per_element):\n"
     "    return num_layers * bytes_per_element * (22 * B * N * D + 12 * D * D + 4 * H * B * N * N + 5 * D)\n"),
]
WRONG["q4_2_gpt2_decode_flops"] += [
    ("MLP biases not counted (charged in Question 4.2 only; Questions 5.1 and 6.1 carry it forward)",
     _sub(_DECODE_FLOPS, "mlp = 16 * B * D * D + 5 * B * D", "mlp = 16 * B * D * D")),
]
WRONG["q4_1_kv_cache_bytes_per_layer"] += [
    ("one byte per element (charged in Question 4.1's per-layer check only; the total carries it forward)",
     "def kv_cache_bytes_per_layer(B, N, D, bytes_per_element):\n    return 2 * B * N * D\n"),
]
WRONG["q2_7_roofline_estimate"] += [
    ("times in ms (charged in Question 2.3 only; Questions 3.2 and 5.1 accept what it gives)",
     _roofline('"t_roofline_s": max(t_compute_s, t_memory_s)', '"t_roofline_s": max(t_compute_s, t_memory_s) * 1e3')),
]
WRONG["q6_3_expected_tokens_per_pass"] += [
    ("gamma + 1 terms off by one (charged in Question 6.3 only; Bonus 6.6 accepts answers built from it)",
     "def expected_tokens_per_pass(alpha, gamma):\n    return float(sum(alpha ** i for i in range(gamma + 2)))\n"),
]
ALTERNATIVES["b6_6_speculative_speedup"] += [
    # built from Question 6.3 (with alpha = 1 handled there)
    "def speculative_speedup(alpha, gamma, cost_ratio):\n"
    "    return expected_tokens_per_pass(alpha, gamma) / (gamma * cost_ratio + 1)\n",
]

# -- point 6: every code hint of the text, followed literally, passes the hidden tests ---------------------------
HINTS: dict[str, list[tuple[str, str]]] = {
    "q6_4_speculative_step": [
        ("Tip: `accepted.long().cumprod(dim=1).sum(dim=1)` counts the leading accepted drafts; randomness from "
         "`torch.multinomial(probs, 1, generator=generator)` and `torch.rand(..., generator=generator, "
         "device=prefix.device)` (float32 uniforms)",
         _spec(("u = torch.rand(batch, gamma, generator=generator, device=device, dtype=torch.float64)",
                "u = torch.rand(batch, gamma, generator=generator, device=prefix.device)"))),
    ],
    "q1_1_causal_attention": [
        ("`torch.softmax` is stable: the masked scores straight into torch.softmax", _ATTENTION),
    ],
    "q2_2_layer_costs": [
        ("Divide integers with `//` (for example `D // H`); build the matmuls from your `matmul_flops` and "
         "`matmul_bytes`", ALTERNATIVES["q2_2_layer_costs"][1]),
    ],
    "q3_1_gpt2_forward_flops": [
        ("Your `layer_costs` of Part 2 is the building block", ALTERNATIVES["q3_1_gpt2_forward_flops"][1]),
    ],
    "q5_1_predictions": [
        ("(`gpt2_forward_*`, Question 3.1) and (`gpt2_decode_*`, Question 4.2)", _PREDICT),
    ],
    "q6_1_decode_time_breakdown": [
        ("The three memory parts must add up to the bytes of Question 4.2",
         _sub(_BREAKDOWN, "other_bytes = L * n * (20 * B * D + 4 * B * H * N)",
              "other_bytes = gpt2_decode_bytes(B, N, D, H, L, n) - weight_bytes - cache_bytes")),
    ],
}

# ==============================================================================================================
# Issue 50, "A grade orders the work": a skipped method earns at most a quarter and less than any one mistake,
# a correct design earns full marks, and the rules the GPU measurement needs are stated and checked on a CPU.
# SKIPS: solution cell grade id -> (label, source) pairs that skip what the question asks (course/cli/harness.py).
# ==============================================================================================================
SKIPS: dict[str, list[tuple[str, str]]] = {}


def _moved(table: dict, cell: str, label_start: str) -> str:
    """Take the (label, source) pair whose label starts with ``label_start`` out of ``table[cell]``; its source."""
    index = next(i for i, (label, _) in enumerate(table[cell]) if label.startswith(label_start))
    return table[cell].pop(index)[1]


# -- Question 1.1 ------------------------------------------------------------------------------------------------
# The library kernel instead of the mask and the softmax: a skip (it was a WRONG answer that lost one check of six).
SKIPS["q1_1_causal_attention"] = [
    ("F.scaled_dot_product_attention(is_causal=True) instead of building the mask and the softmax",
     _moved(WRONG, "q1_1_causal_attention", "calls F.scaled_dot_product_attention")),
    ("F.scaled_dot_product_attention with an explicit boolean causal mask (built by the answer)",
     "def causal_self_attention(q, k, v):\n"
     "    n = q.shape[-2]\n"
     "    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()\n"
     "    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)\n"),
]
ALTERNATIVES["q1_1_causal_attention"] += [
    # the common idiom: the softmax in float32 (HF's eager attention), cast back to q's dtype; on float64 inputs it
    # earned 3/6 though the question stated no precision (now: float32's tolerance, stated in the text)
    '''
def causal_self_attention(q, k, v):
    n, d = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    future = torch.triu(torch.ones(n, n, dtype=torch.bool, device=q.device), diagonal=1)
    weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32).to(q.dtype)
    return weights @ v
''',
]
WRONG["q1_1_causal_attention"] += [
    # earned 6/6 on a CPU grader: the meta default device made the mask meta, masked_fill then raised and the probe
    # could not tell; now the function also runs on inputs on another device (meta), where a CPU mask cannot mix in
    ("causal mask built on the CPU (torch.ones(...).tril() without device=)",
     _attention("torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).tril()",
                "torch.ones(seq_len, seq_len, dtype=torch.bool).tril()")),
    ("additive -inf mask from torch.triu(torch.full(...)) without device=",
     '''
def causal_self_attention(q, k, v):
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores + torch.triu(torch.full((n, n), float("-inf"), dtype=q.dtype), diagonal=1)
    return torch.softmax(scores, dim=-1) @ v
'''),
]

# -- Question 4.5 ------------------------------------------------------------------------------------------------
SKIPS["q4_6_gpt2_step"] = [
    # earned 9.3/12: it lost only the check that a decode step reads the cache
    ("no cache at all: keeps the tokens and runs the whole sequence again",
     _moved(WRONG, "q4_6_gpt2_step", "recomputes everything")),
    # earned 12/12: the student's buffers handed to transformers' DynamicCache, the step run by model(...)
    ("the cache handed to transformers (DynamicCache, past_key_values) and the step run by model(...)",
     '''
@torch.no_grad()
def gpt2_step(model, input_ids, cache):
    from transformers import DynamicCache

    start, new_tokens = cache.length, input_ids.shape[1]
    past = DynamicCache()
    for layer in range(model.config.n_layer):
        past.update(cache.keys[layer, :, :, :start], cache.values[layer, :, :, :start], layer)
    positions = torch.arange(start, start + new_tokens, device=input_ids.device).expand(input_ids.shape[0], -1)
    out = model(input_ids, past_key_values=past, position_ids=positions, use_cache=True)
    for layer in range(model.config.n_layer):
        cached = out.past_key_values.layers[layer]
        cache.keys[layer, :, :, start:start + new_tokens] = cached.keys[:, :, start:]
        cache.values[layer, :, :, start:start + new_tokens] = cached.values[:, :, start:]
    cache.length = start + new_tokens
    return out.logits
'''),
    ("every block run by its own forward (block(x, past_key_values=...)) on a DynamicCache filled from the buffers",
     '''
@torch.no_grad()
def gpt2_step(model, input_ids, cache):
    from transformers import DynamicCache

    body, start = model.transformer, cache.length
    new_tokens = input_ids.shape[1]
    positions = torch.arange(start, start + new_tokens, device=input_ids.device)
    past = DynamicCache()
    for layer in range(model.config.n_layer):
        past.update(cache.keys[layer, :, :, :start], cache.values[layer, :, :, :start], layer)
    x = body.wte(input_ids) + body.wpe(positions)
    future = torch.arange(start + new_tokens, device=x.device)[None, :] > positions[:, None]
    mask = torch.zeros(future.shape, dtype=x.dtype, device=x.device).masked_fill(future, float("-inf"))[None, None]
    for layer, block in enumerate(body.h):
        x = block(x, past_key_values=past, attention_mask=mask, use_cache=True)
        x = x[0] if isinstance(x, tuple) else x
        cached = past.layers[layer]
        cache.keys[layer, :, :, start:start + new_tokens] = cached.keys[:, :, start:]
        cache.values[layer, :, :, start:start + new_tokens] = cached.values[:, :, start:]
    cache.length = start + new_tokens
    return model.lm_head(body.ln_f(x))
'''),
]
ALTERNATIVES["q4_6_static_kv_cache"] += [
    # per-layer views of the two buffers made once in __init__ (correct by the contract; it scored like no cache
    # when the test replaced cache.keys / cache.values with tensors of its own instead of filling the buffers)
    '''
class StaticKVCache:
    def __init__(self, num_layers, batch_size, num_heads, head_dim, max_len, dtype, device):
        shape = (num_layers, batch_size, num_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.layer_keys, self.layer_values = self.keys.unbind(0), self.values.unbind(0)  # views, made once
        self.length = 0

    def update(self, layer, key, value):
        end = self.length + key.shape[2]
        self.layer_keys[layer][:, :, self.length:end] = key
        self.layer_values[layer][:, :, self.length:end] = value
        return self.layer_keys[layer][:, :, :end], self.layer_values[layer][:, :, :end]

    def advance(self, num_tokens):
        self.length += num_tokens
''',
]
WRONG["q4_6_static_kv_cache"] += [
    # earned 12/12: the storage stays the same, but each step copies the whole cache (the text forbids torch.cat)
    ("each update builds the whole layer with torch.cat and copies it back into the same buffer",
     _cache("        self.keys[layer, :, :, self.length:end] = key\n        self.values[layer, :, :, self.length:end] = value\n",
            "        rest = self.keys[layer, :, :, end:]\n"
            "        self.keys[layer].copy_(torch.cat([self.keys[layer, :, :, :self.length], key, rest], dim=2))\n"
            "        self.values[layer].copy_(torch.cat([self.values[layer, :, :, :self.length], value,\n"
            "                                            self.values[layer, :, :, end:]], dim=2))\n")),
    # earned 12/12: the tests used float32 models only (the measurement runs fp16)
    ("buffers ignore dtype (float32 whatever the model's dtype)",
     _cache("        self.keys = torch.zeros(shape, dtype=dtype, device=device)\n        self.values = torch.zeros(shape, dtype=dtype, device=device)\n",
            "        self.keys = torch.zeros(shape, device=device)\n        self.values = torch.zeros(shape, device=device)\n")),
    ("buffers ignore device (on the default device whatever the model's device)",
     _cache("        self.keys = torch.zeros(shape, dtype=dtype, device=device)\n        self.values = torch.zeros(shape, dtype=dtype, device=device)\n",
            "        self.keys = torch.zeros(shape, dtype=dtype)\n        self.values = torch.zeros(shape, dtype=dtype)\n")),
]
WRONG["q4_6_gpt2_step"] += [
    # run in a CUDA graph by Part 5: a host sync breaks the capture; on a CPU grader it passed every check
    ("checks the token ids with a Python if on a tensor (a host sync in every step)",
     _step("    batch, new_tokens = input_ids.shape\n",
           "    batch, new_tokens = input_ids.shape\n"
           "    if input_ids.max() >= model.config.vocab_size:\n"
           "        raise ValueError('token id out of range')\n")),
    ("position ids created on the CPU (torch.arange without device=)",
     _step("positions = torch.arange(start, start + new_tokens, device=input_ids.device)",
           "positions = torch.arange(start, start + new_tokens)")),
    ("attention over the cache concatenated with the new key and value (torch.cat every step, nothing written "
     "in place but the new position)",
     _step("        keys, values = cache.update(layer, key, value)\n",
           "        keys = torch.cat([cache.keys[layer, :, :, :start], key], dim=2)\n"
           "        values = torch.cat([cache.values[layer, :, :, :start], value], dim=2)\n"
           "        cache.update(layer, key, value)\n")),
]
SKIPS["q4_6_gpt2_step"] += [
    # what the prompt gives away and nothing else: buffers of the stated shape (the reference StaticKVCache), a step
    # that returns logits of the right shape and advances the length, writing and reading nothing
    ("writes and reads nothing: zero logits of the right shape, cache.length advanced",
     '''
def gpt2_step(model, input_ids, cache):
    cache.length += input_ids.shape[1]
    return torch.zeros(*input_ids.shape, model.config.vocab_size, dtype=cache.keys.dtype, device=input_ids.device)
'''),
]

# -- Question 6.4: checks that confirmed only the call shapes the contract states -----------------------------------
# earned 2.9/8 before (the public format-and-calls check, the calls check, and the vectorised and device rules, which a
# step that computes nothing passes): the calls must now carry the step's own drafts, and the checks of how the step
# runs check a step that drafts as the contract says
SKIPS["q6_4_speculative_step"] = [
    ("no speculative sampling: the models called on tokens of zeros, one constant token emitted",
     '''
def speculative_step(prefix, draft_model, target_model, gamma, generator):
    batch, tokens = prefix.shape[0], prefix
    for _ in range(gamma):
        draft_model(tokens)
        tokens = torch.cat([tokens, torch.zeros_like(tokens[:, :1])], dim=1)
    target_model(tokens)
    new_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=prefix.device)
    new_tokens[:, 0] = 0
    return new_tokens, torch.ones(batch, dtype=torch.long, device=prefix.device)
'''),
]

# -- checks that a constant answer passed (the label or count the prompt gives away) --------------------------------
# Question 3.2's tie check paid for the constant label "memory" (0.6/3); now it has a case a constant fails. (Question
# 2.7's tie check and Question 6.3's alpha = 1 check did the same, and Bonus 6.6's best_gamma returning 0 earned two
# checks: those constant answers are red-team cases in tests/redteam/lab3_boundary.py, as those questions have
# one-mistake answers that earn nothing, below which no skip fits.)
SKIPS["q3_2_roofline_table"] = [
    ("no table: every number 0 and the bound the constant 'memory', keyed by the cases",
     "def roofline_table(cases, flops_fn, bytes_fn, peak_flops_per_s, bandwidth_bytes_per_s):\n"
     "    return {tuple(case): {'flops': 0, 'bytes': 0, 't_compute_s': 0.0, 't_memory_s': 0.0, 'bound': 'memory'}\n"
     "            for case in cases}\n"),
]
