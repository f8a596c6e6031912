"""What `python -m course measure lab3` times on the grading GPU (course/measure_spec.py reads it: data only).

Question 4.6's cached decode step `gpt2_step(model, token, cache)` with the student's `StaticKVCache`: one new token
per sequence (B of them) after N cached positions, on a GPT-2 XL-shaped model (48 layers, width 1600, 25 heads,
vocabulary 50257; seeded random weights) in float16, at B = 1 and 64 and N = 1024, eager (no CUDA graph), with
cache.length set back to N before each call. FLOP: 2 B (12 L D^2 + V D) for the matmuls and 4 B L (N + 1) D for the
attention; fewest bytes: the weights read once and every layer's cached keys and values read once. Ranked by the
share of this GPU's measured roof at each shape's arithmetic intensity (geometric mean over the shapes).
"""
MEASURE = {
    "setup_cells": ["setup_imports"],
    "rank_by": "roof_share",
    "pieces": [
        {
            "name": "decode_step",
            "function": "gpt2_step",
            "kind": "gpt2_decode",
            "cache_class": "StaticKVCache",
            "cells": ["q4_6_static_kv_cache", "q4_6_gpt2_step"],
            "tests": ["q4_6_kv_cache_tests"],
            "dtype": "float16",
            "flops": "2 * B * (12 * n_layer * n_embd ** 2 + vocab_size * n_embd) + 4 * B * n_layer * (N + 1) * n_embd",
            "bytes": "(12 * n_layer * n_embd ** 2 + vocab_size * n_embd + 2 * n_layer * B * (N + 1) * n_embd) * element_bytes",
            "metric": "gbps",
            "tolerance": 2e-2,
            "warmup": 3,
            "repeat": 10,
            "sets": 2,
            "timeout_s": 90.0,
            "model": {"n_layer": 48, "n_embd": 1600, "n_head": 25, "vocab_size": 50257},
            "tiny_model": {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50},
            "shapes": [
                {"B": 1, "N": 1024},
                {"B": 64, "N": 1024},
            ],
            "tiny_shapes": [
                {"B": 1, "N": 8},
                {"B": 3, "N": 8},
            ],
        },
    ],
}
