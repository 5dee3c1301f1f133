"""What the migration scripts share (outside `versions/`, where every file is a revision)."""

from __future__ import annotations

from alembic import context


def table_schema() -> str | None:
    """`Settings.database_schema`: ALTER TABLE does not go through the schema translate map."""
    schema = context.config.attributes.get("schema")
    return str(schema) if schema else None
