"""Operators' pauses (issue 24, "Operators can pause"): the fleet, a provider or a tenant,
paused and resumed through the command line, the admin API and the console, on each
database; held by real workers with no attempt spent; measured by a gauge an alert watches.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from api_helpers import api_client, new_tenant
from mailbag.cli import app as cli_app
from mailbag.domain.states import Status
from mailbag.services.pauses import (
    InvalidPause,
    NotPaused,
    Pauses,
    holding,
    oldest_by_scope,
    paused_providers,
)
from mailbag.services.tenants import UnknownTenant
from mailbag.store import fleet_state
from mailbag.store.database import READ_ONLY
from mailbag.store.fleet_state import FleetState, Pause, Scope
from mailbag.store.schema import outbox_messages, pauses
from mailbag.worker import Worker
from mailbag.worker.fleet import TOLD_RECHECK_SECONDS, Fleet
from test_console import act, console
from test_first_run import SERVER_ONLY, loaded_within, modules_loaded_by_command
from test_hooks_api import problem
from test_worker import enqueue, make_worker

from conftest import TestDB
from helpers import enqueue as enqueue_messages
from helpers import get
from memory_provider import MemoryProvider

ROOT = Path(__file__).resolve().parent.parent
ADMIN = {"Authorization": "Bearer admin-token"}
runner = CliRunner()


def stored(db: TestDB) -> list[tuple[str, str, str, str | None]]:
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        rows = conn.execute(select(pauses).order_by(pauses.c.scope, pauses.c.target)).all()
    return [(r.scope, r.target, r.paused_by, r.reason) for r in rows]


# --- the service --------------------------------------------------------------------------------


async def test_a_second_pause_reports_the_first_and_a_resume_lifts_it_once(db, async_engine):
    acme, _ = new_tenant(db, "acme")
    svc = Pauses(async_engine)
    first_at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    first = await svc.pause(
        Scope.TENANT, "acme", now=first_at, actor="operator:cli", reason="bounces"
    )
    assert first.new and first.pause.target == acme  # named by its name, stored by its id
    again = await svc.pause(Scope.TENANT, acme, now=datetime.now(UTC), actor="x", reason="y")
    assert not again.new
    assert (again.pause.paused_at, again.pause.paused_by, again.pause.reason) == (
        first_at,
        "operator:cli",
        "bounces",
    )
    assert stored(db) == [("tenant", acme, "operator:cli", "bounces")]
    lifted = await svc.resume(Scope.TENANT, "acme")
    assert (lifted.target, lifted.paused_at) == (acme, first_at)
    with pytest.raises(NotPaused, match=f"tenant {acme} is not paused"):
        await svc.resume(Scope.TENANT, acme)
    assert stored(db) == []


@pytest.mark.parametrize(
    ("scope", "target", "reason", "refused"),
    [
        (Scope.FLEET, "brevo", None, InvalidPause),
        (Scope.PROVIDER, "", None, InvalidPause),
        (Scope.PROVIDER, "Brevo", None, InvalidPause),
        (Scope.PROVIDER, "bre vo", None, InvalidPause),
        (Scope.PROVIDER, "b" * 51, None, InvalidPause),
        (Scope.PROVIDER, "brevo", "x" * 501, InvalidPause),
        (Scope.PROVIDER, "brevo", "line\nbreak", InvalidPause),
        (Scope.TENANT, "nobody", None, UnknownTenant),
    ],
)
async def test_what_cannot_be_paused_is_refused_and_nothing_is_written(
    db, async_engine, scope, target, reason, refused
):
    with pytest.raises(refused):
        await Pauses(async_engine).pause(
            scope, target, now=datetime.now(UTC), actor="t", reason=reason
        )
    assert stored(db) == []


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_message_is_held_by_the_fleets_its_tenants_and_its_waits_providers_pauses(db):
    (message,) = enqueue_messages(db, 1, tenant_id="t_1")
    at = message.created_at
    fleet_pause = Pause(Scope.FLEET, "", at, "a", None)
    provider_pause = Pause(Scope.PROVIDER, "memory", at, "a", None)
    tenant_pause = Pause(Scope.TENANT, "t_1", at, "a", None)
    # The words a real worker writes when a message waits for a paused provider.
    fleet = Fleet.single(MemoryProvider())
    fleet.state = FleetState(pauses=(provider_pause,))
    words = fleet.why_waiting(message, at)
    assert paused_providers(words) == {"memory"}
    assert paused_providers("connection refused") == set()
    waiting = replace(message, last_error=words)
    everything = [fleet_pause, provider_pause, tenant_pause]
    assert holding(everything, waiting) == everything
    assert holding(everything, message) == [fleet_pause, tenant_pause]
    assert holding([tenant_pause], replace(waiting, tenant_id="t_2")) == []
    assert holding(everything, replace(waiting, status=Status.SENT)) == []


# --- the command line ---------------------------------------------------------------------------


def cli(db: TestDB, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    monkeypatch.setenv("MAILBAG_DATABASE_URL", db.url)
    return runner.invoke(cli_app, list(args))


def test_the_command_line_pauses_lists_and_resumes(db, monkeypatch):
    acme, _ = new_tenant(db, "acme")
    done = cli(db, monkeypatch, "pause", "--tenant", "acme", "--reason", "too many bounces")
    assert done.exit_code == 0, done.output
    assert done.stdout == f"paused tenant {acme}: its mail waits until it is resumed\n"
    assert cli(db, monkeypatch, "pause").exit_code == 0
    again = cli(db, monkeypatch, "pause", "--tenant", acme)
    assert again.exit_code == 0
    assert f"tenant {acme} is already paused since " in again.stdout
    assert again.stdout.endswith(" by operator:cli (too many bounces)\n")
    listed = cli(db, monkeypatch, "pauses").stdout.splitlines()
    rows = sorted(line.split("\t") for line in listed)
    assert [row[:2] for row in rows] == [["fleet", "-"], ["tenant", acme]]
    assert [row[3:5] for row in rows] == [
        ["operator:cli", ""],
        ["operator:cli", "too many bounces"],
    ]
    assert all(row[5].endswith(" s") for row in rows)
    resumed = cli(db, monkeypatch, "resume", "--tenant", "acme")
    assert resumed.exit_code == 0 and resumed.stdout.startswith(f"resumed tenant {acme} ")
    assert cli(db, monkeypatch, "resume").exit_code == 0
    empty = cli(db, monkeypatch, "pauses")
    assert (empty.exit_code, empty.stdout, empty.stderr) == (0, "", "nothing is paused\n")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["pause", "--provider", "brevo", "--tenant", "acme"], "not both"),
        (["resume", "--provider", "brevo", "--tenant", "acme"], "not both"),
        (["pause", "--provider", "Brevo"], "--provider must be a provider's name"),
        (["pause", "--provider", ""], "--provider must name the provider"),
        (["pause", "--tenant", "nobody"], "no tenant 'nobody'"),
        (["pause", "--reason", "a\tb"], "--reason must not contain control characters"),
        (["pause", "--reason", "x" * 501], "--reason must be at most 500 characters"),
        (["resume", "--tenant", "nobody"], "no tenant 'nobody'"),
    ],
)
def test_bad_input_exits_2_saying_why_and_pauses_nothing(db, monkeypatch, args, says):
    done = cli(db, monkeypatch, *args)
    assert done.exit_code == 2, done.output
    assert says in done.stderr and done.stdout == ""
    assert stored(db) == []


def test_a_resume_of_what_is_not_paused_exits_1(db, monkeypatch):
    done = cli(db, monkeypatch, "resume", "--provider", "brevo")
    assert (done.exit_code, done.stderr) == (1, "mailbag: provider brevo is not paused\n")


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_the_pause_commands_load_no_server_library(db, tmp_path):
    for args in (["pause", "--provider", "brevo"], ["pauses"], ["resume", "--provider", "brevo"]):
        loaded = modules_loaded_by_command(args, db.url, tmp_path)
        assert "mailbag.services.pauses" in loaded
        assert loaded_within(loaded, SERVER_ONLY) == set()


# --- the admin API ------------------------------------------------------------------------------


async def test_the_admin_api_pauses_lists_and_resumes(db):
    acme, _ = new_tenant(db, "acme")
    async with api_client(db, admin_token="admin-token") as api:
        body = {"scope": "provider", "target": "brevo", "reason": "their incident"}
        made = await api.post("/v1/admin/pauses", json=body, headers=ADMIN)
        assert made.status_code == 201, made.text
        assert made.json()["paused_by"] == "operator:api"
        again = await api.post("/v1/admin/pauses", json={**body, "reason": "x"}, headers=ADMIN)
        assert again.status_code == 200
        assert again.json()["paused_at"] == made.json()["paused_at"]
        assert again.json()["reason"] == "their incident"
        tenant = await api.post(
            "/v1/admin/pauses", json={"scope": "tenant", "target": "acme"}, headers=ADMIN
        )
        assert tenant.status_code == 201 and tenant.json()["target"] == acme
        fleet = await api.post("/v1/admin/pauses", json={"scope": "fleet"}, headers=ADMIN)
        assert fleet.status_code == 201 and fleet.json()["target"] == ""
        listed = (await api.get("/v1/admin/pauses", headers=ADMIN)).json()
        assert [(p["scope"], p["target"]) for p in listed] == [
            ("provider", "brevo"),
            ("tenant", acme),
            ("fleet", ""),
        ]
        assert all(p["age_seconds"] >= 0 for p in listed)
        resumed = await api.delete("/v1/admin/pauses/provider/brevo", headers=ADMIN)
        assert resumed.status_code == 200 and resumed.json()["reason"] == "their incident"
        gone = await api.delete("/v1/admin/pauses/provider/brevo", headers=ADMIN)
        assert problem(gone, 404, "not-found")["detail"] == "provider brevo is not paused"
        assert (await api.delete("/v1/admin/pauses/tenant/acme", headers=ADMIN)).status_code == 200
        assert (await api.delete("/v1/admin/pauses/fleet", headers=ADMIN)).status_code == 200
        problem(await api.delete("/v1/admin/pauses/fleet", headers=ADMIN), 404, "not-found")
    assert stored(db) == []


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        ({"scope": "queue"}, 422, "validation-error"),
        ({"scope": "fleet", "target": "brevo"}, 422, "invalid-pause"),
        ({"scope": "provider"}, 422, "invalid-pause"),
        ({"scope": "provider", "target": "Bre vo"}, 422, "invalid-pause"),
        ({"scope": "provider", "target": "brevo", "reason": "x" * 501}, 422, "validation-error"),
        ({"scope": "provider", "target": "brevo", "until": "never"}, 422, "validation-error"),
        ({"scope": "tenant", "target": "nobody"}, 404, "not-found"),
    ],
)
async def test_a_pause_the_admin_api_refuses_is_a_problem_and_changes_nothing(
    db, body, status, slug
):
    async with api_client(db, admin_token="admin-token") as api:
        refused = await api.post("/v1/admin/pauses", json=body, headers=ADMIN)
        problem(refused, status, slug)
        for path, why in (("queue/x", "validation-error"), ("fleet/x", "invalid-pause")):
            problem(await api.delete(f"/v1/admin/pauses/{path}", headers=ADMIN), 422, why)
        problem(await api.delete("/v1/admin/pauses/tenant/nobody", headers=ADMIN), 404, "not-found")
        assert (await api.post("/v1/admin/pauses", json={"scope": "fleet"})).status_code == 401
    assert stored(db) == []


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_the_pause_routes_are_documented_and_the_document_stays_valid(db):
    from openapi_spec_validator import validate

    async with api_client(db) as api:
        schema = (await api.get("/openapi.json")).json()
    validate(schema)
    paths = schema["paths"]
    posted = paths["/v1/admin/pauses"]["post"]["responses"]
    assert {"200", "201", "401", "404", "422"} <= set(posted)
    for status in ("200", "201"):
        body = posted[status]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith("/PauseOut")
    assert "404" in paths["/v1/admin/pauses/{scope}/{target}"]["delete"]["responses"]
    assert "404" in paths["/v1/admin/pauses/fleet"]["delete"]["responses"]
    scopes = schema["components"]["schemas"]["Scope"]["enum"]
    assert scopes == ["fleet", "provider", "tenant"]


# --- the worker ---------------------------------------------------------------------------------


def rows(db: TestDB) -> dict[str, list[tuple[str, int]]]:
    """Each tenant's messages: (status, attempts)."""
    found: dict[str, list[tuple[str, int]]] = {}
    with db.engine.connect().execution_options(**READ_ONLY) as conn:  # never behind a worker
        query = select(outbox_messages.c.tenant_id, outbox_messages.c.status)
        for r in conn.execute(query.add_columns(outbox_messages.c.attempt_count)).all():
            found.setdefault(r.tenant_id, []).append((r.status, r.attempt_count))
    return found


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await task


