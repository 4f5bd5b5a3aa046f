"""The dispatcher in-process, on each database, against the test suite's memory provider."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import event

from mailbag import providers
from mailbag.domain.breaker import Breaker
from mailbag.domain.content import Attachment
from mailbag.domain.delivery import Accepted, Ambiguous, Deferred, Disabled, Rejected
from mailbag.domain.message import new_message
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.states import Status
from mailbag.domain.templates import FILE_TEMPLATE
from mailbag.services import intake
from mailbag.services import outbox as outbox_service
from mailbag.settings import Settings
from mailbag.store import dispatch as store
from mailbag.store.database import DatabaseTimeout
from mailbag.store.plan import run_async
from mailbag.store.schema import outbox_messages
from mailbag.templates import builtin
from mailbag.worker import PeriodicJob, Worker, WorkerConfig, WorkerFailed
from mailbag.worker.database import Claimed

from conftest import TestDB
from helpers import events, get, run_worker_until, status_counts
from memory_provider import MemoryProvider

FAST_RETRY = RetryPolicy(
    max_attempts=3, base=timedelta(milliseconds=20), cap=timedelta(milliseconds=50)
)
# A failing provider is left alone for 50 ms, not the 30 s of the default.
FAST_BREAKER = Breaker(base=timedelta(milliseconds=50), cap=timedelta(milliseconds=200))


def enqueue(db: TestDB, n: int, **fields: Any) -> list[Any]:
    fields.setdefault("template", "welcome")
    fields.setdefault("data", {"name": "Ada"})
    with db.engine.begin() as conn:
        results = outbox_service.write_many(
            conn,
            [new_message(to=f"user{i}@example.com", **fields) for i in range(n)],
            max_attempts=FAST_RETRY.max_attempts,
        )
    return [r.message.id for r in results]


def make_worker(db: TestDB, async_engine: Any, provider: Any, **config: Any) -> Worker:
    config.setdefault("worker_id", "test-worker")
    config.setdefault("poll_interval", 0.05)
    config.setdefault("policy", FAST_RETRY)
    config.setdefault("sweep_every", 0.05)
    config.setdefault("provider_breaker", FAST_BREAKER)
    return Worker(
        engine=async_engine, provider=provider, catalog=builtin(), config=WorkerConfig(**config)
    )


def all_in(db: TestDB, *wanted: Status, total: int) -> Callable[[], bool]:
    return lambda: sum(status_counts(db).get(s.value, 0) for s in wanted) == total


async def test_the_worker_delivers_every_message_once(db, async_engine):
    ids = enqueue(db, 60)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, batch_size=25, concurrency=10)
    await run_worker_until(worker, all_in(db, Status.SENT, total=60))
    assert sorted(e.message_id for e in provider.sent) == sorted(ids)
    row = get(db, ids[0])
    assert row.provider == "memory" and row.provider_message_id == f"mem-{ids[0]}-1"
    assert row.claim_token is None and row.sent_at is not None
    # The email itself: our Message-ID, rendered template.
    email = next(e for e in provider.sent if e.message_id == ids[0])
    assert email.rfc_message_id == f"<{ids[0]}@localhost>"
    assert email.subject == "Welcome to mailbag, Ada"
    assert b"Message-ID: <" in email.raw and b"multipart/alternative" in email.raw


async def test_claims_never_exceed_the_free_concurrency_slots(db, async_engine):
    enqueue(db, 40)
    provider = MemoryProvider(delay=0.05)
    worker = make_worker(db, async_engine, provider, batch_size=100, concurrency=4)
    most_in_flight = 0

    def done() -> bool:
        nonlocal most_in_flight
        most_in_flight = max(most_in_flight, worker.ledger.undecided)
        return all_in(db, Status.SENT, total=40)()

    await run_worker_until(worker, done)
    assert provider.max_in_flight <= 4
    assert most_in_flight <= 4
    assert provider.max_in_flight == 4  # and the slots were actually used


async def test_transient_failures_retry_with_backoff_then_succeed(db, async_engine):
    (mid,) = enqueue(db, 1)
    script = lambda email, nth: Deferred("451 try later") if nth < 3 else Accepted("ok")  # noqa: E731
    provider = MemoryProvider(script)
    await run_worker_until(
        make_worker(db, async_engine, provider), all_in(db, Status.SENT, total=1)
    )
    row = get(db, mid)
    # last_error is the accepted send's own (None: every recipient taken); the failed
    # attempts stay in the history.
    assert (row.attempt_count, row.last_error) == (3, None)
    assert [e.detail for e in events(db, mid) if e.to_status == "retrying"] == ["451 try later"] * 2
    assert [e.attempt for e in provider.sent] == [1, 2, 3]


async def test_a_provider_outage_longer_than_the_retry_budget_dead_letters_nothing(
    db, async_engine
):
    # By the policy's own numbers an outage spent every message's attempts: all of them
    # were dead within seconds of a refused port (3 attempts, 20 to 50 ms apart).
    ids = enqueue(db, 8)
    down = Deferred("connection refused", provider_fault=True)
    up_at = time.monotonic() + 1.5  # thirty times the budget's whole span
    provider = MemoryProvider(
        lambda email, nth: down if time.monotonic() < up_at else Accepted("ok")
    )
    worker = make_worker(db, async_engine, provider)
    await run_worker_until(worker, all_in(db, Status.SENT, total=8), timeout=30)
    refused = 0
    for mid in ids:
        row = get(db, mid)
        # Refused for as long as the outage lasted, then one attempt that went through.
        assert (row.status, row.attempt_count) == ("sent", 1)
        refused += provider.calls[mid] - 1
        waits = [
            e for e in events(db, mid) if e.from_status == "processing" and e.to_status != "sent"
        ]
        assert {e.detail for e in waits} <= {
            f"{why} (waits; no attempt spent)"
            for why in (
                "connection refused",
                "no provider of its route is available: memory failing (connection refused)",
                "no provider of its route is available: memory probing",
            )
        }
    # The breaker left it alone: five refusals open it, then one probe at a time, each wait
    # doubling from 50 ms to 200 ms; without it the 8 messages retried every 20 to 50 ms.
    assert 5 <= refused <= 5 + 1.5 / 0.05


async def test_a_message_waits_for_its_provider_no_longer_than_the_queue_lifetime(db, async_engine):
    (mid,) = enqueue(db, 1)
    down = Deferred("connection refused", provider_fault=True)
    provider = MemoryProvider(lambda email, nth: down)
    worker = make_worker(db, async_engine, provider, queue_lifetime=timedelta(seconds=1))
    await run_worker_until(worker, all_in(db, Status.DEAD, total=1), timeout=30)
    row = get(db, mid)
    # Waiting spent none of its attempts (3): it died of age, its last refusal counted.
    assert row.attempt_count == 1
    # It died at a refusal, or waiting behind the breaker those refusals opened: either
    # way the refusal and the lifetime are named.
    lifetime = " (in the queue longer than QUEUE_LIFETIME, 0.000277778 h)"
    assert row.last_error in {
        f"connection refused{lifetime}",
        f"no provider of its route is available: memory failing (connection refused){lifetime}",
    }


async def test_a_spent_budget_ends_in_the_dead_letter(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = MemoryProvider(lambda email, nth: Deferred(f"421 busy #{nth}"))
    await run_worker_until(
        make_worker(db, async_engine, provider), all_in(db, Status.DEAD, total=1)
    )
    row = get(db, mid)
    assert (row.attempt_count, row.last_error) == (3, "421 busy #3")
    assert len(provider.sent) == 3


async def test_permanent_rejections_and_template_errors_fail_at_once(db, async_engine):
    (rejected,) = enqueue(db, 1)
    # Written as if rendered with the file template it was pinned to, which then changed (a
    # deploy): at send time welcome needs a `name` it does not have.
    with db.engine.begin() as conn:
        message = new_message(to="user1@example.com", template="welcome", data={})
        (written,) = outbox_service.write_many(conn, [replace(message, pin=FILE_TEMPLATE)])
    broken = written.message.id
    provider = MemoryProvider(lambda email, nth: Rejected("550 5.1.1 no such user"))
    await run_worker_until(
        make_worker(db, async_engine, provider), all_in(db, Status.FAILED, total=2)
    )
    assert get(db, rejected).last_error == "550 5.1.1 no such user"
    assert "'name' is undefined" in get(db, broken).last_error
    assert [e.message_id for e in provider.sent] == [rejected]  # the broken one never left


async def test_an_ambiguous_send_becomes_unknown_and_is_never_resent(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = MemoryProvider(lambda email, nth: Ambiguous("connection lost after DATA"))
    worker = make_worker(db, async_engine, provider)
    await run_worker_until(worker, all_in(db, Status.UNKNOWN, total=1))
    await run_worker_until(worker, lambda: True)  # another round: nothing claims it again
    await asyncio.sleep(0.2)
    assert len(provider.sent) == 1
    assert get(db, mid).status == Status.UNKNOWN


async def test_a_keyed_provider_retries_an_ambiguous_send_with_the_same_key(db, async_engine):
    (mid,) = enqueue(db, 1)
    script = lambda email, nth: Ambiguous("read timeout") if nth == 1 else Accepted("p-1")  # noqa: E731
    provider = MemoryProvider(script, idempotency_window=timedelta(minutes=30))
    await run_worker_until(
        make_worker(db, async_engine, provider), all_in(db, Status.SENT, total=1)
    )
    first, second = provider.sent
    assert first.idempotency_key == second.idempotency_key == f"mailbag-{mid}-1"
    row = get(db, mid)
    assert (row.attempt_count, row.ambiguous_since) == (1, None)


async def test_a_disabled_provider_releases_without_spending_attempts(db, async_engine):
    ids = enqueue(db, 3)
    enabled = False

    def script(email: Any, nth: int) -> Any:
        return Accepted("ok") if enabled else Disabled("no API key")

    provider = MemoryProvider(script)
    worker = make_worker(db, async_engine, provider, disabled_backoff=(0.3, 0.3))
    await run_worker_until(worker, lambda: len(provider.sent) >= 1)
    await asyncio.sleep(0.1)
    rows = [get(db, i) for i in ids]
    assert all(r.attempt_count == 0 for r in rows)
    assert all(r.status in (Status.PENDING, Status.PROCESSING) for r in rows)
    calls_while_disabled = len(provider.sent)
    enabled = True
    await run_worker_until(worker, all_in(db, Status.SENT, total=3))
    assert all(get(db, i).attempt_count == 1 for i in ids)
    assert calls_while_disabled <= 3  # it paused instead of hammering a disabled provider


async def test_a_batch_that_finds_the_provider_disabled_pauses_once_not_once_per_message(
    db, async_engine
):
    ids = enqueue(db, 12)
    enabled = False

    def script(email: Any, nth: int) -> Any:
        return Accepted("ok") if enabled else Disabled("no API key")

    provider = MemoryProvider(script)
    # One burst of twelve: one pause of 0.2 s; doubled per message it would be the cap.
    worker = make_worker(db, async_engine, provider, disabled_backoff=(0.2, 60.0))
    await run_worker_until(worker, lambda: len(provider.sent) >= 12)
    assert worker.disabled_backoff.failures == 1
    enabled = True
    await run_worker_until(worker, all_in(db, Status.SENT, total=12), timeout=10)
    assert all(get(db, i).attempt_count == 1 for i in ids)


async def test_a_slow_live_send_keeps_its_lease(db, async_engine):
    (mid,) = enqueue(db, 1)
    # The send outlasts the lease; the keeper renews every half second, leaving a second of
    # slack for a loaded machine (with a 0.6 s lease, a 0.4 s stall would let the sweep take it).
    provider = MemoryProvider(delay=2.0)
    worker = make_worker(db, async_engine, provider, lease=timedelta(seconds=1.5))
    await run_worker_until(worker, all_in(db, Status.SENT, total=1))
    assert get(db, mid).status == Status.SENT
    assert worker.report.stats["swept"] == 0


def lose_the_first_claims_answer(worker: Worker) -> list[Any]:
    """The first claim that takes messages commits, then its answer is lost on the way back
    (as when the connection drops during COMMIT). Returns the lost claims' tokens."""
    lost: list[Any] = []
    run = worker.database._run

    async def answer_lost(plan: Any, **options: Any) -> Any:
        result = await run(plan, **options)
        if not lost and isinstance(result, Claimed) and result.messages:
            lost.append(result.token)
            raise DatabaseTimeout("the COMMIT's answer never came")
        return result

    worker.database._run = answer_lost  # type: ignore[method-assign]
    return lost


