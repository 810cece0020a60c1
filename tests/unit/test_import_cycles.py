"""No import cycles among the project's modules, lazy and type-checking imports included: a
cycle is two modules that cannot be understood (or changed) one without the other."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "delayq": ROOT / "layers" / "delayq" / "delayq",
    "delayq_local": ROOT / "local" / "delayq_local",
    "delayq_reports": ROOT / "spark_glue" / "delayq_reports",
    "bench": ROOT / "bench",
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[str]:
    """The project modules `name` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            module = target
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name:
                yield module


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_edges_removed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Without a package's `__init__` importing its own submodules to re-export them (the
    package is the submodules' public face, not a module they depend on)."""
    return {
        name: {t for t in targets if not t.startswith(f"{name}.")}
        for name, targets in graph.items()
    }


def test_the_project_has_no_import_cycles() -> None:
    known = modules()
    graph = {name: set(imported(name, path, known)) for name, path in known.items()}

    assert cycles(package_edges_removed(graph)) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ],
)
def test_cycles_are_found(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected
