"""Unit tests of utils.py on CPU: every public name, shapes, units, plots (Agg), model helpers, OOM handling.

Run from the repository root: ``MPLBACKEND=Agg python -m pytest tests/test_utils.py -q``.
"""

import inspect
import json
import math
import os
import time
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _utils_private  # noqa: E402  (utils.py's plumbing)
import utils  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# -----------------------------------------------------------------------------------------------------
# The Lab 1 handout's Gemma-3 decoder layer (course material), used to exercise the model helpers the way
# the lab calls them. Kept as in the handout apart from formatting and dropping the profiler ranges.
# -----------------------------------------------------------------------------------------------------

def _handout_layer_classes():
    """The handout's Gemma-3 layer classes, as Lab 1 defines them (its locked cell ``gemma3_decoder_layer``)."""
    from course.common.notebooks import exec_cells

    lab1 = Path(__file__).resolve().parent.parent / "source" / "lab1" / "lab1.ipynb"
    namespace = exec_cells(lab1, ["setup_imports", "gemma3_decoder_layer"])
    return types.SimpleNamespace(**{name: namespace[name] for name in ("Gemma3DecoderLayer", "Gemma3RotaryEmbedding", "Gemma3TextConfig")})


@pytest.fixture(scope="module")
def handout():
    return _handout_layer_classes()


@pytest.fixture(scope="module")
def tiny_config(handout):
    """A tiny Gemma-3 config (3 layers, GQA 4 query / 2 KV heads) built like utils' configs."""
    return _utils_private.make_gemma3_config(**{
        **utils._GEMMA3_COMMON, **dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8)})


@pytest.fixture
def tiny_model(handout, tiny_config):
    torch.manual_seed(0)
    layer = handout.Gemma3DecoderLayer(tiny_config, 1).eval()
    # The handout's RMSNorm weights start at zero (scale 1 + w); give them values so every norm matters.
    with torch.no_grad():
        for module in layer.modules():
            if hasattr(module, "eps"):
                module.weight.normal_(0, 0.3)
    rotary = handout.Gemma3RotaryEmbedding(tiny_config, layer_type="full_attention")
    return layer, rotary


# -----------------------------------------------------------------------------------------------------
# Module surface
# -----------------------------------------------------------------------------------------------------

def test_all_names_exist_and_functions_have_docstrings_with_units_or_shapes():
    assert len(set(utils.__all__)) == len(utils.__all__), "__all__ lists a name twice"
    for name in utils.__all__:
        obj = getattr(utils, name)
        if inspect.isclass(obj):
            doc = obj.__doc__ or ""
            assert "Args:" in doc and "Attributes:" in doc, (
                f"utils.{name} needs a Google-style class docstring with Args: and Attributes:")
        elif callable(obj) and not isinstance(obj, torch.device) and name != "default_schedule":
            doc = obj.__doc__ or ""
            assert "Returns:" in doc, f"utils.{name} needs a Google-style docstring with Returns:"


