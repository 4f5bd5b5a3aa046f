"""Email verifications: each state change goes through the same door as a message's
(`transition.apply_transition`), guarded and targeted by the verification machine."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Row,
    and_,
    bindparam,
    func,
    insert,
    select,
    true,
    update,
)
from sqlalchemy.exc import DBAPIError

from mailbag.domain.states import Status
from mailbag.domain.verification import (
    ACTIVE,
    FOLLOWS,
    UNFINISHED,
    VERIFICATIONS,
    VAction,
    VState,
)
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import email_verifications as ev
from mailbag.store.schema import tenants, verification_events, verification_sends
from mailbag.store.schema import verification_send_counts as counts
from mailbag.store.transition import EventSpec, Tracked, apply_transition, history_row, record

if TYPE_CHECKING:  # message_transitions calls this module: no import cycle at run time
    from sqlalchemy.ext.asyncio import AsyncConnection

    from mailbag.store.message_transitions import Changed

VERIFICATION_ROWS: Tracked[VState, VAction] = Tracked(
    table=ev,
    state="state",
    machine=VERIFICATIONS,
    history=verification_events,
    subject="verification_id",
    copied={"message_id": "message_id"},
)


@dataclass(frozen=True)
class VerificationFilter:
    """Which verifications are meant (every field optional; all given ones must hold).
    Plain data: `matching` is its SQL."""

    id: uuid.UUID | None = None
    tenant_id: str | None = None
    email: str | None = None
    message_ids: Sequence[uuid.UUID] | None = None  # their current email is one of these
    expired_by: datetime | None = None  # expires_at at or before this
    send_count: int | None = None  # still on this send (a rotation reads it first)
    token_digest: str | None = None
    confirm_attempts_below: int | None = None


def matching(where: VerificationFilter) -> ColumnElement[bool]:
    """The SQL of a verification filter."""
    conditions: list[ColumnElement[bool]] = []
    if where.id is not None:
        conditions.append(ev.c.id == where.id)
    if where.tenant_id is not None:
        conditions.append(ev.c.tenant_id == where.tenant_id)
    if where.email is not None:
        conditions.append(ev.c.email == where.email)
    if where.message_ids is not None:
        conditions.append(ev.c.message_id.in_(where.message_ids))
    if where.expired_by is not None:
        conditions.append(ev.c.expires_at <= where.expired_by)
    if where.send_count is not None:
        conditions.append(ev.c.send_count == where.send_count)
    if where.token_digest is not None:
        conditions.append(ev.c.token_digest == where.token_digest)
    if where.confirm_attempts_below is not None:
        conditions.append(ev.c.confirm_attempts < where.confirm_attempts_below)
    return and_(true(), *conditions)


@dataclass(frozen=True)
class Verification:
    id: uuid.UUID
    tenant_id: str
    email: str
    state: VState
    token_digest: str
    expires_at: datetime
    confirm_attempts: int
    send_count: int
    message_id: uuid.UUID | None
    template_name: str
    redirect_url: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    verified_at: datetime | None


def _verification(row: Row[Any]) -> Verification:
    m = row._mapping
    values = {column.name: m[column.name] for column in ev.columns}
    values["state"] = VState(values["state"])
    return Verification(**values)


def create(values: Mapping[str, Any], *, now: datetime, actor: str) -> Plan[Verification]:
    """Insert a new verification in `created`; raises IntegrityError if one is active."""
    row = {
        **values,
        "state": VState.CREATED.value,
        "created_at": now,
        "updated_at": now,
        "confirm_attempts": 0,
        "send_count": 0,
        "sent_at": None,
        "verified_at": None,
    }
    yield Step(insert(ev).values(row))
    yield from record(
        VERIFICATION_ROWS,
        [history_row(VERIFICATION_ROWS, row, None, at=now, actor=actor, event=EventSpec())],
    )
    return Verification(**{**row, "state": VState.CREATED})


def transition(
    action: VAction,
    *,
    where: VerificationFilter,
    now: datetime,
    actor: str,
    values: Mapping[str, Any] | None = None,
    detail: str | None = None,
) -> Plan[list[Verification]]:
    """Move the verifications matching `where` that `action` allows, and log each move."""
    moved = yield from apply_transition(
        VERIFICATION_ROWS,
        action,
        where=matching(where),
        values=values or {},
        now=now,
        actor=actor,
        event=EventSpec(text=detail),
    )
    return [_verification(row) for row, _ in moved]


def expire_stale(now: datetime, *, actor: str, limit: int) -> Plan[int]:
    """Move up to `limit` verifications whose time is up but that nobody has read since (a
    read expires them too) to `expired`, each with its event. Rows another transaction
    holds are skipped; the next run takes them."""
    moved = yield from apply_transition(
        VERIFICATION_ROWS,
        VAction.EXPIRE,
        where=matching(VerificationFilter(expired_by=now)),
        values={},
        now=now,
        actor=actor,
        limit=limit,
        skip_locked=True,
        event=EventSpec(text="token expired"),
    )
    return len(moved)


def follow_messages(
    changed: Sequence[Changed[Any]], *, now: datetime, actor: str
) -> Plan[list[Verification]]:
    """Carry outbox results over to the verifications whose current email they concern.

    Runs in the transaction that changed the messages, so the two never disagree. Only the
    verification's *current* message counts (a result for a rotated-away send is ignored),
    and the guard keeps `verified` and `expired` rows where they are.
    """
    by_action: dict[VAction, list[uuid.UUID]] = defaultdict(list)
    for c in changed:
        if "verification_id" not in c.message.metadata:
            continue  # most messages are not verification emails: no query for them
        action = FOLLOWS.get(Status(c.message.status))
        if action is not None:
            by_action[action].append(c.message.id)
    moved: list[Verification] = []
    for action, message_ids in by_action.items():
        extra = {"sent_at": now} if action is VAction.MESSAGE_SENT else None
        moved += yield from transition(
            action,
            where=VerificationFilter(message_ids=message_ids),
            now=now,
            actor=actor,
            values=extra,
            detail=f"outbox message {action.value.removeprefix('message_')}",
        )
    return moved


def count_wrong_token(verification_id: uuid.UUID, now: datetime) -> Plan[None]:
    """A wrong confirmation token: one attempt fewer (not a transition, so no event)."""
    yield Step(
        update(ev)
        .where(ev.c.id == verification_id, VERIFICATION_ROWS.in_states(UNFINISHED))
        .values(confirm_attempts=ev.c.confirm_attempts + 1, updated_at=now)
    )


def get(verification_id: uuid.UUID, tenant_id: str) -> Plan[Verification | None]:
    query = select(ev).where(ev.c.id == verification_id, ev.c.tenant_id == tenant_id)
    row = (yield Step(query)).first()
    return _verification(row) if row else None


def active_for(tenant_id: str, email: str) -> Plan[Verification | None]:
    query = select(ev).where(
        ev.c.tenant_id == tenant_id, ev.c.email == email, VERIFICATION_ROWS.in_states(ACTIVE)
    )
    row = (yield Step(query)).first()
    return _verification(row) if row else None


def events(verification_id: uuid.UUID) -> Plan[list[Row[Any]]]:
    query = (
        select(verification_events)
        .where(verification_events.c.verification_id == verification_id)
        .order_by(verification_events.c.id)
    )
    return list((yield Step(query)).all())


def lock_sends(tenant_id: str) -> Plan[None]:
    """Hold the tenant's verification-send lock until the transaction ends.

    Every verification request and resend takes it before it reads anything, so the send
    limits (per address and per tenant) are counted and spent by one transaction at a time
    and a resend always rotates from the newest send. The lock is the tenant's row: FOR NO
    KEY UPDATE on PostgreSQL (it blocks no foreign-key check), FOR UPDATE on MariaDB/MySQL;
    other reads of the row never wait. SQLite needs none: BEGIN IMMEDIATE already runs its
    writers one at a time. The sends of one tenant queue behind each other, which the
    tenant's own hourly limit keeps far below what one row lock can pass.
    """
    yield Step(
        select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update(key_share=True)
    )


def lock_statement() -> Any:
    """lock_sends's statement with its tenant as a parameter (for the pipelined request)."""
    return (
        select(tenants.c.id)
        .where(tenants.c.id == bindparam("tenant_id"))
        .with_for_update(key_share=True)
    )


