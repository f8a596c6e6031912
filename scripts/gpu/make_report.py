"""Turn the JSON that the GPU run wrote into the committed reports ``reports/<lab>-<card>.md`` (card: ``h200``...).

Usage: ``python scripts/gpu/make_report.py RESULTS_DIR [--out reports]``, where RESULTS_DIR holds what
``scripts/gpu/run_reports.sh`` packed (``lab1_measurements.json``, ``lab1_run.json``, ``check_utils_gpu.json``,
figures). Every number in the report comes from those files; predictions are the roofline times computed from
FLOPs and bytes with the *measured* ceilings of the same GPU.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def points_text(graded: dict) -> str:
    """A reference run's autograded points as the lab states them, "46/46 + 10 bonus" (the gradebook's score holds the
    bonus on top of the core maximum; a run short of full marks shows its score as it is)."""
    score, maximum = graded.get("autograded_score"), graded.get("autograded_max")
    if score is None or maximum is None:
        return "-"
    if graded.get("cells_short_of_full_marks") or score < maximum:
        return f"{score:g} (bonus included)/{maximum:g}"
    return f"{maximum:g}/{maximum:g}" + (f" + {score - maximum:g} bonus" if score > maximum else "")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def measured_vs_predicted(name: str, entry: dict) -> list:
    return [name, entry.get("measured_ms"), entry.get("predicted_ms"), entry.get("bound"), entry.get("measured_over_predicted")]


def _autograde_step(results: Path, lab: str) -> dict | None:
    """The record of the ``autograde`` step for ``lab`` (``<lab>_autograde.json``), or None.

    The step grades exactly as TAs grade, so when both exist its result is reported instead of the teaching-scale
    run's own autograde (the report says which one it shows).
    """
    path = results / f"{lab}_autograde.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_section(run: dict, lab: str, later_autograde: dict | None = None) -> list[str]:
    """Wall time per part of the teaching-scale run, and the autograde time of one submission.

    ``later_autograde``: the record of the ``autograde`` step (``<lab>_autograde.json``), which replaces the run's
    own autograde result and is named as such.
    """
    tr = run.get("teaching_run", {})
    ag = (later_autograde or {}).get("autograde") or run.get("autograde", {})
    out = ["## Wall time", "",
           f"The reference notebook `source/{lab}/{lab}.ipynb` ran top to bottom at teaching scale on "
           f"{run.get('device')} (torch {run.get('torch')}) in **{fmt(tr.get('total_s'))} s** with "
           f"{len(tr.get('errors', []))} cell(s) raising.", ""]
    out.append(table(["part", "seconds"], [[p, t] for p, t in tr.get("parts_s", {}).items()]))
    for error in tr.get("errors", []):
        out.append(f"\n- cell {error['index']} ({error['grade_id']}): `{error['error']}`")
    source = f" (the `autograde` step, `{lab}_autograde.json`)" if later_autograde else ""
    out += ["", f"Autograde of one submission{source} (the reference solution, quick scale, as TAs grade): "
            f"**{fmt(ag.get('seconds'))} s**, {points_text(ag)} autograded points (target: at most 120 s on an H100)."
            + (f" Cells short of full marks: {', '.join(ag['cells_short_of_full_marks'])}."
               if ag.get("cells_short_of_full_marks") else "")
            + (f" The grading **{ag['status']}**: {ag.get('reason') or 'no reason recorded'}." if ag.get("status") not in (None, "ok") else ""),
            ""]
    return out


def printed_results(executed: Path, max_chars: int = 1500) -> list[str]:
    """What the measuring cells of the executed notebook printed (profiler tables left out: too wide)."""
    if not executed.exists():
        return []
    nb = json.loads(executed.read_text())
    out = ["## What the teaching-scale run printed", "",
           "The standard output of each code cell of the executed reference notebook that printed results "
           "(profiler tables and the environment report left out).", ""]
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout").strip()
        if not text or "Self CPU" in text or "Environment report" in text or len(text) > max_chars:
            continue
        if any(marker in text for markers in TABLE_MARKERS.values() for marker in markers):
            continue  # shown in full by tables_section
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        out += [f"Cell {index}" + (f" (`{gid}`)" if gid else "") + ":", "", "```", text, "```", ""]
    return out


def why_decode_row(name: str, entry: dict) -> str:
    """One sentence on a decode row of Lab 1's table: its launch overhead, and why it sits where it does."""
    kernels, graph_ms, eager_ms = entry.get("kernels_per_step"), entry.get("graph_ms"), entry.get("eager_ms")
    if not kernels or graph_ms is None:
        return f"- {name}: no CUDA-graph measurement in this run."
    ratio = entry["measured_over_predicted"]
    launch = (f"launched from Python without a graph it takes {fmt(eager_ms)} ms, {fmt(eager_ms - graph_ms)} ms more than the graph replay: the "
              f"CPU's work to launch {kernels} kernels one by one ({fmt((eager_ms - graph_ms) * 1e3 / kernels)} µs each)")
    if ratio <= 2:
        return f"- {name}: within 2× of its roofline as a CUDA graph ({fmt(ratio)}×); {launch}."
    return (f"- {name}: {fmt(ratio)}× its roofline as a CUDA graph because its {kernels} kernels average "
            f"{fmt(graph_ms * 1e3 / kernels)} µs each, {entry.get('elementwise_kernels_per_step')} of them elementwise passes (RMSNorms in "
            f"float32, RoPE, residuals) that the prediction, which counts weights, cache and the K/V projections only, leaves out; "
            f"{launch}.")


