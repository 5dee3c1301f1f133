"""Alembic environment of dex-celery, driven by `dex_celery.store.migrate` (no alembic.ini).

The database URL comes from `Settings.database_url` (set by `dex-celery db ...`); only the
tables of `dex_celery.store.schema.metadata` are managed here, so the tables of other services
in the same database (the order desk's, for example) are never touched or reported.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Connection

from dex_celery.store.schema import metadata
from dex_celery.store.sql_engine import make_engine

config = context.config
#: `Settings.database_schema`: where the tables and the version table live (None: default).
SCHEMA: str | None = config.attributes.get("schema")
#: dex-celery's own version table, beside (never instead of) a host's `alembic_version`.
VERSION_TABLE = "dex_alembic_version"


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table":
        return name in metadata.tables
    return True


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "", SCHEMA)
    try:
        with engine.connect() as conn:
            _configure(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        version_table_schema=SCHEMA,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
