"""PROVIDER_RATE across the fleet: the schedule's arithmetic, its SQL on the three
databases, replicas as real processes that together never exceed the rate, and throttles
that spend no attempt and slow every replica down."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import subprocess
import time
from bisect import bisect_left
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import select

from mailbag.domain import rate as rules
from mailbag.domain.delivery import Attempt, Deferred, Throttled, decide
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.rate import FLOATS, Grant, RateLimit
from mailbag.domain.states import Action, Status
from mailbag.store import rate as store
from mailbag.store.database import make_engine
from mailbag.store.schema import message_events, outbox_messages
from mailbag.store.session import Database
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from servers import mailbag_env, start_mailbag, stop

from helpers import enqueue, run_worker_until, status_counts, wait_for
from memory_provider import MemoryProvider, accept_all
from smtp_server import ReceivedMessage, RecordingSMTPServer

NOW = 1_800_000_000.0  # seconds since the epoch, as the database's clock gives them
THROTTLE_REPLY = "454 4.7.0 Throttling failure: Maximum sending rate exceeded."


def slots(grants: Sequence[Grant]) -> list[float]:
    """Every slot the grants hold, in time order."""
    return sorted(g.first_slot + i / g.rate for g in grants for i in range(g.count))


def most_in_any_window(times: Sequence[float], window: float) -> int:
    ordered = sorted(times)
    return max(
        (bisect_left(ordered, t + window) - i for i, t in enumerate(ordered)),
        default=0,
    )


# --- the arithmetic ----------------------------------------------------------------------


@given(
    st.lists(
        st.tuples(st.floats(0, 2.0), st.integers(1, 30)),  # (time since the last, how many)
        min_size=1,
        max_size=40,
    ),
    st.floats(0.5, 500),
)
def test_slots_taken_one_after_another_are_never_closer_than_the_rate(
    requests: list[tuple[float, int]], rate: float
) -> None:
    bucket, now, grants = rules.new_bucket(NOW), NOW, []
    for gap, count in requests:
        now += gap
        taken = rules.reserve(FLOATS, bucket, now=now, rate=rate, cooldown=60.0, count=count)
        assert taken.first_slot >= now  # never a slot in the past: idle time is not banked
        grants.append(Grant(count, taken.first_slot, taken.rate, now))
        bucket = rules.Bucket(taken.next_slot_at, 0.0, 0.0, 0.0)
    held = slots(grants)
    # Seconds since the epoch in a float: exact to well under a microsecond.
    assert all(b - a >= 1 / rate - 1e-6 for a, b in itertools.pairwise(held))


def test_a_throttle_lowers_the_rate_once_per_burst_for_the_cooldown_and_holds_for_the_hint():
    limit = RateLimit(50.0, cooldown=60.0)
    bucket = rules.new_bucket(NOW)

    def throttle(b: rules.Bucket, now: float, retry_after: float | None = None) -> rules.Bucket:
        return rules.throttled(
            FLOATS, b, now=now, rate=50.0, cooldown=limit.cooldown, retry_after=retry_after
        )

    once = throttle(bucket, NOW, retry_after=2.0)
    assert once.lowered_rate == 50.0 * rules.LOWER_FACTOR and once.lowered_until == NOW + 60
    assert once.next_slot_at == NOW + 2.0  # nobody sends before the provider's hint
    # 429s from sends made before the lowering took effect: the cooldown moves, not the rate.
    again = throttle(once, NOW + 0.5)
    assert again.lowered_rate == once.lowered_rate and again.lowered_until == NOW + 60.5

    # Still throttled once settled: lower again, from the rate in force (climbing back).
    def in_force(b: rules.Bucket, now: float) -> float:
        return float(rules.rate_in_force(FLOATS, b, now=now, rate=50.0, cooldown=60.0))

    assert once.lowered_rate < in_force(again, NOW + 5) < 50.0
    later = throttle(again, NOW + 5)
    assert later.lowered_rate == pytest.approx(in_force(again, NOW + 5) * rules.LOWER_FACTOR)
    assert in_force(later, NOW + 5) == pytest.approx(later.lowered_rate)
    assert in_force(later, NOW + 35) == pytest.approx((later.lowered_rate + 50.0) / 2)
    assert in_force(later, NOW + 65.1) == 50.0  # cooled down
    # Slots taken ahead at the old rate may be throttled too: that lowers nothing more.
    ahead = rules.Bucket(NOW + 5, 0.0, 0.0, 0.0)
    first = throttle(ahead, NOW)
    assert first.settles_at == NOW + 5 + rules.SETTLE_SECONDS
    assert throttle(first, NOW + 4).lowered_rate == first.lowered_rate
    assert throttle(first, NOW + 7).lowered_rate < first.lowered_rate
    # Never below the floor, however low the provider drives it.
    near_floor = rules.Bucket(NOW, 0.55, NOW + 60, 0.0)
    assert throttle(near_floor, NOW).lowered_rate == 50.0 * rules.MIN_FRACTION
    # A retry-after hint never holds the fleet longer than the cooldown.
    assert throttle(bucket, NOW, retry_after=3600).next_slot_at == NOW + 60


def test_a_claim_and_a_chunk_hold_a_bounded_share_of_the_rate() -> None:
    assert rules.claim_limit(48) == 48 and rules.claim_limit(0.2) == 1
    assert rules.chunk_limit(48) == 1 and rules.chunk_limit(5000) == 100
    grant = Grant(count=3, first_slot=NOW + 0.5, rate=10.0, now=NOW)
    assert [grant.delay(i) for i in range(3)] == pytest.approx([0.5, 0.6, 0.7])
    assert grant.ahead == pytest.approx(0.8)


def sends_of(pace: rules.Pace, count: int, rate: float, asks: list[float]) -> list[float]:
    """When chunks leave that first ask at `asks` (each woken then), each asking again when
    its wait ends, as Sender.attempt does; in the order they leave."""
    waiting = sorted(asks)
    sent: list[float] = []
    while waiting:
        now = waiting.pop(0)
        wait = pace.take(count, rate, now)
        if wait > 0:
            waiting = sorted([*waiting, now + wait])
        else:
            sent.append(now)
    return sent


@given(
    st.floats(1.0, 500.0),  # the rate
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),  # how late each slot woke
    st.integers(1, 10),  # emails a chunk
)
def test_a_pace_spreads_late_sends_and_never_delays_ones_a_chunk_late_or_less(
    rate: float, lateness: list[float], count: int
) -> None:
    step, start = count / rate, 100.0  # a monotonic clock's seconds
    # Woken on their slots, or late by at most a chunk's time: nothing waits (no drift).
    pace = rules.Pace()
    waits = [
        pace.take(count, rate, start + k * step + min(late, 0.999) * step)
        for k, late in enumerate(lateness)
    ]
    assert max(waits) <= 1e-9
    # Woken together (the loop was held up): the first two leave at once, the rest a
    # chunk's time apart, whatever their slots said.
    sent = sends_of(rules.Pace(), count, rate, [start] * len(lateness))
    expected = [start + max(0, i - 1) * step for i in range(len(lateness))]
    assert sent == pytest.approx(expected, abs=1e-9)


@given(
    st.floats(1.0, 500.0),  # the rate
    st.lists(st.floats(0.0, 5.0), min_size=3, max_size=40),  # when each chunk wakes
    st.integers(1, 10),  # emails a chunk
)
def test_however_late_chunks_wake_any_three_sends_span_a_chunks_time(
    rate: float, wakes: list[float], count: int
) -> None:
    # Stalls of any length and pattern: at most two chunks ever leave together.
    step = count / rate
    sent = sends_of(rules.Pace(), count, rate, [100.0 + w for w in wakes])
    assert len(sent) == len(wakes)
    assert all(c - a >= step - 1e-9 for a, c in zip(sent, sent[2:], strict=False))


def test_a_throttled_send_is_released_without_an_attempt_unless_its_key_runs_out() -> None:
    claimed = datetime(2026, 1, 1, tzinfo=UTC)
    throttled = Throttled("429 too_many_requests", retry_after=timedelta(seconds=3))
    plain = decide(
        throttled,
        Attempt(5, 5, claimed, None),  # the last attempt: a Deferred would bury it
        now=claimed,
        policy=RetryPolicy(),
        key_window=None,
    )
    assert plain.action is Action.RELEASE
    assert (
        decide(
            Deferred("500"),
            Attempt(5, 5, claimed, None),
            now=claimed,
            policy=RetryPolicy(),
            key_window=None,
        ).action
        is Action.BURY
    )
    window = timedelta(minutes=30)
    fresh = decide(
        throttled,
        Attempt(2, 5, claimed, claimed),
        now=claimed,
        policy=RetryPolicy(),
        key_window=window,
    )
    assert fresh.action is Action.RELEASE
    stale = decide(
        throttled,
        Attempt(2, 5, claimed, claimed - window),
        now=claimed,
        policy=RetryPolicy(),
        key_window=window,
    )
    assert stale.action is Action.MARK_UNKNOWN  # resent without its key it could duplicate


# --- the SQL, on each database -----------------------------------------------------------


def reserve(database: Database, count: int, rate: float = 20.0, provider: str = "p") -> Grant:
    with database.transaction() as tx:
        return tx.run(store.reserve(provider=provider, count=count, rate=rate, cooldown=60.0))


def test_reservations_follow_one_another_on_the_databases_clock(db) -> None:
    database = Database(db.engine)
    first = reserve(database, 5)  # makes the row
    second = reserve(database, 3)
    assert first.rate == second.rate == 20.0
    assert first.first_slot == pytest.approx(first.now + rules.LEAD_SECONDS, abs=1e-3)
    assert second.first_slot == pytest.approx(first.first_slot + 5 / 20.0, abs=1e-6)
    assert 0 < second.delay(0) <= 0.25 + rules.LEAD_SECONDS
    # One schedule per provider: another's first slot is as soon as any.
    assert reserve(database, 1, provider="other").delay(0) == pytest.approx(rules.LEAD_SECONDS)


def test_a_throttle_seen_through_one_connection_slows_every_other(db) -> None:
    replicas = [Database(db.new_engine(null_pool=True)) for _ in range(2)]
    try:
        reserve(replicas[0], 1)
        with replicas[0].transaction() as tx:
            assert tx.run(store.throttle(provider="p", rate=20.0, cooldown=60.0, retry_after=0.5))
        grant = reserve(replicas[1], 2)  # another replica's next claim
        assert grant.rate == pytest.approx(20.0 * rules.LOWER_FACTOR, abs=0.05)
        with replicas[1].connect() as session:
            found = session.run(store.schedule(provider="p"))
        assert found is not None
        bucket, now = found
        throttled_at = bucket.lowered_until - 60
        assert throttled_at <= now < bucket.settles_at
        # The provider's hint holds for everyone: no slot before it has passed.
        assert grant.first_slot >= throttled_at + 0.5 - 1e-6
        with replicas[1].transaction() as tx:  # no row, nothing reserved: nothing to lower
            assert not tx.run(store.throttle(provider="nobody", rate=20.0, cooldown=60.0))
    finally:
        for replica in replicas:
            replica.engine.dispose()


def reserve_in_a_process(url: str, start: Any, seed: int) -> list[tuple[int, float, float]]:
    """In a child process: take slots in random counts, as a worker's claims would."""
    engine = make_engine(url)  # its own pool: one connection, kept
    database, rng, grants = Database(engine), random.Random(seed), []
    try:
        start.wait()
        for _ in range(25):
            grant = reserve(database, rng.randint(1, 8), rate=200.0)
            grants.append((grant.count, grant.first_slot, grant.rate))
    finally:
        engine.dispose()
    return grants


