"""Templates operators own (domain/templates.py): `templates`, their `template_locales` and
every `template_versions` row ever published; the version a message renders with
(`outbox_messages.template_version_id`, with its number and locale) and the locale a
verification's emails ask for (`email_verifications.locale`). Existing messages keep
rendering with the file templates.

Revision ID: 0021_templates
Revises: 0020_domain_shaping
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from mailbag.store.migrations.exact import table_options
from mailbag.store.types import UTCDateTime, json_type, long_text

revision = "0021_templates"
down_revision = "0020_domain_shaping"
branch_labels = None
depends_on = None

TENANT_ID_MAX, NAME_MAX, LOCALE_MAX = 100, 100, 35  # as domain/ has them, frozen here


def _owner() -> list[sa.Column[str]]:
    return [
        sa.Column("tenant_id", sa.String(TENANT_ID_MAX), nullable=False),
        sa.Column("name", sa.String(NAME_MAX), nullable=False),
    ]


def _of_template(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["tenant_id", "name"],
        ["templates.tenant_id", "templates.name"],
        name=f"fk_{table}_tenant_id_templates",
        ondelete="CASCADE",
    )


def upgrade() -> None:
    op.create_table(
        "templates",
        *_owner(),
        sa.Column("default_locale", sa.String(LOCALE_MAX), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "name", name="pk_templates"),
        **table_options(),
    )
    op.create_table(
        "template_locales",
        *_owner(),
        sa.Column("locale", sa.String(LOCALE_MAX), nullable=False),
        sa.Column("current_version", sa.Integer(), nullable=False),
        sa.Column("current_version_id", sa.BigInteger(), nullable=False),
        sa.Column("latest_version", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "name", "locale", name="pk_template_locales"),
        _of_template("template_locales"),
        **table_options(),
    )
    op.create_table(
        "template_versions",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        *_owner(),
        sa.Column("locale", sa.String(LOCALE_MAX), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("format", sa.String(10), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("html", long_text(), nullable=False),
        sa.Column("text", long_text(), nullable=False),
        sa.Column("compiled_html", long_text()),
        sa.Column("sample_data", json_type(), nullable=False),
        sa.Column("dependencies", json_type(), nullable=False),
        sa.Column("changed_by", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_template_versions"),
        _of_template("template_versions"),
        **table_options(),
    )
    op.create_index(
        "ix_template_versions_tenant_id_name_locale_version",
        "template_versions",
        ["tenant_id", "name", "locale", "version"],
        unique=True,
    )
    op.add_column("outbox_messages", sa.Column("template_version_id", sa.BigInteger()))
    op.add_column("outbox_messages", sa.Column("template_version", sa.Integer()))
    op.add_column("outbox_messages", sa.Column("template_locale", sa.String(LOCALE_MAX)))
    op.add_column("email_verifications", sa.Column("locale", sa.String(LOCALE_MAX)))


def downgrade() -> None:
    # ALTER TABLE DROP COLUMN, not a batch (0019 says why).
    op.drop_column("email_verifications", "locale")
    op.drop_column("outbox_messages", "template_locale")
    op.drop_column("outbox_messages", "template_version")
    op.drop_column("outbox_messages", "template_version_id")
    op.drop_table("template_versions")
    op.drop_table("template_locales")
    op.drop_table("templates")
