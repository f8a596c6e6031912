"""The test contract: how every lab's tests compare a student's answers, and how a test cell earns partial credit.

Every public and hidden test of every lab compares answers through this module, so that one policy holds everywhere
(docs/AUTHORING.md, "The test contract"):

- **Forms.** An answer is accepted in every form a question's words allow: a number as a Python ``int``/``float``,
  a NumPy scalar or a one-element tensor; an integer count also as an integral float; a label as a ``str`` or
  ``np.str_``, compared without surrounding spaces or case. Subclasses that could lie in a comparison (an ``int``
  whose ``__eq__`` is always true) and ``bool`` are refused with a message that names the type.
- **Tolerance.** A real answer is held to ``REL_TOL`` (a float32 computation passes); a question that wants more
  says so and passes its own tolerance. Tensors are compared in float64 on the CPU, with a default tolerance taken
  from the dtype the answer has.
- **Messages.** A failure states the contract and the expected value at full precision.
- **Lying answers.** A subclass of an accepted type is tampering (``LyingAnswer``): the whole cell scores zero.
- **Partial credit.** A test cell's checks sit in ``with check("what it checks", weight=w):`` blocks. A failed
  block is recorded and the next one runs; the cell ends with ``finish_checks()``. In a notebook that call raises
  an ``AssertionError`` listing every failed check; when grading, the grader records the weighted share of the
  checks that passed as the cell's score (course/grader/boundary.py). Code outside the blocks is all or nothing: an
  error there (the function is missing, say) costs the whole cell.
- **The method gates the value.** Where a question prescribes how to compute (three nested loops, no library
  product, a tiled loop, a cache), that rule is a ``check(..., method=True)`` block. When a method check fails, the
  cell earns at most ``SKIPPED_METHOD_SHARE`` (a quarter) of its points, scaled by the share of its other checks that
  passed: an answer that hands the work to the library earns less than a real attempt with one mistake.
- **Carried answers.** A later question that builds on an earlier answer uses that answer as it was graded:
  the earlier question's test stores what the later one needs (``keep_carried``), and the later test reads it
  (``kept_carried``), never by calling the student's function again after it may have been redefined.

This file is the graders' and the tests' (``release/`` ships it so that public tests run in a student's notebook);
nothing in it is needed to answer a question.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

__all__ = [
    "REL_TOL", "check", "finish_checks", "ChecksFailed", "LyingAnswer",
    "as_real", "as_integer", "as_label", "as_tensor", "as_dict",
    "assert_close", "assert_integer", "assert_label", "assert_reals_by_key", "assert_tensor_close",
    "as_tuple", "as_truth",
    "assert_calls", "output_devices_with_meta_default",
    "kernel_side", "record_torch_calls", "RecordingDisabled", "assert_on_input_device", "carried", "assert_or_carried",
    "SKIPPED_METHOD_SHARE", "keep_carried", "kept_carried",
]

REL_TOL = 1e-5
"""Default relative tolerance of a real answer: float32 arithmetic (about 1e-7 per operation) meets it."""

SKIPPED_METHOD_SHARE = 0.25
"""The most a test cell earns, as a share of its points, when one of its method checks failed (docs/AUTHORING.md,
"The order of grades")."""

# Default (rtol, atol) of a tensor answer against a float64 reference, by the answer's dtype: what a computation
# in that dtype meets on the small inputs tests use.
TENSOR_TOL = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.bfloat16: (3e-2, 1e-2),
    torch.float16: (3e-3, 1e-3),
}

_NUMPY_INTEGERS = frozenset(np.dtype(code).type for code in "bBhHiIlLqQ")
_NUMPY_REALS = _NUMPY_INTEGERS | frozenset(np.dtype(code).type for code in "efdg")
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _type_name(value) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


# -- partial credit ---------------------------------------------------------------------------------------------
class ChecksFailed(AssertionError):
    """Raised by ``finish_checks`` in a notebook when some checks of the cell failed; its message lists them."""


class LyingAnswer(AssertionError):
    """An answer of a subclass of an accepted type (an ``int`` whose ``==`` always says yes, a tensor subclass with its
    own ``__torch_function__``): tampering, so the whole test cell scores zero, not only the check that saw it."""


def _refuse(value, what: str, wanted: str):
    """The error for a value of the wrong type: ``LyingAnswer`` for a subclass of a type the contract accepts."""
    kind = type(value)
    lying = not issubclass(kind, (bool, np.generic)) and issubclass(kind, (int, float, str, dict, torch.Tensor))
    error = LyingAnswer if lying else AssertionError
    return error(f"{what} must be {wanted}, got {_type_name(value)}" + (" (a subclass: refused)" if lying else ""))


class RecordingDisabled(LyingAnswer):
    """``record_torch_calls`` saw that the recording of torch calls was switched off while it ran (its probe calls
    went unrecorded): tampering, so the whole test cell scores zero."""


class Scorecard:
    """The checks one test cell ran: ``results`` holds ``(name, weight, failure message or None)`` in order;
    ``methods`` the names of the method checks (``check(..., method=True)``)."""

    def __init__(self, graded: bool = False, passthrough: tuple = (), cell: object = None):
        self.graded = graded  # True in the grader: finish_checks leaves the verdict to it
        self.passthrough = passthrough  # exception types a check never catches (the grader's own errors)
        self.cell = cell  # which notebook cell this card belongs to (IPython's execution count), None in the grader
        self.results: list[tuple[str, float, str | None]] = []
        self.methods: set[str] = set()  # names of the checks that test the prescribed method
        self.lying = False  # a check met a LyingAnswer: the cell scores zero

    @property
    def total(self) -> float:
        return sum(weight for _, weight, _ in self.results)

    @property
    def method_failed(self) -> bool:
        """A method check of this cell failed: the answer skipped what the question asks."""
        return any(failed is not None for name, _, failed in self.results if name in self.methods)

    @property
    def share(self) -> float:
        """Weighted share of the checks that passed, in [0, 1]; 1.0 for a cell that ran none. A failed method check
        caps it: ``SKIPPED_METHOD_SHARE`` times the share of the other checks that passed."""
        if self.lying:
            return 0.0
        if self.method_failed:
            others = [(w, failed) for name, w, failed in self.results if name not in self.methods]
            total = sum(w for w, _ in others)
            passed = 1.0 if total == 0 else sum(w for w, failed in others if failed is None) / total
            return SKIPPED_METHOD_SHARE * passed
        total = self.total
        return 1.0 if total == 0 else sum(w for _, w, failed in self.results if failed is None) / total

    def failures(self) -> list[str]:
        """One line per failed check: its name, its weight out of the cell's, and its message; a failed method check
        says that it caps the cell."""
        cap = f" (the method this question asks for: the cell earns at most {SKIPPED_METHOD_SHARE:.0%} of its points)"
        return [f"FAILED {name} (weight {weight:g} of {self.total:g}){cap if name in self.methods else ''}: "
                f"{' '.join(message.splitlines())}"
                for name, weight, message in self.results if message is not None]


_card: Scorecard | None = None
_grader_kernel_side = None  # the grader's kernel_side while it runs a test cell (begin_cell), else None
_notebook_kept: dict = {}  # keep_carried's store in a notebook; the grader passes its own, one per submission
_kept: dict = _notebook_kept


def _execution_count():
    with contextlib.suppress(Exception):
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.execution_count
    return None


def begin_cell(graded: bool = True, passthrough: tuple = (), kernel_side=None, kept: dict | None = None) -> Scorecard:
    """Start the scorecard of one test cell (the grader calls this before it runs a cell, ``end_cell`` after).

    Args:
        graded: True in the grader: ``finish_checks`` then leaves the verdict to it.
        passthrough: exception types a check never catches (the grader's own errors).
        kernel_side: the grader's ``kernel_side``, used by this module's own probes (``assert_on_input_device``)
            while the cell runs; None in a notebook, where a probe is an ordinary call.
        kept: the store of ``keep_carried`` for this submission (the grader's, one per notebook it grades), so that
            no carried answer crosses from one submission to another.
    """
    global _card, _grader_kernel_side, _kept
    _card = Scorecard(graded=graded, passthrough=tuple(passthrough))
    _grader_kernel_side = kernel_side
    _kept = _notebook_kept if kept is None else kept
    return _card


def end_cell() -> Scorecard | None:
    """The scorecard of the cell that just ran, and forget it."""
    global _card, _grader_kernel_side, _kept
    card, _card, _grader_kernel_side, _kept = _card, None, None, _notebook_kept
    return card


def _current_card() -> Scorecard:
    global _card
    if _card is None or (not _card.graded and _card.cell != _execution_count()):
        _card = Scorecard(cell=_execution_count())  # a new notebook cell (an earlier one may have stopped early)
    return _card


@contextlib.contextmanager
def check(name: str, weight: float = 1, method: bool = False):
    """One weighted check of a test cell: a failure inside the block is recorded and the cell goes on.

    Args:
        name: what the block checks, as a student reads it ("matches A @ B for float32 and float64 inputs").
        weight: its share of the cell's points, relative to the other checks of the cell (> 0).
        method: the block checks the method the question prescribes (no library routine, tiling, a cache). When it
            fails, the cell earns at most ``SKIPPED_METHOD_SHARE`` of its points (``Scorecard.share``); its weight
            then does not count.

    An ``AssertionError`` is recorded with its message; any other exception raised by the student's code is recorded
    as ``TypeName: message``. The grader's own errors (a lost kernel) are never caught.
    """
    assert weight > 0, f"check({name!r}) needs a positive weight, got {weight!r}"
    card = _current_card()
    if method:
        card.methods.add(name)
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a failed check, in any form, is that check's failure
        if card.passthrough and isinstance(exc, card.passthrough):
            raise
        message = str(exc) if isinstance(exc, AssertionError) else f"{type(exc).__name__}: {exc}"
        card.lying = card.lying or _raised_from_lying(exc)
        card.results.append((name, float(weight), message or "failed"))
    else:
        card.results.append((name, float(weight), None))


def _raised_from_lying(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``LyingAnswer`` or was raised while handling one: a test helper that catches an
    ``AssertionError`` to add a hint and raises a new one keeps the tampering a tampering."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, LyingAnswer):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def finish_checks(label: str = "") -> None:
    """End a test cell: in a notebook, raise ``ChecksFailed`` listing the failed checks, else print that all passed.

    Args:
        label: what the cell tests, printed with the result ("Question 1.1").

    When grading, the grader reads the cell's checks itself and records their weighted share as the score.
    """
    global _card
    card = _current_card()
    if card.graded:
        return
    _card = None
    failed = card.failures()
    if failed:
        raise ChecksFailed(f"{label + ': ' if label else ''}{len(failed)} of {len(card.results)} checks failed "
                           f"({card.share:.0%} of this cell's weight passed):\n" + "\n".join(failed))
    if card.results:
        print(f"{label + ': ' if label else ''}all {len(card.results)} checks passed")
    else:
        print(f"{label + ': ' if label else ''}this question's tests are hidden; they run when your notebook is graded")


# -- answers in every allowed form ------------------------------------------------------------------------------
def _one_element(value, what):
    if (value.numel() if type(value) is not np.ndarray else value.size) != 1:
        raise AssertionError(f"{what} must be a number, got a {type(value).__name__} of shape {tuple(value.shape)}")
    return value.reshape(()).item()


def as_real(value, what: str) -> float:
    """``value`` as a Python float: an int/float, a NumPy int/float scalar, or a one-element tensor or array.

    Raises:
        AssertionError: any other type (``bool``, ``str``, subclasses, complex numbers) or a NaN.
    """
    kind = type(value)
    if kind in (int, float) or kind in _NUMPY_REALS:
        number = float(value)
    elif kind in _TENSOR_TYPES or kind is np.ndarray:
        if kind is np.ndarray and value.dtype.kind not in "iuf" or kind in _TENSOR_TYPES and (
                value.dtype == torch.bool or value.is_complex()):
            raise AssertionError(f"{what} must be a real number, got a {kind.__name__} of dtype {value.dtype}")
        if kind in _TENSOR_TYPES and value.device.type == "meta":
            raise AssertionError(f"{what} must be a number with a value, got a tensor on the meta device")
        number = float(_one_element(value, what))
    else:
        raise _refuse(value, what, "a number (a Python or NumPy int or float, or a one-element tensor)")
    if math.isnan(number):
        raise AssertionError(f"{what} must be a number, got NaN")
    return number


def as_integer(value, what: str) -> int:
    """``value`` as a Python int: an int, a NumPy integer, an integral float or a one-element tensor holding one.

    Raises:
        AssertionError: another type, or a number with a fractional part.
    """
    kind = type(value)
    if kind is int or kind in _NUMPY_INTEGERS:
        return int(value)
    number = as_real(value, what)
    if not (math.isfinite(number) and number.is_integer()):
        raise AssertionError(f"{what} must be a whole number, got {number!r}")
    return int(number)


def as_label(value, what: str) -> str:
    """``value`` as a label: a ``str`` or ``np.str_``, without surrounding spaces, case folded."""
    if type(value) not in (str, np.str_):
        raise _refuse(value, what, "a string")
    return str(value).strip().casefold()


def as_tensor(value, what: str) -> torch.Tensor:
    """``value`` itself when it is a ``torch.Tensor`` (or ``nn.Parameter``), detached; no other subclass."""
    if type(value) not in _TENSOR_TYPES:
        raise _refuse(value, what, "a torch.Tensor")
    return value.detach()


def as_dict(value, what: str) -> dict:
    """``value`` as a plain ``dict`` (a ``dict``, ``OrderedDict`` or ``defaultdict``; keys as they are)."""
    import collections

    if type(value) not in (dict, collections.OrderedDict, collections.defaultdict):
        raise _refuse(value, what, "a dict")
    return dict(value)


def as_tuple(value, length: int, what: str) -> tuple:
    """``value`` as a tuple of ``length`` items: a tuple, or any sequence of that length (a list)."""
    try:
        items = tuple(value)
    except TypeError:
        raise AssertionError(f"{what} must return a tuple of {length} values, got {value!r}") from None
    assert len(items) == length, f"{what} must return a tuple of {length} values, got {len(items)}: {value!r}"
    return items


def as_truth(value, what: str) -> bool:
    """``value`` as True or False: a Python bool, a NumPy bool or a one-element boolean tensor."""
    if value is True or value is np.True_:
        return True
    if value is False or value is np.False_:
        return False
    if type(value) not in _TENSOR_TYPES or value.dtype != torch.bool or value.numel() != 1:
        raise AssertionError(f"{what} must be True or False, got {_type_name(value)}"
                             + (f" of dtype {value.dtype} and shape {tuple(value.shape)}"
                                if isinstance(value, torch.Tensor) else f" {value!r}"))
    return bool(value.item())


# -- comparisons ----------------------------------------------------------------------------------------------------
def assert_close(got, expected, what: str, rel_tol: float = REL_TOL, abs_tol: float = 0.0,
                 formula: str | None = None) -> float:
    """``got`` must be a number within ``rel_tol`` (relative) or ``abs_tol`` of ``expected``; returns it as a float.

    Args:
        got: the student's answer, in any form ``as_real`` takes.
        expected: the value the test computed (float64).
        what: how the answer is named in messages ("gemm_mac(x, y)").
        rel_tol, abs_tol: the tolerance; the default is what a float32 computation meets.
        formula: how the expected value is defined, shown in the message.
    """
    value = as_real(got, what)
    expected = float(expected)
    ok = math.isclose(value, expected, rel_tol=rel_tol, abs_tol=abs_tol) or (
        math.isinf(expected) and value == expected)
    defined = f"{formula} = " if formula else ""
    tol = f"relative {rel_tol:g}" + (f", absolute {abs_tol:g}" if abs_tol else "")
    assert ok, f"{what} must be {defined}{expected!r} (to a {tol}), got {value!r}"
    return value


def assert_integer(got, expected: int, what: str, formula: str | None = None) -> int:
    """``got`` must be exactly the whole number ``expected`` (an int in any form ``as_integer`` takes)."""
    value = as_integer(got, what)
    defined = f"{formula} = " if formula else ""
    assert value == int(expected), f"{what} must be {defined}{int(expected):,}, got {value:,}"
    return value


def assert_label(got, expected: str, what: str, choices=None) -> str:
    """``got`` must be the label ``expected`` (spaces around it and case do not matter)."""
    value = as_label(got, what)
    options = f" (one of {sorted(choices)})" if choices else ""
    assert value == expected.strip().casefold(), f"{what} must be {expected!r}{options}, got {got!r}"
    return value


def assert_reals_by_key(got, expected_by_key: dict, what: str, rel_tol: float = REL_TOL,
                        formula: str | None = None) -> dict:
    """``got`` must be a dict with exactly the keys of ``expected_by_key``, each value ``assert_close`` to its own."""
    table = as_dict(got, what)
    assert set(table) == set(expected_by_key), (
        f"{what} must have exactly the keys {sorted(expected_by_key, key=str)}, got {sorted(table, key=str)}")
    return {key: assert_close(table[key], expected, f"{what}[{key!r}]", rel_tol=rel_tol, formula=formula)
            for key, expected in expected_by_key.items()}


def assert_tensor_close(got, expected: torch.Tensor, what: str, rtol: float | None = None, atol: float | None = None,
                        dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """``got`` must be a tensor of ``expected``'s shape whose values match it; returns it detached.

    Args:
        got: the student's tensor.
        expected: the reference, computed by the test (float64 on the CPU where precision matters).
        what: how the answer is named in messages.
        rtol, atol: the tolerance; by default ``TENSOR_TOL`` of ``got``'s dtype (float64 when it has another).
        dtype: when given, ``got`` must have exactly this dtype.
        device: when given, ``got`` must be on this device (``torch.device`` or a string such as ``"cpu"``).
    """
    tensor = as_tensor(got, what)
    assert tuple(tensor.shape) == tuple(expected.shape), (
        f"{what} must have shape {tuple(expected.shape)}, got {tuple(tensor.shape)}")
    if dtype is not None:
        assert tensor.dtype == dtype, f"{what} must have dtype {dtype}, got {tensor.dtype}"
    if device is not None:
        want = torch.device(device)  # "cuda" (no index) accepts any CUDA device; "cuda:1" that one
        assert tensor.device.type == want.type and want.index in (None, tensor.device.index), (
            f"{what} must be on {want}, got {tensor.device}")
    default_rtol, default_atol = TENSOR_TOL.get(tensor.dtype, TENSOR_TOL[torch.float64])
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if tensor.dtype == torch.bool or expected.dtype == torch.bool:
        mismatched = int((tensor.cpu() != expected.cpu()).sum())
        assert mismatched == 0, f"{what} differs from the expected boolean tensor in {mismatched} elements"
        return tensor
    got64, want64 = tensor.to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    same_nonfinite = torch.equal(torch.isnan(got64), torch.isnan(want64)) and torch.equal(
        got64[torch.isinf(want64)], want64[torch.isinf(want64)])
    finite = torch.isfinite(want64)
    excess = (got64[finite] - want64[finite]).abs() - (atol + rtol * want64[finite].abs())
    if not same_nonfinite or (excess.numel() and excess.max().item() > 0) or not torch.isfinite(got64[finite]).all():
        err = (got64[finite] - want64[finite]).abs()
        worst = err.max().item() if err.numel() else float("nan")
        raise AssertionError(f"{what} must match the reference to rtol {rtol:g}, atol {atol:g}; "
                             f"largest absolute error {worst!r}" + ("" if same_nonfinite else
                                                                    " (and its NaN or infinite entries differ)"))
    return tensor


def assert_calls(called, what: str, forbidden=(), required=()) -> None:
    """A record of the torch functions a call used (``record_torch_calls``' names) must avoid ``forbidden`` and
    include every name of ``required``."""
    names = {str(name) for name in called}
    if RECORDING_OFF in names:
        raise RecordingDisabled(f"{what}: the recording of torch calls was switched off while it ran (tampering)")
    used = sorted(names & set(forbidden))
    assert not used, f"{what} must not call {used}"
    missing = sorted(set(required) - names)
    assert not missing, f"{what} must call {missing}; it called {sorted(names)}"


# -- a mistake is charged once: answers built on the student's earlier answers ----------------------------------
def carried(compute, *args):
    """``compute(*args)``: a value built from the student's own earlier answers, or None when that fails (an earlier
    function raised, or gave no usable value); then only the test's own value is accepted (docs/AUTHORING.md)."""
    try:
        return compute(*args)
    except Exception:  # noqa: BLE001 - an earlier answer that fails is charged in its own question, not here
        return None


def keep_carried(key: str, compute, *args) -> None:
    """Store ``compute(*args)`` (or None when it raises) under ``key`` for a later question's test.

    The test of the question whose answer a later one builds on calls this while it grades that answer, so the
    later test uses the answer as it was graded (``kept_carried``), not the student's function as it is by then
    (redefined in a later cell, say). Call it outside any ``check`` block, before ``finish_checks``.
    """
    _kept[key] = carried(compute, *args)


def kept_carried(key: str):
    """What ``keep_carried`` stored under ``key`` for this submission, or None (that test did not run, or failed to
    compute it): then only the test's own expected value is accepted."""
    return _kept.get(key)


def _shown(value) -> str:
    return repr(value) if isinstance(value, (int, float, str)) else "the value"


def assert_or_carried(compare, expected, *carried_values, carried_from: str = "your earlier answers"):
    """``compare(expected)``, or else ``compare(c)`` for one of ``carried_values`` (None entries skipped).

    ``compare`` is a one-argument comparison of the answer against an expected value that raises ``AssertionError``
    on a mismatch (``lambda want: assert_integer(got, want, what)``); a carried value is the same computation made
    with the student's own earlier answers (``carried``), so a mistake there is not charged here again.

    Returns:
        What ``compare`` returns for the first value that matches.

    Raises:
        AssertionError: no value matches; the message is the comparison with ``expected``, then the carried values.
    """
    try:
        return compare(expected)
    except LyingAnswer:
        raise  # tampering is never a mismatch that a carried value could excuse
    except AssertionError as mismatch:
        options = [value for value in carried_values if value is not None]
        for value in options:
            try:
                return compare(value)
            except LyingAnswer:
                raise
            except AssertionError:
                continue
        if not options:
            raise
        shown = " or ".join(dict.fromkeys(_shown(value) for value in options))
        raise AssertionError(f"{mismatch} (nor {shown} computed the same way from {carried_from})") from None


# -- probes that run beside the student's code (pass them to ``kernel_side``) -----------------------------------
def kernel_side(fn):
    """Mark a function of a test that must run in the notebook's kernel, next to the student's code.

    Graded tests run in the grader's own process (docs/AUTHORING.md, "the grading boundary"); a probe that has to
    run beside the student's code (a timing, which torch functions a call used, a callback the student's code
    calls) is written as a ``kernel_side`` function. When grading, its source is sent to the kernel, it runs there
    and its return value comes back as plain data (numbers, strings, containers, tensors): it must use only its
    arguments and the notebook's names, never variables of the function around it. In a plain notebook (the
    student's, the instructor's) it is an ordinary function.

    Returns:
        ``fn`` itself (the grader replaces this decorator with its own).
    """
    return fn


def _in_kernel(fn):
    """``fn`` run beside the student's code: through the grader's ``kernel_side`` while grading, else itself."""
    return _grader_kernel_side(fn) if _grader_kernel_side is not None else fn


RECORDING_OFF = "<the recording of torch calls was switched off>"
"""The name ``record_torch_calls`` adds when its probe calls went unrecorded; ``assert_calls`` then raises
``RecordingDisabled``."""


@contextlib.contextmanager
def record_torch_calls():
    """Record the name of every torch function and Tensor method called inside the ``with`` block.

    It sees calls however they are spelled (``@``, ``torch.matmul``, ``getattr(torch, "mat" + "mul")``, an
    imported alias, ``F.gelu``), because it hooks PyTorch's own dispatch (``TorchFunctionMode``). Tests use it
    inside ``kernel_side`` probes to check that a function was written from the operations a question allows.

    It checks itself: a probe call made right after it starts and one made right before it ends must both be
    recorded. When one is not (code patched ``TorchFunctionMode`` or popped the mode while the block ran),
    ``called`` gets ``RECORDING_OFF``, which ``assert_calls`` treats as tampering (the cell scores zero).

    Returns:
        A context manager; ``with record_torch_calls() as called:`` binds ``called``, a ``set[str]`` filled
        with ``func.__name__`` of each call (e.g. ``"matmul"``, ``"__matmul__"``, ``"gelu"``).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    canary = torch.rad2deg  # a probe call, made right after entering and right before leaving the block

    class _Recorder(TorchFunctionMode):
        def __init__(self, names):
            super().__init__()
            self.names = names
            self.canaries = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is canary and args and args[0] is probe:  # the student's own rad2deg calls are recorded
                self.canaries += 1
            else:
                self.names.add(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    names: set = set()
    recorder, probe = _Recorder(names), torch.zeros(())
    recorder.__enter__()
    try:
        canary(probe)
        yield names
    finally:
        canary(probe)
        if recorder.canaries != 2:  # the mode was not entered, or was popped while the block ran
            names.add(RECORDING_OFF)
        try:
            recorder.__exit__(None, None, None)
        except RuntimeError:  # the mode stack was emptied under the recorder: reported above, not a crash of the test
            if RECORDING_OFF not in names:
                raise


def assert_on_input_device(fn, args, device, what: str, outputs: int = 1) -> None:
    """The device rule, checked the same way on every grader: ``fn(*args)`` must return its tensor(s) on ``device``
    (its input's), also when it creates them itself.

    Value checks call functions with CPU tensors on every grader; this check uses inputs on ``device`` (the GPU on a
    GPU grader) and has two parts, both run on every grader:

    - ``fn(*args)`` is called as usual: each of its ``outputs`` tensors (one tensor, or a tuple of ``outputs``) must
      be on ``device``; a function that raises on such inputs fails here, and only here;
    - ``fn(*args)`` is called again beside the student's code with PyTorch's default device set to ``meta``
      (``output_devices_with_meta_default``): a tensor created without naming the input's device lands on ``meta``,
      so a CPU grader sees the mistake a GPU grader sees. When that call needs data from a tensor it created on the
      default device the probe cannot tell (None), and the first part decides.

    Args:
        fn: the student's function. args: its arguments (tensors on ``device``). device: a ``torch.device`` or str.
        what: the call as a message names it, e.g. ``"gemm(A, B)"``. outputs: how many tensors ``fn`` returns.
    """
    out = fn(*args)
    if outputs == 1:
        tensors = [as_tensor(out, what)]
    else:
        items = as_tuple(out, outputs, what)
        tensors = [as_tensor(item, f"{what}[{i}]") for i, item in enumerate(items)]
    want = torch.device(device)
    found = [tensor.device for tensor in tensors]
    advice = "create every tensor on the input's device (device=x.device, torch.zeros_like(x), ...)"
    assert all(d.type == want.type and want.index in (None, d.index) for d in found), (
        f"{what} must return its result on its input's device ({want}), got {[str(d) for d in found]}: {advice}")
    devices = _in_kernel(output_devices_with_meta_default)(fn, *args)
    if devices is None:
        return
    assert len(devices) == outputs and all(torch.device(d) == found[0] for d in devices), (
        f"{what} must return its result on its input's device ({want}), also when it creates tensors itself: with "
        f"PyTorch's default device set to 'meta' (as a GPU grader sees it) its result was on {devices}: {advice}")


def output_devices_with_meta_default(fn, *args, **kwargs) -> list:
    """Call ``fn(*args, **kwargs)`` with PyTorch's default device set to ``meta``; the devices of its tensor outputs.

    A function that must return its result on its input's device and creates it without naming that device
    (``torch.tensor(values)``, ``torch.zeros(n)``) puts it on ``meta`` here: a CPU grader sees the mistake a GPU
    grader would. Use it from a test as ``kernel_side(output_devices_with_meta_default)(student_fn, x)``.

    Code that creates a tensor on the default device and then moves it (``torch.tensor(values).to(x.device)``)
    cannot run with a ``meta`` default (nothing can be copied out of ``meta``): the probe then cannot tell and
    returns None, and the test's ordinary device check decides.

    Returns:
        list[str] | None: ``str(device)`` of every tensor in the result (a tensor, or a tuple/list/dict of them), in
        order; None when the call needed data from a tensor it created on the default device.
    """
    import torch

    try:
        with torch.device("meta"):
            out = fn(*args, **kwargs)
    except (RuntimeError, NotImplementedError) as exc:
        if "meta" in str(exc):
            return None
        raise
    items = list(out.values()) if isinstance(out, dict) else list(out) if isinstance(out, (list, tuple)) else [out]
    return [str(item.device) for item in items if isinstance(item, torch.Tensor)]
