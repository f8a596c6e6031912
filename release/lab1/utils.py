"""Helpers for the Efficient AI labs: everything in this file is for you to call (and to read when in doubt).

Every lab starts with ``from utils import *``, which gives the names of ``__all__``. Five sections, in this order:

1. Run settings and hardware: ``DEVICE``, ``SCALE``/``at_scale``, ``progress``, ``print_environment_report``,
   ``quiet_library_messages``, ``GPU_SPECS``, ``detect_gpu``, ``get_ridge_point``, ``measure_roofline``.
2. Model configs and helpers: ``GEMMA3_270M_CONFIG``, ``GEMMA3_PESUDO_CONFIG`` (the handout's spelling; also
   ``GEMMA3_PSEUDO_CONFIG``) and the input, KV-cache (preallocated, written in place) and multi-layer forward helpers
   used with the lab's own ``Gemma3DecoderLayer``; ``gpt2_decoder_forward`` for Lab 3's GPT-2.
3. Measurement: ``benchmark_latency`` (ms), ``capture_cuda_graph``, ``benchmark_eager_and_graphed`` (ms),
   ``benchmark_compiled_and_graphed`` (ms), ``benchmark_memory`` (GB), ``default_schedule``,
   ``count_cuda_kernels``, ``count_kernels_per_call``, ``run_oom_safe``, ``mark_oom``.
4. Attention backends: ``flash_attn_func`` and ``ATTENTION_BACKEND``.
5. Plotting: ``plot_roofline``, ``plot_gemm_torch_matmul_latency``, ``plot_latency_vs_size``,
   ``plot_flash_attn_improvement``, ``plot_trace_timeline``.

Units: time in milliseconds (ms) unless a name says otherwise (``*_s``, ``*_us``), memory in GB (1e9 bytes),
bandwidth in TB/s (1e12 bytes/s), compute in TFLOP/s (1e12 FLOP/s), arithmetic intensity in FLOP/byte.

Everything runs on CPU and on CUDA. The plumbing behind these functions (choosing the scale, matching GPU names, the
environment report's checks, silencing library messages, classifying profiler events, drawing the plots) lives in
``_utils_private.py`` beside this file; you never need to call or read it. transformers is imported only when a model
config is first used, so ``import utils`` costs little more than ``import torch`` and matplotlib. Importing it
changes no global state (PyTorch's backends, the profiler, logging, warnings, the environment);
``quiet_library_messages()``, which each lab's setup cell calls, silences the library messages you cannot act on.
"""

import contextlib
import gc
import importlib.util
import math
import platform
import time
import traceback

import matplotlib.pyplot as plt
import numpy as np
import torch

import _utils_private as _private

__all__ = [
    # 1. run settings and hardware
    "DEVICE",
    "SCALE",
    "at_scale",
    "progress",
    "uses_answers",
    "print_environment_report",
    "quiet_library_messages",
    "GPU_SPECS",
    "detect_gpu",
    "get_ridge_point",
    "measure_roofline",
    # 2. model configs and helpers
    "GEMMA3_270M_CONFIG",  # noqa: F822  (built on first access by __getattr__)
    "GEMMA3_PESUDO_CONFIG",  # noqa: F822
    "GEMMA3_PSEUDO_CONFIG",  # noqa: F822
    "create_prefill_inputs",
    "create_decode_inputs_without_cache",
    "create_decode_inputs_with_cache",
    "get_position_embeddings",
    "initialize_kv_cache",
    "multi_layer_prefill_forward",
    "multi_layer_decode_forward",
    "KVCache",
    "KVCacheLayer",
    "gpt2_decoder_forward",
    # 3. measurement
    "benchmark_latency",
    "benchmark_memory",
    "capture_cuda_graph",
    "benchmark_eager_and_graphed",
    "benchmark_compiled_and_graphed",
    "default_schedule",
    "count_cuda_kernels",
    "count_kernels_per_call",
    "run_oom_safe",
    "mark_oom",
    # 4. attention backends
    "ATTENTION_BACKEND",
    "flash_attn_func",
    # 5. plotting
    "plot_roofline",
    "plot_gemm_torch_matmul_latency",
    "plot_latency_vs_size",
    "plot_flash_attn_improvement",
    "plot_trace_timeline",
]


# =====================================================================================================
# 1. Run settings and hardware
# =====================================================================================================

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""torch.device: ``cuda`` when a CUDA GPU is visible, else ``cpu``. Notebooks and tests put tensors here."""

SCALE = _private.read_scale()
"""str: the sizes the measuring cells use.

- ``"teaching"``: full sizes, meant for a GPU (the default where CUDA is available);
- ``"cpu"``: sizes at which a laptop's CPU still shows each lab's effects, the whole lab in minutes (the default
  without a GPU);
- ``"quick"``: the smallest sizes, which only check that the code runs (grading and CI always use it).

