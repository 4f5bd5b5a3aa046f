"""What `pip install .` brings: every package mailbag imports is one it declares.

A dependency that only arrives through the test extras keeps CI green while a plain install
cannot start (the console once imported itsdangerous, the SES events cryptography, neither
declared). `.ci/first-run` proves the same end to end in a fresh virtualenv.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "mailbag"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_distributions() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        normalized(re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }


def imported_top_level_modules() -> dict[str, set[str]]:
    """Each third-party top-level module imported anywhere in the package, and where."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top != "mailbag" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_a_declared_dependency():
    declared = declared_distributions()
    providers = packages_distributions()
    undeclared = {
        module: sorted(where)
        for module, where in imported_top_level_modules().items()
        if not {normalized(d) for d in providers.get(module, [module])} & declared
    }
    assert undeclared == {}, f"imported but not in [project.dependencies]: {undeclared}"


def test_the_check_sees_the_imports_it_must():
    # Guards the test above against finding nothing: these are imported today.
    modules = imported_top_level_modules()
    assert {"sqlalchemy", "fastapi", "itsdangerous", "cryptography"} <= modules.keys()