def test_concurrent_replicas_never_hold_slots_closer_than_the_rate(db) -> None:
    # Processes on their own connections, started together: the row's lock orders them.
    processes = 6
    reserve(Database(db.engine), 1, rate=200.0)  # the row exists: every process updates it
    context = multiprocessing.get_context("fork")
    with context.Manager() as manager, context.Pool(processes) as pool:
        start = manager.Barrier(processes)
        results = pool.starmap(
            reserve_in_a_process, [(db.url, start, seed) for seed in range(processes)]
        )
    grants = [Grant(c, first, r, 0.0) for taken in results for c, first, r in taken]
    held = slots(grants)
    assert len(held) == sum(g.count for g in grants) > processes * 25
    gaps = [b - a for a, b in itertools.pairwise(held)]
    assert min(gaps) >= 1 / 200.0 - 1e-6  # never two slots closer than the rate allows
    assert most_in_any_window(held, 0.5) <= 200.0 * 0.5 + 1


# --- the worker ----------------------------------------------------------------------------


def make_worker(async_engine: Any, provider: MemoryProvider, limit: RateLimit | None) -> Worker:
    return Worker(
        engine=async_engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(
            worker_id="rate-worker", poll_interval=0.05, sweep_every=0.05, concurrency=20
        ),
        rate_limit=limit,
    )


