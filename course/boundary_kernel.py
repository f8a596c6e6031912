"""The kernel half of the grading boundary: its source is sent to each grading kernel before any student code.

``course.boundary`` (the grader half, in the nbgrader process) runs every hidden test itself. When a test calls a
student's function, reads a student's variable or runs a ``kernel_side`` probe, the grader sends one request to
this server as a Jupyter comm message (target ``efficient_ai_boundary``; a comm message skips IPython's cell
machinery, so it costs about half an ``execute_request``), and reads back one string, sent on the same comm: a JSON
document that holds only plain data. The grader decodes that document with its own strict decoder; nothing this
server returns is trusted beyond being data, so student code replacing this server only changes the data its own
answers produce.

Requests (a pickled tuple, base64 encoded; they come from the trusted grader, so unpickling them is safe here):
    ``("export", names)``          each name's value in the notebook's namespace, by value or as a handle;
    ``("call", target, args, kwargs)``  call a target (a name, a handle, or ``utils.<name>``);
    ``("getattr", handle, name)``  ``getattr(handles[handle], name)``;
    ``("getitem", handle, key)``   ``handles[handle][key]``;
    ``("define", source, name, args, kwargs)``  define a ``kernel_side`` function from ``source`` in a copy of the
        notebook's namespace and call it;
    ``("release",)``               forget every handle (after each test cell).
Arguments hold ``("__efficient_ai_ref__", id)`` markers where the grader passed a handle back.

Answers: ``{"ok": <value>}`` or ``{"error": [exception type name, message, student traceback text]}``, where a value
is ``null``/``true``/a number/a string, or a tagged object ``{"$": tag, ...}`` (``list``, ``tuple``, ``dict`` as
key-value pairs, ``set``, ``float`` for inf/nan, ``tensor``/``ndarray`` as dtype, shape, device and base64 bytes,
``npscalar``, ``dtype``, ``device``, ``size``, ``handle`` for anything else, which stays in the kernel; a callable's
handle carries its ``__name__``).
This file must stay self-contained: it runs in the student's kernel, where the ``course`` package does not exist.
"""


