"""The tables, as SQLAlchemy Core metadata.

`metadata` is what statements are built from. Where a database lacks partial indexes
(MariaDB/MySQL), `metadata_for("mysql")` adds the generated columns that emulate them; the
migration creates exactly `metadata_for(<its dialect>)`, and a test proves it.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Computed,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.schema import SchemaItem

from mailbag.domain import content, dkim
from mailbag.domain import hooks as hook_rules
from mailbag.domain import message as limits
from mailbag.domain import templates as template_rules
from mailbag.domain.hooks.urls import URL_MAX
from mailbag.domain.states import CLAIMABLE, TERMINAL, Status
from mailbag.domain.verification import ACTIVE, UNFINISHED, VState
from mailbag.store.types import (
    UTCDateTime,
    bigint_pk,
    json_type,
    long_binary,
    long_json,
    long_text,
)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
STATUS_LENGTH = 16


def _sql_list(states: Iterable[StrEnum]) -> str:
    return ", ".join(f"'{state.value}'" for state in sorted(states))


CLAIMABLE_SQL = f"status IN ({_sql_list(CLAIMABLE)})"
STATUS_CHECK_SQL = f"status IN ({_sql_list(set(Status))})"
PROCESSING_SQL = f"status = '{Status.PROCESSING.value}'"
TERMINAL_SQL = f"status IN ({_sql_list(TERMINAL)})"
V_ACTIVE_SQL = f"state IN ({_sql_list(ACTIVE)})"
V_UNFINISHED_SQL = f"state IN ({_sql_list(UNFINISHED)})"
V_STATE_CHECK_SQL = f"state IN ({_sql_list(set(VState))})"
HOOK_CLAIMABLE_SQL = f"status IN ({_sql_list(hook_rules.CLAIMABLE_DELIVERIES)})"
HOOK_STATUS_CHECK_SQL = f"status IN ({_sql_list(set(hook_rules.DState))})"
HOOK_PROCESSING_SQL = f"status = '{hook_rules.DState.PROCESSING.value}'"


# MariaDB/MySQL compare text byte for byte, as PostgreSQL and SQLite do (migration 0013):
# their default utf8mb4 collations ignore case and accents, which made `Order-1` and
# `order-1` one Idempotency-Key and a suppression of `adá@` block `ada@`; and utf8mb4_bin
# still pads, calling `k-1` and `k-1 ` equal. Each server's no-pad binary collation:
EXACT = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}
# The one column compared without case on purpose: a recipient (messages.SameAddress).
CASELESS = "utf8mb4_general_ci"


def _table(name: str, md: MetaData, *items: SchemaItem) -> Table:
    """Every table: InnoDB with full UTF-8 on MariaDB/MySQL. (Migrations make the tables
    there, and give them EXACT, which depends on the server.)"""
    return Table(name, md, *items, mysql_engine="InnoDB", mysql_charset="utf8mb4")


def _where(predicate: str) -> dict[str, Any]:
    """A partial index's predicate (PostgreSQL and SQLite; MariaDB has generated columns)."""
    return {"postgresql_where": text(predicate), "sqlite_where": text(predicate)}


def _history(
    md: MetaData, name: str, subject: str, parent: str, states: tuple[str, str], *extra: SchemaItem
) -> Table:
    """The record of every move of one kind of row (see store/transition.py)."""
    from_state, to_state = states
    return _table(
        name,
        md,
        Column("id", bigint_pk(), primary_key=True, autoincrement=True),
        Column(subject, Uuid, ForeignKey(f"{parent}.id", ondelete="CASCADE"), nullable=False),
        Column(from_state, String(STATUS_LENGTH)),
        Column(to_state, String(STATUS_LENGTH), nullable=False),
        Column("at", UTCDateTime, nullable=False),
        Column("actor", String(200), nullable=False),
        Index(None, subject, "id"),
        *extra,
    )