DECODE_ROWS = (("decode_without_cache", "decode without KV cache (CUDA graph)"),
               ("decode_with_cache", "decode with KV cache (CUDA graph)"),
               ("decode_with_cache_compiled", "decode with KV cache (torch.compile + CUDA graph)"))


def compiled_decode_note(p: dict) -> list[str]:
    """How compiling changed the cached decode step: compile time and kernels per step, or nothing."""
    compiled, graphed = p.get("decode_with_cache_compiled"), p["decode_with_cache"]
    if not compiled:
        return []
    return [f"Compiled with `torch.compile` (mode {compiled.get('compile_mode')}, first call {fmt(compiled['compile_s'])} s, "
            f"once) the cached step runs {compiled['kernels_per_step']} kernels instead of {graphed['kernels_per_step']} "
            f"({compiled['elementwise_kernels_per_step']} elementwise instead of {graphed['elementwise_kernels_per_step']}); "
            f"its \"no graph\" column is the compiled code launched from Python."]


def prefill_decode_section(p: dict) -> list[str]:
    """Lab 1 §3.3: prefill and the decode steps beside their rooflines, decode eager, as a CUDA graph and compiled."""
    rows = [measured_vs_predicted("prefill (eager)", p["prefill"]) + [None, p["prefill"].get("kernels_per_step")]]
    decode_rows = [(key, name) for key, name in DECODE_ROWS if key in p]
    for key, name in decode_rows:
        entry = p[key]
        rows.append(measured_vs_predicted(name, entry) + [entry.get("eager_ms"), entry.get("kernels_per_step")])
    out = [f"## Gemma-3 decoder layer ×{p['layers']} (pseudo config, bf16, batch {p['batch']}, sequence {p['seq_len']})", "",
           "Decode steps are measured replayed as a CUDA graph (`utils.benchmark_eager_and_graphed`, "
           "`utils.benchmark_compiled_and_graphed`), the time launched from Python without a graph beside them; the KV "
           "cache is preallocated and the new token written into it in place.", "",
           table(["stage", "measured (ms)", "predicted (ms)", "bound", "measured/predicted", "no graph (ms)", "kernels per step"], rows),
           "", *compiled_decode_note(p),
           "", f"KV-cache speedup of one decode step: **{fmt(p['kv_cache_speedup'])}×** measured with CUDA graphs "
           f"(predicted {fmt(p.get('kv_cache_speedup_predicted'))}×; eager {fmt(p.get('kv_cache_speedup_eager'))}×).", ""]
    ratio = p["prefill"]["measured_over_predicted"]
    if ratio > 2:
        out.append(f"- prefill: {fmt(ratio)}× its roofline: the prediction counts the GEMMs and the attention's "
                   f"FLOPs at the matmul ceiling, while the step also runs {p['prefill'].get('elementwise_kernels_per_step')} "
                   f"elementwise kernels (of {p['prefill'].get('kernels_per_step')}), RMSNorms in float32, RoPE, GeLU "
                   f"and residuals, each a pass over activations of {p['batch']}×{p['seq_len']} tokens that it does not count.")
    out += [why_decode_row(name.split(" (")[0] + (" compiled" if "compile" in name else ""), p[key])
            for key, name in decode_rows]
    return out + [""]


