"""Random sequences of store operations, every row checked against the transition table.

Hypothesis drives enqueues, claims, finalizes (current and stale tokens), sweeps, requeues,
cancels and resolutions while the clock moves; after every step each message's event
history must be a path through the domain's table ending in its current state, and claim
bookkeeping must match the state.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import select

from mailbag.domain.delivery import Decision
from mailbag.domain.message import Filter
from mailbag.domain.states import CLAIMABLE, Action, Status, can_move
from mailbag.store import dispatch, operator
from mailbag.store import enqueue as enqueue_store
from mailbag.store.plan import run
from mailbag.store.schema import message_events, outbox_messages

from conftest import TestDB
from helpers import T0, message

LEASE = timedelta(seconds=60)
FINAL_ACTIONS = [
    Action.MARK_SENT,
    Action.RETRY,
    Action.FAIL,
    Action.BURY,
    Action.MARK_UNKNOWN,
    Action.RELEASE,
]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self, db: TestDB) -> None:
        super().__init__()
        self.db = db
        self.now = T0
        self.claims: list[dispatch.Claim] = []
        self.ids: list[Any] = []
        self.serial = 0

    def _run(self, plan: Any) -> Any:
        with self.db.engine.begin() as conn:
            return run(conn, plan)

    def _rows(self) -> dict[Any, Any]:
        with self.db.engine.connect() as conn:
            return {r.id: r for r in conn.execute(select(outbox_messages))}

    @initialize()
    def start_empty(self) -> None:
        self.db.clear()

    @rule(n=st.integers(1, 4), keyed=st.booleans())
    def enqueue(self, n: int, keyed: bool) -> None:
        batch = []
        for _ in range(n):
            self.serial += 1
            key = f"k{self.serial % 5}" if keyed else None
            batch.append(message(self.serial, idempotency_key=key))
        results = self._run(enqueue_store.enqueue(batch, now=self.now, default_max_attempts=3))
        for result in results:
            if result.created:
                assert result.message.status == Status.PENDING
                self.ids.append(result.message.id)
            else:
                assert result.message.id in self.ids

    @rule(limit=st.integers(1, 5))
    def claim(self, limit: int) -> None:
        before = self._rows()
        batch = self._run(dispatch.claim(worker_id="w", now=self.now, lease=LEASE, limit=limit))
        assert len(batch.messages) <= limit
        for m in batch.messages:
            assert before[m.id].status in CLAIMABLE
            assert before[m.id].next_attempt_at <= self.now
        due = [
            r for r in before.values() if r.status in CLAIMABLE and r.next_attempt_at <= self.now
        ]
        assert len(batch.messages) == min(limit, len(due))
        if batch.messages:
            self.claims.append(batch)

    @rule(data=st.data())
    def finalize(self, data: st.DataObject) -> None:
        if not self.claims:
            return
        batch = data.draw(st.sampled_from(self.claims))
        picked = data.draw(
            st.lists(st.sampled_from(batch.messages), min_size=1, unique_by=lambda m: m.id)
        )
        outcomes = [
            (
                m.id,
                Decision(
                    data.draw(st.sampled_from(FINAL_ACTIONS)),
                    provider_message_id=f"p-{m.id.hex[:6]}",
                    error="boom",
                    next_attempt_at=self.now + timedelta(seconds=data.draw(st.integers(0, 90))),
                ),
            )
            for m in picked
        ]
        before = self._rows()
        held = {
            message_id
            for message_id, _ in outcomes
            if before[message_id].claim_token == batch.token
            and before[message_id].status == Status.PROCESSING
        }
        result = self._run(
            dispatch.finalize(
                token=batch.token,
                decisions=dict(outcomes),
                now=self.now,
                actor="w",
            )
        )
        assert {c.message.id for c in result.changed} == held
        assert set(result.stale) == {message_id for message_id, _ in outcomes} - held

    @rule(seconds=st.integers(1, 120))
    def tick(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def sweep(self) -> None:
        before = self._rows()
        swept = self._run(dispatch.sweep_expired(now=self.now, actor="sweeper"))
        expected = {
            i
            for i, r in before.items()
            if r.status == Status.PROCESSING and r.lease_expires_at < self.now
        }
        assert {c.message.id for c in swept} == expected

    @rule(data=st.data())
    def operator(self, data: st.DataObject) -> None:
        if not self.ids:
            return
        target = data.draw(st.sampled_from(self.ids))
        before = self._rows()[target].status
        choice = data.draw(st.sampled_from(["requeue", "cancel", "resolve_sent", "resolve_failed"]))
        where = Filter(ids=[target])
        if choice == "requeue":
            plan = operator.requeue(where=where, now=self.now, actor="op", extra_attempts=2)
            allowed = before in (Status.UNKNOWN, Status.DEAD)
        elif choice == "cancel":
            plan = operator.cancel(where=where, now=self.now, actor="op")
            allowed = before == Status.PENDING
        else:
            plan = operator.resolve(
                message_id=target,
                sent=choice == "resolve_sent",
                now=self.now,
                actor="op",
                evidence="test",
            )
            allowed = before == Status.UNKNOWN
        changed = self._run(plan)
        assert bool(changed) == allowed

    @invariant()
    def every_row_follows_the_transition_table(self) -> None:
        rows = self._rows()
        with self.db.engine.connect() as conn:
            logged = conn.execute(select(message_events).order_by(message_events.c.id)).all()
        history: dict[Any, list[Any]] = {}
        for event in logged:
            history.setdefault(event.message_id, []).append(event)
        assert set(history) == set(rows)
        for message_id, row in rows.items():
            path = history[message_id]
            previous = None
            for event in path:
                assert event.from_status == previous
                assert can_move(Status(previous) if previous else None, Status(event.to_status))
                previous = event.to_status
            assert previous == row.status
            in_flight = row.status == Status.PROCESSING
            assert (row.claim_token is not None) == in_flight
            assert (row.lease_expires_at is not None) == in_flight
            attempts = sum(
                1
                for e in path
                if e.from_status == Status.PROCESSING.value
                and e.to_status != Status.PENDING.value
                and e.detail != "released unsent; no attempt spent"
            )
            assert row.attempt_count == attempts
            if row.status == Status.SENT:
                assert row.sent_at is not None


def test_random_operation_sequences_respect_the_transition_table(db):
    examples = 150 if db.dialect == "sqlite" else 40
    run_state_machine_as_test(
        lambda: StoreMachine(db),
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
