"""Alembic environment: runs on the connection mailbag hands it (see mailbag.store.migrate)."""

from __future__ import annotations

from alembic import context

from mailbag.store.schema import metadata_for

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata_for(connection.dialect.name),
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
