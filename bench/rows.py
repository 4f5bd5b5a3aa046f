"""Retention at 10^7 rows on PostgreSQL: `python -m bench.rows` (docs/scaling.md).

Two scratch databases are filled inside the server (INSERT ... SELECT FROM generate_series,
a few big statements, timed): the large one (10^7 messages by default) and a reference one
(10^4), each with the same mix: a fixed backlog of due `pending` messages and a few
`retrying` ones not yet due (the claim's working set), and everything else finished over
the last 40 days (mostly `sent`; some failed, dead, cancelled, unknown), with the
`message_events` rows each message's path leaves (1 to 3 a message), so a purge deletes
what it deletes in production. Both are vacuumed and analyzed, as autovacuum would have.

Then, each timed part under the benchmark lock (`--lock`), never the fill:
- claim latency: `dispatch.claim` batches of 100, each handed back (released) untimed,
  in interleaved rounds on the reference and the large database: p50/p99 per size;
- sizes: every table and index (pg_relation_size), rows as the planner counts them;
- purge: the plan `services.maintenance.purge` runs, chunk after chunk in its own
  transaction, with the default retention (PURGE_AFTER_DAYS=30: a quarter of the rows),
  for a bounded time on the large database; rows/s, chunk p50/p99, the plan of the chunk's
  selection (EXPLAIN ANALYZE) and the whole `maintenance.purge` on the reference;
- vacuum: dead tuples after the purge, VACUUM's time per table, dead tuples after it.
- candidate (only when asked, `--phases candidate`): the purge chunks again with a partial
  index on the finished rows' updated_at, built for the run (or as a migration made it).

Results are printed and written to bench/results/rows.json; the databases are dropped at
the end (`--keep` leaves them; `--reuse` measures kept ones again, and finishes a fill
that was interrupted).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import statistics
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.sql import ClauseElement

from bench import common
from mailbag.clock import utcnow
from mailbag.domain import states
from mailbag.domain.delivery import Decision
from mailbag.domain.states import Action
from mailbag.services import maintenance
from mailbag.store import dispatch, migrate, operator
from mailbag.store.database import make_async_engine, make_engine
from mailbag.store.plan import Step
from mailbag.store.session import AsyncDatabase, Database

DUE = 1000  # pending and due: the claim's working set, the same at every size
WAITING = 200  # retrying, due in a day: in the claim index, out of the claim's range
SPAN = timedelta(days=40)  # the finished rows' ages: 0 to 40 days
RETENTION = timedelta(days=30)  # PURGE_AFTER_DAYS' default
BATCH = 100  # BATCH_SIZE's default
FILL_CHUNK = 1_000_000  # rows per INSERT statement
FILL_CONNECTIONS = 2  # statements at a time: one per core

# Finished messages by share (per 10,000), and the events each one's path left behind:
# (from, to, seconds after it was enqueued, actor, attempt). A dead message's retries are
# folded into one move (it would have 2 per attempt): dead rows are 0.2% of the table.
MIX = (("sent", 9700), ("failed", 100), ("dead", 20), ("cancelled", 30), ("unknown", 5))
ENQUEUED = ("NULL", "pending", 0, "api", 0)
CLAIMED = ("pending", "processing", 1, "worker-1", 1)
PATHS: dict[str, tuple[tuple[str, str, int, str, int], ...]] = {
    "sent": (ENQUEUED, CLAIMED, ("processing", "sent", 2, "worker-1", 1)),
    "failed": (ENQUEUED, CLAIMED, ("processing", "failed", 2, "worker-1", 1)),
    "dead": (ENQUEUED, CLAIMED, ("processing", "dead", 2, "worker-1", 5)),
    "cancelled": (ENQUEUED, ("pending", "cancelled", 60, "operator", 0)),
    "unknown": (ENQUEUED, CLAIMED, ("processing", "unknown", 120, "sweeper", 1)),
    "retrying": (ENQUEUED, CLAIMED, ("processing", "retrying", 2, "worker-1", 1)),
    "pending": (ENQUEUED,),
}


def _status_sql() -> str:
    """Row g's status: the newest DUE + WAITING rows are the queue, the rest the mix (spread
    evenly through time by a multiplicative hash of g)."""
    whens, upto = [], 0
    for status, share in MIX[1:]:
        upto += share
        whens.append(f"WHEN (g * 7919) % 10000 < {upto} THEN '{status}'")
    return (
        "CASE WHEN g > :n - :waiting THEN 'retrying' WHEN g > :n - :waiting - :due THEN "
        f"'pending' {' '.join(whens)} ELSE '{MIX[0][0]}' END"
    )


def _paths_sql() -> str:
    rows = [
        f"('{status}', {'NULL' if src == 'NULL' else repr(src)}::varchar, '{dst}', {offset}, "
        f"'{actor}', {attempt})"
        for status, path in PATHS.items()
        for src, dst, offset, actor, attempt in path
    ]
    return f"(VALUES {', '.join(rows)}) AS e(status, from_status, to_status, offset_s, actor, n)"


# One statement fills rows g = :start .. :stop - 1 of a table that will hold :n, and their
# events. Row g was enqueued at :anchor - (:n - g) * :step seconds (the newest at the
# anchor, the oldest SPAN before it); ids are UUIDv7 of that time, as domain/ids.py makes
# them, so the heap is laid out as years of traffic are. Half the messages carry an
# Idempotency-Key, recipients are one of ~10^6 addresses, tenants one of four.
FILL = f"""
WITH r AS (
    SELECT g, {_status_sql()} AS status,
           :anchor - (:n - g) * make_interval(secs => :step) AS at
    FROM generate_series(CAST(:start AS bigint), :stop - 1) AS g
), m AS (
    INSERT INTO outbox_messages (
        id, tenant_id, idempotency_key, to_address, subject, template_name, template_data,
        headers, tags, metadata, status, attempt_count, max_attempts, next_attempt_at,
        claim_order_at, created_at, updated_at, provider, provider_message_id, last_error,
        sent_at)
    SELECT (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
            || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
           'tenant-' || g % 4,
           CASE WHEN g % 2 = 0 THEN 'order-' || substr(md5('k' || g), 1, 24) END,
           'user' || (g * 2654435761) % 1000003 || '@example.com',
           'Your order ' || g, 'welcome',
           jsonb_build_object('name', 'User ' || g, 'order', g), '{{}}', '[]', '{{}}',
           status,
           CASE status WHEN 'pending' THEN 0 WHEN 'cancelled' THEN 0 WHEN 'dead' THEN 5
                ELSE 1 END,
           5,
           CASE WHEN status = 'retrying' THEN :anchor + interval '1 day' ELSE at END,
           CASE WHEN status = 'retrying' THEN :anchor + interval '1 day' ELSE at END,
           at,
           CASE WHEN status = 'pending' THEN at ELSE at + interval '2 seconds' END,
           CASE WHEN status IN ('pending', 'cancelled') THEN NULL ELSE 'ses' END,
           CASE WHEN status IN ('sent', 'unknown')
                THEN '0100018c' || md5(g::text) || '-000000' END,
           CASE status WHEN 'failed' THEN '550 5.1.1 mailbox does not exist'
                WHEN 'dead' THEN '451 4.3.0 temporary failure'
                WHEN 'retrying' THEN '451 4.3.0 temporary failure' END,
           CASE WHEN status = 'sent' THEN at + interval '2 seconds' END
    FROM r
    RETURNING id, status, created_at, provider_message_id
)
INSERT INTO message_events (message_id, from_status, to_status, at, actor, attempt,
                            provider_message_id)
SELECT m.id, e.from_status, e.to_status, m.created_at + make_interval(secs => e.offset_s),
       e.actor, e.n, CASE WHEN e.to_status = 'sent' THEN m.provider_message_id END
FROM m JOIN {_paths_sql()} ON e.status = m.status
"""

SIZES = """
SELECT c.relname, c.relkind, coalesce(i.indrelid::regclass::text, c.relname) AS tbl,
       pg_relation_size(c.oid) AS bytes,
       CASE WHEN c.relkind = 'r' THEN pg_table_size(c.oid) END AS with_toast,
       c.reltuples::bigint AS estimated_rows
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'public'
LEFT JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relkind IN ('r', 'i')
  AND coalesce(i.indrelid::regclass::text, c.relname) IN ('outbox_messages', 'message_events')
ORDER BY tbl, c.relkind DESC, bytes DESC
"""
TUPLES = """
SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables
WHERE relname IN ('outbox_messages', 'message_events', 'message_attachments')
ORDER BY relname
"""
PHASES = ("claim", "purge", "vacuum")  # and "candidate", on request
VACUUMED = ("outbox_messages", "message_events", "message_attachments")


@dataclass
class Scratch:
    name: str
    rows: int
    url: str
    engine: Engine


@contextmanager
def bench_lock(path: Path | None) -> Iterator[None]:
    """The machine-wide benchmark lock around a timed part (none without a path)."""
    if path is None:
        yield
        return
    with path.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _admin(statement: str) -> None:
    admin = make_engine(common.PG_BASE, null_pool=True)
    try:
        with admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text(statement))
    finally:
        admin.dispose()


def _exists(name: str) -> bool:
    admin = make_engine(common.PG_BASE, null_pool=True)
    try:
        with admin.connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
            return found.first() is not None
    finally:
        admin.dispose()


def database_url(name: str) -> str:
    """The URL of database `name` on the benchmark's PostgreSQL server."""
    return make_url(common.PG_BASE).set(database=name).render_as_string(hide_password=False)


def create(name: str, rows: int, *, reuse: bool) -> tuple[Scratch, bool]:
    """The database `name`, migrated; (it, whether it was already there to reuse)."""
    url = database_url(name)
    found = reuse and _exists(name)
    if not found:
        drop(name)
        _admin(f"CREATE DATABASE {name}")
    engine = make_engine(url, pool_size=2)
    if not found:
        migrate.upgrade(engine)
    return Scratch(name, rows, url, engine), found


def drop(name: str) -> None:
    _admin(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
    _admin(f"DROP DATABASE IF EXISTS {name}")


def fill(
    db: Scratch, anchor: datetime, progress: Callable[[str], None], first: int = 1
) -> dict[str, Any]:
    """Fill `db` with its rows from row `first` on, in statements of FILL_CHUNK (each its
    own transaction), two at a time (one per core), then VACUUM ANALYZE it (what
    autovacuum would have done by then; this server runs with autovacuum off)."""
    step = SPAN.total_seconds() / db.rows
    params = {"n": db.rows, "anchor": anchor, "step": step, "due": DUE, "waiting": WAITING}

    def one(start: int) -> float:
        stop = min(db.rows + 1, start + FILL_CHUNK)
        began = time.perf_counter()
        with db.engine.begin() as conn:
            # The rows are consistent by construction: no per-row foreign key check (the
            # events' message_id) while filling. Purges later check as they always do.
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text(FILL), {**params, "start": start, "stop": stop})
        took = round(time.perf_counter() - began, 1)
        progress(f"{db.name}: rows {start:,} to {stop - 1:,} in {took} s")
        return took

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=FILL_CONNECTIONS) as pool:
        statements = list(pool.map(one, range(first, db.rows + 1, FILL_CHUNK)))
    filled = time.perf_counter() - started
    vacuum = _vacuum(db.engine, analyze=True)
    with db.engine.connect() as conn:
        events = conn.execute(text("SELECT count(*) FROM message_events")).scalar_one()
    return {
        "fill_seconds": round(filled, 1),
        "fill_rows_per_second": round((db.rows - first + 1) / filled),
        "fill_first_row": first,
        "fill_statement_seconds": statements,
        "events": events,
        "post_fill_vacuum_analyze_seconds": vacuum,
    }


