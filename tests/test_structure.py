"""The course tooling stays readable: four rooms by where code runs (docs/LAYOUT.md), imports that only go down the
rooms' order, no import cycle (every import counted, at module level or inside a function), and no function over 80
lines in the tooling, the scripts or the students' helpers."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
COURSE = REPO / "course"
# Which rooms a room may import: the CLI starts grading, grading starts kernels, and all of them share the vocabulary.
# The grader reaches the kernel room for the launcher's limits (settings) and the files it sends to kernels.
MAY_IMPORT = {"cli": {"cli", "grader", "kernel", "common"}, "grader": {"grader", "kernel", "common"},
              "kernel": {"kernel"}, "common": {"common"}}
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    """``course/grader/sandbox.py`` -> ``grader.sandbox``; ``course/__main__.py`` -> ``__main__``."""
    return ".".join(path.relative_to(COURSE).with_suffix("").parts)


def course_imports(path: Path) -> set[str]:
    """The modules of ``course`` (as ``room.module``) that ``path`` imports, relative or absolute."""
    here = module_name(path).split(".")[:-1]  # the importing module's package, below course
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1] if node.level > 1 else here
                parts = [*base, *(node.module.split(".") if node.module else [])]
                names = [".".join([*parts, alias.name]) for alias in node.names] + [".".join(parts)]
            elif node.module and node.module.startswith("course."):
                parts = node.module.split(".")[1:]
                names = [".".join([*parts, alias.name]) for alias in node.names] + [".".join(parts)]
            else:
                continue
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".", 1)[1] for alias in node.names if alias.name.startswith("course."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in COURSE.rglob("*.py") if path.name != "__init__.py"}
    return {name: course_imports(path) & set(modules) - {name} for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (as the modules on it), or [] when there is none."""
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = "open"
        for other in sorted(graph[name]):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state and (cycle := visit(other, path + [other])):
                return cycle
        state[name] = "done"
        return []

    for name in sorted(graph):
        if name not in state and (cycle := visit(name, [name])):
            return cycle
    return []


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_course():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle in course/: " + " -> ".join(cycle)


def test_every_module_sits_in_a_room():
    loose = sorted(path.name for path in COURSE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules of course/ outside its rooms ({', '.join(MAY_IMPORT)}): {loose}"


def test_imports_go_down_the_rooms():
    wrong = [f"{name} imports {other}" for name, others in import_graph().items() if "." in name
             for other in sorted(others) if other.split(".")[0] not in MAY_IMPORT[name.split(".")[0]]]
    assert not wrong, "imports against docs/LAYOUT.md's order of rooms: " + "; ".join(wrong)


def test_room_rule_sees_a_wrong_import(tmp_path, monkeypatch):
    """The rule itself: a common module importing from the grader is caught."""
    room = tmp_path / "course" / "common"
    room.mkdir(parents=True)
    (room / "x.py").write_text("from ..grader.sandbox import use_sandbox\n")
    monkeypatch.setattr(__import__(__name__), "COURSE", tmp_path / "course")
    assert course_imports(room / "x.py") >= {"grader.sandbox"}


@pytest.mark.parametrize("folder", ["course", "scripts", "."])
def test_no_function_is_over_80_lines(folder):
    """Long functions hide rooms of their own (issue 53); lab texts and hidden tests are not counted."""
    paths = (REPO / folder).rglob("*.py") if folder != "." else REPO.glob("*.py")
    long = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
