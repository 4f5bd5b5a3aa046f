"""The command line on each database: migrate, enqueue (idempotent), and bad input.

Only `migrate` and `serve` change the schema: every other command refuses a database whose
schema is missing or stale (side by side, they would race to migrate it).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from mailbag.cli import app
from mailbag.store import migrate
from mailbag.store.database import make_engine

from conftest import _server_database
from helpers import count_rows, events, get

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
    # The history says the CLI enqueued it (the keyed path runs the API's service).
    assert [e.actor for e in events(db, message_id)][:1] == ["cli"]
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


ENQUEUE_A = ["enqueue", "--to", "a@example.com", "--template", "welcome", "--data", '{"name":"A"}']


def test_a_key_reused_for_another_message_exits_2_as_the_api_answers_409(cli, db):
    # It exited 0 ("already enqueued: sent") where POST /v1/messages answers 409.
    acme, api_key = new_tenant(db, "acme")
    first = cli(*ENQUEUE_A, "--tenant", "acme", "--key", "k1")
    assert first.exit_code == 0, first.output
    again = cli(*ENQUEUE_A, "--tenant", "acme", "--key", "k1")
    assert again.exit_code == 0 and again.stdout == first.stdout
    assert "already enqueued this message" in again.stderr
    other = cli(*ENQUEUE_A[:-1], '{"name":"B"}', "--tenant", "acme", "--key", "k1")
    assert other.exit_code == 2, other.output
    words = "this Idempotency-Key was already used for a different request (POST /v1/messages)"
    assert words in other.stderr and "nothing was written" in other.stderr
    assert other.stdout == "" and count_rows(db) == (1, 1)
    # One rule, one record: the API replays the CLI's message and refuses the other body.
    body = {"to": "a@example.com", "template": "welcome", "data": {"name": "A"}}

    async def post_twice() -> tuple[Any, Any]:
        async with api_client(db, api_key) as api:
            key = {"Idempotency-Key": "k1"}
            same = await api.post("/v1/messages", json=body, headers=key)
            changed = {**body, "data": {"name": "B"}}
            return same, await api.post("/v1/messages", json=changed, headers=key)

    replayed, refused = asyncio.run(post_twice())
    assert replayed.json()["id"] == first.stdout.strip(), replayed.text
    assert refused.status_code == 409 and words in refused.json()["detail"]
    assert count_rows(db) == (1, 1) and get(db, uuid.UUID(first.stdout.strip())).tenant_id == acme


def test_text_and_html_take_the_content_itself_or_at_file(cli, db, tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<p>From a file, é</p>")
    base = ["enqueue", "--to", "a@example.com", "--subject", "s"]
    cases = [
        (["--text", "hi"], None, "hi"),  # once: "No such file or directory"
        (["--html", "<p>Hi</p>", "--text", "Hi"], "<p>Hi</p>", "Hi"),
        (["--html", f"@{page}", "--text", "@@home"], "<p>From a file, é</p>", "@home"),
    ]
    for args, html, text in cases:
        result = cli(*base, *args)
        assert result.exit_code == 0 and result.stderr == "", result.output
        stored = get(db, uuid.UUID(result.stdout.strip()))
        assert (stored.html, stored.text) == (html, text), args
    piped = runner.invoke(app, [*base, "--text", "@-"], input="from stdin\n")
    assert piped.exit_code == 0, piped.output
    assert get(db, uuid.UUID(piped.stdout.strip())).text == "from stdin\n"


def test_a_bare_path_to_a_file_is_still_read_with_a_warning_and_a_missing_file_is_refused(
    cli, db, tmp_path
):
    body = tmp_path / "body.txt"
    body.write_text("Read from the file.")
    base = ["enqueue", "--to", "a@example.com", "--subject", "s"]
    old = cli(*base, "--text", str(body))
    assert old.exit_code == 0, old.output
    assert f"write --text @{body}" in old.stderr
    assert get(db, uuid.UUID(old.stdout.strip())).text == "Read from the file."
    missing = cli(*base, "--text", f"@{tmp_path / 'nope.txt'}")
    assert missing.exit_code == 2 and "nope.txt: No such file or directory" in missing.stderr
    assert count_rows(db) == (1, 1)