def lab1_report(results: Path, figures: Path) -> str:
    m = json.loads((results / "lab1_measurements.json").read_text())
    run = json.loads((results / "lab1_run.json").read_text()) if (results / "lab1_run.json").exists() else {}
    s = m["sections"]
    out = [f"# Lab 1 on {m.get('device')}: measured results", "",
           f"Generated by `scripts/gpu/make_report.py` from runs of `scripts/gpu/run_reports.sh` (torch {m.get('torch')}). "
           "Each time is the median of timed calls after warm-up (CUDA events). *Predicted* is the roofline time "
           "max(FLOPs / matmul rate, bytes / copy bandwidth) with this GPU's **measured** ceilings; the ratio is "
           "measured / predicted (1.0 = at the roofline).", ""]

    out += ["## Sanity checks", ""]
    out += [f"- {'PASS' if c['passed'] else '**FAIL**'}: {c['name']} ({c['detail']})" for c in m.get("checks", [])]
    if m.get("errors"):
        out += ["", "Sections that raised: " + ", ".join(sorted(m["errors"]))]
    out.append("")

    if run:
        out += run_section(run, "lab1", _autograde_step(results, "lab1"))

    if "roofline" in s:
        r = s["roofline"]
        d = r.get("datasheet", {})
        out += ["## Roofline ceilings: measured vs datasheet", "",
                table(["ceiling", "measured", "datasheet", "measured/datasheet"], [
                    ["copy bandwidth (TB/s, read + write)", r["bandwidth_tb_s"], d.get("bandwidth_tb_s"),
                     r["bandwidth_tb_s"] / d["bandwidth_tb_s"] if d.get("bandwidth_tb_s") else None],
                    *[[f"{dt} matmul (TFLOP/s, n={r.get('matmul_n')})", v, d.get(f"{dt}_tflops"),
                       v / d[f"{dt}_tflops"] if d.get(f"{dt}_tflops") else None] for dt, v in r["matmul_tflops"].items()],
                ]), "", f"fp32 matmuls ran with allow_tf32={r.get('allow_tf32')}.", ""]
    if "matmul_8192_bf16" in s:
        mm = s["matmul_8192_bf16"]
        out += [f"An 8192³ bf16 matmul through `benchmark_latency`: {fmt(mm['latency_ms'])} ms, "
                f"{fmt(mm['tflops'])} TFLOP/s, {mm['fraction_of_ceiling']:.0%} of the measured ceiling.", ""]
    if "gemm_vs_matmul" in s:
        out += ["## Tri-loop gemm vs torch.matmul (fp32)", "",
                table(["n", "tri-loop gemm (ms)", "torch.matmul (ms)", "speedup", "matmul predicted (ms)", "matmul measured/predicted"],
                      [[r["n"], r["gemm_ms"], r["matmul_ms"], r["speedup"], r["predicted_ms"], r["matmul_over_predicted"]] for r in s["gemm_vs_matmul"]]),
                "", "The tri-loop launches a few tiny kernels per multiply-add, so its time is launch overhead "
                "(about n³ launches), not arithmetic; small matmuls sit far above their roofline time for the same reason.", ""]
    if "prefill_decode" in s:
        out += prefill_decode_section(s["prefill_decode"])
    if "gelu" in s:
        rows = []
        for r in s["gelu"]:
            for name in ("python_eager", "fused", "compiled"):
                e = r[name]
                rows.append([r["numel"], name, e["measured_ms"], e["predicted_ms"], e["measured_over_predicted"],
                             e["achieved_tb_s"], e.get("kernels_per_call")])
        out += ["## GeLU: eager Python vs fused vs torch.compile (fp32)", "",
                table(["elements", "version", "measured (ms)", "predicted (ms)", "measured/predicted", "TB/s (min bytes)", "kernels per call"], rows),
                "", "Predicted time counts the minimum traffic (read x once, write y once); the eager version "
                "makes a round trip to memory per operation, so its ratio counts the extra passes.", ""]
    if "mlp" in s:
        mlp = s["mlp"]
        out += [f"## Gemma-3 270M MLP (bf16, batch {mlp['batch']}, sequence {mlp['seq_len']})", "",
                table(["version", "measured (ms)", "predicted (ms)", "measured/predicted", "kernels per call", "first call (s)"],
                      [[name, mlp[name]["measured_ms"], mlp[name]["predicted_ms"], mlp[name]["measured_over_predicted"],
                        mlp[name]["kernels_per_call"], mlp[name]["first_call_s"]] for name in ("eager", "compiled", "cuda_graphs")]),
                "", "compiled = `torch.compile(mode=\"max-autotune-no-cudagraphs\")`; cuda_graphs = `mode=\"max-autotune\"`. "
                "With CUDA Graphs the profiler sees one graph launch, so its kernel count is what the replay ran.", ""]
    if "flash_attention" in s:
        fa = s["flash_attention"]
        rows = []
        for r in fa["rows"]:
            sd, fl = r.get("sdpa", {}), r.get("flash", {})
            rows.append([r["seq_len"], sd.get("measured_ms") if sd else r["sdpa_status"], sd.get("predicted_ms"),
                         fl.get("measured_ms") if fl else r["flash_status"], fl.get("predicted_ms"), r.get("speedup"),
                         sd.get("peak_gb"), fl.get("peak_gb"), r["attn_matrix_gb"]])
        out += [f"## SDPA (materialized) vs FlashAttention (fp16, batch 1, 16 heads, head dim 128; backend: {fa['attention_backend']})", "",
                table(["seq len", "SDPA (ms)", "SDPA predicted", "Flash (ms)", "Flash predicted", "speedup", "SDPA peak (GB)", "Flash peak (GB)", "L×L matrix (GB)"], rows),
                "", f"Longest sequence the materialized SDPA fit: **{fa['longest_sdpa_seq_len']}**. "
                f"Kernels per call at sequence 1024 (bf16, 2×12 heads): from-scratch SDPA "
                f"{fa['kernels_per_call']['sdpa_from_scratch']['total']}, fused SDPA {fa['kernels_per_call']['flash']['total']}.", ""]
    out += tables_section(results / "lab1_executed.ipynb", "lab1")
    out += figures_section(results / "lab1_executed.ipynb", "lab1", figures)
    out += printed_results(results / "lab1_executed.ipynb")
    return "\n".join(out) + "\n"


