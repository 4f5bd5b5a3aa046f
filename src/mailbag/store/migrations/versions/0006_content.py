"""What a message can carry: recipients, sender name, ready-made content, expiry, priority,
List-Unsubscribe, suppressed recipients; attachments stored once per SHA-256; the senders a
tenant may use. Existing rows keep their data: claim_order_at is their next_attempt_at
(priority normal), and the claim index moves to it.

SQLite cannot change a column's NULL or a CHECK in place: outbox_messages is rebuilt
(batch mode), which migrate.upgrade runs with foreign keys off, so dropping the old table
does not cascade to its events.

Revision ID: 0006_content
Revises: 0005_key_check
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime, json_type, long_binary

revision = "0006_content"
down_revision = "0005_key_check"
branch_labels = None
depends_on = None

# Snapshots of the SQL fragments in mailbag.store.schema as of this revision.
CLAIMABLE_SQL = "status IN ('pending', 'retrying')"
PROCESSING_SQL = "status = 'processing'"
OLD_STATUS_CHECK_SQL = (
    "status IN ('cancelled', 'dead', 'failed', 'pending', 'processing', 'retrying', 'sent', "
    "'unknown')"
)
STATUS_CHECK_SQL = (
    "status IN ('cancelled', 'dead', 'expired', 'failed', 'pending', 'processing', "
    "'retrying', 'sent', 'unknown')"
)
STATUS_CHECK = "ck_outbox_messages_status"


def _new_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("carried", json_type()),
        sa.Column("expires_at", UTCDateTime()),
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="0"),
        sa.Column("claim_order_at", UTCDateTime()),
        sa.Column("attachment_count", sa.SmallInteger(), nullable=False, server_default="0"),
    ]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    mysql = dialect in ("mysql", "mariadb")

    if mysql:
        op.drop_index("ix_outbox_messages_claimable_at_id", table_name="outbox_messages")
        op.drop_column("outbox_messages", "claimable_at")
    else:
        op.drop_index("ix_outbox_messages_claimable", table_name="outbox_messages")
    if dialect == "sqlite":
        # Recreated below with its predicate: a rebuilt table keeps only what reflection saw.
        op.drop_index("ix_outbox_messages_leased", table_name="outbox_messages")

    with op.batch_alter_table("outbox_messages") as batch:
        for column in _new_columns():
            batch.add_column(column)
        batch.alter_column("template_name", existing_type=sa.String(100), nullable=True)
        batch.drop_constraint(STATUS_CHECK, type_="check")
        batch.create_check_constraint(STATUS_CHECK, sa.text(STATUS_CHECK_SQL))

    # Every existing message is of normal priority: its claim order is its due time.
    op.execute("UPDATE outbox_messages SET claim_order_at = next_attempt_at")

    if mysql:
        op.add_column(
            "outbox_messages",
            sa.Column(
                "claimable_at",
                UTCDateTime(),
                sa.Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN claim_order_at END", persisted=True),
            ),
        )
        op.create_index(
            "ix_outbox_messages_claimable_at_id", "outbox_messages", ["claimable_at", "id"]
        )
    else:
        op.create_index(
            "ix_outbox_messages_claimable",
            "outbox_messages",
            ["claim_order_at", "id"],
            postgresql_where=sa.text(CLAIMABLE_SQL),
            sqlite_where=sa.text(CLAIMABLE_SQL),
        )
    if dialect == "sqlite":
        op.create_index(
            "ix_outbox_messages_leased",
            "outbox_messages",
            ["lease_expires_at"],
            sqlite_where=sa.text(PROCESSING_SQL),
        )

    op.create_table(
        "attachments",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("content", long_binary(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name="pk_attachments"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_table(
        "message_attachments",
        sa.Column("message_id", sa.Uuid(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("content_type", sa.String(255), nullable=False),
        sa.Column("content_id", sa.String(255)),
        sa.PrimaryKeyConstraint("message_id", "position", name="pk_message_attachments"),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["outbox_messages.id"],
            name="fk_message_attachments_message_id_outbox_messages",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["sha256"],
            ["attachments.sha256"],
            name="fk_message_attachments_sha256_attachments",
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_message_attachments_sha256", "message_attachments", ["sha256"])
    op.create_table(
        "tenant_senders",
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "address", name="pk_tenant_senders"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    """Back to 0005: what 0005 cannot hold is lost (recipients beyond the first To,
    attachments, sender identities). Fails while a ready-made or expired message is left."""
    dialect = op.get_bind().dialect.name
    mysql = dialect in ("mysql", "mariadb")
    op.drop_table("tenant_senders")
    op.drop_table("message_attachments")
    op.drop_table("attachments")
    if mysql:
        op.drop_index("ix_outbox_messages_claimable_at_id", table_name="outbox_messages")
        op.drop_column("outbox_messages", "claimable_at")
    else:
        op.drop_index("ix_outbox_messages_claimable", table_name="outbox_messages")
    if dialect == "sqlite":
        op.drop_index("ix_outbox_messages_leased", table_name="outbox_messages")
    with op.batch_alter_table("outbox_messages") as batch:
        batch.drop_constraint(STATUS_CHECK, type_="check")
        batch.create_check_constraint(STATUS_CHECK, sa.text(OLD_STATUS_CHECK_SQL))
        batch.alter_column("template_name", existing_type=sa.String(100), nullable=False)
        for column in reversed(_new_columns()):
            batch.drop_column(column.name)
    if mysql:
        op.add_column(
            "outbox_messages",
            sa.Column(
                "claimable_at",
                UTCDateTime(),
                sa.Computed(f"CASE WHEN {CLAIMABLE_SQL} THEN next_attempt_at END", persisted=True),
            ),
        )
        op.create_index(
            "ix_outbox_messages_claimable_at_id", "outbox_messages", ["claimable_at", "id"]
        )
    else:
        op.create_index(
            "ix_outbox_messages_claimable",
            "outbox_messages",
            ["next_attempt_at", "id"],
            postgresql_where=sa.text(CLAIMABLE_SQL),
            sqlite_where=sa.text(CLAIMABLE_SQL),
        )
    if dialect == "sqlite":
        op.create_index(
            "ix_outbox_messages_leased",
            "outbox_messages",
            ["lease_expires_at"],
            sqlite_where=sa.text(PROCESSING_SQL),
        )
