"""DOMAIN_SHAPING: a recipient domain that defers is slowed for the whole fleet (and climbs
back), while other domains go on at full rate. The rules without I/O, the schedule's SQL on
the three databases, two workers on their own connections, and worker processes against a
real SMTP server that defers one domain."""

from __future__ import annotations

import itertools
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update

from mailbag.domain import domain_shaping as rules
from mailbag.domain import rate
from mailbag.domain.delivery import Accepted, Deferred, Throttled
from mailbag.domain.domain_shaping import Shaping, View
from mailbag.domain.policy import RetryPolicy
from mailbag.domain.rate import FLOATS, Grant
from mailbag.providers.smtp import Failure, Phase, SMTPProvider, StepFailed
from mailbag.services import maintenance
from mailbag.settings import InvalidSettings, read_settings
from mailbag.store import domain_rates as store
from mailbag.store.database import READ_ONLY
from mailbag.store.plan import run
from mailbag.store.schema import message_events, outbox_messages, recipient_domain_rates
from mailbag.store.session import Database
from mailbag.templates import builtin
from mailbag.worker import Worker, WorkerConfig
from servers import mailbag_env, start_mailbag, stop

from helpers import enqueue, run_worker_until, status_counts, wait_for
from memory_provider import MemoryProvider
from smtp_server import ReceivedMessage, RecordingSMTPServer

NOW = 1_800_000_000.0  # the database's clock, in seconds since the epoch
SHAPING = Shaping.per_minute(120.0, 6.0, 60.0)  # 2 a second, at least 1 every 10 s
SLOW, FAST = "deferring.example.net", "example.com"
DEFERRAL = "451 4.7.0 Try again later"


def at(domain: str, i: int) -> str:
    return f"user{i}@{domain}"


def domain_message(address: str, last_error: str | None = None) -> Any:
    """A claimed message as the rules see it (only its address and last_error matter)."""
    from types import SimpleNamespace

    return SimpleNamespace(id=address, to_address=address, last_error=last_error)


# --- the rules -----------------------------------------------------------------------------


def test_a_deferral_halves_the_domains_rate_once_per_burst_down_to_the_floor_then_it_climbs_back():
    def in_force(bucket: rate.Bucket, now: float) -> float:
        return float(
            rate.rate_in_force(FLOATS, bucket, now=now, rate=SHAPING.ceiling, cooldown=60.0)
        )

    first = rules.lowered(rate.new_bucket(NOW), SHAPING, now=NOW, settle=3.0)
    assert first.lowered_rate == pytest.approx(SHAPING.ceiling / 2)  # 1 a second
    assert first.lowered_until == NOW + 60.0
    # The burst's other deferrals (sends made before every worker knew): no lower.
    burst = rules.lowered(first, SHAPING, now=NOW + 2.0, settle=3.0)
    assert burst.lowered_rate == first.lowered_rate and burst.lowered_until == NOW + 62.0
    # Deferring still, once settled: halved again from the rate in force.
    again = rules.lowered(burst, SHAPING, now=NOW + 4.0, settle=3.0)
    assert again.lowered_rate == pytest.approx(in_force(burst, NOW + 4.0) / 2)
    bucket = again
    for step in range(10):  # never below the floor, however fast it keeps deferring
        bucket = rules.lowered(bucket, SHAPING, now=NOW + 8.0 + step / 10, settle=0.05)
    assert bucket.lowered_rate == pytest.approx(SHAPING.floor)
    # Once deferrals stop it climbs back in a straight line, then is no longer shaped.
    quiet = bucket.lowered_until - 60.0
    assert in_force(bucket, quiet + 30.0) == pytest.approx((SHAPING.floor + SHAPING.ceiling) / 2)
    at_end = rules.view_of(bucket, SHAPING, db_now=quiet + 60.0, now=datetime.now(UTC))
    assert at_end is None
    midway = rules.view_of(bucket, SHAPING, db_now=quiet + 45.0, now=datetime.now(UTC))
    assert midway is not None and SHAPING.floor < midway.rate < SHAPING.ceiling


