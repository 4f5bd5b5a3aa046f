"""Test databases: SQLite always; PostgreSQL and MariaDB when their URLs are given.

MAILBAG_TEST_POSTGRES_URL and MAILBAG_TEST_MYSQL_URL name a server and a database to
connect to; each test session creates its own scratch database there and drops it at the
end. Without a URL that suite is skipped with a message saying so, except when CI=true:
then a missing URL is an error, so CI can never pass by skipping.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import fastapi.dependencies.models
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from mailbag import log
from mailbag.store import hooks, migrate
from mailbag.store.database import Dialect, dialect_of, make_async_engine, make_engine
from mailbag.store.schema import metadata

SERVER_URLS = {
    "postgresql": "MAILBAG_TEST_POSTGRES_URL",
    "mysql": "MAILBAG_TEST_MYSQL_URL",
}
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    log.configure("INFO")
    missing = [var for var in SERVER_URLS.values() if not os.environ.get(var)]
    if IN_CI and missing:
        raise pytest.UsageError(
            f"CI=true but {', '.join(missing)} is not set: the database suites are required in CI"
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for dialect, var in SERVER_URLS.items():
        url = os.environ.get(var)
        lines.append(f"mailbag {dialect}: {url if url else f'skipped (set {var} to run it)'}")
    return lines


@dataclass
class TestDB:
    __test__ = False  # imported into test modules for type hints: not a test class

    url: str
    dialect: Dialect
    engine: Engine

    def async_engine(self) -> AsyncEngine:
        return make_async_engine(self.url)

    def new_engine(self, **options: object) -> Engine:
        return make_engine(self.url, **options)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def fanning_out(self, fan_out: hooks.FanOut) -> Iterator[None]:
        """`engine` fans events out to hook endpoints as `fan_out` says (the execution
        option a process's engine carries, store/hooks.py), until the block ends."""
        plain = self.engine
        self.engine = plain.execution_options(**fan_out.options())  # type: ignore[assignment]
        try:
            yield
        finally:
            self.engine = plain

    def clear(self) -> None:
        with self.engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())


def _server_database(dialect: str) -> Iterator[str]:
    """Create a scratch database on the server named by the env var; drop it afterwards."""
    base = os.environ.get(SERVER_URLS[dialect])
    if not base:
        pytest.skip(f"{SERVER_URLS[dialect]} not set: {dialect} suite skipped")
    name = f"mailbag_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = make_engine(base, null_pool=True)
    if dialect == "postgresql":
        admin = admin.execution_options(isolation_level="AUTOCOMMIT")  # type: ignore[assignment]
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
        if dialect == "mysql":
            conn.commit()
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            if dialect == "postgresql":
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                    )
                )
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            if dialect == "mysql":
                conn.commit()
        admin.dispose()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What importing every module and collecting every test made lives as long as the run:
    frozen, the collector never walks it again, which keeps each full collection (and
    the event-loop pause it causes in a timing test) short."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def apps_die_with_their_test() -> Iterator[None]:
    """FastAPI remembers facts about endpoint callables in module-level LRU caches of 4,096
    entries, and each entry keeps the app whose closure it is alive. One app per process
    never notices; a suite that builds an app per test held about two million objects by
    mid-run, so every full garbage collection stalled the event loop for over a second, and
    the timing tests (a 503 within DATABASE_TIMEOUT_SECONDS) failed on the collector's
    pause, not on mailbag's. Emptying those caches after each test lets the apps go."""
    yield
    for cached in vars(fastapi.dependencies.models).values():
        if isinstance(cached, functools._lru_cache_wrapper):
            cached.cache_clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The suite runs in two processes (pyproject.toml's addopts); a test marked
    `stops_database` stops a server the other process's tests are using. Every test holds
    a shared lock on one file of the run for its whole protocol (the session's fixtures
    are set up and torn down within it too), a stopping one the exclusive lock: it waits
    for the other process's test in flight, and that process waits for it."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")
    if run is None:  # one process: nothing runs beside it
        yield
        return
    path = Path(tempfile.gettempdir()) / f"mailbag-tests-{run}.lock"
    stops = item.get_closest_marker("stops_database") is not None
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if stops else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    yield from _server_database("postgresql")


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    yield from _server_database("mysql")


@pytest.fixture(scope="session")
def _server_dbs(request: pytest.FixtureRequest) -> dict[str, TestDB]:
    return {}


def _migrated(url: str) -> TestDB:
    engine = make_engine(url)
    migrate.upgrade(engine)
    return TestDB(url, dialect_of(url), engine)


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def db(
    request: pytest.FixtureRequest, tmp_path: Path, _server_dbs: dict[str, TestDB]
) -> Iterator[TestDB]:
    """A migrated, empty database of each kind (the server ones are reused and cleared)."""
    kind = request.param
    if kind == "sqlite":
        test_db = _migrated(f"sqlite:///{tmp_path / 'mailbag.db'}")
        yield test_db
        test_db.engine.dispose()
        return
    if kind not in _server_dbs:
        _server_dbs[kind] = _migrated(request.getfixturevalue(f"{kind}_url"))
    test_db = _server_dbs[kind]
    test_db.clear()
    yield test_db


@pytest.fixture
async def async_engine(db: TestDB) -> AsyncIterator[AsyncEngine]:
    engine = db.async_engine()
    yield engine
    await engine.dispose()


# --- PgBouncer (transaction pooling) in front of the PostgreSQL test server ----------------

PGBOUNCER_URL = "MAILBAG_TEST_PGBOUNCER_URL"


@pytest.fixture(scope="session")
def pgbouncer_base_url() -> str:
    """MAILBAG_TEST_PGBOUNCER_URL: a PgBouncer in transaction mode in front of the server
    MAILBAG_TEST_POSTGRES_URL names, forwarding any database name (tests/pgbouncer/start)."""
    url = os.environ.get(PGBOUNCER_URL)
    if not url:
        if IN_CI:
            pytest.fail(f"CI=true but {PGBOUNCER_URL} is not set: the PgBouncer tests are required")
        pytest.skip(f"{PGBOUNCER_URL} not set: PgBouncer tests skipped (tests/pgbouncer/start)")
    return url


@pytest.fixture
def pgbouncer_url(db: TestDB, pgbouncer_base_url: str) -> str:
    """The `db` fixture's PostgreSQL database, reached through PgBouncer."""
    assert db.dialect == "postgresql", "PgBouncer stands in front of PostgreSQL only"
    database = make_url(db.url).database
    return make_url(pgbouncer_base_url).set(database=database).render_as_string(hide_password=False)
