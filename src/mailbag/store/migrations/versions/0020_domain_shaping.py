"""Each recipient domain's send schedule while DOMAIN_SHAPING slows it after deferrals
(`recipient_domain_rates`, domain.domain_shaping): a row per domain that ever deferred, made
by its first deferral; nothing for a deployment whose recipients never defer.

Revision ID: 0020_domain_shaping
Revises: 0019_fair_queues
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.migrations.exact import table_options

revision = "0020_domain_shaping"
# 0019_fair_queues is being written on another branch: once it lands, this follows it.
down_revision = "0019_fair_queues"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "recipient_domain_rates",
        sa.Column("domain", sa.String(253), nullable=False),
        sa.Column("next_slot_at", sa.Double(), nullable=False),
        sa.Column("lowered_rate", sa.Double(), nullable=False),
        sa.Column("lowered_until", sa.Double(), nullable=False),
        sa.Column("settles_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("domain", name="pk_recipient_domain_rates"),
        **table_options(),
    )
    op.create_index(
        "ix_recipient_domain_rates_lowered_until", "recipient_domain_rates", ["lowered_until"]
    )


def downgrade() -> None:
    op.drop_table("recipient_domain_rates")
