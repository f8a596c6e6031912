"""The kernel half of the grading boundary (docs/SECURITY.md, "the grading boundary"), installed in each grading
kernel before any student code. Self-contained: the ``course`` package does not exist in the kernel.

Requests (``_Server.serve``) are base64 pickles from the trusted grader, so unpickling them is safe; their arguments
hold ``(REF_TAG, id)`` where the grader passes a handle back. Answers are JSON, decoded strictly by the grader:
``{"ok": value}`` or ``{"error": [type name, message, student traceback]}``; a value is JSON's null, bool, number or
string, or a tagged ``{"$": tag, ...}`` document (``_Server.encode``), a ``handle`` for anything but plain data.
"""
import base64
import contextlib
import json
import math
import pickle
import sys
import traceback

REF_TAG = "__efficient_ai_ref__"


class _TooLarge(Exception):
    pass


def _spend(budget, raw):
    """``raw``, once its size is taken from ``budget``; raises ``_TooLarge`` when that leaves less than nothing."""
    budget[0] -= len(raw)
    if budget[0] < 0:
        raise _TooLarge()
    return raw


class _Server:
    """Answers the grader's requests over the notebook's namespace ``shell.user_ns``; an answer whose array data
    (after its strings) exceeds ``max_bytes`` is refused (``ResultTooLarge``)."""

    def __init__(self, max_bytes, shell):
        self.max_bytes = max_bytes
        self.shell = shell
        self.handles = {}

    def new_handle(self, value):
        handle = len(self.handles) + 1
        self.handles[handle] = value
        kind = "class" if isinstance(value, type) else "callable" if callable(value) else "object"
        doc = {"$": "handle", "id": handle, "kind": kind, "type": f"{type(value).__module__}.{type(value).__qualname__}"}
        with contextlib.suppress(Exception):  # a student's __getattr__ may raise anything: the grader asks later
            if kind != "object" and type(name := value.__name__) is str and len(name) <= 200:
                doc["name"] = name  # tests name the function in messages: one round trip fewer per check
        return doc

    def encode(self, value, budget):
        """``value`` as JSON-ready data; ``budget`` (a one-item list) is what is left of ``max_bytes``."""
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is int:
            if kind is str:
                budget[0] -= len(value)
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$": "float", "repr": repr(value)}
        if kind in (list, tuple, set, frozenset):
            items = sorted(value, key=repr) if kind in (set, frozenset) else value
            return {"$": kind.__name__, "items": [self.encode(item, budget) for item in items]}
        if kind is dict or kind.__module__ == "collections" and kind.__name__ in ("OrderedDict", "defaultdict"):
            return {"$": "dict", "items": [[self.encode(k, budget), self.encode(v, budget)] for k, v in value.items()]}
        torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None:
            if kind is torch.Tensor or kind is torch.nn.Parameter:  # a Parameter is a correct tensor answer
                data = value.detach()
                if data.is_sparse or data.layout != torch.strided or data.is_quantized:
                    return self.new_handle(value)
                flat = data.to("cpu").contiguous().reshape(-1)
                raw = _spend(budget, flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
                return {"$": "tensor", "dtype": str(data.dtype).replace("torch.", ""), "shape": list(data.shape),
                        "device": str(data.device), "data": base64.b64encode(raw).decode()}
            if kind is torch.dtype:
                return {"$": "dtype", "name": str(value).replace("torch.", "")}
            if kind is torch.device:
                return {"$": "device", "name": str(value)}
            if kind is torch.Size:
                return {"$": "size", "items": [int(n) for n in value]}
        if numpy is not None:
            if kind is numpy.ndarray and value.dtype.kind in "biufc":
                raw = _spend(budget, numpy.ascontiguousarray(value).tobytes())
                return {"$": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                        "data": base64.b64encode(raw).decode()}
            if kind is numpy.str_:  # a correct label answer (numpy's string scalar)
                budget[0] -= len(value)
                return {"$": "npstr", "text": str(value)}
            if isinstance(value, numpy.generic) and kind.__module__ == "numpy" and value.dtype.kind in "biufc":
                return {"$": "npscalar", "dtype": value.dtype.str, "data": base64.b64encode(value.tobytes()).decode()}
        return self.new_handle(value)

    def resolve(self, value):
        """Request arguments with the grader's handle markers replaced by the objects they stand for."""
        kind = type(value)
        if kind is tuple and len(value) == 2 and value[0] == REF_TAG:
            return self.handles[value[1]]
        if kind in (list, tuple):
            return kind(self.resolve(item) for item in value)
        if kind is dict:
            return {key: self.resolve(item) for key, item in value.items()}
        return value

    def answer(self, value):
        try:
            return json.dumps({"ok": self.encode(value, [self.max_bytes])})
        except _TooLarge:
            return json.dumps({"error": ["ResultTooLarge", f"the result is larger than the {self.max_bytes} bytes "
                                         "the grader reads back; return a smaller value", ""]})

    def serve(self, request):
        """The answer (JSON text) to one request; student code runs in this frame's callees."""
        try:
            op, *rest = pickle.loads(base64.b64decode(request))
            if op == "release":
                self.handles.clear()
                return self.answer(None)
            if op == "export":  # each name on its own: a value too large to send stays here as a handle
                found = []
                for name in rest[0]:
                    if name in self.shell.user_ns:
                        value = self.shell.user_ns[name]
                        try:
                            found.append([name, self.encode(value, [self.max_bytes])])
                        except _TooLarge:
                            found.append([name, self.new_handle(value)])
                return json.dumps({"ok": {"$": "dict", "items": found}})
            if op == "call":
                (_, handle), args, kwargs = rest
                return self.answer(self.handles[handle](*self.resolve(args), **self.resolve(kwargs)))
            if op == "getattr":
                return self.answer(getattr(self.handles[rest[0]], rest[1]))
            if op == "getitem":
                return self.answer(self.handles[rest[0]][self.resolve(rest[1])])
            if op == "define":
                source, name, args, kwargs = rest
                namespace = dict(self.shell.user_ns)
                exec(compile(source, f"<kernel_side {name}>", "exec"), namespace)
                return self.answer(namespace[name](*self.resolve(args), **self.resolve(kwargs)))
            return json.dumps({"error": ["ValueError", f"unknown request {op!r}", ""]})
        except BaseException as exc:  # noqa: BLE001 - every failure of student code becomes data for the grader
            frames = traceback.extract_tb(exc.__traceback__)[1:]  # drop this server's own frame
            text = "".join(traceback.format_list(frames)) if frames else ""
            return json.dumps({"error": [type(exc).__name__, str(exc)[:20000], text[-20000:]]})


def _efficient_ai_boundary_install(max_bytes, comm_target=None):
    """The server's ``serve(request) -> answer`` function; with ``comm_target``, also registered as the handler of
    that comm target in the running kernel (each message's ``data["request"]`` answered as ``data["answer"]``)."""
    shell = get_ipython()  # noqa: F821 - the server runs inside IPython
    serve = _Server(max_bytes, shell).serve

    def open_channel(comm, _open_msg):
        def on_request(msg):
            data = msg["content"].get("data")
            comm.send({"answer": serve(data.get("request") if type(data) is dict else None)})

        comm.on_msg(on_request)

    if comm_target:
        shell.kernel.comm_manager.register_target(comm_target, open_channel)
    return serve