async def until(task: asyncio.Task[None], done: Callable[[], bool], timeout: float = 15) -> float:
    """Seconds until `done()` holds (the worker still running)."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        while not done():
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    return time.monotonic() - started


POLL = 0.2  # the workers' poll interval: how often they read the pauses


async def test_a_paused_tenants_mail_waits_while_others_flow_and_goes_once_resumed(
    db, async_engine
):
    acme, _ = new_tenant(db, "acme")
    svc = Pauses(async_engine)
    await svc.pause(Scope.TENANT, "acme", now=datetime.now(UTC), actor="t", reason=None)
    enqueue(db, 3, tenant_id=acme)
    enqueue(db, 3)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, poll_interval=POLL)
    async with running(worker) as task:
        await until(task, lambda: rows(db)["default"] == [("sent", 1)] * 3)
        await asyncio.sleep(3 * POLL)  # several reads of the pauses later: still held
        assert rows(db)[acme] == [("pending", 0)] * 3
        await svc.resume(Scope.TENANT, acme)
        took = await until(task, lambda: rows(db)[acme] == [("sent", 1)] * 3)
    # One read of the pauses (at most a poll interval), one claim, three sends.
    assert took < 2 * POLL + 1.0, took
    assert len(provider.sent) == 6


async def test_a_paused_fleet_claims_nothing_until_resumed(db, async_engine):
    svc = Pauses(async_engine)
    await svc.pause(Scope.FLEET, None, now=datetime.now(UTC), actor="t", reason="upgrade")
    enqueue(db, 2)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, poll_interval=POLL)
    async with running(worker) as task:
        await asyncio.sleep(4 * POLL)
        assert rows(db)["default"] == [("pending", 0)] * 2 and provider.sent == []
        await svc.resume(Scope.FLEET, "")
        took = await until(task, lambda: rows(db)["default"] == [("sent", 1)] * 2)
    assert took < 2 * POLL + 1.0, took


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_a_listening_worker_reads_the_fleets_state_when_told_and_obeys_at_once(
    db, async_engine, monkeypatch
):
    reads = 0
    read = fleet_state.read

    def counted(**kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return read(**kwargs)

    monkeypatch.setattr(fleet_state, "read", counted)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, poll_interval=0.05)
    worker.listen_url = db.url
    svc = Pauses(async_engine)
    async with running(worker) as task:
        await until(task, lambda: worker.fleet.told)  # LISTEN's probe came back
        await asyncio.sleep(0.2)
        before = reads
        await asyncio.sleep(1.0)  # twenty poll intervals; nothing changed, nothing sent
        assert reads == before
        await svc.pause(Scope.FLEET, None, now=datetime.now(UTC), actor="t", reason=None)
        took = await until(task, lambda: worker.fleet.fleet_paused)
        assert took < 1.0 < TOLD_RECHECK_SECONDS, took  # told, not found at the recheck
        enqueue(db, 2)
        await asyncio.sleep(0.5)
        assert rows(db)["default"] == [("pending", 0)] * 2
        # The listening connection cut: nothing is counted on until it is back and heard.
        with db.engine.begin() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
            )
        await until(task, lambda: not worker.fleet.told)
        await until(task, lambda: worker.fleet.told)
        await svc.resume(Scope.FLEET, "")
        took = await until(task, lambda: rows(db)["default"] == [("sent", 1)] * 2)
    assert took < 1.0, took
    assert len(provider.sent) == 2


async def test_a_paused_providers_mail_waits_unspent_and_its_page_says_why(db, async_engine):
    await Pauses(async_engine).pause(
        Scope.PROVIDER, "memory", now=datetime.now(UTC), actor="operator:cli", reason="incident"
    )
    (message_id,) = enqueue(db, 1)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, poll_interval=POLL)
    async with running(worker) as task:
        await until(task, lambda: get(db, message_id).last_error is not None)
    row = get(db, message_id)
    assert row.last_error == "no provider of its route is available: memory paused"
    assert (row.status, row.attempt_count, provider.sent) == ("pending", 0, [])
    async with console(db) as client:
        page = (await client.get(f"/admin/messages/{message_id}")).text
        assert 'id="held"' in page and "Provider memory is paused" in page
        assert "by operator:cli (incident)" in page


# --- the console --------------------------------------------------------------------------------


async def test_an_operator_pauses_and_resumes_a_tenant_in_the_console(db):
    acme, _ = new_tenant(db, "acme")
    (waiting,) = enqueue(db, 1, tenant_id=acme)
    async with console(db) as client:
        assert 'href="/admin/pauses"' in (await client.get("/admin")).text
        asked = await act(
            client, "/admin/pauses/pause", confirm=False, scope="tenant", target="acme"
        )
        assert asked.status_code == 200 and "Pause tenant acme (" in asked.text
        assert stored(db) == []  # asking changes nothing
        done = await act(
            client, "/admin/pauses/pause", scope="tenant", target="acme", reason="spam"
        )
        assert done.status_code == 303 and done.headers["location"] == "/admin/pauses"
        assert stored(db) == [("tenant", acme, "operator:console", "spam")]
        listing = (await client.get("/admin/pauses")).text
        assert f"<td>acme ({acme})</td>" in listing and "spam" in listing
        page = (await client.get(f"/admin/messages/{waiting}")).text
        assert f"Tenant acme ({acme}) is paused" in page
        again = await act(client, "/admin/pauses/pause", scope="tenant", target=acme)
        assert again.status_code == 303
        assert "already paused" in (await client.get("/admin/pauses")).text
        resumed = await act(client, "/admin/pauses/resume", scope="tenant", target=acme)
        assert resumed.status_code == 303 and stored(db) == []
        assert 'id="held"' not in (await client.get(f"/admin/messages/{waiting}")).text
        assert "Nothing is paused" in (await client.get("/admin/pauses")).text
        late = await act(client, "/admin/pauses/resume", scope="tenant", target=acme)
        assert late.status_code == 409 and "is not paused" in late.text


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"scope": "queue", "target": ""}, 400),
        ({"scope": "provider", "target": "Bre vo"}, 400),
        ({"scope": "fleet", "target": "brevo"}, 400),
        ({"scope": "tenant", "target": "nobody"}, 400),
        ({"scope": "fleet", "reason": "x" * 501}, 400),
    ],
)
async def test_a_pause_the_console_refuses_changes_nothing(db, fields, status):
    async with console(db) as client:
        refused = await act(client, "/admin/pauses/pause", **fields)
        assert refused.status_code == status and "Nothing was changed" in refused.text
        csrf_missing = await client.post(
            "/admin/pauses/pause", data={"scope": "fleet", "confirm": "yes"}
        )
        assert csrf_missing.status_code == 403
    assert stored(db) == []


# --- the metric and the alert -------------------------------------------------------------------


async def test_the_pause_gauges_say_how_long_each_scope_has_been_paused(db, async_engine):
    now = datetime.now(UTC)
    svc = Pauses(async_engine)
    await svc.pause(Scope.PROVIDER, "brevo", now=now - timedelta(hours=2), actor="t", reason=None)
    await svc.pause(Scope.PROVIDER, "ses", now=now - timedelta(minutes=5), actor="t", reason=None)
    async with api_client(db, clock=lambda: now) as api:
        text = (await api.get("/metrics")).text
    assert 'mailbag_pauses{scope="provider"} 2.0' in text
    assert 'mailbag_pause_age_seconds{scope="provider"} 7200.0' in text
    assert 'mailbag_pauses{scope="fleet"} 0.0' in text
    assert 'mailbag_pause_age_seconds{scope="tenant"} 0.0' in text
    await svc.resume(Scope.PROVIDER, "brevo")
    await svc.resume(Scope.PROVIDER, "ses")
    async with api_client(db, clock=lambda: now) as api:
        text = (await api.get("/metrics")).text
    assert 'mailbag_pause_age_seconds{scope="provider"} 0.0' in text
    assert oldest_by_scope([], now) == {scope: (0, 0.0) for scope in Scope}


ALERT_TEST = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'mailbag_pause_age_seconds{{scope="tenant"}}'
        values: '3000+60x20'
      - series: 'mailbag_pause_age_seconds{{scope="fleet"}}'
        values: '0x20'
    alert_rule_test:
      - eval_time: 9m
        alertname: MailbagPausedLong
        exp_alerts: []
      - eval_time: 11m
        alertname: MailbagPausedLong
        exp_alerts:
          - exp_labels: {{severity: warning, scope: tenant}}
            exp_annotations:
              summary: "A tenant pause has lasted 1h 1m 0s"
              description: "{description}"
"""


def test_the_alert_fires_for_a_pause_older_than_an_hour_and_not_before(tmp_path):
    import yaml

    rules_file = ROOT / "deploy" / "prometheus-alerts.yml"
    rules = yaml.safe_load(rules_file.read_text())["groups"][0]["rules"]
    (rule,) = [r for r in rules if r["alert"] == "MailbagPausedLong"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    test = tmp_path / "paused_long_test.yml"
    description = rule["annotations"]["description"].replace("\\", "\\\\").replace('"', '\\"')
    test.write_text(ALERT_TEST.format(rules=rules_file, description=description))
    done = subprocess.run(
        [promtool, "test", "rules", str(test)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
