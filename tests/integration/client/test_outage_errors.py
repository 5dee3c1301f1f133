"""A Redis or database outage through the public Python API: one typed error, short.

Each public entry point (`DexClient`, `AsyncDexClient`, `Dex`, `Approvals`, the sweeper,
`reconcile_once`) raises a `BackendUnavailable` whose message names the URL and the driver's
cause; the driver's own exception is kept as the error's `cause`, not chained, so a printed
traceback is a dozen lines instead of redis-py's or SQLAlchemy's 60 to 120
(`dex_celery/backend_errors.py`). Real outages: a Redis port and a PostgreSQL port nothing
answers, with a real migrated SQLite file (or a real Redis) for the other half.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy.exc

from devtools.processes import RedisServer, free_port
from devtools.toolapp import make_app
from dex_celery import (
    AsyncDexClient,
    CallRequest,
    DatabaseUnavailable,
    Dex,
    RedisUnavailable,
    Settings,
    reconcile_once,
)
from dex_celery.errors import DexError, ToolError
from dex_celery.store.repository import Store

#: Longest printed traceback accepted: the caller's frames and the wrapper's, not a driver's.
MAX_LINES = 40

CALLS: dict[str, Callable[[Dex], Any]] = {
    "DexClient.request_call": lambda d: d.client().request_call("s1", "t1", "c1", "echo", {}),
    "DexClient.request_calls": lambda d: d.client().request_calls(
        [CallRequest("s1", "t1", "c1", "echo", {})]
    ),
    "DexClient.open_session": lambda d: d.client().open_session("s1"),
    "DexClient.send_user_message": lambda d: d.client().send_user_message("s1", "hi"),
    "DexClient.approve": lambda d: d.client().approve("s1/t1/c1", "ann"),
    "DexClient.pending_approvals": lambda d: d.client().pending_approvals(),
    "Dex.approvals.pending": lambda d: d.approvals.pending(),
    "Dex.approvals.reject": lambda d: d.approvals.reject("s1/t1/c1", "ann"),
    "Dex.epoch": lambda d: d.epoch(),
    "Dex.sweeper.sweep_once": lambda d: d.sweeper.sweep_once(),
    "AsyncDexClient.request_call": lambda d: asyncio.run(
        AsyncDexClient(d).request_call("s1", "t1", "c1", "echo", {})
    ),
}
#: Entry points that read SQL before anything else: they meet a database outage.
SQL_CALLS: dict[str, Callable[[Dex], Any]] = {
    **CALLS,
    "DexClient.get_call": lambda d: d.client().get_call("s1/t1/c1"),
    "DexClient.get_agent_snapshot": lambda d: d.client().get_agent_snapshot("s1"),
    "reconcile_once": reconcile_once,
}


def raised(call: Callable[[Dex], Any], dex: Dex) -> DexError:
    with pytest.raises(DexError) as caught:
        call(dex)
    return caught.value


def assert_short(error: DexError, cause_type: type[BaseException]) -> None:
    printed = "".join(traceback.format_exception(error))
    lines = printed.splitlines()
    assert len(lines) <= MAX_LINES, printed
    assert "The above exception was the direct cause" not in printed, printed
    assert "During handling of the above exception" not in printed, printed
    assert isinstance(error.cause, cause_type), repr(error.cause)
    driver = getattr(error.cause, "orig", None) or error.cause  # SQLAlchemy wraps the DBAPI's
    assert str(driver).splitlines()[0].strip()[:40] in str(error), (error, error.cause)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_redis_outage_is_one_short_typed_error(name: str, tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'dex.db'}"
    Store(database).create_schema()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    _app, dex = make_app(Settings(redis_url=dead, database_url=database))
    error = raised(CALLS[name], dex)
    assert isinstance(error, RedisUnavailable), repr(error)
    assert dead in str(error) and "Connection refused" in str(error), str(error)
    assert_short(error, redis.RedisError)


@pytest.mark.parametrize("name", sorted(SQL_CALLS))
def test_database_outage_is_one_short_typed_error(name: str, redis_server: RedisServer) -> None:
    dead = f"postgresql+psycopg://dex@127.0.0.1:{free_port()}/dex"
    _app, dex = make_app(Settings(redis_url=redis_server.url, database_url=dead))
    error = raised(SQL_CALLS[name], dex)
    assert isinstance(error, DatabaseUnavailable), repr(error)
    assert "cannot use the database at postgresql+psycopg://dex@127.0.0.1" in str(error)
    assert_short(error, sqlalchemy.exc.SQLAlchemyError)


def test_a_chain_without_a_driver_error_is_kept() -> None:
    """A tool's own exception behind a dex-celery error is the tool author's to read."""
    from dex_celery.backend_errors import unchained  # the helper itself, only this test

    try:
        try:
            raise KeyError("sku-1")
        except KeyError as e:
            raise ToolError("no such item") from e
    except ToolError as e:
        error = unchained(e)
    assert isinstance(error.__cause__, KeyError) and error.cause is None
