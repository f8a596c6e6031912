"""What `python -m course measure lab1` times on the grading GPU (course/measure_spec.py reads it: data only).

Question 3.1.1's `scaled_dot_product_attention(q, k, v)` (q, k, v of shape (B, H, L, d), float16, no mask) and
Question 4.3.1's `gelu_tanh_python(x)` (float32, N elements). Attention FLOP: 4 B H L^2 d (the two matmuls; the
softmax's few FLOP per score are left out); its fewest bytes: q, k, v read and the output written once (what a fused
kernel moves; a from-scratch version also writes and reads the L x L scores, which is why it sits far below the
roof). GeLU FLOP: about 8 per element (the polynomial and the tanh counted as one); bytes: x read once and the output
written once (the separate elementwise operations read and write N elements each, which a fused kernel would not).
Ranked by the share of this GPU's measured roof at each shape's arithmetic intensity (geometric mean over the shapes
of both pieces).
"""
MEASURE = {
    "setup_cells": ["setup_imports"],
    "rank_by": "roof_share",
    "pieces": [
        {
            "name": "attention",
            "function": "scaled_dot_product_attention",
            "kind": "attention_bhsd",
            "cells": ["q3_1_1_sdpa"],
            "tests": ["q3_1_1_sdpa_tests"],
            "dtype": "float16",
            "flops": "4 * B * H * S * S * D",
            "bytes": "4 * B * H * S * D * element_bytes",
            "metric": "tflops",
            "tolerance": 1e-2,
            "warmup": 3,
            "repeat": 10,
            "timeout_s": 60.0,
            "shapes": [
                {"B": 4, "S": 1024, "H": 16, "D": 64},
                {"B": 1, "S": 4096, "H": 16, "D": 64},
            ],
            "tiny_shapes": [
                {"B": 1, "S": 24, "H": 2, "D": 8},
            ],
        },
        {
            "name": "gelu",
            "function": "gelu_tanh_python",
            "kind": "gelu_tanh",
            "cells": ["q4_3_1_gelu"],
            "tests": ["q4_3_1_gelu_tests"],
            "dtype": "float32",
            "flops": "8 * N",
            "bytes": "2 * N * element_bytes",
            "metric": "gbps",
            "tolerance": 1e-4,
            "warmup": 3,
            "repeat": 10,
            "timeout_s": 60.0,
            "shapes": [
                {"N": 16777216},
                {"N": 67108864},
            ],
            "tiny_shapes": [
                {"N": 1000},
            ],
        },
    ],
}