def test_utils_defines_only_what_students_call():
    """utils.py is read for help: every function and class it defines is public (in ``__all__``); the plumbing lives
    in _utils_private.py beside it (PEP 562's module ``__getattr__``/``__dir__`` build the configs on first use)."""
    import ast

    tree = ast.parse(Path(utils.__file__).read_text())
    defined = [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    private = [name for name in defined if name not in utils.__all__ and name not in ("__getattr__", "__dir__")]
    assert not private, f"utils.py defines {private}, which students do not call: move them to _utils_private.py"
    assert Path(_utils_private.__file__).parent == Path(utils.__file__).parent, "the private module ships beside it"


def test_star_import_gives_every_public_name():
    namespace = {}
    exec("from utils import *", namespace)
    missing = [n for n in utils.__all__ if n not in namespace]
    assert not missing, f"from utils import * misses {missing}"


def test_device_matches_cuda_availability():
    assert isinstance(utils.DEVICE, torch.device)
    assert utils.DEVICE.type == ("cuda" if torch.cuda.is_available() else "cpu")


# -----------------------------------------------------------------------------------------------------
# Run settings
# -----------------------------------------------------------------------------------------------------

def test_scale_env_override_and_default(monkeypatch):
    monkeypatch.setenv("EFFICIENT_AI_SCALE", "teaching")
    assert _utils_private.read_scale() == "teaching"
    monkeypatch.setenv("EFFICIENT_AI_SCALE", " Quick ")
    assert _utils_private.read_scale() == "quick"
    monkeypatch.setenv("EFFICIENT_AI_SCALE", "cpu")
    assert _utils_private.read_scale() == "cpu"
    monkeypatch.setenv("EFFICIENT_AI_SCALE", "huge")
    with pytest.raises(ValueError, match="teaching, cpu, quick"):
        _utils_private.read_scale()
    monkeypatch.delenv("EFFICIENT_AI_SCALE")
    assert _utils_private.read_scale() == ("teaching" if torch.cuda.is_available() else "cpu"), (
        "without a GPU a student gets the cpu scale; only grading and CI ask for quick")


def test_at_scale_follows_scale(monkeypatch):
    teaching, quick, cpu = [4096, 8192], [64], [512]
    monkeypatch.setattr(utils, "SCALE", "teaching")
    assert utils.at_scale(teaching, quick, cpu) is teaching
    monkeypatch.setattr(utils, "SCALE", "quick")
    assert utils.at_scale(teaching=teaching, quick=quick, cpu=cpu) is quick
    monkeypatch.setattr(utils, "SCALE", "cpu")
    assert utils.at_scale(teaching, quick, cpu) is cpu
    assert utils.at_scale(teaching, quick) is quick, "a cell without a cpu size runs its quick size on a CPU"


def test_environment_report_says_how_long_the_lab_took_at_this_scale(capsys, monkeypatch, tmp_path):
    table = tmp_path / "run_times.json"
    table.write_text('{"lab1": {"cpu": {"machine": "2-core CPU", "total_s": 140, "source": "reports/x.json"}}}')
    monkeypatch.setattr(_utils_private, "RUN_TIMES", table)
    assert _utils_private.run_time_line("lab1", "cpu") == (
        "Run time: every cell at cpu scale took about 2 min when measured on 2-core CPU; other machines take longer "
        "or less"), "the line names the machine, never the instructor's report (the student bundle lacks reports/)"
    assert _utils_private.run_time_line("lab1", "teaching") == "", "nothing measured at this scale: nothing said"
    assert _utils_private.run_time_line("lab9", "cpu") == ""
    monkeypatch.setattr(utils, "SCALE", "cpu")
    utils.print_environment_report("lab1")
    assert "took about 2 min" in capsys.readouterr().out, "the report says the time of the scale in effect"


def test_environment_report_lines(capsys, monkeypatch, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# comment\ntorch<1.0\nnumpy>=1.0\nsurely-not-installed-pkg>=1\n-e .\n")
    monkeypatch.setattr(_utils_private, "find_requirements", lambda: str(requirements))
    utils.print_environment_report("lab1")
    out = capsys.readouterr()
    assert "lab1" in out.out and f"torch {torch.__version__}" in out.out
    assert f"Scale: {utils.SCALE}" in out.out and "EFFICIENT_AI_SCALE" in out.out
    assert utils.ATTENTION_BACKEND in out.out
    if not torch.cuda.is_available():
        assert "running on CPU" in out.out
    assert "pip install 'torch<1.0'" in out.out, "a version outside requirements.txt must come with its fix"
    assert "numpy" not in out.out.split("Attention backend")[1], "numpy satisfies numpy>=1.0: not reported"
    assert "surely-not-installed-pkg" not in out.out, "packages that are not installed are not reported"
    assert out.err == ""


def test_environment_report_never_raises(capsys, monkeypatch):
    def broken(_path):
        raise RuntimeError("boom")

    monkeypatch.setattr(_utils_private, "requirement_problems", broken)
    monkeypatch.setattr(_utils_private, "find_requirements", lambda: "whatever.txt")
    utils.print_environment_report()
    assert "could not check requirements.txt (boom)" in capsys.readouterr().out


# -----------------------------------------------------------------------------------------------------
# Hardware
# -----------------------------------------------------------------------------------------------------

REQUIRED_GPUS = ["A10", "A6000", "A100-40GB", "A100-80GB", "H100-SXM", "H100-PCIe", "H200", "L4", "T4", "RTX4090"]
SPEC_FIELDS = ["fp16_tflops", "bf16_tflops", "fp32_tflops", "memory_bandwidth_tb_s", "memory_gb", "sram_kb",
               "num_sms"]


def test_gpu_specs_schema():
    missing = [g for g in REQUIRED_GPUS if g not in utils.GPU_SPECS]
    assert not missing, f"GPU_SPECS lacks {missing}"
    for key, spec in utils.GPU_SPECS.items():
        assert sorted(spec) == sorted(SPEC_FIELDS), f"GPU_SPECS[{key!r}] must have exactly {SPEC_FIELDS}"
        for field in SPEC_FIELDS:
            assert isinstance(spec[field], (int, float)) and spec[field] > 0, f"GPU_SPECS[{key!r}][{field!r}]"
        assert spec["fp16_tflops"] >= spec["fp32_tflops"], f"{key}: tensor-core fp16 is at least the fp32 rate"
        assert spec["bf16_tflops"] >= spec["fp32_tflops"], f"{key}: bf16 is at least the fp32 rate"
        assert 0.1 < spec["memory_bandwidth_tb_s"] < 10, f"{key}: bandwidth is in TB/s"
        assert spec["sram_kb"] in (64, 96, 128, 164, 192, 228, 256), f"{key}: sram_kb is L1/shared per SM in KB"


@pytest.mark.parametrize("key, expected", [
    ("A6000", dict(fp32_tflops=38.7, memory_bandwidth_tb_s=0.768, memory_gb=48, num_sms=84)),
    ("A100-80GB", dict(fp32_tflops=19.5, bf16_tflops=312, fp16_tflops=312, memory_bandwidth_tb_s=2.039,
                       num_sms=108, sram_kb=192, memory_gb=80)),
    ("A100-40GB", dict(fp32_tflops=19.5, bf16_tflops=312, memory_bandwidth_tb_s=1.555, memory_gb=40)),
    ("H100-SXM", dict(fp32_tflops=67, memory_bandwidth_tb_s=3.35, num_sms=132, memory_gb=80, sram_kb=256)),
    ("H200", dict(memory_bandwidth_tb_s=4.8, memory_gb=141, num_sms=132)),
    ("T4", dict(fp32_tflops=8.1, fp16_tflops=65, memory_bandwidth_tb_s=0.32, memory_gb=16, num_sms=40)),
    ("L4", dict(fp32_tflops=30.3, memory_bandwidth_tb_s=0.3, memory_gb=24, num_sms=58)),
])
def test_gpu_specs_datasheet_values(key, expected):
    for field, value in expected.items():
        assert utils.GPU_SPECS[key][field] == pytest.approx(value, rel=1e-3), f"GPU_SPECS[{key!r}][{field!r}]"
    # Dense (not sparsity) tensor-core rate of H100 SXM is ~989 TFLOP/s, H200 has the same compute.
    assert utils.GPU_SPECS["H100-SXM"]["bf16_tflops"] == pytest.approx(989, rel=0.01)
    for field in ("fp16_tflops", "bf16_tflops", "fp32_tflops", "num_sms", "sram_kb"):
        assert utils.GPU_SPECS["H200"][field] == utils.GPU_SPECS["H100-SXM"][field]


def test_ridge_point_is_flops_over_bytes():
    assert utils.get_ridge_point("A6000") == pytest.approx(38.7e12 / 768e9)
    for key, spec in utils.GPU_SPECS.items():
        for dtype, field in ((torch.float32, "fp32_tflops"), (torch.float16, "fp16_tflops"),
                             (torch.bfloat16, "bf16_tflops"), ("bf16", "bf16_tflops"), ("float32", "fp32_tflops")):
            expected = spec[field] * 1e12 / (spec["memory_bandwidth_tb_s"] * 1e12)
            assert utils.get_ridge_point(key, dtype) == pytest.approx(expected), f"ridge point of {key}, {dtype}"
    assert utils.get_ridge_point("H100-SXM", torch.bfloat16) > utils.get_ridge_point("H100-SXM", torch.float32)
    with pytest.raises(KeyError, match="A6000"):
        utils.get_ridge_point("GTX 480")
    with pytest.raises(ValueError):
        utils.get_ridge_point("A6000", torch.int8)


@pytest.mark.parametrize("device_name, key", [
    ("NVIDIA A10", "A10"),
    ("NVIDIA RTX A6000", "A6000"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX4090"),
])
def test_detect_gpu_maps_device_names(device_name, key, capsys):
    assert utils.detect_gpu(name=device_name) == key
    assert capsys.readouterr().out == ""


def test_detect_gpu_unknown_names_nearest(capsys):
    assert utils.detect_gpu(default="A6000", name="NVIDIA A10G") == "A6000"
    out = capsys.readouterr()
    assert "NVIDIA A10G" in out.out and "nearest entries" in out.out and "A10" in out.out
    assert out.err == "", "the warning goes to stdout (stderr fails an nbgrader test cell)"
    assert _utils_private.nearest_gpu_keys(utils.GPU_SPECS, "NVIDIA H200 NVL", num_sms=132, memory_gb=141)[0] == "H200"
    if not torch.cuda.is_available():
        assert utils.detect_gpu() is None and utils.detect_gpu(default="T4") == "T4"


def test_measure_roofline_cpu_small():
    result = utils.measure_roofline(dtypes=(torch.float32,), device="cpu", size=64, copy_mb=1, n_warmup=1,
                                    n_repeat=2)
    assert result["device"] == "cpu" and result["gpu"] is None and result["matmul_n"] == 64
    assert result["bandwidth_tb_s"] > 0 and math.isfinite(result["bandwidth_tb_s"])
    assert set(result["matmul_tflops"]) == {"float32"} and result["matmul_tflops"]["float32"] > 0
    assert result["ridge_point"]["float32"] == pytest.approx(result["matmul_tflops"]["float32"]
                                                             / result["bandwidth_tb_s"])


def test_measure_roofline_arithmetic(monkeypatch):
    """Bandwidth counts bytes read + written; matmul rate is 2 n^3 FLOP over the time (fake timer)."""
    def fake_latency(fn, *args, **kwargs):
        return 2.0 if fn is torch.matmul else 0.5  # ms

    monkeypatch.setattr(utils, "benchmark_latency", fake_latency)
    result = utils.measure_roofline(dtypes=(torch.float32, torch.bfloat16), device="cpu", size=32, copy_mb=2)
    assert result["bandwidth_tb_s"] == pytest.approx(2 * 2e6 / 0.5e-3 / 1e12)
    assert result["matmul_tflops"]["bfloat16"] == pytest.approx(2 * 32**3 / 2e-3 / 1e12)


# -----------------------------------------------------------------------------------------------------
# Model configs and helpers
# -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, fields", [
    ("GEMMA3_270M_CONFIG", dict(hidden_size=640, intermediate_size=2048, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=256, num_hidden_layers=18)),
    ("GEMMA3_PESUDO_CONFIG", dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=8,
                                  num_key_value_heads=8, head_dim=256, num_hidden_layers=26)),
])
def test_gemma3_configs(name, fields):
    config = getattr(utils, name)
    for field, value in fields.items():
        assert getattr(config, field) == value, f"{name}.{field}"
    assert config._attn_implementation == "sdpa"
    assert config.layer_types == ["full_attention"] * config.num_hidden_layers
    assert config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert config.query_pre_attn_scalar == 256 and config.rms_norm_eps == 1e-6
    assert getattr(utils, name) is config, "configs are built once and cached"


