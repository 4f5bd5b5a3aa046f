"""The command line on each database: migrate, enqueue (idempotent), and bad input.

Only `migrate` and `serve` change the schema: every other command refuses a database whose
schema is missing or stale (side by side, they would race to migrate it).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect
from typer.testing import CliRunner

from mailbag.cli import app
from mailbag.store import migrate
from mailbag.store.database import make_engine

from conftest import _server_database
from helpers import count_rows

runner = CliRunner()


@pytest.fixture
def cli(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke


def test_migrate_then_enqueue_prints_the_same_id_for_the_same_key(cli, db):
    assert cli("migrate").exit_code == 0
    args = [
        "enqueue",
        "--to",
        "a@example.com",
        "--template",
        "welcome",
        "--data",
        '{"name":"A"}',
        "--key",
        "k1",
    ]
    first = cli(*args)
    again = cli(*args)
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    message_id = uuid.UUID(first.stdout.strip())
    assert again.stdout.strip() == str(message_id)
    assert count_rows(db) == (1, 1)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--to", "x@y\r\nBcc: z@w"], "header injection"),
        (["--to", "not-an-address"], "not a valid email address"),
        (["--subject", "s" * 600], "limit is 500"),
        (["--data", "{not json"], "not valid JSON"),
        (["--template", "missing"], "unknown template"),
        (["--header", "X-Bad"], "Name: value"),
        (["--send-at", "tomorrow"], "ISO 8601"),
        # Valid to the parsers, refused by the databases: caught before anything is written.
        (["--data", '{"name":"A","x":"\\u0000"}'], "NUL"),
        (["--data", '{"name":"A","\\ud800":1}'], "lone surrogate"),
        (["--data", '{"name":"A","x":' + "[" * 300 + "]" * 300 + "}"], "nested more than"),
        (["--send-at", "9999-12-31T23:00:00-05:00"], "between the years 1000 and 9999"),
        (["--send-at", "0001-01-01T00:00:00+01:00"], "between the years 1000 and 9999"),
    ],
)
def test_bad_input_exits_non_zero_and_writes_nothing(cli, db, args, complaint):
    base = {"--to": "a@example.com", "--template": "welcome", "--data": '{"name":"A"}'}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = cli("enqueue", *[part for pair in base.items() for part in pair])
    assert result.exit_code == 2
    assert complaint in result.stderr
    assert count_rows(db) == (0, 0)


def test_requeue_and_cancel_report_what_they_could_not_do(cli, db):
    enqueued = cli(
        "enqueue", "--to", "a@example.com", "--template", "welcome", "--data", '{"name":"A"}'
    )
    message_id = enqueued.stdout.strip()
    assert cli("requeue", message_id).exit_code == 1  # pending: nothing to requeue
    assert cli("requeue", "not-a-uuid").exit_code == 2
    assert cli("requeue", "--state", "sent").exit_code == 2
    assert cli("cancel", message_id).exit_code == 0
    assert cli("cancel", message_id).exit_code == 1  # already cancelled
    stats = cli("stats", "--json")
    assert '"cancelled": 1' in stats.stdout


def test_the_installed_command_runs(tmp_path):
    env = {"MAILBAG_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}", "PATH": "/usr/bin:/bin"}
    migrated = subprocess.run(
        [sys.executable, "-m", "mailbag", "migrate"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mailbag",
            "enqueue",
            "--to",
            "a@example.com",
            "--template",
            "welcome",
            "--data",
            '{"name":"A"}',
            "--key",
            "k",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    uuid.UUID(result.stdout.strip())


OPERATOR_COMMANDS = [
    ["enqueue", "--to", "a@example.com", "--template", "welcome", "--data", '{"name":"A"}'],
    ["tenants", "create", "acme"],
    ["tenants", "list"],
    ["stats", "--json"],
    ["requeue", "--state", "dead"],
    ["suppressions", "add", "default", "a@example.com"],
    ["purge"],
]


def refused_without_migrate(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", url)
    for args in OPERATOR_COMMANDS:
        result = runner.invoke(app, args)
        assert result.exit_code == 1, (args, result.output)
        assert "run `mailbag migrate` first" in result.stderr, (args, result.stderr)


@pytest.fixture(params=["postgresql", "mysql"])
def empty_server_url(request) -> Iterator[str]:
    with contextlib.contextmanager(_server_database)(request.param) as url:
        yield url


def test_commands_refuse_an_unmigrated_server_database_and_create_nothing(
    empty_server_url, monkeypatch
):
    refused_without_migrate(empty_server_url, monkeypatch)
    engine = make_engine(empty_server_url, null_pool=True)
    assert inspect(engine).get_table_names() == []  # not even alembic_version
    engine.dispose()


def test_commands_refuse_a_missing_sqlite_file_and_do_not_create_it(tmp_path, monkeypatch):
    database = tmp_path / "elsewhere.db"
    refused_without_migrate(f"sqlite:///{database}", monkeypatch)
    assert not database.exists()


def test_commands_refuse_a_stale_schema_and_name_both_revisions(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url, null_pool=True)
    migrate.upgrade(engine, "0001_outbox")
    engine.dispose()
    refused_without_migrate(url, monkeypatch)
    result = runner.invoke(app, ["tenants", "list"])
    assert "schema is at revision '0001_outbox'" in result.stderr, result.stderr
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    assert runner.invoke(app, ["tenants", "list"]).exit_code == 0


def test_long_running_commands_refuse_to_start_without_a_secret_key(tmp_path, monkeypatch):
    # With a database server there is no key file to fall back on: say what to set, at once.
    monkeypatch.delenv("MAILBAG_SECRET_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MAILBAG_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    for command in (["serve"], ["api"], ["worker"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, (command, result.output)
        assert "MAILBAG_SECRET_KEY is not set" in result.stderr, (command, result.stderr)
    assert list(Path(tmp_path).iterdir()) == []
