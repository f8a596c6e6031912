"""Measure what Lab 1 teaches on this GPU, beside what theory predicts, and write one JSON file.

Run from the repository root on a CUDA machine (scripts/gpu/run_reports.sh does):
``python scripts/gpu/lab1_measure.py --out DIR``. Every number is a median of timed calls after warm-up
(``utils.benchmark_latency``, CUDA events). Predictions use the *measured* ceilings of this GPU
(``utils.measure_roofline``): time >= max(FLOPs / matmul rate, bytes / copy bandwidth). The sanity checks of the
course's GPU report are evaluated here and listed under ``checks``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import utils  # noqa: E402
from course.common.notebooks import exec_cells  # noqa: E402

RESULTS: dict = {"sections": {}, "errors": {}, "checks": []}


def section(name):
    """Run one measurement section; record its error instead of stopping the others."""
    def wrap(fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                RESULTS["sections"][name] = fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a report records failures, it does not hide them
                RESULTS["errors"][name] = traceback.format_exc()[-2000:]
            finally:
                torch.cuda.empty_cache()
                print(f"[{name}] {time.perf_counter() - start:.1f} s", flush=True)
        return run
    return wrap


def check(name: str, passed: bool, detail: str) -> None:
    RESULTS["checks"].append({"name": name, "passed": bool(passed), "detail": detail})
    print(f"CHECK {'PASS' if passed else 'FAIL'}: {name}: {detail}", flush=True)


def predicted_ms(flops: float, bytes_moved: float, ceilings: dict, dtype: str) -> dict:
    """Roofline time in ms from FLOPs and bytes, with measured ceilings; and which bound dominates."""
    compute_ms = flops / (ceilings["matmul_tflops"][dtype] * 1e12) * 1e3
    memory_ms = bytes_moved / (ceilings["bandwidth_tb_s"] * 1e12) * 1e3
    return {"flops": flops, "bytes": bytes_moved, "compute_ms": compute_ms, "memory_ms": memory_ms,
            "predicted_ms": max(compute_ms, memory_ms), "bound": "compute" if compute_ms > memory_ms else "memory"}


def with_ratio(measured_ms: float, prediction: dict) -> dict:
    return {**prediction, "measured_ms": measured_ms, "measured_over_predicted": measured_ms / prediction["predicted_ms"]}


def gelu_tanh_python(x):
    """GeLU (tanh approximation) written as separate PyTorch ops: the unfused version students write."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def load_lab_classes() -> dict:
    """The Gemma-3 decoder-layer code cell of Lab 1, executed: the classes the notebook measures."""
    return exec_cells(REPO / "source" / "lab1" / "lab1.ipynb", ["setup_imports", "gemma3_decoder_layer"])


@section("roofline")
def measure_ceilings():
    measured = utils.measure_roofline(dtypes=(torch.float32, torch.bfloat16, torch.float16))
    gpu = measured.get("gpu")
    spec = utils.GPU_SPECS.get(gpu, {}) if gpu else {}
    measured["datasheet"] = {
        "gpu": gpu,
        "bandwidth_tb_s": spec.get("memory_bandwidth_tb_s"),
        "float32_tflops": spec.get("fp32_tflops"),
        "bfloat16_tflops": spec.get("bf16_tflops"),
        "float16_tflops": spec.get("fp16_tflops"),
    }
    return measured


@section("matmul_8192_bf16")
def matmul_check(ceilings):
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = utils.benchmark_latency(torch.matmul, a, b, n_warmup=10, n_repeat=50)
    tflops = 2 * n**3 / (ms * 1e-3) / 1e12
    ratio = tflops / ceilings["matmul_tflops"]["bfloat16"]
    check("8192^3 bf16 matmul through benchmark_latency reaches >= 80% of the measured matmul ceiling",
          ratio >= 0.8, f"{tflops:.0f} TFLOP/s = {ratio:.0%} of {ceilings['matmul_tflops']['bfloat16']:.0f}")
    return {"latency_ms": ms, "tflops": tflops, "fraction_of_ceiling": ratio}