async def test_a_claim_whose_answer_was_lost_is_released_then_sent_once(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = MemoryProvider()
    # A long lease: only the release can bring the message back before the test times out.
    worker = make_worker(
        db, async_engine, provider, lease=timedelta(seconds=60), db_backoff=(0.05, 0.1)
    )
    lost = lose_the_first_claims_answer(worker)
    released_before = REGISTRY.get_sample_value("mailbag_unconfirmed_claims_released_total")
    await run_worker_until(worker, all_in(db, Status.SENT, total=1))
    assert lost and [e.message_id for e in provider.sent] == [mid]
    released = REGISTRY.get_sample_value("mailbag_unconfirmed_claims_released_total")
    assert released == (released_before or 0) + 1
    assert get(db, mid).attempt_count == 1
    assert worker.report.stats["released_unconfirmed"] == 1
    assert worker.report.stats["swept"] == 0
    history = [(e.from_status, e.to_status, e.detail) for e in events(db, mid)]
    assert ("processing", "pending", store.UNCONFIRMED_CLAIM) in history


async def test_a_worker_stopping_releases_what_an_unconfirmed_claim_holds(db, async_engine):
    (mid,) = enqueue(db, 1)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, lease=timedelta(seconds=60))
    lost = lose_the_first_claims_answer(worker)
    # The lost claim pauses the worker a second (its database backoff); it stops meanwhile.
    await run_worker_until(worker, lambda: bool(lost))
    row = get(db, mid)
    assert (row.status, row.attempt_count, row.claim_token) == (Status.PENDING, 0, None)
    assert provider.sent == [] and worker.report.stats["released_unconfirmed"] == 1


