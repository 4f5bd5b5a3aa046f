"""mailbag's MariaDB/MySQL connections are strict whatever the server's default sql_mode.

A lenient server (sql_mode='' is still some servers' setting) cuts a value too long for its
column short with a warning: a message accepted would not be the message sent. Every
connection mailbag opens, sync and async, asks for STRICT_ALL_TABLES, so it is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DataError, OperationalError

from mailbag.store.database import make_async_engine, make_engine
from mailbag.store.schema import tenants

from conftest import TestDB

pytestmark = pytest.mark.parametrize("db", ["mysql"], indirect=True)

TOO_LONG = {  # 201 characters for a String(200) column
    "id": "t_strict",
    "name": "n" * 201,
    "api_key_digest": "d" * 64,
    "api_key_prefix": "p",
    "created_at": datetime(2026, 1, 1, tzinfo=UTC),
}


@pytest.fixture
def lenient_server(db: TestDB) -> Iterator[None]:
    """The server's default sql_mode emptied for the test (new connections take it)."""
    with db.engine.connect() as conn:
        before = conn.execute(text("SELECT @@GLOBAL.sql_mode")).scalar_one()
        conn.execute(text("SET GLOBAL sql_mode = ''"))
    try:
        yield
    finally:
        with db.engine.connect() as conn:
            conn.execute(text("SET GLOBAL sql_mode = :mode"), {"mode": before})


def test_a_lenient_server_still_refuses_a_value_too_long(db, lenient_server):
    # What the server would do to any other client: cut it short and say nothing.
    raw = make_engine(db.url, null_pool=True)
    with raw.connect() as conn:
        conn.execute(text("SET SESSION sql_mode = ''"))  # as a client of this server gets
        conn.execute(insert(tenants).values(TOO_LONG))
        assert len(conn.execute(select(tenants.c.name)).scalar_one()) == 200
        conn.rollback()
    raw.dispose()

    engine = make_engine(db.url, null_pool=True)
    with engine.connect() as conn:
        assert "STRICT_ALL_TABLES" in conn.execute(text("SELECT @@SESSION.sql_mode")).scalar_one()
    too_long = pytest.raises((DataError, OperationalError), match="Data too long")
    with too_long, engine.begin() as conn:
        conn.execute(insert(tenants).values(TOO_LONG))
    engine.dispose()


async def test_the_async_engine_is_strict_too(db, lenient_server):
    engine = make_async_engine(db.url)
    try:
        async with engine.connect() as conn:
            mode = (await conn.execute(text("SELECT @@SESSION.sql_mode"))).scalar_one()
        assert "STRICT_ALL_TABLES" in mode
        with pytest.raises((DataError, OperationalError), match="Data too long"):
            async with engine.begin() as conn:
                await conn.execute(insert(tenants).values(TOO_LONG))
    finally:
        await engine.dispose()
    with db.engine.connect() as conn:
        assert conn.execute(select(tenants.c.id).where(tenants.c.id == "t_strict")).first() is None
