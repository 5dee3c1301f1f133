"""Alembic migrations: the production path to the schema (S9.1; docs/ledger.md).

Upgrade from an empty database on SQLite and on the PostgreSQL of this machine (a database of
its own, created and dropped here, so no other test's tables are touched), a downgrade-upgrade
round trip, and the migrated schema equal to `dex_celery.store.schema.metadata`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import inspect, text

from devtools.toolapp import make_app
from dex_celery import Settings
from dex_celery.cli.main import main
from dex_celery.ops.status import State, database_section
from dex_celery.store import migrate
from dex_celery.store.repository import Store
from dex_celery.store.schema import metadata
from dex_celery.store.sql_engine import make_engine
from tests.support.stores.pg_database import fresh_database

DEX_TABLES = set(metadata.tables)


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


def differences(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return migrate.schema_differences(conn)
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'migrated.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the server at DEX_TEST_POSTGRES_URL, dropped after."""
    with fresh_database("dex_migrations") as url:
        yield url


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_upgrade_from_empty_creates_exactly_the_schema(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """An empty database migrated to head has every table of `metadata`, and alembic's
    compare_metadata finds no difference (columns, types, indexes, constraints)."""
    url = request.getfixturevalue(f"{backend}_url")
    assert migrate.current(url) is None
    assert migrate.upgrade(url) == migrate.head()
    assert tables(url) >= DEX_TABLES | {migrate.VERSION_TABLE}
    assert differences(url) == []
    # And the store works on the migrated schema.
    store = Store(url)
    store.open_session("s1")
    assert store.get_session("s1").id == "s1"
    store.engine.dispose()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_downgrade_upgrade_round_trip(backend: str, request: pytest.FixtureRequest) -> None:
    """Down to base removes every dex-celery table; up again restores the same schema."""
    url = request.getfixturevalue(f"{backend}_url")
    migrate.upgrade(url)
    assert migrate.downgrade(url, "base") is None
    assert not tables(url) & DEX_TABLES
    assert migrate.upgrade(url) == migrate.head()
    assert differences(url) == []


def test_other_services_tables_are_left_alone(sqlite_url: str) -> None:
    """The order desk keeps its own tables in the same database: migrations neither report
    nor drop them."""
    from tasks.orderdesk import OrderDesk

    desk = OrderDesk(sqlite_url)
    desk.add_order(customer="Ada", total_cents=100)
    migrate.upgrade(sqlite_url)
    assert differences(sqlite_url) == []
    migrate.downgrade(sqlite_url, "base")
    assert "orderdesk_orders" in tables(sqlite_url)
    desk.engine.dispose()


def test_a_create_schema_database_is_adopted(sqlite_url: str) -> None:
    """A database made by `Store.create_schema()` (tests, old demos) is stamped, not re-created."""
    Store(sqlite_url).create_schema()
    assert migrate.upgrade(sqlite_url) == migrate.head()
    assert differences(sqlite_url) == []


def test_db_commands_use_the_configured_database(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`dex-celery db upgrade|current|downgrade` read DEX_DATABASE_URL from the settings."""
    monkeypatch.setenv("DEX_DATABASE_URL", sqlite_url)
    runner = CliRunner()
    out = runner.invoke(main, ["db", "current"])  # reading creates no database file
    assert out.exit_code == 1 and "does not exist" in out.output
    out = runner.invoke(main, ["db", "upgrade"])
    assert out.exit_code == 0 and f"at revision {migrate.head()}" in out.output
    assert migrate.current(sqlite_url) == migrate.head()
    out = runner.invoke(main, ["db", "current"])
    assert out.exit_code == 0 and f"at revision {migrate.head()}" in out.output
    out = runner.invoke(main, ["db", "downgrade", "base"])
    assert out.exit_code == 0 and "base (no tables)" in out.output
    assert not tables(sqlite_url) & DEX_TABLES


def _stamp(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = :r"), {"r": revision}
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_database_stamped_with_a_renamed_revision_upgrades(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """The secrets migration was `11_secrets.py` with revision `i11_secrets`; it is now
    `0003_secrets.py`, revision `0003`. A database migrated by the old code (stamped
    `i11_secrets`) upgrades, downgrades and reports its revision under the new name."""
    url = request.getfixturevalue(f"{backend}_url")
    assert migrate.upgrade(url, "0003") == "0003"
    _stamp(url, "i11_secrets")  # what the old code left in the version table
    assert migrate.current(url) == "i11_secrets"
    assert migrate.upgrade(url) == migrate.head()
    assert differences(url) == []
    assert migrate.downgrade(url, "0003") == "0003"
    _stamp(url, "i11_secrets")
    assert migrate.downgrade(url, "0002") == "0002"
    assert migrate.upgrade(url) == migrate.head()
    assert differences(url) == []


def test_every_migration_is_named_by_its_revision() -> None:
    versions = migrate.MIGRATIONS / "versions"
    for path in sorted(versions.glob("*.py")):
        if path.name == "__init__.py":
            continue
        number = path.name.split("_", 1)[0]
        assert number.isdigit() and len(number) == 4, path.name
        assert f'revision: str = "{number}"' in path.read_text(), path.name


def test_a_schema_newer_than_the_code_is_told_apart(sqlite_url: str) -> None:
    """During a deploy the new release migrates first, and the old code still runs
    (docs/deploy.md): its `status` says the schema is newer, not "run `dex-celery db upgrade`"."""
    migrate.upgrade(sqlite_url)
    assert migrate.knows(migrate.head()) and migrate.knows("0001")
    assert migrate.knows("i11_secrets")  # a renamed revision is still this code's
    assert not migrate.knows("9999")
    _app, dex = make_app(Settings(database_url=sqlite_url))
    assert database_section(dex).state is State.OK
    _stamp(sqlite_url, "9999")
    section = database_section(dex)
    assert section.state is State.WARN
    assert section.detail.startswith(
        f"schema at revision 9999, newer than this code's {migrate.head()}"
    )
    assert "db upgrade" not in section.detail
