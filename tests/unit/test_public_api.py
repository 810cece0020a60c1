"""The layer's public API: every module of ``delayq`` declares ``__all__``, it names only
what the module itself defines, and it covers every name the rest of the repository imports
from the module (a private ``_name`` imported by a test is allowed and stays out)."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "layers" / "delayq" / "delayq"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py"))
#: Not the repository's own code (virtual environments, build output, vendored tools).
SKIPPED_DIRS = frozenset({".venv", "venv", ".git", ".aws-sam", ".tools", "node_modules", "build"})


def _module_name(stem: str) -> str:
    return "delayq" if stem == "__init__" else f"delayq.{stem}"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _defined(body: list[ast.stmt]) -> Iterator[str]:
    """Names a module binds itself at top level (not by importing them), also under a
    run-time ``if`` or ``try``; what only exists under ``if TYPE_CHECKING:`` is left out."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            yield node.target.id
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from _defined(node.body)
                yield from _defined(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _defined(block)


def _python_files() -> Iterator[Path]:
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if not any(part in SKIPPED_DIRS or part.startswith(".") for part in parts[:-1]):
            yield path


def _imports_by_module() -> dict[str, dict[str, set[str]]]:
    """``{module stem: {imported name: {importing files}}}`` for ``from delayq... import``
    statements anywhere in the repository outside the module itself."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in _python_files():
        where = str(path.relative_to(ROOT))
        for node in ast.walk(_tree(path)):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
                continue
            if node.module == "delayq":
                # ``from delayq import buckets`` imports a module; any other name is the
                # package's own.
                for alias in node.names:
                    if alias.name not in MODULES:
                        found["__init__"][alias.name].add(where)
                continue
            package, _, stem = node.module.partition(".")
            if package != "delayq" or stem not in MODULES:
                continue
            if path.resolve() == (PACKAGE / f"{stem}.py").resolve():
                continue
            for alias in node.names:
                found[stem][alias.name].add(where)
    return found


IMPORTS = _imports_by_module()


def test_every_layer_module_is_checked() -> None:
    assert "store" in MODULES
    assert "queues" in MODULES
    assert "__init__" in MODULES
    # The scan sees the repository: the handlers and the tests import from the layer.
    assert IMPORTS["store"]
    assert len(MODULES) > 20


@pytest.mark.parametrize("stem", MODULES)
def test_all_names_only_what_the_module_defines(stem: str) -> None:
    module = importlib.import_module(_module_name(stem))
    declared = getattr(module, "__all__", None)
    assert isinstance(declared, list), f"{_module_name(stem)} has no __all__ list"
    assert all(isinstance(name, str) for name in declared)
    assert len(declared) == len(set(declared)), f"{_module_name(stem)}.__all__ repeats names"
    defined = set(_defined(_tree(PACKAGE / f"{stem}.py").body))
    private = [n for n in declared if n.startswith("_")]
    assert not private, f"private names in {_module_name(stem)}.__all__: {private}"
    foreign = [n for n in declared if n not in defined]
    assert not foreign, f"{_module_name(stem)}.__all__ names what it does not define: {foreign}"
    assert all(hasattr(module, name) for name in declared)


@pytest.mark.parametrize("stem", MODULES)
def test_all_covers_every_name_imported_from_the_module(stem: str) -> None:
    module = importlib.import_module(_module_name(stem))
    declared = set(getattr(module, "__all__", ()))
    missing = {
        name: sorted(files)
        for name, files in IMPORTS.get(stem, {}).items()
        if not name.startswith("_") and name not in declared
    }
    assert not missing, f"imported from {_module_name(stem)} but not in its __all__: {missing}"
