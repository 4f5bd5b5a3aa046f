"""docs/sql: every statement the store runs, per database, written from the plans.

    python -m mailbag.sqldocs            # rewrite docs/sql from the plans

docs/sql holds one file per database (postgresql.sql, mysql.sql, sqlite.sql), each
operation in it under a `-- name: module.operation --` header with a one-line
description, and an index (README.md) that lists every operation with a link into each
file. An entry of OPERATIONS is either an Operation: a store plan with sample arguments,
which mailbag.sqlrecorder runs without a database (its SQL is the plan's own, its
answers sample data; `rows` gives a step fewer rows where it must come back empty for the
plan to show the rest), or a Statement: SQL the store hands a driver outside any plan,
shown under a name of its own. tests/test_sql_docs.py regenerates docs/sql into a
temporary directory and fails when it differs, or when a store plan is missing here.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import mailbag.store
from mailbag import sqlrecorder
from mailbag.database_url import Dialect
from mailbag.domain.content import Attachment
from mailbag.domain.delivery import Decision
from mailbag.domain.domain_shaping import Shaping
from mailbag.domain.events import EventKind, ProviderEvent
from mailbag.domain.hooks import Breaker, DAction, DState, HookEndpoint, HookEvent
from mailbag.domain.message import Filter, Message, new_message
from mailbag.domain.states import Action, Status
from mailbag.domain.templates import Draft
from mailbag.domain.verification import VAction
from mailbag.sqlrecorder import NOW, sample_row
from mailbag.store import (
    attachments,
    console_sessions,
    deployment,
    dispatch,
    domain_rates,
    enqueue,
    erasure,
    events,
    first_use,
    fleet_state,
    hooks,
    idempotency,
    messages,
    operator,
    rate,
    sender_domains,
    senders,
    stats,
    suppressions,
    templates,
    tenant_accounts,
    tenant_retention,
    tenants,
    verifications,
)
from mailbag.store.message_transitions import Changed, message_facts, message_from_row
from mailbag.store.plan import Plan, Step
from mailbag.store.schema import outbox_messages
from mailbag.store.sender_domains import NewKey

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sql"
COMMAND = "python -m mailbag.sqldocs"
DATABASES: dict[Dialect, str] = {
    "postgresql": "PostgreSQL",
    "mysql": "MariaDB/MySQL",
    "sqlite": "SQLite",
}

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


_TEMPLATE_VERSION: dict[str, Any] = {"sample_data": {}, "dependencies": {}, "compiled_html": None}


def _first_sentence(doc: str) -> str:
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", paragraph, maxsplit=1)[0]


@dataclass(frozen=True)
class Operation:
    """A store operation as docs/sql shows it: `plan(**args)` run on the recorder."""

    plan: Callable[..., Plan[Any]]
    args: Mapping[str, Any] = field(default_factory=dict)
    rows: Sequence[int] = ()  # sample rows answered to each step in turn; 1 after these
    samples: Mapping[str, Any] = field(default_factory=dict)  # column values beyond SAMPLES
    summary: str = ""  # for a plan without a docstring

    @property
    def name(self) -> str:
        return f"{self.plan.__module__.rsplit('.', 1)[-1]}.{self.plan.__name__}"

    @property
    def description(self) -> str:
        """The docstring's first sentence (else `summary`)."""
        return _first_sentence(inspect.getdoc(self.plan) or "") or self.summary

    def statements(self, dialect: Dialect) -> list[str]:
        plan = self.plan(**self.args)
        samples = {**SAMPLES, **self.samples}
        return sqlrecorder.record(plan, dialect, rows=self.rows, samples=samples)


