"""Not for students: the plumbing behind ``utils.py``. You never need to call or read anything here.

Every function a lab asks you to use is in ``utils.py``, with its documentation. This module holds what those
functions need behind the scenes, in the same five sections: choosing the scale and matching GPU names, the
environment report's version and run-time checks, silencing library messages you cannot act on, classifying
profiler events, the attention fallback's plumbing, and the drawing code of the plots. It ships beside ``utils.py``
(grading always uses the course's copies of both). Importing it changes no global state.
"""

import contextlib
import difflib
import functools
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import pathlib
import platform
import re
import statistics
import sys
import tempfile
from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

# =====================================================================================================
# 1. Run settings and hardware
# =====================================================================================================

SCALES = ("teaching", "cpu", "quick")
SCALE_ENV = "EFFICIENT_AI_SCALE"


def read_scale():
    """The scale ``EFFICIENT_AI_SCALE`` asks for, else ``teaching`` with CUDA and ``cpu`` without."""
    raw = os.environ.get(SCALE_ENV, "").strip().lower()
    if not raw:
        return "teaching" if torch.cuda.is_available() else "cpu"
    if raw not in SCALES:
        raise ValueError(f"{SCALE_ENV}={raw!r} is not a scale; use one of {', '.join(SCALES)}")
    return raw


# torch.cuda.get_device_name() -> GPU_SPECS key. Checked in order; the first match wins.
GPU_NAME_PATTERNS = [
    (r"h200(?!.*nvl)", "H200"),
    (r"h100.*nvl", "H100-NVL"),
    (r"h100.*pcie", "H100-PCIe"),
    (r"h100", "H100-SXM"),
    (r"a100.*80\s*gb.*pcie|a100.*pcie.*80\s*gb", "A100-80GB-PCIe"),
    (r"a100.*80\s*gb", "A100-80GB"),
    (r"a100", "A100-40GB"),
    (r"\ba6000\b", "A6000"),
    (r"\ba10\b", "A10"),
    (r"\bl40s\b", "L40S"),
    (r"\bl4\b", "L4"),
    (r"\bt4\b", "T4"),
    (r"rtx\s*4090(?!\s*d\b)", "RTX4090"),
]

DTYPE_TO_SPEC = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    "float32": "fp32", "fp32": "fp32", "float": "fp32",
    "float16": "fp16", "fp16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
}


def gpu_key_for_name(name):
    """The ``GPU_SPECS`` key whose name pattern matches a device name, or None."""
    lowered = name.lower()
    return next((key for pattern, key in GPU_NAME_PATTERNS if re.search(pattern, lowered)), None)


def spec_prefix(dtype):
    """``"fp32"``, ``"fp16"`` or ``"bf16"``: the prefix of a dtype's peak in a ``GPU_SPECS`` entry."""
    key = dtype.lower() if isinstance(dtype, str) else dtype
    if key not in DTYPE_TO_SPEC:
        raise ValueError(f"no GPU_SPECS peak for dtype {dtype!r}; use torch.float32, torch.float16 or torch.bfloat16")
    return DTYPE_TO_SPEC[key]


def dtype_name(dtype):
    """``"bfloat16"`` for ``torch.bfloat16``."""
    return str(dtype).replace("torch.", "")


def nearest_gpu_keys(gpu_specs, name, num_sms=None, memory_gb=None, k=2):
    """The ``k`` keys of ``gpu_specs`` closest to a device: by SM count and memory size when known, else by name."""
    if num_sms is not None and memory_gb is not None:
        def distance(key):
            spec = gpu_specs[key]
            return (abs(spec["num_sms"] - num_sms) / spec["num_sms"]
                    + abs(spec["memory_gb"] - memory_gb) / spec["memory_gb"])
        return sorted(gpu_specs, key=distance)[:k]
    norm = re.sub(r"nvidia|geforce|tesla|[^a-z0-9]", "", name.lower())
    scored = sorted(gpu_specs, key=lambda key: -difflib.SequenceMatcher(
        None, norm, re.sub(r"[^a-z0-9]", "", key.lower())).ratio())
    return scored[:k]


# -- the environment report -----------------------------------------------------------------------------

def find_requirements():
    """``requirements.txt`` beside this file (a lab's folder, the student bundle) or one folder up; None if absent."""
    here = os.path.dirname(os.path.abspath(__file__))
    for folder in (here, os.path.dirname(here)):
        path = os.path.join(folder, "requirements.txt")
        if os.path.isfile(path):
            return path
    return None


def requirement_problems(path):
    """(name, installed version, requirement string) for installed packages outside requirements.txt."""
    from packaging.requirements import InvalidRequirement, Requirement

    problems = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.url or (req.marker is not None and not req.marker.evaluate()):
                continue
            try:
                installed = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                continue
            if req.specifier and not req.specifier.contains(installed, prereleases=True):
                problems.append((req.name, installed, str(req)))
    return problems


RUN_TIMES = pathlib.Path(__file__).resolve().parent / "assets" / "run_times.json"  # scripts/run_times.py writes it


