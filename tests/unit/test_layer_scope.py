"""The layer is what Lambda runs: every module of ``delayq`` (layers/delayq/delayq/, shipped in
every function's layer) is imported by a handler (``functions/*/app.py``), directly or through
other layer modules. Operator tooling that no function uses lives in the CLI package
(``local/delayq_local/``), which imports the layer; the layer never imports it.

Only the imports that run when a handler is loaded count: those at a module's top level (under
a run-time ``if`` or ``try`` too), not those under ``if TYPE_CHECKING:`` (never run) nor those
inside a function body. A layer module reached only by an import inside a function is reached
only when that function runs, and that is how operator code once hid in the layer:
``runtime.redrive_services``, which only the CLI called, imported ``redrive`` (and with it
``stream_failures`` and ``pacing``) lazily.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = ROOT / "layers" / "delayq" / "delayq"
FUNCTIONS = ROOT / "functions"
PACKAGE = "delayq"
CLI_PACKAGE = "delayq_local"


def layer_modules(folder: Path = LAYER, package: str = PACKAGE) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the layer package (the package itself too)."""
    found: dict[str, Path] = {}
    for path in folder.rglob("*.py"):
        parts = [package, *path.relative_to(folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time_imports(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module with this body is imported: top level,
    also under a run-time ``if``, ``try`` or ``with``; not under ``if TYPE_CHECKING:``, not in
    a function or class body (a class body runs, but the layer imports nothing there)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from load_time_imports(node.body)
            yield from load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from load_time_imports(block)
        elif isinstance(node, ast.With):
            yield from load_time_imports(node.body)


def imported_modules(path: Path, name: str, known: Mapping[str, Path]) -> set[str]:
    """The layer modules a file (module ``name``; a handler's name is not in ``known``) loads
    when it is imported. Importing ``a.b.c`` also runs the packages ``a`` and ``a.b``;
    ``from a import b`` loads the module ``a.b`` when there is one."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in load_time_imports(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{anchor}.{base}" if base else anchor
        targets.add(base)
        targets.update(f"{base}.{alias.name}" for alias in node.names)
    found: set[str] = set()
    for target in targets:
        parts = target.split(".")
        found.update(
            module
            for module in (".".join(parts[:n]) for n in range(1, len(parts) + 1))
            if module in known
        )
    return found


def reachable(starts: Iterable[Path], known: Mapping[str, Path]) -> set[str]:
    """The layer modules loaded by importing the files ``starts`` (the handlers)."""
    todo = [m for start in starts for m in imported_modules(start, "__main__", known)]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(imported_modules(known[module], module, known))
    return seen


def handlers(folder: Path = FUNCTIONS) -> list[Path]:
    return sorted(folder.glob("*/app.py"))


def test_the_handlers_are_found_and_reach_the_layer() -> None:
    found = handlers()
    # One app.py per function folder, and the walk sees what every handler imports.
    assert [p.parent.name for p in found] == sorted(
        p.name for p in FUNCTIONS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
    )
    assert len(found) >= 5
    reached = reachable(found, layer_modules())
    assert {"delayq", "delayq.runtime", "delayq.cleanup", "delayq.store"} <= reached


def test_every_layer_module_is_imported_by_a_function() -> None:
    known = layer_modules()
    unused = sorted(set(known) - reachable(handlers(), known))
    assert not unused, (
        f"imported by no function (functions/*/app.py, through the layer's load-time imports): "
        f"{unused}; operator tooling belongs in the CLI package, local/delayq_local/"
    )


def test_the_layer_never_imports_the_cli_package() -> None:
    offending: dict[str, list[str]] = {}
    for name, path in layer_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            offending.setdefault(name, []).extend(
                t for t in targets if t.split(".")[0] == CLI_PACKAGE
            )
    assert {name: found for name, found in offending.items() if found} == {}


# The check itself, on a small layer and handler written for it.
_FAKE_LAYER = {
    "__init__.py": "",
    "used.py": "from delayq import helper\n",
    "helper.py": "import json\n",
    "typed.py": "x = 1\n",
    "lazy.py": "y = 2\n",
    "orphan.py": "from delayq import used\n",
    "sub/__init__.py": "",
    "sub/deep.py": "",
}
_FAKE_HANDLER = """
from typing import TYPE_CHECKING
from delayq.used import something
import delayq.sub.deep
if TYPE_CHECKING:
    from delayq import typed

def handler(event, context):
    from delayq import lazy
"""


@pytest.fixture
def fake(tmp_path: Path) -> tuple[list[Path], dict[str, Path]]:
    for relative, text in _FAKE_LAYER.items():
        path = tmp_path / "delayq" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    app = tmp_path / "functions" / "one" / "app.py"
    app.parent.mkdir(parents=True)
    app.write_text(_FAKE_HANDLER)
    return handlers(tmp_path / "functions"), layer_modules(tmp_path / "delayq")


def test_the_walk_reports_a_module_no_handler_loads(
    fake: tuple[list[Path], dict[str, Path]],
) -> None:
    starts, known = fake

    reached = reachable(starts, known)

    assert reached == {"delayq", "delayq.used", "delayq.helper", "delayq.sub", "delayq.sub.deep"}
    # Imported by nothing a handler loads (it imports a used module: that does not count), only
    # for type checking, only inside a function.
    assert set(known) - reached == {"delayq.orphan", "delayq.typed", "delayq.lazy"}
