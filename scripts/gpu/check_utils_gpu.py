"""Check utils.py's measurement helpers on a CUDA GPU (written for an H100; any GPU_SPECS GPU works).

Checks, each reported as a row of a table and in ``<out>/check_utils_gpu.json``:

1. ``benchmark_latency`` against ``triton.testing.do_bench`` (medians) on an 8192^3 bf16 matmul and a 256 MiB
   device copy: within 5 %.
2. ``measure_roofline`` against the GPU's ``GPU_SPECS`` ceilings: measured bandwidth and matmul rates must lie
   between 40 % and 102 % of the datasheet (above it means bytes or FLOPs are miscounted, or the entry is wrong).
3. ``count_cuda_kernels`` on a profiled Gemma-3 MLP (bf16): at least 3 gemm and 2 elementwise kernels per step,
   and the total equals an independent count of device events in the exported Chrome trace.
4. ``benchmark_memory`` on a known 1 GiB allocation, ``run_oom_safe`` on a real out-of-memory error (memory is
   back afterwards), ``flash_attn_func`` against a float64 reference (bf16 tolerance), and the KV-cache contract
   of the Gemma-3 helpers on CUDA (prefill S tokens + decode 1 == prefill S+1 tokens, fp32).
5. For information: the Lab 1 Part 3.3 latencies (GEMMA3_PSEUDO_CONFIG, batch 8, 4096 tokens, bf16) and two
   figures (``roofline_measured.png``, ``mlp_timeline.png``).

Usage (from the repository root): ``python scripts/gpu/check_utils_gpu.py --out results/`` (default: $OUT or ".").
``--smoke`` runs every check at tiny sizes, on CPU when there is no GPU (do_bench is then skipped), to test the
script itself. Exit status 1 when a check fails.
"""

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _utils_private  # noqa: E402  (utils.py's plumbing: the config builder)
import utils  # noqa: E402

LATENCY_TOLERANCE = 0.05
ROOFLINE_RANGE = (0.40, 1.02)


class Report:
    """Collects check rows: name, measured, reference, verdict."""

    def __init__(self):
        self.rows = []

    def add(self, check, measured, reference, ok, detail=""):
        self.rows.append({"check": check, "measured": measured, "reference": reference,
                          "status": "skipped" if ok is None else ("pass" if ok else "FAIL"), "detail": detail})
        row = self.rows[-1]
        print(f"  {row['status']:7s} {check}: {_fmt(measured)} vs {_fmt(reference)} {detail}", flush=True)

    @property
    def failed(self):
        return [r for r in self.rows if r["status"] == "FAIL"]

    def table(self):
        widths = [max(len(str(r[k] if k in ("check", "status") else _fmt(r[k]))) for r in self.rows + [
            {"check": "check", "measured": "measured", "reference": "reference", "status": "status"}])
            for k in ("check", "measured", "reference", "status")]
        header = ["check", "measured", "reference", "status"]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
        lines.append("  ".join("-" * w for w in widths))
        for r in self.rows:
            cells = [r["check"], _fmt(r["measured"]), _fmt(r["reference"]), r["status"]]
            lines.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + f"  {r['detail']}")
        return "\n".join(lines)


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def within(measured, reference, tolerance):
    return abs(measured - reference) <= tolerance * abs(reference)


def do_bench_median_ms(fn):
    """Median of triton.testing.do_bench in ms, across triton versions (quantiles API)."""
    from triton.testing import do_bench

    result = do_bench(fn, warmup=25, rep=200, quantiles=[0.5])
    return float(result[0] if isinstance(result, (list, tuple)) else result)


