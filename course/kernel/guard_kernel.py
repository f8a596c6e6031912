"""The in-kernel half of the grading guard (docs/SECURITY.md, "grading guard"), installed in each grading kernel before
any student code. Self-contained: the ``course`` package does not exist in the kernel.

``course.grader.guard_client`` keeps only the handle ``_efficient_ai_guard_install`` returns (its closure holds the key and
the snapshots) and calls it through ``user_expressions``, which no input or AST transformer or cell hook touches.
"""
import hashlib
import hmac
import importlib
import json
import os
import sys

WATCHED_MODULES = ["builtins", "math", "numbers", "operator", "functools", "time", "dis", "inspect", "random"]
# Watched only in a lab whose instructor cells import one of them: importing them costs seconds per submission.
LIBRARY_MODULES = ["numpy", "numpy.testing", "torch", "torch.testing", "torch.testing._comparison",
                   "torch.nn.functional", "torch.overrides", "utils", "_utils_private"]
IPYTHON_MANAGED_BUILTINS = {"exit", "quit", "get_ipython", "display", "help", "copyright", "credits", "license",
                            "_", "__", "___"}


def _is_watchable(value):
    return callable(value) or type(value).__name__ == "module"


def _watchable_attrs(namespace, skip=()):
    return {name: value for name, value in list(namespace.items()) if name not in skip and _is_watchable(value)}


