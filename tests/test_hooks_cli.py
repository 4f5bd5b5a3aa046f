"""`mailbag hooks` on each database: endpoints (the secret alone on stdout, once), their
changes, deliveries and the operator's replay; bad input exits 2, what cannot be done 1."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from api_helpers import new_tenant
from hook_helpers import HOOKS_KEY, sent_and_failed, settle_all
from mailbag.cli import app
from mailbag.domain.hooks import SecretBox, parse_secret
from mailbag.store.schema import hook_endpoints

runner = CliRunner()
URL = "https://hooks.acme.example/mailbag"


@pytest.fixture
def cli(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_HOOKS_KEY", HOOKS_KEY)

    def invoke(*args: str):
        return runner.invoke(app, ["hooks", *args])

    return invoke


def endpoint_count(db) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(hook_endpoints)).scalar_one())


def add(cli, tenant: str, *events: str) -> tuple[str, str]:
    """(endpoint id, secret)"""
    args = [part for event in events or ("sent",) for part in ("--event", event)]
    added = cli("add", tenant, URL, *args)
    assert added.exit_code == 0, added.output
    endpoint_id = added.stderr.split()[2]
    return str(uuid.UUID(endpoint_id)), added.stdout.strip()


def test_hooks_off_says_which_setting_and_exits_1(cli, db, monkeypatch):
    new_tenant(db)
    monkeypatch.delenv("MAILBAG_HOOKS_KEY")
    for args in (("list",), ("add", "acme", URL, "--event", "sent"), ("deliveries",)):
        result = cli(*args)
        assert result.exit_code == 1 and "MAILBAG_HOOKS_KEY" in result.stderr
    assert endpoint_count(db) == 0


def test_add_prints_the_secret_alone_once_and_stores_it_sealed(cli, db):
    tenant, _ = new_tenant(db, "acme")
    endpoint_id, secret = add(cli, "acme", "sent", "message.bounced")
    assert secret.startswith("whsec_") and parse_secret(secret)
    assert "\n" not in secret  # stdout is the secret and nothing else
    with db.engine.connect() as conn:
        stored = conn.execute(select(hook_endpoints.c.secret)).scalar_one()
    assert secret not in stored and SecretBox(HOOKS_KEY).open(stored) == secret

    listed = cli("list")
    assert listed.exit_code == 0
    (line,) = listed.stdout.splitlines()
    assert line.split("\t")[:5] == [endpoint_id, tenant, "enabled", "bounced,sent", URL]
    assert secret not in listed.output
    assert cli("list", "--tenant", "acme").stdout == listed.stdout
    assert cli("list", "--tenant", tenant).stdout == listed.stdout

    rotated = cli("rotate-secret", endpoint_id)
    assert rotated.exit_code == 0, rotated.output
    new_secret = rotated.stdout.strip()
    assert new_secret.startswith("whsec_") and new_secret != secret
    with db.engine.connect() as conn:
        stored = conn.execute(select(hook_endpoints.c.secret)).scalar_one()
    assert SecretBox(HOOKS_KEY).open(stored) == new_secret
    assert new_secret not in cli("list").output


def test_update_disable_enable_and_remove(cli, db):
    new_tenant(db, "acme")
    endpoint_id, _ = add(cli, "acme")
    changed = cli("update", endpoint_id, "--url", "https://other.example/h", "-e", "dead")
    assert changed.exit_code == 0, changed.output
    assert changed.stdout.split("\t")[3:5] == ["dead", "https://other.example/h"]
    off = cli("disable", endpoint_id)
    assert off.exit_code == 0 and "\tdisabled\t" in off.stdout
    assert "\tdisabled\t" in cli("list").stdout
    on = cli("enable", endpoint_id)
    assert on.exit_code == 0 and "\tenabled\t" in on.stdout
    assert cli("update", endpoint_id).exit_code == 2  # nothing to change

    removed = cli("remove", endpoint_id)
    assert removed.exit_code == 0 and endpoint_id in removed.stdout
    again = cli("remove", endpoint_id)
    assert again.exit_code == 1 and "no hook endpoint" in again.stderr
    assert cli("list").stdout == ""
    assert cli("disable", str(uuid.uuid4())).exit_code == 1


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["add", "acme", "http://hooks.acme.example/x", "-e", "sent"], "must use https://"),
        (["add", "acme", "https://u:p@hooks.acme.example/x", "-e", "sent"], "credentials"),
        (["add", "acme", URL, "-e", "sendt"], "unknown event(s) sendt"),
        (["add", "nobody", URL, "-e", "sent"], "no tenant 'nobody'"),
        (["add", "acme", URL], "--event"),
        (["update", "not-a-uuid", "--url", URL], "not an endpoint id"),
        (["deliveries", "--status", "lost"], "--status must be one of"),
        (["deliveries", "--event", "*"], "--event names one event"),
        (["deliveries", "--event", "opend"], "unknown event"),
        (["deliveries", "--cursor", "bogus!"], "--cursor"),
        (["deliveries", "--tenant", "nobody"], "no tenant 'nobody'"),
        (["replay", "nope"], "not a delivery id"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(cli, db, args, complaint):
    new_tenant(db, "acme")
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert complaint in result.stderr
    assert endpoint_count(db) == 0


def test_deliveries_are_listed_shown_and_replayed(cli, db):
    tenant, _ = new_tenant(db, "acme")
    endpoint_id, _ = add(cli, "acme", "sent", "failed")
    messages = sent_and_failed(db, tenant, n_sent=2, n_failed=1)

    listed = cli("deliveries", "--tenant", "acme")
    assert listed.exit_code == 0, listed.output
    lines = [line.split("\t") for line in listed.stdout.splitlines()]
    assert len(lines) == 3
    assert {line[6] for line in lines} == {str(m.id) for m in messages}
    assert all(line[1] == "pending" and line[3] == "0 made, 8 left" for line in lines)
    failed = cli("deliveries", "--event", "failed", "--endpoint", endpoint_id)
    assert [line.split("\t")[6] for line in failed.stdout.splitlines()] == [str(messages[2].id)]
    first = cli("deliveries", "--limit", "2")
    assert len(first.stdout.splitlines()) == 2
    cursor = first.stderr.split("--cursor ")[1].strip()
    rest = cli("deliveries", "--limit", "2", "--cursor", cursor)
    assert len(rest.stdout.splitlines()) == 1 and "--cursor" not in rest.stderr
    assert cli("deliveries", "--status", "dead").stdout == ""

    delivery_id = lines[0][0]
    early = cli("replay", delivery_id)
    assert early.exit_code == 1 and "only delivered or dead" in early.stderr

    assert settle_all(db) == 3
    dead = cli("deliveries", "--status", "dead")
    assert len(dead.stdout.splitlines()) == 3 and "\t410\t" in dead.stdout
    replayed = cli("replay", delivery_id)
    assert replayed.exit_code == 0, replayed.output
    assert f"replayed {delivery_id}: pending" in replayed.stdout
    shown = cli("delivery", delivery_id)
    assert shown.exit_code == 0, shown.output
    assert '"type":"message.' in shown.stdout  # the body it POSTs
    assert "processing -> dead\tattempt 1 HTTP 410" in shown.stdout
    assert "dead -> pending" in shown.stdout and "operator:cli" in shown.stdout
    assert cli("delivery", str(uuid.uuid4())).exit_code == 1
    assert cli("replay", str(uuid.uuid4())).exit_code == 1
