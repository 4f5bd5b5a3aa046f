"""Stale verifications by an index: the scheduler expires the unfinished verifications
whose time is up (services/maintenance.py), every MAINTENANCE_EVERY_SECONDS. Without an
index that read the whole table, finished rows and all (0.85 s at 10^6 rows on PostgreSQL,
past the worker's statement bound near 6 * 10^6). PostgreSQL and SQLite: a partial index
on the unfinished rows' expiry; MariaDB (no partial indexes): (state, expires_at).

Revision ID: 0011_verification_expiry_index
Revises: 0010_provider_rates
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_verification_expiry_index"
down_revision = "0010_provider_rates"
branch_labels = None
depends_on = None

PARTIAL = "ix_email_verifications_unfinished_expiry"
MYSQL = "ix_email_verifications_state_expires_at"
# The unfinished states as this revision knows them (schema.V_UNFINISHED_SQL today).
UNFINISHED = "state IN ('created', 'send_failed', 'send_pending', 'sent')"


def _mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _mysql():
        op.create_index(MYSQL, "email_verifications", ["state", "expires_at"])
        return
    op.create_index(
        PARTIAL,
        "email_verifications",
        ["expires_at"],
        postgresql_where=sa.text(UNFINISHED),
        sqlite_where=sa.text(UNFINISHED),
    )


def downgrade() -> None:
    op.drop_index(MYSQL if _mysql() else PARTIAL, table_name="email_verifications")
