"""The deployment row: a check value of the secret key, so replicas with another key refuse
to start instead of emailing verification codes that never confirm.

Revision ID: 0005_key_check
Revises: 0004_console_sessions
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.types import UTCDateTime

revision = "0005_key_check"
down_revision = "0004_console_sessions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("key_check", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_deployment_one_row"),
        sa.PrimaryKeyConstraint("id", name="pk_deployment"),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("deployment")
