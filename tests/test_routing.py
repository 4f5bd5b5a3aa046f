"""Several providers in one deployment: the `providers` and `routes` settings, what enqueue
accepts under them, and failover in the worker (in-process, against memory providers on
each database; tests/test_failover_processes.py runs it with real processes and servers)."""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update
from typer.testing import CliRunner

from mailbag.cli import app
from mailbag.domain.breaker import Breaker
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Rejected, Throttled
from mailbag.domain.message import InvalidMessage
from mailbag.domain.routing import Match, Route, Routing
from mailbag.domain.states import Status
from mailbag.services.intake import Rules
from mailbag.settings import InvalidSettings, read_settings
from mailbag.store.schema import outbox_messages
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from mailbag.worker.fleet import Fleet
from test_worker import FAST_RETRY, all_in, enqueue

from conftest import TestDB
from helpers import events, get, run_worker_until, status_counts
from memory_provider import MemoryProvider

FAST_BREAKER = Breaker(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=200))
TABLES = {
    "main": {"kind": "postmark", "api_key": "pm-secret-token"},
    "relay": {"kind": "smtp", "host": "smtp.example.com", "port": 587},
}
ROUTES = [
    {"match": {"tenant": "acme"}, "providers": ["main"]},
    {"providers": ["relay", "main"]},
]

# --- settings ---------------------------------------------------------------------------


def test_tables_and_routes_make_a_routing_and_each_providers_own_settings() -> None:
    settings = read_settings(providers=TABLES, routes=ROUTES)
    assert settings.routing == Routing(
        (Route(("main",), Match(tenant="acme")),),
        Route(("relay", "main")),
    )
    kind, relay = settings.provider_table("relay")
    assert (kind, relay.provider, relay.smtp_host, relay.smtp_port) == (
        "smtp",
        "smtp",
        "smtp.example.com",
        587,
    )
    kind, main = settings.provider_table("main")
    assert kind == "postmark" and main.postmark_api_key is not None
    assert main.postmark_api_key.get_secret_value() == "pm-secret-token"
    assert settings.postmark_api_key is None  # the table's, not the deployment's


def test_the_environment_names_them_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAILBAG_PROVIDERS", json.dumps(TABLES))
    monkeypatch.setenv("MAILBAG_ROUTES", json.dumps(ROUTES))
    settings = read_settings()
    assert set(settings.providers) == {"main", "relay"}
    assert settings.routing.default == Route(("relay", "main"))


@pytest.mark.parametrize(
    ("tables", "routes", "expected"),
    [
        ({"main": {"api_key": "x"}}, [], "providers.main.kind: missing"),
        ({"main": {"kind": "smtp", "hots": "a"}}, [], "providers.main.hots: not a setting of smtp"),
        ({"main": {"kind": "smtp", "port": "x"}}, [], "providers.main.port: Input should be"),
        ({"Main": {"kind": "smtp"}}, [], "providers.Main: a provider's name is"),
        ({"tenant": {"kind": "smtp"}}, [], "providers.tenant: a provider's name is"),
        (TABLES, [], "routes: no route without `match`"),
        (TABLES, [{"providers": ["relay", "gone"]}], "routes[1].providers: no [providers.gone]"),
        (
            TABLES,
            [{"providers": []}],
            "routes.0.providers (MAILBAG_ROUTES): List should have at least 1 item",
        ),
        (
            TABLES,
            [{"providers": ["relay"]}, {"match": {"tenant": "a"}, "providers": ["main"]}],
            "routes[2]: comes after the route without `match`, never used",
        ),
        ({}, [{"providers": ["relay"]}], "routes: name [providers.NAME] tables"),
    ],
)
def test_a_table_or_route_that_cannot_work_is_refused_naming_it(
    tables: Any, routes: Any, expected: str
) -> None:
    with pytest.raises(InvalidSettings) as refused:
        read_settings(providers=tables, routes=routes)
    assert expected in str(refused.value)


def test_a_refused_tables_secret_is_never_shown() -> None:
    tables = {"main": {"kind": "postmark", "api_key": "pm-secret-token", "timeout": "soon"}}
    with pytest.raises(InvalidSettings) as refused:
        read_settings(providers=tables)
    assert "providers.main.timeout" in str(refused.value)
    assert "pm-secret-token" not in str(refused.value)


# --- enqueue ----------------------------------------------------------------------------


def test_enqueue_accepts_what_one_provider_of_the_route_can_carry() -> None:
    # Postmark takes no UTF-8 local part; SMTP (with SMTPUTF8) does.
    rules = Rules.of(read_settings(providers=TABLES, routes=ROUTES), catalog=builtin())
    utf8 = "zoë@example.com"
    routed = rules.message(to=utf8, subject="Hi", text="Hello")  # relay, then main
    assert routed.recipients.to[0].address == utf8
    with pytest.raises(InvalidMessage, match="postmark"):
        rules.message(to=utf8, subject="Hi", text="Hello", tenant_id="acme")  # main alone
    assert rules.message(to="ada@example.com", subject="Hi", text="x", tenant_id="acme")