def _filled_until(db: Scratch) -> int:
    """How many rows a kept database was filled with: all of them once its last chunk (the
    queue's rows) is in, whatever was purged since; else the count, as its chunks commit
    whole, in order when one statement runs at a time (resume after an interrupted fill)."""
    with db.engine.connect() as conn:
        last = conn.execute(text("SELECT 1 FROM outbox_messages WHERE status = 'retrying'"))
        if last.first() is not None:
            return db.rows
        return int(conn.execute(text("SELECT count(*) FROM outbox_messages")).scalar_one())


def _anchor(db: Scratch) -> datetime:
    """The anchor a kept database was filled from: its row `count` was enqueued at
    anchor - (rows - count) * step, and the newest of a full one at the anchor."""
    count = _filled_until(db)
    query = "SELECT max(created_at) FROM outbox_messages"
    if count == db.rows:
        query += " WHERE status IN ('pending', 'retrying')"
    with db.engine.connect() as conn:
        newest = conn.execute(text(query)).scalar_one()
    step = SPAN.total_seconds() / db.rows
    return (newest or datetime.now(UTC)) + timedelta(seconds=(db.rows - count) * step)


def _vacuum(engine: Engine, *, analyze: bool = False) -> dict[str, float]:
    timings = {}
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in VACUUMED:
            began = time.perf_counter()
            conn.execute(text(f"VACUUM {'(ANALYZE) ' if analyze else ''}{table}"))
            timings[table] = round(time.perf_counter() - began, 2)
    return timings


