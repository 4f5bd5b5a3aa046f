"""A tenant is named by its id or its name everywhere a person names one (the command line,
the admin API, the console), and one that names no tenant is refused with nothing written,
on each database.

`enqueue --tenant acme` once stored tenant_id='acme': acme's API key could not see the
message, acme's hooks never fired and the console showed an orphan.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from hook_helpers import HOOKS_KEY
from mailbag.cli import app
from mailbag.store.schema import hook_endpoints, outbox_messages, suppressions
from test_console import PASSWORD, act, console, login

from conftest import TestDB
from helpers import count_rows, enqueue

runner = CliRunner()
ADMIN_TOKEN = "admin-token-for-tenant-names-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
UNKNOWN = "no tenant 'typo' (give its id or name"


@pytest.fixture
def cli(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_HOOKS_KEY", HOOKS_KEY)

    def invoke(*args: str) -> Any:
        return runner.invoke(app, list(args))

    return invoke


def tenants_of_messages(db: TestDB) -> list[str]:
    with db.engine.connect() as conn:
        return list(conn.execute(select(outbox_messages.c.tenant_id)).scalars())


def suppressed(db: TestDB) -> list[tuple[str, str]]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(suppressions.c.tenant_id, suppressions.c.email)).all()
    return [(row.tenant_id, row.email) for row in rows]


def refused(result: Any) -> None:
    assert result.exit_code == 2, result.output
    assert UNKNOWN in result.stderr


ENQUEUE = ["enqueue", "--to", "a@example.com", "--template", "welcome", "--data", '{"name":"A"}']


# --- the command line ------------------------------------------------------------------


def test_enqueue_stores_the_tenants_id_whether_given_its_name_or_its_id(cli, db):
    acme, _ = new_tenant(db, "acme")
    assert cli(*ENQUEUE, "--tenant", "acme").exit_code == 0
    assert cli(*ENQUEUE, "--tenant", acme).exit_code == 0
    assert cli(*ENQUEUE).exit_code == 0  # `default` needs no tenant row
    assert sorted(tenants_of_messages(db)) == sorted([acme, acme, "default"])


@pytest.mark.parametrize("command", ["enqueue", "send-bulk"])
def test_a_tenant_nobody_has_exits_2_and_writes_nothing(cli, db, tmp_path, command):
    new_tenant(db, "acme")
    if command == "enqueue":
        result = cli(*ENQUEUE, "--tenant", "typo")
    else:
        people = tmp_path / "people.csv"
        people.write_text("to,name\nada@example.com,Ada\n")
        result = cli("send-bulk", str(people), "--template", "welcome", "--tenant", "typo")
    refused(result)
    assert count_rows(db) == (0, 0)


def test_a_sender_added_by_name_is_used_by_an_enqueue_by_name(cli, db):
    # `tenants senders add acme ...` then `enqueue --tenant acme --from ...` was refused,
    # advising the very command just run: the enqueue looked for a tenant with id 'acme'.
    acme, _ = new_tenant(db, "acme")
    added = cli("tenants", "senders", "add", "acme", "billing@acme.example")
    assert added.exit_code == 0, added.output
    sent = cli(*ENQUEUE, "--tenant", "acme", "--from", "billing@acme.example")
    assert sent.exit_code == 0, sent.output
    assert tenants_of_messages(db) == [acme]


def test_suppressions_name_the_tenant_by_name_or_id_and_refuse_an_unknown_one(cli, db):
    acme, _ = new_tenant(db, "acme")
    assert cli("suppressions", "add", "acme", "ann@example.com").exit_code == 0
    assert suppressed(db) == [(acme, "ann@example.com")]
    listed = cli("suppressions", "list", "--tenant", "acme")
    assert listed.exit_code == 0 and listed.stdout.startswith(f"{acme}\tann@example.com")
    refused(cli("suppressions", "add", "typo", "bob@example.com"))
    refused(cli("suppressions", "list", "--tenant", "typo"))
    refused(cli("suppressions", "remove", "typo", "ann@example.com"))
    assert suppressed(db) == [(acme, "ann@example.com")]
    assert cli("suppressions", "remove", acme, "ann@example.com").exit_code == 0
    assert suppressed(db) == []


def test_hooks_and_senders_refuse_a_tenant_nobody_has(cli, db):
    new_tenant(db, "acme")
    refused(cli("hooks", "add", "typo", "https://hooks.acme.example/mailbag", "-e", "sent"))
    refused(cli("hooks", "list", "--tenant", "typo"))
    refused(cli("hooks", "deliveries", "--tenant", "typo"))
    refused(cli("tenants", "senders", "add", "typo", "billing@acme.example"))
    with db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(hook_endpoints)).scalar_one() == 0


@pytest.mark.parametrize("name", ["default", "t_0123456789abcdef"])
def test_a_tenant_cannot_be_named_as_another_is_identified(cli, db, name):
    created = cli("tenants", "create", name)
    assert created.exit_code == 1 and "names a tenant by id already" in created.stderr
    assert cli("tenants", "list").stdout == ""


# --- the admin API ---------------------------------------------------------------------


def admin_api(db: TestDB) -> Any:
    return api_client(db, admin_token=ADMIN_TOKEN)


def not_found(answer: Any) -> None:
    assert answer.status_code == 404, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert UNKNOWN in answer.json()["detail"]


async def test_the_admin_api_takes_a_tenants_name_wherever_it_takes_its_id(db):
    acme, _ = new_tenant(db, "acme")
    other, _ = new_tenant(db, "other")
    (mine,) = enqueue(db, tenant_id=acme)
    enqueue(db, tenant_id=other)
    async with admin_api(db) as api:
        for named in ("acme", acme):
            listed = await api.get("/v1/admin/messages", params={"tenant_id": named}, headers=AUTH)
            assert [m["id"] for m in listed.json()["items"]] == [str(mine.id)], listed.text
        body = {"tenant_id": "acme", "email": "ann@example.com"}
        added = await api.post("/v1/admin/suppressions", json=body, headers=AUTH)
        assert added.status_code == 201, added.text
        assert suppressed(db) == [(acme, "ann@example.com")]
        only = await api.get("/v1/admin/suppressions", params={"tenant_id": "acme"}, headers=AUTH)
        assert [s["tenant_id"] for s in only.json()] == [acme]
        removed = await api.delete("/v1/admin/suppressions/acme/ann@example.com", headers=AUTH)
        assert removed.status_code == 200 and suppressed(db) == []
        requeued = await api.post("/v1/admin/requeue", json={"tenant_id": "acme"}, headers=AUTH)
        assert requeued.json() == {"requeued": 0}


async def test_the_admin_api_answers_404_for_a_tenant_nobody_has_and_writes_nothing(db):
    new_tenant(db, "acme")
    async with admin_api(db) as api:
        typo = {"tenant_id": "typo"}
        not_found(await api.get("/v1/admin/messages", params=typo, headers=AUTH))
        not_found(await api.get("/v1/admin/suppressions", params=typo, headers=AUTH))
        body = {**typo, "email": "ann@example.com"}
        not_found(await api.post("/v1/admin/suppressions", json=body, headers=AUTH))
        not_found(await api.delete("/v1/admin/suppressions/typo/ann@example.com", headers=AUTH))
        not_found(await api.post("/v1/admin/requeue", json=typo, headers=AUTH))
        sender = {"address": "billing@acme.example"}
        not_found(await api.post("/v1/admin/tenants/typo/senders", json=sender, headers=AUTH))
        # Without the token nothing is looked up: a stranger learns no tenant's name.
        assert (await api.get("/v1/admin/messages", params=typo)).status_code == 401
    assert suppressed(db) == []


# --- the console -----------------------------------------------------------------------


async def test_the_console_shows_tenant_names_and_filters_by_name_or_id(db):
    acme, _ = new_tenant(db, "acme")
    (mine,) = enqueue(db, tenant_id=acme)
    (orphan,) = enqueue(db, tenant_id="acme-typo")  # written before tenants were checked
    async with console(db) as client:
        everything = (await client.get("/admin/messages")).text
        assert f"acme ({acme})" in everything
        assert "acme-typo (no such tenant)" in everything
        for named in ("acme", acme):
            page = await client.get("/admin/messages", params={"tenant": named})
            assert page.status_code == 200
            shown = set(re.findall(r'href="/admin/messages/([0-9a-f-]{36})"', page.text))
            assert shown == {str(mine.id)}
        detail = (await client.get(f"/admin/messages/{mine.id}")).text
        assert f"acme ({acme})" in detail
        typo = await client.get("/admin/messages", params={"tenant": "typo"})
        assert typo.status_code == 400 and "no tenant has this id or name" in typo.text
        assert str(orphan.id) not in typo.text


async def test_console_suppressions_take_a_tenants_name_and_refuse_an_unknown_one(db):
    acme, _ = new_tenant(db, "acme")
    async with console(db) as client:
        done = await act(client, "/admin/suppressions/add", tenant="acme", email="ann@example.com")
        assert done.status_code == 303, done.text
        assert suppressed(db) == [(acme, "ann@example.com")]
        page = await client.get("/admin/suppressions", params={"tenant": "acme"})
        assert page.status_code == 200 and f"acme ({acme})" in page.text
        typo = await client.get("/admin/suppressions", params={"tenant": "typo"})
        assert typo.status_code == 400 and "no tenant has this id or name" in typo.text
        asked = await act(client, "/admin/suppressions/add", tenant="typo", email="bob@example.com")
        assert asked.status_code == 400 and "no tenant &#39;typo&#39; (give its id" in asked.text
        bulk = await act(client, "/admin/messages/bulk-requeue", state="dead", tenant="typo")
        assert bulk.status_code == 400 and "no tenant has this id or name" in bulk.text
    assert suppressed(db) == [(acme, "ann@example.com")]


async def test_the_console_hooks_page_filters_deliveries_by_a_tenants_name(db):
    new_tenant(db, "acme")
    async with api_client(db, admin_password=PASSWORD, hooks_key=HOOKS_KEY) as client:
        await login(client)
        assert (await client.get("/admin/hooks", params={"tenant": "acme"})).status_code == 200
        typo = await client.get("/admin/hooks", params={"tenant": "typo"})
        assert typo.status_code == 400 and "no tenant has this id or name" in typo.text