The environment variable ``EFFICIENT_AI_SCALE=teaching|cpu|quick`` overrides the default (set it before starting
Jupyter); the grader sets ``quick``.
"""


def at_scale(teaching, quick, cpu=None):
    """Pick a size by the scale in effect.

    Args:
        teaching: Value used at teaching scale (GPU-sized sweeps, long sequences).
        quick: Value used at quick scale (grading, CI); keep it small enough for a 2-core CPU.
        cpu: Value used at cpu scale (a student's laptop without a GPU): large enough to show the effect the cell
            measures, small enough for minutes on a laptop. Default: ``quick``.

    Returns:
        The value for ``utils.SCALE`` (returned as given, not copied).
    """
    if SCALE == "teaching":
        return teaching
    return cpu if SCALE == "cpu" and cpu is not None else quick


@contextlib.contextmanager
def uses_answers(*questions, your_functions=None):
    """``with uses_answers("Question 3.1"):`` around code that uses your answers (a demonstration, a plot, a sweep).

    While an answer is not written yet (its stub raises a bare ``NotImplementedError()``), the block stops there and
    the cell prints, once per cell run, which answer it waits for, without an error, so Run All goes on; the
    answer's own test cell says what is missing. Any other error, a ``NotImplementedError`` with a message included
    (a library's), is raised as usual.

    Args:
        *questions: the questions whose answers the block uses, as the lab names them ("Question 3.1").
        your_functions: optional dict from the names of your functions and classes to their question
            (``{"gemm": "Question 1.1"}``); the message then names the one whose stub raised.

    Returns:
        A context manager; the block's code runs inside it.
    """
    try:
        yield
    except NotImplementedError as error:
        if str(error):
            raise
        code = [frame.f_code for frame, _ in traceback.walk_tb(error.__traceback__)][-1]
        name = getattr(code, "co_qualname", code.co_name).rsplit("<locals>.", 1)[-1]  # "StaticKVCache.__init__"
        mine = next((fn for fn in (your_functions or {}) if name == fn or name.startswith(fn + ".")), None)
        if mine:
            what = f"your {mine} ({your_functions[mine]}) is not written yet"
        else:
            what = f"{' and '.join(questions) or 'an answer'} {'is' if len(questions) <= 1 else 'are'} not written yet"
        said = (what, _private.execution_count())
        if said not in _private.NOT_WRITTEN_SAID:
            _private.NOT_WRITTEN_SAID.add(said)
            print(f"Not run yet: {what}; the rest of this block is skipped.")


def progress(iterable, description: str, total: int | None = None):
    """A progress bar over a loop that runs for a while (a benchmark sweep, a training run).

    tqdm's notebook widget inside Jupyter (it needs ``ipywidgets``; without it, tqdm's text bar and no warning),
    a text bar in a terminal. At quick scale, where loops take seconds and grading runs, no bar is drawn: the
    iterable is returned as it is.

    Args:
        iterable: What the loop runs over.
        description: A few words on what each step does, shown left of the bar (``"matmul sizes"``).
        total: The number of steps, where ``len(iterable)`` does not work (a generator).

    Returns:
        An iterable over the same items, in the same order.
    """
    if SCALE == "quick" or importlib.util.find_spec("tqdm") is None:
        return iterable
    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm.std import tqdm
    else:
        from tqdm.auto import tqdm
    return tqdm(iterable, desc=description, total=total)


# Peak figures of common GPUs. Dense rates only (no 2:4 sparsity). fp16/bf16: tensor-core rate with FP32
# accumulation (what PyTorch matmuls use); fp32: the non-tensor-core FP32 (CUDA core) rate, which is what an
# fp32 matmul gets with TF32 disabled (PyTorch's default). Units: TFLOP/s, TB/s (1e12 B/s), GB (1e9 B);
# sram_kb: combined L1 / shared memory per SM in KB; num_sms: streaming multiprocessors.
GPU_SPECS = {
    # NVIDIA A10 Tensor Core GPU datasheet (FP16/BF16 125 TFLOPS dense, 250 with sparsity); GA102: 72 SMs,
    # 128 KB L1/shared per SM (NVIDIA Ampere GA102 GPU architecture whitepaper).
    "A10": dict(fp16_tflops=125.0, bf16_tflops=125.0, fp32_tflops=31.2,
                memory_bandwidth_tb_s=0.600, memory_gb=24, sram_kb=128, num_sms=72),
    # NVIDIA RTX A6000 datasheet (38.7 TFLOPS FP32, 309.7 tensor TFLOPS with sparsity -> 154.8 dense,
    # 768 GB/s, 48 GB); Ampere GA102 whitepaper appendix (84 SMs, 128 KB L1/shared per SM).
    "A6000": dict(fp16_tflops=154.8, bf16_tflops=154.8, fp32_tflops=38.7,
                  memory_bandwidth_tb_s=0.768, memory_gb=48, sram_kb=128, num_sms=84),
    # NVIDIA A100 Tensor Core GPU datasheet (A100 40GB: 19.5 FP32, 312 BF16/FP16 dense, 1,555 GB/s);
    # NVIDIA A100 architecture whitepaper (108 SMs, 192 KB L1/shared per SM).
    "A100-40GB": dict(fp16_tflops=312.0, bf16_tflops=312.0, fp32_tflops=19.5,
                      memory_bandwidth_tb_s=1.555, memory_gb=40, sram_kb=192, num_sms=108),
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column (2,039 GB/s).
    "A100-80GB": dict(fp16_tflops=312.0, bf16_tflops=312.0, fp32_tflops=19.5,
                      memory_bandwidth_tb_s=2.039, memory_gb=80, sram_kb=192, num_sms=108),
    # NVIDIA A100 Tensor Core GPU datasheet, A100 80GB PCIe column (1,935 GB/s).
    "A100-80GB-PCIe": dict(fp16_tflops=312.0, bf16_tflops=312.0, fp32_tflops=19.5,
                           memory_bandwidth_tb_s=1.935, memory_gb=80, sram_kb=192, num_sms=108),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (67 FP32, 1,979 BF16/FP16 with sparsity ->
    # 989.4 dense, 3.35 TB/s, 80 GB); NVIDIA H100 (Hopper) whitepaper (132 SMs, 256 KB L1/shared per SM).
    "H100-SXM": dict(fp16_tflops=989.4, bf16_tflops=989.4, fp32_tflops=67.0,
                     memory_bandwidth_tb_s=3.35, memory_gb=80, sram_kb=256, num_sms=132),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column (51 FP32, 1,513 with sparsity -> 756 dense,
    # 2.0 TB/s, 80 GB); Hopper whitepaper (114 SMs on H100 PCIe).
    "H100-PCIe": dict(fp16_tflops=756.0, bf16_tflops=756.0, fp32_tflops=51.0,
                      memory_bandwidth_tb_s=2.0, memory_gb=80, sram_kb=256, num_sms=114),
    # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL column (60 FP32, 1,671 with sparsity -> 835 dense,
    # 3.9 TB/s, 94 GB); 132 SMs.
    "H100-NVL": dict(fp16_tflops=835.0, bf16_tflops=835.0, fp32_tflops=60.0,
                     memory_bandwidth_tb_s=3.9, memory_gb=94, sram_kb=256, num_sms=132),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (same compute as H100 SXM, 4.8 TB/s, 141 GB).
    "H200": dict(fp16_tflops=989.4, bf16_tflops=989.4, fp32_tflops=67.0,
                 memory_bandwidth_tb_s=4.8, memory_gb=141, sram_kb=256, num_sms=132),
    # NVIDIA L4 Tensor Core GPU datasheet (30.3 FP32, 242 BF16/FP16 with sparsity -> 121 dense, 300 GB/s,
    # 24 GB); Ada Lovelace whitepaper (AD104 as in L4: 58 SMs, 128 KB L1/shared per SM).
    "L4": dict(fp16_tflops=121.0, bf16_tflops=121.0, fp32_tflops=30.3,
               memory_bandwidth_tb_s=0.300, memory_gb=24, sram_kb=128, num_sms=58),
    # NVIDIA L40S datasheet (91.6 FP32, 362.05 BF16/FP16 dense, 864 GB/s, 48 GB); 142 SMs, 128 KB per SM.
    "L40S": dict(fp16_tflops=362.05, bf16_tflops=362.05, fp32_tflops=91.6,
                 memory_bandwidth_tb_s=0.864, memory_gb=48, sram_kb=128, num_sms=142),
    # NVIDIA T4 Tensor Core GPU datasheet (8.1 FP32, 65 FP16 mixed precision, 320 GB/s, 16 GB); Turing
    # whitepaper (40 SMs, 96 KB L1/shared per SM). Turing has no BF16 tensor cores: bf16 matmuls run on
    # the FP32 units at best, so bf16_tflops is the FP32 rate.
    "T4": dict(fp16_tflops=65.0, bf16_tflops=8.1, fp32_tflops=8.1,
               memory_bandwidth_tb_s=0.320, memory_gb=16, sram_kb=96, num_sms=40),
    # NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090 column (82.6 FP32; FP16/BF16 tensor
    # with FP32 accumulate 165.2 dense; 1,008 GB/s; 24 GB; 128 SMs; 128 KB L1/shared per SM).
    "RTX4090": dict(fp16_tflops=165.2, bf16_tflops=165.2, fp32_tflops=82.6,
                    memory_bandwidth_tb_s=1.008, memory_gb=24, sram_kb=128, num_sms=128),
}


def detect_gpu(default=None, name=None):
    """Map this machine's GPU to its ``GPU_SPECS`` key.

    Args:
        default: Returned when there is no CUDA GPU or the GPU is not in ``GPU_SPECS`` (e.g. ``"A6000"``).
        name: A device name to look up instead of ``torch.cuda.get_device_name()`` (e.g. ``"NVIDIA A10"``).

    Returns:
        str | None: The ``GPU_SPECS`` key (e.g. ``"H100-SXM"`` for ``"NVIDIA H100 80GB HBM3"``), or ``default``.
        For an unknown GPU it prints one line naming the nearest entries (to stdout: nbgrader scores a test
        cell that writes to stderr as failed).
    """
    num_sms = memory_gb = None
    if name is None:
        if not torch.cuda.is_available():
            return default
        name = torch.cuda.get_device_name()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        num_sms, memory_gb = props.multi_processor_count, props.total_memory / 1e9
    key = _private.gpu_key_for_name(name)
    if key is not None:
        return key
    nearest = _private.nearest_gpu_keys(GPU_SPECS, name, num_sms, memory_gb)
    details = f" ({num_sms} SMs, {memory_gb:.0f} GB)" if num_sms is not None else ""
    print(f"detect_gpu: {name!r}{details} is not in GPU_SPECS; nearest entries: {', '.join(nearest)}. "
          f"Pick one explicitly (e.g. GPU_SPECS[{nearest[0]!r}]) or add an entry from your GPU's datasheet; "
          f"using {default!r}.")
    return default


def get_ridge_point(gpu_name, dtype=torch.float32):
    """Ridge point of a GPU's roofline: the arithmetic intensity where memory-bound turns compute-bound.

    Args:
        gpu_name: A ``GPU_SPECS`` key, e.g. ``"A6000"``.
        dtype: ``torch.float32`` (FP32 rate), ``torch.float16`` or ``torch.bfloat16`` (tensor-core rate),
            or the same as a string (``"fp32"``, ``"bf16"``, ...).

    Returns:
        float: peak FLOP/s divided by peak bandwidth in bytes/s, in FLOP/byte (A6000, fp32: 38.7e12 / 768e9 =
        50.4).
    """
    if gpu_name not in GPU_SPECS:
        raise KeyError(f"{gpu_name!r} is not a GPU_SPECS key; known: {', '.join(GPU_SPECS)}")
    spec = GPU_SPECS[gpu_name]
    return spec[f"{_private.spec_prefix(dtype)}_tflops"] / spec["memory_bandwidth_tb_s"]


def measure_roofline(dtypes=(torch.float32, torch.bfloat16), device=None, size=None, copy_mb=None,
                     n_warmup=None, n_repeat=None):
    """Measure this machine's achievable memory bandwidth and matmul rate (the empirical roofline).

    Bandwidth comes from a large device-to-device copy ``dst.copy_(src)``: bytes read plus bytes written
    (2 x buffer size) over the median copy time. Compute comes from an ``n x n @ n x n`` matmul per dtype:
    ``2 n^3`` FLOP over the median time. fp32 matmuls use whatever ``torch.backends.cuda.matmul.allow_tf32``
    says (off by default, so they compare with ``fp32_tflops``); the result records it.

    Args:
        dtypes: Matmul dtypes to measure.
        device: Where to measure; default ``DEVICE``.
        size: Matmul dimension n; default 8192 on CUDA, 512 on CPU.
        copy_mb: Copy buffer size in MB (1e6 bytes); default 1024 on CUDA (far larger than any L2), 64 on CPU.
        n_warmup: Untimed calls before timing; default 5 on CUDA, 1 on CPU.
        n_repeat: Timed calls; default 20 on CUDA, 3 on CPU.

    Returns:
        dict: ``device`` ("cuda"/"cpu"), ``device_name``, ``gpu`` (GPU_SPECS key or None),
        ``bandwidth_tb_s`` (float, TB/s), ``matmul_tflops`` (dtype name -> TFLOP/s, e.g. ``"bfloat16"``),
        ``ridge_point`` (dtype name -> measured FLOP/byte), ``matmul_n``, ``copy_mb``, ``allow_tf32``, and the
        datasheet's figures to hold them against: ``datasheet_tflops`` (dtype name -> TFLOP/s) and
        ``datasheet_bandwidth_tb_s``, from ``GPU_SPECS`` for a known GPU; None on a CPU or an unknown GPU (there is
        no CPU datasheet in ``GPU_SPECS``: a CPU's roofline is its measured one).
    """
    device = torch.device(device) if device is not None else DEVICE
    on_cuda = device.type == "cuda"
    size = size or (8192 if on_cuda else 512)
    copy_mb = copy_mb or (1024 if on_cuda else 64)
    n_warmup = n_warmup if n_warmup is not None else (5 if on_cuda else 1)
    n_repeat = n_repeat or (20 if on_cuda else 3)

    n_bytes = int(copy_mb * 1e6) // 4 * 4
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    copy_ms = benchmark_latency(dst.copy_, src, n_warmup=n_warmup, n_repeat=n_repeat, measure_on=device)
    bandwidth_tb_s = 2 * n_bytes / (copy_ms * 1e-3) / 1e12
    del src, dst

    matmul_tflops, ridge_point = {}, {}
    for dtype in dtypes:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        mm_ms = benchmark_latency(torch.matmul, a, b, n_warmup=n_warmup, n_repeat=n_repeat, measure_on=device)
        tflops = 2 * size**3 / (mm_ms * 1e-3) / 1e12
        matmul_tflops[_private.dtype_name(dtype)] = tflops
        ridge_point[_private.dtype_name(dtype)] = tflops / bandwidth_tb_s
        del a, b
    if on_cuda:
        torch.cuda.empty_cache()
    gpu = detect_gpu() if on_cuda else None
    spec = GPU_SPECS.get(gpu) if gpu else None
    return {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if on_cuda else (platform.processor() or "CPU"),
        "gpu": gpu,
        "datasheet_tflops": None if spec is None else {
            _private.dtype_name(dtype): spec[f"{_private.spec_prefix(dtype)}_tflops"] for dtype in dtypes},
        "datasheet_bandwidth_tb_s": None if spec is None else spec["memory_bandwidth_tb_s"],
        "bandwidth_tb_s": bandwidth_tb_s,
        "matmul_tflops": matmul_tflops,
        "ridge_point": ridge_point,
        "matmul_n": size,
        "copy_mb": copy_mb,
        "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }


def print_environment_report(lab=None):
    """Print what this notebook runs on; every lab's first code cell calls it. Never raises.

    Prints a few lines: Python, torch and transformers versions; the GPU (name and ``GPU_SPECS`` key) or that
    it runs on CPU; the scale in effect and how to change it; the attention backend ``flash_attn_func`` uses;
    and each installed package whose version is outside ``requirements.txt`` (looked for beside utils.py or
    one folder up), with the pip command that fixes it.

    Args:
        lab: Optional lab name shown in the header, e.g. ``"lab1"``.

    Returns:
        None
    """
    print("\n".join(_private.environment_report(lab, SCALE, ATTENTION_BACKEND, GPU_SPECS, detect_gpu)))


def quiet_library_messages() -> None:
    """Silence what a correct run prints that is not about your code and that you cannot act on.

    Kineto's ``USDT:... profiler_start`` lines on stderr at every profiler start and stop, Inductor's benign
    autotuning errors (a candidate kernel too big for the GPU's shared memory, which it skips), its AUTOTUNE table
    of candidate timings and its "Autotune Choices Stats" JSON after every ``max-autotune`` search, and a few warnings
    raised inside PyTorch's own code. Every other message, warning and error still shows. Each lab's setup cell calls
    it; importing utils changes nothing by itself.

    Returns:
        None
    """
    _private.quiet_library_messages()


# =====================================================================================================
# 2. Model configs and helpers (Gemma-3; built from configs, no weights are downloaded)
# =====================================================================================================

# The real gemma-3-270m interleaves five sliding-window (512-token) layers with one global layer. The lab's
# Gemma3DecoderLayer implements global (full) causal attention only, so both configs list every layer as
# "full_attention": config, KV cache and layer then agree. "sdpa" is the attention function the layer looks
# up in transformers' ALL_ATTENTION_FUNCTIONS.
_GEMMA3_COMMON = dict(
    vocab_size=262_144,
    head_dim=256,
    max_position_embeddings=32_768,
    rms_norm_eps=1e-6,
    query_pre_attn_scalar=256,
    sliding_window=512,
    hidden_activation="gelu_pytorch_tanh",
    attention_bias=False,
    attention_dropout=0.0,
    attn_implementation="sdpa",
)
# Each config's own sizes, by its public name.
_GEMMA3_CONFIGS = {
    # google/gemma-3-270m-it text config.
    "GEMMA3_270M_CONFIG": dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                               num_attention_heads=4, num_key_value_heads=1),
    # A larger Gemma-3-shaped model (the handout's "pseudo" config): 8 query and 8 KV heads, 26 layers.
    "GEMMA3_PESUDO_CONFIG": dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                 num_attention_heads=8, num_key_value_heads=8),
}
# The handout spells the larger config "PESUDO", and code that follows it keeps that name; the correct spelling
# names the same object.
_SAME_CONFIG = {"GEMMA3_PSEUDO_CONFIG": "GEMMA3_PESUDO_CONFIG"}


def __getattr__(name):
    """The ``GEMMA3_*_CONFIG`` names, built when first used (PEP 562 module attributes): building a config imports
    transformers, which takes seconds, so ``import utils`` alone does not. Each is built once and kept."""
    key = _SAME_CONFIG.get(name, name)
    if key not in _GEMMA3_CONFIGS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if key not in globals():
        globals()[key] = _private.make_gemma3_config(**_GEMMA3_COMMON, **_GEMMA3_CONFIGS[key])
    globals()[name] = globals()[key]
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_GEMMA3_CONFIGS) | set(_SAME_CONFIG))


if importlib.util.find_spec("transformers") is None:
    # Without transformers, ``from utils import *`` still works; the configs and the KV cache are unavailable.
    __all__ = [name for name in __all__ if name not in _GEMMA3_CONFIGS and name not in _SAME_CONFIG]


def create_prefill_inputs(batch_size, seq_len, hidden_size, dtype=torch.float32, device=None):
    """Random hidden states and positions for a prefill step over a whole prompt.

    Args:
        batch_size: B.
        seq_len: S, prompt length in tokens.
        hidden_size: D, model width.
        dtype: dtype of the hidden states.
        device: Device of both tensors; default ``DEVICE``.

    Returns:
        tuple: ``hidden_states`` (B, S, D) of ``dtype``, standard normal; ``position_ids`` (B, S) int64, each
        row ``0, 1, ..., S-1``.
    """
    device = device if device is not None else DEVICE
    hidden_states = torch.randn(batch_size, seq_len, hidden_size, dtype=dtype, device=device)
    position_ids = torch.arange(seq_len, device=device).unsqueeze(0).expand(batch_size, -1)
    return hidden_states, position_ids


def create_decode_inputs_without_cache(batch_size, seq_len, hidden_size, dtype=torch.float32, device=None):
    """Inputs for one decode step that recomputes keys and values of the prompt (no KV cache).

    Args:
        batch_size: B.
        seq_len: S, number of tokens already processed (the prompt).
        hidden_size: D.
        dtype: dtype of the hidden states.
        device: Device of all tensors; default ``DEVICE``.

    Returns:
        tuple: ``decode_input`` (B, 1, D), the new token; ``position_ids`` (B, 1) int64, all equal to S (the
        new token's position); ``prefill_hidden_states`` (B, S, D), the prompt's hidden states from which the
        layer recomputes keys and values.
    """
    device = device if device is not None else DEVICE
    decode_input = torch.randn(batch_size, 1, hidden_size, dtype=dtype, device=device)
    position_ids = torch.full((batch_size, 1), seq_len, dtype=torch.long, device=device)
    prefill_hidden_states = torch.randn(batch_size, seq_len, hidden_size, dtype=dtype, device=device)
    return decode_input, position_ids, prefill_hidden_states


def create_decode_inputs_with_cache(batch_size, seq_len, hidden_size, dtype=torch.float32, device=None):
    """Inputs for one decode step that reads the prompt's keys and values from a KV cache.

    Args:
        batch_size: B.
        seq_len: S, number of tokens already in the cache.
        hidden_size: D.
        dtype: dtype of the hidden states.
        device: Device of all tensors; default ``DEVICE``.

    Returns:
        tuple: ``decode_input`` (B, 1, D); ``position_ids`` (B, 1) int64, all equal to S; ``cache_positions``
        (1,) int64 ``[S]``, the cache slot the new token occupies.
    """
    device = device if device is not None else DEVICE
    decode_input = torch.randn(batch_size, 1, hidden_size, dtype=dtype, device=device)
    position_ids = torch.full((batch_size, 1), seq_len, dtype=torch.long, device=device)
    cache_positions = torch.tensor([seq_len], dtype=torch.long, device=device)
    return decode_input, position_ids, cache_positions


def get_position_embeddings(hidden_states, position_ids, rotary_emb, layer_type="full_attention"):
    """Rotary position embeddings (cos, sin) for the given positions.

    Args:
        hidden_states: (B, S, D) tensor; only its dtype and device are used.
        position_ids: (B, S) or (1, S) int64 positions.
        rotary_emb: A Gemma-3 rotary embedding module (the lab's ``Gemma3RotaryEmbedding`` or transformers').
        layer_type: Which RoPE parameters to use, ``"full_attention"`` for the lab's layer.

    Returns:
        tuple: ``(cos, sin)``, each (position_ids.shape[0], S, head_dim) in ``hidden_states.dtype``.
    """
    with torch.no_grad():
        return rotary_emb(hidden_states, position_ids, layer_type=layer_type)


class KVCacheLayer:
    """One layer's KV cache: key and value buffers allocated once, written in place.

    The first ``update`` (a prefill) allocates two ``(B, H_kv, max_cache_len, head_dim)`` buffers, writes the
    prompt's keys and values at positions ``0..S-1`` and sets ``length = S``. Every later ``update`` (a decode
    step) writes the new tokens' keys and values in place at positions ``length, length+1, ...`` (the step's
    ``cache_position``) and returns views of the filled prefix, positions ``0..length+q-1``: nothing is
    copied or concatenated, so a step reads the cache once, as an inference engine's static cache does.
    ``length`` only moves on ``advance``: a decode step called again (as a benchmark or a CUDA graph replay
    does) overwrites the same slot and measures the same step.

    Args:
        max_cache_len: Positions the buffers will hold, in tokens.

    Attributes:
        max_cache_len: Positions the buffers hold, in tokens.
        length: Tokens committed to the cache (0 when empty).
        key_buffer, value_buffer: The whole buffers, or None before the first update.
    """

    def __init__(self, max_cache_len):
        self.max_cache_len = int(max_cache_len)
        self.key_buffer = self.value_buffer = None
        self.length = 0

    @property
    def keys(self):
        """(B, H_kv, length, head_dim) view of the committed keys, or None when the cache is empty."""
        return None if self.length == 0 else self.key_buffer[:, :, :self.length]

    @property
    def values(self):
        """(B, H_kv, length, head_dim) view of the committed values, or None when the cache is empty."""
        return None if self.length == 0 else self.value_buffer[:, :, :self.length]

    def reset(self):
        """Empty the cache (a new sequence starts); the buffers are kept for reuse."""
        self.length = 0

    def advance(self, num_tokens=1):
        """Commit the last decode step's ``num_tokens`` tokens, so the next step writes after them."""
        if self.length + num_tokens > self.max_cache_len:
            raise ValueError(f"cannot advance to {self.length + num_tokens} tokens: max_cache_len is "
                             f"{self.max_cache_len}")
        self.length += num_tokens

    def _allocate(self, key_states, value_states):
        batch, heads, _, head_dim = key_states.shape
        shape = (batch, heads, self.max_cache_len, head_dim)
        if self.key_buffer is None or self.key_buffer.shape != shape or self.key_buffer.dtype != key_states.dtype \
                or self.key_buffer.device != key_states.device:
            self.key_buffer = self.value_buffer = None  # free the old buffers before allocating new ones
            self.key_buffer = torch.empty(shape, dtype=key_states.dtype, device=key_states.device)
            self.value_buffer = torch.empty(shape, dtype=value_states.dtype, device=value_states.device)

    def update(self, key_states, value_states):
        """Write new keys/values (B, H_kv, q, head_dim) in place; return the keys/values to attend over.

        Args:
            key_states: (B, H_kv, q, head_dim) keys of the q new tokens (the whole prompt on a prefill).
            value_states: Values, same shape.

        Returns:
            tuple: (keys, values), each a (B, H_kv, length + q, head_dim) view of the buffers: the cached
            tokens followed by the new ones.

        Raises:
            ValueError: The new tokens do not fit in ``max_cache_len`` positions.
        """
        new_tokens = key_states.shape[2]
        end = self.length + new_tokens
        if end > self.max_cache_len:
            raise ValueError(
                f"the KV cache holds max_cache_len={self.max_cache_len} tokens, but {self.length} cached plus "
                f"{new_tokens} new ones need {end}: make it with initialize_kv_cache(config, max_cache_len) "
                f"large enough for the prompt and every decoded token (a decode step after an S-token prompt "
                f"needs max_cache_len >= S + 1)")
        if self.length == 0:
            self._allocate(key_states, value_states)
            self.key_buffer[:, :, :end].copy_(key_states)
            self.value_buffer[:, :, :end].copy_(value_states)
            self.length = end
        else:
            self.key_buffer[:, :, self.length:end].copy_(key_states)
            self.value_buffer[:, :, self.length:end].copy_(value_states)
        return self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]


class KVCache:
    """A preallocated KV cache: one ``KVCacheLayer`` per layer, in ``.layers`` (see ``initialize_kv_cache``).

    Args:
        num_layers: Decoder layers, one ``KVCacheLayer`` each.
        max_cache_len: Positions each layer's buffers hold, in tokens.

    Attributes:
        layers: list of ``KVCacheLayer``, index = layer index.
    """

    def __init__(self, num_layers, max_cache_len):
        self.layers = [KVCacheLayer(max_cache_len) for _ in range(num_layers)]

    def get_seq_length(self, layer_idx=0):
        """Tokens committed to layer ``layer_idx``'s cache."""
        return self.layers[layer_idx].length

    def reset(self):
        """Empty every layer (the buffers are kept)."""
        for layer in self.layers:
            layer.reset()

    def advance(self, num_tokens=1):
        """Commit the last decode step's tokens in every layer."""
        for layer in self.layers:
            layer.advance(num_tokens)


def initialize_kv_cache(config, max_cache_len):
    """An empty, preallocated KV cache with one slot per layer of ``config``.

    Slot i (``cache.layers[i]``, a ``KVCacheLayer``) allocates its key and value buffers of ``max_cache_len``
    positions on the first write (the prefill, which fixes batch size, heads, dtype and device); a decode step
    then writes its new token into the buffers in place and attends over the filled prefix. Repeated decode
    steps overwrite the same position (a benchmark measures the same step) until ``cache.advance()``.

    Args:
        config: A model config with ``num_hidden_layers`` (Gemma-3, GPT-2).
        max_cache_len: Positions per slot, in tokens: the prompt plus every token to decode (a prompt of S
            tokens and one decode step need ``S + 1``).

    Returns:
        KVCache with ``len(cache.layers) == config.num_hidden_layers``, every slot empty.

    Raises:
        ValueError: ``max_cache_len`` is not a positive number of tokens.
    """
    if int(max_cache_len) <= 0:
        raise ValueError(f"max_cache_len must be a positive number of tokens, got {max_cache_len}")
    return KVCache(config.num_hidden_layers, int(max_cache_len))


def multi_layer_prefill_forward(num_layers, layer, hidden_states, position_ids, position_embeddings,
                                past_key_values):
    """Prefill: run the prompt through ``layer`` applied ``num_layers`` times, storing each pass's keys/values.

    Pass i reads and writes cache slot i (the one layer object is handed a view of slot i), so after the call slot i
    holds the keys and values of the prompt at layer i, each (B, num_key_value_heads, S, head_dim). A prefill starts
    a new sequence: slots 0..num_layers-1 are emptied first, so calling it repeatedly (as a benchmark does) costs
    the same every time. Runs under ``torch.no_grad()``.

    Args:
        num_layers: How many layers to simulate (e.g. ``config.num_hidden_layers``).
        layer: The lab's ``Gemma3DecoderLayer`` (one object, reused for every pass).
        hidden_states: (B, S, D) prompt hidden states from ``create_prefill_inputs``.
        position_ids: (B, S) positions from ``create_prefill_inputs``.
        position_embeddings: ``(cos, sin)`` from ``get_position_embeddings``.
        past_key_values: Cache from ``initialize_kv_cache`` with at least ``num_layers`` slots.

    Returns:
        torch.Tensor: (B, S, D) hidden states after the last pass.
    """
    _private.check_cache(past_key_values, num_layers)
    for slot in past_key_values.layers[:num_layers]:
        slot.reset()
    with torch.no_grad():
        for i in range(num_layers):
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                past_key_values=_private.CacheSlot(past_key_values, i),
                use_kv_cache=True,
            )
    return hidden_states


