"""A tenant's verification sends counted per minute: the tenant's hourly limit sums at
most 61 rows of `verification_send_counts` instead of counting every send of the last
hour in `verification_sends` (that count grew with traffic, under the tenant's lock).
The sends of the last hour are counted into it, so the limit holds across the upgrade.

Revision ID: 0009_verification_send_counts
Revises: 0008_recipient_index
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime

revision = "0009_verification_send_counts"
down_revision = "0008_recipient_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    counts = op.create_table(
        "verification_send_counts",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("minute", UTCDateTime(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "minute", name="pk_verification_send_counts"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    sends = sa.table("verification_sends", sa.column("tenant_id"), sa.column("at", UTCDateTime()))
    since = datetime.now(UTC) - timedelta(hours=1, minutes=1)
    rows = op.get_bind().execute(sa.select(sends.c.tenant_id, sends.c.at).where(sends.c.at > since))
    per_minute = Counter((tenant, at.replace(second=0, microsecond=0)) for tenant, at in rows)
    if per_minute:
        op.bulk_insert(
            counts,
            [{"tenant_id": t, "minute": m, "n": n} for (t, m), n in per_minute.items()],
        )


def downgrade() -> None:
    op.drop_table("verification_send_counts")
