"""Operating mailbag: webhooks, reconciliation, suppression, the admin API, metrics, CLI."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from mailbag import providers
from mailbag.cli import app as cli_app
from mailbag.domain.delivery import Accepted, Decision
from mailbag.domain.states import Action, Status
from mailbag.providers.brevo import BrevoProvider
from mailbag.services import outbox as outbox_service
from mailbag.services.reconciliation import Reconciler
from mailbag.settings import Settings
from mailbag.store.database import make_async_engine
from mailbag.store.schema import provider_events, suppressions
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig

from conftest import TestDB
from helpers import claim, events, finalize, get, message, run_worker_until, status_counts
from memory_provider import MemoryProvider
from smtp_server import DROP, RecordingSMTPServer
from sns_signing import TOPIC_ARN, notification, shared_signer, sns_time

DATA = Path(__file__).parent / "data" / "webhooks"
SECRETS = {
    "brevo_webhook_secret": "brevo-secret",
    "ses_webhook_secret": "ses-secret",
    "admin_token": "admin-token",
}


def brevo_event(name: str, **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads((DATA / "brevo" / f"{name}.json").read_text())
    payload.update(changes)
    return payload


def ses_record(name: str) -> dict[str, Any]:
    envelope = json.loads((DATA / "ses" / f"{name}.json").read_text())
    record: dict[str, Any] = json.loads(envelope["Message"])
    return record


def unknown_message(db: TestDB, **fields: Any) -> Any:
    """A message whose send ended ambiguously (what a lost connection after DATA leaves)."""
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0, **fields)])
    batch = claim(db, now=datetime.now(UTC))
    finalize(
        db,
        batch.token,
        (result.message.id, Decision(Action.MARK_UNKNOWN, error="connection lost after DATA")),
        now=datetime.now(UTC),
    )
    return get(db, result.message.id)


def brevo_post(api: Any, payload: Any, secret: str = "brevo-secret") -> Any:
    return api.post(
        "/v1/webhooks/brevo", json=payload, headers={"Authorization": f"Bearer {secret}"}
    )


def ses_post(api: Any, envelope: dict[str, Any]) -> Any:
    return api.post(
        "/v1/webhooks/ses",
        content=json.dumps(envelope),
        headers={"Content-Type": "text/plain"},
        params={"secret": "ses-secret"},
    )


def trust_test_certificate(api: Any) -> None:
    signer = shared_signer()
    api._transport.app.state.sns_certificates.put(signer.cert_url, signer.certificate_pem)


# --- webhooks --------------------------------------------------------------------------------


async def test_a_delivered_event_resolves_an_unknown_message(db):
    msg = unknown_message(db)
    async with api_client(db, **SECRETS) as api:
        payload = brevo_event("delivered", **{"X-Mailbag-Message-ID": str(msg.id)})
        first = await brevo_post(api, payload)
        again = await brevo_post(api, payload)  # providers resend
    assert first.status_code == 200 and first.json()["resolved"] == 1
    assert again.json() == {
        "stored": 0,
        "duplicates": 1,
        "unmatched": 0,
        "resolved": 0,
        "suppressed": 0,
    }
    row = get(db, msg.id)
    assert row.status == Status.SENT
    last = events(db, msg.id)[-1]
    assert (last.from_status, last.to_status, last.actor) == ("unknown", "sent", "reconciler")
    assert "delivered" in last.detail
    with db.engine.connect() as conn:
        stored = conn.execute(select(provider_events)).one()
    assert stored.message_id == msg.id and stored.raw["event"] == "delivered"


async def test_an_event_for_a_message_we_never_sent_is_kept_and_counted(db):
    before = (
        REGISTRY.get_sample_value("mailbag_unmatched_provider_events_total", {"provider": "brevo"})
        or 0
    )
    async with api_client(db, **SECRETS) as api:
        r = await brevo_post(
            api,
            brevo_event(
                "delivered",
                **{"X-Mailbag-Message-ID": str(uuid.uuid4()), "message-id": "<nobody@relay>"},
            ),
        )
    assert r.json()["unmatched"] == 1
    with db.engine.connect() as conn:
        assert conn.execute(select(provider_events.c.message_id)).scalar_one() is None
    after = REGISTRY.get_sample_value(
        "mailbag_unmatched_provider_events_total", {"provider": "brevo"}
    )
    assert after == before + 1


async def test_events_match_by_the_providers_message_id_too(db):
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0)])
    batch = claim(db, now=datetime.now(UTC))
    finalize(
        db,
        batch.token,
        (
            result.message.id,
            Decision(Action.MARK_SENT, provider_message_id="<abc@smtp-relay.mailin.fr>"),
        ),
    )
    async with api_client(db, **SECRETS) as api:
        r = await brevo_post(
            api,
            brevo_event(
                "opened",
                **{"message-id": "<abc@smtp-relay.mailin.fr>", "X-Mailbag-Message-ID": None},
            ),
        )
    assert r.json()["unmatched"] == 0
    with db.engine.connect() as conn:
        assert conn.execute(select(provider_events.c.message_id)).scalar_one() == result.message.id


async def test_a_rejected_event_settles_an_unknown_message_as_failed(db):
    msg = unknown_message(db)
    async with api_client(db, **SECRETS) as api:
        await brevo_post(api, brevo_event("blocked", **{"X-Mailbag-Message-ID": str(msg.id)}))
    assert get(db, msg.id).status == Status.FAILED


async def test_webhook_secrets_are_checked(db):
    async with api_client(db, **SECRETS) as api:
        assert (await brevo_post(api, brevo_event("delivered"), secret="wrong")).status_code == 401
        basic = await api.post(
            "/v1/webhooks/brevo", json=brevo_event("delivered"), auth=("brevo", "brevo-secret")
        )
        assert basic.status_code == 200
        bad = await brevo_post(api, {"event": "not-an-event", "email": "a@b.com"})
        assert bad.status_code == 400 and bad.json()["type"].endswith("/invalid-event")
    async with api_client(db) as api:  # no secret configured: the endpoint is off
        assert (await brevo_post(api, brevo_event("delivered"))).status_code == 404


async def test_a_signed_ses_bounce_suppresses_the_address(db, async_engine):
    tenant_id, _ = new_tenant(db)
    msg = unknown_message(db, to="nobody@example.com", tenant_id=tenant_id)
    record = ses_record("notification_bounce_permanent")
    record["mail"]["headers"] = [{"name": "X-Mailbag-Message-ID", "value": str(msg.id)}]
    async with api_client(db, **SECRETS, ses_topic_arns=TOPIC_ARN) as api:
        trust_test_certificate(api)
        signed = shared_signer().sign(notification(record), version="2")
        r = await ses_post(api, signed)
        assert r.status_code == 200, r.text
        assert r.json()["suppressed"] == 1 and r.json()["resolved"] == 1
        tampered = {**signed, "Message": signed["Message"].replace("Permanent", "Transient")}
        assert (await ses_post(api, tampered)).status_code == 403
        other_topic = shared_signer().sign(notification(record, topic_arn=TOPIC_ARN + "-x"))
        assert (await ses_post(api, other_topic)).status_code == 403
    assert get(db, msg.id).status == Status.SENT  # a bounce proves the provider had it
    # The next message to that address fails at once, and no provider is asked.
    with db.engine.begin() as conn:
        (again,) = outbox_service.write_many(
            conn, [message(1, to="Nobody@Example.com", tenant_id=tenant_id)]
        )
    assert (again.message.status, again.message.last_error) == ("failed", "suppressed")
    provider = MemoryProvider()
    worker = Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.05),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.3)
    stop.set()
    await task
    assert provider.sent == []


async def test_an_sns_subscription_is_confirmed_by_visiting_its_url(db):
    envelope = json.loads((DATA / "ses" / "subscription_confirmation.json").read_text())
    envelope.pop("Signature", None)
    envelope["Timestamp"] = sns_time(datetime.now(UTC))  # mailbag refuses old SNS messages
    visited: list[str] = []

    async def visit(url: str) -> None:
        visited.append(url)

    async with api_client(db, **SECRETS) as api:
        trust_test_certificate(api)
        api._transport.app.state.confirm_subscription = visit
        r = await ses_post(api, shared_signer().sign(envelope))
    assert r.status_code == 200 and visited == [envelope["SubscribeURL"]]


# --- reconciliation --------------------------------------------------------------------------


async def test_an_ambiguous_smtp_send_ends_sent_without_a_second_send(db, async_engine):
    """The connection dies after end-of-data; the relay's webhook later says delivered."""
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0)])
    mid = result.message.id
    with RecordingSMTPServer() as smtp:
        smtp.inject("end_of_data", DROP)
        settings = Settings(
            provider="smtp",
            smtp_host=smtp.host,
            smtp_port=smtp.port,
            smtp_tls="none",
            smtp_timeout=5,
        )
        worker = Worker(
            engine=async_engine,
            provider=providers.create("smtp", settings),
            catalog=builtin(),
            config=WorkerConfig(worker_id="w", poll_interval=0.05),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if get(db, mid).status == Status.UNKNOWN:
                break
        assert get(db, mid).status == Status.UNKNOWN
        async with api_client(db, **SECRETS) as api:
            r = await brevo_post(
                api, brevo_event("delivered", **{"X-Mailbag-Message-ID": str(mid)})
            )
            assert r.json()["resolved"] == 1
        await asyncio.sleep(0.3)  # the worker keeps running: it must not send again
        stop.set()
        await task
        await worker.provider.aclose()
        assert len(smtp.arrived) == 1
    assert get(db, mid).status == Status.SENT


async def test_the_reconciler_uses_events_that_came_before_the_sweep(db, async_engine):
    with db.engine.begin() as conn:
        (result,) = outbox_service.write_many(conn, [message(0)])
    batch = claim(db, now=datetime.now(UTC))
    # The delivery event arrives while the message is still processing: stored, no change.
    async with api_client(db, **SECRETS) as api:
        r = await brevo_post(
            api, brevo_event("delivered", **{"X-Mailbag-Message-ID": str(result.message.id)})
        )
        assert r.json()["resolved"] == 0
    finalize(db, batch.token, (result.message.id, Decision(Action.MARK_UNKNOWN, error="?")))
    outcomes = await Reconciler(async_engine).run_once(datetime.now(UTC))
    assert outcomes == {"resolved_sent": 1}
    assert get(db, result.message.id).status == Status.SENT


async def test_the_reconciler_asks_brevo_and_flags_what_nobody_knows(db, async_engine):
    from brevo_server import BrevoServer

    known = unknown_message(db, to="known@example.com")
    nobody = unknown_message(db, to="nobody@example.com")
    with BrevoServer() as brevo:
        provider = BrevoProvider(api_key=brevo.api_key, base_url=brevo.url)
        # Brevo did send `known` (its records have our per-message tag), not `nobody`.
        from helpers import outgoing_email

        sent = await provider.send(
            outgoing_email(0, message_id=known.id, to_email="known@example.com")
        )
        assert isinstance(sent, Accepted)
        reconciler = Reconciler(
            async_engine, providers={provider.name: provider}, flag_after=timedelta(0)
        )
        first = await reconciler.run_once(datetime.now(UTC))
        second = await reconciler.run_once(datetime.now(UTC))
        await provider.aclose()
    assert first == {"resolved_sent": 1, "flagged": 1}
    assert second == {"waiting": 1}  # flagged once per stay in unknown
    assert get(db, known.id).provider_message_id == sent.provider_message_id
    flag = events(db, nobody.id)[-1]
    assert (flag.from_status, flag.to_status, flag.actor) == ("unknown", "unknown", "reconciler")


# --- the admin API ---------------------------------------------------------------------------


async def test_the_admin_api_needs_its_token(db):
    async with api_client(db) as api:
        assert (await api.get("/v1/admin/stats")).status_code == 404
    async with api_client(db, **SECRETS) as api:
        assert (await api.get("/v1/admin/stats")).status_code == 401
        r = await api.get("/v1/admin/stats", headers={"Authorization": "Bearer admin-token"})
        assert r.status_code == 200 and "counts" in r.json()


async def test_operators_act_through_the_admin_api(db):
    msg = unknown_message(db)
    dead = unknown_message(db)
    admin = {"Authorization": "Bearer admin-token"}
    async with api_client(db, **SECRETS) as api:
        detail = await api.get(f"/v1/admin/messages/{msg.id}", headers=admin)
        assert detail.json()["status"] == "unknown" and detail.json()["events"]
        no_evidence = await api.post(
            f"/v1/admin/messages/{msg.id}/resolve",
            headers=admin,
            json={"sent": True, "evidence": ""},
        )
        assert no_evidence.status_code == 422
        resolved = await api.post(
            f"/v1/admin/messages/{msg.id}/resolve",
            headers=admin,
            json={"sent": False, "evidence": "bounce seen in Brevo logs"},
        )
        assert resolved.json()["status"] == "failed"
        again = await api.post(f"/v1/admin/messages/{msg.id}/requeue", headers=admin)
        assert again.status_code == 409
        bulk = await api.post("/v1/admin/requeue", headers=admin, json={"status": "unknown"})
        assert bulk.json() == {"requeued": 1}
        listed = await api.get("/v1/admin/messages", headers=admin, params={"status": "pending"})
        assert [m["id"] for m in listed.json()["items"]] == [str(dead.id)]
        added = await api.post(
            "/v1/admin/suppressions",
            headers=admin,
            json={"tenant_id": "default", "email": "X@Example.com"},
        )
        assert added.status_code == 201 and added.json() == {"added": True}
        rows = (await api.get("/v1/admin/suppressions", headers=admin)).json()
        assert [(s["email"], s["reason"]) for s in rows] == [("x@example.com", "manual")]
        removed = await api.delete("/v1/admin/suppressions/default/x@example.com", headers=admin)
        assert removed.status_code == 200
    assert events(db, msg.id)[-1].actor == "operator:api"
    assert get(db, dead.id).status == Status.PENDING


# --- metrics ---------------------------------------------------------------------------------


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_metrics_report_a_scripted_run(db, async_engine):
    template = {"template": "welcome"}
    before = {
        "enqueued": sample("mailbag_enqueued_total", template),
        "sent": sample("mailbag_sent_total", {"provider": "memory", **template}),
        "failed": sample("mailbag_failed_total", {"provider": "memory", **template}),
        "claims": sample("mailbag_claim_seconds_count"),
    }
    with db.engine.begin() as conn:
        outbox_service.write_many(conn, [message(i) for i in range(5)])

    def script(email: Any, nth: int) -> Any:
        from mailbag.domain.delivery import Rejected

        return Rejected("550") if email.to_email == "user4@example.com" else Accepted("ok")

    worker = Worker(
        engine=async_engine,
        provider=MemoryProvider(script),
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.05),
    )
    await run_worker_until(worker, lambda: status_counts(db) == {"sent": 4, "failed": 1})
    assert sample("mailbag_enqueued_total", template) == before["enqueued"] + 5
    assert sample("mailbag_sent_total", {"provider": "memory", **template}) == before["sent"] + 4
    assert (
        sample("mailbag_failed_total", {"provider": "memory", **template}) == before["failed"] + 1
    )
    assert sample("mailbag_claim_seconds_count") > before["claims"]
    async with api_client(db) as api:
        text = (await api.get("/metrics")).text
    # Final states are the counters' (above); the gauge counts the queue: empty now.
    assert 'mailbag_messages{state="pending"} 0.0' in text
    assert 'mailbag_messages{state="unknown"} 0.0' in text
    assert 'mailbag_messages{state="sent"}' not in text
    assert "mailbag_oldest_due_message_age_seconds 0.0" in text
    assert "mailbag_provider_call_seconds_bucket" in text