def sizes(db: Scratch) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(SIZES))]


def tuples(db: Scratch) -> dict[str, dict[str, int]]:
    # A backend reports its statistics when idle at most once a second, or when it exits:
    # close the pool's connections so the purge's deletes are all counted.
    db.engine.dispose()
    time.sleep(0.5)
    with db.engine.connect() as conn:
        return {
            row.relname: {"live": row.n_live_tup, "dead": row.n_dead_tup}
            for row in conn.execute(text(TUPLES))
        }


async def _claims(url: str, count: int) -> list[float]:
    """`count` claims of BATCH due messages, each timed (claim and commit), each batch then
    released (back to pending, no attempt spent) so the next claim finds the same queue."""
    engine = make_async_engine(url, pool_size=1)
    db, timings = AsyncDatabase(engine), []
    try:
        for _ in range(count):
            began = time.perf_counter()
            async with db.transaction() as tx:
                claim = await tx.run(
                    dispatch.claim(
                        worker_id="bench-rows",
                        now=utcnow(),
                        lease=timedelta(minutes=5),
                        limit=BATCH,
                    )
                )
            timings.append((time.perf_counter() - began) * 1000)
            released = dict.fromkeys((m.id for m in claim.messages), _RELEASE)
            async with db.transaction() as tx:
                await tx.run(
                    dispatch.finalize(
                        token=claim.token, decisions=released, now=utcnow(), actor="bench-rows"
                    )
                )
            if len(claim.messages) != min(BATCH, DUE):
                raise RuntimeError(f"a claim took {len(claim.messages)} messages, not {BATCH}")
    finally:
        await engine.dispose()
    return timings