def test_gemma3_pseudo_config_has_both_spellings():
    assert utils.GEMMA3_PSEUDO_CONFIG is utils.GEMMA3_PESUDO_CONFIG, (
        "GEMMA3_PSEUDO_CONFIG (correct spelling) and GEMMA3_PESUDO_CONFIG (the handout's) must be the same config")
    assert {"GEMMA3_PSEUDO_CONFIG", "GEMMA3_PESUDO_CONFIG"} <= set(utils.__all__), "both are public names"


def test_input_helpers_shapes_and_positions():
    B, S, D = 3, 7, 16
    hidden, pos = utils.create_prefill_inputs(B, S, D, dtype=torch.bfloat16, device=CPU)
    assert hidden.shape == (B, S, D) and hidden.dtype == torch.bfloat16
    assert pos.shape == (B, S) and pos.dtype == torch.long
    assert torch.equal(pos, torch.arange(S).expand(B, S))

    decode, pos, prefill = utils.create_decode_inputs_without_cache(B, S, D, dtype=torch.float32, device=CPU)
    assert decode.shape == (B, 1, D) and prefill.shape == (B, S, D) and pos.shape == (B, 1)
    assert torch.equal(pos, torch.full((B, 1), S)), "the decoded token sits at position seq_len"

    decode, pos, cache_pos = utils.create_decode_inputs_with_cache(B, S, D, dtype=torch.float16, device=CPU)
    assert decode.shape == (B, 1, D) and decode.dtype == torch.float16
    assert torch.equal(pos, torch.full((B, 1), S)) and torch.equal(cache_pos, torch.tensor([S]))


def test_position_embeddings(tiny_model, tiny_config):
    _, rotary = tiny_model
    hidden, pos = utils.create_prefill_inputs(2, 5, tiny_config.hidden_size, dtype=torch.bfloat16, device=CPU)
    cos, sin = utils.get_position_embeddings(hidden, pos, rotary, layer_type="full_attention")
    assert cos.shape == sin.shape == (2, 5, tiny_config.head_dim) and cos.dtype == torch.bfloat16
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    angles = torch.arange(5, dtype=torch.float64)[:, None] * inv_freq[None, :]
    expected = torch.cat([angles, angles], dim=-1).cos()
    torch.testing.assert_close(cos[1].double(), expected, atol=1e-2, rtol=0)


def test_initialize_kv_cache(tiny_config):
    cache = utils.initialize_kv_cache(tiny_config, max_cache_len=16)
    assert isinstance(cache, utils.KVCache)
    assert len(cache.layers) == tiny_config.num_hidden_layers
    assert all(slot.keys is None and slot.values is None and slot.max_cache_len == 16 for slot in cache.layers)
    assert all(slot.key_buffer is None for slot in cache.layers), "buffers are allocated by the prefill"
    assert cache.layers[0] is not cache.layers[1]
    with pytest.raises(ValueError):
        utils.initialize_kv_cache(tiny_config, max_cache_len=0)


def _count_calls(layer):
    calls = []
    handle = layer.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


def test_prefill_fills_one_slot_per_layer(tiny_model, tiny_config):
    layer, rotary = tiny_model
    B, S, n_layers = 2, 6, 2
    cfg = tiny_config
    hidden, pos = utils.create_prefill_inputs(B, S, cfg.hidden_size, device=CPU)
    emb = utils.get_position_embeddings(hidden, pos, rotary)
    cache = utils.initialize_kv_cache(cfg, max_cache_len=S)
    calls, handle = _count_calls(layer)
    out = utils.multi_layer_prefill_forward(n_layers, layer=layer, hidden_states=hidden, position_ids=pos,
                                            position_embeddings=emb, past_key_values=cache)
    handle.remove()
    assert len(calls) == n_layers, "one forward pass of the layer per simulated layer"
    assert out.shape == (B, S, cfg.hidden_size) and not out.requires_grad
    kv_shape = (B, cfg.num_key_value_heads, S, cfg.head_dim)
    for i in range(n_layers):
        assert cache.layers[i].keys.shape == kv_shape and cache.layers[i].values.shape == kv_shape
        assert cache.get_seq_length(i) == S
        assert cache.layers[i].key_buffer.shape == (B, cfg.num_key_value_heads, S, cfg.head_dim), (
            "the prefill allocates max_cache_len positions")
    assert not torch.allclose(cache.layers[0].keys, cache.layers[1].keys), "each pass stores its own layer's keys"
    assert cache.layers[2].keys is None, "slots beyond num_layers stay empty"
    first_keys = cache.layers[1].keys.clone()
    buffer_address = cache.layers[1].key_buffer.data_ptr()
    utils.multi_layer_prefill_forward(n_layers, layer, hidden, pos, emb, cache)
    assert cache.layers[1].keys.shape == kv_shape, "a repeated prefill restarts the sequence (no growth)"
    assert cache.layers[1].key_buffer.data_ptr() == buffer_address, "a repeated prefill reuses the buffers"
    torch.testing.assert_close(cache.layers[1].keys, first_keys)

    other_prompt, _ = utils.create_prefill_inputs(B, S, cfg.hidden_size, device=CPU)
    fresh = utils.initialize_kv_cache(cfg, max_cache_len=S)
    expected = utils.multi_layer_prefill_forward(n_layers, layer, other_prompt, pos, emb, fresh)
    out = utils.multi_layer_prefill_forward(n_layers, layer, other_prompt, pos, emb, cache)
    torch.testing.assert_close(out, expected, msg="a prefill on a used cache must equal one on a fresh cache")
    for i in range(n_layers):
        torch.testing.assert_close(cache.layers[i].keys, fresh.layers[i].keys,
                                   msg="a new prompt's prefill replaces the old prompt's keys")


