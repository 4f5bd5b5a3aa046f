"""Signed mail, end to end: a worker sends through a real SMTP server (aiosmtpd) and into
`.eml` files, and what arrives verifies with dkimpy's verifier against the record a real
DNS server on loopback publishes (the record `mailbag domains add` printed). Mail from a
domain without a key goes unsigned; a key sealed under another secret key signs nothing
and costs no other domain its signature; a rotated key signs the next message."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import dkim as dkimpy
import dns.message
import dns.query
import dns.rdatatype
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update

import mailbag
from api_helpers import settings_for
from mailbag.clock import utcnow
from mailbag.domain.dkim import Algorithm, SigningKey
from mailbag.domain.states import Status
from mailbag.providers.file import FileProvider
from mailbag.providers.smtp import SMTPProvider
from mailbag.services.sender_domains import SenderDomains, domain_box
from mailbag.settings import Settings
from mailbag.store.schema import dkim_keys
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from mailbag.worker.fleet import Fleet
from mailbag.worker.signing import Signing

from conftest import TestDB
from dns_server import DnsServer
from helpers import outgoing_email, run_worker_until, status_counts
from smtp_server import RecordingSMTPServer


@pytest.fixture
def nameserver() -> Iterator[DnsServer]:
    with DnsServer() as server:
        yield server


@pytest.fixture
def smtp() -> Iterator[RecordingSMTPServer]:
    with RecordingSMTPServer() as server:
        yield server


@pytest.fixture
async def provider(smtp: RecordingSMTPServer) -> AsyncIterator[SMTPProvider]:
    settings = Settings(provider="smtp", smtp_host=smtp.host, smtp_port=smtp.port, smtp_tls="none")
    made = SMTPProvider.from_settings(settings)
    yield made
    await made.aclose()


def verifier(dns_server: DnsServer) -> Any:
    """dkimpy's DNS lookup, asked of the loopback server (as a receiver asks its own)."""

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        query = dns.message.make_query(name.decode(), dns.rdatatype.TXT)
        answer = dns.query.udp(query, "127.0.0.1", port=dns_server.port, timeout=timeout)
        return b"".join(s for rrset in answer.answer for r in rrset for s in r.strings)

    return lookup


async def published(db: TestDB, dns_server: DnsServer, tenant: str, domain: str, **add: Any) -> Any:
    engine = db.async_engine()
    try:
        service = SenderDomains(engine, settings_for(db, dns_nameservers=dns_server.nameservers))
        shown = await service.add(tenant, domain, now=utcnow(), actor="test", **add)
        for record in shown.records:
            dns_server.txt.setdefault(record.name, []).append(record.value)
        return shown
    finally:
        await engine.dispose()


def worker(db: TestDB, async_engine: Any, provider: Any, from_email: str) -> Worker:
    signing = Signing.of(settings_for(db))
    return Worker(
        engine=async_engine,
        fleet=Fleet.single(provider, signing=signing),
        catalog=builtin(),
        config=WorkerConfig(worker_id="signing-worker", from_email=from_email, poll_interval=0.05),
    )


def enqueue(db: TestDB, n: int = 1, **fields: Any) -> None:
    with db.engine.begin() as conn:
        for i in range(n):
            mailbag.enqueue(
                conn, to=f"ada{i}@example.org", subject="Your invoice", html="<p>Hi</p>", **fields
            )


def sent(db: TestDB, total: int) -> Any:
    return lambda: status_counts(db).get(Status.SENT.value, 0) == total


async def test_mail_over_smtp_verifies_against_the_published_record(
    db: TestDB, async_engine: Any, nameserver: DnsServer, smtp: RecordingSMTPServer, provider: Any
) -> None:
    await published(db, nameserver, "default", "example.com", selector="s1")
    enqueue(db, 2)
    await run_worker_until(worker(db, async_engine, provider, "billing@example.com"), sent(db, 2))

    assert len(smtp.accepted) == 2
    for received in smtp.accepted:
        assert received.raw.startswith(b"DKIM-Signature: v=1; a=rsa-sha256;")
        assert b"d=example.com" in received.raw and b"s=s1;" in received.raw
        assert dkimpy.verify(received.raw, dnsfunc=verifier(nameserver))
        assert not dkimpy.verify(received.raw.replace(b"Hi", b"Ho"), dnsfunc=verifier(nameserver))


async def test_mail_from_a_domain_without_a_key_goes_unsigned(
    db: TestDB, async_engine: Any, nameserver: DnsServer, smtp: RecordingSMTPServer, provider: Any
) -> None:
    await published(db, nameserver, "default", "example.com")
    enqueue(db)
    await run_worker_until(worker(db, async_engine, provider, "billing@example.net"), sent(db, 1))
    (received,) = smtp.accepted
    assert b"DKIM-Signature" not in received.raw


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_an_eml_file_is_signed_and_a_key_that_does_not_open_signs_nothing(
    db: TestDB,
    async_engine: Any,
    nameserver: DnsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await published(db, nameserver, "default", "example.com", algorithm="ed25519")
    await published(db, nameserver, "default", "broken.example")
    other = domain_box(settings_for(db, secret_key="another-deployments-secret-key-0123456789"))
    with db.engine.begin() as conn:  # sealed under another deployment's key
        conn.execute(
            update(dkim_keys)
            .where(dkim_keys.c.domain == "broken.example")
            .values(sealed_private_key=other.seal("-----BEGIN RSA PRIVATE KEY-----"))
        )
    folder = tmp_path / "outbox"
    provider = FileProvider(folder)
    enqueue(db, from_address=None)
    run = worker(db, async_engine, provider, "billing@example.com")
    await run_worker_until(run, sent(db, 1))
    (eml,) = folder.glob("*.eml")
    raw = eml.read_bytes()
    assert b"a=ed25519-sha256" in raw
    assert dkimpy.verify(raw, dnsfunc=verifier(nameserver))
    assert set(run.fleet.signing_keys) == {("default", "example.com")}  # broken.example: none


def signing_failures() -> float:
    return REGISTRY.get_sample_value("mailbag_dkim_signing_failed_total") or 0.0


def test_a_key_dkimpy_cannot_sign_with_sends_the_email_unsigned() -> None:
    key = SigningKey("example.com", "s1", Algorithm.RSA, b"-----BEGIN PRIVATE KEY-----\nnot")
    before = signing_failures()
    raw = outgoing_email(dkim=key).raw  # raised inside the provider's send before
    assert b"DKIM-Signature" not in raw and b"Subject:" in raw
    assert signing_failures() == before + 1


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_a_signing_failure_during_the_send_is_sent_unsigned_never_unknown(
    db: TestDB,
    async_engine: Any,
    nameserver: DnsServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await published(db, nameserver, "default", "example.com")

    def broken(raw: bytes, key: Any) -> bytes:
        raise ValueError("dkimpy could not sign")

    monkeypatch.setattr("mailbag.domain.dkim.sign", broken)
    folder = tmp_path / "outbox"
    enqueue(db)
    await run_worker_until(
        worker(db, async_engine, FileProvider(folder), "billing@example.com"), sent(db, 1)
    )
    assert status_counts(db) == {Status.SENT.value: 1}  # not unknown: the send never failed
    (eml,) = folder.glob("*.eml")
    assert b"DKIM-Signature" not in eml.read_bytes()
