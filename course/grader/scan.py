"""scan: flags for a TA on student code that can tamper with grading (docs/SECURITY.md, "static scan").

Names are followed through the notebook's imports (``np.x`` is ``numpy.x``). Best effort: honest code can trip a rule,
and a determined student can evade any static scan. The rules are the constants below and ``CellScan``'s visitors.
"""
from __future__ import annotations

import ast
import builtins
import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from nbgrader.utils import is_locked as nbgrader_is_locked

from ..common.notebooks import grade_id
from ..common.quoting import escape_controls

SUSPICIOUS_RE = re.compile(
    r"^(?:ctypes|inspect|importlib|builtins|ipykernel|jupyter_client|nbclient|nbconvert|nbformat|nbgrader"
    r"|sqlite3|subprocess|socket|pty|signal|mock|unittest\.mock|IPython(?!\.display|\.core\.display|\.get_ipython)"
    r"|torch\._C\b|torch\.library|torch\.overrides|torch\.utils\._python_dispatch"
    r"|gc\.(?:get_objects|get_referrers|get_referents|callbacks)"
    r"|sys\.(?:_getframe|_current_frames|settrace|setprofile|addaudithook|modules|path|meta_path|path_hooks"
    r"|path_importer_cache|displayhook|excepthook)"
    r"|threading\.(?:settrace|setprofile)\w*"
    r"|os\.(?:system|popen|exec\w*|spawn\w*|posix_spawn\w*|fork\w*|kill\w*|_exit|chdir))(?:\.|$)"
)
"""Dotted names (after following imports) whose import or use is flagged."""
WELL_KNOWN_MODULES = {"os", "sys", "gc", "inspect", "ctypes", "subprocess", "importlib", "builtins", "threading"}
"""Names taken as these modules even when no cell imports them (``from utils import *`` can provide them)."""
ALLOWED_ASSIGNMENTS = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.",
                       "torch._functorch.config.", "matplotlib.rcParams", "matplotlib.pyplot.rcParams",
                       "pandas.options.", "os.environ")
"""Configuration namespaces honest code sets (``torch.backends.cudnn.benchmark = True``)."""
HARMLESS_SPECIAL_ATTRIBUTES = {"__doc__", "__name__", "__qualname__", "__module__", "__wrapped__"}
CLASS_HOOKS = {"__torch_function__", "__torch_dispatch__", "__eq__", "__ne__", "__bool__", "__float__", "__lt__",
               "__le__", "__gt__", "__ge__", "__instancecheck__", "__subclasscheck__", "__array_function__",
               "__array_ufunc__"}
"""Methods that let an object pass a comparison, truth or isinstance test it should fail."""
DYNAMIC_CODE = {"exec", "eval", "compile", "__import__", "globals"}
GET_IPYTHON = {"get_ipython", "IPython.get_ipython", "IPython.core.getipython.get_ipython"}
ORDINARY_IPYTHON = {"run_line_magic", "run_cell_magic", "system", "getoutput"}  # judged by what they run
PYTHON_MAGICS = {"time", "timeit", "prun", "capture"}
FLAGGED_MAGICS = {"system", "sx", "sc", "bash", "sh", "script", "perl", "ruby", "python", "python2", "python3", "pypy",
                  "writefile", "file", "run", "load", "pip", "conda", "mamba", "cd", "env"}
"""Magics that run shell commands or other files, install packages, or change the folder or environment."""
PATH_RE = re.compile(r"(?:^|[/\\])(?:source|submitted|autograded|\.\.)(?:[/\\]|$)|gradebook|nbgrader_config|\.ipynb\b")
INTERNAL_PREFIX = "_efficient_ai"


def is_locked(cell) -> bool:
    """A cell whose source nbgrader restores from the instructor's copy: a test or locked cell, never an answer."""
    return isinstance(cell.get("metadata", {}).get("nbgrader"), dict) and bool(nbgrader_is_locked(cell))


URL_MARK, LAB_MARK = "urlmark7f3a9c", "labmark7f3a9c"  # stand-ins for the bundle address and the lab