def test_decode_with_cache_equals_full_prefill_last_token(tiny_model, tiny_config):
    """The KV-cache contract: prefill(S tokens) then decode(token S) == prefill(S+1 tokens) at the last token."""
    layer, rotary = tiny_model
    B, S, n_layers, D = 2, 6, 3, tiny_config.hidden_size
    torch.manual_seed(1)
    tokens = torch.randn(B, S + 2, D)

    def full_prefill(length):
        _, positions = utils.create_prefill_inputs(B, length, D, device=CPU)
        cache = utils.initialize_kv_cache(tiny_config, length)
        prompt = tokens[:, :length]
        out = utils.multi_layer_prefill_forward(n_layers, layer, prompt, positions,
                                                utils.get_position_embeddings(prompt, positions, rotary), cache)
        return out, cache

    def decode(cache, position):
        _, dec_pos, cache_pos = utils.create_decode_inputs_with_cache(B, position, D, device=CPU)
        new = tokens[:, position:position + 1]
        return utils.multi_layer_decode_forward(n_layers, layer=layer, hidden_states=new, position_ids=dec_pos,
                                                position_embeddings=utils.get_position_embeddings(new, dec_pos, rotary),
                                                past_key_values=cache, cache_positions=cache_pos, use_kv_cache=True,
                                                prefill_hidden_states=None)

    reference, full_cache = full_prefill(S + 1)
    _, pos = utils.create_prefill_inputs(B, S, D, device=CPU)
    cache = utils.initialize_kv_cache(tiny_config, S + 2)
    prompt = tokens[:, :S]
    utils.multi_layer_prefill_forward(n_layers, layer, prompt, pos, utils.get_position_embeddings(prompt, pos, rotary),
                                      cache)
    buffers = [(slot.key_buffer.data_ptr(), slot.value_buffer.data_ptr()) for slot in cache.layers]
    calls, handle = _count_calls(layer)
    out = decode(cache, S)
    handle.remove()
    assert len(calls) == n_layers
    assert out.shape == (B, 1, D)
    torch.testing.assert_close(out, reference[:, S:], rtol=1e-4, atol=1e-5,
                               msg="decode with the cache must reproduce the last token of a full prefill")
    for i in range(n_layers):
        slot = cache.layers[i]
        torch.testing.assert_close(slot.key_buffer[:, :, S], full_cache.layers[i].keys[:, :, S], rtol=1e-4, atol=1e-5,
                                   msg=f"after a decode step, layer {i}'s cache holds the new token's key at position S")
        torch.testing.assert_close(slot.value_buffer[:, :, S], full_cache.layers[i].values[:, :, S], rtol=1e-4,
                                   atol=1e-5, msg=f"layer {i}'s cache holds the new token's value at position S")
    assert [(s.key_buffer.data_ptr(), s.value_buffer.data_ptr()) for s in cache.layers] == buffers, (
        "a decode step writes into the preallocated buffers in place")
    again = decode(cache, S)
    torch.testing.assert_close(again, out, msg="repeated decode steps measure the same step")
    assert all(cache.get_seq_length(i) == S for i in range(n_layers)), "decode does not grow the cache"

    cache.advance()  # keep token S; the next step decodes token S + 1
    assert all(cache.get_seq_length(i) == S + 1 for i in range(n_layers))
    reference2, _ = full_prefill(S + 2)
    torch.testing.assert_close(decode(cache, S + 1), reference2[:, S + 1:], rtol=1e-4, atol=1e-5,
                               msg="after advance(), the next decode step reproduces a full prefill's next token")
    with pytest.raises(ValueError, match="max_cache_len"):
        cache.advance()  # the cache is full (S + 2 tokens): one more token does not fit
        decode(cache, S + 1)


def test_decode_without_cache(tiny_model, tiny_config):
    layer, rotary = tiny_model
    B, S, n_layers, D = 2, 5, 3, tiny_config.hidden_size
    decode, pos, prefill = utils.create_decode_inputs_without_cache(B, S, D, device=CPU)
    emb = utils.get_position_embeddings(decode, pos, rotary)
    calls, handle = _count_calls(layer)
    out = utils.multi_layer_decode_forward(n_layers, layer=layer, hidden_states=decode, position_ids=pos,
                                           position_embeddings=emb, past_key_values=None, cache_positions=None,
                                           use_kv_cache=False, prefill_hidden_states=prefill)
    handle.remove()
    assert len(calls) == n_layers and out.shape == (B, 1, D)
    with torch.no_grad():
        expected = decode
        for _ in range(n_layers):
            expected = layer(expected, position_embeddings=emb, use_kv_cache=False, prefill_hidden_states=prefill)
    torch.testing.assert_close(out, expected)


def test_decode_helpers_reject_misuse(tiny_model, tiny_config):
    layer, rotary = tiny_model
    D = tiny_config.hidden_size
    decode, pos, cache_pos = utils.create_decode_inputs_with_cache(1, 4, D, device=CPU)
    emb = utils.get_position_embeddings(decode, pos, rotary)
    empty_cache = utils.initialize_kv_cache(tiny_config, 4)
    with pytest.raises(ValueError, match="prefill"):
        utils.multi_layer_decode_forward(2, layer, decode, pos, emb, empty_cache, cache_pos, True, None)
    with pytest.raises(ValueError, match="prefill_hidden_states"):
        utils.multi_layer_decode_forward(2, layer, decode, pos, emb, None, None, False, None)
    hidden, ppos = utils.create_prefill_inputs(1, 4, D, device=CPU)
    with pytest.raises(ValueError, match="layer slots"):
        utils.multi_layer_prefill_forward(tiny_config.num_hidden_layers + 1, layer, hidden, ppos,
                                          utils.get_position_embeddings(hidden, ppos, rotary), empty_cache)


@pytest.fixture(scope="module")
def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=32, bos_token_id=0,
                        eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def test_gpt2_decoder_forward_matches_transformers(tiny_gpt2):
    tokens = torch.randint(50, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = tiny_gpt2.transformer(input_ids=tokens, use_cache=False).last_hidden_state
    out = utils.gpt2_decoder_forward(tiny_gpt2, tokens)
    assert out.shape == (3, 9, 32)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5,
                               msg="without a cache, gpt2_decoder_forward is GPT-2's decoder stack")


def test_cuda_graph_helpers_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x = torch.randn(8)
    assert utils.capture_cuda_graph(torch.sin, x) is None, "no graph off CUDA"
    result = utils.benchmark_eager_and_graphed(torch.sin, x, n_warmup=1, n_repeat=3)
    assert result["graph_ms"] is None and result["eager_ms"] > 0
    assert result["measured_ms"] == result["eager_ms"], "off CUDA the measured time is the eager time"


def test_count_kernels_per_call_counts_one_call():
    x = torch.randn(16)
    counts = utils.count_kernels_per_call(lambda t: torch.relu(t + 1.0), x)
    assert counts["device"] == "cpu" and counts["steps"] == 5, counts
    assert counts["total"] == 2, f"one add and one relu per call, got {counts}"


def test_benchmark_compiled_and_graphed_refuses_modes_that_record_graphs():
    for mode in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ValueError, match="records CUDA graphs"):
            utils.benchmark_compiled_and_graphed(torch.sin, torch.randn(4), mode=mode)


def test_benchmark_compiled_and_graphed_on_cpu_fuses_the_step():
    x = torch.randn(64)

    def step(t):
        return torch.cos(torch.sin(t)) * 2.0 + 1.0

    eager_kernels = utils.count_kernels_per_call(step, x)["total"]
    result = utils.benchmark_compiled_and_graphed(step, x, n_warmup=1, n_repeat=2)
    assert result["graph_ms"] is None and result["measured_ms"] == result["compiled_ms"] > 0
    assert result["compile_s"] > 0
    assert result["kernels"]["total"] < eager_kernels == 4, (result["kernels"], eager_kernels)


# -----------------------------------------------------------------------------------------------------
# Measurement
# -----------------------------------------------------------------------------------------------------

