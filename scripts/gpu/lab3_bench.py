"""Measure what Lab 3 predicts on this GPU, beside the predictions, and write one JSON file.

Run from the repository root on a CUDA machine: ``python scripts/gpu/lab3_bench.py --out DIR``
(``--quick`` runs a tiny configuration on any device, to check the script itself).

What it measures, for a GPT-2-shaped model with random weights (GPT-2 XL in fp16 by default):
- the decoder stack (``model.transformer``) over B x N tokens without a cache, and one cached decode step
  (B new tokens, N - 1 cached), for a sweep of (B, N), with the "eager" and the "sdpa" attention;
- a forward pass over one token (the fixed cost every pass pays: kernel launches and Python);
- the roofline predictions of Lab 3's counting rules (the reference formulas, repeated here so that the
  script does not depend on a notebook), with the datasheet peaks and with this GPU's measured peaks
  (``utils.measure_roofline``).
Every time is a median of timed calls after warm-up (``utils.benchmark_latency``: CUDA events on a GPU).
``checks`` lists the sanity checks the course's GPU report relies on, each with its outcome.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import utils  # noqa: E402


def forward_counts(B, N, D, H, L, n):
    """(FLOPs, bytes) of a forward pass over B x N tokens without a cache (Lab 3, Question 3.1)."""
    flops = L * (24 * B * N * D * D + 4 * B * N * N * D + 5 * H * B * N * N + 5 * B * N * D)
    nbytes = L * n * (22 * B * N * D + 12 * D * D + 6 * H * B * N * N + 5 * D)
    return flops, nbytes


def decode_counts(B, N, D, H, L, n):
    """(FLOPs, bytes) of one cached decode step, N - 1 tokens cached (Lab 3, Question 4.2)."""
    flops = L * (24 * B * D * D + 4 * B * N * D + 4 * B * H * N + 5 * B * D)
    nbytes = L * n * (20 * B * D + 12 * D * D + 2 * B * N * D + 4 * B * H * N + 5 * D)
    return flops, nbytes


def roofline_ms(flops, nbytes, peak_flops_per_s, bandwidth_bytes_per_s):
    return 1e3 * max(flops / peak_flops_per_s, nbytes / bandwidth_bytes_per_s)


def build_gpt2(shape, vocab_size, dtype, attn_implementation):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**shape, vocab_size=vocab_size, n_positions=1024, bos_token_id=0, eos_token_id=0,
                        attn_implementation=attn_implementation)
    with torch.device(utils.DEVICE):
        model = GPT2LMHeadModel(config)
    return model.to(dtype).eval()


@torch.no_grad()
def measure_case(model, B, N, n_warmup, n_repeat):
    """(no_cache_ms, cache_ms) as in the notebook: DynamicCache reset to N - 1 tokens before each step."""
    from transformers import DynamicCache

    body = model.transformer
    tokens = torch.randint(model.config.vocab_size, (B, N), device=utils.DEVICE)
    no_cache_ms = utils.benchmark_latency(lambda: body(input_ids=tokens, use_cache=False),
                                          n_warmup=n_warmup, n_repeat=n_repeat, measure_on=utils.DEVICE)
    cache = DynamicCache(config=model.config)
    body(input_ids=tokens[:, :-1], past_key_values=cache, use_cache=True)
    filled = [(layer.keys, layer.values) for layer in cache.layers]

    def step():
        for layer, (keys, values) in zip(cache.layers, filled):
            layer.keys, layer.values = keys, values
        return body(input_ids=tokens[:, -1:], past_key_values=cache, use_cache=True)

    cache_ms = utils.benchmark_latency(step, n_warmup=n_warmup, n_repeat=n_repeat, measure_on=utils.DEVICE)
    cache = filled = None  # frees the GPU memory before empty_cache (the closure holds the cells)
    if utils.DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    return no_cache_ms, cache_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for lab3_bench.json")
    parser.add_argument("--quick", action="store_true", help="tiny model and sweep (checks the script on any device)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    on_cuda = utils.DEVICE.type == "cuda"
    dtype = torch.float16 if on_cuda else torch.float32
    n = torch.finfo(dtype).bits // 8
    if args.quick:
        shape, vocab, cases, n_warmup, n_repeat = dict(n_layer=2, n_embd=64, n_head=4), 500, [(1, 8), (2, 16)], 1, 2
    else:
        shape, vocab, n_warmup, n_repeat = dict(n_layer=48, n_embd=1600, n_head=25), 50257, 3, 10
        cases = [(B, N) for B in (1, 8, 64) for N in (32, 256, 1024)]
    D, H, L = shape["n_embd"], shape["n_head"], shape["n_layer"]

    result = {"device": torch.cuda.get_device_name() if on_cuda else "cpu", "gpu_key": utils.detect_gpu(),
              "torch": torch.__version__, "dtype": str(dtype), "shape": shape, "cases": {}, "errors": {},
              "checks": []}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        result["errors"]["transformers"] = "not installed"
        (args.out / "lab3_bench.json").write_text(json.dumps(result, indent=1))
        return 1

    roof = utils.measure_roofline(dtypes=(dtype,))
    measured_peak = next(iter(roof["matmul_tflops"].values())) * 1e12
    measured_bw = roof["bandwidth_tb_s"] * 1e12
    result["measured_roofline"] = {"tflops": measured_peak / 1e12, "tb_s": measured_bw / 1e12}
    peaks = {"measured": (measured_peak, measured_bw)}
    if result["gpu_key"]:
        spec = utils.GPU_SPECS[result["gpu_key"]]
        prefix = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")
        peaks["datasheet"] = (spec[f"{prefix}_tflops"] * 1e12, spec["memory_bandwidth_tb_s"] * 1e12)

    for attn in ("eager", "sdpa"):
        start = time.perf_counter()
        try:
            model = build_gpt2(shape, vocab, dtype, attn)
            one_token = torch.zeros(1, 1, dtype=torch.long, device=utils.DEVICE)
            with torch.no_grad():
                floor_ms = utils.benchmark_latency(lambda: model.transformer(input_ids=one_token, use_cache=False),
                                                   n_warmup=n_warmup, n_repeat=n_repeat, measure_on=utils.DEVICE)
            result[f"{attn}_one_token_ms"] = floor_ms
            for B, N in cases:
                status, measured = utils.run_oom_safe(measure_case, model, B, N, n_warmup, n_repeat)
                row = result["cases"].setdefault(f"{B}x{N}", {"B": B, "N": N})
                row[f"{attn}_status"] = status
                if status == "ok":
                    row[f"{attn}_no_cache_ms"], row[f"{attn}_cache_ms"] = measured
                for name, (peak, bw) in peaks.items():
                    row[f"predicted_no_cache_ms_{name}"] = roofline_ms(*forward_counts(B, N, D, H, L, n), peak, bw)
                    row[f"predicted_cache_ms_{name}"] = roofline_ms(*decode_counts(B, N, D, H, L, n), peak, bw)
                print(f"{attn:5s} B={B:3d} N={N:5d}: {row.get(f'{attn}_no_cache_ms', math.nan):9.3f} ms without cache, "
                      f"{row.get(f'{attn}_cache_ms', math.nan):8.3f} ms cached step ({status})", flush=True)
            model = None  # frees the GPU memory (the lambda above holds the cell)
            if on_cuda:
                torch.cuda.empty_cache()
        except Exception:  # keep the other attention implementation and the report
            result["errors"][attn] = traceback.format_exc()[-2000:]
        result[f"{attn}_seconds"] = time.perf_counter() - start

    def check(name, passed, detail):
        result["checks"].append({"check": name, "passed": bool(passed), "detail": detail})

    rows = [row for row in result["cases"].values() if row.get("eager_status") == "ok"]
    bound = "measured"
    lower_bound_ok = all(row["eager_no_cache_ms"] >= 0.9 * row[f"predicted_no_cache_ms_{bound}"]
                         and row["eager_cache_ms"] >= 0.9 * row[f"predicted_cache_ms_{bound}"] for row in rows)
    check("the roofline (measured peaks) is a lower bound of every eager time, within 10 %", lower_bound_ok,
          "prediction = max(FLOPs / matmul rate, bytes / copy bandwidth)")
    big = result["cases"].get("64x1024", {})
    if big.get("eager_status") == "ok":
        speedup = big["eager_no_cache_ms"] / big["eager_cache_ms"]
        check("the KV cache speeds up B=64, N=1024 by more than 5x", speedup > 5, f"measured {speedup:.1f}x")
    if "eager_one_token_ms" in result and rows:
        small = [row["eager_cache_ms"] for row in rows if row["B"] == 1]
        check("batch-1 cached decode steps cost within 2x of a one-token pass (fixed cost dominates)",
              all(t <= 2 * result["eager_one_token_ms"] for t in small),
              f"one-token pass {result['eager_one_token_ms']:.2f} ms, batch-1 steps {[round(t, 2) for t in small]}")
    (args.out / "lab3_bench.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["checks"], indent=1))
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
