"""The store's state changes, on SQLite, PostgreSQL and MariaDB (the seed design's list)."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from mailbag.domain.delivery import Decision
from mailbag.domain.message import Filter
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Action, Status
from mailbag.services import intake
from mailbag.services import outbox as outbox_service
from mailbag.store import dispatch, operator
from mailbag.store import enqueue as enqueue_store
from mailbag.store import messages as message_store
from mailbag.store.plan import run, run_async
from mailbag.store.schema import message_events, outbox_messages

from helpers import (
    LEASE,
    T0,
    claim,
    count_rows,
    enqueue,
    events,
    finalize,
    get,
    message,
    race_claims,
    sweep,
)

LATER = T0 + timedelta(days=365)


def test_claim_takes_due_messages_oldest_first_and_only_once(db):
    first = enqueue(db, 3)
    enqueue(db, 2, now=T0 + timedelta(seconds=1))
    enqueue(db, 1, send_at=T0 + timedelta(hours=1))  # scheduled: not due yet

    now = T0 + timedelta(seconds=1)
    batch = claim(db, now=now, limit=4)
    assert len(batch.messages) == 4
    assert {m.id for m in batch.messages[:3]} == {m.id for m in first}  # due first, taken first
    assert all(m.status == Status.PROCESSING for m in batch.messages)
    assert all(m.claim_token == batch.token and m.claimed_by == "w1" for m in batch.messages)
    assert all(m.lease_expires_at == now + LEASE for m in batch.messages)

    second = claim(db, now=now, limit=10)
    assert len(second.messages) == 1
    assert not {m.id for m in second.messages} & {m.id for m in batch.messages}
    assert claim(db, now=now, limit=10).messages == []
    assert len(claim(db, now=T0 + timedelta(hours=1), limit=10).messages) == 1


def test_concurrent_claimers_take_every_row_exactly_once(db):
    """8 claimers on separate connections race over 2,000 due rows."""
    total, claimers = 2000, 8
    with db.engine.begin() as conn:
        run(
            conn,
            enqueue_store.enqueue(
                [message(i) for i in range(total)], now=T0, default_max_attempts=5
            ),
        )
    taken = race_claims(db, claimers, limit=25)
    every = [mid for ids in taken for mid in ids]
    duplicates = [mid for mid, n in Counter(every).items() if n > 1]
    assert duplicates == []
    assert len(every) == total
    if db.dialect != "sqlite":
        # SQLite has one writer at a time and its busy handler favours whoever just wrote,
        # so there one claimer may take everything; the servers must share the work.
        assert sum(1 for ids in taken if ids) > 1, "the race needs several winners to mean much"
    with db.engine.connect() as conn:
        claims = conn.execute(
            select(func.count())
            .select_from(message_events)
            .where(message_events.c.to_status == Status.PROCESSING.value)
        ).scalar_one()
        processing = conn.execute(
            select(func.count())
            .select_from(outbox_messages)
            .where(outbox_messages.c.status == Status.PROCESSING.value)
        ).scalar_one()
    assert claims == total and processing == total


def test_an_active_lease_is_neither_stolen_nor_swept(db):
    (msg,) = enqueue(db)
    held = claim(db)
    just_before_expiry = T0 + LEASE - timedelta(seconds=1)
    assert claim(db, now=just_before_expiry, worker="w2").messages == []
    assert sweep(db, just_before_expiry) == []
    assert get(db, msg.id).claim_token == held.token


def test_an_expired_lease_is_swept_to_unknown_and_never_claimed_again(db):
    (msg,) = enqueue(db)
    claim(db)
    swept = sweep(db, T0 + LEASE + timedelta(seconds=1))
    assert [c.message.id for c in swept] == [msg.id]
    row = get(db, msg.id)
    assert row.status == Status.UNKNOWN
    assert row.claim_token is None and row.attempt_count == 1
    assert row.claimed_by == "w1"  # kept for the operator who has to decide
    assert claim(db, now=LATER).messages == []
    assert sweep(db, LATER) == []  # a second sweeper finds nothing left to do
    assert [e.to_status for e in events(db, msg.id)] == ["pending", "processing", "unknown"]


def test_unknown_and_dead_are_never_claimable(db):
    a, b = enqueue(db, 2)
    batch = claim(db)
    finalize(
        db,
        batch.token,
        (a.id, Decision(Action.MARK_UNKNOWN, error="timeout after DATA")),
        (b.id, Decision(Action.BURY, error="budget spent")),
    )
    assert {get(db, a.id).status, get(db, b.id).status} == {Status.UNKNOWN, Status.DEAD}
    assert claim(db, now=LATER).messages == []


def test_a_stale_claimant_cannot_finalize_after_a_sweep(db):
    (msg,) = enqueue(db)
    stale = claim(db)
    sweep(db, T0 + LEASE + timedelta(seconds=1))
    result = finalize(
        db, stale.token, (msg.id, Decision(Action.MARK_SENT, provider_message_id="late-id"))
    )
    assert result.changed == [] and result.stale == [msg.id]
    row = get(db, msg.id)
    assert row.status == Status.UNKNOWN and row.provider_message_id is None


def test_a_stale_claimant_cannot_undo_a_newer_claimants_result(db):
    (msg,) = enqueue(db)
    old = claim(db, worker="old")
    sweep(db, T0 + LEASE + timedelta(seconds=1))
    with db.engine.begin() as conn:
        run(
            conn,
            operator.requeue(
                where=Filter(ids=[msg.id]),
                now=T0 + LEASE * 2,
                actor="operator",
                extra_attempts=5,
            ),
        )
    new = claim(db, now=T0 + LEASE * 3, worker="new")
    assert new.token != old.token
    finalize(db, new.token, (msg.id, Decision(Action.MARK_SENT, provider_message_id="p-new")))
    late = finalize(db, old.token, (msg.id, Decision(Action.FAIL, error="old worker gave up")))
    assert late.stale == [msg.id]
    row = get(db, msg.id)
    assert row.status == Status.SENT and row.provider_message_id == "p-new"


def test_transient_failures_retry_with_backoff_until_dead(db):
    policy = RetryPolicy(max_attempts=3)
    (msg,) = enqueue(db)
    now = T0
    for attempt in range(1, 4):
        batch = claim(db, now=now)
        assert [m.id for m in batch.messages] == [msg.id]
        assert batch.messages[0].attempt == attempt
        action = policy.after_transient_failure(attempt)
        next_at = policy.next_attempt_at(now, attempt)
        finalize(
            db,
            batch.token,
            (msg.id, Decision(action, error=f"451 try {attempt}", next_attempt_at=next_at)),
            now=now,
        )
        row = get(db, msg.id)
        assert row.attempt_count == attempt
        if attempt < 3:
            assert row.status == Status.RETRYING and row.next_attempt_at == next_at
            if next_at > now:
                assert claim(db, now=next_at - timedelta(microseconds=1)).messages == []
            now = next_at
    row = get(db, msg.id)
    assert row.status == Status.DEAD and row.last_error == "451 try 3"
    assert claim(db, now=LATER).messages == []


def test_a_permanent_failure_is_final_at_once(db):
    (msg,) = enqueue(db)
    batch = claim(db)
    finalize(db, batch.token, (msg.id, Decision(Action.FAIL, error="550 no such user")))
    row = get(db, msg.id)
    assert (row.status, row.attempt_count, row.last_error) == (Status.FAILED, 1, "550 no such user")
    assert claim(db, now=LATER).messages == []


def test_a_successful_finalize_clears_the_claim(db):
    (msg,) = enqueue(db)
    batch = claim(db)
    finalize(
        db,
        batch.token,
        (msg.id, Decision(Action.MARK_SENT, provider_message_id="p1")),
        now=T0 + timedelta(seconds=2),
    )
    row = get(db, msg.id)
    assert row.status == Status.SENT and row.provider_message_id == "p1" and row.provider == "test"
    assert row.sent_at == T0 + timedelta(seconds=2)
    assert (row.claim_token, row.claimed_by, row.claimed_at, row.lease_expires_at) == (None,) * 4
    sent_event = events(db, msg.id)[-1]
    assert (
        sent_event.from_status,
        sent_event.to_status,
        sent_event.attempt,
        sent_event.provider_message_id,
        sent_event.actor,
    ) == ("processing", "sent", 1, "p1", "w1")


def test_release_hands_the_message_back_without_spending_an_attempt(db):
    fresh, retried = enqueue(db, 2)
    batch = claim(db)
    finalize(db, batch.token, (retried.id, Decision(Action.RETRY, error="421", next_attempt_at=T0)))
    again = claim(db)
    finalize(db, again.token, (retried.id, Decision(Action.RELEASE)))
    finalize(db, batch.token, (fresh.id, Decision(Action.RELEASE)))
    assert (get(db, fresh.id).status, get(db, fresh.id).attempt_count) == (Status.PENDING, 0)
    assert (get(db, retried.id).status, get(db, retried.id).attempt_count) == (Status.RETRYING, 1)
    assert {m.id for m in claim(db).messages} == {fresh.id, retried.id}


def test_a_batch_finalize_applies_each_outcome_in_one_pass(db):
    msgs = enqueue(db, 6)
    batch = claim(db)
    outcomes = [
        (msgs[0].id, Decision(Action.MARK_SENT, provider_message_id="p0")),
        (msgs[1].id, Decision(Action.MARK_SENT, provider_message_id="p1")),
        (msgs[2].id, Decision(Action.RETRY, error="e2", next_attempt_at=T0 + timedelta(1))),
        (msgs[3].id, Decision(Action.RETRY, error="e3", next_attempt_at=T0 + timedelta(2))),
        (msgs[4].id, Decision(Action.MARK_UNKNOWN, error="timeout", provider_message_id=None)),
        (msgs[5].id, Decision(Action.FAIL, error="550")),
    ]
    result = finalize(db, batch.token, *outcomes)
    assert len(result.changed) == 6 and result.stale == []
    rows = [get(db, m.id) for m in msgs]
    assert [r.status for r in rows] == ["sent", "sent", "retrying", "retrying", "unknown", "failed"]
    assert [r.provider_message_id for r in rows[:2]] == ["p0", "p1"]
    assert [r.next_attempt_at for r in rows[2:4]] == [T0 + timedelta(1), T0 + timedelta(2)]
    assert [r.last_error for r in rows[2:]] == ["e2", "e3", "timeout", "550"]


def test_a_keyed_retry_keeps_the_attempt_number(db):
    (msg,) = enqueue(db)
    batch = claim(db)
    finalize(
        db,
        batch.token,
        (
            msg.id,
            Decision(
                Action.RETRY,
                error="read timeout",
                next_attempt_at=T0,
                keep_attempt=True,
                ambiguous_since=T0,
            ),
        ),
    )
    row = get(db, msg.id)
    assert (row.status, row.attempt_count, row.ambiguous_since) == (Status.RETRYING, 0, T0)
    again = claim(db)
    assert again.messages[0].attempt == 1  # the same attempt, hence the same provider key
    finalize(db, again.token, (msg.id, Decision(Action.MARK_SENT, provider_message_id="p")))
    row = get(db, msg.id)
    assert (row.attempt_count, row.ambiguous_since) == (1, None)


def test_extend_lease_keeps_a_slow_send_from_being_swept(db):
    (msg,) = enqueue(db)
    batch = claim(db)
    later = T0 + LEASE - timedelta(seconds=5)
    with db.engine.begin() as conn:
        assert (
            run(
                conn,
                dispatch.extend_lease(token=batch.token, ids=[msg.id], now=later, lease=LEASE),
            )
            == 1
        )
    assert sweep(db, T0 + LEASE + timedelta(seconds=1)) == []
    with db.engine.begin() as conn:
        assert (
            run(
                conn,
                dispatch.extend_lease(
                    token=batch.token.__class__(int=1),
                    ids=[msg.id],
                    now=later,
                    lease=LEASE,
                ),
            )
            == 0
        )


def test_duplicate_enqueue_returns_the_existing_message_and_keeps_the_transaction(db):
    (first,) = enqueue(db, idempotency_key="signup-42")
    with db.engine.begin() as conn:
        dup = outbox_service.write_many(conn, [message(9, idempotency_key="signup-42")])[0]
        assert not dup.created and dup.message.id == first.id
        assert dup.message.to_address == "user0@example.com"
        # The transaction is still usable: later statements in it run and commit.
        other = outbox_service.write_many(conn, [message(10, idempotency_key="other")])[0]
        conn.execute(text("SELECT 1"))
    assert other.created
    assert get(db, other.message.id) is not None
    assert count_rows(db) == (2, 2)


def test_the_same_key_in_another_tenant_is_another_message(db):
    (a,) = enqueue(db, idempotency_key="k", tenant_id="t1")
    (b,) = enqueue(db, idempotency_key="k", tenant_id="t2")
    assert a.id != b.id


def test_a_bulk_enqueue_with_repeated_keys_inserts_each_key_once(db):
    with db.engine.begin() as conn:
        results = outbox_service.write_many(
            conn,
            [
                message(0, idempotency_key="a"),
                message(1, idempotency_key="a"),
                message(2),
                message(3, idempotency_key="b"),
            ],
        )
    assert [r.created for r in results] == [True, False, True, True]
    assert results[0].message.id == results[1].message.id
    assert count_rows(db) == (3, 3)


def test_concurrent_duplicate_enqueues_create_exactly_one_row(db):
    callers = 8
    engine = db.new_engine(pool_size=callers)
    start = threading.Barrier(callers)
    ids: list = []
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            if db.dialect == "sqlite":
                start.wait()  # BEGIN IMMEDIATE is already the write: SQLite queues them there
            with engine.begin() as conn:
                if db.dialect != "sqlite":
                    start.wait()  # every transaction is open before anyone inserts
                result = outbox_service.write_many(conn, [message(i, idempotency_key="once")])
                ids.append(result[0].message.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert not errors, errors
    assert len(ids) == callers and len(set(ids)) == 1
    assert count_rows(db) == (1, 1)


def test_the_callers_rollback_leaves_no_message(db):
    with db.engine.connect() as conn, conn.begin() as tx:
        outbox_service.write_many(conn, [message(0, idempotency_key="rolled-back")])
        tx.rollback()
    assert count_rows(db) == (0, 0)
    (again,) = enqueue(db, idempotency_key="rolled-back")
    assert get(db, again.id) is not None


async def test_enqueue_inside_an_async_callers_transaction(db, async_engine):
    async with async_engine.begin() as conn:
        await conn.execute(text("SELECT 1"))  # the caller's own work in the same transaction
        first = await intake.enqueue_async(
            conn, to="a@example.com", template="welcome", data={"name": "A"}, idempotency_key="k"
        )
        dup = await intake.enqueue_async(
            conn, to="a@example.com", template="welcome", data={"name": "A"}, idempotency_key="k"
        )
    assert first.created and not dup.created and first.message.id == dup.message.id
    async with async_engine.connect() as conn:
        row = await run_async(conn, message_store.get(first.message.id))
    assert row is not None and row.status == Status.PENDING


def test_requeue_and_cancel_follow_the_transition_table(db):
    pending, unknown, dead, sent = enqueue(db, 4)
    batch = claim(db, limit=3)
    assert {m.id for m in batch.messages} == {pending.id, unknown.id, dead.id}
    finalize(
        db,
        batch.token,
        (pending.id, Decision(Action.RELEASE)),
        (unknown.id, Decision(Action.MARK_UNKNOWN, error="?")),
        (dead.id, Decision(Action.BURY, error="x")),
    )

    with db.engine.begin() as conn:
        requeued = run(
            conn,
            operator.requeue(
                where=Filter(ids=[pending.id, unknown.id, dead.id, sent.id]),
                now=T0,
                actor="operator:test",
                extra_attempts=5,
            ),
        )
    assert {c.message.id for c in requeued} == {unknown.id, dead.id}
    assert all(c.message.max_attempts == 6 for c in requeued)  # one done + five more

    with db.engine.begin() as conn:
        cancelled = run(
            conn,
            operator.cancel(
                where=Filter(ids=[pending.id, unknown.id, sent.id]),
                now=T0,
                actor="operator:test",
            ),
        )
    # All three are pending now (sent was never claimed), so all three are cancelled.
    assert {c.message.id for c in cancelled} == {pending.id, unknown.id, sent.id}
    assert get(db, dead.id).status == Status.PENDING


def test_resolve_settles_only_unknown_messages(db):
    a, b = enqueue(db, 2)
    batch = claim(db)
    finalize(
        db,
        batch.token,
        (a.id, Decision(Action.MARK_UNKNOWN, error="timeout")),
        (b.id, Decision(Action.MARK_SENT, provider_message_id="pb")),
    )
    with db.engine.begin() as conn:
        ok = run(
            conn,
            operator.resolve(
                message_id=a.id,
                sent=True,
                now=T0,
                actor="reconciler",
                evidence="delivered event",
                provider_message_id="pa",
            ),
        )
        no = run(
            conn,
            operator.resolve(
                message_id=b.id,
                sent=False,
                now=T0,
                actor="reconciler",
                evidence="bounce",
            ),
        )
    assert [c.message.status for c in ok] == ["sent"] and no == []
    assert get(db, a.id).provider_message_id == "pa"


def test_purge_deletes_old_finished_messages_only(db):
    old_sent, old_unknown, recent = enqueue(db, 3)
    batch = claim(db)
    finalize(
        db,
        batch.token,
        (old_sent.id, Decision(Action.MARK_SENT, provider_message_id="p")),
        (old_unknown.id, Decision(Action.MARK_UNKNOWN, error="?")),
    )
    # `recent` stays processing, and unknown is never purged: only old_sent goes.
    with db.engine.begin() as conn:
        assert run(conn, operator.purge(older_than=T0 + timedelta(days=1))) == 1
    assert get(db, old_sent.id) is None
    assert get(db, old_unknown.id).status == Status.UNKNOWN
    assert get(db, recent.id) is not None
    assert events(db, old_sent.id) == []


def test_enqueue_rejects_nothing_it_validated_and_writes_text_verbatim(db):
    (msg,) = enqueue(
        db,
        to="Ada@EXAMPLE.com",
        to_name="Ada Lovelace",
        subject="Hi – ünïcödé",
        tags=["a", "b", "a"],
        headers={"X-Campaign": "spring"},
        metadata={"order": 7},
    )
    row = get(db, msg.id)
    assert row.to_address == "Ada@example.com"  # the domain is normalized, the local part kept
    assert row.subject == "Hi – ünïcödé"
    assert list(row.tags) == ["a", "b"]
    assert dict(row.headers) == {"X-Campaign": "spring"}
    assert dict(row.metadata) == {"order": 7}


@pytest.mark.parametrize("length", [1999, 2000, 5000])
def test_last_error_keeps_at_most_2000_characters(db, length):
    (msg,) = enqueue(db)
    batch = claim(db)
    finalize(db, batch.token, (msg.id, Decision(Action.FAIL, error="e" * length)))
    stored = get(db, msg.id).last_error
    assert len(stored) == min(length, 2000)
    assert events(db, msg.id)[-1].detail == stored


def test_a_tenant_scope_is_never_dropped_even_an_empty_one(db):
    """A filter that names a tenant matches that tenant only: an empty id matches nobody,
    never every tenant's messages."""
    (msg,) = enqueue(db)
    with db.engine.connect() as conn:
        assert run(conn, message_store.page(Filter(tenant_id=msg.tenant_id), limit=10))[0]
        assert run(conn, message_store.page(Filter(tenant_id=""), limit=10)) == ([], False)
