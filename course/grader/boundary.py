"""The grader half of the grading boundary (docs/SECURITY.md, "the grading boundary"): test cells run here, in the
nbgrader process, never in the untrusted kernel.

``GraderSide`` runs each test cell in the grader's own namespace (the locked cells' imports from the instructor's
``source/<lab>/`` files, and the ``test-helpers`` cells). Other globals come from the kernel: plain data through the
strict ``decode``, anything else as a ``Remote`` handle; ``kernel_side`` functions run in the kernel.
"""
from __future__ import annotations

import ast
import base64
import builtins
import contextlib
import dis
import importlib
import inspect
import io
import json
import linecache
import math
import pickle
import sys
import textwrap
from pathlib import Path

from ..common.paths import KERNEL_DIR

KERNEL_SOURCE = KERNEL_DIR / "boundary_kernel.py"
INSTRUCTOR_MODULES = ("utils", "_utils_private", "checks")  # the lab's own modules (source/<lab>/): the grader imports its copies
HELPERS_TAG = "test-helpers"  # a locked cell with this tag also runs in the grader (helpers hidden tests call)
REF_TAG = "__efficient_ai_ref__"
COMM_TARGET = "efficient_ai_boundary"  # the Jupyter comm target of the kernel's server (boundary_kernel.py)
MAX_ANSWER_BYTES = 4 * 1024 * 1024  # raw bytes of tensors and strings in one answer (ZeroMQ caps a message at 8 MiB)
# Dunder names a Remote forwards to the kernel; others (``__array__``...) are probed by libraries: missing here.
FORWARDED_DUNDERS = {"__name__", "__qualname__", "__doc__", "__module__", "__wrapped__", "__defaults__",
                     "__kwdefaults__", "__annotations__"}
# Run in the kernel on a test cell's handles when a check failed: a strict subclass of a type the test contract
# accepts (checks.py) could lie in a comparison, so the cell scores zero (checks.LyingAnswer).
LYING_TYPES_PROBE = '''def _efficient_ai_lying_types(*values):
    import collections
    import sys

    accepted, exact, honest = [int, float, str, dict], [collections.OrderedDict, collections.defaultdict], [bool]
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None:
        accepted.append(torch.Tensor)
        exact.append(torch.nn.Parameter)
    if numpy is not None:
        honest.append(numpy.generic)
    found = []
    for value in values:
        kind = type(value)
        if issubclass(kind, tuple(accepted)) and kind not in accepted + exact and not issubclass(kind, tuple(honest)):
            found.append(f"{kind.__module__}.{kind.__qualname__}")
    return sorted(set(found))
'''


class BoundaryError(Exception):
    """The kernel did not answer a grader's request with valid data (no answer, a malformed one, a dead kernel)."""


class StudentError(Exception):
    """Student code raised an exception whose type is not a built-in one; ``str()`` names its type."""


class KernelLost(BoundaryError):
    """The kernel died or stopped answering while a test cell was running."""


# -- answers: strict decoding of the kernel's data ----------------------------------------------------------
def _torch_dtype(name):
    import torch

    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise BoundaryError(f"unknown tensor dtype {name!r}")
    return dtype


def _data(doc: dict, shape: list[int], dtype, itemsize: int) -> bytes:
    """The base64 ``data`` of a tensor or array, checked to be exactly what ``shape`` and ``dtype`` hold."""
    raw = base64.b64decode(doc["data"], validate=True)
    if len(raw) != math.prod(shape) * itemsize:
        raise BoundaryError(f"data of shape {shape} and dtype {dtype} cannot hold {len(raw)} bytes")
    return raw


def _decode_tensor(doc: dict):
    import torch

    dtype = _torch_dtype(doc["dtype"])
    shape = [int(n) for n in doc["shape"]]
    raw = _data(doc, shape, dtype, torch.empty((), dtype=dtype).element_size())
    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape).clone() if raw \
        else torch.empty(shape, dtype=dtype)
    device = str(doc.get("device", "cpu"))
    if device.startswith("cuda") and torch.cuda.is_available():
        tensor = tensor.to(device)
    return tensor