async def test_the_worker_paces_its_sends_and_spends_no_attempt_on_a_throttle(
    db, async_engine
) -> None:
    throttled_once = {m.id for m in enqueue(db, 12)[:4]}

    def script(email: Any, nth: int) -> Any:
        if email.message_id in throttled_once and nth == 1:
            return Throttled("429 too_many_requests")
        return accept_all(email, nth)

    provider = MemoryProvider(script)
    sent_at: list[float] = []
    original = provider.send

    async def timed_send(email: Any) -> Any:
        sent_at.append(time.monotonic())
        return await original(email)

    provider.send = timed_send  # type: ignore[method-assign]
    worker = make_worker(async_engine, provider, RateLimit(20.0, cooldown=60.0))
    await run_worker_until(worker, lambda: status_counts(db) == {"sent": 12}, timeout=20)
    assert len(sent_at) == 16  # 12 sends, and 4 the provider throttled
    assert most_in_any_window(sent_at, 0.5) <= 20.0 * 0.5 + 2
    with db.engine.connect() as conn:
        attempts = conn.execute(select(outbox_messages.c.attempt_count)).scalars().all()
        releases = (
            conn.execute(
                select(message_events.c.message_id).where(
                    message_events.c.from_status == Status.PROCESSING.value,
                    message_events.c.to_status == Status.PENDING.value,
                )
            )
            .scalars()
            .all()
        )
    assert sorted(attempts) == [1] * 12  # the throttled tries spent nothing
    assert set(releases) == throttled_once
    with Database(db.engine).connect() as session:
        row = session.run(store.schedule(provider="memory"))
    assert row is not None and row[0].lowered_rate == pytest.approx(20.0 * rules.LOWER_FACTOR)


