"""A key's first use written every way on the same input, compared row by row.

The common case of a keyed POST is one chain (store/chain.py, store/first_use.py): on
PostgreSQL one statement, the verification's sent with its lock in one round trip. Each case
here runs three ways, each on an emptied database with the same setup and the same clock:
combined (the engine as the API has it), one by one (STEP_BY_STEP: the chain's readable
rendering) and the general path alone (WITHOUT_CHAINS: services.idempotency.execute with
store.enqueue, or the verification workflow, which also decides every case the chain leaves
to it). On PostgreSQL the three differ; SQLite and MariaDB run the chain one by one either
way, so there it is compared with the general path. The answers and every row of every
table must come out the same, but for what
legitimately differs from run to run: the ids made (numbered in the order they were made),
sequence numbers, and a token's digest (compared as the digest of its own send's token).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncEngine

from api_helpers import settings_for
from mailbag.domain.message import NewMessage, new_message
from mailbag.domain.verification import digest
from mailbag.services.idempotency import KeyReused
from mailbag.services.messages import Messages
from mailbag.services.outbox import write_many
from mailbag.services.verification import VerificationError, VerificationRequest, Verifications
from mailbag.store import suppressions, tenants, verifications
from mailbag.store.chain import STEP_BY_STEP, WITHOUT_CHAINS
from mailbag.store.database import make_async_engine
from mailbag.store.plan import run
from mailbag.store.schema import metadata

from conftest import TestDB

NOW = datetime(2026, 6, 1, 12, 0, 30, 250_000, tzinfo=UTC)
TENANT = "t_fast_paths"
OVERRIDES = {
    "verification_sends_per_email_per_hour": 3,
    "verification_sends_per_tenant_per_hour": 6,
}
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

words = st.text(alphabet="abcdefghij", min_size=1, max_size=6)
addresses = st.builds(
    lambda local, upper: f"{local.upper() if upper else local}@example.com", words, st.booleans()
)


# --- the cases ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageCase:
    message: dict[str, Any]  # new_message's fields, but the key and the tenant
    other: dict[str, Any]  # another request's fields under the same key
    before: str  # what happened to the key, or to the recipient, before the request


@st.composite
def message_cases(draw: st.DrawFn) -> MessageCase:
    fields: dict[str, Any] = {
        "to": draw(addresses),
        "to_name": draw(st.none() | words),
        "tags": draw(st.lists(words, max_size=2, unique=True)),
        "metadata": draw(st.dictionaries(words, words | st.integers(0, 9), max_size=2)),
        "headers": draw(
            st.dictionaries(st.sampled_from(["X-Campaign", "X-Ref"]), words, max_size=1)
        ),
        "priority": draw(st.sampled_from(["low", "normal", "high"])),
        "send_at": draw(st.none() | st.integers(1, 7200).map(lambda n: NOW + timedelta(seconds=n))),
        "expires_at": draw(st.none() | st.just(NOW + timedelta(days=1))),
    }
    if draw(st.booleans()):
        # The data it renders with (every path renders it once), and words of its own.
        data = {"name": draw(words), **draw(st.dictionaries(words, words, max_size=3))}
        fields.update(template="welcome", data=data)
    else:
        fields.update(subject=draw(words), html=f"<p>{draw(words)}</p>")
    before = draw(
        st.sampled_from(
            [
                "nothing",
                "the same request",
                "another request",
                "the same request, expired",
                "an application's message",
                "another operation",
                "the recipient suppressed",
            ]
        )
    )
    return MessageCase(fields, {**fields, "tags": [*fields["tags"], "other"]}, before)


@dataclass(frozen=True)
class VerificationCase:
    request: VerificationRequest
    before: str
    sends: int  # of the address in the past hour
    tenant_sends: int  # of the tenant in the past hour


@st.composite
def verification_cases(draw: st.DrawFn) -> VerificationCase:
    request = VerificationRequest(
        email=draw(addresses),
        template="verify-email",
        redirect_url=draw(st.none() | st.just("https://example.com/verified?from=mail")),
        data=draw(st.dictionaries(st.sampled_from(["name", "app"]), words, max_size=2)),
    )
    before = draw(
        st.sampled_from(
            [
                "nothing",
                "the same request",
                "another request",
                "an unfinished verification",
                "an expired verification",
                "the address suppressed",
            ]
        )
    )
    per_email, per_tenant = OVERRIDES.values()
    return VerificationCase(
        request,
        before,
        sends=draw(st.sampled_from([0, per_email - 1, per_email])),
        tenant_sends=draw(st.sampled_from([0, per_tenant - 1, per_tenant])),
    )


# --- running a case one way --------------------------------------------------------------


def _fresh(db: TestDB) -> None:
    """An empty database with the tenant (the same id every run)."""
    db.clear()
    with db.engine.begin() as conn:
        run(
            conn,
            tenants.create(
                tenant_id=TENANT, name="fast", key_digest="d" * 64, key_prefix="mb_fast", now=NOW
            ),
        )


def _suppress(db: TestDB, email: str) -> None:
    with db.engine.begin() as conn:
        run(conn, suppressions.add(tenant_id=TENANT, email=email, reason="bounce", now=NOW))


def _message(fields: dict[str, Any]) -> NewMessage:
    return new_message(**fields, tenant_id=TENANT, idempotency_key="k-1")


async def message_one_way(db: TestDB, engine: AsyncEngine, case: MessageCase) -> Any:
    """The case's setup, then its request; what the request answered (or raised)."""
    messages = Messages(engine, settings_for(db, **OVERRIDES))
    earlier = NOW - timedelta(minutes=5)
    if case.before == "the recipient suppressed":
        _suppress(db, case.message["to"])
    elif case.before == "an application's message":
        with db.engine.begin() as conn:
            write_many(conn, [_message(case.message)], now=earlier)
    elif case.before == "another operation":
        request = VerificationRequest("eve@example.com", "verify-email", None, {})
        await Verifications(engine, settings_for(db, **OVERRIDES)).request(
            tenant_id=TENANT, key="k-1", request=request, now=earlier
        )
    elif case.before != "nothing":
        first = case.message if case.before.startswith("the same") else case.other
        then = NOW - timedelta(hours=25) if case.before.endswith("expired") else earlier
        await messages.create(key="k-1", message=_message(first), now=then)
    try:
        response = await messages.create(key="k-1", message=_message(case.message), now=NOW)
    except KeyReused as refused:
        return type(refused).__name__
    return [response.status, response.body, response.replayed]