def test_what_counts_as_a_domains_deferral() -> None:
    # SMTP: 421/451 to RCPT TO, a 4.7.x to RCPT TO, DATA or the content; not the relay's.
    assert rules.is_deferral_reply(451, "451 4.3.0 Try later", to_rcpt=True)
    assert rules.is_deferral_reply(421, "421 closing", to_rcpt=True)
    assert rules.is_deferral_reply(450, "450 4.7.1 Greylisted", to_rcpt=True)
    assert rules.is_deferral_reply(452, "452 4.7.28 unusual rate", to_rcpt=False)
    assert not rules.is_deferral_reply(451, "451 4.3.0 Local error", to_rcpt=False)
    assert not rules.is_deferral_reply(452, "452 4.2.2 Mailbox full", to_rcpt=True)
    assert not rules.is_deferral_reply(550, "550 5.7.1 Refused", to_rcpt=True)
    smtp = SMTPProvider(host="relay.test", port=25, tls="none")
    rcpt = smtp._outcome(StepFailed(Phase.RCPT, Failure.TEMPORARY, DEFERRAL, reply_code=451))
    assert isinstance(rcpt, Deferred) and rcpt.domain_deferral and not rcpt.provider_fault
    mail = smtp._outcome(StepFailed(Phase.MAIL, Failure.TEMPORARY, DEFERRAL, reply_code=451))
    assert isinstance(mail, Deferred) and not mail.domain_deferral
    timeout = smtp._outcome(StepFailed(Phase.RCPT, Failure.TIMEOUT, "timed out"))
    assert isinstance(timeout, Deferred) and not timeout.domain_deferral
    # A throttle is the provider's unless it names the recipient's domain on its own.
    slow = domain_message(at(SLOW, 0))
    assert rules.deferral_of(slow, Deferred(DEFERRAL, domain_deferral=True)) == SLOW
    assert rules.deferral_of(slow, Deferred(DEFERRAL)) is None
    assert rules.deferral_of(slow, Throttled(f"429 too many messages to {SLOW} now")) == SLOW
    assert rules.deferral_of(slow, Throttled("429 slow down")) is None
    assert rules.deferral_of(slow, Throttled(f"SMTP mx.{SLOW}:25, MAIL FROM: 451 x")) is None
    assert rules.deferral_of(slow, Throttled(f"429 for someone@{SLOW}")) is None
    assert rules.deferral_of(slow, Accepted("id")) is None
    assert rules.deferral_of(slow, None) is None
    assert rules.domain_of("Someone@Deferring.Example.NET") == SLOW


def test_a_shaped_domains_claimed_messages_go_hold_a_slot_or_wait_in_line() -> None:
    now = datetime(2026, 6, 1, tzinfo=UTC)
    view = View(rate=1.0, free_at=now, until=now + timedelta(minutes=1), in_line_until=now)
    assert rules.slots_to_take(view, 30, now) == 10  # HORIZON_SECONDS' worth at 1 a second
    assert rules.slots_to_take(view, 3, now) == 3
    far = View(1.0, now + timedelta(seconds=rules.HORIZON_SECONDS), view.until, now)
    assert rules.slots_to_take(far, 3, now) == 0  # the line runs far enough: no statement
    slow = [domain_message(at(SLOW, i)) for i in range(4)]
    grant = Grant(count=2, first_slot=NOW + rate.LEAD_SECONDS, rate=1.0, now=NOW)
    placed = rules.place(SLOW, slow, view, grant, now)
    assert placed.going == slow[:1]  # its slot is due now
    (held, why, due), *in_line = placed.waiting
    assert held is slow[1] and due == now + timedelta(seconds=1.1)
    assert rules.holds_slot(domain_message(held.to_address, last_error=why))
    assert [m for m, _, _ in in_line] == slow[2:]
    assert [d for _, _, d in in_line] == [
        now + timedelta(seconds=3.1),
        now + timedelta(seconds=4.1),
    ]
    assert not any(rules.holds_slot(domain_message("x", last_error=w)) for _, w, _ in in_line)
    # The next claim's line starts after this one's.
    later = rules.place(SLOW, slow[:1], placed.view, None, now)
    assert later.waiting[0][2] == now + timedelta(seconds=5.1)


