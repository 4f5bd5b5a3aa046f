"""Event hooks: tenants' endpoints (secrets sealed with HOOKS_KEY), the deliveries of their
events through an outbox of their own, and each delivery's history.

Revision ID: 0007_hooks
Revises: 0006_content
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime, bigint_pk

revision = "0007_hooks"
down_revision = "0006_content"
branch_labels = None
depends_on = None

# Snapshots of the SQL fragments in mailbag.store.schema as of this revision.
CLAIMABLE_SQL = "status IN ('pending', 'retrying')"
PROCESSING_SQL = "status = 'processing'"
STATUS_CHECK_SQL = "status IN ('dead', 'delivered', 'pending', 'processing', 'retrying')"
TABLE_OPTIONS: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"}


def upgrade() -> None:
    mysql = op.get_bind().dialect.name in ("mysql", "mariadb")

    op.create_table(
        "hook_endpoints",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("events", sa.String(200), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("description", sa.String(500)),
        sa.Column("secret", sa.String(500), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hook_endpoints"),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_hook_endpoints_tenant_id_created_at", "hook_endpoints", ["tenant_id", "created_at"]
    )

    columns: list[sa.Column[object]] = [
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("event", sa.String(30), nullable=False),
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("webhook_id", sa.String(40), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("delivered_at", UTCDateTime()),
        sa.Column("claim_token", sa.Uuid()),
        sa.Column("claimed_by", sa.String(200)),
        sa.Column("lease_expires_at", UTCDateTime()),
        sa.Column("last_status_code", sa.Integer()),
        sa.Column("last_error", sa.String(2000)),
    ]
    if mysql:  # no partial indexes: a column that is NULL unless the row is claimable
        columns.append(
            sa.Column(
                "claimable_at",
                UTCDateTime(),
                sa.Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN next_attempt_at END", persisted=True),
            )
        )
    op.create_table(
        "hook_deliveries",
        *columns,
        sa.PrimaryKeyConstraint("id", name="pk_hook_deliveries"),
        sa.CheckConstraint(STATUS_CHECK_SQL, name="ck_hook_deliveries_status"),
        **TABLE_OPTIONS,
    )
    for name, indexed in (
        ("ix_hook_deliveries_tenant_id_created_at_id", ["tenant_id", "created_at", "id"]),
        ("ix_hook_deliveries_endpoint_id_created_at", ["endpoint_id", "created_at"]),
        ("ix_hook_deliveries_message_id", ["message_id"]),
        ("ix_hook_deliveries_webhook_id", ["webhook_id"]),
    ):
        op.create_index(name, "hook_deliveries", indexed)
    if mysql:
        op.create_index(
            "ix_hook_deliveries_claimable_at_id", "hook_deliveries", ["claimable_at", "id"]
        )
        op.create_index(
            "ix_hook_deliveries_status_lease_expires_at",
            "hook_deliveries",
            ["status", "lease_expires_at"],
        )
    else:
        op.create_index(
            "ix_hook_deliveries_claimable",
            "hook_deliveries",
            ["next_attempt_at", "id"],
            postgresql_where=sa.text(CLAIMABLE_SQL),
            sqlite_where=sa.text(CLAIMABLE_SQL),
        )
        op.create_index(
            "ix_hook_deliveries_leased",
            "hook_deliveries",
            ["lease_expires_at"],
            postgresql_where=sa.text(PROCESSING_SQL),
            sqlite_where=sa.text(PROCESSING_SQL),
        )

    op.create_table(
        "hook_delivery_events",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.Uuid(), nullable=False),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer()),
        sa.Column("detail", sa.String(2000)),
        sa.PrimaryKeyConstraint("id", name="pk_hook_delivery_events"),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["hook_deliveries.id"],
            name="fk_hook_delivery_events_delivery_id_hook_deliveries",
            ondelete="CASCADE",
        ),
        **TABLE_OPTIONS,
    )
    op.create_index(
        "ix_hook_delivery_events_delivery_id_id", "hook_delivery_events", ["delivery_id", "id"]
    )


def downgrade() -> None:
    """Back to 0006: every endpoint, delivery and its history is lost."""
    op.drop_table("hook_delivery_events")
    op.drop_table("hook_deliveries")
    op.drop_table("hook_endpoints")
