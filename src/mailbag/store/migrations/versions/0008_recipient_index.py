"""A tenant's messages to one recipient by an index: `GET /v1/messages?to=` compares
lower-cased addresses, which the index on to_address cannot serve (PostgreSQL and SQLite;
MariaDB has no expression indexes).

Revision ID: 0008_recipient_index
Revises: 0007_hooks
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_recipient_index"
down_revision = "0007_hooks"
branch_labels = None
depends_on = None

NAME = "ix_outbox_messages_tenant_id_lower_to_address"


def upgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        return
    op.create_index(NAME, "outbox_messages", ["tenant_id", sa.text("lower(to_address)")])


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        return
    op.drop_index(NAME, table_name="outbox_messages")
