"""A secret planted in arguments and in an exception's text appears nowhere (S10.4; issue 11,
test 4): not in any SQL text column, not anywhere in Redis (ledger, events, the broker's queue
and unacked hash), not in the worker's log, the events, the snapshot, the CLI, nor a real
Flower's API. The issue's example: `int(api_token)` raising `ValueError` with the token in it.

The same search runs for secrets of any shape (S11.1 in docs/secrets.md terms: every leaf of a
dict or list under a secret argument; issue 19, finding 5): a password inside a dict, an item of
a list inside it and a number, put by the tool into its error text and its result, searched in
the same places and in the web app's pages.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis
from click.testing import CliRunner
from sqlalchemy import select

import devtools.toolapp as toolapp
from devtools.processes import Worker, wait_for
from dex_celery import CallStatus, Dex, ToolCallRecord
from dex_celery.cli.main import main
from dex_celery.store.schema import metadata
from tests.support.faults.crash import finished_events, wait_finished
from tests.support.processes.flower_process import (
    Flower,
    _wait_until_flower_receives_events,
    flower,
)

__all__ = ["flower"]  # the fixture, imported for this module's tests

#: Planted in the arguments of a failing write (and so in its exception text) ...
TOKEN = "tok-9f8e7d6c-planted-in-the-error"
#: ... and of a succeeding read.
OTHER = "sk-live-5a4b3c2d-second-secret"


def everything_in_redis(client: redis.Redis) -> str:
    """Every key and value of the Redis database, as one text."""
    out: list[str] = []
    for key in cast(list[bytes], client.keys("*")):
        kind = client.type(key).decode()
        value: Any
        if kind == "string":
            value = client.get(key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            value = client.smembers(key)
        elif kind == "stream":
            value = client.xrange(key)
        else:
            value = kind
        out.append(f"{key!r} {value!r}")
    return "\n".join(out)


def everything_in_sql(dex: Dex) -> str:
    with dex.store.engine.connect() as conn:
        return "\n".join(
            repr(tuple(row))
            for table in metadata.sorted_tables
            for row in conn.execute(select(table))
        )


#: Leaves of a secret dict argument (`credentials`), each of which the tools put into texts.
PASSWORD = "pw-7c6b5a49-nested-in-a-dict"
LISTED = "key-3e2d1c0b-second-in-a-list"
PIN = 7351902468
CREDENTIALS = {"user": "bob", "password": PASSWORD, "keys": ["k-1", LISTED], "pin": PIN}
NESTED = (PASSWORD, LISTED, str(PIN))


def assert_absent(where: str, text: str, secrets: tuple[str, ...] = (TOKEN, OTHER)) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret value in {where}"


def search_the_cli(commands: list[list[str]], absent: Callable[[str, str], None]) -> None:
    """Each `dex-celery` command's output, on the test tools' app, holds no secret."""
    runner = CliRunner()
    for args in commands:
        result = runner.invoke(main, ["--app", "devtools.toolapp:dex", *args])
        assert result.exit_code == 0, result.output
        absent(f"dex-celery {' '.join(args)}", result.output)


def search_flower(flower: Flower, keys: list[str], absent: Callable[[str, str], None]) -> None:
    """Celery's task events (task-sent, -received, -failed, -succeeded) as Flower keeps them,
    once it shows every call's first attempt ended, hold no secret."""

    def shows_all() -> bool:
        tasks = flower.tasks()
        return all(tasks.get(f"{k}#1", {}).get("state") in ("SUCCESS", "FAILURE") for k in keys)

    wait_for(shows_all, timeout=30, what="Flower to show both tasks")
    _, listing = flower.get("/api/tasks")
    absent("Flower's task list", listing)
    for key in keys:
        _, info = flower.get(f"/api/task/info/{urllib.request.quote(f'{key}#1', safe='')}")
        assert key in info
        absent("Flower's task info", info)


@dataclass(frozen=True)
class SecretRun:
    """A leaking write and a read, requested before any worker ran and then run to their end."""

    broker: redis.Redis
    worker: Worker
    failed: ToolCallRecord
    succeeded: ToolCallRecord


@pytest.fixture
def env(env: dict[str, str]) -> dict[str, str]:
    """The calls are requested before the worker starts: its start on a loaded machine must not
    run into their queue deadline (the tests' default is 5 s)."""
    return {**env, "DEX_SCHEDULE_TO_START": "120"}


#: Runs the two calls (write, read) and searches for what `absent` is given: a `SecretRun`.
RequestThenRun = Callable[[list[tuple[str, dict[str, Any]]], Callable[[str, str], None]], SecretRun]


@pytest.fixture
def request_then_run(
    dex: Dex, env: dict[str, str], start_worker: Callable[[], Worker], flower: Flower
) -> RequestThenRun:
    def run(
        calls: list[tuple[str, dict[str, Any]]], absent: Callable[[str, str], None]
    ) -> SecretRun:
        return _request_then_run(dex, env, calls, start_worker, flower, absent)

    return run


