"""Sender domains on each database, through the CLI, against a real DNS server on loopback:
the records `add` prints (and `--json`), private keys sealed at rest, `check` saying of each
record ok, missing or wrong with the fix and exiting 0 only when ready, a lookup that fails
named with its resolver, a rotation with both keys published, bad input refused with
nothing written, and REQUIRE_READY_DOMAINS refusing mail from a domain that is not ready
at every door (the CLI, mailbag.enqueue, the API and its batch) until it is."""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from structlog.testing import capture_logs
from typer.testing import CliRunner

import mailbag
from api_helpers import TEST_SECRET_KEY, api_client, new_tenant, settings_for
from mailbag.cli import app
from mailbag.clock import utcnow
from mailbag.domain.message import InvalidMessage
from mailbag.services import maintenance
from mailbag.services.sender_domains import SenderDomains
from mailbag.store.schema import dkim_keys, outbox_messages, sender_domains
from test_console import PASSWORD, csrf_in, login
from test_hooks_api import problem

from conftest import TestDB
from dns_server import DnsServer

runner = CliRunner()


@pytest.fixture
def dns() -> Iterator[DnsServer]:
    with DnsServer() as server:
        yield server


@pytest.fixture
def cli(db: TestDB, dns: DnsServer, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_SECRET_KEY", TEST_SECRET_KEY)
    monkeypatch.setenv("MAILBAG_DNS_NAMESERVERS", dns.nameservers)
    monkeypatch.setenv("MAILBAG_DNS_TIMEOUT_SECONDS", "1")
    monkeypatch.setenv("MAILBAG_PROVIDER", "ses")  # its SPF mechanism: include:amazonses.com

    def invoke(*args: str) -> Any:
        return runner.invoke(app, ["domains", *args])

    return invoke


def publish(dns: DnsServer, records: list[dict[str, str]]) -> None:
    for record in records:
        dns.txt.setdefault(record["name"], []).append(record["value"])


def added(cli: Any, *args: str) -> list[dict[str, str]]:
    result = cli("add", *args, "--json")
    assert result.exit_code == 0, result.output
    records: list[dict[str, str]] = json.loads(result.stdout)
    return records


def counts(db: TestDB) -> tuple[int, int, int]:
    with db.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (sender_domains, dkim_keys, outbox_messages)
        )


def test_add_prints_the_records_and_seals_the_private_key(db: TestDB, cli: Any) -> None:
    result = cli("add", "default", "Example.COM", "--selector", "s1")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "added example.com to default; publish these records:"
    assert lines[1].startswith("TXT\ts1._domainkey.example.com\tv=DKIM1; k=rsa; p=MII")
    assert lines[2] == "TXT\texample.com\tv=spf1 include:amazonses.com ~all"
    assert lines[3] == "TXT\t_dmarc.example.com\tv=DMARC1; p=none; adkim=r; aspf=r"

    records = json.loads(cli("records", "default", "example.com", "--json").stdout)
    assert [set(r) for r in records] == [{"type", "name", "value"}] * 3
    with db.engine.connect() as conn:
        (row,) = conn.execute(select(dkim_keys)).all()
    assert row.selector == "s1" and row.state == "signing" and row.algorithm == "rsa"
    assert records[0]["value"].endswith(row.public_key)
    assert "PRIVATE KEY" not in row.sealed_private_key and "MII" not in row.sealed_private_key
    listed = cli("list").stdout.split("\t")
    assert listed[:4] == ["default", "example.com", "unchecked", "s1"]