def minute_of(at: datetime) -> datetime:
    """The minute a send is counted in (PostgreSQL's date_trunc('minute', at) alike)."""
    return at.replace(second=0, microsecond=0)


def record_send(
    *, tenant_id: str, email: str, verification_id: uuid.UUID, now: datetime
) -> Plan[None]:
    """The send's row (the per-address limit counts them) and one more in its tenant's
    minute (the tenant's limit sums those). Runs under lock_sends, so the UPDATE-then-INSERT
    cannot race another send of the tenant."""
    yield Step(
        insert(verification_sends).values(
            tenant_id=tenant_id, email=email, verification_id=verification_id, at=now
        )
    )
    minute = minute_of(now)
    counted = yield Step(
        update(counts)
        .where(counts.c.tenant_id == tenant_id, counts.c.minute == minute)
        .values(n=counts.c.n + 1)
    )
    if counted.rowcount == 0:  # type: ignore[attr-defined]
        yield Step(insert(counts).values(tenant_id=tenant_id, minute=minute, n=1))


def tenant_sends_since(tenant_id: str, since: datetime) -> Plan[tuple[int, datetime | None]]:
    """How many verification emails the tenant sent since a time, counted by whole minutes:
    the minute holding `since` counts whole, so at most 61 rows are read whatever the
    traffic, and the count errs only on the safe side (a send up to one minute older than
    the hour may still count: the limit is never exceeded in any hour). With the count,
    when the oldest counted minute stops counting, less an hour (as sends_since's oldest:
    Retry-After is that plus an hour, less now)."""
    query = select(
        func.sum(counts.c.n).label("n"), func.min(counts.c.minute).label("oldest")
    ).where(counts.c.tenant_id == tenant_id, counts.c.minute >= minute_of(since))
    row = (yield Step(query)).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite's min() over a datetime column comes back as text
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=since.tzinfo)
    return int(row.n or 0), (oldest + timedelta(minutes=1) if oldest else None)