@section("gemm_vs_matmul")
def gemm_vs_matmul(ceilings):
    def gemm(A, B):  # the tri-loop of Question 1.1: one tiny kernel per multiply-add on a GPU
        n, k = A.shape
        m = B.shape[1]
        C = torch.zeros(n, m, device=A.device, dtype=A.dtype)
        for i in range(n):
            for j in range(m):
                for p in range(k):
                    C[i, j] += A[i, p] * B[p, j]
        return C

    rows = []
    for n in (8, 16, 32):
        a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
        loop_ms = utils.benchmark_latency(gemm, a, b, n_warmup=1, n_repeat=3)
        mm_ms = utils.benchmark_latency(torch.matmul, a, b, n_warmup=10, n_repeat=100)
        pred = predicted_ms(2 * n**3, 4 * 3 * n * n, ceilings, "float32")
        rows.append({"n": n, "gemm_ms": loop_ms, "matmul_ms": mm_ms, "speedup": loop_ms / mm_ms,
                     "predicted_ms": pred["predicted_ms"], "matmul_over_predicted": mm_ms / pred["predicted_ms"]})
    for n in (1024, 4096, 8192):
        a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
        mm_ms = utils.benchmark_latency(torch.matmul, a, b, n_warmup=5, n_repeat=20)
        pred = predicted_ms(2 * n**3, 4 * 3 * n * n, ceilings, "float32")
        rows.append({"n": n, "gemm_ms": None, "matmul_ms": mm_ms, "speedup": None,
                     "predicted_ms": pred["predicted_ms"], "matmul_over_predicted": mm_ms / pred["predicted_ms"]})
    return rows


def decoder_layer_costs(cfg, batch: int, q_len: int, kv_len: int, recompute_kv: bool) -> tuple[float, float]:
    """FLOPs and bf16 bytes of one Gemma-3 decoder layer step (weights read once; activations ignored
    except the KV cache, which decode reads in full). ``recompute_kv``: K/V projections run over all kv_len."""
    d, h, kv, dh, inter = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
    q_o_params = 2 * d * h * dh
    kv_params = 2 * d * kv * dh
    mlp_params = 3 * d * inter
    kv_tokens = kv_len if recompute_kv else q_len
    flops = 2 * batch * (q_len * (q_o_params + mlp_params) + kv_tokens * kv_params)
    flops += 4 * batch * h * q_len * kv_len * dh  # QK^T and AV
    bytes_moved = 2 * (q_o_params + kv_params + mlp_params)
    bytes_moved += 2 * 2 * batch * kv * kv_len * dh  # K and V read by attention
    bytes_moved += 2 * 2 * batch * q_len * d  # layer input and output
    return flops, bytes_moved


def eager_and_graphed(fn, *args, **kwargs) -> dict:
    """``utils.benchmark_eager_and_graphed`` of one step, plus the kernels the step launches (eager profile)."""
    times = utils.benchmark_eager_and_graphed(fn, *args, n_warmup=3, n_repeat=20, **kwargs)
    kernels = utils.count_kernels_per_call(fn, *args, **kwargs)
    times["kernels_per_step"], times["elementwise_kernels_per_step"] = kernels["total"], kernels["elementwise"]
    return times