_RELEASE = Decision(Action.RELEASE)


def _quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def claim_latency(dbs: list[Scratch], rounds: int, claims: int) -> dict[str, Any]:
    """Interleaved rounds: in each, `claims` claims on every database in turn."""
    per_db: dict[str, list[float]] = {db.name: [] for db in dbs}
    round_p50: dict[str, list[float]] = {db.name: [] for db in dbs}
    for _ in range(rounds):
        for db in dbs:
            timings = asyncio.run(_claims(db.url, claims))
            per_db[db.name] += timings
            round_p50[db.name].append(round(statistics.median(timings), 2))
    result: dict[str, Any] = {}
    for db in dbs:
        found = per_db[db.name]
        result[str(db.rows)] = {
            "claims": len(found),
            "p50_ms": _quantile(found, 0.5),
            "p99_ms": _quantile(found, 0.99),
            "max_ms": round(max(found), 2),
            "round_p50_ms": round_p50[db.name],
        }
    small, large = (result[str(db.rows)] for db in dbs)
    result["p50_ratio_large_to_reference"] = round(large["p50_ms"] / small["p50_ms"], 2)
    result["round_p50_ratios"] = [
        round(b / a, 2) for a, b in zip(small["round_p50_ms"], large["round_p50_ms"], strict=True)
    ]
    return result


