"""CHANGELOG.md keeps up with the version: its newest section is what `mailbag --version`
prints (the version pyproject.toml gives the package), and every section starts with what
a user must change first."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"


def sections() -> list[tuple[str, str]]:
    """Each release's version and text, newest first."""
    parts = re.split(r"^## (\S+)[^\n]*\n", CHANGELOG.read_text(), flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_the_version_mailbag_prints_is_the_changelogs_newest_section() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "mailbag", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    newest, _ = sections()[0]
    assert printed == f"mailbag {newest}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == newest


def test_the_changelog_is_newest_first_each_section_with_what_to_change_first() -> None:
    found = sections()
    versions = [tuple(int(n) for n in version.split(".")) for version, _ in found]
    assert len(versions) >= 2 and versions == sorted(versions, reverse=True)
    newest, text = found[0]
    # The newest section leads with what users must act on, before anything else.
    assert text.lstrip().split("\n### ", 1)[1].startswith("What you must change first")
    for contract in ("SECRET_KEY", "HOOK_ALLOW_PRIVATE_NETWORKS", "API_MAX_CONNECTIONS", "0014"):
        assert contract in text, (newest, contract)
