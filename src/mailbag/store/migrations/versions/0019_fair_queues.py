"""Fair queues: a message is bulk mail or transactional (`outbox_messages.bulk`), and the
claimable messages are indexed by lane, (tenant, bulk) in claim order, so that a claim
shares its batch among the tenants with due mail (store/fair.py). Existing messages are
transactional.

Revision ID: 0019_fair_queues
Revises: 0018_sender_domains
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_fair_queues"
down_revision = "0018_sender_domains"
branch_labels = None
depends_on = None

CLAIMABLE_SQL = "status IN ('pending', 'retrying')"  # as 0006 has it, frozen here


def upgrade() -> None:
    op.add_column(
        "outbox_messages",
        sa.Column("bulk", sa.Boolean(), nullable=False, server_default="0"),
    )
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.add_column(
            "outbox_messages",
            sa.Column(
                "claimable_tenant",
                sa.String(100),
                sa.Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN tenant_id END", persisted=True),
            ),
        )
        op.create_index(
            "ix_outbox_messages_claimable_tenant_bulk_claimable_at_id",
            "outbox_messages",
            ["claimable_tenant", "bulk", "claimable_at", "id"],
        )
    else:
        op.create_index(
            "ix_outbox_messages_lanes",
            "outbox_messages",
            ["tenant_id", "bulk", "claim_order_at", "id"],
            postgresql_where=sa.text(CLAIMABLE_SQL),
            sqlite_where=sa.text(CLAIMABLE_SQL),
        )


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        op.drop_index(
            "ix_outbox_messages_claimable_tenant_bulk_claimable_at_id",
            table_name="outbox_messages",
        )
        op.drop_column("outbox_messages", "claimable_tenant")
    else:
        op.drop_index("ix_outbox_messages_lanes", table_name="outbox_messages")
    # Not a batch: on SQLite that rebuilds the table, which the expression index on
    # to_address does not survive; ALTER TABLE DROP COLUMN does (SQLite 3.35).
    op.drop_column("outbox_messages", "bulk")
