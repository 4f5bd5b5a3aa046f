"""The workers' LISTEN connection takes the database URL the engines take."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from mailbag.store.listen import libpq_url, listen

from conftest import TestDB


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_a_url_that_turns_prepared_statements_on_still_listens(db: TestDB) -> None:
    # `?prepare_threshold=5` (docs/pgbouncer.md, direct connections) is psycopg's, not
    # libpq's: the listener refused the URL and lost every NOTIFY, quietly polling instead.
    url = f"{db.url}{'&' if '?' in db.url else '?'}prepare_threshold=5"
    assert "prepare_threshold" not in libpq_url(url)
    heard: list[str | None] = []
    task = asyncio.create_task(
        listen(url, "mailbag_test_listen", heard.append, structlog.get_logger())
    )
    try:
        for _ in range(100):  # the (re)connect fires once with None
            if heard:
                break
            await asyncio.sleep(0.05)
        assert heard[0] is None
        import psycopg

        async with await psycopg.AsyncConnection.connect(libpq_url(db.url), autocommit=True) as c:
            await c.execute("SELECT pg_notify('mailbag_test_listen', 'hello')")
        for _ in range(100):
            if "hello" in heard:
                break
            await asyncio.sleep(0.05)
        assert "hello" in heard
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