async def test_sends_woken_late_by_a_stalled_loop_leave_at_the_rate_not_in_one_burst(
    db, async_engine
) -> None:
    enqueue(db, 20)
    provider = MemoryProvider()
    sent_at: list[float] = []
    original = provider.send

    async def stalling_send(email: Any) -> Any:
        sent_at.append(time.monotonic())
        if len(sent_at) == 1:
            time.sleep(0.4)  # the event loop held up (a GC pause, a starved CPU): 8 slots
        return await original(email)

    provider.send = stalling_send  # type: ignore[method-assign]
    worker = make_worker(async_engine, provider, RateLimit(20.0, cooldown=60.0))
    await run_worker_until(worker, lambda: status_counts(db) == {"sent": 20}, timeout=20)
    # The slots that passed during the stall leave two at once, then at the rate: without
    # the pace, 18 left within half a second. Whatever else holds the loop up (a loaded
    # machine), no three sends leave together: any three span most of a chunk's time
    # (0.05 s at 20 a second; the margin is for the few statements between the turn taken
    # and the send's clock reading).
    assert most_in_any_window(sent_at[1:], 0.5) <= 20.0 * 0.5 + 2
    times = sorted(sent_at[1:])
    assert all(c - a >= 0.025 for a, c in zip(times, times[2:], strict=False))


# --- replicas as processes -----------------------------------------------------------------


class TimedSMTPServer(RecordingSMTPServer):
    """A recording SMTP server that also notes when each message's content arrived."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrival_times: list[float] = []

    def _record(self, message: ReceivedMessage) -> None:
        self.arrival_times.append(time.monotonic())
        super()._record(message)


@pytest.mark.slow
@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_worker_processes_together_keep_to_the_rate_and_share_a_throttle(
    db, tmp_path: Path
) -> None:
    total, rate = 40, 20.0
    enqueue(db, total)
    with TimedSMTPServer() as smtp:
        # Three throttles: three sends released, none of them an attempt spent.
        smtp.inject("mail", THROTTLE_REPLY, times=3)
        env = mailbag_env(
            db.url,
            provider="smtp",
            smtp_host=smtp.host,
            smtp_port=str(smtp.port),
            smtp_tls="none",
            poll_interval="0.2",
            batch_size="50",
            concurrency="16",
            provider_rate=str(rate),
            provider_rate_cooldown_seconds="600",
        )
        logs = [(tmp_path / f"w{i}.log").open("ab") for i in range(3)]
        workers = [
            start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log) for log in logs
        ]
        try:
            wait_for(lambda: status_counts(db) == {"sent": total}, 60, "every message sent")
        finally:
            codes = [stop(worker) for worker in workers]
        assert codes == [0, 0, 0], (tmp_path / "w0.log").read_text()[-2000:]
        arrivals = smtp.arrival_times
    assert len(arrivals) == total  # the throttled never got past MAIL FROM
    # Each send leaves at or after its slot; one made late (a busy machine) can bunch with
    # the next on time, so the bound has some slack. The slots themselves are exact (above).
    spread = [round(t - arrivals[0], 3) for t in arrivals]
    assert most_in_any_window(arrivals, 2.0) <= 2 * rate + 5, spread
    assert (arrivals[-1] - arrivals[0]) >= (total - 1) / rate * 0.9, spread
    with db.engine.connect() as conn:
        attempts = set(conn.execute(select(outbox_messages.c.attempt_count)).scalars())
    assert attempts == {1}
    with Database(db.engine).connect() as session:
        row = session.run(store.schedule(provider="smtp"))
    assert row is not None
    bucket, now = row
    # The throttles came together: the rate was lowered once, for every replica.
    assert bucket.lowered_rate == pytest.approx(rate * rules.LOWER_FACTOR)
    assert bucket.lowered_until > now + 500
