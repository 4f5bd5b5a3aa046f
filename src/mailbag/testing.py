"""Helpers for the tests of an application that sends email through mailbag.

Enqueue in your own transaction as in production, then run the real worker with an
in-memory provider until nothing is due, and look at what would have been sent:

    import mailbag
    from mailbag.testing import deliver_all

    with engine.begin() as conn:
        mailbag.enqueue(conn, to="ada@example.org", subject="Welcome", text="Hi Ada")
    (email,) = deliver_all(engine)
    assert email.to == ["ada@example.org"] and "Hi Ada" in email.text

- `deliver_all(engine)` / `await deliver_all_async(engine)`: the worker (templates, MIME,
  state changes, retries as configured) with the `capture` provider, until no message is
  due or in flight; returns the emails it captured (an `Outbox`, a list of `SentEmail`).
  A message it attempted that did not end `sent` raises `Undelivered` (check=False: it
  does not), saying which and why. `respond=` answers for the provider: it is given each
  `SentEmail` before it is recorded; if it raises, the run ends in `RespondFailed`.
- `capture()` (a context manager) and the pytest fixture `mailbag_outbox` (import it into
  your conftest.py): every email captured while inside, like Django's `mail.outbox`.
- `migrate(engine)`: create or upgrade mailbag's tables in a test database.
- `faults(rates=..., script=..., seed=...)`: a provider that fails as real ones do
  (timeouts after acceptance, 429s, 5xx, refused connections, partial batches) around
  capture. `deliver_all(engine, provider=it)` sends through it; `reconcile(engine, it)`
  settles `unknown` messages by its records, as the worker's reconciliation does;
  `ingest_events(engine, it.events(duplicate=0.2, shuffle=True))` takes in what its
  webhook would have said, through the webhooks' own door. A worker process gets it with
  MAILBAG_PROVIDER=faults (MAILBAG_FAULTS_RATES, _SCRIPT, _SEED).
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import SecretStr
from sqlalchemy import Engine, and_, or_, select
from sqlalchemy.engine import URL, make_url

from mailbag import keys, runtime, templates
from mailbag.clock import Clock, utcnow
from mailbag.domain.delivery import Deferred, SendOutcome
from mailbag.domain.events import ProviderEvent
from mailbag.domain.states import CLAIMABLE, Status
from mailbag.providers.base import Provider
from mailbag.providers.faults import FaultProvider
from mailbag.providers.memory import CaptureProvider, Outbox, SentEmail, capture
from mailbag.services.erasure import engine_options
from mailbag.services.reconciliation import Reconciler, ingest
from mailbag.settings import Settings
from mailbag.store import migrate as _migrate
from mailbag.store.database import READ_ONLY, dialect_of, make_async_engine, make_engine
from mailbag.store.schema import message_events as me
from mailbag.store.schema import outbox_messages as om
from mailbag.worker import Worker, WorkerConfig

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.compose import OutgoingEmail

__all__ = [
    "CaptureProvider",
    "Failure",
    "FaultProvider",
    "Outbox",
    "Respond",
    "RespondFailed",
    "SentEmail",
    "Undelivered",
    "capture",
    "deliver_all",
    "deliver_all_async",
    "faults",
    "ingest_events",
    "ingest_events_async",
    "mailbag_outbox",
    "migrate",
    "reconcile",
    "reconcile_async",
]

POLL_SECONDS = 0.02

# What `respond=` is: given each email as a SentEmail (what deliver_all returns), it answers
# for the provider (Rejected, Deferred, ... from mailbag.domain.delivery); None accepts.
Respond = Callable[[SentEmail], SendOutcome | None]

# `faults(rates="throttle=0.1,server_error=0.05", seed=1)`, or `script="throttle,accept"`:
# providers/faults.py says what each fault answers.
faults = FaultProvider

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    """A message the run attempted that was not sent: where it stands now, and why."""

    message_id: uuid.UUID
    to: str
    status: str
    error: str | None

    def __str__(self) -> str:
        return f"{self.message_id} to {self.to}: {self.status} ({self.error or 'no error given'})"


class RespondFailed(AssertionError):
    """The test's `respond` callable raised: the exception it raised is the cause. The
    email it was answering for is deferred (`retrying`, or `dead` on its last attempt), never
    sent nor `unknown`."""

    def __init__(self, email: SentEmail, count: int) -> None:
        self.email, self.count = email, count
        more = f" (and for {count - 1} other email(s))" if count > 1 else ""
        super().__init__(
            f"respond= raised while answering for the email {email.message_id} to "
            f"{', '.join(email.recipients)}{more}: see the exception above"
        )


class Undelivered(AssertionError):
    """Some messages were attempted and not sent. `failures` says which; `outbox` has what
    was captured all the same."""

    def __init__(self, failures: list[Failure], outbox: Outbox) -> None:
        self.failures, self.outbox = failures, outbox
        lines = "\n".join(f"  {failure}" for failure in failures)
        super().__init__(f"{len(failures)} message(s) not sent:\n{lines}")


def migrate(database: Engine | AsyncEngine | URL | str) -> None:
    """Create or upgrade mailbag's tables (as `mailbag migrate` does)."""
    engine = make_engine(_url_of(database), null_pool=True)
    try:
        _migrate.upgrade(engine)
    finally:
        engine.dispose()


