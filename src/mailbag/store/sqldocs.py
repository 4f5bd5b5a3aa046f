"""docs/sql: every statement each store operation runs, per database, written from the plans.

    python -m mailbag.store.sqldocs            # rewrite docs/sql from the plans

Each operation in OPERATIONS (a name, its docstring's first paragraph, sample arguments)
runs on a recorder for each dialect instead of a connection: the recorder answers the
plan's dialect question, compiles every statement the plan yields, in order, and answers
each with sample rows, so that the plan takes its longest path (MariaDB's claim reads a
window of ids and then locks among them; an empty answer would end most plans early).
`rows` gives an operation fewer rows where a step must come back empty to show the rest.

Parameters are shown by name (`:name`); lists are expanded (`:id_1_1, :id_1_2`) as the
driver receives them. A plan's answers are sample data: the SQL is the plan's own.
tests/test_sql_docs.py regenerates into a temporary directory and fails when docs/sql
differs, or when a store operation is missing here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Executable
from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine import Dialect as SQLDialect

import mailbag.store
from mailbag.database_url import Dialect
from mailbag.domain.content import Attachment
from mailbag.domain.delivery import Decision
from mailbag.domain.events import EventKind, ProviderEvent
from mailbag.domain.hooks import DAction, DState, HookEndpoint, HookEvent
from mailbag.domain.message import Filter, Message, new_message
from mailbag.domain.states import Action, Status
from mailbag.domain.verification import VAction
from mailbag.store import (
    attachments,
    console_sessions,
    deployment,
    dispatch,
    enqueue,
    events,
    hooks,
    idempotency,
    messages,
    operator,
    rate,
    senders,
    stats,
    suppressions,
    tenants,
    verifications,
)
from mailbag.store.message_transitions import Changed, message_facts, message_from_row
from mailbag.store.plan import Plan, Step, answering
from mailbag.store.schema import outbox_messages

DOCS = Path(__file__).resolve().parents[3] / "docs" / "sql"
COMMAND = "python -m mailbag.store.sqldocs"

# The drivers mailbag runs on (database_url.py), showing parameters by name.
DIALECTS: dict[Dialect, SQLDialect] = {
    "postgresql": PGDialect_psycopg(paramstyle="named"),  # type: ignore[no-untyped-call]
    "mysql": MySQLDialect_pymysql(paramstyle="named"),
    "sqlite": SQLiteDialect_pysqlite(paramstyle="named"),
}

NOW = datetime(2026, 1, 1, tzinfo=UTC)
IDS = [uuid.UUID(int=n) for n in (1, 2, 3)]
TENANT = "t_sample"
DIGEST = "0" * 64  # a sample sha256 hex digest

# Sample values by column name, where the type alone would not make a valid one: states
# the domain parses ("sent" is a message status and a verification state alike), and
# metadata that marks a message as a verification email, so the verification it follows
# is moved in the docs too.
SAMPLES: dict[str, Any] = {
    "status": Status.SENT.value,
    "previous_state": Status.SENT.value,
    "state": Status.SENT.value,
    "to_status": Status.SENT.value,
    "from_status": Status.PROCESSING.value,
    "metadata": {"verification_id": str(IDS[0])},
    "id": IDS[0],
}


@dataclass(frozen=True)
class Operation:
    """A store operation as docs/sql shows it: `plan(**args)` run on the recorder."""

    plan: Callable[..., Plan[Any]]
    args: Mapping[str, Any] = field(default_factory=dict)
    rows: Sequence[int] = ()  # sample rows answered to each step in turn; 1 after these
    samples: Mapping[str, Any] = field(default_factory=dict)  # column values beyond SAMPLES

    @property
    def name(self) -> str:
        return f"{self.plan.__module__.rsplit('.', 1)[-1]}.{self.plan.__name__}"

    @property
    def description(self) -> str:
        doc = inspect.getdoc(self.plan) or ""
        return " ".join(doc.split("\n\n", 1)[0].split())


class SampleRow(tuple[Any, ...]):
    """A row by position and by name, like SQLAlchemy's Row."""

    _names: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._names.index(name)]
        except ValueError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return dict(zip(self._names, self, strict=True))