class _Guard:
    """What the guard watches (looked up once, at install) and the reference it compares it with."""

    def __init__(self, watch_libraries):
        names = WATCHED_MODULES + (LIBRARY_MODULES if watch_libraries else [])
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a lab without utils.py, or without torch
                pass
        self.shell = shell = get_ipython()  # noqa: F821 - the guard runs inside IPython
        self.modules = {name: sys.modules[name] for name in names if name in sys.modules}
        self.torch = self.modules.get("torch")
        self.classes = [cls for obj in (shell, shell.kernel) for cls in type(obj).__mro__
                        if cls.__module__.split(".")[0] in ("IPython", "ipykernel")]
        if self.torch is not None:
            self.classes += [self.torch.Tensor, self.torch.nn.Module]
        manager = shell.input_transformer_manager
        self.lists = {
            "IPython input_transformers_cleanup": manager.cleanup_transforms,
            "IPython input_transformers_post": shell.input_transformers_post,
            "IPython line transforms": manager.line_transforms,
            "IPython token transformers": manager.token_transformers,
            "IPython ast_transformers": shell.ast_transformers,
            **{f"IPython '{event}' callbacks": shell.events.callbacks[event]
               for event in ("pre_execute", "pre_run_cell", "post_run_cell") if event in shell.events.callbacks},
        }
        plain_text = shell.display_formatter.formatters["text/plain"]
        self.dicts = {"IPython text/plain type printers": plain_text.type_printers,
                      "IPython text/plain deferred printers": plain_text.deferred_printers}
        # Methods are watched through their classes, never here: a bound method is a new object on every access.
        shell_attrs = ("display_formatter", "displayhook", "events", "input_transformer_manager", "custom_exceptions",
                       "compile")
        self.objects = {**{f"shell.{attr}": (shell, attr) for attr in shell_attrs},
                        "sys.displayhook": (sys, "displayhook"), "sys.excepthook": (sys, "excepthook")}
        self.snapshot = {}
        self.locked_globals = {}  # what the locked cells bound, by name
        self.marked = None  # id of every global before the running locked cell

    def take_snapshot(self):
        """The reference, taken when the key is handed out and after every locked cell (instructor code's changes are
        the tests' environment)."""
        self.snapshot = {
            "modules": {name: _watchable_attrs(vars(mod), IPYTHON_MANAGED_BUILTINS if name == "builtins" else ())
                        for name, mod in self.modules.items()},
            "classes": {cls: _watchable_attrs(vars(cls)) for cls in self.classes},
            "instances": [(obj, _watchable_attrs(vars(obj))) for obj in (self.shell, self.shell.kernel)],
            "lists": {name: (lst, list(lst)) for name, lst in self.lists.items()},
            "dicts": {name: (dct, dict(dct)) for name, dct in self.dicts.items()},
            "objects": {name: (owner, attr, getattr(owner, attr, None))
                        for name, (owner, attr) in self.objects.items()},
        }

    def replaced_attributes(self):
        """Module functions, ``sys.modules`` entries, class and instance attributes replaced or overridden, as
        (description, undo) pairs."""
        found = []
        for mod_name, attrs in self.snapshot["modules"].items():
            namespace = vars(self.modules[mod_name])
            for name, value in attrs.items():
                current = namespace.get(name)
                # torch._dynamo wraps torch.manual_seed when torch.compile first imports it: not tampering.
                dynamo = (mod_name, name) == ("torch", "manual_seed") and getattr(current, "__wrapped__", None) is value
                if current is not value and not dynamo:
                    found.append((f"{mod_name}.{name} was replaced",
                                  lambda ns=namespace, n=name, v=value: ns.__setitem__(n, v)))
        for mod_name, mod in self.modules.items():
            if sys.modules.get(mod_name) is not mod:
                found.append((f"sys.modules[{mod_name!r}] was replaced",
                              lambda n=mod_name, m=mod: sys.modules.__setitem__(n, m)))
        for cls, attrs in self.snapshot["classes"].items():
            for name, value in list(vars(cls).items()):
                if name not in attrs and _is_watchable(value) and any(name in vars(base) for base in cls.__mro__[1:]):
                    found.append((f"{cls.__qualname__}.{name} was overridden",
                                  lambda c=cls, n=name: type.__delattr__(c, n)))
            for name, value in attrs.items():
                if vars(cls).get(name) is not value:
                    found.append((f"{cls.__qualname__}.{name} was replaced",
                                  lambda c=cls, n=name, v=value: setattr(c, n, v)))
        for obj, attrs in self.snapshot["instances"]:
            for name, value in list(vars(obj).items()):
                if name in attrs:
                    if value is not attrs[name]:
                        found.append((f"{type(obj).__name__} instance attribute {name} was replaced",
                                      lambda o=obj, n=name, v=attrs[name]: vars(o).__setitem__(n, v)))
                elif callable(value) and any(name in vars(cls) for cls in type(obj).__mro__):
                    found.append((f"{type(obj).__name__}.{name} was overridden on the instance",
                                  lambda o=obj, n=name: vars(o).pop(n, None)))
        return found

    def replaced_contents(self):
        """Watched lists and dicts (IPython's transformers, hooks...), objects and the locked cells' globals."""
        found = []
        for name, (lst, items) in self.snapshot["lists"].items():
            if len(lst) != len(items) or any(a is not b for a, b in zip(lst, items)):
                found.append((f"{name} were changed",
                              lambda lst=lst, items=items: lst.__setitem__(slice(None), items)))
        for name, (dct, items) in self.snapshot["dicts"].items():
            if dct.keys() != items.keys() or any(dct[k] is not v for k, v in items.items()):
                found.append((f"{name} were changed", lambda d=dct, items=items: (d.clear(), d.update(items))))
        for name, (owner, attr, value) in self.snapshot["objects"].items():
            if getattr(owner, attr, None) is not value:
                found.append((f"{name} was replaced", lambda o=owner, a=attr, v=value: setattr(o, a, v)))
        for name, value in self.locked_globals.items():
            if self.shell.user_ns.get(name) is not value:
                found.append((f"the notebook global {name!r} (defined by a locked cell) was replaced",
                              lambda n=name, v=value: self.shell.user_ns.__setitem__(n, v)))
        return found

    def installed_hooks(self):
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
        if self.torch is not None:
            c = self.torch._C
            for kind, length, pop in [("function", c._len_torch_function_stack, c._pop_torch_function_stack),
                                      ("dispatch", c._len_torch_dispatch_stack, c._pop_torch_dispatch_stack)]:
                if length() > 0:
                    found.append((f"a torch {kind} mode was left active",
                                  lambda length=length, pop=pop: [pop() for _ in range(length())]))
        return found

    def changes(self):
        """Everything replaced since the snapshot, as (description, undo) pairs."""
        return self.replaced_attributes() + self.replaced_contents() + self.installed_hooks()

    def run(self, command):
        """The payload of a ``check``, ``restore`` or ``mark``/``adopt`` (around a locked cell) command."""
        user_ns = self.shell.user_ns
        if command == "mark":
            self.marked = {name: id(value) for name, value in user_ns.items()}
            return "marked"
        if command == "adopt":
            # The grader restored every change before the locked cell ran: what changed since is instructor code's.
            before = self.marked or {}
            for name, value in user_ns.items():
                if before.get(name) != id(value) and not name.startswith("_") and _is_watchable(value):
                    self.locked_globals[name] = value
            self.take_snapshot()
            return "adopted"
        if command not in ("check", "restore"):
            raise ValueError(f"unknown guard command {command!r}")
        found = self.changes()
        descriptions = {description for description, _ in found}
        if command == "restore":
            for _, undo in found:
                try:
                    undo()
                except Exception:  # noqa: BLE001, S110 - reported below as not undone
                    pass
            descriptions |= {f"could not undo: {description}" for description, _ in self.changes()}
        return json.dumps(sorted(descriptions))


def _efficient_ai_guard_install(watch_libraries=True):
    """Install the guard; its handle ``handle(command, nonce="")`` answers ``payload|signature``. ``watch_libraries``
    False (the lab imports none of numpy, torch and utils) leaves those unimported and unwatched."""
    key = os.urandom(32)
    guard = _Guard(watch_libraries)
    handed_out = []

    def handle(command, nonce=""):
        if command == "key":  # once, before any student code: the snapshot is taken then
            if handed_out:
                raise PermissionError("the grading key was handed out already")
            handed_out.append(True)
            guard.take_snapshot()
            return key.hex()
        payload = guard.run(command)
        signature = hmac.new(key, f"{nonce}|{payload}".encode(), hashlib.sha256).hexdigest()
        return f"{payload}|{signature}"

    return handle