def test_the_settings_are_checked_and_shaping_is_on_by_default(tmp_path: Path) -> None:
    settings = read_settings(database_url=f"sqlite:///{tmp_path / 'm.db'}")
    assert settings.shaping == Shaping.per_minute(600.0, 1.0, 600.0)
    off = read_settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", domain_shaping=False)
    assert off.shaping is None and WorkerConfig.from_settings(off).domain_shaping is None
    with pytest.raises(InvalidSettings, match="domain_shaping_floor_per_minute"):
        read_settings(
            database_url=f"sqlite:///{tmp_path / 'm.db'}",
            domain_shaping_floor_per_minute=100,
            domain_shaping_ceiling_per_minute=10,
        )
    for bad in ({"domain_shaping_recovery_seconds": 0}, {"domain_shaping_floor_per_minute": -1}):
        with pytest.raises(InvalidSettings):
            read_settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", **bad)


# --- the SQL, on each database -------------------------------------------------------------


def test_a_deferral_seen_through_one_connection_slows_the_domain_for_every_other(db) -> None:
    replicas = [Database(db.new_engine(null_pool=True)) for _ in range(2)]
    try:
        with replicas[0].connect() as session:
            assert session.run(store.shaped()) == {}  # nobody deferred: nothing to read
        with replicas[0].transaction() as tx:
            bucket, now = tx.run(store.defer(domain=SLOW, shaping=SHAPING, settle=3.0))
        assert bucket.lowered_rate == pytest.approx(SHAPING.ceiling / 2)
        assert bucket.lowered_until == pytest.approx(now + 60.0, abs=0.5)
        with replicas[1].connect() as session:
            shaped = session.run(store.shaped())
        assert list(shaped) == [SLOW]  # the other domain has no row: it is not shaped
        with replicas[1].transaction() as tx:  # the same burst, told by another replica
            again, _ = tx.run(store.defer(domain=SLOW, shaping=SHAPING, settle=3.0))
        assert again.lowered_rate == bucket.lowered_rate
        with replicas[1].transaction() as tx:
            first = tx.run(store.reserve(domain=SLOW, count=3, shaping=SHAPING))
        with replicas[0].transaction() as tx:
            second = tx.run(store.reserve(domain=SLOW, count=1, shaping=SHAPING))
        assert first.rate == pytest.approx(SHAPING.ceiling / 2, rel=0.05)
        # One schedule for the fleet: the other replica's slot comes after the three.
        assert second.first_slot == pytest.approx(first.first_slot + 3 / first.rate, abs=0.05)
    finally:
        for replica in replicas:
            replica.engine.dispose()


async def test_the_housekeeping_forgets_domains_quiet_for_a_day_and_keeps_the_others(
    db, async_engine
) -> None:
    with Database(db.engine).transaction() as tx:
        for domain in (SLOW, FAST, "quiet.example.org"):
            tx.run(store.defer(domain=domain, shaping=SHAPING, settle=3.0))
    with db.engine.begin() as conn:  # one quiet for a day and a minute, one for an hour
        for domain, quiet in (("quiet.example.org", 86460.0), (FAST, 3600.0)):
            conn.execute(
                update(recipient_domain_rates)
                .where(recipient_domain_rates.c.domain == domain)
                .values(lowered_until=recipient_domain_rates.c.lowered_until - 60.0 - quiet)
            )
    assert await maintenance.forget_quiet_domains(async_engine, datetime.now(UTC)) == {"domains": 1}
    with db.engine.connect() as conn:
        kept = set(conn.execute(select(recipient_domain_rates.c.domain)).scalars())
    assert kept == {SLOW, FAST} and list(shaped_now(db)) == [SLOW]


# --- two workers, each on its own connections ----------------------------------------------


def enqueue_to(db: Any, addresses: list[str]) -> list[Any]:
    now = datetime.now(UTC)  # not the helpers' T0: QUEUE_LIFETIME counts from enqueue
    return [enqueue(db, 1, now=now, to=address)[0] for address in addresses]


def shaped_now(db: Any) -> dict[str, tuple[rate.Bucket, float]]:
    """The shaped domains, read as status_counts reads (not queued behind a worker)."""
    with db.engine.connect().execution_options(**READ_ONLY) as conn:
        return run(conn, store.shaped())


def shaping_worker(engine: Any, provider: MemoryProvider, name: str, shaping: Shaping) -> Worker:
    return Worker(
        engine=engine,
        provider=provider,
        catalog=builtin(),
        config=WorkerConfig(
            worker_id=name,
            poll_interval=0.05,
            sweep_every=0.05,
            concurrency=40,
            policy=RetryPolicy(base=timedelta(seconds=0.5), multiplier=1.0),
            domain_shaping=shaping,
        ),
    )