def sends_since(
    tenant_id: str, since: datetime, email: str | None = None
) -> Plan[tuple[int, datetime | None]]:
    """How many verification emails went out since a time, and the oldest of them."""
    query = select(
        func.count().label("n"), func.min(verification_sends.c.at).label("oldest")
    ).where(verification_sends.c.tenant_id == tenant_id, verification_sends.c.at > since)
    if email is not None:
        query = query.where(verification_sends.c.email == email)
    row = (yield Step(query)).one()
    oldest = row.oldest
    if isinstance(oldest, str):  # SQLite's min() over a datetime column comes back as text
        oldest = datetime.fromisoformat(oldest).replace(tzinfo=since.tzinfo)
    return int(row.n), oldest


# --- PostgreSQL: a verification request in one statement ------------------------------------
#
# The readable request (services.verification.Verifications.request) makes about seventeen
# round trips, fifteen of them under the tenant's send lock, so the lock's hold time bounds a
# tenant's rate. On PostgreSQL its common case (no unfinished verification for the address,
# under both send limits, the address not suppressed, the Idempotency-Key new) is the lock
# and then ONE statement: it re-reads what the readable path checks (each statement of a READ
# COMMITTED transaction sees everything committed before it, so after the lock it sees every
# send the lock's previous holder made) and, only if all of it holds, writes exactly the rows
# the readable path writes: the idempotency record (answer included), the verification in
# `send_pending` with the history of its two moves (created, then email 1 enqueued), its
# email (store.enqueue.created_message_sql) and the send. Anything else writes nothing and
# the caller rolls back and takes the readable path, which decides that case as before.
# The address's send count is sends_since's (from its own index); the tenant's is
# tenant_sends_since's sum of at most 61 per-minute rows, which the statement also adds
# this send to (`counted`), as record_send does.