LAB3_COMPARISON = ["B", "N", "predicted_no_cache_ms", "predicted_cache_ms", "measured_no_cache_ms", "eager_no_cache_ms",
                   "measured_cache_ms", "eager_cache_ms", "kernels_cache", "ratio_no_cache", "ratio_cache",
                   "speedup_predicted", "speedup_measured", "speedup_eager"]


def lab3_comparison_rows(executed: Path) -> list[dict]:
    """The rows of Lab 3's Part 5 comparison table, as the executed notebook printed them (columns above)."""
    if not executed.exists():
        return []
    nb = json.loads(executed.read_text())
    for cell in nb["cells"]:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        lines = text.splitlines()
        header = next((i for i, line in enumerate(lines) if "predicted_no_cache_ms" in line and "kernels_cache" in line), None)
        if header is None:
            continue
        rows = []
        for line in lines[header + 1:]:
            fields = line.replace(",", "").split()
            if len(fields) != len(LAB3_COMPARISON):
                break
            rows.append(dict(zip(LAB3_COMPARISON, (float(f) for f in fields))))
        return rows
    return []


def lab3_why_section(executed: Path) -> list[str]:
    """One sentence per Part 5 measurement whose CUDA-graph time is above 2x its roofline, with the number why."""
    rows = lab3_comparison_rows(executed)
    if not rows:
        return []
    out = ["## Part 5: why a measurement sits above 2× its prediction", "",
           "Times are CUDA-graph replays (GPT-2 XL, fp16) of the pass without a cache (`gpt2_decoder_forward` and the "
           "LM head) and of one cached decode step (the reference solution's `gpt2_step` and `StaticKVCache`, "
           "Question 4.6); eager times beside them.", ""]
    for r in rows:
        case = f"(B={r['B']:.0f}, N={r['N']:.0f})"
        if r["ratio_cache"] > 2:
            out.append(f"- {case} cached decode step, {fmt(r['ratio_cache'])}×: {r['kernels_cache']:.0f} kernels at "
                       f"{fmt(r['measured_cache_ms'] * 1e3 / r['kernels_cache'])} µs each on average even in a CUDA graph, "
                       f"a floor above the {fmt(r['predicted_cache_ms'])} ms that its bytes need (eagerly: "
                       f"{fmt(r['eager_cache_ms'])} ms, the CPU launching them).")
        if r["ratio_no_cache"] > 2:
            out.append(f"- {case} pass without a cache, {fmt(r['ratio_no_cache'])}×: passes Part 2 does not count (a "
                       f"separate scale pass over the N×N scores, which Part 2 fuses into QK^T; GPT-2's GELU as eight "
                       f"elementwise kernels over (B, N, 4D); layer norms, residuals and the copy of the heads) and, for "
                       f"small passes, the same per-kernel floor.")
        out.append(f"  KV-cache speedup {case}: measured {fmt(r['speedup_measured'])}×, predicted "
                   f"{fmt(r['speedup_predicted'])}×, eager {fmt(r['speedup_eager'])}×.")
    return out + [""]