def multi_layer_decode_forward(num_layers, layer, hidden_states, position_ids, position_embeddings,
                               past_key_values, cache_positions, use_kv_cache, prefill_hidden_states):
    """Decode one token through ``layer`` applied ``num_layers`` times, with or without the KV cache.

    With the cache (``use_kv_cache=True``), pass i writes the new token's key and value into slot i's buffers
    in place (position S) and attends over positions 0..S; the slot's length stays S until
    ``past_key_values.advance()``, so repeated calls (a benchmark, a CUDA graph replay) each measure the same
    step. Nothing in this call synchronizes with the GPU, so it can be captured as a CUDA graph
    (``capture_cuda_graph``). Without it, every pass recomputes keys and values of the S prompt tokens from
    ``prefill_hidden_states`` (the same tensor stands in for each layer's input). Runs under
    ``torch.no_grad()``.

    Args:
        num_layers: How many layers to simulate.
        layer: The lab's ``Gemma3DecoderLayer``.
        hidden_states: (B, 1, D) new-token hidden states.
        position_ids: (B, 1) positions, all equal to S.
        position_embeddings: ``(cos, sin)`` for the new token, from ``get_position_embeddings``.
        past_key_values: With the cache: the cache filled by ``multi_layer_prefill_forward``; else None.
        cache_positions: (1,) ``[S]`` from ``create_decode_inputs_with_cache``, or None without the cache.
        use_kv_cache: Whether to read keys/values from the cache.
        prefill_hidden_states: Without the cache: (B, S, D) prompt hidden states; else None.

    Returns:
        torch.Tensor: (B, 1, D) hidden states after the last pass.
    """
    if use_kv_cache:
        _private.check_cache(past_key_values, num_layers)
        empty = [i for i in range(num_layers) if past_key_values.layers[i].keys is None]
        if empty:
            raise ValueError(f"cache slots {empty} are empty: run multi_layer_prefill_forward with this cache "
                             f"before decoding with use_kv_cache=True")
    elif prefill_hidden_states is None:
        raise ValueError("use_kv_cache=False needs prefill_hidden_states (B, S, D) to recompute keys and values")
    with torch.no_grad():
        for i in range(num_layers):
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                past_key_values=_private.CacheSlot(past_key_values, i) if use_kv_cache else None,
                cache_position=cache_positions if use_kv_cache else None,
                use_kv_cache=use_kv_cache,
                prefill_hidden_states=None if use_kv_cache else prefill_hidden_states,
            )
    return hidden_states