def run_time_line(lab, scale):
    """How long running every cell of the lab took at ``scale``, as measured (``assets/run_times.json``); "" when
    nothing was measured at this scale. The line names the machine, not the instructor's report it came from (a
    student's bundle does not hold it)."""
    if not lab or not RUN_TIMES.is_file():
        return ""
    measured = json.loads(RUN_TIMES.read_text()).get(lab, {}).get(scale)
    if not measured:
        return ""
    seconds = measured["total_s"]
    took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
    return (f"Run time: every cell at {scale} scale took about {took} when measured on {measured['machine']}; "
            f"other machines take longer or less")


def versions_line():
    """Python, torch and transformers versions, in one line."""
    try:
        tf_version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        tf_version = "not installed"
    return f"Python {platform.python_version()} | torch {torch.__version__} | transformers {tf_version}"


def gpu_line(gpu_specs, detect_gpu):
    """The GPU found (its name and ``GPU_SPECS`` entry), or that the notebook runs on CPU."""
    if not torch.cuda.is_available():
        return "GPU: none found, running on CPU (timings are CPU timings; GPU-only cells say so and move on)"
    name, key = torch.cuda.get_device_name(), detect_gpu()
    if key is None:
        return f"GPU: {name} (not in GPU_SPECS: pass a GPU_SPECS key by hand where a lab asks)"
    spec = gpu_specs[key]
    return (f"GPU: {name} -> GPU_SPECS[{key!r}] (bf16 {spec['bf16_tflops']:g} TFLOP/s, "
            f"fp32 {spec['fp32_tflops']:g} TFLOP/s, {spec['memory_bandwidth_tb_s']:g} TB/s)")


def package_lines():
    """One line per installed package outside ``requirements.txt``, with the pip command that fixes it (nothing
    where no ``requirements.txt`` is found)."""
    path = find_requirements()
    if path is None:
        return []
    problems = requirement_problems(path)
    if not problems:
        return ["Packages: all installed versions match requirements.txt"]
    return [f"Package {name} {installed} is outside {requirement!r}: pip install '{requirement}'"
            for name, installed, requirement in problems]


def environment_report(lab, scale, attention_backend, gpu_specs, detect_gpu):
    """The lines of ``utils.print_environment_report``; a part that fails says so in its line, nothing raises."""
    lines = [f"== Environment report{' for ' + lab if lab else ''} =="]
    for what, make in (("versions", versions_line), ("GPU", lambda: gpu_line(gpu_specs, detect_gpu))):
        try:
            lines.append(make())
        except Exception as exc:  # the report must never stop a notebook
            lines.append(f"{what}: could not be read ({exc})")
    source = f"from {SCALE_ENV}" if os.environ.get(SCALE_ENV) else "default for this machine"
    lines.append(f"Scale: {scale} ({source}); to change it, set {SCALE_ENV}=teaching, cpu or quick before "
                 f"starting Jupyter and restart the kernel")
    lines.append(f"Attention backend: {attention_backend}")
    try:
        lines += [line for line in [run_time_line(lab, scale)] if line]
    except Exception as exc:
        lines.append(f"Run time: could not be read ({exc})")
    try:
        lines += package_lines()
    except Exception as exc:
        lines.append(f"Packages: could not check requirements.txt ({exc})")
    return lines


# -- library messages a student cannot act on ------------------------------------------------------------

@contextlib.contextmanager
def without_kineto_usdt_lines():
    """Drop the ``USDT:... profiler_start`` / ``profiler_stop`` lines that Kineto (the profiler's C++ side) writes
    to file descriptor 2 at every profiler start and stop, whatever ``KINETO_LOG_LEVEL`` says.

    In a notebook they show as red stderr that looks like a failure, and in grading they reach the TA's terminal.
    Everything else written to descriptor 2 meanwhile is written out again unchanged when the block ends."""
    try:
        sys.stderr.flush()
        saved_fd = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (a detached process): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not line.startswith(b"USDT:")]
            if kept:
                os.write(2, b"".join(kept))


def quiet_profiler_calls() -> None:
    """Run the profiler's start and stop calls (all ``torch.profiler.profile`` and ``torch.autograd.profiler``
    use) through ``without_kineto_usdt_lines`` (once per process)."""
    import torch.autograd.profiler as autograd_profiler

    for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler"):
        call = getattr(autograd_profiler, name, None)
        if call is None or getattr(call, "_drops_usdt_lines", False):
            continue

        @functools.wraps(call)
        def quiet(*args, _call=call, **kwargs):
            with without_kineto_usdt_lines():
                return _call(*args, **kwargs)

        quiet._drops_usdt_lines = True
        setattr(autograd_profiler, name, quiet)