TABLE_MARKERS = {  # lab -> {text a measurement table prints: its title}; printed in full (printed_results cuts long ones)
    "lab1": {
        "MLP FLOPs": "Section 3.5: every operator of the MLP and of attention on the measured roofline",
    },
    "lab2": {  # the first marker an output holds names it: Part 2's and Part 5's roofline tables share their columns
        "speedup_if_fused": "Part 1: relu(A @ B), eager, matmul alone, compiled and autotuned",
        " kernel(s): ": "Part 1: kernels per call (n = 16384, k = 64)",
        "KV_HEAD=": "Part 2: C @ relu(A @ B) on the roofline",
        "forward_ms (rows": "Part 5: the attention sweep",
        "forward_tflops_eager": "Part 5: torch.compile on whole Transformers (TFLOP/s, time per layer, kernels per forward)",
        "pct_of_roof": "Part 5: attention on the roofline",
    },
}


FIGURE_MARKERS = {  # lab -> {text in the source of a cell that draws a figure the report shows: its title}
    "lab1": {"q3_5_2_plot": "Section 3.5: every operator on the measured roofline"},
    "lab3": {"q5_2_plot": "Part 5: decode with and without the cache against the roofline"},
}  # Lab 2's Part 5 figure is redrawn from its table (lab2_roofline_figure)

LAB2_ROOFLINE_TITLE = "Part 5: attention implementations on the roofline"


