"""SQLAlchemy on Django's own connection: mailbag's plans run on the DB-API connection Django
holds for an alias, inside whatever transaction Django has open on it.

    with transaction.atomic(using="default"):
        Order.objects.create(...)
        with on_django_connection("default") as conn:   # a sqlalchemy Connection
            write_many(conn, messages)                   # committed or rolled back with Order

Why an engine over Django's connection, and not a runner that compiles each statement for
Django's cursor: plans read their answers through SQLAlchemy Results (rows by column name,
UUIDs, JSON, aware datetimes, dialect-specific INSERTs); a cursor runner would have to
redo all of SQLAlchemy's result typing. Here SQLAlchemy compiles and types as it always
does, and only the connection is Django's. What keeps SQLAlchemy off Django's transaction:

- the pool (NullPool) asks `creator` for Django's live DB-API connection at every checkout,
  so it is always the current thread's, and the one Django has after it reconnects;
- the dialect's begin, commit, rollback and close do nothing (`_DjangoOwnsTheConnection`):
  closing a SQLAlchemy Connection rolls its transaction back, and SQLAlchemy's first
  connect ends with a rollback; both would end Django's transaction. Django alone commits,
  rolls back and closes; the pool does no reset on return either;
- the dialect's on-connect setup is off: it would be added again at every checkout of a
  connection that outlives each use (psycopg notice handlers, SQLite functions);
- values come back the way Django's connection makes them: its SQLite connection parses
  DATETIME columns into datetimes (detect_types), and its psycopg adapters load jsonb as
  text. The dialects below accept both forms.

Django's sqlite3 and postgresql (psycopg 3) backends are supported; another backend raises
ImproperlyConfigured saying so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite import DATETIME as SQLITE_DATETIME
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.pool import NullPool
from sqlalchemy.types import DateTime

# Django's DB-API module -> the URL of the dialect below that speaks to its connections.
_URLS = {
    "sqlite3": "sqlite+mailbag_django://",
    "psycopg": "postgresql+mailbag_django://",
}


class _DjangoOwnsTheConnection:
    """Mixed into a dialect: SQLAlchemy never ends Django's transaction nor closes its
    connection (see the module docstring)."""

    def do_begin(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_close(self, dbapi_connection: Any) -> None:
        pass

    def do_terminate(self, dbapi_connection: Any) -> None:
        pass

    def on_connect(self) -> Any:  # Any: the parents disagree on the callable's argument
        return None


class _DateTimeOrParsed(SQLITE_DATETIME):
    """SQLite DATETIME that also takes the datetime Django's sqlite3 converter made."""

    def result_processor(self, dialect: Any, coltype: object) -> Callable[[Any], Any] | None:
        parse = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if value is None or isinstance(value, datetime) or parse is None:
                return value
            return parse(value)

        return process


class SQLiteOnDjango(_DjangoOwnsTheConnection, SQLiteDialect_pysqlite):
    supports_statement_cache = True  # its statements compile as its parent's do
    colspecs = {**SQLiteDialect_pysqlite.colspecs, DateTime: _DateTimeOrParsed}


def _json_text(value: Any) -> Any:
    """Django's psycopg adapters load jsonb as text; anything else came parsed already."""
    return json.loads(value) if isinstance(value, str | bytes) else value


class PostgresOnDjango(_DjangoOwnsTheConnection, PGDialect_psycopg):
    supports_statement_cache = True
    # SQLAlchemy would rely on psycopg's own jsonb loader, which Django replaces with text.
    supports_native_json_deserialization = False


registry.register("sqlite.mailbag_django", __name__, "SQLiteOnDjango")
registry.register("postgresql.mailbag_django", __name__, "PostgresOnDjango")

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def _dbapi_connection(alias: str) -> Any:
    """The DB-API connection Django holds for `alias` in this thread, opened if need be."""
    django_connection = connections[alias]
    django_connection.ensure_connection()
    return django_connection.connection


def engine_for(alias: str) -> Engine:
    """An engine whose every connection is Django's for `alias`, in the calling thread."""
    with _lock:
        if alias not in _engines:
            module = connections[alias].Database.__name__.partition(".")[0]
            if module not in _URLS:
                raise ImproperlyConfigured(
                    f"mailbag.django runs on Django's sqlite3 and postgresql (psycopg 3) "
                    f"backends; DATABASES[{alias!r}] uses {module}"
                )
            _engines[alias] = create_engine(
                _URLS[module],
                creator=lambda: _dbapi_connection(alias),
                poolclass=NullPool,
                pool_reset_on_return=None,
                # Statement errors would otherwise carry recipients and keys into logs.
                hide_parameters=True,
                **({"json_deserializer": _json_text} if module == "psycopg" else {}),
                **({"use_native_hstore": False} if module == "psycopg" else {}),
            )
        return _engines[alias]


@contextmanager
def on_django_connection(alias: str) -> Iterator[Connection]:
    """A SQLAlchemy Connection on Django's connection for `alias`. It runs statements in the
    transaction Django has open, and ends nothing: commit or roll back with Django. Use it
    inside `transaction.atomic(using=alias)`: in Django's autocommit mode each statement
    would commit on its own."""
    with engine_for(alias).connect() as conn:
        yield conn
