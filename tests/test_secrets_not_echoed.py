"""A bad setting is refused by name, never by value: secrets (SECRET_SETTINGS, and database
URLs, which may carry a password) appear in no error the command line or the API prints.

pydantic's own text quotes the input (`input_value='...'`); `mailbag serve` with a short
ADMIN_PASSWORD once printed the password.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mailbag.api.app import app_from_environment
from mailbag.settings import SECRET_SETTINGS, InvalidSettings
from servers import mailbag_env

TIMEOUT = 60  # a bound on a loaded machine
MARKER = "pa55-do-not-print-7Qx"


def run_mailbag(folder: Path, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    url = settings.pop("database_url", f"sqlite:///{folder / 'mailbag.db'}")
    env = mailbag_env(url, **settings)
    env["MAILBAG_CONFIG"] = str(folder / "mailbag.toml")
    if "secret_key" not in settings:  # the environment wins: leave the TOML file its say
        env.pop("MAILBAG_SECRET_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "mailbag", *args],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def assert_refused_without_the_value(
    result: subprocess.CompletedProcess[str], setting: str, value: str
) -> None:
    printed = result.stdout + result.stderr
    assert result.returncode == 2, printed
    assert value not in printed, printed
    assert "input_value" not in printed, printed
    assert f"mailbag: invalid settings: {setting} (MAILBAG_{setting.upper()}):" in result.stderr


@pytest.mark.parametrize("setting", SECRET_SETTINGS)
def test_a_secret_of_the_wrong_type_is_refused_by_name_and_never_printed(tmp_path, setting):
    # From a TOML file a secret can be a list: pydantic's message would quote all of it.
    (tmp_path / "mailbag.toml").write_text(f'{setting} = ["{MARKER}"]\n')
    result = run_mailbag(tmp_path, "stats", "--json")
    assert_refused_without_the_value(result, setting, MARKER)


@pytest.mark.parametrize(
    ("setting", "too_short"),
    [
        ("admin_password", f"{MARKER}"[:11]),
        ("hooks_key", f"{MARKER}-{MARKER}"[:31]),
        ("secret_key", f"{MARKER}-{MARKER}"[:31]),
    ],
)
@pytest.mark.parametrize("command", ["serve", "stats"])
def test_a_secret_too_short_is_refused_by_name_and_never_printed(
    tmp_path, setting, too_short, command
):
    assert setting in SECRET_SETTINGS
    result = run_mailbag(tmp_path, command, **{setting: too_short})
    assert_refused_without_the_value(result, setting, too_short)
    assert "must be at least" in result.stderr
    assert not (tmp_path / "mailbag.db").exists()  # refused before anything was written


@pytest.mark.parametrize("setting", ["database_url", "listen_url", "migrate_url"])
@pytest.mark.parametrize(
    "url",
    [
        f"oracle://ann:{MARKER}@db.example/mail",  # a scheme mailbag cannot serve
        f"postgresql://ann:{MARKER}@db.example:port/mail",  # a port that is no number
        f"ann:{MARKER}@db.example/mail",  # no scheme: SQLAlchemy cannot parse it
    ],
    ids=["scheme", "port", "unparsable"],
)
def test_a_database_url_that_cannot_be_used_is_refused_without_its_password(tmp_path, setting, url):
    result = run_mailbag(tmp_path, "stats", "--json", **{setting: url})
    assert_refused_without_the_value(result, setting, MARKER)


def test_the_api_built_from_the_environment_names_a_bad_secret_and_not_its_value(monkeypatch):
    # uvicorn's worker processes build their app here; their error reaches the log.
    monkeypatch.setenv("MAILBAG_HOOKS_KEY", MARKER)
    with pytest.raises(InvalidSettings) as refused:
        app_from_environment()
    assert "MAILBAG_HOOKS_KEY" in str(refused.value) and MARKER not in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
