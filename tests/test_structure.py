"""The course tooling stays readable: no import cycle between the modules of ``course/`` (every import counted, at
module level or inside a function)."""
from __future__ import annotations

import ast
from pathlib import Path

COURSE = Path(__file__).resolve().parents[1] / "course"


def course_imports(path: Path) -> set[str]:
    """The modules of ``course`` that ``path`` imports (``from . import x``, ``from .x import y``, ``course.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.module and node.module.startswith("course."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("course."))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {path.stem: path for path in COURSE.glob("*.py")}
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
