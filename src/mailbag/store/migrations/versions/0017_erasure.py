"""Erasure of one person's data: the record of each erasure (`erasures`: the address's
keyed hash, never the address, and how far it got, so an interrupted one resumes), and a
tenant's own PURGE_AFTER_DAYS (`tenant_retention`).

Revision ID: 0017_erasure
Revises: 0016_tenant_accounts
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.migrations.exact import table_options
from mailbag.store.types import UTCDateTime, json_type

revision = "0017_erasure"
down_revision = "0016_tenant_accounts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(100)),
        sa.Column("address_hash", sa.String(100), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("progress", json_type(), nullable=False),
        sa.Column("requested_at", UTCDateTime(), nullable=False),
        sa.Column("requested_by", sa.String(200), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime()),
        sa.PrimaryKeyConstraint("id", name="pk_erasures"),
        **table_options(),
    )
    op.create_index("ix_erasures_address_hash_tenant_id", "erasures", ["address_hash", "tenant_id"])
    op.create_table(
        "tenant_retention",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("purge_after_days", sa.Double(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_retention"),
        **table_options(),
    )


def downgrade() -> None:
    op.drop_table("tenant_retention")
    op.drop_index("ix_erasures_address_hash_tenant_id", table_name="erasures")
    op.drop_table("erasures")