# --- the worker -------------------------------------------------------------------------


def fleet_worker(async_engine: Any, *members: MemoryProvider) -> Worker:
    fleet = Fleet(
        {m.name: m for m in members},
        Routing((), Route(tuple(m.name for m in members))),
        breaker=FAST_BREAKER,
    )
    config = WorkerConfig(
        worker_id="fleet-worker",
        poll_interval=0.05,
        sweep_every=0.05,
        policy=FAST_RETRY,
        provider_breaker=FAST_BREAKER,
    )
    return Worker(engine=async_engine, fleet=fleet, catalog=builtin(), config=config)


def providers_of(db: TestDB, ids: list[Any]) -> list[str]:
    return [get(db, mid).provider for mid in ids]


async def test_what_the_primary_surely_refused_the_backup_sends_once(db, async_engine) -> None:
    ids = enqueue(db, 6)
    refusals = iter([Deferred("connection refused", provider_fault=True), Throttled("429")] * 3)
    primary = MemoryProvider(lambda email, nth: next(refusals), name="primary")
    backup = MemoryProvider(name="backup")
    await run_worker_until(
        fleet_worker(async_engine, primary, backup), all_in(db, Status.SENT, total=6)
    )
    assert sorted(backup.calls) == sorted(ids) and set(backup.calls.values()) == {1}
    assert providers_of(db, ids) == ["backup"] * 6
    assert {get(db, mid).attempt_count for mid in ids} == {1}  # failover spends none
    # Three refusals and three throttles: the breaker counts only the refusals, and the
    # breaker's metric says it is closed.
    assert REGISTRY.get_sample_value("mailbag_provider_breaker_open", {"provider": "primary"}) == 0
    assert len(primary.calls) == 6


async def test_what_fails_over_goes_in_the_backups_own_batch_size(db, async_engine) -> None:
    ids = enqueue(db, 7)
    refused = Deferred("connection refused", provider_fault=True)
    primary = MemoryProvider(lambda email, nth: refused, name="primary", max_batch_size=10)
    backup = MemoryProvider(name="backup", max_batch_size=3)
    await run_worker_until(
        fleet_worker(async_engine, primary, backup), all_in(db, Status.SENT, total=7)
    )
    assert primary.batches == [7]  # the chunk as it was cut for the primary
    assert backup.batches == [3, 3]  # and the seventh alone, through send
    assert sorted(backup.calls) == sorted(ids) and set(backup.calls.values()) == {1}


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        (Ambiguous("timed out after the content", keyed=False), Status.UNKNOWN),
        (Rejected("550 no such user"), Status.FAILED),
    ],
)
async def test_after_a_maybe_or_a_refusal_of_the_message_itself_no_backup_is_tried(
    db, async_engine, answer: Any, status: Status
) -> None:
    ids = enqueue(db, 3)
    primary = MemoryProvider(lambda email, nth: answer, name="primary")
    backup = MemoryProvider(name="backup")
    await run_worker_until(fleet_worker(async_engine, primary, backup), all_in(db, status, total=3))
    assert backup.calls == {}
    assert providers_of(db, ids) == ["primary"] * 3


async def test_a_retry_under_an_idempotency_key_waits_for_the_provider_that_has_the_key(
    db, async_engine
) -> None:
    (mid,) = enqueue(db, 1)

    def script(email: Any, nth: int) -> Any:
        if nth == 1:
            return Ambiguous("timed out after the request", keyed=True)
        if nth <= 3:
            return Deferred("connection refused", provider_fault=True)
        return Accepted("ok")

    primary = MemoryProvider(script, name="primary", idempotency_window=timedelta(hours=1))
    backup = MemoryProvider(name="backup")
    await run_worker_until(
        fleet_worker(async_engine, primary, backup), all_in(db, Status.SENT, total=1)
    )
    assert backup.calls == {}  # it knows nothing of the key: it could send a second copy
    assert primary.calls[mid] == 4
    assert {e.idempotency_key for e in primary.sent[1:]} == {primary.sent[0].idempotency_key}
    assert get(db, mid).provider == "primary"