def _decode_numpy(doc: dict, scalar: bool):
    import numpy as np

    dtype = np.dtype(str(doc["dtype"]))
    if dtype.kind not in "biufc":
        raise BoundaryError(f"unsupported array dtype {dtype}")
    shape = [] if scalar else [int(n) for n in doc["shape"]]
    array = np.frombuffer(_data(doc, shape, dtype, dtype.itemsize), dtype=dtype).reshape(shape)
    return array[()] if scalar else array.copy()


def decode(doc, link: "KernelLink"):
    """Build the grader's own value from one JSON value of an answer; only plain types, never code."""
    if doc is None or type(doc) in (bool, int, float, str):
        return doc
    if type(doc) is not dict or "$" not in doc:
        raise BoundaryError(f"malformed answer element of type {type(doc).__name__}")
    tag = doc["$"]
    containers = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in containers:
        return containers[tag]([decode(item, link) for item in doc["items"]])
    if tag == "dict":
        return {decode(key, link): decode(value, link) for key, value in doc["items"]}
    if tag == "float":
        if doc["repr"] not in ("inf", "-inf", "nan"):
            raise BoundaryError(f"malformed float {doc['repr']!r}")
        return float(doc["repr"])
    if tag == "tensor":
        return _decode_tensor(doc)
    if tag == "npstr":
        if type(doc.get("text")) is not str:
            raise BoundaryError("malformed numpy string")
        import numpy

        return numpy.str_(doc["text"])
    if tag in ("ndarray", "npscalar"):
        return _decode_numpy(doc, scalar=tag == "npscalar")
    if tag == "dtype":
        return _torch_dtype(doc["name"])
    if tag in ("device", "size"):
        import torch

        return torch.device(str(doc["name"])) if tag == "device" else torch.Size(int(n) for n in doc["items"])
    if tag == "handle":
        name = doc.get("name")
        if name is not None and type(name) is not str:
            raise BoundaryError("malformed handle name")
        remote = Remote(link, int(doc["id"]), str(doc["kind"]), str(doc["type"]), name)
        if remote._kind == "object":
            link.objects.append(remote)  # the test cell may ask whether it is a lying subclass (LYING_TYPES_PROBE)
        return remote
    raise BoundaryError(f"unknown answer tag {tag!r}")


def _student_error(kind: str, message: str, trace: str) -> Exception:
    """The grader's copy of an exception raised by student code: the built-in type itself where it is one."""
    text = message + (f"\n\nwhere it was raised (your code):\n{trace}" if trace else "")
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, OSError):
        with contextlib.suppress(Exception):  # a constructor that wants other arguments
            return cls(text)
    return StudentError(f"{kind}: {text}")


# -- requests ---------------------------------------------------------------------------------------------------
def _mark_refs(value):
    kind = type(value)
    if kind is Remote:
        return (REF_TAG, value._id)
    if kind in (list, tuple):
        return kind(_mark_refs(item) for item in value)
    if kind is dict:
        return {key: _mark_refs(item) for key, item in value.items()}
    return value


