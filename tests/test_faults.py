"""The `faults` provider (mailbag.testing.faults): each fault ends as a real provider's
failure does in the real worker, reconciliation settles what timed out after acceptance
as sent and never sends it again, webhook-like events (duplicated, out of order) settle
each message once, and a seed gives the same answers (issue 24, item 7)."""

from __future__ import annotations

import asyncio
import random
import subprocess
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from api_helpers import settings_for
from mailbag import providers
from mailbag.domain.faults import Fault, Plan, parse_rates, parse_script
from mailbag.domain.states import Status
from mailbag.providers.faults import FaultProvider
from mailbag.settings import InvalidSettings, Settings, read_settings
from mailbag.store.schema import suppressions
from mailbag.testing import (
    Undelivered,
    capture,
    deliver_all_async,
    faults,
    ingest_events_async,
    reconcile_async,
)
from servers import mailbag_env, start_mailbag, stop
from test_scheduler import wait_for
from test_worker import all_in, enqueue, make_worker

from conftest import TestDB
from helpers import events, get, run_worker_until

TERMINAL = (Status.SENT, Status.FAILED, Status.DEAD, Status.UNKNOWN)


def faults_of(provider: FaultProvider, message_id: Any) -> list[Fault]:
    return [a.fault for a in provider.answered if a.message_id == message_id]


def into(db: TestDB, message_id: Any, status: str) -> list[Any]:
    return [e for e in events(db, message_id) if e.to_status == status]


async def test_a_timeout_after_acceptance_ends_unknown_then_is_settled_as_sent_never_resent(
    db, async_engine
):
    (mid,) = enqueue(db, 1)
    provider = faults(script="timeout_after_accept")
    worker = make_worker(db, async_engine, provider)
    with capture() as outbox:
        await run_worker_until(worker, all_in(db, Status.UNKNOWN, total=1))
        await run_worker_until(worker, lambda: True)  # another round claims nothing
        await asyncio.sleep(0.2)
    assert [email.message_id for email in outbox] == [mid]  # it left, once
    assert get(db, mid).status == Status.UNKNOWN
    assert get(db, mid).last_error.startswith("faults: read timeout after the request was sent")

    done = await reconcile_async(db.engine, provider, settings=settings_for(db))

    assert done == {"resolved_sent": 1}
    row = get(db, mid)
    assert (row.status, row.attempt_count) == (Status.SENT, 1)
    assert row.provider_message_id == f"capture-{mid}-1"  # the id the inner provider gave
    (settled,) = into(db, mid, "sent")
    assert (settled.from_status, settled.actor) == ("unknown", "reconciler")
    assert provider.answered == [provider.answered[0]]  # asked once: a lookup sends nothing