@dataclass(frozen=True)
class Statement:
    """SQL the store hands a driver itself, outside any plan, shown under the name of the
    function that runs it (`of`, whose docstring describes it): `steps()` builds its
    statements, the store's own, in the order they run."""

    of: Callable[..., Any]
    steps: Callable[[], Sequence[Step]]
    dialects: tuple[Dialect, ...] = ("postgresql",)

    @property
    def name(self) -> str:
        return f"{self.of.__module__.rsplit('.', 1)[-1]}.{self.of.__name__}"

    @property
    def description(self) -> str:
        return _first_sentence(inspect.getdoc(self.of) or "")

    def statements(self, dialect: Dialect) -> list[str]:
        if dialect not in self.dialects:
            return []
        return [sqlrecorder.readable(step, dialect) for step in self.steps()]


def _message(**values: Any) -> Message:
    """A sample stored message."""
    row = sample_row(list(outbox_messages.columns), {**SAMPLES, "carried": None})
    return replace(message_from_row(row), **values)  # type: ignore[arg-type]  # a Row in all but name


SENDER = "billing@example.com"
SHAPING = Shaping.per_minute(600.0, 1.0, 600.0)  # DOMAIN_SHAPING's defaults
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

# A new verification's values, as the service gives them (created, and on a first use).
_VERIFICATION: dict[str, Any] = {
    "id": IDS[0],
    "tenant_id": TENANT,
    "email": "ada@example.com",
    "token_digest": "",
    "expires_at": NOW,
    "message_id": None,
    "template_name": "verify",
    "redirect_url": None,
    "locale": None,
}

# A key's first use (store/first_use.py): its message, and its record.
_FIRST_USE_MESSAGE = new_message(
    to="ada@example.com",
    template="welcome",
    data={"name": "Ada"},
    tenant_id=TENANT,
    idempotency_key="k",
)


# A sender domain's key, sealed, as the service hands it to the store.
_DKIM_KEY = NewKey("mb20261202", "rsa", "MIIBIjANBgkq", "gAAAAABsealed")
_DKIM_ROW: dict[str, Any] = {"state": "signing", "algorithm": "rsa", "ready": True}


def _record(operation: str) -> dict[str, Any]:
    return idempotency.complete_record(
        tenant_id=TENANT,
        key="k",
        operation=operation,
        fingerprint=DIGEST,
        now=NOW,
        expires_at=NOW + timedelta(hours=24),
        resource_id=str(IDS[0]),
        status=201,
        body={"id": str(IDS[0])},
    )


