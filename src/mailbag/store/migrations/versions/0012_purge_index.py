"""The purge by an index: operator.purge takes the oldest finished messages past the cutoff
in updated_at order, one chunk at a time. (status, updated_at) cannot give that order across
the five finished states, so every chunk read and sorted all finished rows past the cutoff
(2.2 s a chunk with 2.5 * 10^6 of them on PostgreSQL, a first purge of 10^7 rows in about an
hour). PostgreSQL and SQLite: a partial index on the finished rows' updated_at, whose
predicate is the purge's own state filter; MariaDB (no partial indexes): (updated_at,
status), read in order with the state checked in the index.

Building it holds writes on PostgreSQL for its duration (7.5 s at 10^7 rows, bench.rows'
candidate run; the whole upgrade is one transaction under the migration lock). An operator
who cannot pause writes that long may build it first, outside a transaction:
    CREATE INDEX CONCURRENTLY ix_outbox_messages_finished_updated_at ON outbox_messages
    (updated_at) WHERE status IN ('cancelled', 'dead', 'expired', 'failed', 'sent');
and this revision then keeps it (IF NOT EXISTS). MariaDB builds it online (InnoDB).

Revision ID: 0012_purge_index
Revises: 0011_verification_expiry_index
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_purge_index"
down_revision = "0011_verification_expiry_index"
branch_labels = None
depends_on = None

PARTIAL = "ix_outbox_messages_finished_updated_at"
MYSQL = "ix_outbox_messages_updated_at_status"
# The finished states as this revision knows them (schema.TERMINAL_SQL today).
FINISHED = "status IN ('cancelled', 'dead', 'expired', 'failed', 'sent')"


def _mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _mysql():
        op.create_index(MYSQL, "outbox_messages", ["updated_at", "status"])
        return
    op.create_index(
        PARTIAL,
        "outbox_messages",
        ["updated_at"],
        if_not_exists=True,
        postgresql_where=sa.text(FINISHED),
        sqlite_where=sa.text(FINISHED),
    )


def downgrade() -> None:
    op.drop_index(MYSQL if _mysql() else PARTIAL, table_name="outbox_messages")