async def test_a_keyed_timeout_is_retried_under_its_key_and_taken_once(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = faults(script="timeout_after_accept", idempotency_window=timedelta(hours=1))
    with capture() as outbox:
        await run_worker_until(
            make_worker(db, async_engine, provider), all_in(db, Status.SENT, total=1)
        )
    assert faults_of(provider, mid) == [Fault.TIMEOUT_AFTER_ACCEPT, Fault.ACCEPT]
    assert len(outbox) == 1  # the retry under the same key was deduplicated
    row = get(db, mid)
    assert (row.attempt_count, row.provider_message_id) == (1, f"capture-{mid}-1")


async def test_a_429_is_handed_back_at_once_and_sent_without_spending_an_attempt(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = faults(script="throttle")
    with capture() as outbox:
        await run_worker_until(
            make_worker(db, async_engine, provider), all_in(db, Status.SENT, total=1)
        )
    assert faults_of(provider, mid) == [Fault.THROTTLE, Fault.ACCEPT]
    assert len(outbox) == 1
    # decide(): Throttled releases unsent, due at once (the worker pauses its claims and
    # logs the 429; the history keeps no error for a release that does not wait).
    released = next(e for e in events(db, mid) if e.from_status == "processing")
    assert (released.to_status, released.detail) == ("pending", "released unsent; no attempt spent")
    assert get(db, mid).attempt_count == 1  # the one send that went through


@pytest.mark.parametrize("fault", ["server_error", "refuse_connection"])
async def test_a_provider_failure_waits_and_then_sends_once_with_one_attempt(
    db, async_engine, fault
):
    (mid,) = enqueue(db, 1)
    provider = faults(script=f"{fault},{fault}")
    with capture() as outbox:
        await run_worker_until(
            make_worker(db, async_engine, provider), all_in(db, Status.SENT, total=1)
        )
    assert faults_of(provider, mid) == [Fault(fault), Fault(fault), Fault.ACCEPT]
    assert len(outbox) == 1  # refused before taking anything: nothing left twice
    row = get(db, mid)
    assert row.attempt_count == 1
    waits = [e for e in events(db, mid) if e.from_status == "processing" and e.to_status != "sent"]
    assert len(waits) == 2
    assert all(e.detail.endswith("(waits; no attempt spent)") for e in waits)


async def test_a_partial_batch_sends_the_taken_once_and_the_others_by_their_outcome(
    db, async_engine
):
    ids = enqueue(db, 4)
    provider = faults(script="accept,reject,defer,accept", batch_size=4)
    worker = make_worker(db, async_engine, provider, batch_size=4)
    with capture() as outbox:
        await run_worker_until(worker, all_in(db, Status.SENT, Status.FAILED, total=4))
    first = provider.answered[:4]
    assert {a.message_id for a in first} == set(ids)  # one request of four
    by_fault = {a.fault: a.message_id for a in first if a.fault is not Fault.ACCEPT}
    taken = [a.message_id for a in first if a.fault is Fault.ACCEPT]
    for mid in taken:
        assert (get(db, mid).status, get(db, mid).attempt_count) == (Status.SENT, 1)
    rejected = get(db, by_fault[Fault.REJECT])
    assert (rejected.status, rejected.attempt_count) == (Status.FAILED, 1)
    assert rejected.last_error == "faults: 550 5.1.1 the recipient does not exist"
    # Deferred for its own sake: the attempt is spent, the retry (accepted) is the second.
    deferred = get(db, by_fault[Fault.DEFER])
    assert (deferred.status, deferred.attempt_count) == (Status.SENT, 2)
    assert [e.detail for e in into(db, deferred.id, "retrying")] == [
        "faults: 452 4.2.2 mailbox full, try later"
    ]
    assert sorted(map(str, (e.message_id for e in outbox))) == sorted(
        map(str, [*taken, deferred.id])
    )


async def test_duplicated_and_shuffled_events_settle_each_message_once(db, async_engine):
    ids = enqueue(db, 4)
    provider = faults(script="timeout_after_accept,accept,timeout_after_accept,reject", seed=3)
    worker = make_worker(db, async_engine, provider, concurrency=1, batch_size=1)
    await run_worker_until(worker, all_in(db, *TERMINAL, total=4))
    unknown = {a.message_id for a in provider.answered if a.fault is Fault.TIMEOUT_AFTER_ACCEPT}
    assert len(unknown) == 2 and all(get(db, mid).status == Status.UNKNOWN for mid in unknown)
    bounced = next(mid for mid in unknown)
    bounce_to = get(db, bounced).to_address

    reported = provider.events(bounce_to=[bounce_to], duplicate=1.0, shuffle=True)
    # Three taken, one recipient each: accepted then delivered (or bounced), every one twice.
    assert len(reported) == 3 * 2 * 2
    assert [e.kind.value for e in reported] != sorted(e.kind.value for e in reported)
    settings = settings_for(db)
    first = await ingest_events_async(db.engine, reported, settings=settings)
    again = await ingest_events_async(db.engine, reported, settings=settings)

    assert first == {"stored": 6, "duplicates": 6, "unmatched": 0, "resolved": 2, "suppressed": 1}
    assert again == {"stored": 0, "duplicates": 12, "unmatched": 0, "resolved": 0, "suppressed": 0}
    for mid in ids:
        row = get(db, mid)
        expected = Status.FAILED if faults_of(provider, mid) == [Fault.REJECT] else Status.SENT
        assert row.status == expected
        assert len(into(db, mid, row.status)) == 1  # one move into where it ended
    for mid in unknown:
        (settled,) = into(db, mid, "sent")
        assert (settled.from_status, settled.actor) == ("unknown", "reconciler")
    with db.engine.connect() as conn:
        kept = conn.execute(select(suppressions.c.email, suppressions.c.reason)).all()
    assert [tuple(r) for r in kept] == [(bounce_to, "hard_bounce")]


async def test_the_same_seed_gives_the_same_answers_and_the_same_ends(db, async_engine):
    rates = "timeout_after_accept=0.2,server_error=0.3,reject=0.15"

    async def run(seed: int) -> tuple[list[Fault], Counter[str]]:
        ids = enqueue(db, 8)
        provider = faults(rates=rates, seed=seed)
        worker = make_worker(db, async_engine, provider, concurrency=1, batch_size=1)

        def ended() -> bool:
            return all(get(db, mid).status in TERMINAL for mid in ids)

        await run_worker_until(worker, ended, timeout=30)
        return [a.fault for a in provider.answered], Counter(get(db, m).status for m in ids)

    answers, ends = await run(11)
    assert (answers, ends) == await run(11)
    assert len(set(answers)) == 4  # every fault of the rates came up, and accept
    other, _ = await run(12)
    assert other[: len(answers)] != answers[: len(other)]


def test_a_seeded_plan_draws_the_same_answers_for_the_same_requests() -> None:
    rates = parse_rates("throttle=0.1,server_error=0.1,batch_partial=0.3,defer=0.1")

    def answers(seed: int) -> list[list[Fault]]:
        plan = Plan(rates, (), random.Random(seed))
        return [plan.answers(size) for size in [1, 5, 3, 1, 4, 2] * 20]

    assert answers(7) == answers(7) != answers(8)
    drawn = answers(7)
    # A request fault holds for the whole request; a partial batch is never all or none.
    for request in drawn:
        if request[0] in (Fault.THROTTLE, Fault.SERVER_ERROR):
            assert set(request) == {request[0]}
    partial = [r for r in drawn if len(r) > 1 and Fault.ACCEPT in r and len(set(r)) > 1]
    assert partial


def test_a_script_answers_email_by_email_and_then_accepts() -> None:
    plan = Plan({}, parse_script("throttle,reject,accept,defer"), random.Random(0))
    assert plan.answers(1) == [Fault.THROTTLE]
    assert plan.answers(2) == [Fault.REJECT, Fault.ACCEPT]
    assert plan.answers(3) == [Fault.DEFER, Fault.ACCEPT, Fault.ACCEPT]


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("rates", "throttle=0.1,teapot=0.2", "'teapot' is not a rate; one of: timeout_after"),
        ("rates", "throttle=1.5", "throttle: 1.5 is not a rate from 0 to 1"),
        ("rates", "throttle=often", "throttle: 'often' is not a number"),
        ("rates", "throttle", "'throttle' is no name=rate (e.g. throttle=0.1)"),
        ("rates", "throttle=0.6,server_error=0.5", "throttle+server_error add up to 1.1"),
        ("rates", "throttle=0.1,throttle=0.2", "throttle is given twice"),
        ("script", "throttle,batch_partial", "batch_partial is a rate; in a script each"),
        ("script", "accept,explode", "'explode' is not a script entry; one of: accept"),
        ("inner", "faults", "must name the provider the faults wrap"),
    ],
)
def test_fault_settings_that_cannot_work_are_a_settings_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch, setting: str, value: str, says: str
) -> None:
    monkeypatch.setenv(f"MAILBAG_FAULTS_{setting.upper()}", value)
    with pytest.raises(InvalidSettings) as raised:
        read_settings()
    assert str(raised.value).startswith(f"faults_{setting} (MAILBAG_FAULTS_{setting.upper()}): ")
    assert says in str(raised.value)


