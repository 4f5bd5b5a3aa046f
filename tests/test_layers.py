"""Imports point downwards only (DESIGN.md's layers): each rule here is one that was broken
once. Read from the source, lazy imports inside functions included, so a rule holds for
every code path, not only for what one test run happened to load."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "mailbag"

# (importer, what it must not import, but for these): modules or packages, by dotted name
RULES: list[tuple[str, str, tuple[str, ...]]] = [
    ("mailbag.console", "mailbag.api", ()),  # the console and the API share mailbag.web
    ("mailbag.services", "mailbag.api", ()),
    ("mailbag.settings", "mailbag.store", ()),
    ("mailbag.settings", "mailbag.providers", ()),  # providers read settings, never back
    # Commands call services, never statements: the CLI only makes engines, and migrates.
    ("mailbag.cli", "mailbag.store", ("mailbag.store.database", "mailbag.store.migrate")),
    # The HTTP client is installed beside applications: it imports nothing of the server.
    ("mailbag.client", "mailbag", ("mailbag.client",)),
]


def sources(name: str) -> list[Path]:
    path = PACKAGE.joinpath(*name.split(".")[1:])
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def imported_modules(path: Path) -> set[str]:
    """Every name an import brings in, dotted: `import m` gives m, `from m import n` gives
    m.n (n may be a module or a name in m). mailbag imports absolutely."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


@pytest.mark.parametrize(
    ("importer", "forbidden", "allowed"), RULES, ids=[f"{r[0]} !> {r[1]}" for r in RULES]
)
def test_a_layer_imports_nothing_from_the_one_it_must_not(
    importer: str, forbidden: str, allowed: tuple[str, ...]
) -> None:
    paths = sources(importer)
    assert paths and all(p.exists() for p in paths)  # the rule names real modules
    broken = {
        str(path.relative_to(PACKAGE)): sorted(
            m
            for m in imported_modules(path)
            if within(m, forbidden) and not any(within(m, a) for a in allowed)
        )
        for path in paths
    }
    assert {where: found for where, found in broken.items() if found} == {}


def test_the_check_sees_imports_of_each_kind() -> None:
    # Guards the test above against finding nothing.
    imports = imported_modules(PACKAGE / "api" / "app.py")
    assert {"mailbag.console", "fastapi.FastAPI"} <= imports
    assert "mailbag.store.migrate" in imported_modules(PACKAGE / "api" / "health.py")
    assert "mailbag.store.deployment" in imported_modules(PACKAGE / "runtime.py")  # in a function


# --- the import graph: no circles, between files or between rooms -------------------------


def module_of(path: Path) -> str:
    parts = ["mailbag", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports (any import: at
    the top, inside a function, under TYPE_CHECKING), `from a import b` meaning the
    module a.b when there is one, else a."""
    paths = [p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts]
    modules = {module_of(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imported_modules(path):
            if not imported.startswith("mailbag"):
                continue
            target = imported if imported in modules else imported.rpartition(".")[0]
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
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


def room_of(module: str) -> str:
    """A folder directly under the package, or a module at its top: one room each."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_module_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_no_room_imports_one_that_imports_it_back():
    # With no circle between rooms every arrow can run downwards: the layers of DESIGN.md.
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        rooms.setdefault(room_of(module), set()).update(
            room_of(t) for t in targets if room_of(t) != room_of(module)
        )
    assert circles(rooms) == []


def test_the_graph_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


LONGEST_FUNCTION = 80  # lines, from `def` to its last line


def test_every_function_reads_on_one_screen():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    too_long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({length})")
    assert too_long == []
