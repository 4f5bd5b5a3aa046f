"""The outbox: outbox_messages and message_events.

Revision ID: 0001_outbox
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime, bigint_pk, json_type

revision = "0001_outbox"
down_revision = None
branch_labels = None
depends_on = None

# Snapshots of the SQL fragments in mailbag.store.schema as of this revision.
CLAIMABLE_SQL = "status IN ('pending', 'retrying')"
PROCESSING_SQL = "status = 'processing'"
STATUS_CHECK_SQL = (
    "status IN ('cancelled', 'dead', 'failed', 'pending', 'processing', 'retrying', 'sent', "
    "'unknown')"
)


def upgrade() -> None:
    mysql = op.get_bind().dialect.name in ("mysql", "mariadb")
    generated: list[sa.Column[object]] = (
        [
            sa.Column(
                "claimable_at",
                UTCDateTime(),
                sa.Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN next_attempt_at END", persisted=True),
            )
        ]
        if mysql
        else []
    )
    op.create_table(
        "outbox_messages",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("to_address", sa.String(255), nullable=False),
        sa.Column("to_name", sa.String(255)),
        sa.Column("from_address", sa.String(255)),
        sa.Column("subject", sa.String(500)),
        sa.Column("template_name", sa.String(100), nullable=False),
        sa.Column("template_data", json_type(), nullable=False),
        sa.Column("headers", json_type(), nullable=False),
        sa.Column("tags", json_type(), nullable=False),
        sa.Column("metadata", json_type(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("claim_token", sa.Uuid()),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("claimed_at", UTCDateTime()),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("provider", sa.String(50)),
        sa.Column("provider_message_id", sa.String(255)),
        sa.Column("last_error", sa.String(2000)),
        sa.Column("sent_at", UTCDateTime()),
        sa.Column("ambiguous_since", UTCDateTime()),
        *generated,
        sa.PrimaryKeyConstraint("id", name="pk_outbox_messages"),
        sa.CheckConstraint(STATUS_CHECK_SQL, name="ck_outbox_messages_status"),
        sa.CheckConstraint("attempt_count >= 0", name="ck_outbox_messages_attempt_count"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_outbox_messages_tenant_id_idempotency_key",
        "outbox_messages",
        ["tenant_id", "idempotency_key"],
        unique=True,
    )
    op.create_index(
        "ix_outbox_messages_tenant_id_created_at_id",
        "outbox_messages",
        ["tenant_id", "created_at", "id"],
    )
    op.create_index(
        "ix_outbox_messages_status_updated_at", "outbox_messages", ["status", "updated_at"]
    )
    op.create_index(
        "ix_outbox_messages_provider_message_id", "outbox_messages", ["provider_message_id"]
    )
    op.create_index("ix_outbox_messages_to_address", "outbox_messages", ["to_address"])
    if mysql:
        op.create_index(
            "ix_outbox_messages_claimable_at_id", "outbox_messages", ["claimable_at", "id"]
        )
        op.create_index(
            "ix_outbox_messages_status_lease_expires_at",
            "outbox_messages",
            ["status", "lease_expires_at"],
        )
    else:
        op.create_index(
            "ix_outbox_messages_claimable",
            "outbox_messages",
            ["next_attempt_at", "id"],
            postgresql_where=sa.text(CLAIMABLE_SQL),
            sqlite_where=sa.text(CLAIMABLE_SQL),
        )
        op.create_index(
            "ix_outbox_messages_leased",
            "outbox_messages",
            ["lease_expires_at"],
            postgresql_where=sa.text(PROCESSING_SQL),
            sqlite_where=sa.text(PROCESSING_SQL),
        )

    op.create_table(
        "message_events",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("provider_message_id", sa.String(255)),
        sa.Column("detail", sa.String(2000)),
        sa.PrimaryKeyConstraint("id", name="pk_message_events"),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["outbox_messages.id"],
            name="fk_message_events_message_id_outbox_messages",
            ondelete="CASCADE",
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_message_events_message_id_id", "message_events", ["message_id", "id"])
    op.create_index("ix_message_events_to_status_at", "message_events", ["to_status", "at"])


def downgrade() -> None:
    op.drop_table("message_events")
    op.drop_table("outbox_messages")