def gpt2_decoder_forward(model, input_ids):
    """The decoder stack of a transformers GPT-2 model over all N tokens, with eager attention and no cache.

    Runs the model's own modules (``model.transformer``: token and position embeddings, every block, the
    final layer norm) with the attention written out as Lab 3 counts it: ``Q K^T`` times the scale, the causal
    mask, softmax, ``A V``, each a kernel that writes its result. It is the uncached pass Lab 3 measures; the
    cached decode step is the student's own (Lab 3, Question 4.6). Nothing synchronizes with the GPU, so a call
    can be captured as a CUDA graph (``capture_cuda_graph``). Runs under ``torch.no_grad()``.

    Args:
        model: A ``GPT2LMHeadModel`` or ``GPT2Model`` (its ``.transformer``, or itself, holds the blocks).
        input_ids: (B, N) int64 token ids.

    Returns:
        torch.Tensor: (B, N, D) hidden states after the final layer norm.

    Raises:
        ValueError: N exceeds the model's ``n_positions``.
    """
    body = getattr(model, "transformer", model)
    tokens = input_ids.shape[1]
    if tokens > body.config.n_positions:
        raise ValueError(f"{tokens} positions exceed the model's n_positions={body.config.n_positions}")
    with torch.no_grad():
        positions = torch.arange(tokens, device=input_ids.device)
        hidden_states = body.wte(input_ids) + body.wpe(positions)
        for i, block in enumerate(body.h):
            hidden_states = hidden_states + _private.gpt2_attention(block, block.ln_1(hidden_states), i)
            hidden_states = hidden_states + block.mlp(block.ln_2(hidden_states))
        return body.ln_f(hidden_states)