def _sent_before(db: TestDB, case: VerificationCase) -> None:
    """The sends the case's limits count: of the address, and of the tenant's others."""
    per_address = [(case.request.email, n) for n in range(case.sends)]
    others = [(f"other-{n}@example.com", 10 + n) for n in range(case.tenant_sends - case.sends)]
    with db.engine.begin() as conn:
        for email, n in per_address + others:
            sent = verifications.record_send(
                tenant_id=TENANT,
                email=email,
                verification_id=uuid.UUID(int=n + 1),  # of verifications finished since
                now=NOW - timedelta(minutes=50 - n),
            )
            run(conn, sent)


async def verification_one_way(db: TestDB, engine: AsyncEngine, case: VerificationCase) -> Any:
    """The case's setup, then its request; what the request answered (or raised)."""
    service = Verifications(engine, settings_for(db, **OVERRIDES))
    request = case.request
    _sent_before(db, case)
    earlier: VerificationRequest | None = None
    then = NOW - timedelta(minutes=5)
    if case.before == "the address suppressed":
        _suppress(db, request.email)
    elif case.before == "another request":
        earlier = VerificationRequest(request.email, "verify-email", "https://example.com/b", {})
    elif case.before != "nothing":
        earlier = request
        then = NOW - timedelta(days=2) if "expired" in case.before else then  # a TTL of a day
    if earlier is not None:
        key = "k-1" if case.before.endswith("request") else "k-0"
        with contextlib.suppress(VerificationError):  # a limit: the request below meets it
            await service.request(tenant_id=TENANT, key=key, request=earlier, now=then)
    try:
        response = await service.request(tenant_id=TENANT, key="k-1", request=request, now=NOW)
    except (KeyReused, VerificationError) as refused:
        return type(refused).__name__
    return [response.status, response.body, response.replayed]


# --- what a run wrote --------------------------------------------------------------------