def test_check_says_what_each_record_lacks_and_is_ready_once_all_are_published(
    db: TestDB, cli: Any, dns: DnsServer
) -> None:
    records = added(cli, "default", "example.com", "--algorithm", "ed25519")
    result = cli("check", "default", "example.com")
    assert result.exit_code == 1
    assert [line.split("\t")[:2] for line in result.stdout.splitlines()[:3]] == [
        ["missing", "dkim"],
        ["missing", "spf"],
        ["missing", "dmarc"],
    ]
    assert result.stdout.splitlines()[-1] == "example.com: not ready"

    dns.txt["example.com"] = ["v=spf1 mx ~all", "google-site-verification=abc"]
    dns.txt["_dmarc.example.com"] = ["v=DMARC1; p=reject"]
    publish(dns, records[:1])
    shown = json.loads(cli("check", "default", "example.com", "--json").stdout)
    states = {f["purpose"]: (f["state"], f["fix"]) for f in shown["findings"]}
    assert states["dkim"] == ("ok", "") and states["dmarc"] == ("ok", "")
    assert states["spf"] == (
        "wrong",
        "add include:amazonses.com: v=spf1 mx include:amazonses.com ~all",
    )
    assert shown["ready"] is False and shown["state"] == "not ready"

    dns.txt["example.com"] = ["v=spf1 mx include:amazonses.com ~all"]
    result = cli("check", "default", "example.com")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "example.com: ready"
    with db.engine.connect() as conn:
        row = conn.execute(select(sender_domains)).one()
    assert row.ready is True and row.checked_at is not None and row.ready_since is not None
    assert [f["state"] for f in row.report] == ["ok", "ok", "ok"]

    dns.txt[records[0]["name"]] = ["v=DKIM1; k=ed25519; p=c29tZW9uZSBlbHNl"]
    result = cli("check", "default", "example.com")
    assert result.exit_code == 1
    assert result.stdout.startswith(f"wrong\tdkim\t{records[0]['name']}\treplace it: publish")


def test_a_failed_lookup_names_the_record_and_the_resolver(cli: Any, dns: DnsServer) -> None:
    records = added(cli, "default", "example.com")
    publish(dns, records)
    dns.failing.add("example.com")
    dns.silent.add("_dmarc.example.com")
    result = cli("check", "default", "example.com", "--json")
    assert result.exit_code == 1
    found = {f["purpose"]: f for f in json.loads(result.stdout)["findings"]}
    assert found["dkim"]["state"] == "ok"
    assert found["spf"]["state"] == "unchecked"
    assert found["spf"]["fix"] == (
        "the lookup failed: TXT example.com: no server gave a usable answer "
        f"(SERVFAIL, REFUSED or a malformed reply): {dns.nameservers}"
    )
    assert found["dmarc"]["state"] == "unchecked"
    assert found["dmarc"]["fix"] == (
        f"the lookup failed: TXT _dmarc.example.com: no answer from {dns.nameservers} in time"
    )


def test_a_rotation_keeps_both_keys_published_and_signs_with_the_new_one_once_dns_has_it(
    db: TestDB, cli: Any, dns: DnsServer
) -> None:
    publish(dns, added(cli, "default", "example.com", "--selector", "old"))
    assert cli("check", "default", "example.com").exit_code == 0

    result = cli("rotate", "default", "example.com", "--finish")
    assert result.exit_code == 1 and "has no next key" in result.output
    result = cli("rotate", "default", "example.com", "--selector", "new", "--json")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [r["name"] for r in records[:2]] == [
        "old._domainkey.example.com",
        "new._domainkey.example.com",
    ]
    again = cli("rotate", "default", "example.com")
    assert again.exit_code == 1 and "has a next key already" in again.output
    # The next key is not yet in DNS: the domain stays ready, the switch is refused.
    assert cli("check", "default", "example.com").exit_code == 0
    refused = cli("rotate", "default", "example.com", "--finish")
    assert refused.exit_code == 1
    assert "new._domainkey.example.com) is missing: publish TXT" in refused.output

    publish(dns, records[1:2])
    result = cli("rotate", "default", "example.com", "--finish")
    assert result.exit_code == 0, result.output
    assert result.stdout == "example.com is signed with new from now\n"
    with db.engine.connect() as conn:
        states = dict(conn.execute(select(dkim_keys.c.selector, dkim_keys.c.state)).all())
    assert states == {"new": "signing", "old": "retired"}

    refused = cli("remove", "default", "example.com", "--selector", "new")
    assert refused.exit_code == 1 and "new signs example.com's mail" in refused.output
    assert cli("remove", "default", "example.com", "--selector", "old").exit_code == 0
    assert cli("remove", "default", "example.com").exit_code == 0
    assert counts(db)[:2] == (0, 0)
    gone = cli("remove", "default", "example.com")
    assert gone.exit_code == 1 and "has no domain example.com" in gone.output


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["default", "not a domain"], 2, "is not a domain name"),
        (["default", "192.168.0.1"], 2, "is an address, not a domain name"),
        (["default", "example.com", "--selector", "s1.x"], 2, "must be one DNS label"),
        (["default", "example.com", "--algorithm", "dsa"], 2, "is not rsa or ed25519"),
        (["nobody", "example.com"], 2, "nobody"),
        (["default", "example.com", "--key-file", "/nonexistent/key.pem"], 2, "--key-file"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    db: TestDB, cli: Any, args: list[str], code: int, said: str
) -> None:
    result = cli("add", *args)
    assert result.exit_code == code, result.output
    assert said in result.output
    assert counts(db) == (0, 0, 0)