async def test_messages_of_a_paused_tenant_wait_while_the_others_go(db, async_engine) -> None:
    from mailbag.store import fleet_state
    from mailbag.store.plan import run

    held = enqueue(db, 2, tenant_id="default")
    with db.engine.begin() as conn:
        run(
            conn,
            fleet_state.pause(
                fleet_state.Scope.TENANT,
                "default",
                now=get(db, held[0]).created_at,
                actor="test",
                reason=None,
            ),
        )
        # Another tenant's message: the default tenant's two must not hold it up.
        conn.execute(
            update(outbox_messages).where(outbox_messages.c.id == held[1]).values(tenant_id="x")
        )
    provider = MemoryProvider(name="primary")
    await run_worker_until(
        fleet_worker(async_engine, provider), lambda: status_counts(db).get("sent", 0) == 1
    )
    assert list(provider.calls) == [held[1]]
    assert get(db, held[0]).status == "pending" and get(db, held[0]).attempt_count == 0
    assert events(db, held[0])[-1].to_status == "pending"


def test_the_providers_command_lists_tables_breakers_and_routes(db, monkeypatch) -> None:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    monkeypatch.setenv("MAILBAG_PROVIDERS", json.dumps(TABLES))
    monkeypatch.setenv("MAILBAG_ROUTES", json.dumps(ROUTES))
    from mailbag.clock import utcnow
    from mailbag.store import fleet_state
    from mailbag.store.plan import run

    with db.engine.begin() as conn:
        run(
            conn,
            fleet_state.record(
                answered=set(),
                failed={"main": (5, "connection refused")},
                now=utcnow(),
                breaker=Breaker(),
            ),
        )
    done = CliRunner().invoke(app, ["providers", "--json"])
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    by_name = {row["name"]: row for row in shown["providers"]}
    assert by_name["relay"]["state"] == "ok"
    assert by_name["main"]["state"].startswith("breaker open until")
    assert by_name["main"]["last_error"] == "connection refused"
    assert shown["routes"] == [
        {"match": "tenant=acme", "providers": ["main"]},
        {"match": "", "providers": ["relay", "main"]},
    ]
    assert "pm-secret-token" not in done.output


async def test_a_tenants_own_account_sends_its_mail_and_its_failure_costs_no_one_else(
    db, async_engine, tmp_path
) -> None:
    from api_helpers import new_tenant, settings_for
    from mailbag.clock import utcnow
    from mailbag.services.tenant_accounts import TenantAccounts
    from mailbag.store.schema import provider_health
    from mailbag.worker import fleet

    acme, _ = new_tenant(db, "acme")
    beta, _ = new_tenant(db, "beta")
    settings = settings_for(
        db,
        providers={"main": {"kind": "file", "dir": str(tmp_path / "main")}},
        routes=[{"providers": ["tenant", "main"]}],
    )
    accounts = TenantAccounts(async_engine, settings)
    await accounts.put(acme, "file", {"dir": str(tmp_path / "acme")}, now=utcnow(), actor="t")
    with socket.socket() as spare:  # a port nothing listens on: beta's account is down
        spare.bind(("127.0.0.1", 0))
        closed = spare.getsockname()[1]
    down = {"host": "127.0.0.1", "port": closed, "tls": "none"}
    await accounts.put(beta, "smtp", down, now=utcnow(), actor="t")
    ids = {t: enqueue(db, 3, tenant_id=t) for t in (acme, beta, "default")}
    config = WorkerConfig(
        worker_id="accounts-worker",
        poll_interval=0.05,
        sweep_every=0.05,
        policy=FAST_RETRY,
        provider_breaker=FAST_BREAKER,
    )
    worker = Worker(
        engine=async_engine, fleet=fleet.from_settings(settings), catalog=builtin(), config=config
    )
    try:
        await run_worker_until(worker, all_in(db, Status.SENT, total=9))
        assert len(list((tmp_path / "acme").glob("*.eml"))) == 3
        assert len(list((tmp_path / "main").glob("*.eml"))) == 6  # beta's, failed over, default's
        # Its account taken away, acme's next mail goes the rest of the route, at once.
        await accounts.remove(acme)
        await asyncio.sleep(0.1)  # workers see it within a poll interval (here 50 ms)
        later = enqueue(db, 2, tenant_id=acme)
        await run_worker_until(worker, all_in(db, Status.SENT, total=11))
    finally:
        await worker.fleet.aclose()
    assert len(list((tmp_path / "acme").glob("*.eml"))) == 3
    assert len(list((tmp_path / "main").glob("*.eml"))) == 8
    assert set(providers_of(db, later)) == {"main"}
    assert set(providers_of(db, ids[acme])) == {fleet.account_name(acme)}
    assert set(providers_of(db, ids[beta])) == {"main"}
    assert set(providers_of(db, ids["default"])) == {"main"}
    with db.engine.connect() as conn:
        failing = {row.name for row in conn.execute(select(provider_health)) if row.failures_in_row}
    assert failing == {fleet.account_name(beta)}  # only beta's own breaker counts it