def explain_purge_selection(db: Scratch, cutoff: datetime) -> list[str]:
    """EXPLAIN ANALYZE of the first step of a purge chunk (the selection of its rows)."""
    plan = operator.purge(older_than=cutoff, limit=maintenance.CHUNK)
    first = next(plan)
    plan.close()
    if not isinstance(first, Step) or not isinstance(first.statement, ClauseElement):
        raise TypeError("operator.purge no longer starts with a SELECT")
    compiled = first.statement.compile(
        dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]
        compile_kwargs={"literal_binds": True},
    )
    with db.engine.connect() as conn:
        found = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}"))
        return [row[0] for row in found]


def purge_chunks(db: Scratch, cutoff: datetime, budget: float) -> dict[str, Any]:
    """maintenance.purge's loop (one transaction per chunk of maintenance.CHUNK, repeated
    until a chunk comes back short), stopped after `budget` seconds."""
    database, chunks = Database(db.engine), []
    deleted = 0
    began = time.perf_counter()
    while time.perf_counter() - began < budget:
        started = time.perf_counter()
        with database.transaction() as tx:
            n = tx.run(operator.purge(older_than=cutoff, limit=maintenance.CHUNK))
        chunks.append((time.perf_counter() - started) * 1000)
        deleted += n
        if n < maintenance.CHUNK:
            break
    elapsed = time.perf_counter() - began
    return {
        "messages_deleted": deleted,
        "chunks": len(chunks),
        "finished": bool(chunks) and deleted < len(chunks) * maintenance.CHUNK,
        "seconds": round(elapsed, 1),
        "messages_per_second": round(deleted / elapsed),
        "chunk_p50_ms": _quantile(chunks, 0.5),
        "chunk_p99_ms": _quantile(chunks, 0.99),
        "first_chunk_ms": round(chunks[0], 1),
        "last_chunk_ms": round(chunks[-1], 1),
    }


# What-if, not the shipped schema: an index that hands purge its oldest finished rows in
# order, so a chunk's selection reads CHUNK index entries instead of sorting every
# finished row older than the cutoff.
CANDIDATE_INDEX = (
    "CREATE INDEX ix_outbox_messages_finished_updated_at ON outbox_messages (updated_at) "
    f"WHERE status IN ({', '.join(repr(s.value) for s in sorted(states.TERMINAL))})"
)


def candidate_purge(db: Scratch, cutoff: datetime, budget: float) -> dict[str, Any]:
    """The purge chunks again with CANDIDATE_INDEX in place: built, timed and dropped, or,
    when the schema already has it (a migration shipped it), measured as it is."""
    with db.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        shipped = conn.execute(
            text("SELECT to_regclass('ix_outbox_messages_finished_updated_at') IS NOT NULL")
        ).scalar_one()
        built = None
        if not shipped:
            began = time.perf_counter()
            conn.execute(text(CANDIDATE_INDEX))
            built = round(time.perf_counter() - began, 1)
            conn.execute(text("ANALYZE outbox_messages"))
    try:
        plan = explain_purge_selection(db, cutoff)
        chunks = purge_chunks(db, cutoff, budget)
    finally:
        if not shipped:
            with db.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.execute(text("DROP INDEX ix_outbox_messages_finished_updated_at"))
    return {
        "index": CANDIDATE_INDEX,
        "in_schema": shipped,
        "build_seconds": built,
        "selection_plan": plan,
        **chunks,
    }


def eligible(db: Scratch, cutoff: datetime) -> int:
    with db.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM outbox_messages WHERE updated_at < :cutoff AND "
                    "status IN ('sent', 'failed', 'dead', 'cancelled', 'expired')"
                ),
                {"cutoff": cutoff},
            ).scalar_one()
        )


