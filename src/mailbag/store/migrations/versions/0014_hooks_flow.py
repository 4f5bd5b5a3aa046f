"""Hooks that keep flowing:

- each endpoint's breaker: how many attempts in a row failed, and until when its
  deliveries wait (store/hooks.py `record_endpoint_outcomes`); two columns with defaults,
  an instant change on PostgreSQL, MariaDB and SQLite;
- on MariaDB/MySQL, a delivery's payload as LONGTEXT: TEXT stops at 64 KiB, a message's
  metadata alone may be 64 KiB, and a payload too long for its column failed the INSERT,
  and with it the worker's finalize of the message whose event it was. (PostgreSQL's and
  SQLite's TEXT have no such bound.) This copies hook_deliveries on MariaDB.

Revision ID: 0014_hooks_flow
Revises: 0013_exact_text
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from mailbag.store.types import UTCDateTime

revision = "0014_hooks_flow"
down_revision = "0013_exact_text"
branch_labels = None
depends_on = None


def _mysql() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("hook_endpoints") as table:
        table.add_column(
            sa.Column("failures_in_row", sa.Integer(), nullable=False, server_default="0")
        )
        table.add_column(sa.Column("paused_until", UTCDateTime(), nullable=True))
    if _mysql():  # keeps the table's collation (0013's exact one)
        op.alter_column(
            "hook_deliveries", "payload", type_=mysql.LONGTEXT(), existing_nullable=False
        )


def downgrade() -> None:
    if _mysql():
        op.alter_column("hook_deliveries", "payload", type_=sa.Text(), existing_nullable=False)
    with op.batch_alter_table("hook_endpoints") as table:
        table.drop_column("paused_until")
        table.drop_column("failures_in_row")