class _FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_benchmark_latency_cpu_units_and_warmup(monkeypatch):
    clock = _FakeClock()
    monkeypatch.setattr(utils.time, "perf_counter", clock)
    calls = []

    def fn(x, scale=1.0, device=None):
        calls.append(device)
        # 1 s for each of the 3 warmup calls, then 2 ms, 4 ms, 3 ms, 3 ms (repeating) for the timed calls.
        clock.now += 1.0 if len(calls) <= 3 else [2e-3, 4e-3, 3e-3, 3e-3][(len(calls) - 4) % 4]

    x = torch.zeros(2)
    assert utils.benchmark_latency(fn, x, n_warmup=3, n_repeat=4, device="meta") == pytest.approx(3.0)
    assert len(calls) == 7 and calls[-1] == "meta", "warmup + repeat calls; a device= kwarg reaches fn"
    calls.clear()
    assert utils.benchmark_latency(fn, x, n_warmup=3, n_repeat=4, stat="mean") == pytest.approx(3.0)
    calls.clear()
    assert utils.benchmark_latency(fn, x, n_warmup=3, n_repeat=4, stat="min") == pytest.approx(2.0)
    with pytest.raises(ValueError):
        utils.benchmark_latency(fn, x, stat="p99")


def test_benchmark_latency_real_clock_is_in_ms():
    latency_ms = utils.benchmark_latency(time.sleep, 0.002, n_warmup=0, n_repeat=3, measure_on="cpu")
    assert latency_ms >= 2.0, "time.sleep(2 ms) takes at least 2 ms: the result must be in milliseconds"


def test_timing_device_inference():
    cpu_tensor = torch.zeros(1)
    assert _utils_private.timing_device(print, (cpu_tensor,), {}, None, utils.DEVICE).type == "cpu"
    assert _utils_private.timing_device(print, (), {"x": [cpu_tensor]}, None, utils.DEVICE).type == "cpu"
    assert _utils_private.timing_device(nn.Linear(2, 2), (), {}, None, utils.DEVICE).type == "cpu"
    assert _utils_private.timing_device(print, (), {}, None, utils.DEVICE) == utils.DEVICE
    assert _utils_private.timing_device(print, (cpu_tensor,), {}, "cuda", utils.DEVICE).type == "cuda"


def test_benchmark_memory_cpu_peak_and_allocated():
    n_temp, n_out = 2_000_000, 500_000  # float32 elements: 8 MB temporary, 2 MB output

    def fn():
        temp = torch.ones(n_temp)
        return temp[:n_out] * 2

    peak_gb, allocated_gb = utils.benchmark_memory(fn, n_warmup=1, n_repeat=3)
    assert peak_gb == pytest.approx((n_temp + n_out) * 4 / 1e9, rel=0.05), "peak = temporary + output, in GB"
    assert allocated_gb == pytest.approx(n_out * 4 / 1e9, rel=0.05), "allocated = output still alive, in GB"

    existing = torch.ones(1_000_000)
    peak_gb, allocated_gb = utils.benchmark_memory(lambda t: t * 2, existing, n_warmup=0, n_repeat=1)
    assert peak_gb == pytest.approx(4e-3, rel=0.05), "inputs allocated before the call are not counted"


def test_default_schedule_records_five_of_ten_steps():
    from torch.profiler import ProfilerAction

    actions = [utils.default_schedule(step) for step in range(10)]
    recorded = [a for a in actions if a in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)]
    assert len(recorded) == 5 and actions[8] == ProfilerAction.RECORD_AND_SAVE
    assert actions[9] == ProfilerAction.NONE


def _profiled_mlp(n_steps=10, hold_s=0.0):
    """A CPU profile of a small MLP's forward, one ``mlp_forward`` range per step; ``hold_s`` keeps each range open
    that long (a sleep), so that the range, not the profiler's own work between steps, fills most of each step."""
    from torch.profiler import profile

    mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 16))
    x = torch.randn(4, 16)
    with torch.no_grad(), profile(schedule=utils.default_schedule) as prof:
        for _ in range(n_steps):
            with torch.profiler.record_function("mlp_forward"):
                mlp(x).sum()
                time.sleep(hold_s)
            prof.step()
    return prof


@pytest.fixture(scope="module")
def cpu_profile():
    return _profiled_mlp()


def test_count_cuda_kernels_cpu_fallback(cpu_profile):
    counts = utils.count_cuda_kernels(cpu_profile)
    assert counts["device"] == "cpu" and counts["steps"] == 5
    # Per step: 2 linear layers (addmm each), gelu, sum.
    assert counts["gemm"] == 2 * 5 and counts["elementwise"] == 1 * 5 and counts["reduction"] == 1 * 5
    assert counts["total"] == sum(counts[c] for c in _utils_private.KERNEL_CATEGORIES) == 4 * 5
    per_step = utils.count_cuda_kernels(cpu_profile, per_step=True)
    assert per_step["total"] == 4 and per_step["gemm"] == 2


def _fake_event(name, device_type, annotation=False, activity="kernel"):
    return types.SimpleNamespace(name=name, device_type=device_type, is_user_annotation=annotation,
                                 activity_type=activity, cpu_parent=None)


def test_count_cuda_kernels_categories_on_cuda_events():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [
        _fake_event("nvjet_tst_64x8_64x16_2x4_v_bz_NNT", cuda),
        _fake_event("ampere_sgemm_128x64_nn", cuda),
        _fake_event("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", cuda),
        _fake_event("triton_tem_fused_mm_0", cuda),
        _fake_event("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", cuda),
        _fake_event("triton_poi_fused_addmm_gelu_0", cuda),
        _fake_event("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps>>", cuda),
        _fake_event("void (anonymous namespace)::cunn_SoftMaxForward<4, float>", cuda),
        _fake_event("triton_red_fused_mean_pow_1", cuda),
        _fake_event("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", cuda),
        _fake_event("fmha_cutlassF_f16_aligned_64x64_rf_sm80", cuda),
        _fake_event("Memcpy DtoD (Device -> Device)", cuda, activity="gpu_memcpy"),
        _fake_event("Memset (Device)", cuda, activity="gpu_memset"),
        _fake_event("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel", cuda),
        _fake_event("some_custom_kernel", cuda),
        _fake_event("ProfilerStep*", cuda, annotation=True, activity="gpu_user_annotation"),
        _fake_event("gate_proj", cuda, annotation=True, activity="gpu_user_annotation"),
        _fake_event("ProfilerStep*", cpu, annotation=True, activity="user_annotation"),
        _fake_event("aten::mm", cpu, activity="cpu_op"),
    ]
    counts = utils.count_cuda_kernels(events)
    assert counts == {"gemm": 4, "attention": 2, "elementwise": 3, "reduction": 3, "memcpy/memset": 2,
                      "other": 1, "total": 15, "steps": 1, "device": "cuda"}


def test_count_cuda_kernels_needs_recorded_steps():
    class NotRecorded:
        def events(self):
            return None

    with pytest.raises(ValueError, match="prof.step"):
        utils.count_cuda_kernels(NotRecorded())


def test_run_oom_safe():
    def cuda_oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    def cpu_oom():
        raise MemoryError()

    def runtime_oom():
        raise RuntimeError("CUDA error: out of memory")

    def bug():
        raise ValueError("not an OOM")

    assert utils.run_oom_safe(cuda_oom) == ("oom", None)
    assert utils.run_oom_safe(cpu_oom) == ("oom", None)
    assert utils.run_oom_safe(runtime_oom) == ("oom", None)
    assert utils.run_oom_safe(lambda a, b=0: a + b, 2, b=3) == ("ok", 5)
    with pytest.raises(ValueError):
        utils.run_oom_safe(bug)