def written(db: TestDB, answer: Any) -> dict[str, Any]:
    """The answer and every row of every table, with what legitimately differs between runs
    replaced: each id the run made by its number in the order made (uuid7s increase),
    sequence numbers left out (rows stay in their order), a token's digest checked against
    the token of its own send."""
    tables: dict[str, list[dict[str, Any]]] = {}
    with db.engine.connect() as conn:
        for table in metadata.sorted_tables:
            query = select(table).order_by(*table.primary_key.columns)
            tables[table.name] = [
                {k: v for k, v in row.items() if not (k == "id" and isinstance(v, int))}
                for row in conn.execute(query).mappings()
            ]
    tokens = settings_for(db).verification_tokens
    for row in tables["email_verifications"]:
        if row["token_digest"] == digest(tokens.token(row["id"], row["send_count"])):
            row["token_digest"] = "<its send's token>"
    made = sorted(
        {
            value
            for rows in tables.values()
            for row in rows
            for value in row.values()
            if isinstance(value, uuid.UUID) and value.version == 7
        }
    )
    names = {str(made_id): f"<id {n}>" for n, made_id in enumerate(made)}
    return _renamed({"answer": answer, **tables}, names)  # type: ignore[no-any-return]


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, uuid.UUID):
        return names.get(str(value), value)
    if isinstance(value, str):
        for made_id, name in names.items():
            value = value.replace(made_id, name)
        return value
    if isinstance(value, dict):
        return {k: _renamed(v, names) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_renamed(v, names) for v in value]
    return value


@dataclass
class Ways:
    """An engine for each way on one event loop, and how many statements each sent through
    SQLAlchemy's own execution (the combined way's go through the session's pipeline)."""

    runner: asyncio.Runner
    engines: dict[str, AsyncEngine]
    executed: list[str]

    def run(self, db: TestDB, one_way: Any, case: Any) -> dict[str, tuple[dict[str, Any], int]]:
        done = {}
        for way, engine in self.engines.items():
            _fresh(db)
            self.executed.clear()
            answer = self.runner.run(one_way(db, engine, case))
            done[way] = (written(db, answer), len(self.executed))
        return done


@contextmanager
def every_way(db: TestDB) -> Iterator[Ways]:
    with asyncio.Runner() as runner:
        engine = make_async_engine(db.url)
        executed: list[str] = []
        event.listen(
            engine.sync_engine,
            "before_cursor_execute",
            lambda _c, _cur, statement, *_: executed.append(statement),
        )
        engines = {
            "combined": engine,
            "one by one": engine.execution_options(**STEP_BY_STEP),
            "general path": engine.execution_options(**WITHOUT_CHAINS),
        }
        try:
            yield Ways(runner, engines, executed)
        finally:
            runner.run(engine.dispose())


def _same_every_way(done: dict[str, tuple[dict[str, Any], int]]) -> None:
    combined = done["combined"][0]
    for way in ("one by one", "general path"):
        assert done[way][0] == combined, f"{way} wrote otherwise than combined"


# --- the tests ---------------------------------------------------------------------------


@pytest.fixture
def ways(db: TestDB) -> Iterator[Ways]:
    with every_way(db) as found:
        yield found


@pytest.mark.parametrize("db", ["postgresql", "sqlite", "mysql"], indirect=True)
@PROPERTY
@given(case=message_cases())
def test_a_messages_key_used_first_writes_the_same_rows_every_way(
    db: TestDB, ways: Ways, case: MessageCase
) -> None:
    hypothesis.event(case.before)
    done = ways.run(db, message_one_way, case)
    _same_every_way(done)
    if case.before == "nothing" and db.dialect == "postgresql":  # one statement, sent alone
        # ...after one read for a template: the version it is pinned to, and rendered with.
        reads = 1 if "template" in case.message else 0
        assert done["combined"][1] == reads < done["one by one"][1]
        assert done["combined"][0]["answer"][0] == 201


@pytest.mark.parametrize("db", ["postgresql", "sqlite", "mysql"], indirect=True)
@PROPERTY
@given(case=verification_cases())
def test_a_verification_requests_first_use_writes_the_same_rows_every_way(
    db: TestDB, ways: Ways, case: VerificationCase
) -> None:
    hypothesis.event(f"{case.before}, {case.sends} sends, {case.tenant_sends} the tenant's")
    done = ways.run(db, verification_one_way, case)
    _same_every_way(done)
    under = case.sends < OVERRIDES["verification_sends_per_email_per_hour"] and (
        case.tenant_sends < OVERRIDES["verification_sends_per_tenant_per_hour"]
    )
    if case.before == "nothing" and under and db.dialect == "postgresql":  # one round trip
        # ...after one read: the version its email is pinned to, and rendered with.
        assert done["combined"][1] == 1 < done["one by one"][1]
        assert done["combined"][0]["answer"][0] == 201