def test_a_key_file_that_does_not_parse_is_refused_without_being_quoted(
    db: TestDB, cli: Any, tmp_path: Path
) -> None:
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n")
    result = cli("add", "default", "example.com", "--key-file", str(key))
    assert result.exit_code == 2
    assert "not an unencrypted PEM private key" in result.output
    assert "c2VjcmV0" not in result.output
    assert counts(db) == (0, 0, 0)
    assert cli("add", "default", "example.com").exit_code == 0
    assert cli("add", "default", "example.com").exit_code == 1  # it exists
    assert counts(db)[:2] == (1, 1)


# An SQLite database keeps its key in a file beside it: it always has one.
@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_without_a_secret_key_no_domain_can_be_added(
    db: TestDB, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MAILBAG_SECRET_KEY")
    result = cli("add", "default", "example.com")
    assert result.exit_code == 1 and "SECRET_KEY" in result.output
    assert counts(db) == (0, 0, 0)


# --- REQUIRE_READY_DOMAINS ---------------------------------------------------------------


def enqueue_cli(*args: str) -> Any:
    return runner.invoke(
        app, ["enqueue", "--to", "ada@example.org", "--subject", "Hi", "--text", "Hello", *args]
    )


def test_with_ready_domains_required_every_door_refuses_a_from_that_is_not_ready(
    db: TestDB, cli: Any, dns: DnsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAILBAG_REQUIRE_READY_DOMAINS", "true")
    monkeypatch.setenv("MAILBAG_FROM_EMAIL", "mail@example.com")
    refused = enqueue_cli()
    assert refused.exit_code == 2, refused.output
    assert "the sender domain example.com is not ready to send" in refused.output
    assert "mailbag domains add default example.com" in refused.output

    records = added(cli, "default", "example.com")
    refused = enqueue_cli()
    assert refused.exit_code == 2 and "mailbag domains check default example.com" in refused.output
    settings = settings_for(db, require_ready_domains=True, from_email="mail@example.com")
    with pytest.raises(InvalidMessage, match="not ready"), db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Hi", text="Hi", settings=settings)
    assert counts(db)[2] == 0

    publish(dns, records)
    assert cli("check", "default", "example.com").exit_code == 0
    assert enqueue_cli().exit_code == 0
    with db.engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Hi", text="Hi", settings=settings)
    assert counts(db)[2] == 2

    # A domain that stops being ready is refused again at its next check.
    dns.txt.pop("_dmarc.example.com")
    assert cli("check", "default", "example.com").exit_code == 1
    assert enqueue_cli().exit_code == 2
    assert counts(db)[2] == 2


async def made_ready(db: TestDB, dns: DnsServer, tenant: str, domain: str) -> None:
    """A domain added and its records published, then checked: ready (the service the CLI
    runs, from inside this test's event loop)."""
    engine = db.async_engine()
    try:
        domains = SenderDomains(engine, settings_for(db, dns_nameservers=dns.nameservers))
        shown = await domains.add(tenant, domain, now=utcnow(), actor="test")
        publish(dns, [r.as_dict() for r in shown.records])
        assert (await domains.check(tenant, domain, now=utcnow())).ready
    finally:
        await engine.dispose()


async def test_the_api_refuses_a_from_that_is_not_ready_with_a_422_and_writes_nothing(
    db: TestDB, cli: Any, dns: DnsServer
) -> None:
    tenant, key = new_tenant(db)
    own = runner.invoke(app, ["tenants", "senders", "add", tenant, "news@acme.example"])
    assert own.exit_code == 0, own.output
    body = {"to": "ada@example.org", "subject": "Hi", "text": "Hello"}
    options = {"require_ready_domains": True, "from_email": "mail@example.com"}
    async with api_client(db, key, **options) as client:
        answer = await client.post("/v1/messages", json=body, headers={"Idempotency-Key": "k1"})
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert "example.com is not ready" in json.dumps(answer.json())
        batch = {
            "messages": [
                {**body, "from": "news@acme.example"},
                {**body, "to": "grace@example.org"},
            ]
        }
        await made_ready(db, dns, tenant, "acme.example")
        answer = await client.post(
            "/v1/messages/batch", json=batch, headers={"Idempotency-Key": "b1"}
        )
        results = answer.json()["results"]
        assert [r["result"] for r in results] == ["created", "invalid"], results
        assert "example.com is not ready" in json.dumps(results[1])
        # The deployment's domain, once ready, serves every tenant.
        await made_ready(db, dns, "default", "example.com")
        answer = await client.post("/v1/messages", json=body, headers={"Idempotency-Key": "k2"})
        assert answer.status_code == 201, answer.text
    with db.engine.connect() as conn:
        sent_from = conn.execute(select(outbox_messages.c.from_address)).scalars().all()
    assert sorted(sent_from, key=str) == sorted(["news@acme.example", None], key=str)


async def test_the_scheduler_rechecks_domains_that_are_due_and_metrics_count_the_unready(
    db: TestDB, dns: DnsServer
) -> None:
    await made_ready(db, dns, "default", "example.com")
    await made_ready(db, dns, "default", "example.net")
    settings = settings_for(db, dns_nameservers=dns.nameservers, domain_check_every_seconds=60)
    engine = db.async_engine()
    try:
        checked = await maintenance.check_sender_domains(engine, settings, utcnow())
        assert checked == {"domains": 0}  # both were checked just now
        dns.txt.pop("_dmarc.example.net")
        later = utcnow() + timedelta(seconds=61)
        with capture_logs() as logs:
            checked = await maintenance.check_sender_domains(engine, settings, later)
        assert checked == {"domains": 2}
        changed = [e for e in logs if e["event"] == "sender_domain_readiness_changed"]
        assert [(e["domain"], e["ready"]) for e in changed] == [("example.net", False)]
    finally:
        await engine.dispose()
    with db.engine.connect() as conn:
        ready = dict(conn.execute(select(sender_domains.c.domain, sender_domains.c.ready)).all())
    assert ready == {"example.com": True, "example.net": False}
    async with api_client(db) as client:
        scraped = (await client.get("/metrics")).text
    assert "mailbag_sender_domains_not_ready 1.0" in scraped


# --- the admin API ------------------------------------------------------------------------

ADMIN_TOKEN = "admin-token-for-domains-0123456789"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_an_operator_adds_checks_rotates_and_removes_a_domain_through_the_api(
    db: TestDB, dns: DnsServer
) -> None:
    tenant, _ = new_tenant(db)
    base = "/v1/admin/tenants/acme/domains"  # a tenant by its name
    options = {"admin_token": ADMIN_TOKEN, "dns_nameservers": dns.nameservers}
    async with api_client(db, **options) as client:
        answer = await client.post(
            base, json={"domain": "Acme.Example", "selector": "s1"}, headers=AUTH
        )
        assert answer.status_code == 201, answer.text
        made = answer.json()
        assert made["tenant_id"] == tenant and made["domain"] == "acme.example"
        assert made["state"] == "unchecked" and made["keys"] == [
            {"selector": "s1", "algorithm": "rsa", "state": "signing"}
        ]
        assert [r["name"] for r in made["records"]] == [
            "s1._domainkey.acme.example",
            "acme.example",
            "_dmarc.acme.example",
        ]
        problem(
            await client.post(base, json={"domain": "acme.example"}, headers=AUTH),
            409,
            "domain-exists",
        )

        checked = (await client.post(f"{base}/acme.example/check", headers=AUTH)).json()
        assert checked["ready"] is False
        assert [f["state"] for f in checked["findings"]] == ["missing"] * 3
        publish(dns, made["records"])
        checked = (await client.post(f"{base}/acme.example/check", headers=AUTH)).json()
        assert checked["ready"] is True and checked["state"] == "ready"
        listed = (await client.get(base, headers=AUTH)).json()
        assert [(d["domain"], d["state"]) for d in listed] == [("acme.example", "ready")]

        rotated = await client.post(
            f"{base}/acme.example/rotate", json={"selector": "s2"}, headers=AUTH
        )
        assert rotated.status_code == 200, rotated.text
        problem(
            await client.post(f"{base}/acme.example/rotate/finish", headers=AUTH),
            409,
            "rotation-refused",
        )
        publish(dns, [r for r in rotated.json()["records"] if r["name"].startswith("s2.")])
        finished = (await client.post(f"{base}/acme.example/rotate/finish", headers=AUTH)).json()
        assert {k["selector"]: k["state"] for k in finished["keys"]} == {
            "s2": "signing",
            "s1": "retired",
        }
        assert finished["ready"] is True

        gone = await client.delete(f"{base}/acme.example", params={"selector": "s1"}, headers=AUTH)
        assert gone.json() == {"removed": True}
        assert (await client.delete(f"{base}/acme.example", headers=AUTH)).status_code == 200
        problem(await client.get(f"{base}/acme.example", headers=AUTH), 404, "not-found")


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        ({"domain": "not a domain"}, 422, "invalid-domain"),
        ({"domain": "acme.example", "selector": "a.b"}, 422, "invalid-domain"),
        ({"domain": "acme.example", "algorithm": "dsa"}, 422, "invalid-domain"),
        (
            {"domain": "acme.example", "private_key": "-----BEGIN PRIVATE KEY-----\nc2Vj\n"},
            422,
            "invalid-domain",
        ),
        ({"domain": "acme.example", "extra": 1}, 422, "validation-error"),
        ({"domain": "x" * 300}, 422, "validation-error"),
    ],
)
async def test_bad_domains_are_a_problem_and_change_nothing(
    db: TestDB, body: dict[str, Any], status: int, slug: str
) -> None:
    new_tenant(db)
    async with api_client(db, admin_token=ADMIN_TOKEN) as client:
        answer = await client.post("/v1/admin/tenants/acme/domains", json=body, headers=AUTH)
        found = problem(answer, status, slug)
        assert "c2Vj" not in json.dumps(found)
        problem(
            await client.post(
                "/v1/admin/tenants/nobody/domains", json={"domain": "a.example"}, headers=AUTH
            ),
            404,
            "not-found",
        )
    assert counts(db) == (0, 0, 0)