class DropBenignAutotuneErrors(logging.Filter):
    """Drops Inductor's error records about a candidate kernel that needs more shared memory than the GPU has
    ("No valid triton configs. OutOfMemoryError: out of resource: triton_mm ..."): with ``mode="max-autotune"``
    Inductor skips such candidates and picks among the rest. Any other autotuning error is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is not ours to judge
            return True
        return not ("No valid triton configs" in text and "out of resource" in text)


# Messages of a correct run that read as failures in a notebook (red stderr), each known to be harmless here.
BENIGN_WARNINGS = (
    # Lab 2 reads one profiler cycle on purpose (default_schedule has repeat=1).
    r"Warning: Profiler clears events at the end of each cycle",
    # Raised inside Inductor's own code, not by anything a student writes.
    r"TypedStorage is deprecated",
    r"\s*Online softmax is disabled on the fly",
)


def quiet_library_messages() -> None:
    """What ``utils.quiet_library_messages`` does: the profiler's USDT lines, Inductor's benign autotuning errors,
    its AUTOTUNE tables and choices statistics, and ``BENIGN_WARNINGS``."""
    import warnings

    quiet_profiler_calls()
    autotune_log = logging.getLogger("torch._inductor.select_algorithm")
    if not any(isinstance(known, DropBenignAutotuneErrors) for known in autotune_log.filters):
        autotune_log.addFilter(DropBenignAutotuneErrors())
    # Read by torch._inductor.config when it is first imported (importing it here would cost seconds): no choices
    # statistics, and no AUTOTUNE table (written to stderr after every max-autotune search, one per GEMM shape,
    # when 0 choices are to be displayed).
    os.environ.setdefault("TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", "0")
    if "torch._inductor.config" in sys.modules:
        config = sys.modules["torch._inductor.config"]
        config.max_autotune_report_choices_stats = False
        config.autotune_num_choices_displayed = 0
    for message in BENIGN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


NOTED = set()


def note_once(key, message):
    """Print ``message`` the first time ``key`` is seen in this process."""
    if key not in NOTED:
        NOTED.add(key)
        print(message)


# =====================================================================================================
# 2. Model configs and helpers
# =====================================================================================================

def make_gemma3_config(**args):
    """A transformers ``Gemma3TextConfig`` from its arguments, every layer full (global) causal attention, as the
    lab's ``Gemma3DecoderLayer`` implements it (config, KV cache and layer then agree)."""
    from transformers.models.gemma3.configuration_gemma3 import Gemma3TextConfig

    args = dict(args)
    args["layer_types"] = ["full_attention"] * args["num_hidden_layers"]
    args["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    return Gemma3TextConfig(**args)


class CacheSlot:
    """A view of one cache slot that the lab's attention reads at any ``layer_idx``.

    The lab applies one layer object (fixed ``layer_idx``) num_layers times. Handing it this view on pass i
    makes ``past_key_values.layers[self.layer_idx]`` resolve to slot i, so each pass reads and writes its own
    layer's keys and values, as num_layers distinct layers would.
    """

    class _AnySlot:
        def __init__(self, slot, n):
            self._slot, self._n = slot, n

        def __getitem__(self, index):
            return self._slot

        def __len__(self):
            return self._n

    def __init__(self, cache, index):
        self.layers = self._AnySlot(cache.layers[index], len(cache.layers))


def check_cache(past_key_values, num_layers):
    """Raise ValueError unless ``past_key_values`` is a cache from ``initialize_kv_cache`` with enough slots."""
    if past_key_values is None or not hasattr(past_key_values, "layers"):
        raise ValueError("past_key_values must be the cache from initialize_kv_cache(config, max_cache_len)")
    if len(past_key_values.layers) < num_layers:
        raise ValueError(f"the cache has {len(past_key_values.layers)} layer slots but num_layers={num_layers}; "
                         f"make it with initialize_kv_cache from a config with at least {num_layers} layers")


def gpt2_attention(block, hidden_states, layer_idx):
    """Eager causal multi-head attention of one GPT-2 block (its own weights) over every token."""
    attn, config = block.attn, block.attn.config
    batch, tokens, width = hidden_states.shape
    heads = config.n_head
    head_dim = width // heads
    shape = (batch, tokens, heads, head_dim)
    query, key, value = (t.view(shape).transpose(1, 2) for t in attn.c_attn(hidden_states).split(width, dim=2))
    scale = head_dim ** -0.5 if getattr(config, "scale_attn_weights", True) else 1.0
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        scale /= layer_idx + 1
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    positions = torch.arange(tokens, device=scores.device)
    scores = scores.masked_fill(positions[None, :] > positions[:, None], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, value).transpose(1, 2).reshape(batch, tokens, width)
    return attn.c_proj(out)


# =====================================================================================================
# 3. Measurement
# =====================================================================================================

STATISTICS = {"median": statistics.median, "mean": statistics.fmean, "min": min}


def tensor_device(obj, depth=0):
    """The first device found on a tensor (or module parameter) inside obj, or None."""
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, torch.nn.Module):
        for p in obj.parameters():
            return p.device
        return None
    if depth < 2 and isinstance(obj, (list, tuple)):
        for item in obj:
            found = tensor_device(item, depth + 1)
            if found is not None:
                return found
    if depth < 2 and isinstance(obj, Mapping):
        for item in obj.values():
            found = tensor_device(item, depth + 1)
            if found is not None:
                return found
    return None


def timing_device(fn, args, kwargs, measure_on, default):
    """Where to time ``fn(*args, **kwargs)``: ``measure_on`` if given, CUDA if any tensor argument (or fn's
    parameters) is on CUDA, CPU if all are on CPU, else ``default``."""
    if measure_on is not None:
        return torch.device(measure_on)
    found = [d for d in (tensor_device(a) for a in (fn, *args, *kwargs.values())) if d is not None]
    if any(d.type == "cuda" for d in found):
        return torch.device("cuda")
    if found:
        return torch.device("cpu")
    return default