def test_provider_faults_is_built_from_the_settings() -> None:
    settings = Settings(
        provider="faults",
        faults_script="throttle,accept",
        faults_rates="server_error=0.25",
        faults_seed=5,
        faults_inner="file",
        faults_batch_size=20,
    )
    provider = providers.create("faults", settings)
    assert isinstance(provider, FaultProvider)
    assert provider.plan.script == (Fault.THROTTLE, Fault.ACCEPT)
    assert provider.plan.rates == {Fault.SERVER_ERROR: 0.25}
    assert (provider.inner.name, provider.max_batch_size) == ("file", 20)
    again = providers.create("faults", settings)
    assert isinstance(again, FaultProvider)
    assert again.plan.answers(30) == provider.plan.answers(30)  # FAULTS_SEED


async def test_deliver_all_sends_through_a_fault_provider_and_names_what_is_unknown(db):
    ids = enqueue(db, 2)
    provider = faults(script="timeout_after_accept")
    with pytest.raises(Undelivered) as raised:
        await deliver_all_async(db.engine, settings=settings_for(db), provider=provider)
    (failure,) = raised.value.failures
    assert failure.status == "unknown" and failure.error.startswith("faults: read timeout")
    assert sorted(str(e.message_id) for e in raised.value.outbox) == sorted(map(str, ids))
    assert await reconcile_async(db.engine, provider, settings=settings_for(db)) == {
        "resolved_sent": 1
    }
    with pytest.raises(ValueError, match="respond= answers for the capture provider"):
        await deliver_all_async(db.engine, provider=provider, respond=lambda email: None)


def test_a_worker_process_with_provider_faults_follows_its_settings(db, tmp_path) -> None:
    # The plan from MAILBAG_FAULTS_*, the emails taken written by the file provider, and the
    # worker's own reconciliation settling the timed-out one from the same provider.
    ids = enqueue(db, 2)
    env = mailbag_env(
        db.url,
        provider="faults",
        faults_script="timeout_after_accept,throttle",
        faults_inner="file",
        file_dir=str(tmp_path / "mail"),
        poll_interval="0.1",
        reconcile_every_seconds="0.2",
        scheduler_lease_seconds="1",
    )
    log = tmp_path / "worker.log"
    worker = start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log.open("ab"))
    try:
        wait_for(lambda: all(get(db, mid).status == Status.SENT for mid in ids), 45, "both sent")
    finally:
        code = stop(worker)
    assert code == 0, log.read_text()[-2000:]
    assert len(list((tmp_path / "mail").glob("*.eml"))) == 2  # each left once
    timed_out = [mid for mid in ids if into(db, mid, "unknown")]
    assert len(timed_out) == 1
    (settled,) = into(db, timed_out[0], "sent")
    assert (settled.from_status, settled.actor) == ("unknown", "reconciler")
