"""Database URLs: which dialect, and which drivers, serve each URL a user may write.

Users write plain `sqlite:///path`, `postgresql://...` or `mysql://...` URLs; mailbag picks
its drivers (pysqlite/aiosqlite, psycopg 3 for both sync and async, PyMySQL/asyncmy). Pure:
no engine, no connection. Settings check a URL with it when they are read; store/database.py
builds engines from it.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy.engine import URL, make_url

Dialect = Literal["sqlite", "postgresql", "mysql"]

_DRIVERS: dict[str, tuple[Dialect, str, str]] = {
    # scheme: (dialect, sync driver, async driver)
    "sqlite": ("sqlite", "sqlite", "sqlite+aiosqlite"),
    "postgresql": ("postgresql", "postgresql+psycopg", "postgresql+psycopg_async"),
    "postgres": ("postgresql", "postgresql+psycopg", "postgresql+psycopg_async"),
    "mysql": ("mysql", "mysql+pymysql", "mysql+asyncmy"),
    "mariadb": ("mysql", "mysql+pymysql", "mysql+asyncmy"),
}


class UnsupportedDatabase(ValueError):
    pass


def parse(url: str | URL) -> tuple[URL, Dialect, str, str]:
    """The URL (MySQL's with utf8mb4 unless it names a charset), its dialect, and its sync
    and async driver names."""
    parsed = make_url(url) if isinstance(url, str) else url
    scheme = parsed.drivername.split("+", 1)[0]
    if scheme not in _DRIVERS:
        raise UnsupportedDatabase(
            f"unsupported database URL scheme {scheme!r}: use sqlite:///, postgresql:// or mysql://"
        )
    dialect, sync_driver, async_driver = _DRIVERS[scheme]
    if dialect == "mysql" and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed, dialect, sync_driver, async_driver


def dialect_of(url: str | URL) -> Dialect:
    return parse(url)[1]
