"""Tenants' own provider accounts on each database: set, shown (keys, never a secret's
value), replaced and removed through the CLI, the admin API and the console; sealed at
rest (the raw row holds no credential); bad input refused by name, never echoed, with
nothing changed; and what a worker reads (`accounts`), where one tenant's unreadable
account leaves every other tenant's alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from typer.testing import CliRunner

from api_helpers import TEST_SECRET_KEY, api_client, new_tenant, settings_for
from mailbag.api import create_app
from mailbag.cli import app
from mailbag.domain.hooks import SecretBox
from mailbag.services import tenant_accounts as accounts
from mailbag.store.schema import tenant_accounts
from mailbag.store.session import AsyncDatabase
from servers import uvicorn_thread
from test_console import PASSWORD, csrf_in, login, token
from test_console_browser import ARTIFACTS, chromium, log_in  # noqa: F401 - a fixture
from test_console_browser import PASSWORD as BROWSER_PASSWORD
from test_hooks_api import problem

from conftest import TestDB

SECRET = "pm-live-token-7c41d9e05b"  # the account's API key: it must surface nowhere
OTHER_SECRET = "sg-live-token-2f8a63b1c4"
ADMIN_TOKEN = "admin-token-for-accounts-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
runner = CliRunner()


@pytest.fixture
def cli(db: TestDB, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_SECRET_KEY", TEST_SECRET_KEY)

    def invoke(*args: str, input: str | None = None) -> Any:
        return runner.invoke(app, ["tenants", "account", *args], input=input)

    return invoke


def rows(db: TestDB) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        found = conn.execute(select(tenant_accounts).order_by(tenant_accounts.c.tenant_id))
        return [dict(row._mapping) for row in found]


def raw_bytes(db: TestDB) -> bytes:
    """Every stored value of every account, as the database hands them out."""
    return b"\n".join(str(value).encode() for row in rows(db) for value in row.values())


def box(db: TestDB) -> SecretBox:
    return accounts.account_box(settings_for(db))


async def opened(db: TestDB) -> dict[str, accounts.TenantAccount]:
    engine = db.async_engine()
    try:
        return await accounts.accounts(engine, box(db))
    finally:
        await engine.dispose()


def secret_file(tmp_path: Path, secret: str = SECRET) -> Path:
    path = tmp_path / "token"
    path.write_text(secret + "\n")
    return path


# --- the command line --------------------------------------------------------------------


def test_an_operator_sets_shows_replaces_and_removes_an_account_with_the_cli(db, cli, tmp_path):
    tenant, _ = new_tenant(db, "acme")
    given = cli(
        "set",
        "acme",
        "--kind",
        "postmark",
        "--set",
        f"api_key=@{secret_file(tmp_path)}",
        "--set",
        "base_url=https://pm.acme.example",
    )
    assert given.exit_code == 0, given.output
    assert given.stdout == f"gave {tenant} its own postmark account: api_key, base_url\n"
    assert SECRET not in given.output

    stored = rows(db)
    assert [(r["tenant_id"], r["kind"], r["updated_by"]) for r in stored] == [
        (tenant, "postmark", "operator:cli")
    ]
    assert SECRET.encode() not in raw_bytes(db)  # sealed: the row holds no credential
    assert json.loads(box(db).open(stored[0]["sealed_settings"])) == {
        "api_key": SECRET,  # the file's text, its newline dropped
        "base_url": "https://pm.acme.example",
    }

    shown = cli("show", tenant)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[:4] == [
        f"tenant\t{tenant}",
        "kind\tpostmark",
        "api_key\tset",
        "base_url\thttps://pm.acme.example",
    ]
    assert lines[4].startswith("updated\t") and lines[4].endswith(" by operator:cli")
    assert SECRET not in shown.output
    assert cli("list").stdout.split("\t")[:2] == [tenant, "postmark"]

    # Replaced whole, from a TOML table with its kind (as a [providers.NAME] table has it).
    table = tmp_path / "account.toml"
    table.write_text(f'kind = "sendgrid"\napi_key = "{OTHER_SECRET}"\ntimeout = 12.5\n')
    replaced = cli("set", "acme", "--from-file", str(table))
    assert replaced.exit_code == 0, replaced.output
    assert replaced.stdout.startswith(f"replaced {tenant} its own sendgrid account")
    (row,) = rows(db)
    assert row["created_at"] == stored[0]["created_at"] and row["kind"] == "sendgrid"
    assert json.loads(box(db).open(row["sealed_settings"])) == {
        "api_key": OTHER_SECRET,
        "timeout": 12.5,
    }
    assert cli("show", "acme").stdout.splitlines()[2:4] == ["api_key\tset", "timeout\t12.5"]
    worker_view = asyncio.run(opened(db))
    assert worker_view[tenant].kind == "sendgrid"
    assert worker_view[tenant].settings == {"api_key": OTHER_SECRET, "timeout": 12.5}

    removed = cli("remove", "acme")
    assert removed.exit_code == 0 and removed.stdout == f"removed {tenant}'s own account\n"
    assert rows(db) == []
    for again in (cli("remove", "acme"), cli("show", "acme")):
        assert again.exit_code == 1 and "has no own provider account" in again.stderr


def test_a_secret_comes_from_standard_input_and_at_at_is_a_literal_at(db, cli):
    tenant, _ = new_tenant(db, "acme")
    given = cli(
        "set",
        tenant,
        "--kind",
        "smtp",
        "--set",
        "password=@-",
        "--set",
        "username=@@acme",
        "--set",
        "host=smtp.acme.example",
        "--set",
        "port=2525",
        input=f"{SECRET}\n",
    )
    assert given.exit_code == 0, given.output
    (row,) = rows(db)
    assert json.loads(box(db).open(row["sealed_settings"])) == {
        "password": SECRET,
        "username": "@acme",
        "host": "smtp.acme.example",
        "port": "2525",
    }
    shown = cli("show", tenant).stdout
    assert "password\tset" in shown and "username\t@acme" in shown and SECRET not in shown
    twice = cli("set", tenant, "--kind", "smtp", "--set", "password=@-", "--set", "host=@-")
    assert twice.exit_code == 2 and "standard input" in twice.stderr


def test_bad_input_exits_2_names_the_key_and_changes_nothing(db, cli, tmp_path):
    tenant, _ = new_tenant(db, "acme")
    token_file = secret_file(tmp_path)
    assert (
        cli("set", tenant, "--kind", "postmark", "--set", f"api_key=@{token_file}").exit_code == 0
    )
    before = rows(db)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text(f'api_key = "{SECRET}\n')  # an unterminated string
    cases = [
        (("--kind", "acmemail", "--set", f"api_key={SECRET}"), "kind: not a provider"),
        (("--kind", "postmark", "--set", f"apikey={SECRET}"), "settings.apikey: not a setting"),
        (("--kind", "postmark", "--set", "timeout=soon"), "settings.timeout: Input should be"),
        (("--kind", "smtp", "--set", "port=many"), "settings.port:"),
        (("--kind", "postmark", "--set", SECRET), "--set 1: not key=value"),
        (
            (
                "--kind",
                "postmark",
            ),
            "no settings",
        ),
        (("--set", f"api_key={SECRET}"), "--kind"),
        (("--kind", "postmark", "--from-file", str(bad_toml)), "not TOML"),
        (("--kind", "postmark", "--from-file", str(tmp_path / "missing.json")), "missing.json"),
        (("--kind", "postmark", "--set", f"api_key=@{tmp_path / 'nope'}"), "--set api_key"),
    ]
    for args, said in cases:
        result = cli("set", tenant, *args)
        assert result.exit_code == 2, (args, result.output)
        assert said in result.stderr, (args, result.stderr)
        assert SECRET not in result.output, args
    elsewhere = [
        (("set", "globex", "--kind", "postmark", "--set", "api_key=x"), "no tenant 'globex'"),
        (("set", "default", "--kind", "postmark", "--set", "api_key=x"), "default tenant"),
        (("show", "globex"), "no tenant 'globex'"),
        (("remove", "globex"), "no tenant 'globex'"),
    ]
    for args, said in elsewhere:
        result = cli(*args)
        assert result.exit_code == 2 and said in result.stderr, (args, result.output)
    assert rows(db) == before  # the account as it was, sealed the same


def test_without_a_key_to_seal_with_nothing_is_stored(db, cli, monkeypatch):
    tenant, _ = new_tenant(db, "acme")
    monkeypatch.delenv("MAILBAG_SECRET_KEY")
    result = cli("set", tenant, "--kind", "postmark", "--set", f"api_key={SECRET}")
    if db.dialect == "sqlite":
        # The embedded default's key lives beside the database (mailbag.keys): it seals.
        assert result.exit_code == 0, result.output
        assert Path(db.url.removeprefix("sqlite:///") + ".key").exists()
        assert SECRET.encode() not in raw_bytes(db)
        return
    assert result.exit_code == 1 and "MAILBAG_SECRET_KEY is not set" in result.stderr
    assert SECRET not in result.output and rows(db) == []


def test_a_key_other_than_the_databases_is_refused(db, cli, monkeypatch):
    tenant, _ = new_tenant(db, "acme")
    assert cli("set", tenant, "--kind", "postmark", "--set", "api_key=one").exit_code == 0
    before = rows(db)
    monkeypatch.setenv("MAILBAG_SECRET_KEY", "another-deployments-key-0123456789abcdef")
    for args in (("set", tenant, "--kind", "postmark", "--set", "api_key=two"), ("show", tenant)):
        result = cli(*args)
        assert result.exit_code == 1 and "differs from the key" in result.stderr, result.output
    assert rows(db) == before


# --- the admin API -----------------------------------------------------------------------


def admin_api(db: TestDB, **overrides: Any) -> Any:
    return api_client(db, admin_token=ADMIN_TOKEN, **overrides)


def path(tenant: str) -> str:
    return f"/v1/admin/tenants/{tenant}/account"


async def test_an_operator_sets_shows_replaces_and_removes_an_account_through_the_api(
    db, capsys, caplog
):
    tenant, _ = new_tenant(db, "acme")
    body = {
        "kind": "postmark",
        "settings": {"api_key": SECRET, "message_stream": "broadcast", "timeout": 9},
    }
    async with admin_api(db) as api:
        assert (await api.put(path(tenant), json=body)).status_code == 401
        created = await api.put(path("acme"), json=body, headers=AUTH)
        assert created.status_code == 201, created.text
        answer = created.json()
        assert answer["tenant_id"] == tenant and answer["kind"] == "postmark"
        assert answer["keys"] == ["api_key", "message_stream", "timeout"]
        assert answer["secret_keys"] == ["api_key"]
        assert answer["settings"] == {"message_stream": "broadcast", "timeout": 9}
        assert answer["updated_by"] == "operator:api"

        shown = await api.get(path(tenant), headers=AUTH)
        assert shown.status_code == 200 and shown.json() == answer

        again = {"kind": "resend", "settings": {"api_key": OTHER_SECRET}}
        replaced = await api.put(path(tenant), json=again, headers=AUTH)
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["keys"] == ["api_key"] and replaced.json()["settings"] == {}
        assert replaced.json()["created_at"] == answer["created_at"]
        worker_view = await opened(db)
        assert dict(worker_view[tenant].settings) == {"api_key": OTHER_SECRET}

        removed = await api.delete(path(tenant), headers=AUTH)
        assert removed.status_code == 200 and removed.json() == {"removed": True}
        problem(await api.get(path(tenant), headers=AUTH), 404, "not-found")
        problem(await api.delete(path(tenant), headers=AUTH), 404, "not-found")
        texts = [r.text for r in (created, shown, replaced, removed)]
    assert rows(db) == []
    logged = capsys.readouterr().err + caplog.text
    for text in [*texts, logged]:
        assert SECRET not in text and OTHER_SECRET not in text


async def test_bad_account_requests_are_4xx_naming_the_key_and_change_nothing(db, capsys, caplog):
    tenant, _ = new_tenant(db, "acme")
    good = {"kind": "postmark", "settings": {"api_key": SECRET}}
    async with admin_api(db) as api:
        assert (await api.put(path(tenant), json=good, headers=AUTH)).status_code == 201
        before = rows(db)
        cases: list[tuple[str, dict[str, Any], int, str, str]] = [
            (
                tenant,
                {"kind": "acmemail", "settings": {"api_key": SECRET}},
                422,
                "invalid-account",
                "kind: not a provider",
            ),
            (
                tenant,
                {"kind": "postmark", "settings": {"apikey": SECRET}},
                422,
                "invalid-account",
                "settings.apikey: not a setting of postmark",
            ),
            (
                tenant,
                {"kind": "postmark", "settings": {"timeout": SECRET}},
                422,
                "invalid-account",
                "settings.timeout",
            ),
            (
                tenant,
                {"kind": "postmark", "settings": {"api_key": {"nested": SECRET}}},
                422,
                "validation-error",
                "",
            ),
            (
                tenant,
                {"kind": "postmark", "settings": {"api_key": SECRET}, "x": 1},
                422,
                "validation-error",
                "",
            ),
            ("globex", good, 404, "not-found", "no tenant 'globex'"),
            ("default", good, 422, "invalid-account", "default tenant"),
        ]
        for owner, body, status, slug, said in cases:
            answer = await api.put(path(owner), json=body, headers=AUTH)
            found = problem(answer, status, slug)
            assert said in found.get("detail", ""), (body, found)
            assert SECRET not in answer.text, body
        problem(await api.get(path("globex"), headers=AUTH), 404, "not-found")
        problem(await api.delete(path("globex"), headers=AUTH), 404, "not-found")
    assert rows(db) == before
    assert SECRET not in capsys.readouterr().err + caplog.text


# --- what a worker reads -----------------------------------------------------------------


def test_one_tenants_unreadable_account_never_touches_anothers(db, cli):
    acme, _ = new_tenant(db, "acme")
    globex, _ = new_tenant(db, "globex")
    assert cli("set", acme, "--kind", "postmark", "--set", f"api_key={SECRET}").exit_code == 0
    assert cli("set", globex, "--kind", "resend", "--set", "api_key=re_1").exit_code == 0
    foreign = SecretBox("sealed-by-another-deployment-0123456789").seal('{"api_key": "x"}')
    with db.engine.begin() as conn:
        conn.execute(
            update(tenant_accounts)
            .where(tenant_accounts.c.tenant_id == acme)
            .values(sealed_settings=foreign)
        )

    async def read() -> tuple[dict[str, accounts.TenantAccount], list[str], list[Any]]:
        engine = db.async_engine()
        try:  # also in a caller's own transaction, as a worker reads it beside its fleet
            async with AsyncDatabase(engine).transaction() as tx:
                in_tx = list(await accounts.accounts(tx, box(db)))
        finally:
            await engine.dispose()
        async with admin_api(db) as api:
            answers = [await api.get(path(t), headers=AUTH) for t in (acme, globex)]
        return await opened(db), in_tx, answers

    found, in_tx, (broken, fine) = asyncio.run(read())
    assert list(found) == [globex] and dict(found[globex].settings) == {"api_key": "re_1"}
    assert in_tx == [globex]
    problem(broken, 409, "account-unreadable")
    assert fine.json()["kind"] == "resend"
    shown = cli("show", acme)
    assert shown.exit_code == 1 and "does not open" in shown.stderr
    # Setting it again, or removing it, is the way out.
    assert cli("set", acme, "--kind", "postmark", "--set", "api_key=new").exit_code == 0
    assert sorted(asyncio.run(opened(db))) == sorted([acme, globex])


# --- the console -------------------------------------------------------------------------


@asynccontextmanager
async def console(db: TestDB) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db, admin_password=PASSWORD) as client:
        await login(client)
        yield client


async def test_an_operator_sets_and_removes_an_account_in_the_console(db, capsys, caplog):
    tenant, _ = new_tenant(db, "acme")
    new_tenant(db, "globex")
    async with console(db) as client:
        listing = await client.get("/admin/tenants")
        assert listing.status_code == 200
        assert 'href="/admin/tenants" class="here"' in listing.text
        assert f'href="/admin/tenants/{tenant}"' in listing.text and "globex" in listing.text

        page = await client.get("/admin/tenants/acme")
        assert page.status_code == 200 and 'id="no-account"' in page.text
        settings = f"api_key = {SECRET}\r\n\r\nbase_url=https://pm.acme.example\r\n"
        form = {"kind": "postmark", "settings": settings}

        forged = await client.post(f"/admin/tenants/{tenant}/account", data=form)
        assert forged.status_code == 403 and rows(db) == []

        csrf = csrf_in(page)
        bad = await client.post(
            f"/admin/tenants/{tenant}/account",
            data={**form, "csrf": csrf, "settings": f"apikey={SECRET}"},
        )
        assert bad.status_code == 400
        assert "settings.apikey: not a setting of postmark" in bad.text
        assert SECRET not in bad.text and rows(db) == []

        saved = await client.post(f"/admin/tenants/{tenant}/account", data={**form, "csrf": csrf})
        assert saved.status_code == 303 and saved.headers["location"] == f"/admin/tenants/{tenant}"
        shown = await client.get(saved.headers["location"])
        assert "Gave acme" in shown.text and "its own postmark account" in shown.text
        assert 'id="account-kind">postmark<' in shown.text
        assert 'id="account-keys">api_key, base_url<' in shown.text
        assert SECRET not in shown.text and "pm.acme.example" not in shown.text
        assert "postmark" in (await client.get("/admin/tenants")).text
        (row,) = rows(db)
        assert row["updated_by"] == "operator:console"
        assert json.loads(box(db).open(row["sealed_settings"]))["api_key"] == SECRET

        asked = await client.post(
            f"/admin/tenants/{tenant}/account/remove", data={"csrf": await token(client)}
        )
        assert asked.status_code == 200 and 'name="confirm" value="yes"' in asked.text
        assert len(rows(db)) == 1
        done = await client.post(
            f"/admin/tenants/{tenant}/account/remove",
            data={"csrf": await token(client), "confirm": "yes"},
        )
        assert done.status_code == 303 and rows(db) == []
        assert (await client.get("/admin/tenants/nobody")).status_code == 404
    assert SECRET not in capsys.readouterr().err + caplog.text


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_an_operator_gives_a_tenant_its_own_account_in_the_browser(db, chromium):  # noqa: F811
    tenant, _ = new_tenant(db, "acme")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    app_under_test = create_app(settings_for(db, admin_password=BROWSER_PASSWORD))
    with uvicorn_thread(app_under_test) as base:
        # Scripts on: the console's CSP would report anything of these pages it blocks.
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(10_000)
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        log_in(page, base, "/admin/tenants")
        page.click("#tenants >> text=acme")
        assert page.url == f"{base}/admin/tenants/{tenant}"
        assert page.is_visible("#no-account")

        page.select_option("#set-account select[name=kind]", "postmark")
        page.fill("#set-account textarea[name=settings]", f"api_key={SECRET}\nmessage_stream=x")
        page.click("#set-account button[type=submit]")
        assert "its own postmark account" in page.inner_text(".flash")
        assert page.inner_text("#account-keys") == "api_key, message_stream"
        assert SECRET not in page.content()
        assert page.input_value("#set-account textarea[name=settings]") == ""
        page.screenshot(path=str(ARTIFACTS / "tenant-account.png"), full_page=True)

        page.click("#remove-account button")
        assert "Remove this tenant's own account?" in page.inner_text("h1")
        page.click("button:has-text('Yes, remove')")
        assert page.is_visible("#no-account") and "Removed" in page.inner_text(".flash")
        context.close()
    assert problems == []
    assert rows(db) == []