def printed_table(text: str, marker: str) -> list[dict]:
    """The rows of a pandas table (``DataFrame.to_string(index=False)``, right-aligned columns) that ``text`` prints
    under the header line holding ``marker``: each row a dict of strings, column -> value."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if marker in line), None)
    if start is None:
        return []
    header = lines[start]
    ends = [match.end() for match in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cuts = [0] + ends
        rows.append({name: line[cuts[i]:cuts[i + 1]].strip() for i, name in enumerate(names)})
    return rows


def _lab_function(lab_source: Path, name: str, namespace: dict):
    """The function ``name`` defined at the top level of a lab's text file, compiled alone into ``namespace``: the
    report draws with the lab's own code instead of a copy of it."""
    import ast

    tree = ast.parse(lab_source.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(lab_source), "exec"), namespace)
    return namespace[name]


def lab2_roofline_figure(executed: Path, figures: Path, lab_source: Path) -> list[str]:
    """Lab 2's attention roofline (Part 5) redrawn from the table the run printed, with the lab's own
    ``plot_roofline_measured`` (measured TFLOP/s beside each point, labels apart): one panel per sequence length."""
    import math
    import sys

    if not executed.exists() or not lab_source.exists():
        return []
    nb = json.loads(executed.read_text())
    text = next((t for t in ("".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                                     if o.get("output_type") == "stream") for cell in nb["cells"])
                 if "pct_of_roof" in t), None)
    match = re.search(r"batch (\d+), one head, d_model (\d+); roof of (\S+) \(bf16\): ([\d.]+) TFLOP/s, ([\d.]+) TB/s",
                      text or "")
    rows = printed_table(text or "", "pct_of_roof")
    if not match or not rows:
        return []
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import utils

    draw = _lab_function(lab_source, "plot_roofline_measured",
                         {"math": math, "plt": plt, "plot_roofline": utils.plot_roofline})
    batch, d_model, gpu, peak, bandwidth = match.groups()

    def number(value: str) -> float:
        try:
            return float(value)
        except ValueError:
            return math.nan  # "OOM", "-"

    seq_lens = list(dict.fromkeys(row["seq_len"] for row in rows))
    fig, axes = plt.subplots(1, len(seq_lens), figsize=(8 * len(seq_lens), 6.5), squeeze=False)
    for ax, seq_len in zip(axes[0], seq_lens):
        operations = {}
        for row in (r for r in rows if r["seq_len"] == seq_len):
            status = row.get("status", "ok").lower()
            name = row["impl"] if status == "ok" else f"{row['impl']} ({'out of memory' if status == 'oom' else status})"
            tflops = number(row["forward_tflops"])
            operations[name] = (number(row["intensity_flop_per_byte"]), tflops) if status == "ok" else \
                number(row["intensity_flop_per_byte"])
        draw(gpu, float(peak), float(bandwidth), operations, ax=ax,
             title=f"attention forward, S = {seq_len}, d = {d_model}, batch {batch}, on {gpu}")
    name = "lab2_part_5.png"
    fig.savefig(figures / name, dpi=110, bbox_inches="tight")
    plt.close(fig)
    later = "" if any("no cache" in row["impl"] for row in rows) else (
        " This run predates the lab's `Triton (yours), no cache` placement (the same measurement at Part 4's count "
        "of K and V re-read from HBM once per query tile) and its status column.")
    return [f"### {LAB2_ROOFLINE_TITLE}", "",
            f"Redrawn by `scripts/gpu/make_report.py` from the table above with the lab's own "
            f"`plot_roofline_measured`: the filled marker on the roof is the model's prediction at the intensity, the "
            f"hollow marker below it the measured TFLOP/s, written beside it.{later}", "",
            f"![{LAB2_ROOFLINE_TITLE}](figures/{name})", ""]


