"""Erasure of one person's data (`mailbag erase ADDRESS`, `POST /v1/admin/erasures`).

`Erasures.run` checks the address and the tenant before it writes anything, then runs the
chunks of store/erasure.py, each its own short transaction of at most domain.erasure.CHUNK
rows, and says how it ended:

- done: nothing in scope quotes the address any more; it stays suppressed by its keyed hash;
- waiting: the only rows left are messages a worker holds right now (a claimed message is
  never changed under its worker: it could be sent with what it carried, and its outcome
  written after the erasure). Run it again once their lease ends (`mailbag erase` waits
  for them itself); the same erasure resumes.

An interrupted run (a killed process, a lost connection) leaves its record `running`: the
next run of the same address and scope takes it up where it stopped.

On SQLite the file is then rewritten (VACUUM) and its write-ahead log emptied, so that no
free page and no old frame still holds what was erased (`compact_sqlite`).

Errors:
    InvalidAddress   not an email address: 422, exit 2, nothing written
    NoErasureKey     no deployment key to hash the address with: 409, exit 1
    UnknownTenant    (services.tenants) no tenant has that id or name: 404, exit 2
"""

from __future__ import annotations

import functools
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from email_validator import EmailNotValidError

from mailbag.clock import utcnow
from mailbag.domain.erasure import CHUNK, ErasureKey, State
from mailbag.domain.message import ANY_ADDRESS, normalize_address
from mailbag.services.hooks import fan_out
from mailbag.services.tenants import tenant_id_of
from mailbag.store import erasure as store
from mailbag.store.erasure import Erasure
from mailbag.store.plan import Plan, dialect_of_connection
from mailbag.store.session import AsyncDatabase
from mailbag.store.suppressions import ERASURE_KEY_OPTION

if TYPE_CHECKING:  # engines are handed in, never made here
    from sqlalchemy.ext.asyncio import AsyncEngine

    from mailbag.settings import Settings


class InvalidAddress(ValueError):
    """Not an email address; nothing was written."""


class NoErasureKey(Exception):
    """No deployment key: an erased address could not be kept suppressed by its hash."""


def erasure_key(settings: Settings) -> ErasureKey | None:
    """The key erased addresses are hashed under, if the deployment has a key."""
    return settings.erasure_key


def engine_options(settings: Settings) -> dict[str, Any]:
    """The execution options every engine mailbag builds from settings carries for its
    plans (store/plan.py connection_option): how hooks fan out, and the erasure key the
    suppression checks hash addresses with."""
    options: dict[str, Any] = dict(fan_out(settings).options())
    if (key := erasure_key(settings)) is not None:
        options[ERASURE_KEY_OPTION] = key
    return options


def checked_address(address: str) -> str:
    """The address as mailbag stores it (domain lowercased); InvalidAddress otherwise."""
    try:
        return normalize_address(address.strip(), ANY_ADDRESS)
    except EmailNotValidError as exc:
        raise InvalidAddress(f"{address!r} is not an email address: {exc}") from None


@dataclass(frozen=True)
class Outcome:
    erasure: Erasure
    held: int  # messages a worker holds right now, left for a later run (state waiting)


class Erasures:
    def __init__(self, engine: AsyncEngine, key: ErasureKey | None, *, chunk: int = CHUNK):
        self.engine = engine
        self.db = AsyncDatabase(engine)
        self.key = key
        self.chunk = chunk

    async def run(self, address: str, *, tenant: str | None, actor: str) -> Outcome:
        """Erase (or go on erasing) what mailbag holds about `address`, of one tenant (its
        id or name) or of every tenant (None)."""
        address = checked_address(address)
        if self.key is None:
            raise NoErasureKey(
                "set MAILBAG_SECRET_KEY: an erased address is kept by its keyed hash"
            )
        address_hash = self.key.hashed(address)
        async with self.db.transaction() as tx:
            tenant_id = None if tenant is None else await tx.run(tenant_id_of(tenant))
            erasure = await tx.run(
                store.begin(
                    address=address,
                    address_hash=address_hash,
                    tenant_id=tenant_id,
                    now=utcnow(),
                    actor=actor,
                )
            )
        # The messages first (what hangs from them goes with them), then every other table.
        chunks: list[Callable[..., Plan[int]]] = [
            functools.partial(store.erase_messages, erasure.id, actor=actor)
        ]
        chunks += [
            functools.partial(store.erase_rows, erasure.id, rows) for rows in store.OTHER_ROWS
        ]
        for chunk in chunks:
            while await self._chunk(chunk, address=address, tenant_id=tenant_id):
                pass
        async with self.db.transaction() as tx:
            held = await tx.run(store.held_messages(address=address, tenant_id=tenant_id))
            erasure = await tx.run(store.finish(erasure.id, waiting=held > 0, now=utcnow()))
        if erasure.state == State.DONE:
            await compact_sqlite(self.engine)
        from mailbag import log  # structlog: not for the commands that only build engines

        # The record of the erasure: its id, scope and counts, never the address.
        log.get("mailbag.erasure").info(
            "erasure_" + erasure.state,
            erasure_id=str(erasure.id),
            tenant_id=tenant_id,
            held=held,
            **dict(erasure.progress),
        )
        return Outcome(erasure, held)

    async def _chunk(
        self, chunk: Callable[..., Plan[int]], *, address: str, tenant_id: str | None
    ) -> bool:
        """One chunk in its own transaction; whether it was full (more may follow)."""
        async with self.db.transaction() as tx:
            done = await tx.run(
                chunk(address=address, tenant_id=tenant_id, now=utcnow(), limit=self.chunk)
            )
        return done >= self.chunk

    async def get(self, erasure_id: uuid.UUID) -> Erasure | None:
        async with self.db.connect(read_only=True) as session:
            return await session.run(store.get(erasure_id))

    async def listing(self, *, limit: int = 100) -> list[Erasure]:
        async with self.db.connect(read_only=True) as session:
            return await session.run(store.listing(limit=limit))


async def compact_sqlite(engine: AsyncEngine) -> bool:
    """On SQLite, rewrite the file (VACUUM: no free page keeps erased bytes) and empty its
    write-ahead log (checkpoint TRUNCATE: no old frame keeps them). False when another
    connection kept the file or its log from it (logged: run `mailbag erase` again later);
    the erasure itself is done either way."""
    async with engine.connect() as conn:
        if dialect_of_connection(conn) != "sqlite":
            return True
        # On the driver's own connection: SQLAlchemy's would BEGIN first (store/database.py
        # begins every transaction IMMEDIATE), and VACUUM cannot run inside a transaction.
        sqlite = (await conn.get_raw_connection()).driver_connection
        assert sqlite is not None
        try:
            await sqlite.execute("VACUUM")
            async with sqlite.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cursor:
                busy = (await cursor.fetchone())[0]
        except sqlite3.OperationalError:  # locked past the busy timeout by a busy writer
            busy = 1
    if busy:
        from mailbag import log

        log.get("mailbag.erasure").warning("erasure_wal_busy")
    return not busy


def describe(erasure: Erasure, *, held: int = 0) -> dict[str, Any]:
    """An erasure as the API and `mailbag erase --json` show it."""
    return {
        "id": str(erasure.id),
        "tenant_id": erasure.tenant_id,
        "state": erasure.state,
        "progress": dict(erasure.progress),
        "held": held,
        "requested_at": erasure.requested_at.isoformat(),
        "requested_by": erasure.requested_by,
        "finished_at": erasure.finished_at.isoformat() if erasure.finished_at else None,
    }