def check_latency(report, device, smoke):
    print("1. benchmark_latency vs triton.testing.do_bench", flush=True)
    n = 256 if smoke else 8192
    copy_bytes = (4 if smoke else 256) * 2**20
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    src = torch.empty(copy_bytes // 4, device=device).uniform_()
    dst = torch.empty_like(src)
    cases = {f"matmul {n}^3 bf16 (ms)": lambda: torch.matmul(a, b),
             f"copy {copy_bytes // 2**20} MiB (ms)": lambda: dst.copy_(src)}
    out = {}
    for name, fn in cases.items():
        ours = utils.benchmark_latency(fn, n_warmup=25, n_repeat=10 if smoke else 200, measure_on=device.type)
        if device.type != "cuda" or importlib.util.find_spec("triton") is None:
            report.add(f"benchmark_latency {name}", ours, "do_bench n/a", None, "(needs CUDA and triton)")
            out[name] = {"benchmark_latency_ms": ours}
            continue
        ref = do_bench_median_ms(fn)
        report.add(f"benchmark_latency {name}", ours, ref, within(ours, ref, LATENCY_TOLERANCE),
                   f"(diff {100 * (ours / ref - 1):+.1f} %, limit {100 * LATENCY_TOLERANCE:.0f} %)")
        out[name] = {"benchmark_latency_ms": ours, "do_bench_ms": ref}
    return out


def check_roofline(report, device, smoke):
    print("2. measure_roofline vs GPU_SPECS", flush=True)
    kwargs = dict(size=256, copy_mb=8, n_repeat=3) if smoke else {}
    measured = utils.measure_roofline(dtypes=(torch.float32, torch.bfloat16, torch.float16), device=device,
                                      **kwargs)
    key = measured["gpu"]
    if key is None:
        for name in ("bandwidth_tb_s", "float32", "bfloat16", "float16"):
            value = measured["bandwidth_tb_s"] if name == "bandwidth_tb_s" else measured["matmul_tflops"][name]
            report.add(f"measure_roofline {name}", value, "no GPU_SPECS entry", None)
        return measured
    spec = utils.GPU_SPECS[key]
    pairs = [("bandwidth (TB/s)", measured["bandwidth_tb_s"], spec["memory_bandwidth_tb_s"]),
             ("fp32 matmul (TFLOP/s)", measured["matmul_tflops"]["float32"], spec["fp32_tflops"]),
             ("bf16 matmul (TFLOP/s)", measured["matmul_tflops"]["bfloat16"], spec["bf16_tflops"]),
             ("fp16 matmul (TFLOP/s)", measured["matmul_tflops"]["float16"], spec["fp16_tflops"])]
    lo, hi = ROOFLINE_RANGE
    for name, value, ceiling in pairs:
        ratio = value / ceiling
        ok = None if smoke else lo <= ratio <= hi
        report.add(f"measure_roofline {name} on {key}", value, ceiling, ok,
                   f"({100 * ratio:.0f} % of datasheet, expected {100 * lo:.0f}-{100 * hi:.0f} %)")
    return measured


class GemmaMLP(nn.Module):
    """Gemma-3 MLP: down(gelu_tanh(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden, intermediate):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def check_kernel_counts(report, device, smoke, out_dir):
    print("3. count_cuda_kernels on a profiled MLP", flush=True)
    from torch.profiler import profile

    config = utils.GEMMA3_270M_CONFIG
    mlp = GemmaMLP(config.hidden_size, config.intermediate_size).to(device=device, dtype=torch.bfloat16)
    x = torch.randn(4, 64 if smoke else 1024, config.hidden_size, device=device, dtype=torch.bfloat16)
    with torch.no_grad(), profile(schedule=utils.default_schedule) as prof:
        for _ in range(10):
            mlp(x)
            prof.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    counts = utils.count_cuda_kernels(prof)
    per_step = utils.count_cuda_kernels(prof, per_step=True)
    trace_path = out_dir / "mlp_trace.json"
    prof.export_chrome_trace(str(trace_path))
    with open(trace_path) as f:
        trace = json.load(f)
    device_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    independent = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in device_cats)
    on_cuda = counts["device"] == "cuda"
    report.add("count_cuda_kernels MLP total (5 steps)", counts["total"], independent if on_cuda else "n/a",
               (counts["total"] == independent) if on_cuda else None,
               "(trace's kernel+memcpy+memset events)" if on_cuda else "(CPU: operator calls)")
    report.add("count_cuda_kernels MLP per step (gemm, elementwise)", (per_step["gemm"], per_step["elementwise"]),
               "(>=3, >=2)", per_step["gemm"] >= 3 and per_step["elementwise"] >= 2 and counts["steps"] == 5,
               f"per step {per_step}")
    fig, _ = utils.plot_trace_timeline(trace_path, title="Gemma-3 MLP forward, bf16 (5 profiled steps)")
    fig.savefig(out_dir / "mlp_timeline.png", dpi=120)
    return {"counts": counts, "per_step": per_step, "trace_device_events": independent}


def reference_attention(q, k, v, causal):
    q, k, v = (t.double() for t in (q, k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        q_len, kv_len = q.shape[1], k.shape[1]
        allowed = torch.arange(kv_len, device=q.device)[None] <= torch.arange(q_len, device=q.device)[:, None] + (
            kv_len - q_len)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def load_handout_layer_classes():
    spec = importlib.util.spec_from_file_location("test_utils", REPO / "tests" / "test_utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._handout_layer_classes()


def check_helpers(report, device, smoke):
    print("4. benchmark_memory, run_oom_safe, flash_attn_func, Gemma-3 helpers", flush=True)
    out = {}
    size = 2**20 if smoke else 2**30
    peak_gb, allocated_gb = utils.benchmark_memory(torch.empty, size, dtype=torch.uint8, device=device,
                                                   n_warmup=1, n_repeat=3)
    report.add("benchmark_memory of a 1 GiB tensor (GB)" if not smoke else "benchmark_memory 1 MiB (GB)",
               peak_gb, size / 1e9, within(peak_gb, size / 1e9, 0.01) and within(allocated_gb, size / 1e9, 0.01))
    out["benchmark_memory"] = {"peak_gb": peak_gb, "allocated_gb": allocated_gb}

    if device.type == "cuda":
        before = torch.cuda.memory_allocated()
        status, result = utils.run_oom_safe(torch.empty, 10**15, dtype=torch.uint8, device=device)
        after = torch.cuda.memory_allocated()
        report.add("run_oom_safe on a 1 PB allocation", status, "oom", status == "oom" and result is None and
                   after == before, f"(allocated before {before}, after {after} bytes)")
        out["run_oom_safe"] = status

    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for causal, (q_len, kv_len) in ((False, (512, 512)), (True, (512, 512)), (True, (128, 512))):
        q = torch.randn(2, q_len, 8, 128, device=device, dtype=dtype)
        k = torch.randn(2, kv_len, 8, 128, device=device, dtype=dtype)
        v = torch.randn(2, kv_len, 8, 128, device=device, dtype=dtype)
        error = (utils.flash_attn_func(q, k, v, causal=causal).double()
                 - reference_attention(q, k, v, causal)).abs().max().item()
        limit = 2e-2 if dtype == torch.bfloat16 else 1e-5
        report.add(f"flash_attn_func causal={causal} {q_len}x{kv_len} max abs error", error, limit, error <= limit,
                   f"({utils.flash_attn_func.last_backend})")
    out["attention_backend"] = utils.flash_attn_func.last_backend

    handout = load_handout_layer_classes()
    config = _utils_private.make_gemma3_config(**{
        **utils._GEMMA3_COMMON, **dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=64, query_pre_attn_scalar=64)})
    torch.manual_seed(0)
    layer = handout.Gemma3DecoderLayer(config, 1).to(device).eval()
    rotary = handout.Gemma3RotaryEmbedding(config, layer_type="full_attention")
    B, S, n_layers = 2, 37, 4
    tokens = torch.randn(B, S + 1, config.hidden_size, device=device)
    _, pos_full = utils.create_prefill_inputs(B, S + 1, config.hidden_size, device=device)
    full = utils.multi_layer_prefill_forward(n_layers, layer, tokens, pos_full,
                                             utils.get_position_embeddings(tokens, pos_full, rotary),
                                             utils.initialize_kv_cache(config, S + 1))
    cache = utils.initialize_kv_cache(config, S + 1)
    _, pos = utils.create_prefill_inputs(B, S, config.hidden_size, device=device)
    utils.multi_layer_prefill_forward(n_layers, layer, tokens[:, :S], pos,
                                      utils.get_position_embeddings(tokens[:, :S], pos, rotary), cache)
    _, dec_pos, cache_pos = utils.create_decode_inputs_with_cache(B, S, config.hidden_size, device=device)
    decoded = utils.multi_layer_decode_forward(n_layers, layer, tokens[:, S:], dec_pos,
                                               utils.get_position_embeddings(tokens[:, S:], dec_pos, rotary),
                                               cache, cache_pos, True, None)
    error = (decoded - full[:, S:]).abs().max().item()
    report.add("KV-cache contract (decode == last token of full prefill), fp32", error, 1e-3, error <= 1e-3)
    out["kv_cache_contract_max_abs_error"] = error
    return out


def handout_part_3_3(report, device, smoke):
    print("5. Lab 1 Part 3.3 latencies (information)", flush=True)
    handout = load_handout_layer_classes()
    config = utils.GEMMA3_PSEUDO_CONFIG
    batch, seq = (1, 64) if smoke else (8, 4096)
    num_layers = 2 if smoke else config.num_hidden_layers
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    layer = handout.Gemma3DecoderLayer(config, 5).to(device=device, dtype=dtype)
    rotary = handout.Gemma3RotaryEmbedding(config, layer_type="full_attention")
    reps = dict(n_warmup=1, n_repeat=2) if smoke else dict(n_warmup=3, n_repeat=10)
    hidden = config.hidden_size
    prefill, pos = utils.create_prefill_inputs(batch, seq, hidden, dtype=dtype, device=device)
    cache = utils.initialize_kv_cache(config, max_cache_len=seq + 1)
    prefill_ms = utils.benchmark_latency(utils.multi_layer_prefill_forward, num_layers, layer=layer,
                                         hidden_states=prefill, position_ids=pos,
                                         position_embeddings=utils.get_position_embeddings(prefill, pos, rotary),
                                         past_key_values=cache, **reps)
    dec, dpos, prefill_states = utils.create_decode_inputs_without_cache(batch, seq, hidden, dtype=dtype,
                                                                         device=device)
    no_cache_ms = utils.benchmark_latency(utils.multi_layer_decode_forward, num_layers, layer=layer,
                                          hidden_states=dec, position_ids=dpos,
                                          position_embeddings=utils.get_position_embeddings(dec, dpos, rotary),
                                          past_key_values=None, cache_positions=None, use_kv_cache=False,
                                          prefill_hidden_states=prefill_states, **reps)
    dec, dpos, cpos = utils.create_decode_inputs_with_cache(batch, seq, hidden, dtype=dtype, device=device)
    cache_ms = utils.benchmark_latency(utils.multi_layer_decode_forward, num_layers, layer=layer,
                                       hidden_states=dec, position_ids=dpos,
                                       position_embeddings=utils.get_position_embeddings(dec, dpos, rotary),
                                       past_key_values=cache, cache_positions=cpos, use_kv_cache=True,
                                       prefill_hidden_states=None, **reps)
    name = f"B={batch} S={seq} {num_layers} layers {str(dtype).replace('torch.', '')}"
    report.add(f"Part 3.3 prefill {name} (ms)", prefill_ms, "-", None, "(information)")
    report.add(f"Part 3.3 decode without cache {name} (ms)", no_cache_ms, "-", None, "(information)")
    report.add(f"Part 3.3 decode with cache {name} (ms)", cache_ms, "-", None,
               f"(KV cache speedup {no_cache_ms / cache_ms:.1f}x)")
    return {"prefill_ms": prefill_ms, "decode_without_cache_ms": no_cache_ms, "decode_with_cache_ms": cache_ms,
            "batch": batch, "seq_len": seq, "num_layers": num_layers}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON and figures")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU when there is no GPU")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available() and not args.smoke:
        parser.error("no CUDA GPU found (use --smoke to test the script on CPU)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    utils.print_environment_report("check_utils_gpu")

    report, results = Report(), {}
    started = time.time()
    results["latency"] = check_latency(report, device, args.smoke)
    results["roofline"] = check_roofline(report, device, args.smoke)
    results["kernel_counts"] = check_kernel_counts(report, device, args.smoke, out_dir)
    results["helpers"] = check_helpers(report, device, args.smoke)
    results["part_3_3"] = handout_part_3_3(report, device, args.smoke)

    roofline = results["roofline"]
    key = roofline["gpu"]
    if key is not None:
        spec = utils.GPU_SPECS[key]
        ops = {f"matmul {roofline['matmul_n']}^3 {d}": (2 * roofline["matmul_n"] ** 3 / (
            3 * roofline["matmul_n"] ** 2 * (4 if d == "float32" else 2)), tflops)
            for d, tflops in roofline["matmul_tflops"].items() if d != "float16"}
        fig, _ = utils.plot_roofline(key, spec["bf16_tflops"], spec["memory_bandwidth_tb_s"], ops,
                                     title=f"{key}: datasheet roofline (bf16) and measured matmuls")
        fig.savefig(out_dir / "roofline_measured.png", dpi=120)

    summary = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "CPU",
        "gpu_specs_key": utils.detect_gpu(),
        "torch": torch.__version__,
        "smoke": args.smoke,
        "seconds": round(time.time() - started, 1),
        "checks": report.rows,
        "results": results,
        "passed": not report.failed,
    }
    with open(out_dir / "check_utils_gpu.json", "w") as f:
        json.dump(summary, f, indent=2, default=str)
    print()
    print(report.table())
    print(f"\n{len(report.failed)} failed of {len(report.rows)} rows; JSON and figures in {out_dir.resolve()}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