def figures_section(executed: Path, lab: str, figures: Path) -> list[str]:
    """The figures of ``FIGURE_MARKERS`` taken from the executed notebook into ``figures/``, linked from the report."""
    import base64

    if not executed.exists():
        return []
    nb = json.loads(executed.read_text())
    out = []
    for marker, title in FIGURE_MARKERS.get(lab, {}).items():
        for cell in nb["cells"]:
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
            images = [o["data"]["image/png"] for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
            if images and (marker in source or marker == grade_id):
                name = f"{lab}_{title.split(':')[0].lower().replace(' ', '_').replace('.', '_')}.png"
                (figures / name).write_bytes(base64.b64decode(images[0]))
                out += [f"### {title}", "", f"![{title}](figures/{name})", ""]
                break
    return (["## Figures", ""] + out) if out else []


def tables_section(executed: Path, lab: str) -> list[str]:
    """A lab's measurement tables (``TABLE_MARKERS``) in full: ``printed_results`` leaves out long outputs such as
    Lab 2's attention sweep or Lab 1's operator table, which the written answers quote."""
    markers = TABLE_MARKERS.get(lab, {})
    if not executed.exists() or not markers:
        return []
    nb = json.loads(executed.read_text())
    out = [f"## {lab.capitalize()}'s measurement tables", ""]
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream" and o.get("name") == "stdout").strip()
        title = next((title for marker, title in markers.items() if marker in text), None)
        if title:
            out += [f"### {title}", "", "```", text, "```", ""]
    return out if len(out) > 2 else []


def lab_run_report(results: Path, lab: str, figures: Path) -> str:
    """Report of a lab whose GPU evidence is its teaching-scale run (Labs 2 and 3)."""
    run = json.loads((results / f"{lab}_run.json").read_text())
    out = [f"# {lab.capitalize()} on {run.get('device')}: the teaching-scale run", "",
           "Generated by `scripts/gpu/make_report.py` from a run of `scripts/gpu/run_reports.sh`.", ""]
    out += run_section(run, lab, _autograde_step(results, lab))
    if lab == "lab3":
        out += lab3_why_section(results / f"{lab}_executed.ipynb")
    out += tables_section(results / f"{lab}_executed.ipynb", lab)
    out += figures_section(results / f"{lab}_executed.ipynb", lab, figures)
    if lab == "lab2":
        redrawn = lab2_roofline_figure(results / f"{lab}_executed.ipynb", figures,
                                       Path(__file__).resolve().parents[2] / "labs" / "lab2" / "lab2.py")
        out += (["## Figures", ""] if redrawn and "## Figures" not in out else []) + redrawn
    out += printed_results(results / f"{lab}_executed.ipynb")
    return "\n".join(out) + "\n"


def flash_figure(results: Path, figures: Path) -> str:
    """FlashAttention vs materialized SDPA, drawn from the measured rows with utils' own plot."""
    import sys

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import utils

    m = json.loads((results / "lab1_measurements.json").read_text())
    rows = [{"seq_len": r["seq_len"],
             "sdpa_ms": r.get("sdpa", {}).get("measured_ms"), "flash_ms": r.get("flash", {}).get("measured_ms"),
             "sdpa_mem_gb": r.get("sdpa", {}).get("peak_gb"), "flash_mem_gb": r.get("flash", {}).get("peak_gb")}
            for r in m["sections"]["flash_attention"]["rows"]]
    fig, _ = utils.plot_flash_attn_improvement(pd.DataFrame(rows), title=f"FlashAttention vs SDPA on {m.get('device')}")
    fig.savefig(figures / "lab1_flash_vs_sdpa.png", dpi=110, bbox_inches="tight")
    return "\n![FlashAttention vs SDPA, measured](figures/lab1_flash_vs_sdpa.png)\n"


def utils_report(results: Path) -> str:
    path = results / "check_utils_gpu.json"
    if not path.exists():
        return ""
    data = json.loads(path.read_text())
    return "## utils.py checks on this GPU\n\n```json\n" + json.dumps(data, indent=1)[:6000] + "\n```\n"


def autograde_report(results: Path) -> str:
    """One reference submission of every lab graded as TAs grade it (``<lab>_autograde.json``), or ""."""
    runs = [json.loads(path.read_text()) for path in sorted(results.glob("*_autograde.json"))]
    if not runs:
        return ""
    rows = [[run["lab"], run["autograde"].get("status"), run["autograde"].get("seconds"),
             points_text(run["autograde"])]
            for run in runs]
    return "\n".join([
        f"# Autograde on {runs[0].get('device')}", "",
        "Generated by `scripts/gpu/make_report.py` from `scripts/gpu/run_lab.py LAB --skip-execute` (the `autograde` "
        f"step of `scripts/gpu/run_reports.sh`; torch {runs[0].get('torch')}): the reference solution of each lab, "
        "graded by `course.cli.grade` as TAs grade (quick scale, grading guard on). Target: at most 120 s per submission "
        "on an H100. Points are earned/maximum, with the bonus earned on top.", "",
        table(["lab", "status", "seconds", "autograded points"], rows), "", *cuda_faults_section(results)])


def cuda_faults_section(results: Path) -> list[str]:
    """Lab 1 submissions that break the GPU, graded there (``cuda_faults.json`` of check_cuda_faults.py)."""
    path = results / "cuda_faults.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    rows = [[student, entry["status"], entry["seconds"], sum(entry["scores"].values()),
             "; ".join(entry["notes"]) or entry["reason"] or "-"] for student, entry in data["students"].items()]
    return ["## Submissions that break the GPU", "",
            "`scripts/gpu/check_cuda_faults.py`: Lab 1's reference, and the reference with its gemm answer cell "
            "starting with an out-of-bounds index on `DEVICE` (a device-side assert on the GPU) or a 4 TiB "
            "allocation (CUDA out-of-memory), graded as one class by `course grade`'s one worker. On a CPU grader both "
            "lose Question 1.1 (5 points) and nothing else. A submission's seconds count from its turn: the worker "
            "starts the next submission's nbgrader process (its imports, kernel, setup cells and the modules of the "
            "lab's locked cells) while it grades one.",
            "",
            table(["submission", "status", "seconds", "autograded points", "note"], rows), "",
            *[f"- {'PASS' if ok else 'FAIL'}: {check}" for check, ok in data["checks"].items()], ""]