async def test_a_stale_finalize_changes_nothing_and_is_logged(db, async_engine, capsys):
    (mid,) = enqueue(db, 1)
    provider = MemoryProvider()
    provider.gate = asyncio.Event()
    worker = make_worker(db, async_engine, provider)

    async def swept_behind_its_back() -> bool:
        if get(db, mid).status != Status.PROCESSING:
            return False
        # Another replica's sweep, as if this worker had stalled past its lease.
        async with async_engine.begin() as conn:
            await run_async(
                conn,
                store.sweep_expired(now=datetime.now(UTC) + timedelta(hours=1), actor="other"),
            )
        provider.gate.set()
        return True

    await run_worker_until(worker, swept_behind_its_back)
    await run_worker_until(worker, lambda: worker.report.stats["stale"] == 1)
    row = get(db, mid)
    assert row.status == Status.UNKNOWN and row.provider_message_id is None
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "stale" in line]
    assert lines and lines[0]["provider_message_id"] == f"mem-{mid}-1"


async def test_a_batch_provider_gets_chunks_of_its_batch_size(db, async_engine):
    enqueue(db, 25)
    provider = MemoryProvider(max_batch_size=10)
    worker = make_worker(db, async_engine, provider, batch_size=25, concurrency=25)
    await run_worker_until(worker, all_in(db, Status.SENT, total=25))
    assert max(provider.batches) == 10 and sum(provider.batches) == 25


