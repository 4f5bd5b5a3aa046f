"""Operations: provider events (webhooks) and the suppression list.

Revision ID: 0003_operations
Revises: 0002_api
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime, bigint_pk, json_type

revision = "0003_operations"
down_revision = "0002_api"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_events",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(20), nullable=False),
        sa.Column("dedup_key", sa.String(100), nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("bounce_type", sa.String(10)),
        sa.Column("provider_event", sa.String(50), nullable=False),
        sa.Column("occurred_at", UTCDateTime(), nullable=False),
        sa.Column("received_at", UTCDateTime(), nullable=False),
        sa.Column("provider_message_id", sa.String(255)),
        sa.Column("message_id", sa.Uuid()),
        sa.Column("tenant_id", sa.String(100)),
        sa.Column("recipient", sa.String(255)),
        sa.Column("detail", sa.String(2000)),
        sa.Column("raw", json_type(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_provider_events"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_provider_events_dedup_key", "provider_events", ["dedup_key"], unique=True)
    op.create_index("ix_provider_events_message_id", "provider_events", ["message_id"])
    op.create_index(
        "ix_provider_events_provider_message_id", "provider_events", ["provider_message_id"]
    )
    op.create_index("ix_provider_events_received_at", "provider_events", ["received_at"])

    op.create_table(
        "suppressions",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("email", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(50), nullable=False),
        sa.Column("detail", sa.String(2000)),
        sa.Column("source_event_id", sa.BigInteger()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_suppressions"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_suppressions_tenant_id_email", "suppressions", ["tenant_id", "email"], unique=True
    )


def downgrade() -> None:
    op.drop_table("suppressions")
    op.drop_table("provider_events")