@functools.cache
def _course_fetch_cell() -> re.Pattern:
    """The source of the cell ``course build`` puts first in a release notebook (with ``labs/bundle_url.txt``) to
    fetch the lab's files on Colab, for any bundle address and lab: the course's own code, not the student's. Made by
    ``course.common.fetch_cell.fetch_cell_source`` itself, so that it is the cell as built, whatever the template asks for."""
    from ..common.fetch_cell import fetch_cell_source

    built = fetch_cell_source(URL_MARK, LAB_MARK)
    # The address stays inside its string literal (no quote, backslash or line break), so it changes no code.
    return re.compile(re.escape(built.strip()).replace(URL_MARK, r'[^"\\\n]*').replace(LAB_MARK, r"\w+"))


def is_course_fetch_cell(source: str) -> bool:
    """Whether a code cell is the course's fetch cell exactly as built (any edit makes it the student's code)."""
    return _course_fetch_cell().fullmatch(source.replace("\r\n", "\n").strip()) is not None


def parse_cell(source: str) -> ast.Module:
    """Parse a code cell; IPython syntax (``%magic``, ``!shell``, ``x?``) is first turned into the
    ``get_ipython()`` calls IPython runs for it.

    Raises:
        SyntaxError: it is not Python even so.
    """
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: null bytes; IPython is imported only for such a cell
        from IPython.core.inputtransformer2 import TransformerManager
    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SyntaxError(f"{type(exc).__name__}: {exc}") from None


class Binding(NamedTuple):
    """A name a cell binds at module level."""

    name: str
    kind: str  # "import", "def" (def or class) or "assign" (assignment, del, loop or with target, except name)
    origin: str | None = None  # the dotted origin of an import


def _where(exc: SyntaxError) -> str:
    return f"line {exc.lineno}: {exc.msg}" if exc.lineno else str(exc.msg)


@dataclass
class Context:
    """What the whole notebook binds, for following names: imports, simple aliases, and the locked names.

    Attributes:
        aliases: name -> dotted origin (``np`` -> ``numpy``; ``t`` -> ``torch`` after ``t = torch``;
            ``ip`` -> ``get_ipython()`` after ``ip = get_ipython()``).
        protected: top-level names locked cells import (name -> origin) or define by def/class (None), and the
            builtins locked cells use (None).
    """

    aliases: dict[str, str] = field(default_factory=dict)
    protected: dict[str, str | None] = field(default_factory=dict)

    def dotted(self, node) -> str | None:
        """The dotted name an expression refers to, following imports; None for anything else."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            return node.id if node.id in WELL_KNOWN_MODULES or node.id in GET_IPYTHON else None
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and not node.args and self.dotted(node.func) in GET_IPYTHON:
            return "get_ipython()"
        return None

    def learn(self, tree: ast.Module, locked: bool) -> None:
        """Record the imports and aliases of one cell and, for a locked cell, the names it protects."""
        for node in ast.walk(tree):
            for name, origin in _imported(node):
                self.aliases[name] = origin
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
                if (isinstance(value, ast.Name) and value.id in self.aliases) or self.dotted(value) == "get_ipython()":
                    self.aliases[node.targets[0].id] = self.dotted(value)
        if not locked:
            return
        bindings = top_level_bindings(tree)
        self.protected.update((binding.name, binding.origin) for binding in bindings if binding.kind != "assign")
        bound = {binding.name for binding in bindings}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and hasattr(builtins, node.id) \
                    and node.id not in bound and not node.id.startswith("__"):
                self.protected.setdefault(node.id, None)


def _imported(node) -> list[tuple[str, str]]:
    """(bound name, dotted origin) of each name an import statement binds."""
    if isinstance(node, ast.Import):
        return [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0]) for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names if a.name != "*"]
    return []


def _unpacked(target) -> list:
    """What an assignment target assigns to, in order: ``a, (b, *c)`` is a, b and c; any other target is itself."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [leaf for element in target.elts for leaf in _unpacked(element)]
    return _unpacked(target.value) if isinstance(target, ast.Starred) else [target]


def top_level_bindings(tree: ast.Module) -> list[Binding]:
    """Names a cell binds at module level (also inside top-level if/for/while/with/try, not inside defs)."""
    found: list[Binding] = []

    def assigned(target):
        found.extend(Binding(leaf.id, "assign") for leaf in _unpacked(target) if isinstance(leaf, ast.Name))

    def visit(statements):
        for stmt in statements:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.append(Binding(stmt.name, "def"))
                continue
            found.extend(Binding(name, "import", origin) for name, origin in _imported(stmt))
            for target in getattr(stmt, "targets", []):  # Assign, Delete
                assigned(target)
            if isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                assigned(stmt.target)
            for item in getattr(stmt, "items", []):  # With
                assigned(item.optional_vars)
            for handler in getattr(stmt, "handlers", []):  # Try
                if handler.name:
                    found.append(Binding(handler.name, "assign"))
                visit(handler.body)
            for block in ("body", "orelse", "finalbody"):
                visit(getattr(stmt, block, []))

    visit(tree.body)
    return found