OPERATIONS: list[Operation | Statement] = [
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
        first_use.message,
        {
            # POST /v1/messages with a new key (one To, no from, no attachments): record,
            # message and history; on PostgreSQL one statement (autocommit).
            "row": enqueue.first_use_row(_FIRST_USE_MESSAGE, NOW, 5),
            "record": _record("POST /v1/messages"),
            "now": NOW,
            "actor": "api",
        },
        samples={"not_suppressed": True, "record": 1, "message": 1, "message_history": 1},
    ),
    Operation(
        dispatch.claim,
        {"worker_id": "worker-1", "now": NOW, "lease": timedelta(minutes=5), "limit": 10},
        # One lane with due mail (store/fair.py: its share of the batch, its rows' lane).
        samples={
            "status": Status.PROCESSING.value,
            "previous_state": Status.PENDING.value,
            "share": 10,
            "lane": 0,
        },
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
    # Tenants' own provider accounts (their settings sealed before any plan sees them)
    Operation(
        tenant_accounts.put,
        {
            "tenant_id": TENANT,
            "kind": "postmark",
            "sealed": "gAAAAA...",
            "now": NOW,
            "actor": "cli",
        },
        rows=(0,),
    ),
    Operation(tenant_accounts.remove, {"tenant_id": TENANT}),
    Operation(tenant_accounts.sealed_one, {"tenant_id": TENANT}),
    Operation(tenant_accounts.listing),
    Operation(tenant_accounts.sealed_all),
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
    Operation(
        messages.events, {"message_id": IDS[0]}, summary="A message's history, oldest first."
    ),
    Operation(messages.count_by_status, summary="How many messages are in each status."),
    Operation(stats.oldest_due, {"now": NOW}),
    Operation(stats.outbox_gauges, {"now": NOW}),
    Operation(stats.sent_per_bucket, {"now": NOW, "buckets": 2}),
    Operation(stats.attempt_endings, {"since": NOW}),
    Operation(stats.oldest_unknown, summary="The messages longest in `unknown`, oldest first."),
    # Provider events and suppressions
    Operation(events.match, {"event": _EVENT}, rows=(0,)),  # not found by our id: by theirs
    Operation(events.store, {"event": _EVENT, "message": _message(), "now": NOW}, rows=(0,)),
    Operation(events.for_message, {"message": _message(provider_message_id="<p-1>")}),
    Operation(events.unmatched_count, summary="How many provider events matched no message."),
    Operation(
        suppressions.add,
        {"tenant_id": TENANT, "email": "ada@example.com", "reason": "hard_bounce", "now": NOW},
        rows=(0,),  # not suppressed yet
    ),
    Operation(
        suppressions.remove,
        {"tenant_id": TENANT, "email": "ada@example.com"},
        summary="Lift a suppression of an address.",
    ),
    Operation(
        suppressions.listing, {"tenant_id": TENANT}, summary="Suppressions, newest first, a page."
    ),
    Operation(suppressions.count, summary="How many addresses are suppressed."),
    Operation(suppressions.among, {"pairs": [(TENANT, "ada@example.com")]}),
    # Erasure of one person's data, and tenants' own retention
    Operation(
        erasure.begin,
        {
            "address": "ada@example.com",
            "address_hash": "erased:" + DIGEST,
            "tenant_id": TENANT,
            "now": NOW,
            "actor": "operator:cli",
        },
        rows=(0,),  # no unfinished erasure of it yet
        samples={"progress": {}},
    ),
    Operation(
        erasure.erase_messages,
        {
            "erasure_id": IDS[0],
            "address": "ada@example.com",
            "tenant_id": TENANT,
            "now": NOW,
            "actor": "operator:cli",
            "limit": 500,
        },
        samples={"progress": {}, "status": Status.PENDING.value, "previous_state": "pending"},
    ),
    Operation(
        erasure.erase_rows,
        {
            "erasure_id": IDS[0],
            "rows": next(r for r in erasure.OTHER_ROWS if r.table.name == "email_verifications"),
            "address": "ada@example.com",
            "tenant_id": TENANT,
            "now": NOW,
            "limit": 500,
        },
        samples={"progress": {}, "id": IDS[1]},
    ),
    Operation(erasure.held_messages, {"address": "ada@example.com", "tenant_id": None}),
    Operation(
        erasure.finish,
        {"erasure_id": IDS[0], "waiting": False, "now": NOW},
        samples={"progress": {}},
    ),
    Operation(erasure.get, {"erasure_id": IDS[0]}, samples={"progress": {}}),
    Operation(erasure.listing, samples={"progress": {}}),
    Operation(tenant_retention.put, {"tenant_id": TENANT, "purge_after_days": 90.0, "now": NOW}),
    Operation(tenant_retention.remove, {"tenant_id": TENANT}),
    Operation(tenant_retention.all_days),
    # Tenants' templates
    Operation(
        templates.publish,
        {
            "tenant_id": TENANT,
            "name": "welcome",
            "locale": "fr-CA",
            "draft": Draft("Bienvenue {{ name }}", "<p>Bonjour {{ name }}</p>", ""),
            "compiled_html": None,
            "dependencies": {"layout": 1},
            "changed_by": "api:t_sample",
            "now": NOW,
        },
    ),
    Operation(
        templates.rollback,
        {"tenant_id": TENANT, "name": "welcome", "locale": "fr-CA", "version": 1, "now": NOW},
        samples=_TEMPLATE_VERSION,
    ),
    Operation(
        templates.version_of,
        {"tenant_id": TENANT, "name": "welcome", "locale": "fr-CA", "version": 1},
        samples=_TEMPLATE_VERSION,
    ),
    Operation(
        templates.versions,
        {"tenant_id": TENANT, "name": "welcome", "locale": "fr-CA"},
        samples=_TEMPLATE_VERSION,
    ),
    Operation(templates.by_ids, {"ids": [1, 2]}, samples=_TEMPLATE_VERSION),
    Operation(templates.listing, {"tenant_id": TENANT, "names": ["welcome"]}),
    Operation(templates.current_ids, {"wanted": [(TENANT, "welcome"), (TENANT, "layout")]}),
    # Verifications
    Operation(
        verifications.create,
        {
            "values": _VERIFICATION,
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
    Operation(
        verifications.get,
        {"verification_id": IDS[0], "tenant_id": TENANT},
        summary="One verification of a tenant.",
    ),
    Operation(
        verifications.active_for,
        {"tenant_id": TENANT, "email": "ada@example.com"},
        summary="The verification of an address still under way, if any.",
    ),
    Operation(
        verifications.events,
        {"verification_id": IDS[0]},
        summary="A verification's history, oldest first.",
    ),
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
    # POST /v1/email-verifications with a new key: on PostgreSQL the lock and one statement
    # in one round trip
    Operation(
        first_use.verification,
        {
            "created": verifications.created_row(_VERIFICATION, now=NOW),
            "values": {
                "token_digest": DIGEST,
                "message_id": IDS[1],
                "send_count": 1,
                "confirm_attempts": 0,
            },
            "message_row": enqueue.first_use_row(_FIRST_USE_MESSAGE, NOW, 5),
            "record": _record("POST /v1/email-verifications"),
            "since": NOW - timedelta(hours=1),
            "per_email": 3,
            "per_tenant": 100,
            "now": NOW,
            "actor": "api",
            "detail": "email 1 enqueued",
        },
        samples={
            **{check.name: True for check in first_use.VERIFICATION_REQUEST.checks},
            **{write.name: write.rows for write in first_use.VERIFICATION_REQUEST.writes},
        },
    ),
    # Idempotency records
    Operation(
        idempotency.find,
        {"tenant_id": TENANT, "key": "k-1"},
        summary="The record a tenant's Idempotency-Key holds, if any.",
    ),
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
        summary="Store the response a key replays.",
    ),
    Operation(
        idempotency.purge_expired, {"now": NOW}, summary="Delete up to `limit` expired records."
    ),
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
        summary="A new tenant with its API key's digest.",
    ),
    Operation(
        tenants.by_key_digest, {"key_digest": "d"}, summary="The tenant an API key belongs to."
    ),
    Operation(tenants.by_name, {"name": "sample"}, summary="The tenant of this name."),
    Operation(tenants.named, {"tenant": "sample"}),
    Operation(tenants.all_tenants, summary="Every tenant, oldest first."),
    Operation(
        console_sessions.start,
        {"id_digest": "d", "password_fingerprint": "f", "now": NOW, "expires_at": NOW},
    ),
    Operation(
        console_sessions.is_live, {"id_digest": "d", "password_fingerprint": "f", "now": NOW}
    ),
    Operation(console_sessions.end, {"id_digest": "d"}, summary="End a session (sign out)."),
    Operation(deployment.record_key_check, {"key_check": "c", "now": NOW}),
    Operation(deployment.replace_key_check, {"key_check": "c", "now": NOW}),
    Operation(deployment.stored_key_check, summary="The stored SECRET_KEY check value."),
    # The fleet's send rate (PROVIDER_RATE)
    Operation(rate.reserve, {"provider": "brevo", "count": 100, "rate": 50.0, "cooldown": 60.0}),
    Operation(
        rate.throttle, {"provider": "brevo", "rate": 50.0, "cooldown": 60.0, "retry_after": 2.0}
    ),
    Operation(rate.schedule, {"provider": "brevo"}),
    # Recipient domains slowed after their deferrals (DOMAIN_SHAPING)
    Operation(domain_rates.shaped),
    Operation(domain_rates.reserve, {"domain": "example.com", "count": 5, "shaping": SHAPING}),
    Operation(
        domain_rates.defer,
        {"domain": "example.com", "shaping": SHAPING, "settle": 3.0},
        rows=(0,),  # its first deferral: the row is made
    ),
    Operation(domain_rates.schedule, {"domain": "example.com"}),
    Operation(domain_rates.forget, {"limit": 1000}),
    # The fleet's state: providers' breakers, operators' pauses (worker/fleet.py)
    Operation(fleet_state.read, summary="Every provider's breaker and every pause."),
    Operation(
        fleet_state.record,
        {
            "answered": {"main"},
            "failed": {"backup": (3, "connection refused")},
            "now": NOW,
            "breaker": Breaker(),
        },
    ),
    Operation(
        fleet_state.pause,
        {
            "scope": fleet_state.Scope.TENANT,
            "target": TENANT,
            "now": NOW,
            "actor": "cli",
            "reason": "r",
        },
    ),
    Operation(fleet_state.resume, {"scope": fleet_state.Scope.TENANT, "target": TENANT}),
    Operation(fleet_state.announce),
    # Sender domains and their DKIM keys (services/sender_domains.py)
    Operation(
        sender_domains.add,
        {
            "tenant_id": TENANT,
            "domain": "example.com",
            "key": _DKIM_KEY,
            "now": NOW,
            "actor": "cli",
        },
        rows=(0,),
    ),
    Operation(
        sender_domains.add_key,
        {"tenant_id": TENANT, "domain": "example.com", "key": _DKIM_KEY, "now": NOW},
    ),
    Operation(
        sender_domains.promote,
        {"tenant_id": TENANT, "domain": "example.com", "selector": "mb20261202"},
    ),
    Operation(sender_domains.remove, {"tenant_id": TENANT, "domain": "example.com"}),
    Operation(
        sender_domains.remove_key,
        {"tenant_id": TENANT, "domain": "example.com", "selector": "mb20261202"},
    ),
    Operation(
        sender_domains.one, {"tenant_id": TENANT, "domain": "example.com"}, samples=_DKIM_ROW
    ),
    Operation(sender_domains.listing, {"tenant_id": TENANT}, samples=_DKIM_ROW),
    Operation(
        sender_domains.record_check,
        {"tenant_id": TENANT, "domain": "example.com", "ready": True, "report": [], "now": NOW},
        samples=_DKIM_ROW,
    ),
    Operation(sender_domains.due, {"before": NOW, "limit": 50}),
    Operation(
        sender_domains.unready,
        {"messages": [_NEW_MESSAGE], "default_from": SENDER},
        samples=_DKIM_ROW,
    ),
    Operation(sender_domains.not_ready_count, samples={"count_1": 0}),
    Operation(sender_domains.signing_keys, samples=_DKIM_ROW),
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
    Operation(
        hooks.create_endpoint,
        {"endpoint": _HOOK_ENDPOINT, "sealed_secret": "sealed"},
        summary="A new hook endpoint, its secret sealed.",
    ),
    Operation(
        hooks.endpoint,
        {"endpoint_id": IDS[0], "tenant_id": TENANT},
        samples=_HOOK,
        summary="One hook endpoint (of a tenant).",
    ),
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
        hooks.settle,
        {
            "token": IDS[2],
            "results": [
                hooks.Attempted(IDS[0], DAction.RETRY, 503, "http-5xx: HTTP 503", NOW),
            ],
            "now": NOW,
            "actor": "worker-1",
            "breaker": Breaker(),
        },
        samples={
            **_HOOK,
            "status": DState.RETRYING.value,
            "previous_state": DState.PROCESSING.value,
            "failures_in_row": 5,
        },
    ),
    Operation(
        hooks.finalize_claims,
        {
            "claims": {
                IDS[2]: [
                    hooks.Attempted(IDS[0], DAction.DELIVER, status_code=204),
                    hooks.Attempted(IDS[1], DAction.RETRY, 503, "http-5xx: HTTP 503", NOW),
                ],
                IDS[1]: [hooks.Attempted(IDS[2], DAction.DELIVER, status_code=200)],
            },
            "now": NOW,
            "actor": "worker-1",
        },
        samples={**_HOOK, "previous_state": DState.PROCESSING.value},
    ),
    Operation(
        hooks.settle_claims,
        {
            "claims": {
                IDS[2]: [hooks.Attempted(IDS[0], DAction.DELIVER, status_code=204)],
                IDS[1]: [
                    hooks.Attempted(IDS[1], DAction.RETRY, 503, "http-5xx: HTTP 503", NOW),
                ],
            },
            "now": NOW,
            "actor": "worker-1",
            "breaker": Breaker(),
        },
        samples={
            **_HOOK,
            "status": DState.RETRYING.value,
            "previous_state": DState.PROCESSING.value,
            "failures_in_row": 5,
        },
    ),
    Operation(
        hooks.turn,
        {
            "claims": {IDS[2]: [hooks.Attempted(IDS[0], DAction.DELIVER, status_code=204)]},
            "worker_id": "worker-1",
            "now": NOW,
            "lease": timedelta(minutes=2),
            "limit": 10,
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
    "hooks.fan_out_config": "hooks.fan_out (a question to the connection, no SQL)",
    "suppressions.erasure_key": "suppressions.among, .remove (a question to the connection)",
    "suppressions.forms": "suppressions.remove, first_use.message (a question, no SQL)",
    "message_transitions.transition": "every message transition (claim, finalize, cancel...)",
    "transition.apply_transition": "message_transitions.transition, verifications.transition",
    "transition.guarded_update": "transition.apply_transition",
    "chain.run": "first_use.message, first_use.verification (one by one, or one statement)",
    "transition.record": "transition.apply_transition, enqueue, verifications.create",
    "attachments.store": "enqueue.enqueue",
    "attachments.attached": "attachments.refs, when a message carries any (claim, get, page)",
    "sender_domains.readiness": "sender_domains.unready",
    "sender_domains.require_ready": "sender_domains.unready (it raises the first refusal)",
    "rate.take_slots": "rate.reserve, domain_rates.reserve",
    "rate.lower": "rate.throttle, domain_rates.defer",
    "rate.read_schedule": "rate.schedule, domain_rates.schedule, domain_rates.defer",
    "rate.make_row": "rate.reserve, domain_rates.defer (a key's first row)",
}


# --- Writing docs/sql ---------------------------------------------------------------------

Entry = Operation | Statement


def record(entry: Entry, dialect: Dialect) -> list[str]:
    """The statements `entry` runs on `dialect`, readable, in order."""
    return entry.statements(dialect)


def groups() -> dict[str, list[Entry]]:
    """OPERATIONS by store module, modules in the order they first appear."""
    grouped: dict[str, list[Entry]] = {}
    for entry in OPERATIONS:
        grouped.setdefault(entry.name.split(".", 1)[0], []).append(entry)
    return grouped


def _comments(text: str) -> list[str]:
    """`text` as comment lines, wrapped between words."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= sqlrecorder.WIDTH:
            lines[-1] += f" {word}"
        else:
            lines.append(f"-- {word}")
    return lines


def _entry(entry: Entry, dialect: Dialect) -> list[str]:
    """An entry's part of a dialect's file: its header, then each statement it runs."""
    lines = [f"-- name: {entry.name} --", *_comments(entry.description)]
    statements = record(entry, dialect)
    if not statements:
        lines.append(f"-- No statement on {DATABASES[dialect]}: it runs none here.")
    for number, sql in enumerate(statements, 1):
        if len(statements) > 1:
            lines.append(f"-- step {number} of {len(statements)}")
        lines += sql.splitlines()
    return lines


def render(dialect: Dialect) -> tuple[str, dict[str, int]]:
    """A dialect's file, and the line each entry's header stands on."""
    lines = [
        f"-- The SQL mailbag runs on {DATABASES[dialect]}: every store operation's statements,",
        "-- in the order it runs them. The index with links is README.md in this directory.",
        f"-- Written by `{COMMAND}` from the store's plans; do not edit.",
        "-- Parameters are named (:name); a list is expanded (:ids_1, :ids_2) as the driver",
        "-- receives it. The values a plan was recorded with are samples: the SQL is its own.",
    ]
    if dialect == "postgresql":
        lines.append("-- psycopg also receives each parameter's type as a cast; left out here.")
    where: dict[str, int] = {}
    for module, entries in groups().items():
        lines += ["", "", f"-- === {module} {'=' * (86 - len(module))}"]
        for entry in entries:
            lines.append("")
            where[entry.name] = len(lines) + 1
            lines += _entry(entry, dialect)
    return "\n".join(lines) + "\n", where


_INDEX_HEAD = f"""# SQL, per database

Every statement mailbag's store runs, one file per database: [postgresql.sql](postgresql.sql),
[mysql.sql](mysql.sql) (MariaDB and MySQL) and [sqlite.sql](sqlite.sql), the way
procrastinate's `sql/queries.sql` is procrastinate's. Written by `{COMMAND}`
(`src/mailbag/sqldocs.py`) from the store's plans; do not edit. Run it after changing a plan
and commit the result with the change: `tests/test_sql_docs.py` fails when these files differ
from what the plans run, and when a store operation (a public function of `mailbag.store`
that returns a `Plan`) is missing from `sqldocs.OPERATIONS`, where each one has its sample
arguments.

## How to read a file

- Each operation stands under a `-- name: module.operation --` header (the module of
  `src/mailbag/store/` that holds it) with a one-line description (the first sentence of
  its docstring), then every statement it runs, in order (`-- step 1 of 3`).
- Statements are compiled for the database's driver as it receives them, with parameters
  by name (`:now`; those SQLAlchemy numbers itself, such as `param_1`, take the name of the
  column each is set to or compared with) and lists expanded (`:id_1, :id_2`); psycopg's
  casts (`::UUID`) are left out, and long lines are cut between words. A statement run
  once per row of a batch says so (`executemany`).
- A plan that branches on what the database answered is shown on its longest path: the
  generator answers each step with sample rows (MariaDB's claim reads a window of due ids,
  then locks among them, updates them and reads them back). An empty answer ends most plans
  early: a claim that finds nothing due runs only its first statement. An operation that
  runs nothing on a database says so.
- The same operation differs between databases where the databases differ (compare
  `dispatch.claim` on PostgreSQL, one statement, with MariaDB's); how and why is in the
  module docstrings of `store/transition.py` and `store/dispatch.py`.
- Statements a plan sends together, in one round trip (on PostgreSQL, a verification
  request's lock and its one statement: `first_use.verification`), are shown with the
  BEGIN and COMMIT that go with them.
"""


def index(lines: Mapping[Dialect, Mapping[str, int]]) -> str:
    """docs/sql/README.md: each operation, what it does, and its place in each file."""
    out = [_INDEX_HEAD]
    for module, entries in groups().items():
        out += [f"## {module}", "", "| Operation | What it does | SQL |", "|---|---|---|"]
        for entry in entries:
            links = " · ".join(
                f"[{name}]({d}.sql#L{lines[d][entry.name]})" for d, name in DATABASES.items()
            )
            out.append(f"| `{entry.name}` | {entry.description} | {links} |")
        out.append("")
    out += [
        "## Parts",
        "",
        "Plans that are parts of the operations above, not operations of their own: their",
        "SQL shows under the operations that run them.",
        "",
        "| Part | Shows under |",
        "|---|---|",
        *(f"| `{part}` | {where} |" for part, where in PARTS.items()),
    ]
    return "\n".join(out) + "\n"


def write(directory: Path) -> list[Path]:
    """Write each dialect's file and the index into `directory`; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written, lines = [], {}
    for dialect in DATABASES:
        text, lines[dialect] = render(dialect)
        path = directory / f"{dialect}.sql"
        path.write_text(text)
        written.append(path)
    readme = directory / "README.md"
    readme.write_text(index(lines))
    return [*written, readme]


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
    for stale in [*DOCS.glob("*.sql"), DOCS / "README.md"]:
        stale.unlink(missing_ok=True)
    written = write(DOCS)
    print(f"wrote {len(written)} files to {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