def _name(column: Any) -> str:
    return str(getattr(column, "key", None) or getattr(column, "name", ""))


def _value(column: Any, samples: Mapping[str, Any]) -> Any:
    name = _name(column)
    if name in samples:
        return samples[name]
    try:
        kind = column.type.python_type
    except NotImplementedError:
        return None
    defaults: dict[type, Any] = {
        uuid.UUID: IDS[0],
        datetime: NOW,
        int: 1,
        float: 1.0,
        bool: False,
        str: "sample",
        dict: {},
        list: [],
    }
    return defaults.get(kind)


def _row(columns: Sequence[Any], samples: Mapping[str, Any]) -> SampleRow:
    row = SampleRow(_value(c, {**SAMPLES, **samples}) for c in columns)
    row._names = tuple(_name(c) for c in columns)
    return row


def _message(**values: Any) -> Message:
    """A sample stored message."""
    row = _row(list(outbox_messages.columns), {"carried": None})
    return replace(message_from_row(row), **values)  # type: ignore[arg-type]  # a Row in all but name


SENDER = "billing@example.com"
_NEW_MESSAGE = new_message(
    tenant_id=TENANT,
    to="ada@example.com",
    template="welcome",
    idempotency_key="k",
    from_address=SENDER,  # the sender identity check shows
    attachments=[Attachment("invoice.pdf", "application/pdf", b"%PDF-1.7 sample")],
)
_EVENT = ProviderEvent(
    provider="brevo",
    kind=EventKind.DELIVERED,
    provider_event="delivered",
    occurred_at=NOW,
    provider_message_id="<provider-1@example.com>",
    message_id=IDS[0],
    recipient="ada@example.com",
    dedup_key="brevo:1",
    detail=None,
    raw={},
)

# Event hooks' rows: a delivery's states and event, an endpoint's subscriptions.
_HOOK: dict[str, Any] = {
    "status": DState.DELIVERED.value,
    "previous_state": DState.PROCESSING.value,
    "from_status": DState.PROCESSING.value,
    "to_status": DState.DELIVERED.value,
    "event": HookEvent.SENT.value,
    "events": ",sent,",
    "tenant_id": TENANT,
}
_HOOK_ENDPOINT = HookEndpoint(
    id=IDS[0],
    tenant_id=TENANT,
    url="https://example.com/hooks",
    events=frozenset({HookEvent.SENT}),
    enabled=True,
    description=None,
    created_at=NOW,
    updated_at=NOW,
)