_REQUEST_SQL = f"""
WITH blocked AS (
    SELECT 1 FROM suppressions WHERE tenant_id = :tenant AND email = :lower_email
), present AS (
    SELECT 1 FROM email_verifications
    WHERE tenant_id = :tenant AND email = :email
      AND state IN ({", ".join(f"'{s.value}'" for s in UNFINISHED)})
), allowed AS (
    SELECT 1
    WHERE (SELECT count(*) FROM verification_sends
           WHERE tenant_id = :tenant AND email = :email AND at > :since) < :per_email
      AND (SELECT coalesce(sum(n), 0) FROM verification_send_counts
           WHERE tenant_id = :tenant AND minute >= date_trunc('minute', :since)) < :per_tenant
      AND NOT EXISTS (SELECT 1 FROM blocked) AND NOT EXISTS (SELECT 1 FROM present)
), took AS (
    INSERT INTO idempotency_records (tenant_id, idempotency_key, created_at, expires_at,
        operation, fingerprint, resource_id, response_status, response_body)
    SELECT :tenant, :request_key, :now, :record_expires_at,
        :operation, :fingerprint, :resource_id, :response_status, :response_body
    FROM allowed
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id
), verification AS (
    INSERT INTO email_verifications (id, tenant_id, email, state, token_digest, expires_at,
        confirm_attempts, send_count, message_id, template_name, redirect_url, created_at,
        updated_at)
    SELECT :verification_id, :tenant, :email, :state, :token_digest, :verification_expires_at,
        0, 1, :id, :template_name, :redirect_url, :now, :now
    FROM took
    RETURNING id
), moves AS (
    INSERT INTO verification_events (verification_id, from_state, to_state, at, actor,
        message_id, detail)
    SELECT verification.id, m.from_state, m.to_state, :now, :verification_actor, m.message_id,
        m.detail
    FROM verification, (VALUES
        (NULL, '{VState.CREATED.value}', NULL::uuid, NULL),
        ('{VState.CREATED.value}', :state, :id, :move_detail)
    ) AS m (from_state, to_state, message_id, detail)
    RETURNING 1
), sends AS (
    INSERT INTO verification_sends (tenant_id, email, verification_id, at)
    SELECT :tenant, :email, id, :now FROM verification
    RETURNING 1
), counted AS (
    INSERT INTO verification_send_counts (tenant_id, minute, n)
    SELECT :tenant, date_trunc('minute', :now), 1 FROM verification
    ON CONFLICT (tenant_id, minute) DO UPDATE SET n = verification_send_counts.n + 1
    RETURNING 1
), {{message}}
SELECT
    (SELECT count(*) FROM verification) AS verification,
    (SELECT count(*) FROM moves) AS moves,
    (SELECT count(*) FROM sends) AS sends,
    (SELECT count(*) FROM made) AS made,
    (SELECT count(*) FROM made_history) AS made_history,
    (SELECT count(*) FROM counted) AS counted,
    (SELECT pg_notify('{{channel}}', '') FROM made) AS notified
"""  # noqa: S608 (constant names and states only; every value is a bound parameter)


def _request_statement() -> Any:
    from sqlalchemy import text

    from mailbag.store import enqueue
    from mailbag.store.schema import idempotency_records as records

    sql = _REQUEST_SQL.format(
        message=enqueue.created_message_sql("verification"), channel=enqueue.NOTIFY_CHANNEL
    )
    # One space for each run of spaces (no literal in it has any): shorter than 4,096
    # characters, psycopg caches its parsed form.
    sql = " ".join(sql.split())
    types = {
        **enqueue.created_message_types(),
        "verification_id": ev.c.id.type,
        "email": ev.c.email.type,
        "lower_email": ev.c.email.type,
        "since": verification_sends.c.at.type,
        "per_email": Integer(),
        "per_tenant": Integer(),
        "request_key": records.c.idempotency_key.type,
        "record_expires_at": records.c.expires_at.type,
        "operation": records.c.operation.type,
        "fingerprint": records.c.fingerprint.type,
        "resource_id": records.c.resource_id.type,
        "response_status": records.c.response_status.type,
        "response_body": records.c.response_body.type,
        "state": ev.c.state.type,
        "token_digest": ev.c.token_digest.type,
        "verification_expires_at": ev.c.expires_at.type,
        "redirect_url": ev.c.redirect_url.type,
        "verification_actor": verification_events.c.actor.type,
        "move_detail": verification_events.c.detail.type,
    }
    return text(sql).bindparams(*(bindparam(k, type_=t) for k, t in types.items()))


