"""PostgreSQL LISTEN: wake idle workers the moment an enqueue commits.

A dedicated autocommit psycopg connection listens on the channel the enqueue NOTIFYs. On
(re)connect it fires once, since notifications sent while disconnected are lost; polling
remains the fallback if this connection is down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from mailbag.store.database import DEFAULT_TIMEOUT, connect_args


def libpq_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def listen(
    url: str,
    channel: str,
    on_notify: Callable[[], None],
    log: Any,
    network_timeout: float = DEFAULT_TIMEOUT,
) -> None:
    delay = 1.0
    while True:
        try:
            # The engines' connect timeout and keepalives: a partition ends this connection
            # (and polling carries on) instead of leaving it waiting for ever.
            connection = await psycopg.AsyncConnection.connect(
                libpq_url(url), autocommit=True, **connect_args(url, network_timeout)
            )
            async with connection as conn:
                await conn.execute(f"LISTEN {channel}")
                delay = 1.0
                on_notify()
                async for _ in conn.notifies():
                    on_notify()
        except (psycopg.Error, OSError) as exc:
            log.warning("listen_connection_lost", error=type(exc).__name__, retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