def _outbox_messages(md: MetaData, dialect: str | None) -> Table:
    table = _table(
        "outbox_messages",
        md,
        Column("id", Uuid, primary_key=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("idempotency_key", String(limits.IDEMPOTENCY_KEY_MAX)),
        Column("to_address", _recipient_type(dialect), nullable=False),
        Column("to_name", String(limits.NAME_MAX)),
        Column("from_address", String(limits.ADDRESS_MAX)),
        Column("subject", String(limits.SUBJECT_MAX)),
        Column("template_name", String(limits.TEMPLATE_NAME_MAX)),  # NULL: ready-made
        Column("template_data", json_type(), nullable=False),
        Column("headers", json_type(), nullable=False),
        Column("tags", json_type(), nullable=False),
        Column("metadata", json_type(), nullable=False),
        Column("status", String(STATUS_LENGTH), nullable=False),
        Column("attempt_count", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("next_attempt_at", UTCDateTime, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("claim_token", Uuid),
        Column("claimed_by", String(200)),
        Column("claimed_at", UTCDateTime),
        Column("lease_expires_at", UTCDateTime),
        Column("provider", String(50)),
        Column("provider_message_id", String(255)),
        Column("last_error", String(limits.ERROR_MAX)),
        Column("sent_at", UTCDateTime),
        # Set while retries reuse one provider idempotency key after an ambiguous send: the
        # retry is only safe while the provider still remembers that key.
        Column("ambiguous_since", UTCDateTime),
        # What a message can carry beyond one To and a template (migration 0006): recipients,
        # reply-to, sender name, ready-made html/text, unsubscribe, suppressed recipients, as
        # one JSON object (message_transitions.carried_json); NULL for a plain message, so
        # the common case reads and writes one NULL, not eight.
        Column("carried", long_json()),
        Column("expires_at", UTCDateTime),
        Column("priority", SmallInteger, nullable=False, server_default="0"),
        # next_attempt_at less the priority's head start (content.HEAD_START): claim order.
        Column("claim_order_at", UTCDateTime),
        # How many message_attachments rows it has: a claim reads them only when some do.
        Column("attachment_count", SmallInteger, nullable=False, server_default="0"),
        # Bulk mail, not transactional (NewMessage.bulk): its own lane in the claim.
        Column("bulk", Boolean, nullable=False, server_default="0"),
        # Its template version (migration 0021; NULL: ready-made, or a file template):
        # columns, not `carried`, as every claim reads them.
        Column("template_version_id", BigInteger),
        Column("template_version", Integer),
        Column("template_locale", String(template_rules.LOCALE_MAX)),
        CheckConstraint(STATUS_CHECK_SQL, name="status"),
        CheckConstraint("attempt_count >= 0", name="attempt_count"),
        Index(None, "tenant_id", "idempotency_key", unique=True),
        Index(None, "tenant_id", "created_at", "id"),
        Index(None, "status", "updated_at"),
        Index(None, "provider_message_id"),
        Index(None, "to_address"),
    )
    if not _is_mysql(dialect):
        # A tenant's messages to one recipient (`GET /v1/messages?to=`) compare lower-cased
        # addresses; without this index that filter read the whole table (1.3 s at 10^6 rows).
        # MariaDB has no expression indexes: it reads the plain to_address index instead
        # (messages.SameAddress).
        Index(  # bound to the table by its columns
            "ix_outbox_messages_tenant_id_lower_to_address",
            table.c.tenant_id,
            func.lower(table.c.to_address),
        )
    _queue_indexes(table, dialect, "claim_order_at", CLAIMABLE_SQL, PROCESSING_SQL)
    _lane_index(table, dialect)
    # The purge (operator.purge) takes the oldest finished rows in updated_at order, chunk by
    # chunk: (status, updated_at) cannot give that order across five states, so each chunk
    # sorted every finished row past the cutoff (2.2 s a chunk with 2.5 * 10^6 of them).
    # MariaDB (no partial indexes): updated_at order, the state checked in the index itself.
    if _is_mysql(dialect):
        Index(None, table.c.updated_at, table.c.status)
    else:
        Index(f"ix_{table.name}_finished_updated_at", table.c.updated_at, **_where(TERMINAL_SQL))
    return table


def _recipient_type(dialect: str | None) -> String:
    if _is_mysql(dialect):
        return mysql.VARCHAR(limits.ADDRESS_MAX, collation=CASELESS)
    return String(limits.ADDRESS_MAX)


def _queue_indexes(
    table: Table, dialect: str | None, order_at: str, claimable: str, processing: str
) -> None:
    """The two indexes of a table that workers claim from under a lease: the due rows in
    claim order (`order_at`, id), and the leased ones by expiry (the sweep).

    MariaDB has no partial indexes: it indexes a generated column that is NULL unless the
    row is claimable, so the claim reads due rows in order and never touches the (many)
    finished ones."""
    if _is_mysql(dialect):
        table.append_column(
            Column(
                "claimable_at",
                UTCDateTime,
                Computed(f"CASE WHEN {claimable} THEN {order_at} END", persisted=True),
            )
        )
        Index(None, table.c.claimable_at, table.c.id)
        Index(None, table.c.status, table.c.lease_expires_at)
    else:
        Index(f"ix_{table.name}_claimable", table.c[order_at], table.c.id, **_where(claimable))
        Index(f"ix_{table.name}_leased", table.c.lease_expires_at, **_where(processing))


def _lane_index(table: Table, dialect: str | None) -> None:
    """The claimable messages by lane (tenant, bulk) in claim order: the fair claim
    (store/fair.py) finds the tenants with claimable mail one index probe each, and each
    lane's head in order. MariaDB: over a generated column that is the tenant of a
    claimable row and NULL otherwise, so that the finished rows are out of the way."""
    if _is_mysql(dialect):
        table.append_column(
            Column(
                "claimable_tenant",
                String(limits.TENANT_ID_MAX),
                Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN tenant_id END", persisted=True),
            )
        )
        Index(None, table.c.claimable_tenant, table.c.bulk, table.c.claimable_at, table.c.id)
    else:
        Index(
            "ix_outbox_messages_lanes",
            table.c.tenant_id,
            table.c.bulk,
            table.c.claim_order_at,
            table.c.id,
            **_where(CLAIMABLE_SQL),
        )


def _message_events(md: MetaData) -> Table:
    return _history(
        md,
        "message_events",
        "message_id",
        "outbox_messages",
        ("from_status", "to_status"),
        Column("attempt", Integer, nullable=False),
        Column("provider_message_id", String(255)),
        Column("detail", String(limits.ERROR_MAX)),
        Index(None, "to_status", "at"),
    )


def _tenants(md: MetaData) -> Table:
    return _table(
        "tenants",
        md,
        Column("id", String(limits.TENANT_ID_MAX), primary_key=True),
        Column("name", String(200), nullable=False),
        Column("api_key_digest", String(64), nullable=False),
        Column("api_key_prefix", String(16), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Index(None, "name", unique=True),
        Index(None, "api_key_digest", unique=True),
    )


def _idempotency_records(md: MetaData) -> Table:
    return _table(
        "idempotency_records",
        md,
        Column("id", bigint_pk(), primary_key=True, autoincrement=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("idempotency_key", String(limits.IDEMPOTENCY_KEY_MAX), nullable=False),
        Column("operation", String(100), nullable=False),
        Column("fingerprint", String(64), nullable=False),
        Column("resource_id", String(64)),
        Column("response_status", Integer),
        Column("response_body", json_type()),
        Column("created_at", UTCDateTime, nullable=False),
        Column("expires_at", UTCDateTime, nullable=False),
        Index(None, "tenant_id", "idempotency_key", unique=True),
        Index(None, "expires_at"),
    )


def _email_verifications(md: MetaData, dialect: str | None) -> Table:
    table = _table(
        "email_verifications",
        md,
        Column("id", Uuid, primary_key=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("email", String(limits.ADDRESS_MAX), nullable=False),
        Column("state", String(STATUS_LENGTH), nullable=False),
        Column("token_digest", String(64), nullable=False),
        Column("expires_at", UTCDateTime, nullable=False),
        Column("confirm_attempts", Integer, nullable=False),
        Column("send_count", Integer, nullable=False),
        Column("message_id", Uuid),
        Column("template_name", String(limits.TEMPLATE_NAME_MAX), nullable=False),
        Column("redirect_url", String(2000)),
        Column("locale", String(template_rules.LOCALE_MAX)),  # its emails' (migration 0021)
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("sent_at", UTCDateTime),
        Column("verified_at", UTCDateTime),
        CheckConstraint(V_STATE_CHECK_SQL, name="state"),
        Index(None, "message_id"),
        Index(None, "tenant_id", "email", "created_at"),
    )
    if _is_mysql(dialect):
        # The partial unique index of the other databases, emulated: NULL (never a
        # duplicate) unless the verification is active.
        table.append_column(
            Column(
                "active_email",
                String(limits.ADDRESS_MAX),
                Computed(f"CASE WHEN {V_ACTIVE_SQL} THEN email END", persisted=True),
            )
        )
        Index(None, table.c.tenant_id, table.c.active_email, unique=True)
    else:
        Index(
            "ix_email_verifications_active_email",
            table.c.tenant_id,
            table.c.email,
            unique=True,
            **_where(V_ACTIVE_SQL),
        )
    # The scheduler's expiry of stale verifications (services/maintenance.py) finds the
    # unfinished ones whose time is up without reading the finished majority.
    if _is_mysql(dialect):
        Index(None, table.c.state, table.c.expires_at)
    else:
        Index(
            "ix_email_verifications_unfinished_expiry",
            table.c.expires_at,
            **_where(V_UNFINISHED_SQL),
        )
    return table


def _verification_events(md: MetaData) -> Table:
    return _history(
        md,
        "verification_events",
        "verification_id",
        "email_verifications",
        ("from_state", "to_state"),
        Column("message_id", Uuid),
        Column("detail", String(limits.ERROR_MAX)),
    )


def _verification_sends(md: MetaData) -> Table:
    """One row per verification email sent: what the send limits count."""
    return _table(
        "verification_sends",
        md,
        Column("id", bigint_pk(), primary_key=True, autoincrement=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("email", String(limits.ADDRESS_MAX), nullable=False),
        Column("verification_id", Uuid, nullable=False),
        Column("at", UTCDateTime, nullable=False),
        Index(None, "tenant_id", "email", "at"),
        Index(None, "tenant_id", "at"),
    )


def _verification_send_counts(md: MetaData) -> Table:
    """A tenant's verification sends per minute: its hourly limit sums at most 61 rows
    instead of counting every send of the hour (one row per send grows with traffic)."""
    return _table(
        "verification_send_counts",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), primary_key=True),
        Column("minute", UTCDateTime, primary_key=True),
        Column("n", Integer, nullable=False),
    )


def _provider_events(md: MetaData) -> Table:
    """Delivery events from providers' webhooks, raw payload kept, one row per event."""
    return _table(
        "provider_events",
        md,
        Column("id", bigint_pk(), primary_key=True, autoincrement=True),
        Column("provider", String(20), nullable=False),
        Column("dedup_key", String(100), nullable=False),
        Column("kind", String(20), nullable=False),
        Column("bounce_type", String(10)),
        Column("provider_event", String(50), nullable=False),
        Column("occurred_at", UTCDateTime, nullable=False),
        Column("received_at", UTCDateTime, nullable=False),
        Column("provider_message_id", String(255)),
        Column("message_id", Uuid),  # ours, when the event could be matched to a message
        Column("tenant_id", String(limits.TENANT_ID_MAX)),
        Column("recipient", String(limits.ADDRESS_MAX)),
        Column("detail", String(limits.ERROR_MAX)),
        Column("raw", json_type(), nullable=False),
        Index(None, "dedup_key", unique=True),
        Index(None, "message_id"),
        Index(None, "provider_message_id"),
        Index(None, "received_at"),
    )


def _suppressions(md: MetaData) -> Table:
    """Addresses a tenant must not send to (hard bounces, complaints, operators' choice)."""
    return _table(
        "suppressions",
        md,
        Column("id", bigint_pk(), primary_key=True, autoincrement=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("email", String(limits.ADDRESS_MAX), nullable=False),  # lower case
        Column("reason", String(50), nullable=False),
        Column("detail", String(limits.ERROR_MAX)),
        Column("source_event_id", BigInteger),
        Column("created_at", UTCDateTime, nullable=False),
        Index(None, "tenant_id", "email", unique=True),
    )


def _console_sessions(md: MetaData) -> Table:
    """Operators logged in to the console. A row is a live session: logout deletes it, so
    it ends on every API replica at once. The id is the digest of the cookie's secret, so a
    database reader cannot take over a session."""
    return _table(
        "console_sessions",
        md,
        Column("id_digest", String(64), primary_key=True),  # hex SHA-256 of the secret
        # HMAC of ADMIN_PASSWORD under the deployment key: a new password ends the session.
        Column("password_fingerprint", String(64), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("expires_at", UTCDateTime, nullable=False),
        Index(None, "expires_at"),
    )


def _deployment(md: MetaData) -> Table:
    """One row about the deployment: a check value of the secret key, recorded by the first
    process to start, so a replica started with another key refuses to (an HMAC under a
    subkey: it says nothing about the key)."""
    return _table(
        "deployment",
        md,
        Column("id", Integer, primary_key=True, autoincrement=False),  # always 1
        Column("key_check", String(64), nullable=False),  # hex HMAC-SHA256
        Column("created_at", UTCDateTime, nullable=False),  # when key_check was recorded
        CheckConstraint("id = 1", name="one_row"),
    )


def _provider_rates(md: MetaData) -> Table:
    """Each provider's send schedule under PROVIDER_RATE, shared by the fleet (domain.rate):
    the first free slot and the lowered rate after a throttle, in the database's time
    (seconds since the epoch). One row per provider, written once per claimed batch."""
    return _table(
        "provider_rates",
        md,
        Column("provider", String(20), primary_key=True),
        Column("next_slot_at", Double, nullable=False),
        Column("lowered_rate", Double, nullable=False),
        Column("lowered_until", Double, nullable=False),
        Column("settles_at", Double, nullable=False),
    )


def _recipient_domain_rates(md: MetaData) -> Table:
    """Each recipient domain's send schedule while DOMAIN_SHAPING slows it (domain.
    domain_shaping): provider_rates' columns, one row per domain that ever deferred, made
    by its first deferral. Workers read the rows still lowered (`lowered_until` ahead) once
    a poll interval."""
    return _table(
        "recipient_domain_rates",
        md,
        Column("domain", String(253), primary_key=True),
        Column("next_slot_at", Double, nullable=False),
        Column("lowered_rate", Double, nullable=False),
        Column("lowered_until", Double, nullable=False),
        Column("settles_at", Double, nullable=False),
        Index("ix_recipient_domain_rates_lowered_until", "lowered_until"),
    )


def _provider_health(md: MetaData) -> Table:
    """Each configured provider's breaker, shared by the fleet (store/fleet_state.py): sure
    failures in a row, and until when messages wait for it instead of being sent to it."""
    return _table(
        "provider_health",
        md,
        Column("name", String(100), primary_key=True),
        Column("failures_in_row", Integer, nullable=False),
        Column("open_until", UTCDateTime),
        Column("last_error", String(limits.ERROR_MAX)),
        Column("updated_at", UTCDateTime, nullable=False),
    )


def _pauses(md: MetaData) -> Table:
    """What operators paused (`mailbag pause`): the whole fleet (target ''), a provider or a
    tenant. Paused mail waits, no attempt spent, until it is resumed."""
    return _table(
        "pauses",
        md,
        Column("scope", String(STATUS_LENGTH), primary_key=True),
        Column("target", String(200), primary_key=True),
        Column("paused_at", UTCDateTime, nullable=False),
        Column("paused_by", String(200), nullable=False),
        Column("reason", String(500)),
    )


def _attachments(md: MetaData) -> Table:
    """Attachment bytes, once each whatever the number of messages that carry them: the
    key is their SHA-256. `purge` deletes the rows no message references any more."""
    return _table(
        "attachments",
        md,
        Column("sha256", String(64), primary_key=True),  # hex
        Column("size", BigInteger, nullable=False),
        Column("content", long_binary(), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
    )


def _message_attachments(md: MetaData) -> Table:
    """Which attachments a message carries, in order, under which name and type."""
    return _table(
        "message_attachments",
        md,
        Column(
            "message_id",
            Uuid,
            ForeignKey("outbox_messages.id", ondelete="CASCADE"),
            nullable=False,
        ),
        Column("position", Integer, nullable=False),
        Column("sha256", String(64), ForeignKey("attachments.sha256"), nullable=False),
        Column("filename", String(content.FILENAME_MAX), nullable=False),
        Column("content_type", String(content.CONTENT_TYPE_MAX), nullable=False),
        Column("content_id", String(content.CONTENT_ID_MAX)),
        PrimaryKeyConstraint("message_id", "position"),
        Index(None, "sha256"),
    )


def _tenant_senders(md: MetaData) -> Table:
    """The From addresses a tenant may send from (`mailbag tenants senders add`)."""
    return _table(
        "tenant_senders",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("address", String(limits.ADDRESS_MAX), nullable=False),
        Column("name", String(limits.NAME_MAX)),
        Column("created_at", UTCDateTime, nullable=False),
        PrimaryKeyConstraint("tenant_id", "address"),
    )


def _tenant_accounts(md: MetaData) -> Table:
    """A tenant's own provider account, at most one (services/tenant_accounts.py): its kind
    (a provider's name) and that kind's settings, sealed as a whole under a key derived
    from SECRET_KEY, never in clear (they hold the account's credentials)."""
    return _table(
        "tenant_accounts",
        md,
        Column(
            "tenant_id",
            String(limits.TENANT_ID_MAX),
            ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        Column("kind", String(100), nullable=False),
        Column("sealed_settings", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("updated_by", String(200), nullable=False),
    )


def _sender_domains(md: MetaData) -> Table:
    """The domains a tenant sends from with its own DKIM keys (services/sender_domains.py),
    and what their last check of DNS found: `ready` (NULL: never checked), the findings
    (`report`), and since when it has been as it is (`ready_since`)."""
    return _table(
        "sender_domains",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("domain", String(dkim.DOMAIN_MAX), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("created_by", String(200), nullable=False),
        Column("ready", Boolean),
        Column("checked_at", UTCDateTime),
        Column("ready_since", UTCDateTime),
        Column("report", json_type()),
        PrimaryKeyConstraint("tenant_id", "domain"),
        Index(None, "checked_at"),
    )


def _dkim_keys(md: MetaData) -> Table:
    """A sender domain's DKIM keys by selector: the one `signing`, during a rotation the
    `next` one, and `retired` ones still published. The private key is sealed under a key
    derived from SECRET_KEY, never in clear."""
    return _table(
        "dkim_keys",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("domain", String(dkim.DOMAIN_MAX), nullable=False),
        Column("selector", String(63), nullable=False),
        Column("algorithm", String(20), nullable=False),
        Column("state", String(STATUS_LENGTH), nullable=False),
        Column("public_key", Text, nullable=False),
        Column("sealed_private_key", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        PrimaryKeyConstraint("tenant_id", "domain", "selector"),
        ForeignKeyConstraint(
            ["tenant_id", "domain"],
            ["sender_domains.tenant_id", "sender_domains.domain"],
            ondelete="CASCADE",
        ),
    )


def _hook_endpoints(md: MetaData) -> Table:
    """Where a tenant's event hooks go (domain/hooks.py). `events` holds the subscribed
    names between commas (`,sent,bounced,`); `secret` is the signing secret sealed with
    HOOKS_KEY (domain.hooks.SecretBox), never the secret itself."""
    return _table(
        "hook_endpoints",
        md,
        Column("id", Uuid, primary_key=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("url", String(URL_MAX), nullable=False),
        Column("events", String(200), nullable=False),
        Column("enabled", Boolean, nullable=False),
        Column("description", String(hook_rules.DESCRIPTION_MAX)),
        Column("secret", String(500), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        # The breaker (store/hooks.py): failed attempts in a row, and until when the
        # endpoint's deliveries wait.
        Column("failures_in_row", Integer, nullable=False, server_default="0"),
        Column("paused_until", UTCDateTime),
        Index(None, "tenant_id", "created_at"),
    )


def _hook_deliveries(md: MetaData, dialect: str | None) -> Table:
    """One event for one endpoint, delivered through an outbox of its own (store/hooks.py).
    No foreign key to its endpoint: the fan-out writes deliveries in the transaction of a
    message's change and must never fail it because an endpoint was deleted meanwhile (a
    claim only takes deliveries of an endpoint that exists and is enabled)."""
    table = _table(
        "hook_deliveries",
        md,
        Column("id", Uuid, primary_key=True),
        Column("endpoint_id", Uuid, nullable=False),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("event", String(30), nullable=False),
        Column("message_id", Uuid, nullable=False),
        Column("webhook_id", String(40), nullable=False),  # same for every retry and replay
        Column("payload", long_text(), nullable=False),  # the exact body of every attempt
        Column("status", String(STATUS_LENGTH), nullable=False),
        Column("attempts", Integer, nullable=False),
        Column("max_attempts", Integer, nullable=False),
        Column("next_attempt_at", UTCDateTime, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("delivered_at", UTCDateTime),
        Column("claim_token", Uuid),
        Column("claimed_by", String(200)),
        Column("lease_expires_at", UTCDateTime),
        Column("last_status_code", Integer),
        Column("last_error", String(limits.ERROR_MAX)),
        CheckConstraint(HOOK_STATUS_CHECK_SQL, name="status"),
        Index(None, "tenant_id", "created_at", "id"),
        Index(None, "endpoint_id", "created_at"),
        Index(None, "message_id"),
        Index(None, "webhook_id"),
    )
    _queue_indexes(table, dialect, "next_attempt_at", HOOK_CLAIMABLE_SQL, HOOK_PROCESSING_SQL)
    return table


def _hook_delivery_events(md: MetaData) -> Table:
    return _history(
        md,
        "hook_delivery_events",
        "delivery_id",
        "hook_deliveries",
        ("from_status", "to_status"),
        Column("attempt", Integer, nullable=False),
        Column("status_code", Integer),
        Column("detail", String(limits.ERROR_MAX)),
    )


def _erasures(md: MetaData) -> Table:
    """Erasures of one person's data (`mailbag erase`, store/erasure.py): which address (its
    keyed hash, never the address), of one tenant or all (NULL), how far it got (rows erased
    per table, written with each chunk), so an interrupted erasure resumes when run again."""
    return _table(
        "erasures",
        md,
        Column("id", Uuid, primary_key=True),
        Column("tenant_id", String(limits.TENANT_ID_MAX)),  # NULL: every tenant
        Column("address_hash", String(100), nullable=False),
        Column("state", String(STATUS_LENGTH), nullable=False),
        Column("progress", json_type(), nullable=False),
        Column("requested_at", UTCDateTime, nullable=False),
        Column("requested_by", String(200), nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("finished_at", UTCDateTime),
        Index(None, "address_hash", "tenant_id"),
    )


def _tenant_retention(md: MetaData) -> Table:
    """A tenant's own PURGE_AFTER_DAYS (`mailbag tenants retention`): its finished messages
    are purged after this many days instead of the setting's (0: never). No foreign key:
    the `default` tenant has no row in `tenants` and may have one here."""
    return _table(
        "tenant_retention",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), primary_key=True),
        Column("purge_after_days", Double, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
    )


def _templates(md: MetaData) -> Table:
    """Tenants' own templates (domain/templates.py): one row per name, with the locale a
    message falls back to."""
    return _table(
        "templates",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("name", String(limits.TEMPLATE_NAME_MAX), nullable=False),
        Column("default_locale", String(template_rules.LOCALE_MAX), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        PrimaryKeyConstraint("tenant_id", "name"),
    )


def _template_locales(md: MetaData) -> Table:
    """A template's locales: the version each makes current, and the latest one."""
    return _table(
        "template_locales",
        md,
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("name", String(limits.TEMPLATE_NAME_MAX), nullable=False),
        Column("locale", String(template_rules.LOCALE_MAX), nullable=False),
        Column("current_version", Integer, nullable=False),
        Column("current_version_id", BigInteger, nullable=False),
        Column("latest_version", Integer, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        PrimaryKeyConstraint("tenant_id", "name", "locale"),
        ForeignKeyConstraint(
            ["tenant_id", "name"], ["templates.tenant_id", "templates.name"], ondelete="CASCADE"
        ),
    )


def _template_versions(md: MetaData) -> Table:
    """Every version ever published, never updated: messages name theirs by `id`, a random
    62-bit number (store/templates.py says why)."""
    return _table(
        "template_versions",
        md,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("tenant_id", String(limits.TENANT_ID_MAX), nullable=False),
        Column("name", String(limits.TEMPLATE_NAME_MAX), nullable=False),
        Column("locale", String(template_rules.LOCALE_MAX), nullable=False),
        Column("version", Integer, nullable=False),
        Column("format", String(10), nullable=False),
        Column("subject", Text, nullable=False),
        Column("html", long_text(), nullable=False),
        Column("text", long_text(), nullable=False),
        # An MJML version's html compiled to HTML (with its Jinja), once, when published:
        # workers never need the compiler. NULL for a Jinja version.
        Column("compiled_html", long_text()),
        Column("sample_data", json_type(), nullable=False),
        Column("dependencies", json_type(), nullable=False),
        Column("changed_by", String(200), nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Index(None, "tenant_id", "name", "locale", "version", unique=True),
        ForeignKeyConstraint(
            ["tenant_id", "name"], ["templates.tenant_id", "templates.name"], ondelete="CASCADE"
        ),
    )


def _is_mysql(dialect: str | None) -> bool:
    return dialect in ("mysql", "mariadb")


def build_metadata(dialect: str | None = None) -> MetaData:
    md = MetaData(naming_convention=NAMING)
    _outbox_messages(md, dialect)
    _message_events(md)
    _tenants(md)
    _idempotency_records(md)
    _email_verifications(md, dialect)
    _verification_events(md)
    _verification_sends(md)
    _verification_send_counts(md)
    _provider_events(md)
    _suppressions(md)
    _console_sessions(md)
    _deployment(md)
    _provider_rates(md)
    _recipient_domain_rates(md)
    _provider_health(md)
    _pauses(md)
    _attachments(md)
    _message_attachments(md)
    _tenant_senders(md)
    _tenant_accounts(md)
    _sender_domains(md)
    _dkim_keys(md)
    _hook_endpoints(md)
    _hook_deliveries(md, dialect)
    _hook_delivery_events(md)
    _erasures(md)
    _tenant_retention(md)
    _templates(md)
    _template_locales(md)
    _template_versions(md)
    return md


metadata = build_metadata()
outbox_messages = metadata.tables["outbox_messages"]
message_events = metadata.tables["message_events"]
tenants = metadata.tables["tenants"]
idempotency_records = metadata.tables["idempotency_records"]
email_verifications = metadata.tables["email_verifications"]
verification_events = metadata.tables["verification_events"]
verification_sends = metadata.tables["verification_sends"]
verification_send_counts = metadata.tables["verification_send_counts"]
provider_rates = metadata.tables["provider_rates"]
recipient_domain_rates = metadata.tables["recipient_domain_rates"]
provider_health = metadata.tables["provider_health"]
pauses = metadata.tables["pauses"]
provider_events = metadata.tables["provider_events"]
suppressions = metadata.tables["suppressions"]
console_sessions = metadata.tables["console_sessions"]
deployment = metadata.tables["deployment"]
attachments = metadata.tables["attachments"]
message_attachments = metadata.tables["message_attachments"]
tenant_senders = metadata.tables["tenant_senders"]
tenant_accounts = metadata.tables["tenant_accounts"]
sender_domains = metadata.tables["sender_domains"]
dkim_keys = metadata.tables["dkim_keys"]
hook_endpoints = metadata.tables["hook_endpoints"]
hook_deliveries = metadata.tables["hook_deliveries"]
hook_delivery_events = metadata.tables["hook_delivery_events"]
erasures = metadata.tables["erasures"]
tenant_retention = metadata.tables["tenant_retention"]
templates_table = metadata.tables["templates"]
template_locales = metadata.tables["template_locales"]
template_versions = metadata.tables["template_versions"]
_mysql_metadata = build_metadata("mysql")


def metadata_for(dialect: str) -> MetaData:
    return _mysql_metadata if _is_mysql(dialect) else metadata