OPERATIONS: list[Operation] = [
    # Enqueue and the worker's dispatch
    Operation(
        enqueue.enqueue,
        {"messages": [_NEW_MESSAGE], "now": NOW, "default_max_attempts": 5},
        # The sender is the tenant's; the new row is not found by its id (a key taken), so
        # the key is read back too: nobody holds it, the message is created, and its
        # attachment's bytes are new. (A first send finds its ids and reads no key back.)
        rows=(1, 1, 1, 0, 0),
        samples={"idempotency_key": "k", "tenant_id": TENANT, "address": SENDER},
    ),
    Operation(
        enqueue.enqueue_first_use,
        {
            # POST /v1/messages with a new key on PostgreSQL (one To, no from, no
            # attachments): record, message and history in one statement (autocommit).
            "row": enqueue.first_use_row(
                new_message(
                    to="ada@example.com",
                    template="welcome",
                    data={"name": "Ada"},
                    tenant_id=TENANT,
                    idempotency_key="k",
                ),
                NOW,
                5,
            ),
            "record": idempotency.complete_record(
                tenant_id=TENANT,
                key="k",
                operation="POST /v1/messages",
                fingerprint=DIGEST,
                now=NOW,
                expires_at=NOW + timedelta(hours=24),
                resource_id=str(IDS[0]),
                status=201,
                body={"id": str(IDS[0])},
            ),
            "now": NOW,
            "actor": "api",
        },
        samples={"took": 1, "made": 1, "history": 1},
    ),
    Operation(
        dispatch.claim,
        {"worker_id": "worker-1", "now": NOW, "lease": timedelta(minutes=5), "limit": 10},
        samples={"status": Status.PROCESSING.value, "previous_state": Status.PENDING.value},
    ),
    Operation(
        dispatch.release_unconfirmed,
        {"tokens": IDS[2:], "now": NOW, "actor": "worker-1"},
        samples={"status": Status.PENDING.value, "previous_state": Status.PROCESSING.value},
    ),
    Operation(
        dispatch.extend_lease,
        {"token": IDS[2], "ids": IDS[:2], "now": NOW, "lease": timedelta(minutes=5)},
    ),
    Operation(
        dispatch.finalize,
        {
            "token": IDS[2],
            "decisions": {
                IDS[0]: Decision(Action.MARK_SENT, provider_message_id="<p-1>"),
                IDS[1]: Decision(Action.RETRY, error="421 busy", next_attempt_at=NOW),
            },
            "now": NOW,
            "actor": "worker-1",
            "provider": "brevo",
        },
        samples={"previous_state": Status.PROCESSING.value},
    ),
    Operation(
        dispatch.sweep_expired,
        {"now": NOW, "actor": "worker-1"},
        samples={"status": Status.UNKNOWN.value, "previous_state": Status.PROCESSING.value},
    ),
    Operation(dispatch.expired_before, {"message_ids": IDS[:2]}),
    # Operators
    Operation(
        operator.requeue,
        {
            "where": Filter(status=Status.DEAD, tenant_id=TENANT),
            "now": NOW,
            "actor": "operator",
            "extra_attempts": 5,
            "limit": 10_000,
        },
        samples={"status": Status.PENDING.value, "previous_state": Status.DEAD.value},
    ),
    Operation(
        operator.cancel,
        {"where": Filter(ids=IDS[:1], tenant_id=TENANT), "now": NOW, "actor": "api"},
        samples={"status": Status.CANCELLED.value, "previous_state": Status.PENDING.value},
    ),
    Operation(
        operator.resolve,
        {
            "message_id": IDS[0],
            "sent": True,
            "now": NOW,
            "actor": "reconciler",
            "evidence": "provider event delivered",
            "provider_message_id": "<p-1>",
        },
        samples={"previous_state": Status.UNKNOWN.value},
    ),
    Operation(
        operator.flag,
        {"message_id": IDS[0], "now": NOW, "actor": "reconciler", "detail": "no evidence"},
        samples={"status": Status.UNKNOWN.value, "previous_state": Status.UNKNOWN.value},
    ),
    Operation(operator.purge, {"older_than": NOW}),
    # Attachments and sender identities
    Operation(attachments.refs, {"message_ids": IDS[:2]}),
    Operation(attachments.contents, {"sha256s": [DIGEST]}, samples={"content": b"%PDF"}),
    Operation(
        attachments.content, {"message_id": IDS[0], "position": 0}, samples={"content": b"%PDF"}
    ),
    Operation(attachments.purge_unreferenced),
    Operation(
        senders.add, {"tenant_id": TENANT, "address": SENDER, "name": None, "now": NOW}, rows=(0,)
    ),
    Operation(senders.remove, {"tenant_id": TENANT, "address": SENDER}),
    Operation(senders.listing, {"tenant_id": TENANT}),
    Operation(senders.owned, {"pairs": [(TENANT, SENDER)]}),
    # Reads
    Operation(messages.get, {"message_id": IDS[0], "tenant_id": TENANT}),
    Operation(
        messages.page,
        {
            "where": Filter(tenant_id=TENANT, status=Status.PENDING, to="Ada@example.com"),
            "limit": 50,
            "before": IDS[2],
        },
    ),
    Operation(messages.events, {"message_id": IDS[0]}),
    Operation(messages.count_by_status),
    Operation(stats.oldest_due, {"now": NOW}),
    Operation(stats.outbox_gauges, {"now": NOW}),
    Operation(stats.sent_per_bucket, {"now": NOW, "buckets": 2}),
    Operation(stats.attempt_endings, {"since": NOW}),
    Operation(stats.oldest_unknown),
    # Provider events and suppressions
    Operation(events.match, {"event": _EVENT}, rows=(0,)),  # not found by our id: by theirs
    Operation(events.store, {"event": _EVENT, "message": _message(), "now": NOW}, rows=(0,)),
    Operation(events.for_message, {"message": _message(provider_message_id="<p-1>")}),
    Operation(events.unmatched_count),
    Operation(
        suppressions.add,
        {"tenant_id": TENANT, "email": "ada@example.com", "reason": "hard_bounce", "now": NOW},
        rows=(0,),  # not suppressed yet
    ),
    Operation(suppressions.remove, {"tenant_id": TENANT, "email": "ada@example.com"}),
    Operation(suppressions.listing, {"tenant_id": TENANT}),
    Operation(suppressions.count),
    Operation(suppressions.among, {"pairs": [(TENANT, "ada@example.com")]}),
    # Verifications
    Operation(
        verifications.create,
        {
            "values": {
                "id": IDS[0],
                "tenant_id": TENANT,
                "email": "ada@example.com",
                "token_digest": "",
                "expires_at": NOW,
                "message_id": None,
                "template_name": "verify",
                "redirect_url": None,
            },
            "now": NOW,
            "actor": "api",
        },
    ),
    Operation(
        verifications.transition,
        {
            "action": VAction.CONFIRM,
            "where": verifications.VerificationFilter(
                id=IDS[0], token_digest=DIGEST, confirm_attempts_below=5
            ),
            "now": NOW,
            "actor": "api",
            "values": {"verified_at": NOW},
            "detail": "token confirmed",
        },
    ),
    Operation(
        verifications.follow_messages,
        {"changed": [Changed(_message(), Status.PROCESSING)], "now": NOW, "actor": "worker-1"},
    ),
    Operation(verifications.expire_stale, {"now": NOW, "actor": "scheduler", "limit": 1000}),
    Operation(verifications.count_wrong_token, {"verification_id": IDS[0], "now": NOW}),
    Operation(verifications.get, {"verification_id": IDS[0], "tenant_id": TENANT}),
    Operation(verifications.active_for, {"tenant_id": TENANT, "email": "ada@example.com"}),
    Operation(verifications.events, {"verification_id": IDS[0]}),
    Operation(verifications.lock_sends, {"tenant_id": TENANT}),
    Operation(
        verifications.record_send,
        {"tenant_id": TENANT, "email": "ada@example.com", "verification_id": IDS[0], "now": NOW},
    ),
    Operation(
        verifications.sends_since,
        {"tenant_id": TENANT, "since": NOW, "email": "ada@example.com"},
    ),
    Operation(verifications.tenant_sends_since, {"tenant_id": TENANT, "since": NOW}),
    # Idempotency records
    Operation(idempotency.find, {"tenant_id": TENANT, "key": "k-1"}),
    Operation(idempotency.drop_if_expired, {"tenant_id": TENANT, "key": "k-1", "now": NOW}),
    Operation(
        idempotency.take_key,
        {
            "tenant_id": TENANT,
            "key": "k-1",
            "operation": "POST /v1/messages",
            "fingerprint": "f",
            "now": NOW,
            "expires_at": NOW,
        },
    ),
    Operation(
        idempotency.record_response,
        {"tenant_id": TENANT, "key": "k-1", "resource_id": "r", "status": 201, "body": {}},
    ),
    Operation(idempotency.purge_expired, {"now": NOW}),
    # Tenants, console sessions, the deployment row
    Operation(
        tenants.create,
        {
            "tenant_id": TENANT,
            "name": "sample",
            "key_digest": "d",
            "key_prefix": "mb_abc",
            "now": NOW,
        },
    ),
    Operation(tenants.by_key_digest, {"key_digest": "d"}),
    Operation(tenants.by_name, {"name": "sample"}),
    Operation(tenants.all_tenants),
    Operation(
        console_sessions.start,
        {"id_digest": "d", "password_fingerprint": "f", "now": NOW, "expires_at": NOW},
    ),
    Operation(
        console_sessions.is_live, {"id_digest": "d", "password_fingerprint": "f", "now": NOW}
    ),
    Operation(console_sessions.end, {"id_digest": "d"}),
    Operation(deployment.record_key_check, {"key_check": "c", "now": NOW}),
    Operation(deployment.replace_key_check, {"key_check": "c", "now": NOW}),
    Operation(deployment.stored_key_check),
    # The fleet's send rate (PROVIDER_RATE)
    Operation(rate.reserve, {"provider": "brevo", "count": 100, "rate": 50.0, "cooldown": 60.0}),
    Operation(
        rate.throttle, {"provider": "brevo", "rate": 50.0, "cooldown": 60.0, "retry_after": 2.0}
    ),
    Operation(rate.schedule, {"provider": "brevo"}),
    # Event hooks
    Operation(
        hooks.fan_out,
        {
            "events": [(HookEvent.SENT, _message(tenant_id=TENANT))],
            "facts": message_facts,
            "now": NOW,
        },
        samples={"tenant_id": TENANT, "events": ",sent,"},
    ),
    Operation(hooks.create_endpoint, {"endpoint": _HOOK_ENDPOINT, "sealed_secret": "sealed"}),
    Operation(hooks.endpoint, {"endpoint_id": IDS[0], "tenant_id": TENANT}, samples=_HOOK),
    Operation(hooks.endpoints, {"tenant_id": TENANT}, samples=_HOOK),
    Operation(
        hooks.update_endpoint,
        {"endpoint_id": IDS[0], "tenant_id": TENANT, "now": NOW, "enabled": False},
        samples=_HOOK,
    ),
    Operation(hooks.delete_endpoint, {"endpoint_id": IDS[0], "tenant_id": TENANT}, samples=_HOOK),
    Operation(
        hooks.claim,
        {"worker_id": "worker-1", "now": NOW, "lease": timedelta(minutes=2), "limit": 10},
        samples={**_HOOK, "status": DState.PROCESSING.value, "previous_state": "pending"},
    ),
    Operation(
        hooks.finalize,
        {
            "token": IDS[2],
            "results": [hooks.Attempted(IDS[0], DAction.DELIVER, status_code=204)],
            "now": NOW,
            "actor": "worker-1",
        },
        samples={**_HOOK, "previous_state": DState.PROCESSING.value},
    ),
    Operation(
        hooks.sweep,
        {"now": NOW, "actor": "worker-1"},
        samples={**_HOOK, "status": DState.RETRYING.value, "previous_state": "processing"},
    ),
    Operation(hooks.delivery, {"delivery_id": IDS[0], "tenant_id": TENANT}, samples=_HOOK),
    Operation(
        hooks.page,
        {"query": hooks.DeliveryQuery(tenant_id=TENANT), "limit": 50, "after": (NOW, IDS[2])},
        samples=_HOOK,
    ),
    Operation(
        hooks.replay,
        {
            "delivery_id": IDS[0],
            "tenant_id": TENANT,
            "now": NOW,
            "actor": "operator",
            "extra_attempts": 8,
        },
        samples={**_HOOK, "status": DState.PENDING.value, "previous_state": "dead"},
    ),
]