# =====================================================================================================
# 3. Measurement
# =====================================================================================================

def benchmark_latency(fn, *args, n_warmup=10, n_repeat=100, stat="median", measure_on=None, **kwargs):
    """Latency of ``fn(*args, **kwargs)`` in milliseconds, warmup excluded.

    On CUDA each timed call sits between two CUDA events recorded on the current stream; the calls are
    issued back to back and the device is synchronized once after warmup and once at the end, so the
    figure is GPU time per call in steady state (as ``triton.testing.do_bench`` measures it, without its
    L2 flush). On CPU each call is timed with ``time.perf_counter``.

    Args:
        fn: The callable to time.
        *args: Positional arguments for fn.
        n_warmup: Untimed calls first (compilation, cuBLAS heuristics, caches).
        n_repeat: Timed calls.
        stat: ``"median"`` (robust to outliers), ``"mean"`` or ``"min"`` of the timed calls.
        measure_on: ``"cuda"`` or ``"cpu"`` timing; default: CUDA if any tensor argument (or fn's
            parameters) is on CUDA, CPU if all are on CPU, else ``DEVICE``. (Named so that a ``device=``
            keyword still reaches fn.)
        **kwargs: Keyword arguments for fn.

    Returns:
        float: Latency per call in ms.
    """
    if stat not in _private.STATISTICS:
        raise ValueError(f"stat must be one of {', '.join(_private.STATISTICS)}, got {stat!r}")
    if n_repeat < 1:
        raise ValueError(f"n_repeat must be at least 1, got {n_repeat}")
    device = _private.timing_device(fn, args, kwargs, measure_on, DEVICE)
    if device.type == "cuda":
        for _ in range(n_warmup):
            fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        for start, end in zip(starts, ends):
            start.record()
            fn(*args, **kwargs)
            end.record()
        torch.cuda.synchronize(device)
        times_ms = [start.elapsed_time(end) for start, end in zip(starts, ends)]
    else:
        for _ in range(n_warmup):
            fn(*args, **kwargs)
        times_ms = []
        for _ in range(n_repeat):
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            times_ms.append((time.perf_counter() - t0) * 1e3)
    return float(_private.STATISTICS[stat](times_ms))


def capture_cuda_graph(fn, *args, n_warmup=3, **kwargs):
    """Record ``fn(*args, **kwargs)`` once as a CUDA graph; return a function that replays it.

    A replay launches every recorded kernel with one call (``cudaGraphLaunch``): the CPU's per-kernel launch
    work, which bounds small steps such as a decode step, disappears. The replay reuses the recorded tensors:
    it reads the inputs' memory as it is at replay time and rewrites the recorded output tensor, which the
    replay function returns. ``fn`` must not synchronize with the GPU (``.item()``, printing a CUDA tensor,
    data-dependent shapes); it is called ``n_warmup`` times on a side stream first, as CUDA graph capture
    requires.

    Args:
        fn: The callable to record.
        *args: Positional arguments for fn.
        n_warmup: Calls before recording (lazy initialization, cuBLAS handles and workspaces).
        **kwargs: Keyword arguments for fn.

    Returns:
        A function of no arguments that replays the graph and returns the recorded output, or None when
        CUDA is not available (a graph cannot mean anything on a CPU).
    """
    if not torch.cuda.is_available():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(n_warmup):
            fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    # The graph allocates from a private pool: hand the blocks cached by earlier calls back to the device first, so
    # a step that fits in memory eagerly also fits when recorded.
    torch.cuda.empty_cache()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn(*args, **kwargs)

    def replay():
        graph.replay()
        return output

    replay.graph = graph
    return replay


def benchmark_eager_and_graphed(fn, *args, n_warmup=3, n_repeat=10, **kwargs):
    """Latency in ms of ``fn(*args, **kwargs)`` launched eagerly and replayed as a CUDA graph.

    Both are medians of ``n_repeat`` timed calls after ``n_warmup`` untimed ones (``benchmark_latency``). The
    eager time includes the CPU's work to launch every kernel; the graph time is what the GPU needs once that
    work is gone, the number to hold against a roofline prediction. The graph is released before returning.

    Args:
        fn: The callable (it must not synchronize with the GPU; see ``capture_cuda_graph``).
        *args: Positional arguments for fn.
        n_warmup: Untimed calls of each version.
        n_repeat: Timed calls of each version.
        **kwargs: Keyword arguments for fn.

    Returns:
        dict: ``eager_ms``; ``graph_ms`` (None off CUDA, where graphs do not exist); ``measured_ms``, the
        graph time where there is one, else the eager time.
    """
    device = _private.timing_device(fn, args, kwargs, None, DEVICE)
    eager_ms = benchmark_latency(fn, *args, n_warmup=n_warmup, n_repeat=n_repeat, measure_on=device, **kwargs)
    graph_ms = None
    if device.type == "cuda":
        replay = capture_cuda_graph(fn, *args, n_warmup=1, **kwargs)
        graph_ms = benchmark_latency(replay, n_warmup=n_warmup, n_repeat=n_repeat, measure_on=device)
        del replay
        torch.cuda.empty_cache()
    return {"eager_ms": eager_ms, "graph_ms": graph_ms, "measured_ms": eager_ms if graph_ms is None else graph_ms}


