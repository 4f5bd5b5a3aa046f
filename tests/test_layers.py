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
    assert {"mailbag.console", "mailbag.store.migrate", "fastapi.FastAPI"} <= imports
    assert "mailbag.store.deployment" in imported_modules(PACKAGE / "runtime.py")  # in a function
