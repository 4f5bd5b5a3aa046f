"""PostgreSQL LISTEN: wake idle workers the moment an enqueue commits.

A dedicated autocommit psycopg connection listens on the channel the enqueue NOTIFYs. On
(re)connect it fires once, since notifications sent while disconnected are lost; polling
remains the fallback if this connection is down.

LISTEN needs a session of its own: behind PgBouncer in transaction mode the LISTEN is
accepted, then its server connection goes back to the pool and no notification ever comes
(LISTEN_URL names a direct connection for it; docs/pgbouncer.md). Nothing fails loudly
there, so after each (re)connect a probe NOTIFYs a payload of its own, sent the way an
enqueue's is (the caller's `probe`, on DATABASE_URL), and a warning says so when it does
not arrive in time. Probe payloads wake nobody, here or on other replicas.

`on_notify` gets each NOTIFY's payload (None at each (re)connect: what was sent meanwhile is
lost), and `on_working` says when LISTEN is known to hear what DATABASE_URL sends (True: the
probe came back) and when it stops (False: the connection is lost). A listener may count on
NOTIFYs only in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from mailbag.store.database import DEFAULT_TIMEOUT, connect_args

if TYPE_CHECKING:  # the asyncio extension brings in the ORM: only its callers load it
    from sqlalchemy.ext.asyncio import AsyncConnection

PROBE_PREFIX = "mailbag-listen-probe:"
# How long a probe's NOTIFY may take to come back before LISTEN counts as not working: a
# round trip through the database, so a second is plenty even on a loaded server.
PROBE_SECONDS = 5.0

Probe = Callable[[str], Awaitable[None]]  # sends NOTIFY with this payload on the channel


def libpq_url(url: str) -> str:
    """The URL as libpq takes it: the driver named plainly, without psycopg's own
    `prepare_threshold` (connect_args passes that to psycopg; libpq refuses the URL)."""
    plain = make_url(url).set(drivername="postgresql")
    return plain.difference_update_query(["prepare_threshold"]).render_as_string(
        hide_password=False
    )


async def notify(conn: AsyncConnection, channel: str, payload: str) -> None:
    """NOTIFY `payload` on `channel` (delivered at the transaction's commit)."""
    await conn.execute(select(func.pg_notify(channel, payload)))


async def listen(
    url: str,
    channel: str,
    on_notify: Callable[[str | None], None],
    log: Any,
    network_timeout: float = DEFAULT_TIMEOUT,
    *,
    probe: Probe | None = None,
    probe_seconds: float = PROBE_SECONDS,
    on_working: Callable[[bool], None] = lambda working: None,
) -> None:
    delay = 1.0
    while True:
        try:
            # The engines' connect timeout and keepalives: a partition ends this connection
            # (and polling carries on) instead of leaving it waiting for ever.
            connection = await psycopg.AsyncConnection.connect(
                libpq_url(url), autocommit=True, **connect_args(url, network_timeout)
            )
            try:
                async with connection as conn:
                    await conn.execute(f"LISTEN {channel}")
                    delay = 1.0
                    on_notify(None)
                    await _hear(conn, url, on_notify, log, probe, probe_seconds, on_working)
            finally:  # however it ends (lost, cancelled, a bug): nothing is heard from now
                on_working(False)
        except (psycopg.Error, OSError) as exc:
            log.warning("listen_connection_lost", error=type(exc).__name__, retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


async def _hear(
    conn: psycopg.AsyncConnection[Any],
    url: str,
    on_notify: Callable[[str | None], None],
    log: Any,
    probe: Probe | None,
    probe_seconds: float,
    on_working: Callable[[bool], None],
) -> None:
    """Pass on every notification until the connection ends, probing it once first."""
    payload = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
    heard = asyncio.Event()
    checking = None
    if probe is not None:
        checking = asyncio.create_task(_check(probe, payload, heard, url, log, probe_seconds))
    try:
        async for notification in conn.notifies():
            if notification.payload == payload:
                heard.set()
                on_working(True)
            elif not notification.payload.startswith(PROBE_PREFIX):  # another's probe
                on_notify(notification.payload)
    finally:
        if checking is not None:
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checking


async def _check(
    probe: Probe, payload: str, heard: asyncio.Event, url: str, log: Any, seconds: float
) -> None:
    try:
        await probe(payload)
    except (SQLAlchemyError, OSError) as exc:  # the database is down: the worker says so
        log.info("listen_probe_not_sent", error=type(exc).__name__)
        return
    try:
        await asyncio.wait_for(heard.wait(), seconds)
    except TimeoutError:
        log.warning(
            "listen_not_working",
            listen_url=make_url(url).render_as_string(hide_password=True),
            waited_seconds=seconds,
            hint=(
                "LISTEN heard no NOTIFY: idle workers wake only every POLL_INTERVAL. Is this "
                "URL a transaction pooler (PgBouncer)? Set LISTEN_URL to a direct PostgreSQL "
                "(or session-pooled) URL"
            ),
        )
        return
    log.debug("listen_working")