_GRAPHING_COMPILE_MODES = ("reduce-overhead", "max-autotune")


def benchmark_compiled_and_graphed(fn, *args, mode=None, n_warmup=3, n_repeat=10, **kwargs):
    """Compile ``fn`` with ``torch.compile``, then time it launched from Python and replayed as a CUDA graph.

    Compiling fuses chains of small operations (norms, RoPE, residuals, activations) into a few generated
    kernels, so a step launches far fewer kernels; replaying the compiled step as a CUDA graph
    (``capture_cuda_graph``) then removes the CPU's launch work for the kernels that remain. The first call
    compiles (seconds to minutes, once per process); it is timed on its own and left out of the latencies.

    Args:
        fn: The callable to compile (it must not synchronize with the GPU; see ``capture_cuda_graph``).
        *args: Positional arguments for fn.
        mode: ``torch.compile`` mode: None (default) or ``"max-autotune-no-cudagraphs"`` (tunes the matrix
            kernels, compiles longer). Modes that record CUDA graphs of their own are refused: the graph here
            is recorded by ``capture_cuda_graph``.
        n_warmup: Untimed calls of each version, after the compiling call.
        n_repeat: Timed calls of each version.
        **kwargs: Keyword arguments for fn.

    Returns:
        dict: ``compile_s``, seconds of the first (compiling) call; ``compiled_ms``, the compiled step
        launched from Python; ``graph_ms``, the compiled step replayed as a CUDA graph (None off CUDA);
        ``measured_ms``, the graph time where there is one, else ``compiled_ms``; ``kernels``,
        ``count_kernels_per_call`` of the compiled step (kernels per call, by category).

    Raises:
        ValueError: ``mode`` records CUDA graphs itself (``"reduce-overhead"``, ``"max-autotune"``).
    """
    if mode in _GRAPHING_COMPILE_MODES:
        raise ValueError(f"mode={mode!r} records CUDA graphs inside torch.compile; use mode=None or "
                         f"'max-autotune-no-cudagraphs': benchmark_compiled_and_graphed records the graph itself")
    device = _private.timing_device(fn, args, kwargs, None, DEVICE)
    compiled = torch.compile(fn, mode=mode)
    start = time.perf_counter()
    compiled(*args, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    compile_s = time.perf_counter() - start
    times = benchmark_eager_and_graphed(compiled, *args, n_warmup=n_warmup, n_repeat=n_repeat, **kwargs)
    return {"compile_s": compile_s, "compiled_ms": times["eager_ms"], "graph_ms": times["graph_ms"],
            "measured_ms": times["measured_ms"], "kernels": count_kernels_per_call(compiled, *args, **kwargs)}


def benchmark_memory(fn, *args, n_warmup=3, n_repeat=10, measure_on=None, **kwargs):
    """Peak memory of ``fn(*args, **kwargs)`` above what was allocated before it, in GB (1e9 bytes).

    On CUDA it reads the caching allocator: baseline ``torch.cuda.memory_allocated()`` after warmup, then the
    peak ``torch.cuda.max_memory_allocated()`` over ``n_repeat`` calls (each call's output is freed before
    the next, so outputs do not pile up). On CPU there is no allocator counter, so it records every CPU
    tensor allocation and free during the calls with the PyTorch profiler (``profile_memory=True``) and
    replays them in time order; this counts tensor memory only (not Python objects or allocator slack).
    An out-of-memory error is raised as usual (wrap the call in ``run_oom_safe`` to get a status instead).

    Args:
        fn: The callable to measure.
        *args: Positional arguments for fn (already allocated: they are part of the baseline).
        n_warmup: Untimed calls first.
        n_repeat: Measured calls; the peak is over all of them.
        measure_on: ``"cuda"`` or ``"cpu"``; default as in ``benchmark_latency``.
        **kwargs: Keyword arguments for fn.

    Returns:
        tuple: ``(peak_gb, allocated_gb)``: the peak above baseline while fn ran (workspace plus output), and
        what stayed allocated above baseline right after the last call with its output still alive (output
        plus anything fn keeps), both in GB.
    """
    if n_repeat < 1:
        raise ValueError(f"n_repeat must be at least 1, got {n_repeat}")
    device = _private.timing_device(fn, args, kwargs, measure_on, DEVICE)
    for _ in range(n_warmup):
        out = fn(*args, **kwargs)
        del out
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(n_repeat - 1):
            out = fn(*args, **kwargs)
            del out
        out = fn(*args, **kwargs)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - baseline
        allocated = torch.cuda.memory_allocated(device) - baseline
        del out
        return peak / 1e9, allocated / 1e9
    _private.note_once("cpu-memory", "benchmark_memory: on CPU, memory comes from the profiler's record of tensor "
                             "allocations (no CUDA allocator here).")
    peak, allocated = _private.cpu_memory_trace(fn, args, kwargs, n_repeat)
    return peak / 1e9, allocated / 1e9


default_schedule = torch.profiler.schedule(wait=1, warmup=3, active=5, repeat=1)
"""torch.profiler schedule for a loop of 10 ``prof.step()`` calls: step 0 is skipped, steps 1-3 warm up
(not recorded), steps 4-8 are recorded (5 active steps), step 9 runs unprofiled. Use it as
``profile(schedule=default_schedule)``; counts and tables then cover 5 iterations."""


def count_cuda_kernels(prof, per_step=False):
    """Count the device kernels a profiled region launched, by category.

    On a CUDA profile it counts every device-side event (kernels, memcpy, memset) of the recorded steps;
    user annotations (``record_function`` ranges, ``ProfilerStep#``) are not kernels and are left out.
    Without CUDA events (a CPU run) there are no kernels, so it counts CPU operator calls instead: the
    outermost ``aten::`` ops that compute or copy data (views, allocations and composite wrappers such as
    ``aten::linear`` are skipped and their working child counted; ops nested inside a counted op are not
    counted again). Each such call is roughly one kernel on a GPU (RMSNorm written as pow, mean, add, rsqrt,
    mul counts 5). ``"device"`` says which was counted.

    Args:
        prof: A finished ``torch.profiler.profile`` (or anything with ``.events()``, or a list of
            FunctionEvents).
        per_step: Divide the counts by the number of recorded ``ProfilerStep`` ranges (per loop iteration).

    Returns:
        dict: one int per category (``"gemm"``, ``"attention"``, ``"elementwise"``, ``"reduction"``,
        ``"memcpy/memset"``, ``"other"``), ``"total"`` (their sum), ``"steps"`` (recorded profiler steps,
        0 without a schedule) and ``"device"`` (``"cuda"`` or ``"cpu"``, a str).
    """
    events = _private.profile_events(prof)
    cuda_type = torch.autograd.DeviceType.CUDA
    cuda_events = [e for e in events if e.device_type == cuda_type and not _private.is_annotation(e)]
    activities = getattr(prof, "activities", None) or ()
    cuda_mode = bool(cuda_events) or (torch.profiler.ProfilerActivity.CUDA in activities
                                      and torch.cuda.is_available())
    counted = cuda_events if cuda_mode else _private.outermost_working_ops(events)
    counts = {category: 0 for category in _private.KERNEL_CATEGORIES}
    for evt in counted:
        counts[_private.kernel_category(evt.name)] += 1
    steps = sum(1 for e in events if e.name.startswith("ProfilerStep") and e.device_type != cuda_type)
    if per_step and steps:
        counts = {k: int(round(v / steps)) for k, v in counts.items()}
    counts["total"] = sum(counts[c] for c in _private.KERNEL_CATEGORIES)
    counts["steps"] = steps
    counts["device"] = "cuda" if cuda_mode else "cpu"
    return counts


def count_kernels_per_call(fn, *args, **kwargs):
    """Kernels that one call of ``fn(*args, **kwargs)`` launches, by category.

    Profiles 10 calls under ``default_schedule`` (5 recorded) and counts with
    ``count_cuda_kernels(prof, per_step=True)``. A function that replays a CUDA graph counts the kernels the
    graph runs. Where fn runs on the CPU, operator calls are counted instead (see ``count_cuda_kernels``).

    Args:
        fn: The callable to profile.
        *args: Positional arguments for fn.
        **kwargs: Keyword arguments for fn.

    Returns:
        dict: kernels per call in each category (``"gemm"``, ``"attention"``, ``"elementwise"``,
        ``"reduction"``, ``"memcpy/memset"``, ``"other"``), ``"total"``, ``"steps"`` (calls recorded) and
        ``"device"``, as ``count_cuda_kernels`` returns them.
    """
    from torch.profiler import ProfilerActivity, profile

    on_cuda = _private.timing_device(fn, args, kwargs, None, DEVICE).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities, schedule=default_schedule) as prof:
        for _ in range(10):
            fn(*args, **kwargs)
            prof.step()
        if on_cuda:
            torch.cuda.synchronize()
    return count_cuda_kernels(prof, per_step=True)