async def test_claimed_but_unstarted_messages_are_released_at_shutdown(db, async_engine):
    ids = enqueue(db, 3)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider)
    async with async_engine.begin() as conn:
        claim = await run_async(
            conn,
            store.claim(
                worker_id="test-worker",
                now=datetime.now(UTC),
                lease=timedelta(seconds=60),
                limit=10,
            ),
        )
    worker.stopping = True  # the shutdown began between the claim and the sends
    worker._dispatch(claim.token, claim.messages)
    finalizer = worker.writer.start()
    await worker._drain()
    finalizer.cancel()
    assert provider.sent == []
    rows = [get(db, i) for i in ids]
    assert {(r.status, r.attempt_count) for r in rows} == {(Status.PENDING, 0)}


async def test_the_worker_survives_a_database_it_cannot_reach(tmp_path):
    """A worker pointed at a database that refuses connections keeps running and backing off."""
    from mailbag.store.database import make_async_engine

    engine = make_async_engine("postgresql://nobody@127.0.0.1:1/none")
    worker = Worker(
        engine=engine,
        provider=MemoryProvider(),
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.05, db_backoff=(0.05, 0.2)),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.8)
    assert not task.done()
    assert worker.db_backoff.failures >= 3
    stop.set()
    await task
    await engine.dispose()


