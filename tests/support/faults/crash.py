"""Helpers of the crash tests: read what the tools, the ledger, the broker and SQL say.

Every crash test checks two independent witnesses: the record (SQL, ledger, events) and the
tool's own side-effect log (`toolapp.executions`). These helpers read them, never sleep blindly.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import redis
from sqlalchemy import func, select

from devtools.processes import Worker, wait_for
from devtools.toolapp import LOG_ENV, STALL_RECORDER_ENV, executions, log_dir, make_app
from dex_celery import Dex, Settings
from dex_celery.engine.upkeep.sweep import run_forever
from dex_celery.model.ids import CallKey
from dex_celery.model.records import MessageRole, ToolCallRecord
from dex_celery.processes.celery_config import is_amqp_url
from dex_celery.settings import env_name
from dex_celery.store.schema import tool_calls
from dex_celery.testing import assertions
from dex_celery.tools.tool import TASK_PREFIX
from tests.support.faults.rabbitmq import queued_task_ids

#: Celery's default queue: the Redis list every attempt message is pushed to.
BROKER_QUEUE = "celery"


def lines(key: str, what: str) -> list[tuple[int, int, str]]:
    """`(attempt, pid, key)` of each `what` line (`start` / `end`) the tool logged for `key`."""
    out = []
    for line in executions(key):
        kind, attempt, pid, logged_key = line.split(" ", 3)
        if kind == what:
            out.append((int(attempt), int(pid), logged_key))
    return out


def wait_started(key: str, *, attempt: int = 1, timeout: float = 60) -> int:
    """Wait until the tool itself logged the start of `attempt`; return the pid running it."""
    wait_for(
        lambda: any(a == attempt for a, _, _ in lines(key, "start")),
        timeout=timeout,
        what=f"the tool to start attempt {attempt} of {key}",
    )
    return next(pid for a, pid, _ in lines(key, "start") if a == attempt)


def runs_in(worker: Worker, pid: int) -> bool:
    """Is process `pid` (from the tool's own log) `worker`'s: its main process (threads pool)
    or one of its pool processes (prefork)? Asked while the worker lives."""
    return pid == worker.pid or pid in worker.children()


def wait_finished(dex: Dex, key: str, *, timeout: float = 60) -> ToolCallRecord:
    """`dex_celery.testing.assertions.wait_finished`, saying on a timeout where the call is."""
    try:
        return assertions.wait_finished(dex, key, timeout=timeout)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}; {_where_is(dex, key)}") from None


def _where_is(dex: Dex, key: str) -> str:
    """What the record, the ledger and the tool's log say of a call that did not finish."""
    try:
        entry: object = dex.ledger.client.hgetall(dex.ledger.keys.call(key))
        epoch: object = dex.ledger.client.get(dex.ledger.keys.epoch)
    except redis.RedisError as error:
        entry = epoch = f"unreadable ({error})"
    worker_lines = [
        line
        for path in sorted(log_dir().glob("worker-*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if key in line
    ]
    return (
        f"record: {dex.store.get_call(key)!r}; ledger epoch {epoch!r}, entry {entry!r}; "
        f"tool log: {executions(key)!r}; workers' log lines: {worker_lines[-12:]!r}"
    )


def wait_late_result(dex: Dex, key: str, *, timeout: float = 30) -> ToolCallRecord:
    """Wait until a late result (S5.2) has been kept on the record of `key` and return it."""
    return assertions.wait_late_result(dex, key, timeout=timeout)


def release_tools(env: dict[str, str]) -> None:
    """Let every held `slow_*` tool return (see `toolapp._hold`)."""
    (Path(env[LOG_ENV]) / "release").write_text("go")


def finished_events(dex: Dex, key: str, timeout: float = 30) -> int:
    """How many `tool_call_finished` events the call has, once it has one. The event follows
    the record's SQL commit (docs/semantics.md S7.3): a record already read from SQL may not
    have it yet, so asserting at once would race the recorder."""
    wait_for(
        lambda: events(dex, type_="tool_call_finished", key=key),
        timeout=timeout,
        what=f"the tool_call_finished event of {key}",
    )
    return len(events(dex, type_="tool_call_finished", key=key))


def events(dex: Dex, *, type_: str | None = None, key: str | None = None) -> list[dict[str, str]]:
    """Every event in the AgentEvents stream, optionally of one type and one call."""
    out = []
    entries: list[tuple[str, dict[str, str]]] = []
    for shard in dex.keys.all_shards:  # every shard's stream (one on a single node)
        entries += cast(list[tuple[str, dict[str, str]]], dex.ledger.client.xrange(shard.events))
    entries.sort(key=lambda e: tuple(int(p) for p in e[0].split("-")))
    for _id, fields in entries:
        if type_ is not None and fields.get("type") != type_:
            continue
        if key is not None and fields.get("key") != key:
            continue
        out.append(dict(fields))
    return out


def tool_messages(dex: Dex, key: str) -> list[str]:
    """The TOOL messages the model would read for `key` (S4.4)."""
    call = CallKey.parse(key)
    _calls, history = dex.store.snapshot(call.session_id)
    return [
        m.tool_output or ""
        for m in history
        if m.role is MessageRole.TOOL
        and m.tool_call_id == call.tool_call_id
        and m.turn_id == call.turn_id
    ]


def republish(dex: Dex, record: ToolCallRecord, attempt: int) -> None:
    """Send the very message of `attempt` again: same task name, task id and kwargs (a stale or
    duplicated delivery, as a broker redelivery or an operator's replay would produce)."""
    key = CallKey.parse(record.key)
    dex.celery.send_task(
        TASK_PREFIX + record.tool_name,
        kwargs={"key": record.key, "attempt": attempt, "arguments": json.loads(record.arguments)},
        task_id=key.task_id(attempt),
    )


def refused(dex: Dex, key: str) -> int:
    """How many claims of `key` the ledger turned away (claim.lua counts them)."""
    entry = dex.ledger.read(key)
    return entry.refused if entry is not None else 0


def broker_task_ids(client: redis.Redis, queue: str = BROKER_QUEUE) -> list[str]:
    """Task ids of the messages waiting in the broker's list for `queue` (no worker running)."""
    ids = []
    for raw in client.lrange(queue, 0, -1):
        message: dict[str, Any] = json.loads(raw)
        ids.append(str(message["headers"]["id"]))
    return ids


#: Kombu's Redis transport keeps each delivered, unacknowledged message in this hash.
KOMBU_UNACKED = "unacked"


def broker_holds(env: dict[str, str], task_id: str) -> bool:
    """Does the broker hold a copy of message `task_id` it may give out again? On Redis, Kombu's
    hash of delivered, unacknowledged messages (restored after the visibility timeout); on
    RabbitMQ, the queue itself, where a dead consumer's unacknowledged messages return at once
    (no worker may be consuming while this is asked)."""
    broker_url = env.get("DEX_BROKER_URL")
    if broker_url and is_amqp_url(broker_url):
        return task_id in queued_task_ids(broker_url, BROKER_QUEUE)
    client = redis.Redis.from_url(env["DEX_REDIS_URL"])
    return any(task_id.encode() in m for m in client.hvals(KOMBU_UNACKED))


def count_calls(dex: Dex) -> int:
    """How many tool-call records the database holds (nothing was written, say)."""
    with dex.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(tool_calls)).scalar_one())


def env_names() -> frozenset[str]:
    """Every environment variable the settings read (checked against docker-compose.yml)."""
    return frozenset(env_name(f.name) for f in dataclasses.fields(Settings))


def dex_with_sweeper(environ: dict[str, str]) -> Iterator[Dex]:
    """The test tools' Dex built from `environ`, with a sweeper loop running in a thread until
    the generator is closed (a fixture yields from it)."""
    _app, own = make_app(Settings.from_env(environ))
    stop = threading.Event()
    thread = threading.Thread(target=run_forever, args=(own,), kwargs={"stop": stop}, daemon=True)
    thread.start()
    yield own
    stop.set()
    thread.join(timeout=15)


def stalled_recorder_writes(
    dex: Dex, start_worker: Callable[..., Worker], pid_file: Path
) -> list[ToolCallRecord]:
    """Start a worker whose outcome recorder stalls (writing its pid to `pid_file`), then
    request three quick writes of one turn for it."""
    start_worker(extra_env={STALL_RECORDER_ENV: str(pid_file)})
    client = dex.client()
    return [
        client.request_call("s1", "t1", f"c{i}", "slow_non_idempotent_write", {"seconds": 0})
        for i in range(3)
    ]
