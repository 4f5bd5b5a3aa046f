"""The deliverer's bookkeeping in batches (issue 27): one statement per kind of outcome for
many deliveries of several claims, each delivery keeping its own result; and a turn of the
deliverer that records what finished and claims in one transaction. On each database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from mailbag.domain import hooks as rules
from mailbag.domain.delivery import Decision
from mailbag.domain.hooks import Breaker, DAction, HookEndpoint, SecretBox
from mailbag.domain.ids import uuid7
from mailbag.domain.states import Action
from mailbag.store import hooks as store
from mailbag.store.plan import run
from mailbag.store.schema import hook_deliveries, hook_delivery_events, hook_endpoints

from conftest import TestDB
from helpers import T0, claim, enqueue, finalize

BOX = SecretBox("hooks-key-for-batch-tests-0123456789abcdef")
LATER = T0 + timedelta(minutes=5)


@pytest.fixture(autouse=True)
def fan_out_on(db: TestDB) -> Iterator[None]:
    with db.fanning_out(store.FanOut(max_attempts=3)):
        yield


def endpoint(db: TestDB, host: str, tenant: str = "default") -> uuid.UUID:
    found = HookEndpoint(
        id=uuid7(),
        tenant_id=tenant,
        url=f"https://{host}/h",
        events=frozenset({rules.HookEvent.SENT}),
        enabled=True,
        description=None,
        created_at=T0,
        updated_at=T0,
    )
    with db.engine.begin() as conn:
        run(conn, store.create_endpoint(found, BOX.seal(rules.new_secret())))
    return found.id


def sent(db: TestDB, n: int, tenant: str = "default") -> None:
    messages = enqueue(db, n, tenant_id=tenant)
    token = claim(db, limit=n).token
    finalize(
        db, token, *((m.id, Decision(Action.MARK_SENT, provider_message_id="p")) for m in messages)
    )


def take(db: TestDB, limit: int, **fields: Any) -> store.HookClaim:
    with db.engine.begin() as conn:
        return run(
            conn,
            store.claim(
                worker_id=fields.get("worker", "w1"),
                now=fields.get("now", T0),
                lease=timedelta(minutes=1),
                limit=limit,
                fairness=store.Fairness(in_flight=100),
            ),
        )


def settle(db: TestDB, claims: dict[uuid.UUID, list[store.Attempted]], **fields: Any) -> Any:
    with db.engine.begin() as conn:
        return run(
            conn,
            store.settle_claims(
                claims,
                now=fields.get("now", T0),
                actor="w1",
                breaker=fields.get("breaker", Breaker()),
            ),
        )


def row(db: TestDB, delivery_id: uuid.UUID) -> Any:
    with db.engine.connect() as conn:
        return conn.execute(
            select(hook_deliveries).where(hook_deliveries.c.id == delivery_id)
        ).one()


def moves(
    db: TestDB, delivery_id: uuid.UUID
) -> list[tuple[str | None, str, int, int | None, str | None]]:
    with db.engine.connect() as conn:
        found = conn.execute(
            select(hook_delivery_events)
            .where(hook_delivery_events.c.delivery_id == delivery_id)
            .order_by(hook_delivery_events.c.id)
        ).all()
    return [(m.from_status, m.to_status, m.attempt, m.status_code, m.detail) for m in found]


def test_one_settle_of_two_claims_keeps_each_deliverys_own_result(db):
    endpoint(db, "a.example.com")
    sent(db, 6)
    first, second = take(db, 3), take(db, 3)
    a, b, c = (d.delivery.id for d in first.deliveries)
    d, e, f = (d.delivery.id for d in second.deliveries)
    soon, sooner = T0 + timedelta(seconds=40), T0 + timedelta(seconds=20)
    settled = settle(
        db,
        {
            first.token: [
                store.Attempted(a, DAction.DELIVER, status_code=200),
                store.Attempted(b, DAction.RETRY, 503, "http-5xx: HTTP 503", soon),
                store.Attempted(c, DAction.BURY, 410, "http-4xx: HTTP 410"),
            ],
            second.token: [
                store.Attempted(d, DAction.DELIVER, status_code=204),
                store.Attempted(e, DAction.RETRY, None, "timeout: no answer", sooner),
                store.Attempted(f, DAction.RELEASE),
            ],
        },
    )
    assert {x.id: x.status.value for x in settled.deliveries} == {
        a: "delivered",
        b: "retrying",
        c: "dead",
        d: "delivered",
        e: "retrying",
        f: "pending",
    }
    got = {x: row(db, x) for x in (a, b, c, d, e, f)}
    assert {x: (r.attempts, r.last_status_code, r.last_error) for x, r in got.items()} == {
        a: (1, 200, None),
        b: (1, 503, "http-5xx: HTTP 503"),
        c: (1, 410, "http-4xx: HTTP 410"),
        d: (1, 204, None),
        e: (1, None, "timeout: no answer"),
        f: (0, None, None),  # released: no attempt spent
    }
    assert (got[b].next_attempt_at, got[e].next_attempt_at) == (soon, sooner)
    assert got[a].delivered_at == got[d].delivered_at == T0
    assert {got[x].next_attempt_at for x in (a, c, d, f)} == {T0}  # kept
    assert {r.claim_token for r in got.values()} == {None}
    assert moves(db, b)[-1] == ("processing", "retrying", 1, 503, "http-5xx: HTTP 503")
    assert moves(db, d)[-1] == ("processing", "delivered", 1, 204, None)
    assert moves(db, f)[-1] == (
        "processing",
        "pending",
        1,
        None,
        "released unposted; no attempt spent",
    )


def test_a_result_under_a_stale_claim_changes_nothing_and_the_rest_of_its_batch_is_kept(db):
    endpoint(db, "a.example.com")
    sent(db, 3)
    mine = take(db, 3)
    x, y, z = (d.delivery.id for d in mine.deliveries)
    # y's lease ran out, the sweep took it back and another worker holds it now.
    with db.engine.begin() as conn:
        run(conn, store.sweep(now=T0 + timedelta(minutes=2), actor="sweeper"))
    theirs = take(db, 1, worker="w2", now=T0 + timedelta(minutes=2))
    assert [d.delivery.id for d in theirs.deliveries] == [x]  # all three were swept: x first
    settled = settle(
        db,
        {
            mine.token: [
                store.Attempted(x, DAction.DELIVER, status_code=204),
                store.Attempted(y, DAction.DELIVER, status_code=204),
                store.Attempted(z, DAction.BURY, 410, "http-4xx: HTTP 410"),
            ]
        },
    )
    assert settled.deliveries == []  # every one of them was swept: none is ours now
    assert row(db, x).claimed_by == "w2" and row(db, x).status == "processing"
    # Its own claim's result is recorded beside the stale ones of another claim.
    settled = settle(
        db,
        {
            mine.token: [store.Attempted(y, DAction.DELIVER, status_code=204)],
            theirs.token: [store.Attempted(x, DAction.DELIVER, status_code=202)],
        },
    )
    assert [(d.id, d.last_status_code) for d in settled.deliveries] == [(x, 202)]
    assert (row(db, y).status, row(db, y).attempts) == ("retrying", 1)  # the sweep's


def test_failures_in_a_batch_count_against_their_own_endpoint_only(db):
    failing, healthy = endpoint(db, "failing.example.com"), endpoint(db, "ok.example.com", "t_ok")
    sent(db, 3)
    sent(db, 3, tenant="t_ok")
    batch = take(db, 6)
    by_endpoint: dict[uuid.UUID, list[uuid.UUID]] = {}
    for claimed in batch.deliveries:
        by_endpoint.setdefault(claimed.delivery.endpoint_id, []).append(claimed.delivery.id)
    results = [
        store.Attempted(i, DAction.RETRY, 500, "http-5xx: HTTP 500", LATER)
        for i in by_endpoint[failing]
    ] + [store.Attempted(i, DAction.DELIVER, status_code=204) for i in by_endpoint[healthy]]
    settled = settle(db, {batch.token: results}, breaker=Breaker(failures=3))
    assert settled.paused == {failing: T0 + Breaker().base}
    with db.engine.connect() as conn:
        rows = dict(
            conn.execute(select(hook_endpoints.c.id, hook_endpoints.c.failures_in_row)).all()
        )
    assert rows == {failing: 3, healthy: 0}
    assert {row(db, i).status for i in by_endpoint[healthy]} == {"delivered"}
    assert {row(db, i).status for i in by_endpoint[failing]} == {"retrying"}