async def _roll_back(conn: AsyncConnection, pg: Any) -> None:
    """End the pipeline's failed transaction; a connection that cannot is never reused."""
    import psycopg

    try:
        if not pg.closed:
            await pg.execute("ROLLBACK")
            return
    except psycopg.Error:
        pass
    await conn.invalidate()


def _all_written(answer: Any) -> bool:
    verification, moves, sends, made, made_history, counted = answer[:6]
    return bool(verification == sends == made == made_history == counted == 1 and moves == 2)


_PIPELINED: dict[str, Any] = {}  # the statement compiled for psycopg, once per process


async def request_in_one_round_trip(
    conn: AsyncConnection,
    verification: Mapping[str, Any],
    message_row: dict[str, Any],
    record: Mapping[str, Any],
    *,
    since: datetime,
    per_email: int,
    per_tenant: int,
    now: datetime,
    actor: str,
    detail: str,
) -> bool:
    """A verification request's common case (see above) with its lock and transaction in
    ONE round trip: BEGIN, the tenant's send lock (lock_sends), the statement and COMMIT go
    to PostgreSQL together in a psycopg pipeline. The server takes the lock and then runs
    the statement (a new snapshot: it sees the previous holder's sends) without waiting for
    the client in between, so the lock is held for the server's work only, not across
    round trips and the event loop's turns of every other request in flight. `conn` must
    be in autocommit mode: the pipeline carries its own BEGIN and COMMIT. False: nothing
    was written (an error rolls back)."""
    from mailbag.store import enqueue

    values = enqueue.created_message_values(message_row, now=now, actor=actor)
    if values is None:
        return False
    values.update(
        verification_id=verification["id"],
        email=verification["email"],
        lower_email=verification["email"].lower(),
        since=since,
        per_email=per_email,
        per_tenant=per_tenant,
        request_key=record["idempotency_key"],
        record_expires_at=record["expires_at"],
        operation=record["operation"],
        fingerprint=record["fingerprint"],
        resource_id=record["resource_id"],
        response_status=record["response_status"],
        response_body=record["response_body"],
        state=verification["state"],
        token_digest=verification["token_digest"],
        verification_expires_at=verification["expires_at"],
        redirect_url=verification["redirect_url"],
        verification_actor=actor[:200],
        move_detail=detail,
    )
    import psycopg  # here: only PostgreSQL runs this, and other installs may lack psycopg

    if not _PIPELINED:
        # psycopg is given the SQL SQLAlchemy compiles, and the values through the same
        # bind processors (JSON serialization, UTC datetimes) an execute would apply.
        compiled = _request_statement().compile(dialect=conn.dialect)
        lock = lock_statement().compile(dialect=conn.dialect)
        _PIPELINED.update(
            sql=str(compiled),
            processors=dict(compiled._bind_processors),
            lock=str(lock),
            lock_param=next(iter(lock.params)),
        )
    processors = _PIPELINED["processors"]
    params = {k: processors[k](v) if k in processors else v for k, v in values.items()}
    raw = await conn.get_raw_connection()
    pg = raw.driver_connection
    assert pg is not None and pg.autocommit
    statement = pg.cursor()
    try:
        async with pg.pipeline():
            await pg.execute("BEGIN")
            await pg.execute(
                _PIPELINED["lock"], {_PIPELINED["lock_param"]: verification["tenant_id"]}
            )
            await statement.execute(_PIPELINED["sql"], params)
            await pg.execute("COMMIT")
        answer = await statement.fetchone()
    except psycopg.IntegrityError:
        await _roll_back(conn, pg)  # the error skipped the pipeline's COMMIT
        return False  # a unique index: another row was first; nothing was written
    except psycopg.Error as exc:
        await _roll_back(conn, pg)
        # As SQLAlchemy would raise it (an OperationalError is the database being down).
        raise DBAPIError.instance(
            _PIPELINED["sql"], None, exc, psycopg.Error, connection_invalidated=pg.closed
        ) from exc
    except BaseException:
        await conn.invalidate()  # cancelled mid-pipeline: its state is unknown, never reused
        raise
    finally:
        await statement.close()
    return answer is not None and _all_written(answer)