def run_oom_safe(fn, *args, **kwargs):
    """Call ``fn(*args, **kwargs)``; report running out of memory as a status instead of raising.

    After an out-of-memory error (``torch.cuda.OutOfMemoryError``, a CPU ``MemoryError``, or a RuntimeError
    saying "out of memory") it drops the failed call's tensors and returns cached CUDA memory, so the next
    call starts clean. Other exceptions propagate.

    Args:
        fn: The callable.
        *args: Positional arguments for fn.
        **kwargs: Keyword arguments for fn.

    Returns:
        tuple: ``("ok", fn's result)`` or ``("oom", None)``.
    """
    oom = False
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 (re-raised below unless it is an OOM)
        if not _private.is_oom(exc):
            raise
        oom = True
    # Outside the except block the traceback (and the frames holding the failed call's tensors) is released.
    if oom:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return "oom", None


def mark_oom(table, status_col="status", float_format=lambda value: f"{value:.4g}"):
    """A copy of a results table for printing, with the cells an out-of-memory row could not fill shown as "OOM".

    Sweeps record a row per size with ``run_oom_safe``'s status; a row whose status is ``"oom"`` has no numbers
    (None or NaN), and printing NaN hides why. Here every number is formatted with ``float_format``, a missing
    value in an ``"oom"`` row becomes ``"OOM"`` and any other missing value ``"-"``. The status column and
    columns that are not numbers are kept as they are.

    Args:
        table: A pandas DataFrame with a status column.
        status_col: The column holding ``"ok"``/``"oom"``.
        float_format: Formats one float (units are the column's own).

    Returns:
        A new DataFrame of strings (the same index and columns), ready for ``to_string`` or ``pivot``.

    Raises:
        KeyError: the table has no column ``status_col``.
    """
    if status_col not in table.columns:
        raise KeyError(f"mark_oom needs the status column {status_col!r} ('ok' or 'oom' per row); "
                       f"the table has {list(table.columns)}")
    oom_rows = table[status_col].astype(str).str.lower() == "oom"
    shown = table.copy().astype(object)

    def cell(value, oom):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "OOM" if oom else "-"
        if isinstance(value, (float, np.floating)):
            return float_format(float(value))
        return value

    for column in table.columns:
        if column != status_col:
            shown[column] = [cell(value, oom) for value, oom in zip(table[column].tolist(), oom_rows.tolist())]
    return shown


# =====================================================================================================
# 4. Attention backends
# =====================================================================================================

ATTENTION_BACKEND = _private.describe_backend()
"""str: What ``flash_attn_func`` runs on this machine: the flash-attn package, PyTorch's SDPA flash kernel,
or the SDPA math path on CPU."""

