"""Each provider's send schedule under PROVIDER_RATE, shared by every replica
(`provider_rates`, domain.rate): a row per provider, made by the first worker to send.

Revision ID: 0010_provider_rates
Revises: 0009_verification_send_counts
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_provider_rates"
down_revision = "0009_verification_send_counts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_rates",
        sa.Column("provider", sa.String(20), nullable=False),
        sa.Column("next_slot_at", sa.Double(), nullable=False),
        sa.Column("lowered_rate", sa.Double(), nullable=False),
        sa.Column("lowered_until", sa.Double(), nullable=False),
        sa.Column("settles_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("provider", name="pk_provider_rates"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("provider_rates")