class CellScan(ast.NodeVisitor):
    """The flags of one student cell (without the cell's label)."""

    def __init__(self, context: Context):
        self.context = context
        self.flags: list[str] = []

    def flag(self, text: str) -> None:
        if text not in self.flags:
            self.flags.append(text)

    def run(self, tree: ast.Module) -> list[str]:
        protected = self.context.protected
        for binding in top_level_bindings(tree):
            origin = protected.get(binding.name)
            if binding.name not in protected or (binding.kind == "import" and binding.origin == origin):
                continue  # not protected, or the same import again
            why = ("imported by a locked cell" if origin is not None
                   else "a builtin the tests use" if hasattr(builtins, binding.name) else "defined by a locked cell")
            self.flag(f"rebinds {binding.name} ({why})")
        self.visit(tree)
        return self.flags

    # imports -----------------------------------------------------------------------------------------------
    def visit_Import(self, node):
        for alias in node.names:
            if SUSPICIOUS_RE.match(alias.name):
                self.flag(f"import {alias.name}")

    def visit_ImportFrom(self, node):
        module = node.module or ""
        for alias in node.names:
            if SUSPICIOUS_RE.match(module if alias.name == "*" else f"{module}.{alias.name}"):
                self.flag(f"from {module} import {alias.name}")

    # names and uses ----------------------------------------------------------------------------------------
    def visit_Name(self, node):
        if node.id.startswith(INTERNAL_PREFIX):
            self.flag(f"name {node.id}")
        origin = self.context.aliases.get(node.id)
        if origin and SUSPICIOUS_RE.match(origin):
            self.flag(f"uses {origin}")

    def visit_Attribute(self, node):
        if node.attr.startswith(INTERNAL_PREFIX):
            self.flag(f"attribute {node.attr}")
        base, dotted = self.context.dotted(node.value), self.context.dotted(node)
        if base == "get_ipython()" and node.attr not in ORDINARY_IPYTHON:
            self.flag(f"get_ipython().{node.attr}")
        elif base is not None and node.attr == "__dict__":
            self.flag(f"uses {dotted}")
        if dotted and SUSPICIOUS_RE.match(dotted):
            self.flag(f"uses {dotted}")
            return  # the shortest suspicious chain is named once: not its parts again
        self.generic_visit(node)

    def visit_Constant(self, node):
        if not isinstance(text := node.value, str):
            return
        shown = repr(text if len(text) <= 60 else text[:57] + "...")
        if "NBGRADER" in text:
            self.flag(f"mentions NBGRADER: {shown}")
        if INTERNAL_PREFIX in text or "__torch_function__" in text or "__torch_dispatch__" in text:
            self.flag(f"string {shown}")
        if PATH_RE.search(text) and "\n" not in text.strip():
            self.flag(f"path {shown}")

    # calls -------------------------------------------------------------------------------------------------
    def visit_Call(self, node):
        func = self.context.dotted(node.func)
        args = [a.value if isinstance(a, ast.Constant) else None for a in node.args]
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name in DYNAMIC_CODE and name not in self.context.aliases:
            self.flag(f"calls {name}")
        elif name in ("setattr", "delattr") and node.args:
            target = self.context.dotted(node.args[0])
            hook = args[1] if len(args) > 1 and args[1] in CLASS_HOOKS else None
            if target or hook:
                self.flag(f"{name} on {target or ast.unparse(node.args[0])}" + (f" ({hook})" if hook else ""))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("__setattr__", "__delattr__"):
            owner = node.func.value
            if self.context.dotted(owner) or (isinstance(owner, ast.Name) and owner.id in ("object", "type")):
                self.flag(f"calls {ast.unparse(node.func)}")
        elif func in ("get_ipython().system", "get_ipython().getoutput"):
            self.flag(f"shell command {args[0]!r}" if args and isinstance(args[0], str) else "shell command")
        elif func in ("get_ipython().run_line_magic", "get_ipython().run_cell_magic") and args and isinstance(args[0], str):
            self.magic(args[0], [a for a in args[1:] if isinstance(a, str)], cell=func.endswith("cell_magic"))
            return
        self.generic_visit(node)

    def magic(self, name: str, texts: list[str], cell: bool) -> None:
        """A ``%name`` line magic (``texts``: its argument) or ``%%name`` cell magic (its line and body)."""
        if name in PYTHON_MAGICS and texts:  # ``%time stmt``, a ``%%time`` body: Python, scanned as such
            try:
                self.visit(parse_cell(texts[-1]))
            except SyntaxError as exc:
                if cell:  # a line magic's argument may start with options (``%timeit -n 3 f()``): no flag
                    self.flag(f"magic body does not parse ({_where(exc)}), not scanned")
        elif name in FLAGGED_MAGICS:
            line = texts[0].strip() if texts else ""
            self.flag(("%%" if cell else "%") + f"{name} {line}".strip()[:70] + (" cell" if cell else ""))

    # assignments -------------------------------------------------------------------------------------------
    def check_target(self, target, verb: str) -> None:
        """Flag an assignment or ``del`` of an attribute or item of an imported module or class, or of a special
        attribute of anything."""
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            owner = self.context.dotted(target.value)
            if owner and owner != "get_ipython()":
                dotted = f"{owner}.{target.attr}" if isinstance(target, ast.Attribute) else owner
                if not dotted.startswith(ALLOWED_ASSIGNMENTS):
                    self.flag(f"{verb} {dotted if isinstance(target, ast.Attribute) else ast.unparse(target)}")
            elif isinstance(target, ast.Attribute) and target.attr.startswith("__") and target.attr.endswith("__") \
                    and target.attr not in HARMLESS_SPECIAL_ATTRIBUTES:
                self.flag(f"{verb} {ast.unparse(target)}")

    def visit_Assign(self, node):
        verb = "deletes" if isinstance(node, ast.Delete) else "assigns"
        for target in getattr(node, "targets", None) or [node.target]:
            for leaf in _unpacked(target):
                self.check_target(leaf, verb)
        self.generic_visit(node)

    visit_AugAssign = visit_AnnAssign = visit_Delete = visit_Assign

    def visit_ClassDef(self, node):
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [stmt.name]
            else:
                names = [t.id for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)]
            for name in names:
                if name in CLASS_HOOKS:
                    self.flag(f"class {node.name} defines {name}")
        self.generic_visit(node)