def test_the_memory_provider_is_found_through_the_public_registry():
    assert "memory" in providers.available()
    assert isinstance(providers.create("memory", Settings()), MemoryProvider)


def test_an_unknown_provider_is_a_clear_error():
    with pytest.raises(providers.UnknownProvider, match=r"available: .*smtp"):
        providers.create("carrier-pigeon", Settings())


def test_logging_never_prints_secrets(capsys):
    from mailbag import log

    log.configure()
    log.get("t").info("event", smtp_password="hunter2", api_key="k-123", key_hash="ab")
    line = capsys.readouterr().err
    assert "hunter2" not in line and "k-123" not in line and '"key_hash": "ab"' in line
    assert logging.getLogger("alembic").level == logging.WARNING


async def test_a_keyed_retry_is_never_sent_inside_a_batch(db, async_engine):
    ids = enqueue(db, 4)
    first = ids[0]

    def script(email: Any, nth: int) -> Any:
        if email.message_id == first and nth == 1:
            return Ambiguous("read timeout")
        return Accepted(f"p-{nth}")

    provider = MemoryProvider(script, max_batch_size=10, idempotency_window=timedelta(minutes=30))
    worker = make_worker(db, async_engine, provider, batch_size=10, concurrency=10)
    await run_worker_until(worker, all_in(db, Status.SENT, total=4))
    retry = [e for e in provider.sent if e.message_id == first]
    assert len(retry) == 2 and retry[0].idempotency_key == retry[1].idempotency_key
    assert provider.batches == [4]  # one batch call; the keyed retry went alone, via send()


async def test_an_enqueue_in_this_process_wakes_the_worker_at_commit(db, async_engine):
    """`serve` runs API and worker in one process: no need to wait for the next poll."""
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, poll_interval=30)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(0.3)  # idle now, asleep until the poll 30 s away
    async with async_engine.begin() as conn:
        await intake.enqueue_async(conn, to="a@example.com", template="welcome", data={"name": "A"})
    for _ in range(100):
        if provider.sent:
            break
        await asyncio.sleep(0.02)
    stop.set()
    await task
    assert len(provider.sent) == 1


# --- a helper task that dies stops the worker -------------------------------------------


def fail_writes(worker: Worker, times: int) -> None:
    """The finalizer's write raises a bug (not a database error) its first `times` calls."""
    real = worker.writer.write
    calls = 0

    async def write(batch: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= times:
            raise RuntimeError("injected finalizer bug")
        return await real(batch)

    worker.writer.write = write


async def run_until_it_fails(worker: Worker) -> WorkerFailed:
    """Run with no stop ever requested: only the worker's own failure ends it."""
    with pytest.raises(WorkerFailed) as failed:
        async with asyncio.timeout(15):
            await worker.run(asyncio.Event())
    return failed.value


async def test_a_dead_finalizer_stops_the_worker_which_writes_what_it_can_first(
    db, async_engine, capsys
):
    ids = enqueue(db, 10)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, batch_size=4, concurrency=4)
    fail_writes(worker, times=1)
    failure = await run_until_it_fails(worker)
    assert "mailbag-finalizer" in str(failure) and "injected finalizer bug" in str(failure)
    logged = [json.loads(line) for line in capsys.readouterr().err.splitlines() if "died" in line]
    assert logged[0]["event"] == "worker_helper_died" and logged[0]["level"] == "error"
    # Drained: what was sent is recorded as sent, the rest released untouched; none is
    # left `processing` behind a worker that is gone.
    sent = {e.message_id for e in provider.sent}
    assert sent and status_counts(db) == {"sent": len(sent), "pending": 10 - len(sent)}
    assert {get(db, i).attempt_count for i in ids if i not in sent} == {0}

    successor = MemoryProvider()
    await run_worker_until(
        make_worker(db, async_engine, successor), all_in(db, Status.SENT, total=10)
    )
    assert sorted([e.message_id for e in provider.sent + successor.sent]) == sorted(ids)