class KernelLink:
    """Requests to the kernel's boundary server; ``ask`` sends one and returns the answer text (or None)."""

    def __init__(self, ask):
        self._ask = ask
        self.objects: list[Remote] = []  # handles of plain objects (not callables or classes) decoded since reset

    def request(self, *request):
        try:
            payload = base64.b64encode(pickle.dumps(_mark_refs(request), protocol=4)).decode()
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise TypeError(
                "a hidden test can pass student code only data (numbers, strings, containers, tensors, picklable "
                "objects) or the student's own objects; run code that must call back into the test in a "
                f"kernel_side function ({exc})") from None
        text = self._ask(payload)
        if text is None:
            raise KernelLost("the kernel did not answer the grader's request")
        try:
            answer = json.loads(text)
        except (TypeError, ValueError):
            raise BoundaryError("the kernel's answer is not valid JSON") from None
        if type(answer) is not dict:
            raise BoundaryError("the kernel's answer is not a JSON object")
        if "error" in answer:
            error = answer["error"]
            if type(error) is not list or len(error) != 3 or not all(type(e) is str for e in error):
                raise BoundaryError("the kernel's error answer is malformed")
            raise _student_error(*error)
        if "ok" not in answer:
            raise BoundaryError("the kernel's answer holds no value")
        return decode(answer["ok"], self)

    def export(self, names: list[str]) -> dict:
        found = self.request("export", sorted(names))
        if type(found) is not dict:
            raise BoundaryError("the kernel's export answer is not a dict")
        return {name: value for name, value in found.items() if name in names}

    def kernel_side(self, fn):
        """The grader's ``kernel_side`` decorator: ``fn`` runs in the kernel; its result comes back as data."""
        if fn.__code__.co_freevars:
            raise TypeError(
                f"kernel_side function {fn.__name__} uses variables of the function around it "
                f"({', '.join(fn.__code__.co_freevars)}): it runs in the kernel, so pass them as arguments")
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        if not isinstance(tree.body[0], ast.FunctionDef):
            raise TypeError("kernel_side decorates a plain function (def), not a lambda or a class")
        tree.body[0].decorator_list = []
        source = ast.unparse(tree)

        def run_in_kernel(*args, **kwargs):
            return self.request("define", source, fn.__name__, args, kwargs)

        run_in_kernel.__name__ = fn.__name__
        run_in_kernel.__wrapped__ = fn
        return run_in_kernel