def scan_notebook(nb) -> list[str]:
    """Flags for every student code cell of a notebook, in cell order: ``"<grade id or cell N>: <what>"``, with
    control characters in quoted student text escaped (``course.common.quoting``).

    Locked cells are read only to follow names (their imports) and to know which names they protect; the course's
    own fetch cell (``is_course_fetch_cell``) is not scanned either.
    """
    context, student_cells = Context(), []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        locked = is_locked(cell)
        try:
            tree = parse_cell(cell.source)
        except SyntaxError as exc:
            tree = f"does not parse ({_where(exc)}), not scanned"
        else:
            context.learn(tree, locked)
        if not locked and not is_course_fetch_cell(cell.source):
            student_cells.append((grade_id(cell) or f"cell {index}", tree))
    flags = []  # scanned once every cell is learned: a later cell's import names what an earlier cell uses
    for label, tree in student_cells:
        found = [tree] if isinstance(tree, str) else CellScan(context).run(tree)
        flags += [escape_controls(f"{label}: {text}") for text in found]
    return flags


RECORDING_BYPASS_RE = re.compile(
    r"torch\._C\b|torch\.overrides|torch\.utils\._python_dispatch|__torch_function__|__torch_dispatch__"
    r"|record_torch_calls|\b(?:_utils_private|utils|checks)\.(?!\w+\()"
)
"""Flag texts that reach what ``checks.record_torch_calls`` relies on: PyTorch's function and dispatch modes, the
recorder, or the modules that could hold it (``checks``, ``utils`` and its private ``_utils_private``)."""


def recording_bypass_flags(nb) -> list[str]:
    """The flags of ``scan_notebook`` that touch what call recording relies on: with any, the tests that check which
    torch functions an answer called score zero (the kernel could have switched the recording off)."""
    return [flag for flag in scan_notebook(nb) if RECORDING_BYPASS_RE.search(flag.split(": ", 1)[-1])]