async def test_a_finalizer_that_cannot_write_leaves_its_sends_to_the_sweep_not_to_a_resend(
    db, async_engine
):
    ids = enqueue(db, 10)
    provider = MemoryProvider()
    lease = timedelta(seconds=1)
    worker = make_worker(db, async_engine, provider, batch_size=4, concurrency=4, lease=lease)
    fail_writes(worker, times=1_000)
    await run_until_it_fails(worker)
    # Nothing could be written: what it held stays `processing` (its sends, and any claim
    # the drain could not hand back), with leases no one renews any more.
    sent = {e.message_id for e in provider.sent}
    held = {i for i in ids if get(db, i).status == Status.PROCESSING}
    assert sent and sent <= held and status_counts(db).get("pending") == 10 - len(held)
    leases = {i: get(db, i).lease_expires_at for i in held}
    await asyncio.sleep(lease.total_seconds() / 2)  # the keeper renewed every third of it
    assert {i: get(db, i).lease_expires_at for i in held} == leases

    # A successor's sweep makes them `unknown` when the lease ends (sent, or maybe: never
    # resent blindly) and delivers the rest.
    successor = MemoryProvider()
    await run_worker_until(
        make_worker(db, async_engine, successor, lease=lease),
        all_in(db, Status.SENT, Status.UNKNOWN, total=10),
    )
    assert {i for i in ids if get(db, i).status == Status.UNKNOWN} == held
    assert {e.message_id for e in successor.sent} == set(ids) - held


async def test_a_periodic_job_that_fails_any_way_never_stops_mail(db, async_engine, monkeypatch):
    # A bug in one optional part (a periodic job) once stopped the worker, and all mail.
    from mailbag.worker import supervisor

    monkeypatch.setattr(supervisor, "RESTART_BACKOFF", (0.05, 0.1))
    kinds = [ValueError("a bug"), UnicodeError("idna"), KeyError("k"), RuntimeError("r")]
    calls: list[datetime] = []

    async def broken(now: datetime) -> Any:
        calls.append(now)
        raise kinds[len(calls) % len(kinds)]

    ids = enqueue(db, 30)
    provider = MemoryProvider(delay=0.01)
    worker = Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.05, batch_size=5, concurrency=5),
        jobs=[PeriodicJob("reconciled", 0.02, broken)],
    )
    failed_before = (
        REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "reconciled"}) or 0.0
    )
    await run_worker_until(
        worker, lambda: all_in(db, Status.SENT, total=30)() and len(calls) >= 4
    )  # raises if the worker stopped on its own (WorkerFailed)
    assert sorted(e.message_id for e in provider.sent) == sorted(ids)
    failed = REGISTRY.get_sample_value("mailbag_side_task_failures_total", {"task": "reconciled"})
    assert failed is not None and failed - failed_before >= 4
    assert worker.side_tasks.failure is None


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_a_listener_that_fails_is_restarted_and_mail_keeps_flowing(db, async_engine):
    starts = 0

    async def broken_listen(url: str, on_notify: Any, log: Any, on_working: Any) -> None:
        nonlocal starts
        starts += 1
        raise RuntimeError("a bug in the listener")

    provider = MemoryProvider()
    worker = Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(worker_id="w", poll_interval=0.05),
        listen_url=db.url,
    )
    worker.database.listen = broken_listen  # type: ignore[method-assign]
    ids = enqueue(db, 5)
    await run_worker_until(
        worker, lambda: all_in(db, Status.SENT, total=5)() and starts >= 2, timeout=15
    )
    assert sorted(e.message_id for e in provider.sent) == sorted(ids)


# --- what a message can carry ---------------------------------------------------------

PDF = Attachment("invoice.pdf", "application/pdf", b"%PDF-1.4\n" + bytes(range(256)), None)


