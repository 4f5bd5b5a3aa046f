"""The options of every table a migration creates from 0013 on: on MariaDB/MySQL InnoDB,
full UTF-8 and the server's no-pad binary collation, so text compares byte for byte as on
PostgreSQL and SQLite (0013_exact_text says why), and a foreign key's column has the
collation of the column it references. Nothing elsewhere."""

from __future__ import annotations

from typing import Any, cast

from alembic import op
from sqlalchemy.dialects.mysql.base import MySQLDialect


def table_options() -> dict[str, Any]:
    """`op.create_table(..., **table_options())` in a migration."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return {}
    mariadb = cast(MySQLDialect, bind.dialect).is_mariadb
    exact = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": exact}