# --- the console --------------------------------------------------------------------------


async def test_the_console_shows_each_domains_readiness_and_checks_it_again(
    db: TestDB, dns: DnsServer
) -> None:
    await made_ready(db, dns, "default", "example.com")
    engine = db.async_engine()
    try:
        service = SenderDomains(engine, settings_for(db, dns_nameservers=dns.nameservers))
        await service.add("default", "example.net", now=utcnow(), actor="test")
    finally:
        await engine.dispose()
    options = {"admin_password": PASSWORD, "dns_nameservers": dns.nameservers}
    async with api_client(db, **options) as client:
        await login(client)
        page = await client.get("/admin/domains")
        assert page.status_code == 200
        states = re.findall(
            r'<td class="mono">([a-z.]+)</td>\s*<td class="domain-state">([a-z ]+)<', page.text
        )
        assert states == [("example.net", "unchecked"), ("example.com", "ready")]
        assert "s1._domainkey" not in page.text and "_domainkey.example.net" in page.text

        form = {"csrf": csrf_in(page), "tenant": "default", "domain": "example.net"}
        refused = await client.post("/admin/domains/check", data={**form, "csrf": "forged"})
        assert refused.status_code == 403
        done = await client.post("/admin/domains/check", data=form, follow_redirects=True)
        assert "Checked example.net: not ready." in done.text
        assert "missing (dmarc)" in done.text and "publish TXT _dmarc.example.net" in done.text
        gone = await client.post("/admin/domains/check", data={**form, "domain": "nothing.example"})
        assert gone.status_code == 404 and "Nothing was checked" in gone.text


def test_a_malformed_dns_answer_is_a_failed_lookup_naming_the_resolver(
    db: TestDB, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that answers every question with bytes that are not DNS."""
    garbage = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    garbage.bind(("127.0.0.1", 0))
    port = garbage.getsockname()[1]

    def answer() -> None:
        while True:
            try:
                question, client = garbage.recvfrom(512)
            except OSError:
                return
            garbage.sendto(question[:2] + b"\x81\x80 not a dns answer", client)

    threading.Thread(target=answer, daemon=True).start()
    try:
        assert cli("add", "default", "example.com").exit_code == 0
        monkeypatch.setenv("MAILBAG_DNS_NAMESERVERS", f"127.0.0.1:{port}")
        result = cli("check", "default", "example.com", "--json")
    finally:
        garbage.close()
    assert result.exit_code == 1, result.output
    findings = json.loads(result.stdout)["findings"]
    assert [f["state"] for f in findings] == ["unchecked"] * 3
    assert all(f"127.0.0.1:{port}" in f["fix"] for f in findings), findings
    assert "Traceback" not in result.output