class Remote:
    """A student's object that stays in the kernel: calling it, reading its attributes or items asks the kernel."""

    __slots__ = ("_link", "_id", "_kind", "_type", "_name")

    def __init__(self, link: KernelLink, handle: int, kind: str, type_name: str, name: str | None = None):
        for slot, value in zip(self.__slots__, (link, handle, kind, type_name, name)):
            object.__setattr__(self, slot, value)

    def __call__(self, *args, **kwargs):
        return self._link.request("call", ("handle", self._id), args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__") and name not in FORWARDED_DUNDERS:
            raise AttributeError(name)
        if name == "__name__" and self._name is not None:
            return self._name
        link = object.__getattribute__(self, "_link")  # not self._link: a half-built handle must not recurse here
        return link.request("getattr", self._id, name)

    def __setattr__(self, name, value):
        raise TypeError("a hidden test cannot set attributes of a student's object from the grader")

    def __getitem__(self, key):
        return self._link.request("getitem", self._id, key)

    def __repr__(self) -> str:
        return f"<student {self._kind} of type {self._type}>"


# -- the grader's namespace ---------------------------------------------------------------------------------------
def global_reads(code) -> set[str]:
    """Global names a compiled cell reads (module level and inside its functions), minus those it binds itself."""
    reads, binds, todo = set(), set(), [code]
    while todo:
        obj = todo.pop()
        todo += [const for const in obj.co_consts if inspect.iscode(const)]
        for ins in dis.get_instructions(obj):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"):
                reads.add(ins.argval)
            elif ins.opname in ("STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL") and obj is code:
                binds.add(ins.argval)
    return reads - binds


@contextlib.contextmanager
def _instructor_imports(folder: Path | None):
    """``sys.path`` with the instructor's files first and never the current folder (a submission's files sit there)."""
    saved = list(sys.path)
    sys.path[:] = ([str(folder)] if folder else []) + [p for p in saved if p not in ("", ".") and Path(p).is_absolute()
                                                       and Path(p).resolve() != Path.cwd().resolve()]
    try:
        yield
    finally:
        sys.path[:] = saved


class GraderSide:
    """One notebook's grader-side namespace and the test cells run in it."""

    def __init__(self, instructor_folder: Path | None, link: KernelLink, needed: set[str] | None = None):
        self.folder = instructor_folder
        self.link = link
        self.kernel_side = link.kernel_side
        self.base: dict = {"__builtins__": builtins, "__name__": "__grader__", "kernel_side": self.kernel_side}
        self._pending: list[tuple[str, list[str]]] = []  # locked cells not yet taken into the grader
        self.needed = needed  # names the notebook's test cells read (None: all): other imports are not made here
        self._cells = 0
        self.kept: dict = {}  # checks.keep_carried's store: this submission's answers as graded, for later questions
        self.last_failures: list[str] = []  # the failed checks of the last test cell (checks.Scorecard.failures)

    def run_locked_cell(self, source: str, tags) -> None:
        """Take a locked cell's imports (the whole cell if tagged ``test-helpers``) into the grader before the next
        test cell (``take_pending``), so they overlap with the kernel's work in between."""
        self._pending.append((source, list(tags or ())))

    def take_pending(self) -> None:
        """Take the locked cells run so far into the grader now."""
        pending, self._pending = self._pending, []
        for source, tags in pending:
            self._take_locked_cell(source, tags)
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)  # as in the grading kernels (kernel_channel)

    def _take_locked_cell(self, source: str, tags: list[str]) -> None:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return
        self._cells += 1
        filename = f"<test-helpers cell {self._cells}>"
        if HELPERS_TAG in tags:
            nodes = tree.body
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # kernel_side source
        else:
            nodes = [node for node in tree.body if _import_wanted(node, self.needed)]
        for name in INSTRUCTOR_MODULES:
            if name in sys.modules and self.folder and not _from_folder(sys.modules[name], self.folder):
                del sys.modules[name]  # another course's copy: this lab's tests use its own instructor files
        with _instructor_imports(self.folder):
            for node in nodes:
                with contextlib.suppress(Exception):  # an import the grader cannot make leaves its names remote
                    if self.needed is not None and _is_star_import(node):
                        self._take_star_import(node.module)
                    else:
                        exec(compile(ast.Module(body=[node], type_ignores=[]), filename, "exec"), self.base)
                self.base["kernel_side"] = self.kernel_side  # `from checks import *` brings the local one

    def _take_star_import(self, name: str) -> None:
        """``from <name> import *`` restricted to the names the tests read: lazy attributes no test uses are not built."""
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        if exported is None:
            exported = [key for key in vars(module) if not key.startswith("_")]
        for key in self.needed.intersection(exported):
            self.base[key] = getattr(module, key)

    def run_test_cell(self, source: str, label: str) -> tuple[str, tuple[str, str] | None, float]:
        """Run one test cell here: what it printed, its error (type name, message) or None, and the weighted share
        of its ``checks.check`` blocks that passed (1.0 for a cell without any; 0.0 after an error)."""
        filename = f"<test cell {label}>"
        try:
            code = compile(source, filename, "exec")
        except SyntaxError as exc:
            return "", ("SyntaxError", f"the test cell does not compile: {exc}"), 0.0
        self.take_pending()
        contract = self._contract()
        started = None
        if contract is not None:
            started = contract.begin_cell(graded=True, passthrough=(BoundaryError,), kernel_side=self.kernel_side,
                                          kept=self.kept)
        namespace = dict(self.base)
        printed = io.StringIO()
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        self.link.objects = []
        try:
            wanted = sorted(name for name in global_reads(code) if name not in namespace and not hasattr(builtins, name))
            if wanted:
                namespace.update(self.link.export(wanted))
            with contextlib.redirect_stdout(printed), _instructor_imports(self.folder):
                exec(code, namespace)
            lying = self._lying_types(started)
        except KernelLost:
            raise
        except BoundaryError as exc:
            return printed.getvalue(), ("GradingBoundaryError", f"the kernel's answer could not be read: {exc}"), 0.0
        except Exception as exc:  # noqa: BLE001 - a failed test, in any form, is that cell's failure
            return printed.getvalue(), (type(exc).__name__, str(exc)), 0.0
        finally:
            card = contract.end_cell() if contract is not None else None
            linecache.cache.pop(filename, None)
            with contextlib.suppress(BoundaryError):
                self.link.request("release")  # the kernel forgets this cell's handles
        self.last_failures = card.failures() if card is not None else []
        failures = "\n".join(self.last_failures)
        if lying:
            return printed.getvalue(), ("LyingAnswer", (
                f"an answer of type {', '.join(lying)} is a subclass of a type the test contract accepts (it could "
                "lie in a comparison): tampering, so this cell scores zero\n" + failures).strip()), 0.0
        if card is None or card.share == 1.0:
            return printed.getvalue(), None, 1.0
        if card.share == 0.0:
            return printed.getvalue(), ("AssertionError", f"every check of this cell failed:\n{failures}"), 0.0
        return printed.getvalue() + failures + "\n", None, card.share

    def _lying_types(self, card) -> list[str]:
        """The lying answer types among this cell's handles (``LYING_TYPES_PROBE``), asked only when a check failed."""
        if card is None or card.share == 1.0 or card.lying or not self.link.objects:
            return []
        found = self.link.request("define", LYING_TYPES_PROBE, "_efficient_ai_lying_types", tuple(self.link.objects), {})
        return [str(name) for name in found] if type(found) is list else []

    def _contract(self):
        """The instructor's ``checks`` module when this lab's tests use it (imported by a locked cell), else None."""
        module = sys.modules.get("checks")  # _from_folder(None, ...) is False
        ours = self.folder is not None and _from_folder(module, self.folder) and hasattr(module, "begin_cell")
        return module if ours else None


