"""Every API and worker replica must have the same secret key: the first start records a
check value of it in the database, and a start with another key refuses, saying what to do,
until `mailbag migrate --accept-new-key` makes the new key the expected one."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
import uvicorn
from sqlalchemy import select
from typer.testing import CliRunner

from api_helpers import TEST_SECRET_KEY, settings_for
from mailbag import runtime
from mailbag.cli import app
from mailbag.store.schema import deployment

OTHER_KEY = "another-secret-key-not-for-production-9876543210"
runner = CliRunner()


def stored_rows(db) -> list[tuple[int, str]]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(deployment.c.id, deployment.c.key_check))]


def test_the_first_start_records_the_key_and_the_same_key_starts_again(db):
    assert stored_rows(db) == []
    runtime.check_key(settings_for(db))
    rows = stored_rows(db)
    assert len(rows) == 1 and rows[0][0] == 1
    runtime.check_key(settings_for(db))  # another replica, or a restart, with the same key
    assert stored_rows(db) == rows


def test_a_different_key_refuses_to_start_and_changes_nothing(db):
    runtime.check_key(settings_for(db))
    recorded = stored_rows(db)
    with pytest.raises(runtime.CannotStart, match="differs from the key this database") as exc:
        runtime.check_key(settings_for(db, secret_key=OTHER_KEY))
    assert "mailbag migrate --accept-new-key" in str(exc.value)
    assert stored_rows(db) == recorded
    runtime.check_key(settings_for(db))  # the original key still starts


def test_the_check_value_tells_keys_apart_and_does_not_contain_the_key(db):
    runtime.check_key(settings_for(db))
    [(_, stored)] = stored_rows(db)
    assert stored == runtime.key_check(TEST_SECRET_KEY.encode())
    assert stored != runtime.key_check(OTHER_KEY.encode())
    assert len(stored) == 64
    assert TEST_SECRET_KEY not in stored and TEST_SECRET_KEY.encode().hex() not in stored


@pytest.fixture
def cli_env(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the file provider's folder, were anything to start
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_LOG_LEVEL", "WARNING")
    monkeypatch.setenv("MAILBAG_SECRET_KEY", TEST_SECRET_KEY)
    return monkeypatch


def test_serve_api_and_worker_refuse_another_key_until_migrate_accepts_it(db, cli_env):
    runtime.check_key(settings_for(db))  # the deployment's first start
    recorded = stored_rows(db)
    cli_env.setenv("MAILBAG_SECRET_KEY", OTHER_KEY)

    def started(*args: Any, **kwargs: Any) -> NoReturn:  # fail, rather than serve forever
        raise AssertionError("started with another key")

    cli_env.setattr(runtime, "run_serve", started)
    cli_env.setattr(runtime, "run_worker", started)
    cli_env.setattr(uvicorn, "run", started)
    for command in (["serve"], ["api"], ["worker"]):
        result = runner.invoke(app, command)
        assert isinstance(result.exception, SystemExit), (command, result.exception)
        assert result.exit_code == 1, (command, result.output)
        assert "differs from the key this database was first used with" in result.stderr
        assert "--accept-new-key" in result.stderr
    assert stored_rows(db) == recorded

    result = runner.invoke(app, ["migrate", "--accept-new-key"])
    assert result.exit_code == 0, result.output
    assert "no longer work" in result.stderr  # the warning about codes and sessions
    runtime.check_key(settings_for(db, secret_key=OTHER_KEY))  # the new key starts now
    with pytest.raises(runtime.CannotStart, match="differs"):
        runtime.check_key(settings_for(db))  # and the old one no longer does
    assert stored_rows(db) == [(1, runtime.key_check(OTHER_KEY.encode()))]


def test_migrate_accept_new_key_records_a_key_on_a_database_without_one(db, cli_env):
    result = runner.invoke(app, ["migrate", "--accept-new-key"])
    assert result.exit_code == 0, result.output
    assert stored_rows(db) == [(1, runtime.key_check(TEST_SECRET_KEY.encode()))]


def test_plain_migrate_leaves_the_recorded_key_alone(db, cli_env):
    runtime.check_key(settings_for(db))
    recorded = stored_rows(db)
    cli_env.setenv("MAILBAG_SECRET_KEY", OTHER_KEY)
    assert runner.invoke(app, ["migrate"]).exit_code == 0
    assert stored_rows(db) == recorded
