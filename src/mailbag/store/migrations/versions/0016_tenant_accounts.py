"""Tenants' own provider accounts: at most one a tenant, its kind and its settings sealed
under a key derived from SECRET_KEY (`tenant_accounts`), gone with its tenant.

Revision ID: 0016_tenant_accounts
Revises: 0015_fleet_state
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.migrations.exact import table_options
from mailbag.store.types import UTCDateTime

revision = "0016_tenant_accounts"
down_revision = "0015_fleet_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_accounts",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("kind", sa.String(100), nullable=False),
        sa.Column("sealed_settings", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("updated_by", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", name="pk_tenant_accounts"),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name="fk_tenant_accounts_tenant_id_tenants",
            ondelete="CASCADE",
        ),
        **table_options(),
    )


def downgrade() -> None:
    op.drop_table("tenant_accounts")