def card_of(results: Path) -> str:
    """The card of a run as reports name it (``"NVIDIA H200"`` in ``gpu.csv`` -> ``"h200"``).

    Raises:
        SystemExit: ``gpu.csv`` is missing or names no card (pass ``--card``).
    """
    rows = (results / "gpu.csv").read_text().splitlines()[1:] if (results / "gpu.csv").exists() else []
    if not rows:
        raise SystemExit(f"{results / 'gpu.csv'} names no GPU: pass --card")
    return rows[0].split(",")[0].replace("NVIDIA", "").split()[0].lower()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--card", help="the card in the reports' names (default: from the run's gpu.csv, e.g. h200)")
    args = parser.parse_args()
    card = args.card or card_of(args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    figures = args.out / "figures"
    figures.mkdir(exist_ok=True)
    for png in sorted(args.results.glob("*.png")):
        if "_fig_" not in png.name:  # every notebook figure is in the executed notebook; the reports link a few
            shutil.copy2(png, figures / png.name)
    if (args.results / "lab1_measurements.json").exists():
        report = lab1_report(args.results, figures) + flash_figure(args.results, figures) + "\n" + utils_report(args.results)
        (args.out / f"lab1-{card}.md").write_text(report)
        print(f"wrote {args.out / f'lab1-{card}.md'}")
    autograde = autograde_report(args.results)
    if autograde:
        (args.out / f"autograde-{card}.md").write_text(autograde)
        print(f"wrote {args.out / f'autograde-{card}.md'}")
    for lab in ("lab2", "lab3"):
        if (args.results / f"{lab}_run.json").exists():
            (args.out / f"{lab}-{card}.md").write_text(lab_run_report(args.results, lab, figures))
            print(f"wrote {args.out / f'{lab}-{card}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
