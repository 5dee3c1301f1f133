"""SQLite's WAL checkpoints taken off the commits on a call's path (docs/benchmarks.md, section
18; `dex_celery/store/wal_checkpoint.py`): the outcome writer copies the log back into the
database file itself, in the background, every `CHECKPOINT_AFTER` outcomes.

What shows a checkpoint ran is the database file alone: a copy of it without its `-wal` file
holds only what was copied back. Each test keeps far fewer pages in the log than the 1,000 at
which a commit checkpoints on its own, so without the writer's checkpoints the copy holds none
of the rows.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, event

from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex
from dex_celery.store.sql_engine import make_engine
from dex_celery.store.wal_checkpoint import CHECKPOINT_AFTER, WalCheckpointer


def _rows_in_the_file_alone(database: Path, table: str, where: str = "") -> int | None:
    """The rows of `table` (0 while the table itself is not there) in a copy of the database
    file without its log; None while the copy caught a checkpoint half-way (it is taken again
    at the next poll)."""
    copy = database.with_name(f"copy-{database.name}")
    shutil.copyfile(database, copy)
    try:
        connection = sqlite3.connect(copy)
        try:
            (tables,) = connection.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
            ).fetchone()
            if not tables:
                return 0
            return int(connection.execute(f"SELECT count(*) FROM {table} {where}").fetchone()[0])
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        if "malformed" not in str(error) and "not a database" not in str(error):
            raise
        return None
    finally:
        for suffix in ("", "-wal", "-shm"):
            copy.with_name(copy.name + suffix).unlink(missing_ok=True)


@pytest.fixture
def database(tmp_path: Path) -> tuple[Path, Engine]:
    """A WAL-mode SQLite file whose own commits never checkpoint, with ten rows in its log."""
    path = tmp_path / "wal.db"
    engine = make_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _no_automatic_checkpoints(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")

    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (n INTEGER)")
    for n in range(10):
        with engine.begin() as connection:
            connection.exec_driver_sql(f"INSERT INTO t VALUES ({n})")
    assert _rows_in_the_file_alone(path, "t") == 0
    return path, engine


def test_enough_outcomes_copy_the_log_into_the_database_file(
    database: tuple[Path, Engine],
) -> None:
    path, engine = database
    checkpointer = WalCheckpointer(engine)
    checkpointer.wrote(CHECKPOINT_AFTER - 1)
    assert checkpointer.runs == 0  # fewer outcomes than the threshold: no thread, no copy
    assert _rows_in_the_file_alone(path, "t") == 0
    checkpointer.wrote(1)
    wait_for(
        lambda: _rows_in_the_file_alone(path, "t") == 10,
        timeout=10,
        what="the ten rows in the database file itself",
    )
    assert checkpointer.runs == 1


def test_a_failed_checkpoint_is_logged_and_the_next_one_runs_on_a_new_connection(
    database: tuple[Path, Engine], caplog: pytest.LogCaptureFixture
) -> None:
    path, engine = database
    checkpointer = WalCheckpointer(engine, after=1)
    checkpointer.checkpoint()
    assert checkpointer.runs == 1
    checkpointer._connection.dbapi_connection.close()  # the connection breaks under it
    with caplog.at_level(logging.WARNING, logger="dex_celery.store.wal_checkpoint"):
        checkpointer.checkpoint()
    assert checkpointer.runs == 1
    assert "a WAL checkpoint failed" in caplog.text
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO t VALUES (10)")
    checkpointer.checkpoint()
    assert checkpointer.runs == 2
    assert _rows_in_the_file_alone(path, "t") == 11


def test_a_server_database_gets_no_checkpointer() -> None:
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # never connected
    assert WalCheckpointer.for_engine(engine) is None


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_worker_copies_its_outcomes_into_the_database_file(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], pool: str
) -> None:
    """The recorder (prefork) and a threads worker's writer thread both checkpoint: after
    `CHECKPOINT_AFTER` calls the database file itself holds their records, with ~11 pages of
    log a call far under the 1,000 at which a commit would have copied them.

    A passive checkpoint copies only what no reader still needs, so one taken while a reader
    (this test's `wait`, say) still held an older snapshot leaves part of the log behind, and
    nothing else here checkpoints before the 1,000 pages. If the first round's checkpoint came
    short (seen beside `stress --cpu 2`), a second round of `CHECKPOINT_AFTER` calls makes the
    writer checkpoint again: still some 750 pages of log in all, under the commits' mark."""
    start_worker(pool=pool)
    client = dex.client()
    path = Path(env["DEX_DATABASE_URL"].removeprefix("sqlite:///"))
    succeeded = f"WHERE status = '{CallStatus.SUCCEEDED.value}'"

    def copied() -> bool:
        rows = _rows_in_the_file_alone(path, "dex_tool_calls", succeeded)
        return (rows or 0) >= CHECKPOINT_AFTER

    sent = 0
    for calls, deadline in ((CHECKPOINT_AFTER + 4, 20), (CHECKPOINT_AFTER, 60)):
        keys = [
            client.request_call("s1", "t1", f"c{n}", "echo", {"n": n}).key
            for n in range(sent, sent + calls)
        ]
        sent += calls
        records = client.wait(keys, timeout=60)
        assert all(r.status is CallStatus.SUCCEEDED for r in records)
        try:
            # A deadline, not a measure: a busy 2-core machine copies late.
            wait_for(copied, timeout=deadline, what="the records in the database file")
            return
        except AssertionError:
            continue
    raise AssertionError(
        f"fewer than {CHECKPOINT_AFTER} of {sent} records in the database file itself after "
        "two rounds of the writer's checkpoints"
    )
