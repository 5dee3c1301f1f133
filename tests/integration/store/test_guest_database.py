"""dex-celery as a guest in the host application's PostgreSQL database.

The host has its own Alembic history (its own `alembic_version`, its own tables). dex-celery
keeps its revision in `dex_alembic_version` and, with `DEX_DATABASE_SCHEMA`, all its tables in a
schema of its own: `dex-celery db upgrade` and `downgrade` work beside the host's history, and
the host's own `alembic upgrade` keeps working before and after.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, text

from dex_celery import CallStatus, MessageRole, Settings
from dex_celery.cli.main import main
from dex_celery.model.ids import CallKey
from dex_celery.store import migrate
from dex_celery.store.repository import Store
from dex_celery.store.schema import metadata
from dex_celery.store.values import Outcome, OutcomeRow
from tests.support.stores.pg_database import fresh_database
from tests.support.stores.store_rig import new_call

pytestmark = pytest.mark.postgres

HOST_ENV = """
from alembic import context
from sqlalchemy import create_engine

url = context.config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

HOST_REVISIONS = {
    "h1_orders.py": """
revision = "h1"
down_revision = None
branch_labels = None
depends_on = None

from alembic import op
import sqlalchemy as sa


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("orders")
""",
    "h2_customers.py": """
revision = "h2"
down_revision = "h1"
branch_labels = None
depends_on = None

from alembic import op
import sqlalchemy as sa


def upgrade():
    op.add_column("orders", sa.Column("customer", sa.String(100)))


def downgrade():
    op.drop_column("orders", "customer")
""",
}


@pytest.fixture
def database() -> Iterator[str]:
    """A fresh PostgreSQL database of its own (dropped after)."""
    with fresh_database("dex_guest") as url:
        yield url


def host_alembic(tmp_path: Path, url: str) -> Config:
    """The host application's own Alembic project (default `alembic_version` table)."""
    folder = tmp_path / "host_migrations"
    (folder / "versions").mkdir(parents=True)
    (folder / "env.py").write_text(textwrap.dedent(HOST_ENV))
    for name, body in HOST_REVISIONS.items():
        (folder / "versions" / name).write_text(textwrap.dedent(body))
    cfg = Config()
    cfg.set_main_option("script_location", str(folder))
    cfg.set_main_option("sqlalchemy.url", url)
    return cfg


def host_revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def tables(url: str, schema: str | None) -> set[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names(schema=schema))
    finally:
        engine.dispose()


def dex_cli(url: str, schema: str | None, *args: str) -> str:
    env = {"DEX_DATABASE_URL": url}
    if schema:
        env["DEX_DATABASE_SCHEMA"] = schema
    result = CliRunner().invoke(main, ["db", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("schema", [None, "dex"], ids=["host-schema", "own-schema"])
def test_dex_migrations_live_beside_the_hosts(
    database: str, tmp_path: Path, schema: str | None
) -> None:
    host = host_alembic(tmp_path, database)
    command.upgrade(host, "h1")
    assert host_revision(database) == "h1"

    out = dex_cli(database, schema, "upgrade")
    assert f"at revision {migrate.head()}" in out
    assert tables(database, schema) >= set(metadata.tables) | {"dex_alembic_version"}
    assert host_revision(database) == "h1"  # the host's version row is untouched
    assert "orders" in tables(database, None)

    command.upgrade(host, "head")  # the host's own next migration still works
    assert host_revision(database) == "h2"
    assert f"at revision {migrate.head()}" in dex_cli(database, schema, "current")

    # The store works in the configured schema.
    settings = Settings(database_url=database, database_schema=schema)
    store = Store(settings.database_url, schema=settings.database_schema)
    store.open_session("s1")
    assert store.get_session("s1").id == "s1"
    # The worker's outcome write (driver SQL compiled once, `store/hot.py`) too.
    store.insert_calls([new_call("s1/t/a")], epoch="e")
    row = OutcomeRow(CallKey.parse("s1/t/a"), "echo", "{}", Outcome(CallStatus.SUCCEEDED, "", "1"))
    store.record_outcomes([row, row])
    call = store.get_call("s1/t/a")
    assert call is not None and (call.status, call.result) == (CallStatus.SUCCEEDED, "1")
    _calls, history = store.snapshot("s1")
    assert [m.tool_output for m in history if m.role is MessageRole.TOOL] == ["1"]
    store.engine.dispose()

    assert "base (no tables)" in dex_cli(database, schema, "downgrade", "base")
    assert not tables(database, schema) & set(metadata.tables)
    assert host_revision(database) == "h2"
    command.downgrade(host, "h1")  # and the host's downgrade is unaffected
    assert host_revision(database) == "h1"
    dex_cli(database, schema, "upgrade")
    assert tables(database, schema) >= set(metadata.tables)


def test_a_schema_on_sqlite_is_refused() -> None:
    with pytest.raises(Exception, match="PostgreSQL"):
        Settings(database_url="sqlite:///x.db", database_schema="dex")