def cpu_memory_trace(fn, args, kwargs, n_repeat):
    """Peak and final bytes above baseline of fn's CPU allocations, from the profiler's allocation records."""
    from torch.autograd.profiler import profile as autograd_profile

    with autograd_profile(use_cpu=True, profile_memory=True) as prof:
        for _ in range(n_repeat - 1):
            out = fn(*args, **kwargs)
            del out
        out = fn(*args, **kwargs)
    records = sorted(
        (evt.start_ns(), evt.nbytes()) for evt in prof.kineto_results.events()
        if evt.name() == "[memory]" and evt.device_type() == torch.autograd.DeviceType.CPU
    )
    running = peak = 0
    for _, nbytes in records:
        running += nbytes
        peak = max(peak, running)
    del out
    return peak, running


GEMM_OPS = {
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_int_mm", "_addmm_activation",
    "addr", "_scaled_mm", "mkldnn_convolution", "_convolution", "convolution", "cudnn_convolution",
    "_mkldnn_linear", "mkldnn_linear", "linear", "matmul", "einsum",  # the last three: wrappers (for colours)
}
REDUCTION_OPS = {
    "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "_softmax", "_log_softmax", "_safe_softmax",
    "softmax", "log_softmax", "var", "std", "var_mean", "std_mean", "prod", "cumsum", "cumprod", "logsumexp",
    "topk", "sort", "all", "any", "norm", "linalg_vector_norm", "native_layer_norm", "_fused_rms_norm",
    "native_group_norm", "native_batch_norm", "_batch_norm_with_update", "count_nonzero", "nansum", "median",
    "layer_norm", "rms_norm", "group_norm", "batch_norm",
}
# CPU operator calls that launch no kernel of their own: views, shape queries and uninitialised buffers...
VIEW_OR_ALLOC_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "view", "_unsafe_view", "view_as",
    "as_strided", "transpose", "t", "permute", "expand", "expand_as", "unsqueeze", "squeeze", "slice", "select",
    "alias", "detach", "detach_", "resolve_conj", "resolve_neg", "_reshape_alias", "reshape", "unfold", "split",
    "split_with_sizes", "chunk", "narrow", "unbind", "diagonal", "set_", "lift_fresh", "result_type",
    "is_nonzero", "item", "_local_scalar_dense", "size", "stride", "numel", "dim", "flatten", "unflatten",
    "movedim", "swapaxes", "_has_compatible_shallow_copy_type", "is_same_size", "broadcast_tensors", "numpy_T",
    "mT", "mH", "adjoint", "matrix_H", "view_as_real", "view_as_complex", "_conj", "conj",
}
# ...and composite wrappers, whose arithmetic or copy happens in a child op (copy_, fill_, mm, _softmax,
# native_layer_norm, ...) that is counted instead.
WRAPPER_OPS = {
    "contiguous", "to", "type_as", "_to_copy", "clone", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "new_zeros", "new_ones", "new_full", "repeat", "lift_fresh_copy", "dropout", "matmul",
    "linear", "einsum", "layer_norm", "group_norm", "batch_norm", "rms_norm", "softmax", "log_softmax",
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math",
}
NO_KERNEL_OPS = VIEW_OR_ALLOC_OPS | WRAPPER_OPS
KERNEL_CATEGORIES = ("gemm", "attention", "elementwise", "reduction", "memcpy/memset", "other")


def aten_category(op):
    """Category of an ``aten::`` operator, given without its ``aten::`` prefix (lower case)."""
    if "attention" in op or "flash" in op:
        return "attention"
    if op in GEMM_OPS:
        return "gemm"
    if op in REDUCTION_OPS:
        return "reduction"
    return "elementwise"


def kernel_category(name):
    """Category of a CUDA kernel name or an ``aten::`` operator name: gemm, attention, reduction, ..."""
    lowered = name.lower()
    if lowered.startswith("aten::"):
        return aten_category(lowered[len("aten::"):])
    if lowered.startswith(("memcpy", "memset")):
        return "memcpy/memset"
    if "triton_poi" in lowered:
        return "elementwise"
    if "triton_red" in lowered or "triton_per" in lowered:
        return "reduction"
    if "triton_tem" in lowered:
        return "gemm"
    if re.search(r"flash|fmha|attention|attn|sdpa|\bmha", lowered):
        return "attention"
    if re.search(r"gemm|gemv|nvjet|cublas|cutlass|xmma|matmul|splitkreduce|_mm_|\bmm_", lowered):
        return "gemm"
    if re.search(r"reduce|softmax|norm(?!al)|argmax|argmin|cumsum|scan|topk|sort", lowered):
        return "reduction"
    if re.search(r"elementwise|vectorized|unrolled|pointwise|copy|fill|cat|index|gather|scatter|where", lowered):
        return "elementwise"
    return "other"


def profile_events(prof):
    """The FunctionEvents of a finished profile (or the list itself)."""
    if hasattr(prof, "events"):
        events = prof.events()
        if events is None:
            raise ValueError("the profiler recorded nothing: with a schedule, make sure the loop calls "
                             "prof.step() enough times to reach the active steps (10 for default_schedule)")
        return events
    return list(prof)


