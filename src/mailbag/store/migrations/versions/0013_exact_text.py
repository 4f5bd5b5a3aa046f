"""MariaDB/MySQL compare text byte for byte, as PostgreSQL and SQLite do.

Every table was created with utf8mb4's default collation, which compares without case and
without accents. Unique keys and lookups therefore disagreed with the other databases:
`Order-1` and `order-1` were one Idempotency-Key (the second request got the first one's
answer, or a 409), and `adá@example.com` and `ada@example.com` one suppression. Every
table moves to the server's no-pad binary collation (utf8mb4_bin would still call `k-1`
and `k-1 ` equal): utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL 8. Except
`outbox_messages.to_address`, which keeps a caseless collation so that its plain index can
serve `?to=` (store/messages.py, SameAddress). Down again: the charset's default.

Tightening a collation never makes two stored values collide, so the conversion cannot
fail on existing data. It rebuilds each table (ALGORITHM=COPY), holding writes to it
meanwhile: schedule it like any table rebuild on a large outbox. PostgreSQL and SQLite:
nothing to do.

Revision ID: 0013_exact_text
Revises: 0012_purge_index
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import cast

from alembic import op
from sqlalchemy.dialects.mysql.base import MySQLDialect

revision = "0013_exact_text"
down_revision = "0012_purge_index"
branch_labels = None
depends_on = None

# The tables as this revision knows them.
TABLES = (
    "attachments",
    "console_sessions",
    "deployment",
    "email_verifications",
    "hook_deliveries",
    "hook_delivery_events",
    "hook_endpoints",
    "idempotency_records",
    "message_attachments",
    "message_events",
    "outbox_messages",
    "provider_events",
    "provider_rates",
    "suppressions",
    "tenant_senders",
    "tenants",
    "verification_events",
    "verification_send_counts",
    "verification_sends",
)
RECIPIENT = "to_address VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
# The one text column a foreign key shares: MariaDB changes neither side's collation while
# the key stands, so it is dropped and made again around the conversion.
SHARED_KEY = "fk_message_attachments_sha256_attachments"


def _convert(collation: str) -> None:
    op.drop_constraint(SHARED_KEY, "message_attachments", type_="foreignkey")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 {collation}")
    op.execute(f"ALTER TABLE outbox_messages MODIFY {RECIPIENT}")
    op.create_foreign_key(SHARED_KEY, "message_attachments", "attachments", ["sha256"], ["sha256"])


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        mariadb = cast(MySQLDialect, bind.dialect).is_mariadb
        exact = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
        _convert(f"COLLATE {exact}")


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        _convert("")  # the charset's default collation, as the tables were made
