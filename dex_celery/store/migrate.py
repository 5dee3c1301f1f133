"""Alembic migrations, run programmatically (`dex-celery db upgrade|downgrade|current`).

Production creates and changes the schema only through these migrations; `Store.create_schema()`
(plain `create_all`) is for tests. The migration scripts live in `migrations/` beside this
module and are found without an `alembic.ini`.

dex-celery is a guest in the host application's database: its revision is kept in its own
version table, `dex_alembic_version` (never the host's `alembic_version`), and with
`Settings.database_schema` every table, the version table included, lives in that PostgreSQL
schema (created by the first upgrade). The host's own Alembic history is never read or changed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Connection, inspect, text

from dex_celery.errors import ConfigurationError
from dex_celery.store.alembic_log import quiet_alembic
from dex_celery.store.schema import metadata
from dex_celery.store.sql_engine import make_engine

with quiet_alembic():  # its first import logs each plugin it sets up, at INFO
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util.exc import CommandError

log = logging.getLogger("dex_celery.migrate")

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: dex-celery's own Alembic version table: a host application's `alembic_version` is its own.
VERSION_TABLE = "dex_alembic_version"
#: Revisions renamed so every migration is `NNNN_<what>.py` with revision `NNNN`: a database
#: stamped with the old name is moved to the new one before any upgrade or downgrade.
RENAMED = {"i11_secrets": "0003"}


def alembic_config(
    url: str, connection: Connection | None = None, schema: str | None = None
) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["schema"] = schema
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migration_context(conn: Connection, schema: str | None) -> MigrationContext:
    return MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema}
    )


def head() -> str:
    """The newest revision the code knows."""
    with quiet_alembic():
        revision = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    assert revision is not None
    return revision


def knows(revision: str) -> bool:
    """Whether this code has the migration `revision`; False when a newer release migrated the
    database past it (expand-then-contract keeps this code working there: docs/deploy.md)."""
    if revision in RENAMED:
        return True
    try:
        with quiet_alembic():
            scripts = ScriptDirectory.from_config(alembic_config(""))
        return scripts.get_revision(revision) is not None
    except CommandError:  # Alembic's "No such revision"
        return False


def current(url: str, schema: str | None = None) -> str | None:
    """The revision the database is at; None for a database never migrated."""
    engine = make_engine(url, schema)
    try:
        with quiet_alembic(), engine.connect() as conn:
            return migration_context(conn, schema).get_current_revision()
    finally:
        engine.dispose()


def follow_renames(conn: Connection, schema: str | None) -> None:
    """Rewrite a version stamp of a renamed revision (`RENAMED`) to its current name."""
    if VERSION_TABLE not in inspect(conn).get_table_names(schema=schema):
        return
    table = f'"{schema}".{VERSION_TABLE}' if schema else VERSION_TABLE
    for old, new in RENAMED.items():
        moved = conn.execute(
            text(f"UPDATE {table} SET version_num = :new WHERE version_num = :old"),
            {"new": new, "old": old},
        )
        if moved.rowcount:
            log.info("revision %s is now named %s", old, new)


def schema_differences(connection: Connection) -> list[object]:
    """What `metadata` has that the database lacks or has differently (empty when in step)."""
    context = MigrationContext.configure(
        connection,
        opts={
            "include_name": lambda name, type_, _parents: (
                type_ != "table" or name in metadata.tables
            ),
            "compare_type": True,
        },
    )
    return list(compare_metadata(context, metadata))


def upgrade(url: str, revision: str = "head", schema: str | None = None) -> str | None:
    """Migrate the database at `url` up to `revision`; returns the revision it is at after.

    A database whose tables were made by `Store.create_schema()` (no version table) is adopted
    when its tables match the current schema exactly, and refused otherwise.
    """
    engine = make_engine(url, schema)
    try:
        with engine.begin() as conn:
            if schema is not None:
                conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            follow_renames(conn, schema)
            tables = set(inspect(conn).get_table_names(schema=schema))
            if VERSION_TABLE not in tables and tables & set(metadata.tables):
                differences = schema_differences(conn)
                if differences:
                    raise ConfigurationError(
                        "the database has dex-celery tables that Alembic did not create and that "
                        f"differ from the current schema ({differences[:3]}); migrate it by hand"
                    )
                log.warning("adopting tables made by create_schema(): stamping revision head")
                command.stamp(alembic_config(url, conn, schema), "head")
            else:
                command.upgrade(alembic_config(url, conn, schema), revision)
        return current(url, schema)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str, schema: str | None = None) -> str | None:
    """Migrate down to `revision` (`base` drops every dex-celery table)."""
    engine = make_engine(url, schema)
    try:
        with engine.begin() as conn:
            follow_renames(conn, schema)
            command.downgrade(alembic_config(url, conn, schema), revision)
        return current(url, schema)
    finally:
        engine.dispose()