def statements_reading_attachment_bytes(async_engine: Any) -> list[str]:
    """Every statement the engine runs from now on that reads attachments' bytes."""
    seen: list[str] = []

    @event.listens_for(async_engine.sync_engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if re.search(r"\battachments\.content\b", statement):
            seen.append(statement)

    return seen


async def test_attachment_bytes_are_read_once_per_claim_and_never_for_plain_messages(
    db, async_engine
):
    reads = statements_reading_attachment_bytes(async_engine)
    enqueue(db, 3)
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, batch_size=10, concurrency=10)
    await run_worker_until(worker, all_in(db, Status.SENT, total=3))
    assert reads == []  # a plain message costs no statement more

    templated = enqueue(db, 1, attachments=[PDF])
    (ready_made,) = enqueue(
        db,
        1,
        template=None,
        data=None,
        subject="Invoice",
        html="<p>Attached</p>",
        attachments=[PDF],
    )
    await run_worker_until(worker, all_in(db, Status.SENT, total=5))
    assert len(reads) == 1  # both in one claim: one read, the shared PDF once
    carrying = [e for e in provider.sent if e.attachments]
    assert {e.message_id for e in carrying} == {templated[0], ready_made}
    assert all(list(e.attachments) == [PDF] for e in carrying)
    email = next(e for e in carrying if e.message_id == ready_made)
    assert (email.subject, email.text.strip()) == ("Invoice", "Attached")  # no template


async def test_an_expired_message_lapses_and_a_live_one_in_the_same_claim_is_sent(db, async_engine):
    past = datetime.now(UTC) - timedelta(seconds=1)
    (expired,) = enqueue(db, 1, expires_at=past)
    (live,) = enqueue(db, 1, expires_at=datetime.now(UTC) + timedelta(hours=1))
    provider = MemoryProvider()
    worker = make_worker(db, async_engine, provider, batch_size=10, concurrency=10)
    await run_worker_until(worker, all_in(db, Status.SENT, Status.EXPIRED, total=2))
    assert [e.message_id for e in provider.sent] == [live]
    row = get(db, expired)
    assert (row.status, row.attempt_count) == (Status.EXPIRED, 0)
    assert row.last_error == f"expired before it could be sent (expires_at {past.isoformat()})"
    assert worker.report.stats["lapse"] == 1


# --- MAX_BYTES_IN_FLIGHT ------------------------------------------------------------------

MIB = 1024 * 1024


async def test_the_attachment_bytes_one_worker_holds_stay_under_max_bytes_in_flight(
    db, async_engine
):
    # Twelve 1 MiB attachments claimed in one batch of up to 100, under a bound of 3 MiB:
    # never more than three messages' bytes held, every message sent, no attempt spent.
    for i in range(12):
        pdf = Attachment(f"report-{i}.pdf", "application/pdf", bytes([i]) * MIB)
        enqueue(db, 1, attachments=[pdf], max_attempts=3)
    provider = MemoryProvider(delay=0.1)
    worker = make_worker(db, async_engine, provider, concurrency=16, max_bytes_in_flight=3 * MIB)
    await run_worker_until(worker, all_in(db, Status.SENT, total=12), timeout=60)
    assert provider.max_in_flight == 3  # each send holds its 1 MiB; three at once fit
    assert worker.report.stats["handed_back_for_bytes"] > 0  # the claims took more
    with db.engine.connect() as conn:
        attempts = conn.execute(outbox_messages.select()).all()
    assert {row.attempt_count for row in attempts} == {1}  # handed back: no attempt spent
    assert worker.ledger.bytes_held == 0


async def test_a_message_larger_than_the_bound_goes_alone_never_stuck(db, async_engine):
    big = Attachment("big.bin.pdf", "application/pdf", b"x" * (2 * MIB))
    enqueue(db, 3, attachments=[big])
    provider = MemoryProvider(delay=0.05)
    worker = make_worker(db, async_engine, provider, concurrency=8, max_bytes_in_flight=MIB)
    await run_worker_until(worker, all_in(db, Status.SENT, total=3), timeout=60)
    assert provider.max_in_flight == 1


def test_max_bytes_in_flight_below_one_message_is_refused_at_start():
    with pytest.raises(ValueError, match="max_bytes_in_flight: must be at least"):
        Settings(max_bytes_in_flight=MIB, max_message_bytes=2 * MIB)