def deliver_all(
    database: Engine | AsyncEngine | URL | str | None = None,
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
    respond: Respond | None = None,
    provider: Provider | None = None,
    timeout: float = 30.0,
    check: bool = True,
) -> Outbox:
    """Run the worker with the capture provider until no message is due or in flight, and
    return the emails it captured, oldest first.

    `database`: an engine or URL (default: `settings.database_url`); `settings`: the
    worker's (default: from the environment, as `mailbag worker` reads them); `at`: run as
    if it were then (a message scheduled for later, or a retry, is due then); `respond`:
    the provider's answer to an email, given as a `SentEmail` (return e.g.
    `Rejected("...")`; None accepts); `provider`: send through this one instead (e.g.
    `faults(...)`, whose emails taken are captured too). Raises `RespondFailed` (from what
    it raised) when `respond` raises, whatever `check` says; `Undelivered` when a message
    it attempted was not sent (unless check=False); TimeoutError when messages are still
    due after `timeout` seconds."""
    return _blocking(
        lambda: deliver_all_async(
            database,
            settings=settings,
            at=at,
            respond=respond,
            provider=provider,
            timeout=timeout,
            check=check,
        ),
        "deliver_all",
    )


async def deliver_all_async(
    database: Engine | AsyncEngine | URL | str | None = None,
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
    respond: Respond | None = None,
    provider: Provider | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109 (deliver_all's own parameters, alike)
    check: bool = True,
) -> Outbox:
    """`deliver_all` for async tests."""
    if provider is not None and respond is not None:
        raise ValueError("respond= answers for the capture provider: give it or provider=")
    settings = await _ready(database, settings)
    clock: Clock = (lambda: at) if at is not None else utcnow
    worker_id = f"mailbag.testing-{uuid.uuid4().hex[:12]}"
    engine = _engine(settings)
    raised: list[tuple[SentEmail, Exception]] = []
    if provider is None:
        provider = CaptureProvider(_answering(respond, raised) if respond else None)
    try:
        worker = Worker(
            engine=engine,
            provider=provider,
            catalog=templates.load(settings.templates_dir),
            config=_config(settings, worker_id),
            clock=clock,
        )
        with capture() as outbox:
            await _run_until_drained(worker, engine, clock, timeout)
        failures = await _failures(engine, worker_id)
    finally:
        await engine.dispose()
    if raised:
        email, error = raised[0]
        raise RespondFailed(email, len(raised)) from error
    if check and failures:
        raise Undelivered(failures, outbox)
    return outbox


def reconcile(
    database: Engine | AsyncEngine | URL | str | None,
    provider: Provider,
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
) -> dict[str, int]:
    """One pass of the worker's reconciliation over the `unknown` messages: each is settled
    by its stored provider events, else by `provider`'s own records (`find_sent`: a
    `faults` provider finds what it took before it timed out). Returns how many ended
    each way (`resolved_sent`, `resolved_failed`, `waiting`, `flagged`). Nothing is sent."""
    return _blocking(
        lambda: reconcile_async(database, provider, settings=settings, at=at), "reconcile"
    )


async def reconcile_async(
    database: Engine | AsyncEngine | URL | str | None,
    provider: Provider,
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
) -> dict[str, int]:
    """`reconcile` for async tests."""
    settings = await _ready(database, settings)
    flag_after = timedelta(minutes=settings.reconcile_flag_after_minutes)
    engine = _engine(settings)
    try:
        reconciler = Reconciler(engine, providers={provider.name: provider}, flag_after=flag_after)
        done = await reconciler.run_once(at or utcnow(), message_domain=settings.message_id_host)
    finally:
        await engine.dispose()
    return dict(done)


def ingest_events(
    database: Engine | AsyncEngine | URL | str | None,
    events: Sequence[ProviderEvent],
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
) -> dict[str, int]:
    """Take in provider events (e.g. a `faults` provider's `events()`) as the webhooks do:
    each stored once, matched to its message, a hard bounce or complaint suppressing its
    recipient, an `unknown` message settled. Returns the counts (`stored`, `duplicates`,
    `unmatched`, `resolved`, `suppressed`)."""
    return _blocking(
        lambda: ingest_events_async(database, events, settings=settings, at=at), "ingest_events"
    )


async def ingest_events_async(
    database: Engine | AsyncEngine | URL | str | None,
    events: Sequence[ProviderEvent],
    *,
    settings: Settings | None = None,
    at: datetime | None = None,
) -> dict[str, int]:
    """`ingest_events` for async tests."""
    engine = _engine(await _ready(database, settings))
    try:
        return (await ingest(engine, events, at or utcnow())).as_dict()
    finally:
        await engine.dispose()


try:
    import pytest
except ImportError:  # pytest is no dependency of mailbag: no fixture without it
    pass
else:

    @pytest.fixture
    def mailbag_outbox() -> Iterator[Outbox]:
        """Every email captured during the test (by deliver_all or any capture provider)."""
        with capture() as outbox:
            yield outbox


# --- the parts ---------------------------------------------------------------------------


def _blocking(run: Callable[[], Coroutine[Any, Any, T]], name: str) -> T:
    """A helper's sync face: its async twin run to the end, outside any event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run())
    raise RuntimeError(
        f"{name} was called with an event loop running: use `await {name}_async(...)`"
    )


def _engine(settings: Settings) -> AsyncEngine:
    # Events fire event hooks as in production (a message's state change, a bounce).
    return make_async_engine(settings.database_url, execution_options=engine_options(settings))


def _answering(
    respond: Respond, raised: list[tuple[SentEmail, Exception]]
) -> Callable[[OutgoingEmail], SendOutcome | None]:
    """The capture provider's answer: `respond` given the SentEmail. What it raises is kept
    for deliver_all to raise once the run is over; the email is deferred meanwhile (an
    exception reaching the worker would make its message `unknown`, and stay silent)."""

    def answer(email: OutgoingEmail) -> SendOutcome | None:
        sent = SentEmail(email)
        try:
            return respond(sent)
        except Exception as exc:
            raised.append((sent, exc))
            return Deferred(f"respond= raised {type(exc).__name__} (mailbag.testing)")

    return answer


def _url_of(database: Engine | AsyncEngine | URL | str) -> str:
    if isinstance(database, str):
        url = database
    elif isinstance(database, URL):
        url = database.render_as_string(hide_password=False)
    else:
        url = database.url.render_as_string(hide_password=False)
    parsed = make_url(url)
    if dialect_of(parsed) == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise ValueError(
            "an in-memory SQLite database is private to one connection, so the worker cannot "
            "see it: use a file (sqlite:///path/to/test.db)"
        )
    return url


def _settings_for(
    database: Engine | AsyncEngine | URL | str | None, settings: Settings | None
) -> Settings:
    base = settings if settings is not None else Settings()
    if database is None:
        _url_of(base.database_url)  # the same check
        return base
    url = _url_of(database)
    if url == base.database_url:
        return base
    return Settings.model_validate({**base.model_dump(), "database_url": url})


async def _ready(
    database: Engine | AsyncEngine | URL | str | None, settings: Settings | None
) -> Settings:
    """The settings for `database`, once its schema is known to be current."""
    settings = _settings_for(database, settings)
    await asyncio.to_thread(_require_schema, settings)
    return settings


def _require_schema(settings: Settings) -> None:
    try:
        runtime.ensure_schema(settings, upgrade=False)
    except runtime.SchemaNotCurrent as exc:
        raise runtime.SchemaNotCurrent(
            f"{exc} (in a test: mailbag.testing.migrate(engine))"
        ) from None


def _config(settings: Settings, worker_id: str) -> WorkerConfig:
    # Quick to notice new work and to stop; everything else as configured.
    quick = {
        "worker_id": worker_id,
        "poll_interval": POLL_SECONDS,
        "sweep_every": 0.2,
        "db_backoff": (0.05, 0.5),
        "shutdown_grace": 5.0,
    }
    try:
        return WorkerConfig.from_settings(settings, **quick)
    except keys.MissingSecretKey:
        # Without the deployment's key only verification emails cannot be rendered: they
        # fail, saying so, and every other email is delivered.
        keyless = settings.model_copy(update={"secret_key": SecretStr(secrets.token_hex(32))})
        return replace(WorkerConfig.from_settings(keyless, **quick), tokens=None)


async def _run_until_drained(
    worker: Worker, engine: AsyncEngine, clock: Clock, seconds: float
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(seconds):
            # The database says when the work is done: polled, as nothing signals it.
            while True:
                if task.done() or not await _pending(engine, clock()):
                    break
                await asyncio.sleep(POLL_SECONDS)
    except TimeoutError:
        left = await _pending(engine, clock())
        raise TimeoutError(
            f"after {seconds} s, {len(left)} message(s) still due or being sent: "
            + ", ".join(f"{message_id} ({status})" for message_id, status in left[:5])
        ) from None
    finally:
        stop.set()
        await task  # raises what stopped the worker, if anything did


async def _pending(engine: AsyncEngine, now: datetime) -> list[tuple[uuid.UUID, str]]:
    """Messages due now or held by a worker (this run's until their outcome is written)."""
    due = and_(om.c.status.in_([s.value for s in CLAIMABLE]), om.c.next_attempt_at <= now)
    query = select(om.c.id, om.c.status).where(or_(due, om.c.status == Status.PROCESSING.value))
    async with engine.connect() as conn:
        conn = await conn.execution_options(**READ_ONLY)
        return [(row.id, row.status) for row in await conn.execute(query)]


async def _failures(engine: AsyncEngine, worker_id: str) -> list[Failure]:
    """The messages this run claimed that are not sent now, in the order they were claimed."""
    claimed = select(me.c.message_id).where(me.c.actor == worker_id).distinct()
    query = (
        select(om.c.id, om.c.to_address, om.c.status, om.c.last_error)
        .where(om.c.id.in_(claimed), om.c.status != Status.SENT.value)
        .order_by(om.c.claim_order_at, om.c.id)
    )
    async with engine.connect() as conn:
        conn = await conn.execution_options(**READ_ONLY)
        rows = (await conn.execute(query)).all()
    return [Failure(row.id, row.to_address, row.status, row.last_error) for row in rows]
