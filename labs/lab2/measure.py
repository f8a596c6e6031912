"""What `python -m course measure lab2` times on the grading GPU (course/measure_spec.py reads it: data only).

Question 4.3's Triton FlashAttention forward, through the lab's own locked wrapper `triton_attention_forward(q, k, v,
causal)` (q, k, v of shape (B, S, H, D), bf16), at S = 1k, 4k and 16k (16k tokens per call: B = 16k / S), head
dimension 64 and 128, causal and not. FLOP: 4 B H S^2 D (two matmuls of 2 S^2 D per head; half of it with the causal
mask). Bytes: q, k, v read once and the output written once, plus the float32 log-sum-exp. Ranked by the share of
this GPU's measured roof at each shape's arithmetic intensity (geometric mean over the shapes).
"""
MEASURE = {
    "setup_cells": ["setup_imports"],
    "rank_by": "roof_share",
    "pieces": [
        {
            "name": "triton_forward",
            "function": "triton_attention_forward",
            "kind": "attention_bshd",
            "cells": ["q4_3_triton_forward", "triton_launcher"],
            "tests": ["q4_3_triton_forward_tests"],
            "dtype": "bfloat16",
            "tiny_dtype": "float32",
            "flops": "4 * B * H * S * S * D * (0.5 if causal else 1)",
            "bytes": "4 * B * S * H * D * element_bytes + 4 * B * H * S",
            "metric": "tflops",
            "tolerance": 2e-2,
            "warmup": 3,
            "repeat": 10,
            "timeout_s": 60.0,
            "shapes": [
                {"B": 16, "S": 1024, "H": 16, "D": 64, "causal": False},
                {"B": 16, "S": 1024, "H": 16, "D": 64, "causal": True},
                {"B": 16, "S": 1024, "H": 16, "D": 128, "causal": False},
                {"B": 16, "S": 1024, "H": 16, "D": 128, "causal": True},
                {"B": 4, "S": 4096, "H": 16, "D": 64, "causal": False},
                {"B": 4, "S": 4096, "H": 16, "D": 64, "causal": True},
                {"B": 4, "S": 4096, "H": 16, "D": 128, "causal": False},
                {"B": 4, "S": 4096, "H": 16, "D": 128, "causal": True},
                {"B": 1, "S": 16384, "H": 16, "D": 64, "causal": False},
                {"B": 1, "S": 16384, "H": 16, "D": 64, "causal": True},
                {"B": 1, "S": 16384, "H": 16, "D": 128, "causal": False},
                {"B": 1, "S": 16384, "H": 16, "D": 128, "causal": True},
            ],
            "tiny_shapes": [
                {"B": 1, "S": 40, "H": 2, "D": 16, "causal": False},
                {"B": 1, "S": 40, "H": 2, "D": 16, "causal": True},
            ],
        },
    ],
}
