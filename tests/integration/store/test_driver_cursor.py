"""The hot path's statements on the pooled DBAPI connection (`store/hot.py`, `driver_cursor`),
on SQLite and the running PostgreSQL: a failure rolls back everything the transaction wrote and
is raised as SQLAlchemy raises it (so `backend_errors` names it), the connection goes back to the
pool, and a connection the server dropped is invalidated instead of being handed out again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.pool import NullPool

from devtools.processes import free_port
from dex_celery.backend_errors import translate
from dex_celery.errors import DatabaseUnavailable, SchemaMissing
from dex_celery.store.hot import driver_cursor, hot_statements
from dex_celery.store.repository import Store
from dex_celery.store.schema import tool_calls
from tests.support.stores.databases import ON_BOTH_DATABASES, database_url

pytestmark = ON_BOTH_DATABASES


@pytest.fixture
def store(database_kind: str, tmp_path: Path) -> Iterator[Store]:
    with database_url(database_kind, tmp_path) as url:
        store = Store(url)
        store.create_schema()
        yield store
        store.engine.dispose()


def _calls(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(tool_calls)).scalar_one())


#: One group's count, as `count_ended` upserts it: the write each transaction below makes first.
COUNT = {
    "b_tool": "t",
    "b_effect": "read",
    "b_status": "succeeded",
    "b_shard": 0,
    "b_calls": 1,
    "b_attempts": 1,
    "b_retries": 0,
}
#: A write-fence claim of a call no one requested: it changes no row.
CLAIM_OF_NO_CALL = {
    "b_key": "s/t/none",
    "b_from": "pending",
    "b_fence": "f",
    "b_attempt": 1,
    "b_now": 1.0,
    "b_owner": "w",
}


def test_a_failing_statement_rolls_back_the_transaction_and_raises_sqlalchemys_error(
    store: Store,
) -> None:
    engine = store.engine
    insert = hot_statements(engine).count_ended
    with pytest.raises(sqlalchemy.exc.DBAPIError) as raised, driver_cursor(engine) as cursor:
        insert.execute_many(cursor, [COUNT])  # written, then the next statement fails
        cursor.execute("SELECT no_such_column FROM dex_tool_calls")
    assert raised.value.orig is not None
    assert isinstance(translate(raised.value, redis_url="", database_url=""), DatabaseUnavailable)
    with engine.connect() as conn:  # the count written before the failure was rolled back
        assert conn.execute(text("SELECT count(*) FROM dex_call_counts")).scalar_one() == 0
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_an_exception_of_the_caller_rolls_back_too(store: Store) -> None:
    engine = store.engine
    statements = hot_statements(engine)
    with pytest.raises(RuntimeError), driver_cursor(engine) as cursor:
        statements.count_ended.execute_many(cursor, [COUNT])
        raise RuntimeError("the caller gave up")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM dex_call_counts")).scalar_one() == 0
    with driver_cursor(engine) as cursor:  # the pool still serves; a claim of no call: 0 rows
        assert statements.claim_write.execute(cursor, CLAIM_OF_NO_CALL) == 0
    assert _calls(engine) == 0


def test_a_missing_schema_reads_as_schema_missing(store: Store) -> None:
    store.engine.dispose()
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE dex_tool_calls"))
    with pytest.raises(sqlalchemy.exc.DBAPIError) as raised:
        store.get_call("s/t/c")
    assert isinstance(translate(raised.value, redis_url="", database_url=""), SchemaMissing)


def _pg(store: Store) -> bool:
    return store.engine.dialect.name == "postgresql"


def test_a_connection_the_server_dropped_is_invalidated_not_reused(store: Store) -> None:
    if not _pg(store):
        pytest.skip("SQLite has no server to drop a connection")
    engine = store.engine
    with driver_cursor(engine) as cursor:  # the pool's one connection, and its server process
        cursor.execute("SELECT pg_backend_pid()")
        (backend,) = cursor.fetchall()[0]
    assert engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    killer = create_engine(store.url, poolclass=NullPool)  # not the pool's own connection
    with killer.connect() as other:
        other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
    killer.dispose()
    # The dropped connection is found (pre-ping at checkout, or the failed statement, which
    # invalidates it): the read is served on a new connection, and the next one too.
    try:
        assert store.get_call("s/t/c") is None
    except sqlalchemy.exc.DBAPIError as e:
        assert e.connection_invalidated
    assert store.get_call("s/t/c") is None
    with driver_cursor(engine) as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchall()[0][0] != backend


def test_a_connection_dropped_during_the_transaction_is_invalidated(store: Store) -> None:
    if not _pg(store):
        pytest.skip("SQLite has no server to drop a connection")
    engine = store.engine
    killer = create_engine(store.url, poolclass=NullPool)
    try:
        with pytest.raises(sqlalchemy.exc.DBAPIError) as raised, driver_cursor(engine) as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (backend,) = cursor.fetchall()[0]
            with killer.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
            cursor.execute("SELECT 1")
    finally:
        killer.dispose()
    assert raised.value.connection_invalidated
    assert isinstance(translate(raised.value, redis_url="", database_url=""), DatabaseUnavailable)
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    with driver_cursor(engine) as cursor:  # a new connection, not the dropped one
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchall()[0][0] != backend


def test_a_database_it_cannot_connect_to_is_a_sqlalchemy_error(
    database_kind: str, tmp_path: Path
) -> None:
    if database_kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'no-such-folder' / 'dex.db'}"
    else:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test"
    store = Store(url)
    with pytest.raises(sqlalchemy.exc.DBAPIError) as raised:
        store.get_call("s/t/c")
    assert isinstance(translate(raised.value, redis_url="", database_url=url), DatabaseUnavailable)
    store.engine.dispose()
