"""The in-kernel half of the grading guard: its source is sent to each grading kernel before any student code.

``course.guard_client.GuardClient`` (for ``course.guarded_execute.GuardedExecute``) executes this file's text in a
fresh grading kernel (silently, outside the notebook's history), then talks to the handle it returns only through
Jupyter ``user_expressions``, which IPython evaluates without input or AST transformers and without
``pre_run_cell`` hooks, so student code cannot rewrite the checks on their way in. The handle snapshots what the tests rely on and later reports, signed with a key that
only the grader learned (it is handed out once, before any student code runs), which of those things student
code has replaced:

- functions and classes of the modules tests use (``torch``, ``torch.testing`` and its internals,
  ``torch.nn.functional``, ``numpy``, ``numpy.testing``, ``math``, ``builtins``, ``time``, ``utils``...), and the
  methods of ``torch.Tensor``;
- ``sys.modules`` entries of those modules, trace and profile functions, torch function and dispatch modes;
- IPython's input and AST transformers, execution event callbacks, plain-text type printers, the shell's and
  kernel's methods (``run_cell``, ``showtraceback``, ``do_execute``...), custom exception handlers;
- the globals that the notebook's locked (instructor) cells bound to modules, functions and classes.

``restore`` puts every replaced object back, so tampering found before one test cell costs that cell only.
This file must stay self-contained: it runs in the student's kernel, where the ``course`` package does not exist.
"""


