"""The command line on each database: migrate, enqueue (idempotent), and bad input."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from typer.testing import CliRunner

from mailbag.cli import app

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