def _request_then_run(
    dex: Dex,
    env: dict[str, str],
    calls: list[tuple[str, dict[str, Any]]],
    start_worker: Callable[[], Worker],
    flower: Flower,
    absent: Callable[[str, str], None],
) -> SecretRun:
    """Request a leaking write and a read before any worker runs, search what rests in Redis
    and SQL while their messages sit in the broker's queue, then start a worker (with Flower
    receiving its events) and wait for both to end: the write failed, the read succeeded."""
    client = dex.client()
    broker = redis.Redis.from_url(env["DEX_REDIS_URL"])
    leaky, read = (
        client.request_call("s1", "t1", name, tool, arguments)
        for name, (tool, arguments) in zip(("leaky", "read"), calls, strict=True)
    )
    assert broker.llen("celery") == 2
    absent("Redis with the messages queued", everything_in_redis(broker))
    absent("SQL before the run", everything_in_sql(dex))
    worker = start_worker()
    _wait_until_flower_receives_events(dex, flower)
    failed = wait_finished(dex, leaky.key, timeout=30)
    succeeded = wait_finished(dex, read.key, timeout=30)
    assert failed.status is CallStatus.FAILED, failed
    assert succeeded.status is CallStatus.SUCCEEDED, succeeded
    return SecretRun(broker, worker, failed, succeeded)


def test_a_secret_appears_in_no_output_and_not_in_clear_at_rest(
    dex: Dex,
    flower: Flower,
    request_then_run: RequestThenRun,
    monkeypatch: Any,
) -> None:
    run = request_then_run(
        [
            ("leaky", {"order": 7, "api_token": TOKEN}),
            ("with_secret", {"query": "orders", "api_token": OTHER}),
        ],
        assert_absent,
    )
    client, broker, worker = dex.client(), run.broker, run.worker
    failed, succeeded = run.failed, run.succeeded

    # The tool really got the values (the read reports the token's length; the write raised).
    assert failed.error == "ValueError: invalid literal for int() with base 10: '***'"
    assert json.loads(succeeded.result or "")["token_length"] == len(OTHER)
    assert json.loads(failed.arguments) == {"order": 7, "api_token": "***"}
    assert failed.sealed_arguments  # kept sealed, so a retry or an approval can still run

    # The worker logged the traceback, scrubbed.
    wait_for(lambda: "ValueError" in worker.log(), timeout=10, what="the worker's error log")
    assert "invalid literal for int()" in worker.log()
    assert_absent("the worker's log", worker.log())
    assert_absent("SQL", everything_in_sql(dex))
    assert_absent("Redis", everything_in_redis(broker))

    # The event follows the record's SQL commit: waited for, not raced.
    assert finished_events(dex, failed.key) == 1
    events = [e for e in client.events("0")]
    assert any(e.type == "tool_call_finished" and e.key == failed.key for e in events)
    assert_absent("events", repr(events))
    snapshot = client.get_agent_snapshot("s1")
    assert len(snapshot.messages) == 2
    assert_absent("the snapshot", repr(snapshot))

    monkeypatch.setattr(toolapp, "dex", dex)
    search_the_cli(
        [
            ["calls", "show", failed.key],
            ["calls", "show", failed.key, "--json"],
            ["calls", "show", succeeded.key, "--json"],
            ["calls", "list", "--json"],
            ["calls", "list"],
        ],
        assert_absent,
    )
    search_flower(flower, [failed.key, succeeded.key], assert_absent)


def test_a_secret_inside_a_dict_or_list_appears_nowhere(
    dex: Dex,
    flower: Flower,
    request_then_run: RequestThenRun,
    monkeypatch: Any,
) -> None:
    """Issue 19, finding 5: `credentials={"user": ..., "password": ...}` under
    `secret_arguments=["credentials"]`, the tool putting its leaves into its error and result."""
    from dex_celery.web.app import WebApp
    from tests.support.web.web_session import CREDENTIALS as WEB_USERS
    from tests.support.web.web_session import signed_in

    def absent(where: str, text: str) -> None:
        assert_absent(where, text, NESTED)

    run = request_then_run(
        [
            ("leaky_nested", {"order": 7, "credentials": CREDENTIALS}),
            ("nested_secret", {"query": "orders", "credentials": CREDENTIALS}),
        ],
        absent,
    )
    client, broker, worker = dex.client(), run.broker, run.worker
    failed, succeeded = run.failed, run.succeeded

    # The tools got the real values, and what they said keeps its shape with *** in place.
    assert failed.error == ("ValueError: login refused for bob with password ***, key ***, pin ***")
    result = json.loads(succeeded.result or "")
    assert result == {
        "query": "orders",
        "password_length": len(PASSWORD),
        "echo": "used ***",
        "keys": ["k-1", "***"],
        "pin": "***",
    }
    assert json.loads(failed.arguments) == {"order": 7, "credentials": "***"}
    assert failed.sealed_arguments

    wait_for(lambda: "login refused" in worker.log(), timeout=10, what="the worker's error log")
    # The tool's own log line and print (Celery logs a pool process's stdout) are kept, scrubbed.
    assert "about to log in with ***" in worker.log()
    assert "charging order 7 with ***" in worker.log()
    absent("the worker's log", worker.log())
    absent("SQL", everything_in_sql(dex))
    absent("Redis", everything_in_redis(broker))
    absent("events", repr(list(client.events("0"))))
    absent("the snapshot", repr(client.get_agent_snapshot("s1")))

    monkeypatch.setattr(toolapp, "dex", dex)
    search_the_cli(
        [
            ["calls", "show", failed.key],
            ["calls", "show", failed.key, "--json"],
            ["calls", "show", succeeded.key],
            ["calls", "show", succeeded.key, "--json"],
            ["calls", "list", "--json"],
            ["calls", "list"],
        ],
        absent,
    )

    web = signed_in(WebApp(dex, WEB_USERS), "alice", "pw-a")
    for path in ("/calls", "/calls?session=s1", f"/calls/{failed.key}", f"/calls/{succeeded.key}"):
        page = web.get(path)
        assert page.status_code == 200, path
        absent(f"the web page {path}", page.text)

    search_flower(flower, [failed.key, succeeded.key], absent)
