"""Sender domains and their DKIM keys: the domains a tenant sends from, what the last check
of their DNS records found (`sender_domains`), and each domain's keys by selector, the
private halves sealed (`dkim_keys`).

Revision ID: 0018_sender_domains
Revises: 0017_erasure
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.migrations.exact import table_options
from mailbag.store.types import UTCDateTime, json_type

revision = "0018_sender_domains"
down_revision = "0017_erasure"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sender_domains",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("domain", sa.String(253), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("ready", sa.Boolean()),
        sa.Column("checked_at", UTCDateTime()),
        sa.Column("ready_since", UTCDateTime()),
        sa.Column("report", json_type()),
        sa.PrimaryKeyConstraint("tenant_id", "domain", name="pk_sender_domains"),
        **table_options(),
    )
    op.create_index("ix_sender_domains_checked_at", "sender_domains", ["checked_at"])
    op.create_table(
        "dkim_keys",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("domain", sa.String(253), nullable=False),
        sa.Column("selector", sa.String(63), nullable=False),
        sa.Column("algorithm", sa.String(20), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("sealed_private_key", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "domain", "selector", name="pk_dkim_keys"),
        sa.ForeignKeyConstraint(
            ["tenant_id", "domain"],
            ["sender_domains.tenant_id", "sender_domains.domain"],
            name="fk_dkim_keys_tenant_id_sender_domains",
            ondelete="CASCADE",
        ),
        **table_options(),
    )


def downgrade() -> None:
    op.drop_table("dkim_keys")
    op.drop_table("sender_domains")