def test_mark_oom_shows_oom_only_where_an_oom_row_has_no_number():
    import pandas as pd

    table = pd.DataFrame([
        {"seq_len": 8192, "status": "ok", "peak_gb": 4.32851, "backward_ms": float("nan"), "note": "x"},
        {"seq_len": 16384, "status": "oom", "peak_gb": float("nan"), "backward_ms": None, "note": "y"},
        {"seq_len": 32768, "status": "OOM", "peak_gb": 8.58993, "backward_ms": float("nan"), "note": None},
    ])
    shown = utils.mark_oom(table, float_format=lambda v: f"{v:.2f}")
    assert shown.to_dict("list") == {
        "seq_len": [8192, 16384, 32768], "status": ["ok", "oom", "OOM"], "peak_gb": ["4.33", "OOM", "8.59"],
        "backward_ms": ["-", "OOM", "OOM"], "note": ["x", "y", "OOM"]}
    assert table["peak_gb"].isna().tolist() == [False, True, False], "the table itself must not change"
    with pytest.raises(KeyError, match="status"):
        utils.mark_oom(table.drop(columns="status"))


# -----------------------------------------------------------------------------------------------------
# Attention backends
# -----------------------------------------------------------------------------------------------------

def _reference_attention(q, k, v, causal, scale):
    """float64 attention in (B, S, H, D) layout, GQA by head repetition, causal aligned bottom-right."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        q_len, kv_len = q.shape[1], k.shape[1]
        allowed = torch.arange(kv_len)[None, :] <= torch.arange(q_len)[:, None] + (kv_len - q_len)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


@pytest.mark.parametrize("q_len, kv_len, heads, kv_heads, causal, scale", [
    (9, 9, 4, 4, False, None),
    (9, 9, 4, 4, True, None),
    (3, 11, 4, 2, True, 0.3),
    (1, 7, 6, 2, False, None),
])
def test_flash_attn_func_matches_float64_reference(q_len, kv_len, heads, kv_heads, causal, scale):
    torch.manual_seed(q_len * 100 + kv_len)
    B, D = 2, 16
    q = torch.randn(B, q_len, heads, D)
    k = torch.randn(B, kv_len, kv_heads, D)
    v = torch.randn(B, kv_len, kv_heads, D)
    out = utils.flash_attn_func(q, k, v, causal=causal, softmax_scale=scale)
    assert out.shape == (B, q_len, heads, D) and out.dtype == q.dtype and out.is_contiguous()
    expected = _reference_attention(q, k, v, causal, scale if scale is not None else D**-0.5)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert utils.flash_attn_func.last_backend == "PyTorch SDPA math path (CPU)"


def test_flash_attn_func_announces_backend_once(capsys, monkeypatch):
    monkeypatch.setattr(_utils_private, "NOTED", set())
    q = torch.randn(1, 4, 2, 8)
    utils.flash_attn_func(q, q, q)
    utils.flash_attn_func(q, q, q)
    out = capsys.readouterr().out
    assert out.count("flash_attn_func: using") == 1
    with pytest.raises(ValueError):
        utils.flash_attn_func(q[0], q[0], q[0])
    assert isinstance(utils.ATTENTION_BACKEND, str)
    if not torch.cuda.is_available():
        assert "CPU" in utils.ATTENTION_BACKEND


def test_flash_attn_func_cuda_fallback_chain(monkeypatch):
    """On a GPU without SDPA's flash kernel (T4) the call falls back to memory-efficient/math, never fails."""
    from torch.nn.attention import SDPBackend

    class FakeCudaTensor:
        def __init__(self, shape, dtype=torch.bfloat16):
            self.shape, self.dtype, self.is_cuda = torch.Size(shape), dtype, True

        def dim(self):
            return len(self.shape)

    tried = []

    def fake_sdpa(q, k, v, causal, scale, backends):
        tried.append(tuple(backends))
        if backends == [SDPBackend.FLASH_ATTENTION]:
            raise RuntimeError("No available kernel. Aborting execution.")
        return "output"

    monkeypatch.setattr(_utils_private, "sdpa_bshd", fake_sdpa)
    monkeypatch.setattr(_utils_private, "FLASH_ATTN_INSTALLED", False)
    q = FakeCudaTensor((1, 8, 2, 64))
    assert utils.flash_attn_func(q, q, q) == "output"
    assert tried == [(SDPBackend.FLASH_ATTENTION,), (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)]
    assert utils.flash_attn_func.last_backend == "PyTorch SDPA memory-efficient/math kernel"
    tried.clear()
    q32 = FakeCudaTensor((1, 8, 2, 64), dtype=torch.float32)
    utils.flash_attn_func(q32, q32, q32)
    assert tried == [(SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)], "fp32 never tries the flash kernel"


# -----------------------------------------------------------------------------------------------------
# Plotting
# -----------------------------------------------------------------------------------------------------

def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_plot_roofline():
    peak, bw = 38.7, 0.768
    fig, ax = utils.plot_roofline("A6000", peak, bw, {"mlp_prefill": 400.0, "mlp_decode": 2.0,
                                                      "gemm measured": (30.0, 12.5)})
    assert isinstance(fig, plt.Figure)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP/byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel() and "A6000" in ax.get_title()
    labels = ax.get_legend_handles_labels()[1]
    assert any("ridge point" in lbl and f"{peak / bw:.1f}" in lbl for lbl in labels)
    assert "memory-bound region" in labels and "compute-bound region" in labels
    texts = _texts(ax)
    assert {"mlp_prefill", "mlp_decode", "gemm measured", "gemm measured (measured)"} <= set(texts)
    roof = ax.get_lines()[0]
    x, y = roof.get_xdata(), roof.get_ydata()
    assert y.max() == pytest.approx(peak) and y[0] == pytest.approx(bw * x[0]), "roof = min(peak, bw * AI)"
    decode_point = [line for line in ax.get_lines() if list(line.get_xdata()) == [2.0]][0]
    assert decode_point.get_ydata()[0] == pytest.approx(2.0 * bw), "a memory-bound op sits on the slope"
    with pytest.raises(ValueError):
        utils.plot_roofline("A6000", peak, bw, {"bad": 0.0})
    with pytest.raises(TypeError):
        utils.plot_roofline("A6000", peak, bw, [1.0, 2.0])


def test_plot_roofline_with_measured_ceilings():
    peak, bw, m_peak, m_bw = 38.7, 0.768, 20.0, 0.5
    fig, ax = utils.plot_roofline("A6000", peak, bw, {"gemm": (100.0, 12.5), "copy": (0.25, 0.1)},
                                  measured_tflops=m_peak, measured_bandwidth_tb_s=m_bw, measured_label="this GPU",
                                  measured_only=True)
    labels = ax.get_legend_handles_labels()[1]
    assert "A6000 roofline (datasheet)" in labels, "with measured ceilings the datasheet roof is named as such"
    assert any(lbl.startswith("this GPU:") and "20 TFLOP/s" in lbl for lbl in labels), labels
    assert any(f"this GPU ridge: {m_peak / m_bw:.1f} FLOP/byte" == lbl for lbl in labels), labels
    measured_roof = next(line for line in ax.get_lines() if line.get_label().startswith("this GPU:"))
    x, y = measured_roof.get_xdata(), measured_roof.get_ydata()
    assert y.max() == pytest.approx(m_peak) and y[0] == pytest.approx(m_bw * x[0]), "measured roof = min(peak, bw*AI)"
    spans = [patch for patch in ax.patches if patch.get_label() == "memory-bound region"]
    assert spans and spans[0].get_x() + spans[0].get_width() == pytest.approx(m_peak / m_bw), (
        "the regions are shaded by the measured ridge, not the datasheet's")
    points = {line.get_label().split(":")[0]: line.get_ydata()[0] for line in ax.get_lines()
              if len(line.get_xdata()) == 1 and "ridge" not in line.get_label()}
    assert points == {"gemm": pytest.approx(12.5), "copy": pytest.approx(0.1)}, (
        f"measured_only draws each operation at its measured TFLOP/s only: {points}")
    with pytest.raises(ValueError):
        utils.plot_roofline("A6000", peak, bw, {"x": 1.0}, measured_tflops=m_peak)
    with pytest.raises(ValueError):
        utils.plot_roofline("A6000", peak, bw, {"x": 1.0}, measured_tflops=0.0, measured_bandwidth_tb_s=m_bw)