@section("prefill_decode")
def prefill_decode(ceilings):
    ns = load_lab_classes()
    cfg = utils.GEMMA3_PSEUDO_CONFIG
    batch, seq_len, layers = 8, 4096, cfg.num_hidden_layers
    layer = ns["Gemma3DecoderLayer"](cfg, 5).to(device="cuda", dtype=torch.bfloat16)
    rotary = ns["Gemma3RotaryEmbedding"](cfg, layer_type="full_attention").to("cuda")
    hidden = cfg.hidden_size
    out = {"batch": batch, "seq_len": seq_len, "layers": layers}
    with torch.no_grad():
        x, pos = utils.create_prefill_inputs(batch, seq_len, hidden, dtype=torch.bfloat16, device="cuda")
        emb = utils.get_position_embeddings(x, pos, rotary, layer_type="full_attention")
        cache = utils.initialize_kv_cache(config=cfg, max_cache_len=seq_len + 1)
        ms = utils.benchmark_latency(utils.multi_layer_prefill_forward, layers, layer=layer, hidden_states=x,
                                     position_ids=pos, position_embeddings=emb, past_key_values=cache,
                                     n_warmup=2, n_repeat=5)
        f, b = decoder_layer_costs(cfg, batch, seq_len, seq_len, True)
        out["prefill"] = with_ratio(ms, predicted_ms(layers * f, layers * b, ceilings, "bfloat16"))
        kernels = utils.count_kernels_per_call(lambda: utils.multi_layer_prefill_forward(layers, layer, x, pos, emb, cache))
        out["prefill"]["kernels_per_step"], out["prefill"]["elementwise_kernels_per_step"] = kernels["total"], kernels["elementwise"]
        x = emb = None  # frees the GPU memory (the lambda above holds the cells)
        dx, dpos, prefill_hidden = utils.create_decode_inputs_without_cache(batch, seq_len, hidden, dtype=torch.bfloat16, device="cuda")
        demb = utils.get_position_embeddings(dx, dpos, rotary, layer_type="full_attention")
        times = eager_and_graphed(utils.multi_layer_decode_forward, layers, layer=layer, hidden_states=dx,
                                  position_ids=dpos, position_embeddings=demb, past_key_values=None,
                                  cache_positions=None, use_kv_cache=False, prefill_hidden_states=prefill_hidden)
        f, b = decoder_layer_costs(cfg, batch, 1, seq_len + 1, True)
        out["decode_without_cache"] = {**with_ratio(times["measured_ms"], predicted_ms(layers * f, layers * b, ceilings, "bfloat16")),
                                       **times}
        del prefill_hidden
        dx, dpos, cache_pos = utils.create_decode_inputs_with_cache(batch, seq_len, hidden, dtype=torch.bfloat16, device="cuda")
        demb = utils.get_position_embeddings(dx, dpos, rotary, layer_type="full_attention")
        times = eager_and_graphed(utils.multi_layer_decode_forward, layers, layer=layer, hidden_states=dx,
                                  position_ids=dpos, position_embeddings=demb, past_key_values=cache,
                                  cache_positions=cache_pos, use_kv_cache=True, prefill_hidden_states=None)
        f, b = decoder_layer_costs(cfg, batch, 1, seq_len + 1, False)
        cached_prediction = predicted_ms(layers * f, layers * b, ceilings, "bfloat16")
        out["decode_with_cache"] = {**with_ratio(times["measured_ms"], cached_prediction), **times}
        compiled = utils.benchmark_compiled_and_graphed(
            utils.multi_layer_decode_forward, layers, layer=layer, hidden_states=dx, position_ids=dpos,
            position_embeddings=demb, past_key_values=cache, cache_positions=cache_pos, use_kv_cache=True,
            prefill_hidden_states=None, n_warmup=3, n_repeat=20)
        kernels = compiled.pop("kernels")
        out["decode_with_cache_compiled"] = {**with_ratio(compiled["measured_ms"], cached_prediction), **compiled,
                                             "eager_ms": compiled["compiled_ms"], "kernels_per_step": kernels["total"],
                                             "elementwise_kernels_per_step": kernels["elementwise"],
                                             "compile_mode": "default"}
    no_cache, cached = out["decode_without_cache"], out["decode_with_cache"]
    speedup = no_cache["measured_ms"] / cached["measured_ms"]
    out["kv_cache_speedup"] = speedup
    out["kv_cache_speedup_eager"] = no_cache["eager_ms"] / cached["eager_ms"]
    out["kv_cache_speedup_predicted"] = no_cache["predicted_ms"] / cached["predicted_ms"]
    check("KV-cache decode beats decode without cache", speedup > 1.0, f"{speedup:.1f}x faster with the cache")
    compiled = out["decode_with_cache_compiled"]
    check("KV-cache decode step (torch.compile + CUDA graph) within 2x of its roofline",
          compiled["measured_over_predicted"] <= 2.0,
          f"{compiled['measured_ms']:.2f} ms against {compiled['predicted_ms']:.2f} ms predicted "
          f"({compiled['kernels_per_step']} kernels; CUDA graph without compiling: {cached['measured_ms']:.2f} ms, "
          f"{cached['kernels_per_step']} kernels)")
    return out


@section("gelu")
def gelu(ceilings):
    rows = []
    compiled = torch.compile(gelu_tanh_python)
    fused = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    for numel in (1_000_000, 2**28):
        x = torch.randn(numel, device="cuda")
        bytes_moved = 2 * 4 * numel
        row = {"numel": numel, "bytes_min": bytes_moved}
        for name, fn in (("python_eager", gelu_tanh_python), ("fused", fused), ("compiled", compiled)):
            ms = utils.benchmark_latency(fn, x, n_warmup=10, n_repeat=50)
            row[name] = with_ratio(ms, predicted_ms(8 * numel, bytes_moved, ceilings, "float32"))
            row[name]["achieved_tb_s"] = bytes_moved / (ms * 1e-3) / 1e12
            if numel == 1_000_000:
                row[name]["kernels_per_call"] = utils.count_kernels_per_call(fn, x)["total"]
        rows.append(row)
        del x
    big = rows[-1]
    frac = big["fused"]["achieved_tb_s"] / ceilings["bandwidth_tb_s"]
    check("fused GeLU reaches >= 70% of measured copy bandwidth", frac >= 0.7,
          f"{big['fused']['achieved_tb_s']:.2f} TB/s = {frac:.0%} of {ceilings['bandwidth_tb_s']:.2f} TB/s at {big['numel']} fp32 elements")
    return rows