def is_annotation(evt):
    """Whether a profiler event is a ``record_function`` range or a ``ProfilerStep``, not work."""
    activity = str(getattr(evt, "activity_type", "") or "")
    return bool(getattr(evt, "is_user_annotation", False)) or "annotation" in activity or \
        evt.name.startswith("ProfilerStep")


def has_ancestor_in(evt, ids):
    """Whether one of ``evt``'s CPU parents has its ``id`` in ``ids``."""
    parent = evt.cpu_parent
    while parent is not None:
        if id(parent) in ids:
            return True
        parent = parent.cpu_parent
    return False


def outermost_working_ops(events):
    """The CPU ``aten::`` calls that compute or copy data and are not nested inside another such call."""
    working = [
        e for e in events
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::")
        and not is_annotation(e) and e.name[len("aten::"):] not in NO_KERNEL_OPS
    ]
    working_ids = {id(w) for w in working}
    return [e for e in working if not has_ancestor_in(e, working_ids)]


OOM_ERRORS = (torch.OutOfMemoryError, MemoryError) if hasattr(torch, "OutOfMemoryError") else \
    (torch.cuda.OutOfMemoryError, MemoryError)


def is_oom(exc):
    """Whether an exception is running out of memory (on the GPU or the CPU)."""
    if isinstance(exc, OOM_ERRORS):
        return True
    # Some allocation failures surface as plain RuntimeErrors (cuBLAS workspace, older PyTorch).
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc).lower()
                                              or "CUBLAS_STATUS_ALLOC_FAILED" in str(exc))


# =====================================================================================================
# 4. Attention backends
# =====================================================================================================

FLASH_ATTN_INSTALLED = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
TORCH_VERSION = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])


def describe_backend():
    """What ``utils.flash_attn_func`` runs on this machine, in a few words."""
    if FLASH_ATTN_INSTALLED:
        try:
            version = importlib.metadata.version("flash-attn")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        return f"flash-attn {version}"
    if torch.cuda.is_available():
        return "PyTorch SDPA flash kernel (flash-attn not installed)"
    return "PyTorch SDPA math path on CPU (no CUDA)"