def run(
    rows: int,
    reference: int,
    *,
    rounds: int = 5,
    claims: int = 200,
    purge_seconds: float = 240.0,
    lock: Path | None = None,
    prefix: str = "mailbag_scale",
    keep: bool = False,
    reuse: bool = False,
    phases: Collection[str] = PHASES,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    anchor = datetime.now(UTC)
    cutoff = anchor - RETENTION
    small, small_found = create(f"{prefix}_{reference}", reference, reuse=reuse)
    large, large_found = create(f"{prefix}_{rows}", rows, reuse=reuse)
    result: dict[str, Any] = {"rows": rows, "reference_rows": reference, "due": DUE}
    try:
        for db, found in ((small, small_found), (large, large_found)):
            first, db_anchor = (_filled_until(db) + 1, _anchor(db)) if found else (1, anchor)
            if first <= db.rows:
                result[f"fill_{db.rows}"] = fill(db, db_anchor, progress, first)
                progress(f"fill {db.rows}: {json.dumps(result[f'fill_{db.rows}'])}")
            if db is large:  # its rows' ages decide what the purge finds
                anchor, cutoff = db_anchor, db_anchor - RETENTION
        result["sizes"] = {str(db.rows): sizes(db) for db in (small, large)}
        if "claim" in phases:
            with bench_lock(lock):
                result["claim"] = claim_latency([small, large], rounds, claims)
            progress(f"claim: {json.dumps(result['claim'])}")
        if "purge" in phases:
            result["purge_eligible"] = {str(db.rows): eligible(db, cutoff) for db in (small, large)}
            with bench_lock(lock):
                result["purge_selection_plan"] = explain_purge_selection(large, cutoff)
                began = time.perf_counter()
                whole = maintenance.purge(small.engine, older_than=cutoff, now=anchor)
                result[f"purge_{reference}"] = {
                    "messages_deleted": whole.messages,
                    "seconds": round(time.perf_counter() - began, 2),
                }
                result[f"purge_{rows}"] = purge_chunks(large, cutoff, purge_seconds)
            progress(f"purge: {json.dumps(result[f'purge_{rows}'])}")
        if "vacuum" in phases:
            result["tuples_after_purge"] = tuples(large)
            with bench_lock(lock):
                result["vacuum_after_purge_seconds"] = _vacuum(large.engine)
            result["tuples_after_vacuum"] = tuples(large)
            result["sizes_after_vacuum"] = sizes(large)
        if "candidate" in phases:
            with bench_lock(lock):
                result["candidate"] = candidate_purge(large, cutoff, purge_seconds)
            progress(f"candidate: {json.dumps(result['candidate'])}")
        result["server"] = _server(large)
    finally:
        for db in (small, large):
            db.engine.dispose()
            if not keep:
                drop(db.name)
    return result


def _server(db: Scratch) -> dict[str, str]:
    names = (
        "server_version",
        "shared_buffers",
        "work_mem",
        "maintenance_work_mem",
        "autovacuum",
        "autovacuum_vacuum_scale_factor",
        "max_wal_size",
    )
    with db.engine.connect() as conn:
        found = conn.execute(
            text("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(:n)"),
            {"n": list(names)},
        )
        return {row[0]: row[1] for row in found}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rows", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--reference", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--claims", type=int, default=200, help="claims per round and size")
    parser.add_argument("--purge-seconds", type=float, default=240.0)
    parser.add_argument("--lock", type=Path, help="flock this file around the timed parts")
    parser.add_argument("--keep", action="store_true", help="leave the databases")
    parser.add_argument("--reuse", action="store_true", help="take kept databases as filled")
    parser.add_argument(
        "--phases",
        nargs="*",
        default=list(PHASES),
        choices=[*PHASES, "candidate"],
        help="what to measure once filled (candidate: purge with a what-if index)",
    )
    parser.add_argument("--out", type=Path, default=common.ROOT / "bench" / "results" / "rows.json")
    args = parser.parse_args()
    started = time.time()
    result = run(
        args.rows,
        args.reference,
        rounds=args.rounds,
        claims=args.claims,
        purge_seconds=args.purge_seconds,
        lock=args.lock,
        keep=args.keep,
        reuse=args.reuse,
        phases=args.phases,
        progress=lambda line: print(line, flush=True),
    )
    result["total_seconds"] = round(time.time() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