def attempts_by_address(db: Any) -> dict[str, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(select(outbox_messages.c.to_address, outbox_messages.c.attempt_count))
        return {address: count for address, count in rows}


async def test_a_deferring_domain_is_slowed_for_the_fleet_while_another_goes_at_full_rate(
    db,
) -> None:
    shaping = Shaping.per_minute(120.0, 6.0, 8.0)  # deferred: 1 a second, back in 8 s
    deferred_once = at(SLOW, 0)
    sent: list[tuple[str, float]] = []

    def script(email: Any, nth: int) -> Any:
        address = email.recipients.to[0].address
        if address == deferred_once and nth == 1:
            return Deferred(f"RCPT TO: {DEFERRAL}", domain_deferral=True)
        sent.append((address.rpartition("@")[2], time.monotonic()))
        return Accepted(f"mem-{email.message_id}-{nth}")

    provider = MemoryProvider(script)
    engines = [db.async_engine(), db.async_engine()]
    try:
        first = shaping_worker(engines[0], provider, "w-first", shaping)
        enqueue_to(db, [deferred_once])
        await run_worker_until(first, lambda: bool(shaped_now(db)), timeout=20)
        # Another worker, on its own connections, knows of the deferral only from the
        # database: it slows the domain, and only that domain.
        other = shaping_worker(engines[1], provider, "w-other", shaping)
        enqueue_to(db, [at(SLOW, i) for i in range(1, 6)] + [at(FAST, i) for i in range(20)])
        await run_worker_until(other, lambda: status_counts(db) == {"sent": 26}, timeout=30)
        slow = sorted(t for domain, t in sent if domain == SLOW)
        fast = sorted(t for domain, t in sent if domain == FAST)
        assert len(slow) == 6 and len(fast) == 20
        assert fast[-1] - fast[0] < 1.5  # at full rate: all at once
        # At 1 a second, climbing to 1.6 over the test: never two within 0.4 s (a slot
        # within GO_SECONDS goes at once), and six spread over several seconds.
        gaps = [round(b - a, 2) for a, b in itertools.pairwise(slow)]
        assert min(gaps) >= 0.4 and slow[-1] - slow[0] >= 3.0, gaps
        # No attempt spent on waiting: the deferred one spent the policy's one, no more.
        attempts = attempts_by_address(db)
        assert attempts.pop(deferred_once) == 2 and set(attempts.values()) == {1}
        with db.engine.connect() as conn:
            waits = conn.execute(
                select(message_events.c.detail).where(
                    message_events.c.detail.like("%its recipient domain%")
                )
            ).scalars()
            assert all(w.endswith("(waits; no attempt spent)") for w in waits)
        # It climbs back: once the recovery has run out the domain is not shaped, and its
        # next messages go at full rate too.
        (bucket, now), *_ = shaped_now(db).values()
        time.sleep(max(0.0, bucket.lowered_until - now) + 0.2)
        sent.clear()
        enqueue_to(db, [at(SLOW, i) for i in range(6, 12)])
        await run_worker_until(other, lambda: status_counts(db) == {"sent": 32}, timeout=30)
        again = sorted(t for domain, t in sent if domain == SLOW)
        assert len(again) == 6 and again[-1] - again[0] < 1.0
    finally:
        for engine in engines:
            await engine.dispose()


async def test_recipients_that_never_defer_cost_one_read_a_poll_interval_and_nothing_a_message(
    db, async_engine
) -> None:
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "recipient_domain_rates" in statement:
            statements.append(statement)

    event.listen(async_engine.sync_engine, "before_cursor_execute", seen)
    enqueue_to(db, [at(FAST, i) for i in range(60)])
    worker = shaping_worker(async_engine, MemoryProvider(), "w-quiet", SHAPING)
    started = time.monotonic()
    await run_worker_until(worker, lambda: status_counts(db) == {"sent": 60}, timeout=20)
    polls = (time.monotonic() - started) / worker.config.poll_interval
    assert statements and all(s.lstrip().upper().startswith(("SELECT", "WITH")) for s in statements)
    assert len(statements) <= polls + 2  # the read, once a poll interval: no reservation


async def test_a_throttle_naming_the_recipients_domain_slows_that_domain_not_the_worker(
    db, async_engine
) -> None:
    def script(email: Any, nth: int) -> Any:
        if nth == 1 and email.recipients.to[0].address.endswith(SLOW):
            return Throttled(f"429 too many messages to {SLOW}, slow down")
        return Accepted(f"mem-{email.message_id}-{nth}")

    enqueue_to(db, [at(SLOW, 0)])
    worker = shaping_worker(async_engine, MemoryProvider(script), "w-throttled", SHAPING)
    await run_worker_until(worker, lambda: status_counts(db) == {"sent": 1}, timeout=20)
    assert list(shaped_now(db)) == [SLOW]
    assert worker.paused_until == 0.0  # its claims were never paused for the provider
    assert attempts_by_address(db) == {at(SLOW, 0): 1}  # a throttle spends no attempt


# --- worker processes against a real SMTP server ------------------------------------------


class TimedSMTPServer(RecordingSMTPServer):
    """A recording SMTP server that also notes when each recipient's message arrived."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrivals: list[tuple[str, float]] = []

    def _record(self, message: ReceivedMessage) -> None:
        for recipient in message.rcpt_tos:
            self.arrivals.append((recipient.rpartition("@")[2], time.monotonic()))
        super()._record(message)

    def of(self, domain: str) -> list[float]:
        return sorted(t for d, t in self.arrivals if d == domain)


@pytest.mark.slow
@pytest.mark.parametrize("db", ["postgresql", "mysql"], indirect=True)
def test_worker_processes_slow_a_domain_the_smtp_server_defers_and_not_the_others(
    db, tmp_path: Path
) -> None:
    with TimedSMTPServer() as smtp:
        smtp.inject("rcpt", DEFERRAL, recipient=at(SLOW, 0), times=1)
        env = mailbag_env(
            db.url,
            provider="smtp",
            smtp_host=smtp.host,
            smtp_port=str(smtp.port),
            smtp_tls="none",
            poll_interval="0.2",
            batch_size="50",
            concurrency="16",
            retry_base_seconds="1",
            retry_multiplier="1",
            domain_shaping_ceiling_per_minute="60",  # deferred: 30 a minute
            domain_shaping_floor_per_minute="6",
            domain_shaping_recovery_seconds="20",
        )
        logs = [(tmp_path / f"w{i}.log").open("ab") for i in range(3)]
        workers = [
            start_mailbag("worker", env=env, stdout=subprocess.DEVNULL, stderr=log) for log in logs
        ]
        try:
            enqueue_to(db, [at(SLOW, 0)])
            wait_for(lambda: bool(shaped_now(db)), 30, "the deferral recorded")
            time.sleep(0.5)  # every worker reads it within a poll interval (0.2 s)
            enqueue_to(db, [at(SLOW, i) for i in range(1, 6)] + [at(FAST, i) for i in range(30)])
            wait_for(lambda: status_counts(db) == {"sent": 36}, 60, "every message sent")
            slow, fast = smtp.of(SLOW), smtp.of(FAST)
            # Climbed back once the recovery ran out: the domain's next ones go at once.
            (bucket, now), *_ = shaped_now(db).values()
            time.sleep(max(0.0, bucket.lowered_until - now) + 0.5)
            enqueue_to(db, [at(SLOW, i) for i in range(6, 12)])
            wait_for(lambda: status_counts(db) == {"sent": 42}, 30, "the later ones sent")
            later = smtp.of(SLOW)[len(slow) :]
        finally:
            codes = [stop(worker) for worker in workers]
        assert codes == [0, 0, 0], (tmp_path / "w0.log").read_text()[-2000:]
    assert len(fast) == 30 and fast[-1] - fast[0] < 2.0  # full rate: together
    # At 30 a minute (climbing a little): one every two seconds, about.
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(slow)]
    assert len(slow) == 6 and min(gaps) >= 1.0 and slow[-1] - slow[0] >= 6.0, gaps
    assert len(later) == 6 and later[-1] - later[0] < 2.0
    attempts = attempts_by_address(db)
    assert attempts.pop(at(SLOW, 0)) == 2 and set(attempts.values()) == {1}