def names_tests_read(nb) -> set[str]:
    """Global names the autograded test cells of ``nb`` read, and the ``test-helpers`` cells (the grader runs both)."""
    from ..common.notebooks import is_autograded_test

    needed: set[str] = set()
    for cell in nb.cells:
        if is_autograded_test(cell) or cell.cell_type == "code" and HELPERS_TAG in (cell.metadata.get("tags") or ()):
            try:
                needed |= global_reads(compile(cell.source, "<test>", "exec"))
            except SyntaxError:
                continue
    return needed


# Libraries the kernel-side guard imports and watches (course/kernel/guard_kernel.py) when the lab itself uses them.
GUARD_LIBRARIES = frozenset({"numpy", "torch", "utils"})


def imported_modules(nb, keep=None) -> set[str]:
    """Modules the code cells of ``nb`` that ``keep`` accepts import (``from torch.nn import functional``: ``torch.nn``;
    relative imports are left out)."""
    found: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code" or keep is not None and not keep(cell):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
    return found


def _instructor_notebooks(folder: Path | None) -> list:
    """The instructor's notebooks in ``folder`` (``source/<lab>/``); raises when one cannot be read."""
    import nbformat

    paths = sorted(folder.glob("*.ipynb")) if folder and folder.is_dir() else []
    return [nbformat.read(path, as_version=4) for path in paths]


def lab_uses_guard_libraries(folder: Path | None) -> bool:
    """Whether the instructor's notebooks in ``folder`` import one of ``GUARD_LIBRARIES`` (True if unreadable)."""
    try:
        notebooks = _instructor_notebooks(folder)
        return not notebooks or any({name.split(".")[0] for name in imported_modules(nb)} & GUARD_LIBRARIES
                                    for nb in notebooks)
    except Exception:  # noqa: BLE001 - unreadable instructor files: watch everything
        return True


def locked_cell_imports(folder: Path | None) -> list[str]:
    """The modules the kernel's locked cells (not tests) import in the instructor's notebooks in ``folder``, sorted
    ([] if unreadable): a kernel waiting for its turn imports them ahead."""
    from .nbgrader_ext import is_setup_cell

    try:
        return sorted(set().union(*(imported_modules(nb, keep=is_setup_cell) for nb in _instructor_notebooks(folder))))
    except Exception:  # noqa: BLE001 - unreadable instructor files: nothing imported ahead
        return []


def _is_star_import(node) -> bool:
    return isinstance(node, ast.ImportFrom) and bool(node.module) and not node.level and any(
        alias.name == "*" for alias in node.names)


def _import_wanted(node, needed: set[str] | None) -> bool:
    """Whether the grader makes this statement of a locked cell: an import of a name some test reads, or a ``*``."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return False
    if needed is None:
        return True
    names = {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return "*" in names or bool(names & needed)


def _from_folder(module, folder: Path) -> bool:
    path = getattr(module, "__file__", None)
    return bool(path) and Path(path).resolve().parent == folder.resolve()