def _efficient_ai_guard_install(watch_libraries=True):  # noqa: C901 - one closure keeps the guard's state private
    """Install the guard; its handle. ``watch_libraries=False`` (a lab whose instructor cells import none of numpy,
    torch and utils) leaves those libraries unimported and unwatched: nothing of the lab relies on them, and importing
    them costs seconds per submission."""
    import hashlib
    import hmac
    import importlib
    import json
    import os
    import sys

    watched_modules = ["builtins", "math", "numbers", "operator", "functools", "time", "dis", "inspect", "random"]
    if watch_libraries:
        watched_modules += ["numpy", "numpy.testing", "torch", "torch.testing", "torch.testing._comparison",
                            "torch.nn.functional", "torch.overrides", "utils"]
    ipython_managed_builtins = {"exit", "quit", "get_ipython", "display", "help", "copyright", "credits", "license",
                                "_", "__", "___"}
    for name in watched_modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a lab without utils.py, or without torch
            pass
    modules = {name: sys.modules[name] for name in watched_modules if name in sys.modules}
    torch = modules.get("torch")
    shell = get_ipython()  # noqa: F821 - the guard runs inside IPython
    key = os.urandom(32)
    handed_out = []

    def is_watchable(value):
        return callable(value) or type(value).__name__ == "module"

    def snapshot_attrs(namespace, skip=()):
        return {name: value for name, value in list(namespace.items()) if name not in skip and is_watchable(value)}

    def python_classes(obj):
        return [cls for cls in type(obj).__mro__ if cls.__module__.split(".")[0] in ("IPython", "ipykernel")]

    watched_classes = [cls for cls in python_classes(shell) + python_classes(shell.kernel)]
    if torch is not None:
        watched_classes += [torch.Tensor, torch.nn.Module]
    manager = shell.input_transformer_manager
    lists = {
        "IPython input_transformers_cleanup": manager.cleanup_transforms,
        "IPython input_transformers_post": shell.input_transformers_post,
        "IPython line transforms": manager.line_transforms,
        "IPython token transformers": manager.token_transformers,
        "IPython ast_transformers": shell.ast_transformers,
        **{f"IPython '{event}' callbacks": shell.events.callbacks[event]
           for event in ("pre_execute", "pre_run_cell", "post_run_cell") if event in shell.events.callbacks},
    }
    plain_text = shell.display_formatter.formatters["text/plain"]
    dicts = {"IPython text/plain type printers": plain_text.type_printers,
             "IPython text/plain deferred printers": plain_text.deferred_printers}
    # Methods are watched through their classes (and instance overrides), never here: a bound method is a new
    # object on every attribute access.
    objects = {"shell.display_formatter": (shell, "display_formatter"), "shell.displayhook": (shell, "displayhook"),
               "shell.events": (shell, "events"), "shell.input_transformer_manager": (shell, "input_transformer_manager"),
               "shell.custom_exceptions": (shell, "custom_exceptions"), "shell.compile": (shell, "compile"),
               "sys.displayhook": (sys, "displayhook"), "sys.excepthook": (sys, "excepthook")}

    state = {}

    def take_snapshot():
        """Called through ``user_expressions`` like every check, so both see IPython in the same phase (IPython
        swaps ``sys.displayhook``, ``builtins.input`` and others in and out around each cell). Taken when the key
        is handed out, and again after every locked cell: what instructor code changes (a library it imports
        registering an IPython hook, say) is the environment the tests run in, not tampering."""
        state.update({
            "modules": {name: snapshot_attrs(vars(mod), ipython_managed_builtins if name == "builtins" else ())
                        for name, mod in modules.items()},
            "sys.modules": dict(modules),
            "classes": {cls: snapshot_attrs(vars(cls)) for cls in watched_classes},
            "instances": {id(obj): (obj, snapshot_attrs(vars(obj))) for obj in (shell, shell.kernel)},
            "lists": {name: (lst, list(lst)) for name, lst in lists.items()},
            "dicts": {name: (dct, dict(dct)) for name, dct in dicts.items()},
            "objects": {name: (owner, attr, getattr(owner, attr, None)) for name, (owner, attr) in objects.items()},
        })
        state.setdefault("globals", {})
        state.setdefault("marked", None)

    def library_wrapper(mod_name, name, original, current):
        """torch._dynamo, when torch.compile first imports it, wraps torch.manual_seed (importing it up front
        would import Triton before a lab can set TRITON_INTERPRET)."""
        return (mod_name, name) == ("torch", "manual_seed") and getattr(current, "__wrapped__", None) is original

    def changes():
        """Everything replaced since the snapshot, as (description, undo) pairs."""
        return replaced_attributes() + replaced_contents() + installed_hooks()

    def replaced_attributes():
        """Module functions, ``sys.modules`` entries, class and instance attributes replaced or overridden."""
        found = []
        for mod_name, attrs in state["modules"].items():
            namespace = vars(modules[mod_name])
            for name, value in attrs.items():
                current = namespace.get(name)
                if current is not value and not library_wrapper(mod_name, name, value, current):
                    found.append((f"{mod_name}.{name} was replaced",
                                  lambda ns=namespace, n=name, v=value: ns.__setitem__(n, v)))
        for mod_name, mod in state["sys.modules"].items():
            if sys.modules.get(mod_name) is not mod:
                found.append((f"sys.modules[{mod_name!r}] was replaced",
                              lambda n=mod_name, m=mod: sys.modules.__setitem__(n, m)))
        for cls, attrs in state["classes"].items():
            for name, value in list(vars(cls).items()):
                if name not in attrs and is_watchable(value) and any(name in vars(base) for base in cls.__mro__[1:]):
                    found.append((f"{cls.__qualname__}.{name} was overridden",
                                  lambda c=cls, n=name: type.__delattr__(c, n)))
            for name, value in attrs.items():
                if vars(cls).get(name) is not value:
                    found.append((f"{cls.__qualname__}.{name} was replaced",
                                  lambda c=cls, n=name, v=value: setattr(c, n, v)))
        for obj, attrs in state["instances"].values():
            current = vars(obj)
            for name, value in list(current.items()):
                if name in attrs:
                    if value is not attrs[name]:
                        found.append((f"{type(obj).__name__} instance attribute {name} was replaced",
                                      lambda o=obj, n=name, v=attrs[name]: vars(o).__setitem__(n, v)))
                elif callable(value) and any(name in vars(cls) for cls in type(obj).__mro__):
                    found.append((f"{type(obj).__name__}.{name} was overridden on the instance",
                                  lambda o=obj, n=name: vars(o).pop(n, None)))
        return found

    def replaced_contents():
        """Watched lists and dicts (IPython's transformers, hooks...), objects and the locked cells' globals."""
        found = []
        for name, (lst, items) in state["lists"].items():
            if len(lst) != len(items) or any(a is not b for a, b in zip(lst, items)):
                found.append((f"{name} were changed", lambda lst=lst, items=items: lst.__setitem__(slice(None), items)))
        for name, (dct, items) in state["dicts"].items():
            if dct.keys() != items.keys() or any(dct[k] is not v for k, v in items.items()):
                found.append((f"{name} were changed", lambda d=dct, items=items: (d.clear(), d.update(items))))
        for name, (owner, attr, value) in state["objects"].items():
            if getattr(owner, attr, None) is not value:
                found.append((f"{name} was replaced", lambda o=owner, a=attr, v=value: setattr(o, a, v)))
        for name, value in state["globals"].items():
            if shell.user_ns.get(name) is not value:
                found.append((f"the notebook global {name!r} (defined by a locked cell) was replaced",
                              lambda n=name, v=value: shell.user_ns.__setitem__(n, v)))
        return found

    def installed_hooks():
        """Trace, profile and monitoring functions, and torch function or dispatch modes left active."""
        found = []
        if sys.gettrace() is not None:
            found.append(("a trace function was installed (sys.settrace)", lambda: sys.settrace(None)))
        if sys.getprofile() is not None:
            found.append(("a profile function was installed (sys.setprofile)", lambda: sys.setprofile(None)))
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            for tool in range(6):
                if monitoring.get_tool(tool) is not None:
                    found.append((f"sys.monitoring tool {tool} was registered",
                                  lambda t=tool: (monitoring.set_events(t, 0), monitoring.free_tool_id(t))))
        if torch is not None:
            if torch._C._len_torch_function_stack() > 0:
                found.append(("a torch function mode was left active",
                              lambda: [torch._C._pop_torch_function_stack()
                                       for _ in range(torch._C._len_torch_function_stack())]))
            if torch._C._len_torch_dispatch_stack() > 0:
                found.append(("a torch dispatch mode was left active",
                              lambda: [torch._C._pop_torch_dispatch_stack()
                                       for _ in range(torch._C._len_torch_dispatch_stack())]))
        return found

    def sign(nonce, payload):
        return hmac.new(key, f"{nonce}|{payload}".encode(), hashlib.sha256).hexdigest()

    def handle(command, nonce=""):
        """``key`` (once), ``check``, ``restore``, ``mark``/``adopt`` (around a locked cell)."""
        if command == "key":
            if handed_out:
                raise PermissionError("the grading key was handed out already")
            handed_out.append(True)
            take_snapshot()
            return key.hex()
        if command == "mark":
            state["marked"] = {name: id(value) for name, value in shell.user_ns.items()}
            payload = "marked"
        elif command == "adopt":
            # After a locked cell: the grader restored every change before it ran, so what changed since was done
            # by instructor code (its imports included) and becomes the reference.
            before = state["marked"] or {}
            for name, value in shell.user_ns.items():
                if before.get(name) != id(value) and not name.startswith("_") and is_watchable(value):
                    state["globals"][name] = value
            take_snapshot()
            payload = "adopted"
        elif command in ("check", "restore"):
            found = changes()
            descriptions = {description for description, _ in found}
            if command == "restore":
                for _, undo in found:
                    try:
                        undo()
                    except Exception:  # noqa: BLE001 - reported below as not undone
                        pass
                descriptions |= {f"could not undo: {description}" for description, _ in changes()}
            payload = json.dumps(sorted(descriptions))
        else:
            raise ValueError(f"unknown guard command {command!r}")
        return f"{payload}|{sign(nonce, payload)}"

    return handle
