"""`mailbag --help` and every command's help read as a person expects: values named by what
they are (ADDRESS, N, FILE), never by a Python type (`<list[str]>`, `<int range>`,
`{file}`), and every command's summary whole, never cut with "...".
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from mailbag.cli import app

runner = CliRunner()
PYTHON_TYPE = re.compile(r"<[^>\s]*>|<\w+ range>|\{[a-z_]+\}")


def commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command and group of the real app, with the words that call it."""
    found = [(path, group)]
    for name, command in getattr(group, "commands", {}).items():
        found += commands(command, (*path, name))
    return found


EVERY = commands(typer.main.get_command(app))


def help_of(*words: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "mailbag", *words, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_readable(text: str) -> None:
    assert not PYTHON_TYPE.search(text), PYTHON_TYPE.search(text)
    assert "…" not in text and "...\n" not in text.replace("COMMAND [ARGS]...\n", "")


def sentence(doc: str) -> str:
    """A docstring's first sentence, as help wraps it (whitespace aside)."""
    words = doc.split("\n\n")[0].split()
    end = next(i for i, word in enumerate([*words, "."]) if word.endswith("."))
    return " ".join(words[: end + 1])


@pytest.mark.parametrize("words", [(), ("enqueue",), ("send-bulk",), ("hooks",), ("api",)])
def test_the_help_a_person_runs_names_values_and_keeps_summaries_whole(words):
    text = help_of(*words)
    assert_readable(text)
    if words == ("enqueue",):
        assert "--to ADDRESS" in text and "--data JSON" in text
    if words == ("send-bulk",):
        assert "Usage: mailbag send-bulk [OPTIONS] FILE\n" in text


def test_every_command_is_listed_with_its_whole_first_sentence():
    flat = " ".join(help_of().split())
    for path, command in EVERY:
        if len(path) == 1 and command.callback is not None and command.callback.__doc__:
            assert sentence(command.callback.__doc__) in flat, path


@pytest.mark.parametrize("path", [path for path, _ in EVERY], ids=" ".join)
def test_no_command_shows_a_python_type_or_a_cut_summary(path):
    result = runner.invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert_readable(result.stdout)


def test_version_prints_the_package_version():
    result = subprocess.run(
        [sys.executable, "-m", "mailbag", "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert result.stdout == f"mailbag {version('mailbag')}\n"