def _efficient_ai_boundary_install(max_bytes, comm_target=None):  # noqa: C901 - one closure keeps state private
    """The server's ``serve(request) -> answer`` function; with ``comm_target``, also registered as the handler of
    that comm target in the running kernel (each message's ``data["request"]`` answered as ``data["answer"]``)."""
    import base64
    import json
    import math
    import pickle
    import sys
    import traceback

    shell = get_ipython()  # noqa: F821 - the server runs inside IPython
    handles = {}
    ref_tag = "__efficient_ai_ref__"

    class TooLarge(Exception):
        pass

    def new_handle(value):
        handle = len(handles) + 1
        handles[handle] = value
        kind = "class" if isinstance(value, type) else "callable" if callable(value) else "object"
        doc = {"$": "handle", "id": handle, "kind": kind, "type": f"{type(value).__module__}.{type(value).__qualname__}"}
        if kind != "object":
            try:
                name = value.__name__
            except Exception:  # noqa: BLE001 - a student's __getattr__ may raise anything: the grader asks later
                name = None
            if type(name) is str and len(name) <= 200:
                doc["name"] = name  # tests name the function in messages: one round trip fewer per check
        return doc

    def encode(value, budget):
        kind = type(value)
        if value is None or kind is bool or kind is str or kind is int:
            if kind is str:
                budget[0] -= len(value)
            return value
        if kind is float:
            return value if math.isfinite(value) else {"$": "float", "repr": repr(value)}
        if kind in (list, tuple, set, frozenset):
            items = sorted(value, key=repr) if kind in (set, frozenset) else value
            return {"$": kind.__name__, "items": [encode(item, budget) for item in items]}
        if kind is dict or kind.__module__ == "collections" and kind.__name__ in ("OrderedDict", "defaultdict"):
            return {"$": "dict", "items": [[encode(k, budget), encode(v, budget)] for k, v in value.items()]}
        torch = sys.modules.get("torch")
        numpy = sys.modules.get("numpy")
        if torch is not None:
            if kind is torch.Tensor or kind is torch.nn.Parameter:  # a Parameter is a correct tensor answer
                data = value.detach()
                if data.is_sparse or data.layout != torch.strided or data.is_quantized:
                    return new_handle(value)
                flat = data.to("cpu").contiguous().reshape(-1)
                raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
                budget[0] -= len(raw)
                if budget[0] < 0:
                    raise TooLarge()
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
                raw = numpy.ascontiguousarray(value).tobytes()
                budget[0] -= len(raw)
                if budget[0] < 0:
                    raise TooLarge()
                return {"$": "ndarray", "dtype": value.dtype.str, "shape": list(value.shape),
                        "data": base64.b64encode(raw).decode()}
            if kind is numpy.str_:  # a correct label answer (numpy's string scalar)
                budget[0] -= len(value)
                return {"$": "npstr", "text": str(value)}
            if isinstance(value, numpy.generic) and kind.__module__ == "numpy" and value.dtype.kind in "biufc":
                return {"$": "npscalar", "dtype": value.dtype.str,
                        "data": base64.b64encode(value.tobytes()).decode()}
        return new_handle(value)

    def resolve(value):
        kind = type(value)
        if kind is tuple and len(value) == 2 and value[0] == ref_tag:
            return handles[value[1]]
        if kind in (list, tuple):
            return kind(resolve(item) for item in value)
        if kind is dict:
            return {key: resolve(item) for key, item in value.items()}
        return value

    def target_of(target):
        kind, name = target
        if kind == "handle":
            return handles[name]
        if kind == "utils":
            return getattr(sys.modules["utils"], name)
        return shell.user_ns[name]

    def answer(value):
        budget = [max_bytes]
        try:
            return json.dumps({"ok": encode(value, budget)})
        except TooLarge:
            return json.dumps({"error": ["ResultTooLarge", f"the result is larger than the {max_bytes} bytes the "
                                                           "grader reads back; return a smaller value", ""]})

    def failure(exc):
        frames = traceback.extract_tb(exc.__traceback__)[1:]  # drop this server's own frame
        text = "".join(traceback.format_list(frames)) if frames else ""
        return json.dumps({"error": [type(exc).__name__, str(exc)[:20000], text[-20000:]]})

    def serve(request):
        try:
            op, *rest = pickle.loads(base64.b64decode(request))
            if op == "release":
                handles.clear()
                return answer(None)
            if op == "export":  # each name on its own: a value too large to send stays here as a handle
                found = []
                for name in rest[0]:
                    if name in shell.user_ns:
                        value = shell.user_ns[name]
                        try:
                            found.append([name, encode(value, [max_bytes])])
                        except TooLarge:
                            found.append([name, new_handle(value)])
                return json.dumps({"ok": {"$": "dict", "items": found}})
            if op == "call":
                target, args, kwargs = rest
                return answer(target_of(target)(*resolve(args), **resolve(kwargs)))
            if op == "getattr":
                return answer(getattr(handles[rest[0]], rest[1]))
            if op == "getitem":
                return answer(handles[rest[0]][resolve(rest[1])])
            if op == "define":
                source, name, args, kwargs = rest
                namespace = dict(shell.user_ns)
                exec(compile(source, f"<kernel_side {name}>", "exec"), namespace)
                return answer(namespace[name](*resolve(args), **resolve(kwargs)))
            return json.dumps({"error": ["ValueError", f"unknown request {op!r}", ""]})
        except BaseException as exc:  # noqa: BLE001 - every failure of student code becomes data for the grader
            return failure(exc)

    def open_channel(comm, _open_msg):
        def on_request(msg):
            data = msg["content"].get("data")
            comm.send({"answer": serve(data.get("request") if type(data) is dict else None)})

        comm.on_msg(on_request)

    if comm_target:
        shell.kernel.comm_manager.register_target(comm_target, open_channel)
    return serve