# Plans that are parts of the operations above, not operations of their own: their SQL
# shows in the files of the operations that run them.
PARTS = {
    "message_transitions.transition": "every message transition (claim, finalize, cancel...)",
    "transition.apply_transition": "message_transitions.transition, verifications.transition",
    "transition.guarded_update": "transition.apply_transition",
    "transition.record": "transition.apply_transition, enqueue, verifications.create",
    "attachments.store": "enqueue.enqueue",
    "attachments.attached": "attachments.refs, when a message carries any (claim, get, page)",
}


# --- The recorder -------------------------------------------------------------------------


class SampleResult:
    """What a recorded step answers: `count` sample rows of the statement's columns."""

    def __init__(self, statement: Executable, count: int, samples: Mapping[str, Any]) -> None:
        columns = list(getattr(statement, "exported_columns", None) or [])
        self._rows = [_row(columns, samples) for _ in range(count)] if columns else []
        self.rowcount = count
        self.inserted_primary_key = (1,)

    def all(self) -> list[SampleRow]:
        return list(self._rows)

    def __iter__(self) -> Iterator[SampleRow]:
        return iter(self._rows)

    def first(self) -> SampleRow | None:
        return self._rows[0] if self._rows else None

    def one(self) -> SampleRow:
        return self._rows[0]

    def scalar_one(self) -> Any:
        return self._rows[0][0]

    def scalars(self) -> SampleResult:
        scalars = SampleResult.__new__(SampleResult)
        scalars._rows = [row[0] for row in self._rows]
        return scalars


