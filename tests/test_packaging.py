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


# Subpackages that only work with an extra installed (`pip install mailbag[django]`): what
# they import may come from that extra as well.
EXTRAS = {PACKAGE / "django": "django"}


def declared_distributions(extra: str | None = None) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + (project["optional-dependencies"][extra] if extra else [])
    return {normalized(re.split(r"[\s\[<>=!~;]", dep, maxsplit=1)[0]) for dep in deps}


def guarded_imports(tree: ast.AST) -> set[ast.AST]:
    """Imports inside `try: ... except ImportError`: optional by construction."""
    guarded: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"}
            for h in node.handlers
        ):
            guarded.update(n for stmt in node.body for n in ast.walk(stmt))
    return guarded


def imported_top_level_modules() -> dict[str, set[str]]:
    """Each third-party top-level module imported anywhere in the package, and where."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        optional = guarded_imports(tree)
        for node in ast.walk(tree):
            if node in optional:
                continue
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


def allowed_for(where: str) -> set[str]:
    for root, extra in EXTRAS.items():
        if (ROOT / where).is_relative_to(root):
            return declared_distributions(extra)
    return declared_distributions()


def test_every_imported_package_is_a_declared_dependency():
    providers = packages_distributions()
    undeclared = {
        module: sorted(bad)
        for module, where in imported_top_level_modules().items()
        if (
            bad := {
                w
                for w in where
                if not {normalized(d) for d in providers.get(module, [module])} & allowed_for(w)
            }
        )
    }
    assert undeclared == {}, f"imported but not in [project.dependencies]: {undeclared}"


def test_the_check_sees_the_imports_it_must():
    # Guards the test above against finding nothing: these are imported today.
    modules = imported_top_level_modules()
    assert {"sqlalchemy", "fastapi", "itsdangerous", "cryptography"} <= modules.keys()
    assert "django" in modules  # only the extra declares it: allowed under mailbag/django alone
    assert not allowed_for("src/mailbag/cli/__init__.py") >= {"django"}
