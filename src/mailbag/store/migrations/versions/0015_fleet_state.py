"""What the fleet shares about its providers and what operators paused: each provider's
breaker (`provider_health`) and the pauses (`pauses`: the fleet, a provider, a tenant).

Revision ID: 0015_fleet_state
Revises: 0014_hooks_flow
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql.base import MySQLDialect

from mailbag.store.types import UTCDateTime

revision = "0015_fleet_state"
down_revision = "0014_hooks_flow"
branch_labels = None
depends_on = None


def _options() -> dict[str, Any]:
    """MariaDB/MySQL tables compare text byte for byte, as 0013 made every other one."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return {}
    mariadb = cast(MySQLDialect, bind.dialect).is_mariadb
    exact = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": exact}


def upgrade() -> None:
    op.create_table(
        "provider_health",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("failures_in_row", sa.Integer(), nullable=False),
        sa.Column("open_until", UTCDateTime()),
        sa.Column("last_error", sa.String(2000)),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_provider_health"),
        **_options(),
    )
    op.create_table(
        "pauses",
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("paused_at", UTCDateTime(), nullable=False),
        sa.Column("paused_by", sa.String(200), nullable=False),
        sa.Column("reason", sa.String(500)),
        sa.PrimaryKeyConstraint("scope", "target", name="pk_pauses"),
        **_options(),
    )


def downgrade() -> None:
    op.drop_table("pauses")
    op.drop_table("provider_health")
