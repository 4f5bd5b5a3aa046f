"""Apply the schema with Alembic, and check it is current, on any of the three databases.

Only `upgrade` needs Alembic (about 0.15 s to import): every command, replica and `/readyz`
checks the schema with one plain query against HEAD, which a test holds equal to the
newest migration's revision.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, exc, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
# The newest migration's revision: bump it with every new file in migrations/versions
# (tests/test_migrations.py fails until it matches Alembic's head).
HEAD = "0021_templates"
VERSION_TABLE = "alembic_version"


def alembic_config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


# Any fixed number/name will do: it only has to be the same for every mailbag process.
LOCK_ID = 0x6D61_696C_6261_67  # "mailbag"
LOCK_NAME = "mailbag.migrate:"  # + the database's name: MariaDB's named locks are server-wide
LOCK_WAIT_SECONDS = 600


class MigrationLockTimeout(RuntimeError):
    pass


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Upgrade under a database lock, so that migrations started side by side (replicas,
    scripts) run one after the other: the later ones find the schema current.

    PostgreSQL: a transaction-level advisory lock, released with the migration's transaction.
    MariaDB: GET_LOCK on the connection (its DDL commits implicitly, so a transaction could
    not hold it). SQLite: the engine's BEGIN IMMEDIATE already takes the write lock.
    """
    from alembic import command

    _migrate(engine, lambda config: command.upgrade(config, revision))


def downgrade(engine: Engine, revision: str) -> None:
    """Go back to `revision`, under the same lock (an operator's way back, and the tests')."""
    from alembic import command

    _migrate(engine, lambda config: command.downgrade(config, revision))


def _migrate(engine: Engine, step: Callable[[Config], None]) -> None:
    dialect = engine.dialect.name
    with engine.connect() as connection:
        if dialect == "mysql":
            _mysql_lock(connection)
        if dialect == "sqlite":
            _sqlite_foreign_keys(connection, on=False)
        try:
            with connection.begin():
                if dialect == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": LOCK_ID})
                step(alembic_config(connection))
                if dialect == "sqlite":
                    _sqlite_check_foreign_keys(connection)
        finally:
            if dialect == "mysql":
                _mysql_unlock(connection)
            if dialect == "sqlite":
                _sqlite_foreign_keys(connection, on=True)


def _sqlite_foreign_keys(connection: Connection, *, on: bool) -> None:
    """Foreign keys off while migrating: SQLite changes a column or a CHECK by rebuilding
    the table, and dropping the old outbox_messages would otherwise delete every event
    (ON DELETE CASCADE). The PRAGMA is ignored inside a transaction, so it goes to the
    driver's connection before SQLAlchemy begins one (and after it ends)."""
    dbapi = connection.connection.dbapi_connection
    assert dbapi is not None
    dbapi.execute(f"PRAGMA foreign_keys = {'ON' if on else 'OFF'}")


def _sqlite_check_foreign_keys(connection: Connection) -> None:
    """With the keys off, nothing stopped a migration from leaving a dangling reference:
    refuse to commit one."""
    dangling = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    if dangling:
        raise RuntimeError(f"the migration left rows with dangling foreign keys: {dangling[:5]}")


def _mysql_lock_name(connection: Connection) -> str:
    return f"{LOCK_NAME}{connection.engine.url.database or ''}"[:64]  # the longest allowed


def _mysql_lock(connection: Connection) -> None:
    name = _mysql_lock_name(connection)
    got = connection.execute(
        text("SELECT GET_LOCK(:name, :wait)"), {"name": name, "wait": LOCK_WAIT_SECONDS}
    ).scalar()
    connection.commit()  # GET_LOCK belongs to the session, not to this transaction
    if got != 1:
        raise MigrationLockTimeout(
            f"another migration held the lock {name!r} for {LOCK_WAIT_SECONDS} s"
        )


def _mysql_unlock(connection: Connection) -> None:
    try:
        connection.execute(
            text("SELECT RELEASE_LOCK(:name)"), {"name": _mysql_lock_name(connection)}
        )
        connection.commit()
    except exc.DBAPIError:
        connection.invalidate()  # a closed session holds no lock; never pool one that might


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None when it has no mailbag schema at all."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    found = connection.execute(text("SELECT version_num FROM alembic_version")).scalars()
    revisions = sorted(found)
    # One linear history keeps one row; anything else is not HEAD, and shown as it is.
    return ", ".join(revisions) if revisions else None


def is_current(connection: Connection) -> bool:
    return current_revision(connection) == HEAD