def flash_attn_func(q, k, v, causal=False, softmax_scale=None):
    """Attention in flash-attn's layout: ``softmax(q k^T * scale) v`` per head.

    Runs the flash-attn package when installed (CUDA, fp16/bf16); otherwise PyTorch's SDPA FlashAttention-2
    kernel on CUDA (fp16/bf16 on sm80+; other dtypes, older GPUs or masked shapes use SDPA's memory-efficient
    or math kernel), and the SDPA math path on CPU. Prints once which backend ran; ``flash_attn_func.last_backend``
    names the backend of the latest call.

    Args:
        q: (B, S_q, H, D) queries.
        k: (B, S_kv, H_kv, D) keys; H must be a multiple of H_kv (grouped-query attention).
        v: (B, S_kv, H_kv, D) values.
        causal: Causal mask, aligned bottom-right as in flash-attn (query i sees keys j <= i + S_kv - S_q).
        softmax_scale: Scale of the scores; default 1 / sqrt(D).

    Returns:
        torch.Tensor: (B, S_q, H, D) output, dtype and device of q.
    """
    from torch.nn.attention import SDPBackend

    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flash_attn_func expects (B, S, H, D) tensors, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(f"incompatible shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         f"need equal B and D, k and v alike, and H a multiple of H_kv")
    half = q.dtype in (torch.float16, torch.bfloat16)
    out = None
    if q.is_cuda and half and _private.FLASH_ATTN_INSTALLED:
        try:
            from flash_attn import flash_attn_func as _flash_attn

            out, backend = _flash_attn(q, k, v, causal=causal, softmax_scale=softmax_scale), "flash-attn"
        except (ImportError, RuntimeError):  # a broken install, or a GPU the package does not support
            out = None
    if out is None and q.is_cuda and half and not (causal and q.shape[1] != k.shape[1]) and q.shape[3] <= 256:
        try:
            backend = "PyTorch SDPA flash kernel"
            out = _private.sdpa_bshd(q, k, v, causal, softmax_scale, [SDPBackend.FLASH_ATTENTION])
        except RuntimeError:  # no flash kernel for this GPU (before sm80, e.g. T4)
            out = None
    if out is None and q.is_cuda:
        backend = "PyTorch SDPA memory-efficient/math kernel"
        out = _private.sdpa_bshd(q, k, v, causal, softmax_scale, [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    elif out is None:
        backend = "PyTorch SDPA math path (CPU)"
        out = _private.sdpa_bshd(q, k, v, causal, softmax_scale, [SDPBackend.MATH])
    flash_attn_func.last_backend = backend
    _private.note_once(("attention", backend), f"flash_attn_func: using {backend}")
    return out


flash_attn_func.last_backend = None


# =====================================================================================================
# 5. Plotting (matplotlib; every function returns the figure and its axes)
# =====================================================================================================

def plot_roofline(gpu_name, peak_tflops, peak_bandwidth_tb_s, operations, title=None, ax=None,
                  measured_tflops=None, measured_bandwidth_tb_s=None, measured_label="measured",
                  measured_only=False):
    """Roofline plot (log-log) with operations placed by arithmetic intensity.

    The roof is ``min(peak_tflops, peak_bandwidth_tb_s * intensity)``; the ridge point
    ``peak_tflops / peak_bandwidth_tb_s`` (FLOP/byte) is marked, the memory-bound region (left of it) and
    compute-bound region (right) are shaded, and each operation is drawn and labelled on the roof. With measured
    ceilings (``measured_tflops`` and ``measured_bandwidth_tb_s``, e.g. from ``measure_roofline``) a second roof is
    drawn beside the first, with its own ridge point, and the regions are shaded by the measured ridge: what this
    machine reaches, not what its datasheet promises.

    Args:
        gpu_name: Label of the hardware (e.g. ``"A6000"``).
        peak_tflops: Peak compute in TFLOP/s (the datasheet's, or a measured one when there is no datasheet).
        peak_bandwidth_tb_s: Peak memory bandwidth in TB/s.
        operations: dict name -> arithmetic intensity (FLOP/byte), or name -> (intensity, measured TFLOP/s)
            to also place a measured point below the roof.
        title: Plot title; default names the GPU and its peaks.
        ax: Axes to draw on; default a new figure.
        measured_tflops: Optional measured compute ceiling in TFLOP/s (a large matmul).
        measured_bandwidth_tb_s: Optional measured memory ceiling in TB/s (a large copy); given with
            ``measured_tflops``.
        measured_label: How the legend names the measured roof (e.g. ``"measured on this CPU"``).
        measured_only: When True, an operation with a measured TFLOP/s is drawn only at its measured point
            (labelled with its name), not also on the roof: for many operations on one plot.

    Returns:
        tuple: ``(fig, ax)``.
    """
    parsed = _private.roofline_operations(operations)
    measured_roof = _private.measured_ceilings(measured_tflops, measured_bandwidth_tb_s)
    peak, bandwidth = float(peak_tflops), float(peak_bandwidth_tb_s)
    ridge = peak / bandwidth
    shade_ridge = measured_roof[0] / measured_roof[1] if measured_roof else ridge
    intensities = [ridge, shade_ridge] + [i for _, i, _ in parsed]
    lo, hi = min(intensities) / 8, max(intensities) * 8
    fig, ax = _private.new_axes(ax, (8, 5.5))
    y_values = _private.draw_roofs(ax, (lo, hi), gpu_name, peak, bandwidth, measured_roof, measured_label)
    y_values += _private.draw_roofline_operations(ax, parsed, peak, bandwidth, measured_only)
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(y_values) / 5, max(y_values) * 5)
    ax.set_xlabel("Arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("Attainable performance (TFLOP/s)")
    ax.set_title(title or f"Roofline: {gpu_name} ({peak:g} TFLOP/s, {bandwidth:g} TB/s)")
    ax.grid(True, which="both", alpha=0.3)
    if len(parsed) > 6:  # many operations: the legend goes beside the plot, where it hides none of them
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, borderaxespad=0.0)
    else:
        ax.legend(loc="lower right", fontsize=7)
    return fig, ax


def plot_gemm_torch_matmul_latency(sizes, gemm_latencies_s, matmul_latencies_s, ax=None):
    """Latency of the tri-loop ``gemm`` against ``torch.matmul`` for square matrices.

    Args:
        sizes: Matrix sizes N (each product is (N, N) @ (N, N)).
        gemm_latencies_s: Tri-loop gemm latency per size, in seconds.
        matmul_latencies_s: torch.matmul latency per size, in seconds.
        ax: Axes to draw on; default a new figure.

    Returns:
        tuple: ``(fig, ax)``; latencies are drawn in ms on a log axis, each size labelled with the speedup.
    """
    sizes = [int(s) for s in sizes]
    gemm_ms = [_private.as_float(t) * 1e3 for t in gemm_latencies_s]
    matmul_ms = [_private.as_float(t) * 1e3 for t in matmul_latencies_s]
    if not len(sizes) == len(gemm_ms) == len(matmul_ms):
        raise ValueError("sizes, gemm_latencies_s and matmul_latencies_s must have the same length")
    fig, ax = _private.new_axes(ax, (7, 4.5))
    ax.plot(sizes, gemm_ms, marker="o", label="tri-loop gemm")
    ax.plot(sizes, matmul_ms, marker="s", label="torch.matmul")
    for n, slow, fast in zip(sizes, gemm_ms, matmul_ms):
        if fast > 0 and math.isfinite(slow):
            ax.annotate(f"{slow / fast:,.0f}x", (n, math.sqrt(slow * fast)), ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xlabel("Matrix size N ((N, N) @ (N, N))")
    ax.set_ylabel("Latency (ms, log scale)")
    ax.set_title("Tri-loop gemm vs torch.matmul")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig, ax


def plot_latency_vs_size(sizes, series, xlabel="Size", ylabel="Latency (ms)", title="Latency vs size",
                         logy=True, logx=False, ax=None):
    """Line plot of one or more latency series against a size.

    Args:
        sizes: x values (matrix size, sequence length, batch size, ...).
        series: dict label -> list of latencies (same length as sizes; None or NaN marks a missing point,
            e.g. out of memory, and is skipped).
        xlabel: x-axis label, with its unit.
        ylabel: y-axis label, with its unit (the values are drawn as given).
        title: Plot title.
        logy: Log-scale y axis.
        logx: Log-scale x axis (base 2).
        ax: Axes to draw on; default a new figure.

    Returns:
        tuple: ``(fig, ax)``.
    """
    xs = [_private.as_float(s) for s in sizes]
    fig, ax = _private.new_axes(ax, (7, 4.5))
    for label, values in series.items():
        values = [_private.as_float(v) for v in values]
        if len(values) != len(xs):
            raise ValueError(f"series {label!r} has {len(values)} values for {len(xs)} sizes")
        points = [(x, y) for x, y in zip(xs, values) if math.isfinite(y)]
        if points:
            ax.plot(*zip(*points), marker="o", label=str(label))
    if logy:
        ax.set_yscale("log")
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig, ax


def plot_flash_attn_improvement(df, title="FlashAttention vs SDPA", latency_cols=("sdpa_ms", "flash_ms"),
                                memory_cols=("sdpa_mem_gb", "flash_mem_gb"), seq_len_col="seq_len",
                                annotate_speedup=True, annotate_mem_reduction=True,
                                labels=("SDPA", "FlashAttention")):
    """Latency and peak memory of standard attention against FlashAttention over sequence length.

    Args:
        df: pandas DataFrame (or list of dicts) with one row per sequence length.
        title: Figure title.
        latency_cols: (baseline, flash) latency columns, in ms.
        memory_cols: (baseline, flash) peak-memory columns, in GB; None (or absent columns) draws latency only.
        seq_len_col: Sequence-length column, in tokens.
        annotate_speedup: Label each flash point with baseline / flash latency.
        annotate_mem_reduction: Label each flash point with baseline / flash memory.
        labels: Legend names of the baseline and the flash series.

    Returns:
        tuple: ``(fig, axes)``, axes a numpy array (latency panel, then memory panel if drawn). Rows where
        a value is None/NaN (out of memory) are left out of that series and marked "OOM".
    """
    import pandas as pd

    df = pd.DataFrame(df)
    panels = [("Latency (ms)", latency_cols, annotate_speedup, "{:.1f}x faster")]
    if memory_cols is not None and all(c in df.columns for c in memory_cols):
        panels.append(("Peak memory (GB)", memory_cols, annotate_mem_reduction, "{:.1f}x less"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    axes = axes[0]
    seq = [int(s) for s in df[seq_len_col]]
    for ax, (ylabel, (base_col, flash_col), annotate, template) in zip(axes, panels):
        base = [_private.as_float(v) if v is not None and not pd.isna(v) else float("nan") for v in df[base_col]]
        flash = [_private.as_float(v) if v is not None and not pd.isna(v) else float("nan") for v in df[flash_col]]
        for values, label, marker in ((base, labels[0], "o"), (flash, labels[1], "s")):
            points = [(s, y) for s, y in zip(seq, values) if math.isfinite(y)]
            if points:
                ax.plot(*zip(*points), marker=marker, label=label)
        finite = [y for y in base + flash if math.isfinite(y) and y > 0]
        top = max(finite) if finite else 1.0
        for s, b, f in zip(seq, base, flash):
            for value, label in ((b, labels[0]), (f, labels[1])):
                if not math.isfinite(value):
                    ax.annotate(f"{label}: OOM", (s, top), ha="center", va="bottom", fontsize=8, color="red")
            if annotate and math.isfinite(b) and math.isfinite(f) and f > 0 and b > 0:
                ax.annotate(template.format(b / f), (s, math.sqrt(b * f)), ha="center", va="center",
                            fontsize=8, bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
        ax.set_xscale("log", base=2)
        ax.set_xticks(seq)
        ax.set_xticklabels([str(s) for s in seq], rotation=45)
        if finite:
            ax.set_yscale("log")
            ax.set_ylim(min(finite) / 2, top * 3)
        ax.set_xlabel("Sequence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.set_title(ylabel.split(" (")[0])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig, axes


def plot_trace_timeline(prof_or_trace_path, max_rows=12, title=None, max_depth=2, time_range_us=None,
                        merge_below=0.002, ax=None):
    """Draw the timeline of a profiler trace in the notebook (what chrome://tracing would show).

    One row per GPU stream (kernels, memcpy, memset) and per CPU thread and nesting depth (operators and
    ``record_function`` ranges; depth 0 is outermost, ``ProfilerStep`` ranges become dotted step lines).
    Bars are coloured by the kernel category of ``count_cuda_kernels``; bars wide enough carry their
    (shortened) name. Runs of events narrower than ``merge_below`` of the time span with gaps below it are
    merged into one hatched bar, so hundreds of tiny kernels stay readable.

    Args:
        prof_or_trace_path: A finished ``torch.profiler.profile`` (read through ``prof.events()``, so it
            still works before or after ``prof.export_chrome_trace``, which a profile allows only once), a
            path to a Chrome trace JSON (``prof.export_chrome_trace("trace.json")``, optionally .gz), or the
            trace already loaded as a dict.
        max_rows: Most rows to draw (GPU streams first, then CPU rows by depth); the rest are noted.
        title: Plot title; default says how many events are drawn.
        max_depth: CPU nesting levels to draw (1: only outermost ops/ranges).
        time_range_us: Optional (start, end) window in µs relative to the first drawn event.
        merge_below: Merge threshold as a fraction of the drawn time span.
        ax: Axes to draw on; default a new figure sized to the rows.

    Returns:
        tuple: ``(fig, ax)``; x axis is time since the first drawn event in µs (ms when the span exceeds
        10 ms).
    """
    drawable, steps, t0, window = _private.timeline_events(prof_or_trace_path, time_range_us)
    rows, keys, hidden_rows = _private.timeline_rows(drawable, max_rows, max_depth)
    begin = window[0] if window else t0
    end = window[1] if window else max(e["ts"] + e["dur"] for k in keys for e in rows[k])
    span_us = max(end - begin, 1e-3)
    scale, unit = (1e-3, "ms") if span_us > 10_000 else (1.0, "µs")
    fig, ax = _private.new_axes(ax, (12, 1.4 + 0.45 * len(keys)))
    drawn = _private.draw_timeline_rows(ax, rows, keys, t0, scale, span_us, threshold_us=merge_below * span_us)
    _private.draw_step_lines(ax, steps, begin, end, t0, scale)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([_private.trace_row_label(key) for key in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    ax.set_xlim((begin - t0) * scale, (end - t0) * scale)
    ax.set_xlabel(f"Time since first drawn event ({unit})")
    ax.set_ylabel("GPU stream / CPU thread")
    note = f", {hidden_rows} more rows not shown" if hidden_rows else ""
    ax.set_title(title or f"Profiler timeline: {drawn['events']} events{note}", pad=14)
    _private.timeline_legend(ax, drawn["categories"], drawn["merged"])
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig, ax