def compiled(step: Step, dialect: Dialect) -> str:
    """A step's statement as the driver receives it, parameters by name."""
    many = isinstance(step.params, Sequence) and not isinstance(step.params, Mapping)
    params = step.params[0] if many and step.params else step.params  # type: ignore[index]
    sql = step.statement.compile(  # type: ignore[attr-defined]
        dialect=DIALECTS[dialect],
        column_keys=list(params) if params else None,
        for_executemany=many,
        compile_kwargs={"render_postcompile": True},
    )
    text = "\n".join(line.rstrip() for line in str(sql).strip().splitlines())
    return f"{text};" + ("  -- once per row (executemany)" if many else "")


def record(operation: Operation, dialect: Dialect) -> list[str]:
    """The statements `operation` runs on `dialect`, compiled, in order."""
    steps = answering(operation.plan(**operation.args), dialect)
    counts = iter(operation.rows)
    statements = []
    try:
        step = next(steps)
        while True:
            statements.append(compiled(step, dialect))
            answer = SampleResult(step.statement, next(counts, 1), operation.samples)
            step = steps.send(answer)  # type: ignore[arg-type]
    except StopIteration:
        return statements


def render(operation: Operation, dialect: Dialect) -> str:
    statements = record(operation, dialect)
    header = [
        f"-- {operation.name} ({dialect})",
        *(f"-- {line}" for line in _wrap(operation.description)),
        f"-- Written by `{COMMAND}` from the plan; do not edit.",
    ]
    body = [f"-- step {i}\n{sql}" for i, sql in enumerate(statements, 1)] or ["-- no SQL"]
    return "\n".join(header) + "\n\n" + "\n\n".join(body) + "\n"


def _wrap(text: str, width: int = 92) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def write(directory: Path) -> list[Path]:
    """Write every operation's file for every dialect into `directory`; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for operation in OPERATIONS:
        for dialect in DIALECTS:
            path = directory / f"{operation.name}.{dialect}.sql"
            path.write_text(render(operation, dialect))
            written.append(path)
    return written


def store_operations() -> set[str]:
    """Every public function of the store that returns a Plan, as `module.function`."""
    found = set()
    for info in pkgutil.iter_modules(mailbag.store.__path__):
        module = importlib.import_module(f"mailbag.store.{info.name}")
        for name, value in vars(module).items():
            if (
                inspect.isfunction(value)
                and value.__module__ == module.__name__
                and not name.startswith("_")
                and str(value.__annotations__.get("return", "")).startswith("Plan[")
            ):
                found.add(f"{info.name}.{name}")
    return found


def main() -> None:
    for stale in DOCS.glob("*.sql"):
        stale.unlink()
    written = write(DOCS)
    print(f"wrote {len(written)} files to {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