def sdpa_bshd(q, k, v, causal, softmax_scale, backends):
    """SDPA on (B, S, H, D) inputs with the given SDPA backends; causal masks aligned bottom-right."""
    from torch.nn.attention import sdpa_kernel

    q_len, kv_len = q.shape[1], k.shape[1]
    n_heads, n_kv_heads = q.shape[2], k.shape[2]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    extra = {}
    if n_kv_heads != n_heads:
        if TORCH_VERSION >= (2, 5):
            extra["enable_gqa"] = True
        else:
            kt = kt.repeat_interleave(n_heads // n_kv_heads, dim=1)
            vt = vt.repeat_interleave(n_heads // n_kv_heads, dim=1)
    mask, is_causal = None, False
    if causal and q_len == kv_len:
        is_causal = True
    elif causal:
        # flash-attn's convention: query i sees keys j <= i + (kv_len - q_len).
        rows = torch.arange(q_len, device=q.device)[:, None]
        cols = torch.arange(kv_len, device=q.device)[None, :]
        mask = cols <= rows + (kv_len - q_len)
    with sdpa_kernel(backends):
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=is_causal,
                                             scale=softmax_scale, **extra)
    return out.transpose(1, 2).contiguous()


# =====================================================================================================
# 5. Plotting
# =====================================================================================================

CATEGORY_COLORS = {
    "gemm": "tab:blue", "attention": "tab:red", "elementwise": "tab:orange", "reduction": "tab:green",
    "memcpy/memset": "tab:purple", "other": "tab:gray", "annotation": "lightgray",
}


def new_axes(ax, figsize):
    """``(fig, ax)``: the given axes and their figure, or a new figure of ``figsize`` inches."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
    else:
        fig = ax.figure
    return fig, ax


def as_float(x):
    """float(x) for numbers, 0-d tensors/arrays; NaN for None."""
    if x is None:
        return float("nan")
    if isinstance(x, torch.Tensor):
        return float(x.item())
    return float(x)


# -- the roofline ---------------------------------------------------------------------------------------

def roofline_operations(operations):
    """``plot_roofline``'s operations as ``(name, intensity, measured TFLOP/s or None)``, checked."""
    if not isinstance(operations, Mapping):
        raise TypeError("operations must be a dict: name -> intensity (FLOP/byte) or (intensity, TFLOP/s)")
    parsed = []
    for name, value in operations.items():
        if isinstance(value, (tuple, list)):
            intensity, measured = as_float(value[0]), as_float(value[1])
        else:
            intensity, measured = as_float(value), None
        if not intensity > 0:
            raise ValueError(f"arithmetic intensity of {name!r} must be positive, got {intensity}")
        parsed.append((str(name), intensity, measured))
    return parsed


def measured_ceilings(measured_tflops, measured_bandwidth_tb_s):
    """``(TFLOP/s, TB/s)`` of a measured roof, or None when neither is given."""
    if (measured_tflops is None) != (measured_bandwidth_tb_s is None):
        raise ValueError("give both measured_tflops and measured_bandwidth_tb_s, or neither")
    if measured_tflops is None:
        return None
    measured_roof = (as_float(measured_tflops), as_float(measured_bandwidth_tb_s))
    if not (measured_roof[0] > 0 and measured_roof[1] > 0):
        raise ValueError(f"measured ceilings must be positive, got {measured_roof}")
    return measured_roof


def draw_roofs(ax, x_range, gpu_name, peak, bandwidth, measured_roof, measured_label):
    """The datasheet roof, the shaded regions, the ridge point and the measured roof (if any).

    Returns:
        list: the y values drawn (TFLOP/s), to fit the axis to.
    """
    lo, hi = x_range
    ridge = peak / bandwidth
    shade_ridge = measured_roof[0] / measured_roof[1] if measured_roof else ridge
    x = np.logspace(math.log10(lo), math.log10(hi), 400)
    datasheet_style = dict(color="black", lw=2) if measured_roof is None else dict(color="gray", lw=1.5, ls="--")
    roof_name = f"{gpu_name} roofline" + ("" if measured_roof is None else " (datasheet)")
    ax.loglog(x, np.minimum(peak, bandwidth * x), label=roof_name, **datasheet_style)
    ax.axvspan(lo, shade_ridge, color="tab:blue", alpha=0.08, label="memory-bound region")
    ax.axvspan(shade_ridge, hi, color="tab:orange", alpha=0.08, label="compute-bound region")
    ax.axvline(ridge, color="gray", ls="--", lw=1)
    ax.plot([ridge], [peak], marker="*", ms=14, color="gold", markeredgecolor="black", zorder=5,
            label=f"ridge point: {ridge:.1f} FLOP/byte")
    y_values = [bandwidth * lo, peak]
    if measured_roof is not None:
        m_peak, m_bandwidth = measured_roof
        ax.loglog(x, np.minimum(m_peak, m_bandwidth * x), color="black", lw=2,
                  label=f"{measured_label}: {m_peak:.3g} TFLOP/s, {m_bandwidth:.3g} TB/s")
        ax.axvline(shade_ridge, color="black", ls=":", lw=1)
        ax.plot([shade_ridge], [m_peak], marker="*", ms=14, color="white", markeredgecolor="black", zorder=5,
                label=f"{measured_label} ridge: {shade_ridge:.1f} FLOP/byte")
        y_values += [m_bandwidth * lo, m_peak]
    return y_values


# Neighbouring labels get different offsets (below/above the roof, near/far) so clusters stay legible.
LABEL_OFFSETS = [(0, -22), (0, 16), (0, -38), (0, 30)]
MARKERS = "osD^vP"


def draw_roofline_operation(ax, index, rank, operation, attainable, measured_only):
    """One operation: its point on the roof and, where measured, its measured point below it (or only that).

    Returns:
        list: the measured TFLOP/s drawn (empty when none).
    """
    name, intensity, measured = operation
    color, marker = plt.cm.tab10(index % 10), MARKERS[index % len(MARKERS)]
    has_measured = measured is not None and measured > 0
    line = dict(color=color, lw=0.5)
    if measured_only and has_measured:
        ax.plot([intensity], [measured], marker=marker, ms=8, color=color, markeredgecolor="black", zorder=6,
                ls="none", label=f"{name}: {intensity:.3g} FLOP/byte, {measured:.3g} TFLOP/s")
        ax.annotate(name, (intensity, measured), textcoords="offset points", xytext=LABEL_OFFSETS[rank % 4],
                    ha="center", fontsize=8, color=color, arrowprops=dict(arrowstyle="-", **line))
        return [measured]
    ax.plot([intensity], [attainable], marker=marker, ms=8, color=color, markeredgecolor="black",
            zorder=6, ls="none", label=f"{name}: {intensity:.3g} FLOP/byte")
    ax.annotate(name, (intensity, attainable), textcoords="offset points", xytext=LABEL_OFFSETS[rank % 4],
                ha="center", fontsize=8, color=color, arrowprops=dict(arrowstyle="-", **line))
    if not has_measured:
        return []
    ax.plot([intensity], [measured], marker=marker, ms=8, mfc="none", color=color, zorder=6, ls="none")
    ax.plot([intensity, intensity], [measured, attainable], color=color, ls=":", lw=1)
    ax.annotate(f"{name} (measured)", (intensity, measured), textcoords="offset points",
                xytext=(0, -14), ha="center", fontsize=8, color=color)
    return [measured]


def draw_roofline_operations(ax, parsed, peak, bandwidth, measured_only):
    """Every operation of ``roofline_operations``, labels staggered by intensity; returns the y values drawn."""
    y_values = []
    by_intensity = sorted(range(len(parsed)), key=lambda i: parsed[i][1])
    for rank, index in enumerate(by_intensity):
        attainable = min(peak, bandwidth * parsed[index][1])
        y_values += draw_roofline_operation(ax, index, rank, parsed[index], attainable, measured_only)
    return y_values


# -- the profiler timeline ------------------------------------------------------------------------------

GPU_TRACE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_TRACE_CATS = {"cpu_op", "user_annotation"}


def trace_from_profile(prof):
    """Chrome-trace-like events built from a profile's FunctionEvents (repeatable, unlike export_chrome_trace,
    which a profile allows once)."""
    cuda_type = torch.autograd.DeviceType.CUDA
    events = []
    for evt in profile_events(prof):
        if evt.name == "[memory]":
            continue
        name = getattr(evt, "trace_name", None) or evt.name
        start, end = evt.time_range.start, evt.time_range.end
        if evt.device_type == cuda_type:
            if is_annotation(evt):
                continue
            category = "gpu_memcpy" if name.startswith(("Memcpy", "Memset")) else "kernel"
            events.append({"ph": "X", "cat": category, "name": name, "ts": start, "dur": end - start,
                           "pid": evt.device_index, "tid": getattr(evt, "device_resource_id", 0),
                           "args": {"device": evt.device_index,
                                    "stream": getattr(evt, "device_resource_id", 0)}})
        else:
            category = "user_annotation" if is_annotation(evt) else "cpu_op"
            events.append({"ph": "X", "cat": category, "name": name, "ts": start, "dur": end - start,
                           "pid": "host", "tid": evt.thread})
    return {"traceEvents": events}


def load_trace(source):
    """A Chrome trace as a dict, from a dict, a finished profile, or a JSON file (optionally .gz)."""
    if isinstance(source, Mapping):
        return source
    if hasattr(source, "events"):
        return trace_from_profile(source)
    path = os.fspath(source)
    if path.endswith(".gz"):
        import gzip

        with gzip.open(path, "rt") as f:
            return json.load(f)
    with open(path) as f:
        return json.load(f)


def short_name(name, limit=40):
    """A kernel or operator name without templates, arguments and namespaces, cut to ``limit`` characters."""
    name = re.sub(r"^void ", "", name)
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"(^aten::|at::native::|\(anonymous namespace\)::|at::cuda::|cutlass::)", "", name)
    return name if len(name) <= limit else name[: limit - 1] + "…"


