"""The HTTP API: tenants, idempotency records, email verifications.

Revision ID: 0002_api
Revises: 0001_outbox
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime, bigint_pk, json_type

revision = "0002_api"
down_revision = "0001_outbox"
branch_labels = None
depends_on = None

# Snapshots of the SQL fragments in mailbag.store.schema as of this revision.
V_ACTIVE_SQL = "state IN ('created', 'send_pending', 'sent')"
V_STATE_CHECK_SQL = (
    "state IN ('created', 'expired', 'send_failed', 'send_pending', 'sent', 'verified')"
)


def upgrade() -> None:
    mysql = op.get_bind().dialect.name in ("mysql", "mariadb")

    op.create_table(
        "tenants",
        sa.Column("id", sa.String(100), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("api_key_digest", sa.String(64), nullable=False),
        sa.Column("api_key_prefix", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_tenants_name", "tenants", ["name"], unique=True)
    op.create_index("ix_tenants_api_key_digest", "tenants", ["api_key_digest"], unique=True)

    op.create_table(
        "idempotency_records",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=False),
        sa.Column("operation", sa.String(100), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("resource_id", sa.String(64)),
        sa.Column("response_status", sa.Integer()),
        sa.Column("response_body", json_type()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_records"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_idempotency_records_tenant_id_idempotency_key",
        "idempotency_records",
        ["tenant_id", "idempotency_key"],
        unique=True,
    )
    op.create_index("ix_idempotency_records_expires_at", "idempotency_records", ["expires_at"])

    generated: list[sa.Column[object]] = (
        [
            sa.Column(
                "active_email",
                sa.String(255),
                sa.Computed(f"CASE WHEN {V_ACTIVE_SQL} THEN email END", persisted=True),
            )
        ]
        if mysql
        else []
    )
    op.create_table(
        "email_verifications",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("email", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("token_digest", sa.String(64), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("confirm_attempts", sa.Integer(), nullable=False),
        sa.Column("send_count", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.Uuid()),
        sa.Column("template_name", sa.String(100), nullable=False),
        sa.Column("redirect_url", sa.String(2000)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime()),
        sa.Column("verified_at", UTCDateTime()),
        *generated,
        sa.PrimaryKeyConstraint("id", name="pk_email_verifications"),
        sa.CheckConstraint(V_STATE_CHECK_SQL, name="ck_email_verifications_state"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_email_verifications_message_id", "email_verifications", ["message_id"])
    op.create_index(
        "ix_email_verifications_tenant_id_email_created_at",
        "email_verifications",
        ["tenant_id", "email", "created_at"],
    )
    if mysql:
        op.create_index(
            "ix_email_verifications_tenant_id_active_email",
            "email_verifications",
            ["tenant_id", "active_email"],
            unique=True,
        )
    else:
        op.create_index(
            "ix_email_verifications_active_email",
            "email_verifications",
            ["tenant_id", "email"],
            unique=True,
            postgresql_where=sa.text(V_ACTIVE_SQL),
            sqlite_where=sa.text(V_ACTIVE_SQL),
        )

    op.create_table(
        "verification_events",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("verification_id", sa.Uuid(), nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("message_id", sa.Uuid()),
        sa.Column("detail", sa.String(2000)),
        sa.PrimaryKeyConstraint("id", name="pk_verification_events"),
        sa.ForeignKeyConstraint(
            ["verification_id"],
            ["email_verifications.id"],
            name="fk_verification_events_verification_id_email_verifications",
            ondelete="CASCADE",
        ),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_verification_events_verification_id_id",
        "verification_events",
        ["verification_id", "id"],
    )

    op.create_table(
        "verification_sends",
        sa.Column("id", bigint_pk(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(100), nullable=False),
        sa.Column("email", sa.String(255), nullable=False),
        sa.Column("verification_id", sa.Uuid(), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_verification_sends"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index(
        "ix_verification_sends_tenant_id_email_at",
        "verification_sends",
        ["tenant_id", "email", "at"],
    )
    op.create_index("ix_verification_sends_tenant_id_at", "verification_sends", ["tenant_id", "at"])


def downgrade() -> None:
    for table in (
        "verification_sends",
        "verification_events",
        "email_verifications",
        "idempotency_records",
        "tenants",
    ):
        op.drop_table(table)