def test_plot_roofline_on_given_axes():
    fig, ax = plt.subplots()
    fig2, ax2 = utils.plot_roofline("H100-SXM", 989.4, 3.35, {"x": 10}, title="custom", ax=ax)
    assert fig2 is fig and ax2 is ax and ax.get_title() == "custom"


def test_plot_gemm_torch_matmul_latency():
    fig, ax = utils.plot_gemm_torch_matmul_latency([64, 128], [0.5, 4.0], [1e-5, 2e-5])
    gemm_line, matmul_line = ax.get_lines()[:2]
    assert list(gemm_line.get_ydata()) == pytest.approx([500.0, 4000.0]), "seconds are drawn as ms"
    assert list(matmul_line.get_ydata()) == pytest.approx([0.01, 0.02])
    assert "ms" in ax.get_ylabel() and ax.get_xlabel() and ax.get_title()
    assert "50,000x" in _texts(ax) and "200,000x" in _texts(ax)


def test_plot_latency_vs_size_skips_missing_points():
    fig, ax = utils.plot_latency_vs_size([1, 2, 4], {"a": [1.0, 2.0, 3.0], "b": [1.0, None, float("nan")]},
                                         xlabel="Batch size", ylabel="Latency (ms)", title="t", logx=True)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["a"].get_xdata()) == [1, 2, 4] and list(lines["b"].get_xdata()) == [1]
    assert ax.get_xlabel() == "Batch size" and ax.get_ylabel() == "Latency (ms)" and ax.get_yscale() == "log"
    with pytest.raises(ValueError):
        utils.plot_latency_vs_size([1, 2], {"a": [1.0]})


def test_plot_flash_attn_improvement_handles_oom():
    import pandas as pd

    df = pd.DataFrame([
        {"seq_len": 256, "sdpa_ms": 1.0, "flash_ms": 0.5, "sdpa_mem_gb": 0.4, "flash_mem_gb": 0.1},
        {"seq_len": 512, "sdpa_ms": 4.0, "flash_ms": 1.0, "sdpa_mem_gb": 1.6, "flash_mem_gb": 0.2},
        {"seq_len": 1024, "sdpa_ms": None, "flash_ms": 2.0, "sdpa_mem_gb": None, "flash_mem_gb": 0.4},
    ])
    fig, axes = utils.plot_flash_attn_improvement(
        df=df, title="FlashAttention vs SDPA", latency_cols=("sdpa_ms", "flash_ms"),
        memory_cols=("sdpa_mem_gb", "flash_mem_gb"), seq_len_col="seq_len",
        annotate_speedup=True, annotate_mem_reduction=True)
    assert len(axes) == 2 and fig._suptitle.get_text() == "FlashAttention vs SDPA"
    latency_ax, memory_ax = axes
    assert "ms" in latency_ax.get_ylabel() and "GB" in memory_ax.get_ylabel()
    assert "tokens" in latency_ax.get_xlabel()
    assert "2.0x faster" in _texts(latency_ax) and "4.0x faster" in _texts(latency_ax)
    assert "8.0x less" in _texts(memory_ax)
    assert "SDPA: OOM" in _texts(latency_ax) and "SDPA: OOM" in _texts(memory_ax)
    sdpa_line = [line for line in latency_ax.get_lines() if line.get_label() == "SDPA"][0]
    assert list(sdpa_line.get_xdata()) == [256, 512], "OOM rows are left out of the series"
    fig, axes = utils.plot_flash_attn_improvement(df, "latency only", memory_cols=None, annotate_speedup=False)
    assert len(axes) == 1 and not any("faster" in t for t in _texts(axes[0]))


def _synthetic_gpu_trace():
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 1000,
               "dur": 400}]
    ts = 1000.0
    for i in range(200):  # many tiny kernels, then a few long ones
        events.append({"ph": "X", "cat": "kernel", "name": f"void at::native::vectorized_elementwise_kernel<{i}>",
                       "pid": 0, "tid": 7, "ts": ts, "dur": 0.2, "args": {"device": 0, "stream": 7}})
        ts += 0.3
    events.append({"ph": "X", "cat": "kernel", "name": "nvjet_tst_64x8_64x16_2x4_v_bz_NNT", "pid": 0, "tid": 7,
                   "ts": ts + 5, "dur": 300, "args": {"device": 0, "stream": 7}})
    events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 8,
                   "ts": ts, "dur": 20, "args": {"device": 0, "stream": 8}})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1001, "dur": 30})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::gelu", "pid": 1, "tid": 1, "ts": 1002, "dur": 5})
    events.append({"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}})
    return {"traceEvents": events}


def test_plot_trace_timeline_gpu_rows_and_merging():
    fig, ax = utils.plot_trace_timeline(_synthetic_gpu_trace(), max_rows=10)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:2] == ["GPU 0 stream 7", "GPU 0 stream 8"], "GPU streams come first"
    assert "CPU thread 1" in labels and "CPU thread 1 depth 1" in labels
    assert "µs" in ax.get_xlabel() and "204 events" in ax.get_title()
    stream7 = [c for c in ax.collections if c.get_paths() and abs(c.get_paths()[0].vertices[:, 1].mean()) < 0.5]
    assert len(stream7) < 20, "hundreds of tiny kernels are merged into a few bars"
    assert any(c.get_hatch() == "///" for c in stream7)
    assert "nvjet_tst_64x8_64x16_2x4_v_bz_NNT" in _texts(ax)
    assert any(t.startswith("step#4") for t in _texts(ax))
    fig, ax = utils.plot_trace_timeline(_synthetic_gpu_trace(), max_rows=1, max_depth=1, title="one row")
    assert len(ax.get_yticks()) == 1 and ax.get_title() == "one row"


def test_merge_short_events_merges_runs_of_short_events_only():
    def event(ts, dur, name="void gemm_kernel"):
        return {"ts": float(ts), "dur": float(dur), "name": name, "cat": "kernel"}

    # threshold 10 µs: three short kernels close together, a long one, two short ones after a wide gap.
    events = [event(0, 2), event(5, 3), event(12, 1), event(20, 50, "flash_fwd"), event(200, 2), event(205, 2)]
    bars = _utils_private.merge_short_events(list(reversed(events)), threshold_us=10)  # order of input does not matter
    assert [(bar[0], bar[1], bar[4]) for bar in bars] == [(0, 13, 3), (20, 70, 1), (200, 207, 2)], (
        "short events within the threshold of each other form one bar; a long event gets its own bar")
    assert bars[0][2] == {"gemm": 6.0}, "a merged bar adds up the busy time of its events per category"
    assert bars[1][3] == "flash_fwd" and not bars[1][5], "a long event keeps its name and never absorbs others"
    long_then_short = _utils_private.merge_short_events([event(0, 50), event(51, 1)], threshold_us=10)
    assert len(long_then_short) == 2, "a short event never joins a bar that began with a long event"


def test_plot_trace_timeline_from_profile_and_json_path(tmp_path):
    # A bar is labelled only where its name fits (11 characters of mlp_forward: about 6 % of the 5 steps drawn).
    # Without the hold, a loaded machine (the suite runs two workers) can stretch the profiler's work between steps
    # until the forward's own range is too narrow for its name.
    prof = _profiled_mlp(hold_s=0.02)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))  # a profile exports once; plotting it must still work afterwards
    for source in (prof, str(path)):
        fig, ax = utils.plot_trace_timeline(source, max_rows=6)
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels[0].startswith("CPU thread") and all(lbl.startswith("CPU thread") for lbl in labels)
        assert ax.get_xlabel().startswith("Time since first drawn event (") and ax.get_title()
        assert "mlp_forward" in _texts(ax), "record_function ranges are drawn and labelled"
        assert sum(t.startswith("step#") for t in _texts(ax)) == 5, "the 5 recorded steps are marked"
        fig, ax = utils.plot_trace_timeline(source, max_depth=1)
        assert len(ax.get_yticks()) == 1
    with open(path) as f:
        trace = json.load(f)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("ph") != "X"]
    with pytest.raises(ValueError, match="no kernel or operator events"):
        utils.plot_trace_timeline(trace)