def trace_rows(events):
    """Group drawable events into rows: one per GPU stream, one per (CPU thread, nesting depth)."""
    rows = {}
    by_thread = {}
    for e in events:
        if e.get("cat") in GPU_TRACE_CATS:
            args = e.get("args", {})
            key = (0, str(args.get("device", e.get("pid"))), str(args.get("stream", e.get("tid"))), 0)
            rows.setdefault(key, []).append(e)
        else:
            by_thread.setdefault((str(e.get("pid")), str(e.get("tid"))), []).append(e)
    for (pid, tid), thread_events in by_thread.items():
        thread_events.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for e in thread_events:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            rows.setdefault((1, pid, tid, len(open_ends)), []).append(e)
            open_ends.append(e["ts"] + e["dur"])
    return rows


def drawable_trace_events(trace):
    """The complete events (``ph == "X"``) of a Chrome trace that a timeline draws, and its ``ProfilerStep`` ranges.

    Args:
        trace: A loaded Chrome trace: a dict with ``traceEvents``, or the list of events itself.

    Returns:
        tuple: ``(drawable, steps)``, lists of event dicts with ``ts`` and ``dur`` as floats (µs): GPU kernels,
        memcpy and memset and CPU operators and ranges; and the profiler's step ranges.
    """
    raw = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    complete = [e for e in raw if e.get("ph") == "X" and "ts" in e and "dur" in e]
    for e in complete:
        e["ts"], e["dur"] = float(e["ts"]), float(e["dur"])
    steps = [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep")]
    drawable = [e for e in complete if (e.get("cat") in GPU_TRACE_CATS or e.get("cat") in CPU_TRACE_CATS)
                and not str(e.get("name", "")).startswith("ProfilerStep")]
    return drawable, steps


def timeline_events(source, time_range_us):
    """What ``plot_trace_timeline`` draws of ``source``: ``(drawable, steps, t0, window)``, ``t0`` the first event's
    start (µs) and ``window`` the absolute ``(start, end)`` of ``time_range_us``, or None."""
    drawable, steps = drawable_trace_events(load_trace(source))
    if not drawable:
        raise ValueError("the trace has no kernel or operator events to draw (was anything profiled?)")
    t0 = min(e["ts"] for e in drawable + steps)
    window = None
    if time_range_us is not None:
        window = (t0 + time_range_us[0], t0 + time_range_us[1])
        drawable = [e for e in drawable if e["ts"] + e["dur"] >= window[0] and e["ts"] <= window[1]]
        if not drawable:
            raise ValueError(f"no events in time_range_us={time_range_us}")
    return drawable, steps, t0, window


def timeline_rows(drawable, max_rows, max_depth):
    """``(rows, keys, hidden)``: the rows of ``trace_rows``, the keys of those drawn (GPU streams first, then CPU
    rows by depth, at most ``max_rows``), and how many rows were left out."""
    rows = trace_rows(drawable)
    keys = sorted((k for k in rows if k[0] == 0 or k[3] < max_depth),
                  key=lambda k: (k[0], k[3], -len(rows[k]), k[1], k[2]))
    return rows, keys[:max_rows], max(0, len(keys) - max_rows)


def merge_short_events(events, threshold_us):
    """One timeline row's events as bars, with runs of short events merged into one bar.

    An event shorter than ``threshold_us`` joins the bar before it when that bar also started with a short event
    and the gap between them is at most ``threshold_us``; longer events always get a bar of their own.

    Args:
        events: Event dicts with ``ts``, ``dur`` (µs), ``name`` and optionally ``cat``, in any order.
        threshold_us: Duration and gap (µs) below which events are merged.

    Returns:
        list: Bars in time order, each ``[start_us, end_us, {category: busy_us}, first event's name, event count,
        mergeable]``; categories are those of ``count_cuda_kernels`` (``"annotation"`` for ``record_function``).
    """
    bars = []
    for e in sorted(events, key=lambda e: e["ts"]):
        start, stop = e["ts"], e["ts"] + e["dur"]
        category = "annotation" if e.get("cat") == "user_annotation" else kernel_category(str(e["name"]))
        tiny = e["dur"] < threshold_us
        last = bars[-1] if bars else None
        if tiny and last is not None and last[5] and start - last[1] <= threshold_us:
            last[1] = max(last[1], stop)
            last[2][category] = last[2].get(category, 0.0) + e["dur"]
            last[4] += 1
        else:
            bars.append([start, stop, {category: e["dur"]}, str(e["name"]), 1, tiny])
    return bars


def trace_row_label(key):
    """``"GPU 0 stream 7"`` or ``"CPU thread 12 depth 1"`` for a row key of ``trace_rows``."""
    kind, first, second, depth = key
    if kind == 0:
        return f"GPU {first} stream {second}"
    return f"CPU thread {second}" + (f" depth {depth}" if depth else "")


def draw_row_bars(ax, row, bars, t0, scale, span_us, char_fraction):
    """Draw one timeline row's bars (``merge_short_events``) and the labels that fit inside them.

    Args:
        ax: Axes of the timeline; ``row`` is the y position.
        bars: Bars of the row, times in µs; ``t0`` the time origin (µs), ``scale`` the axis unit per µs.
        span_us: Drawn time span (µs); ``char_fraction`` the width of one label character as a fraction of it.

    Returns:
        dict: ``categories`` drawn (set), ``events`` drawn (count) and whether any bar ``merged`` several events.
    """
    drawn = {"categories": set(), "events": 0, "merged": False}
    for start, stop, categories, name, count, _ in bars:
        category = max(categories, key=categories.get)
        drawn["categories"].add(category)
        x, width = (start - t0) * scale, max((stop - start) * scale, span_us * scale * 2e-4)
        ax.broken_barh([(x, width)], (row - 0.4, 0.8), facecolors=CATEGORY_COLORS[category],
                       edgecolor="black", linewidth=0.2, hatch="///" if count > 1 else None)
        drawn["events"] += count
        drawn["merged"] |= count > 1
        fits = int((stop - start) / span_us / char_fraction) - 1
        label = f"{count} events" if count > 1 else short_name(name, limit=max(fits, 1))
        if fits >= 6 and len(label) <= fits:
            ax.text(x + width / 2, row, label, ha="center", va="center", fontsize=7, clip_on=True)
    return drawn


def draw_timeline_rows(ax, rows, keys, t0, scale, span_us, threshold_us):
    """Every drawn row's bars, runs of events shorter than ``threshold_us`` (µs) merged; the totals of
    ``draw_row_bars`` over the rows."""
    # Width of one 7-pt character as a fraction of the time axis, to decide which bars can hold a label.
    axes_width_in = ax.figure.get_figwidth() * ax.get_position().width
    char_fraction = 7 * 0.6 / 72 / axes_width_in
    total = {"categories": set(), "events": 0, "merged": False}
    for row, key in enumerate(keys):
        drawn = draw_row_bars(ax, row, merge_short_events(rows[key], threshold_us), t0, scale, span_us,
                              char_fraction)
        total["categories"] |= drawn["categories"]
        total["events"] += drawn["events"]
        total["merged"] |= drawn["merged"]
    return total


def draw_step_lines(ax, steps, begin, end, t0, scale):
    """A dotted line and a ``step#N`` label at the start of every ``ProfilerStep`` range inside [begin, end]."""
    for step in sorted(steps, key=lambda e: e["ts"]):
        if begin <= step["ts"] <= end:
            x = (step["ts"] - t0) * scale
            ax.axvline(x, color="black", ls=":", lw=0.8)
            ax.text(x, 1.0, str(step["name"]).replace("ProfilerStep", "step"), fontsize=7, va="bottom",
                    transform=ax.get_xaxis_transform())


def timeline_legend(ax, used, merged_any):
    """The category legend beside the timeline (only the categories drawn), with the hatch of merged bars."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=CATEGORY_COLORS[c], label=c) for c in CATEGORY_COLORS if c in used]
    if merged_any:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="merged short events"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, title="category",
              title_fontsize=7)


# -- unfinished answers (utils.uses_answers) ------------------------------------------------------------------------
NOT_WRITTEN_SAID: set = set()
"""(message, IPython execution count) pairs ``utils.uses_answers`` printed: each message once per cell run."""


def execution_count():
    """IPython's execution count of the running cell, or None outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None)