@section("mlp")
def mlp(ceilings):
    ns = load_lab_classes()
    cfg = utils.GEMMA3_270M_CONFIG
    batch, seq = 4, 1024
    x = torch.randn(batch, seq, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    d, inter = cfg.hidden_size, cfg.intermediate_size
    flops = 2 * batch * seq * 3 * d * inter + 9 * batch * seq * inter
    bytes_moved = 2 * (3 * d * inter + 2 * batch * seq * d)
    pred = predicted_ms(flops, bytes_moved, ceilings, "bfloat16")
    out = {"batch": batch, "seq_len": seq}
    with torch.no_grad():
        for name, mode in (("eager", None), ("compiled", "max-autotune-no-cudagraphs"), ("cuda_graphs", "max-autotune")):
            model = ns["Gemma3MLP"](cfg).to(device="cuda", dtype=torch.bfloat16)
            fn = model if mode is None else torch.compile(model, mode=mode)
            start = time.perf_counter()
            fn(x)
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - start
            ms = utils.benchmark_latency(fn, x, n_warmup=10, n_repeat=50)
            out[name] = {**with_ratio(ms, pred), "first_call_s": first_call_s,
                         "kernels_per_call": utils.count_kernels_per_call(fn, x)["total"]}
    return out


def reference_sdpa(q, k, v):
    """Attention that materializes the L x L matrix (the lab's from-scratch SDPA)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@section("flash_attention")
def flash(ceilings):
    heads, dim = 16, 128
    rows = []
    for seq in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        q, k, v = (torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.float16) for _ in range(3))
        qf, kf, vf = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        flops = 4 * heads * seq * seq * dim
        row = {"seq_len": seq, "attn_matrix_gb": heads * seq * seq * 2 / 1e9}
        status, sdpa_ms = utils.run_oom_safe(utils.benchmark_latency, reference_sdpa, q, k, v, n_warmup=2, n_repeat=5)
        if status == "ok":
            _, mem = utils.run_oom_safe(utils.benchmark_memory, reference_sdpa, q, k, v, n_warmup=1, n_repeat=3)
            row["sdpa"] = with_ratio(sdpa_ms, predicted_ms(flops, 2 * (4 * heads * seq * dim + 4 * heads * seq * seq), ceilings, "float16"))
            row["sdpa"]["peak_gb"] = mem[0] if mem else None
        row["sdpa_status"] = status
        status, fa_ms = utils.run_oom_safe(utils.benchmark_latency, utils.flash_attn_func, qf, kf, vf, n_warmup=3, n_repeat=10)
        if status == "ok":
            _, mem = utils.run_oom_safe(utils.benchmark_memory, utils.flash_attn_func, qf, kf, vf, n_warmup=1, n_repeat=3)
            row["flash"] = with_ratio(fa_ms, predicted_ms(flops, 2 * 4 * heads * seq * dim, ceilings, "float16"))
            row["flash"]["peak_gb"] = mem[0] if mem else None
        row["flash_status"] = status
        if "sdpa" in row and "flash" in row:
            row["speedup"] = row["sdpa"]["measured_ms"] / row["flash"]["measured_ms"]
        rows.append(row)
        del q, k, v, qf, kf, vf
        torch.cuda.empty_cache()
    fitted = [r["seq_len"] for r in rows if r["sdpa_status"] == "ok"]
    long_rows = [r for r in rows if r["seq_len"] >= 4096 and "speedup" in r]
    check("FlashAttention beats SDPA at sequence length 4096 and above",
          bool(long_rows) and all(r["speedup"] > 1 for r in long_rows),
          ", ".join(f"{r['seq_len']}: {r['speedup']:.1f}x" for r in long_rows))
    kernels = {}
    q, k, v = (torch.randn(2, 12, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        kernels["sdpa_from_scratch"] = utils.count_kernels_per_call(reference_sdpa, q, k, v)
        kernels["flash"] = utils.count_kernels_per_call(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), q, k, v)
    return {"rows": rows, "longest_sdpa_seq_len": max(fitted) if fitted else None, "kernels_per_call": kernels,
            "attention_backend": utils.ATTENTION_BACKEND}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("lab1_measure: no CUDA device; this script measures a GPU")
        return 2
    RESULTS["device"] = torch.cuda.get_device_name()
    RESULTS["torch"] = torch.__version__
    measure_ceilings()
    ceilings = RESULTS["sections"].get("roofline")
    if ceilings:
        matmul_check(ceilings)
        gemm_vs_matmul(ceilings)
        prefill_decode(ceilings)
        gelu(ceilings)
        mlp(ceilings)
        flash(ceilings)
    out = Path(args.out) / "lab1_measurements.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(RESULTS, indent=1, default=str))
    print(f"wrote {out}; errors in: {sorted(RESULTS['errors']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