PROFILE_ONCE = """
import os, sys, warnings, torch
if sys.argv[1] == "with-utils":
    import utils
    utils.quiet_library_messages()
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU]):
    torch.ones(4) @ torch.ones(4)
    os.write(2, b"a warning of its own\\n")
warnings.warn("TypedStorage is deprecated. It will be removed in the future", UserWarning)
warnings.warn("a student's own warning", UserWarning)
print(os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS"))
"""


def test_quiet_library_messages_drops_the_profilers_usdt_lines_and_benign_warnings_and_nothing_else():
    import subprocess
    import sys

    def stderr_of(mode: str) -> str:
        result = subprocess.run([sys.executable, "-c", PROFILE_ONCE, mode], capture_output=True, text=True,
                                cwd=Path(utils.__file__).parent, timeout=300)
        assert result.returncode == 0, result.stderr
        return result.stderr + result.stdout

    control = stderr_of("plain")
    if "USDT:" not in control:
        pytest.skip("this torch build's profiler writes no USDT lines: nothing to drop")
    quiet = stderr_of("with-utils")
    assert "USDT:" not in quiet, f"utils must drop Kineto's USDT lines from descriptor 2:\n{quiet}"
    assert "a warning of its own" in quiet, "anything else on stderr must still come through"
    assert "TypedStorage is deprecated" in control and "TypedStorage is deprecated" not in quiet, (
        "warnings raised inside torch's own code that a correct run triggers are not shown")
    assert "a student's own warning" in quiet, "every other warning is shown"
    assert quiet.rstrip().endswith("0"), "Inductor's 'Autotune Choices Stats' JSON is switched off before it loads"


def test_inductor_skipping_a_kernel_too_big_for_the_gpu_is_not_shown_as_an_error():
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    utils.quiet_library_messages()
    log, kept = logging.getLogger("torch._inductor.select_algorithm"), Keep()
    benign = ("No valid triton configs. OutOfMemoryError: out of resource: triton_mm Required: 262144 "
              "Hardware limit:232448 Reducing block sizes or `num_stages` may help.")
    log.addHandler(kept)  # torch's loggers do not propagate to the root logger (nor to caplog)
    try:
        log.error("Runtime error during autotuning: \n%s. \nIgnoring this choice.", benign)
        log.error("Runtime error during autotuning: \n%s. \nIgnoring this choice.", "an illegal memory access")
    finally:
        log.removeHandler(kept)
    assert len(kept.messages) == 1 and "illegal memory access" in kept.messages[0], (
        f"only Inductor's benign out-of-resource skips are dropped, every other autotuning error is shown: "
        f"{kept.messages}")


def test_progress_draws_a_bar_except_at_quick_scale(monkeypatch, capsys):
    items = [3, 1, 2]
    monkeypatch.setattr(utils, "SCALE", "quick")
    assert utils.progress(items, "steps") is items, "at quick scale (grading) the loop runs over the iterable itself"
    monkeypatch.setattr(utils, "SCALE", "teaching")
    bar = utils.progress(iter(items), "steps", total=len(items))
    assert bar is not items and list(bar) == items, "the bar yields the same items in the same order"
    assert "steps" in capsys.readouterr().err, "outside Jupyter the bar is tqdm's text bar on stderr"


GLOBAL_STATE = """
import json, logging, os, sys, warnings
import torch
import torch.autograd.profiler as ap
b = torch.backends

def state():
    return {
        "sdp": [b.cuda.cudnn_sdp_enabled(), b.cuda.flash_sdp_enabled(), b.cuda.mem_efficient_sdp_enabled(),
                b.cuda.math_sdp_enabled()] if hasattr(b.cuda, "cudnn_sdp_enabled") else [],
        "backends": [b.cudnn.benchmark, b.cudnn.deterministic, b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32,
                     torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled()],
        "defaults": [str(torch.get_default_dtype()), str(torch.get_default_device()), torch.get_num_threads(),
                     torch.is_grad_enabled()],
        "profiler": [id(getattr(ap, name, None)) for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler")],
        "modes": [torch._C._is_torch_function_mode_enabled(), len(torch.overrides._get_current_function_mode_stack())],
        "logging": {name: [type(f).__name__ for f in logging.getLogger(name).filters]
                    for name in ("torch._inductor.select_algorithm", "torch", "")},
        "warnings": len(warnings.filters),
        "environ": dict(os.environ),
        "fds": sorted(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else [],
        "rng": torch.initial_seed(),
    }

before = state()
import utils
after = state()
changed = {key: [before[key], after[key]] for key in before if before[key] != after[key]}
print(json.dumps(changed, default=str))
"""


def test_importing_utils_changes_no_global_state():
    """The student helper module is read for help; importing it changes nothing a student would have to know about:
    PyTorch's attention backends and numerical settings, the profiler's functions, torch function modes, logging
    filters, warning filters, the environment, open file descriptors. (The grader sets what grading needs in its
    own kernels: nbgrader_ext.GRADING_KERNEL_SETTINGS.)"""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GLOBAL_STATE], capture_output=True, text=True, timeout=300,
                          cwd=Path(utils.__file__).parent, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-2000:]
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    assert changed == {}, f"import utils changed global state: {changed}"


def test_uses_answers_skips_a_block_whose_answer_is_not_written_and_says_which(capsys):
    class StaticKVCache:
        def __init__(self):
            raise NotImplementedError()

    with utils.uses_answers("Question 4.5", your_functions={"StaticKVCache": "Question 4.5"}):
        StaticKVCache()
        raise AssertionError("the rest of the block must be skipped")
    assert "your StaticKVCache (Question 4.5) is not written yet" in capsys.readouterr().out
    with utils.uses_answers("Question 3.1", "Question 4.2"):
        raise NotImplementedError()
    assert "Question 3.1 and Question 4.2 are not written yet" in capsys.readouterr().out
    with pytest.raises(NotImplementedError, match="no kernel"):  # a library's error says what is missing: raised
        with utils.uses_answers("Question 3.1"):
            raise NotImplementedError("no kernel for this dtype")
    with pytest.raises(ValueError):
        with utils.uses_answers("Question 3.1"):
            raise ValueError("a real bug")