# --- the command line --------------------------------------------------------------------------


def test_operator_commands(db, monkeypatch):
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    runner = CliRunner()
    msg = unknown_message(db)
    refused = runner.invoke(cli_app, ["resolve", str(msg.id), "--evidence", " "])
    assert refused.exit_code == 2
    ok = runner.invoke(cli_app, ["resolve", str(msg.id), "--sent", "--evidence", "seen in logs"])
    assert ok.exit_code == 0, ok.output
    assert get(db, msg.id).status == Status.SENT
    assert events(db, msg.id)[-1].actor == "operator:cli"
    assert runner.invoke(cli_app, ["resolve", str(msg.id), "--evidence", "x"]).exit_code == 1
    assert runner.invoke(cli_app, ["suppressions", "add", "default", "a@b.com"]).exit_code == 0
    listed = runner.invoke(cli_app, ["suppressions", "list"])
    assert "a@b.com" in listed.stdout
    assert runner.invoke(cli_app, ["suppressions", "remove", "default", "a@b.com"]).exit_code == 0
    assert runner.invoke(cli_app, ["suppressions", "remove", "default", "a@b.com"]).exit_code == 1
    with db.engine.connect() as conn:
        assert conn.execute(select(suppressions)).all() == []
    stats = json.loads(runner.invoke(cli_app, ["stats", "--json"]).stdout)
    assert stats["counts"]["sent"] == 1
    table = runner.invoke(cli_app, ["stats"])
    assert "oldest due" in table.stdout
    reconciled = runner.invoke(cli_app, ["reconcile"], env={"MAILBAG_PROVIDER": "memory"})
    assert reconciled.exit_code == 0 and json.loads(reconciled.stdout) == {}


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_alert_rules_are_valid(db):
    import shutil
    import subprocess

    import yaml

    from mailbag import metrics

    path = Path(__file__).parents[1] / "deploy" / "prometheus-alerts.yml"
    rules = yaml.safe_load(path.read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert {
        "MailbagQueueDelayed",
        "MailbagUnknownRising",
        "MailbagFingerprintConflicts",
        "MailbagLeaseExpiredRepeatedly",
        "MailbagUnmatchedProviderEvents",
        "MailbagDeadLettersRising",
        "MailbagOptionalPartFailing",
        "MailbagHookEndpointsPaused",
    } <= names
    assert metrics.SENT  # importing mailbag.metrics registers every metric
    exported = {family.name for family in REGISTRY.collect()}
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]
        for word in rule["expr"].replace("(", " ").replace(")", " ").replace("[", " ").split():
            if word.startswith("mailbag_"):
                base = word.split("{")[0]
                stem = base.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
                assert stem in exported, f"{rule['alert']} uses unknown metric {base}"
    if shutil.which("promtool"):
        result = subprocess.run(
            ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


async def test_health_and_readiness(db):
    async with api_client(db) as api:
        assert (await api.get("/healthz")).json() == {"status": "ok"}
        ready = await api.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        services = api._transport.app.state.services
        services.engine = make_async_engine("postgresql://nobody@127.0.0.1:1/none")
        down = await api.get("/readyz")
    assert down.status_code == 503 and down.json()["status"] == "database unreachable"


def test_purge_drops_expired_idempotency_records(db, monkeypatch):
    from mailbag.clock import utcnow
    from mailbag.store import idempotency as records
    from mailbag.store.plan import run

    with db.engine.begin() as conn:
        run(
            conn,
            records.take_key(
                tenant_id="t",
                key="old",
                operation="op",
                fingerprint="f",
                now=utcnow() - timedelta(days=2),
                expires_at=utcnow() - timedelta(days=1),
            ),
        )
        run(
            conn,
            records.take_key(
                tenant_id="t",
                key="fresh",
                operation="op",
                fingerprint="f",
                now=utcnow(),
                expires_at=utcnow() + timedelta(days=1),
            ),
        )
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    result = CliRunner().invoke(cli_app, ["purge", "--older-than", "30d"])
    assert result.exit_code == 0 and "1 expired idempotency record" in result.stdout
    with db.engine.connect() as conn:
        assert run(conn, records.find("t", "old")) is None
        assert run(conn, records.find("t", "fresh")) is not None
