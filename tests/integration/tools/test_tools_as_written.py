"""Ordinary tools as a new user writes them, through a real prefork worker (issue 11).

Each test reproduces one behaviour the issue reported: an `async def` tool whose every call
failed with "coroutine is not JSON serializable"; a plain function returning a coroutine; a
30 MB result stored three times; Kombu's JSON type markers turning arguments into other Python
objects (or crashing the message); a write whose return value is not JSON recorded `failed`
although its effect took place.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

import redis

from devtools.processes import Worker
from devtools.toolapp import executions
from dex_celery import CallStatus, Dex

MB = 1024 * 1024


def _run(dex: Dex, tool: str, arguments: dict[str, Any], call: str = "c1") -> Any:
    client = dex.client()
    record = client.request_call("s1", "t1", call, tool, arguments)
    (done,) = client.wait([record.key], timeout=60)
    return done


def test_async_tool_is_awaited_not_serialised(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker()
    done = _run(dex, "async_echo", {"text": "hello"})
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert json.loads(done.result) == {"text": "hello", "attempt": 1}
    assert "never awaited" not in worker.log()


def test_a_plain_function_returning_a_coroutine_is_a_clear_error(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    worker = start_worker()
    done = _run(dex, "sync_returns_coroutine", {})
    assert done.status is CallStatus.FAILED
    assert "declare the tool with `async def`" in (done.error or "")
    assert "never awaited" not in worker.log()


def test_a_large_result_never_reaches_redis_or_sql_whole(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """30 MB results against the default 1 MiB `max_result_bytes`: a read fails saying so (it
    changed nothing); a write succeeded (its effect took place) with a note, not the result.
    Neither SQL, the ledger hash, nor the tool message holds more than a few kilobytes."""
    start_worker()
    read = _run(dex, "big_read", {"size": 30 * MB}, "read")
    write = _run(dex, "big_write", {"size": 30 * MB}, "write")
    assert read.status is CallStatus.FAILED
    assert "over the limit of 1048576 bytes (max_result_bytes)" in (read.error or "")
    assert write.status is CallStatus.SUCCEEDED
    note = json.loads(write.result)
    assert note["bytes"] == 30 * MB + 2
    assert "its effect took place" in note["result_not_kept"]
    assert len(executions("s1/t1/write")) == 1
    snapshot = dex.client().get_agent_snapshot("s1")
    assert all(len(m.tool_output or "") < 4096 for m in snapshot.messages)
    assert all(len(c.result or "") < 4096 for c in snapshot.tool_calls)
    r = redis.Redis.from_url(env["DEX_REDIS_URL"])
    assert r.info("memory")["used_memory"] < 20 * MB
    for key in ("s1/t1/read", "s1/t1/write"):
        fields = cast(dict[bytes, bytes], r.hgetall(dex.keys.call(key)))
        assert sum(len(v) for v in fields.values()) < 8192


def test_kombu_type_markers_reach_the_tool_as_sent(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """`{"__type__": "decimal", "__value__": "1.5"}` is a dict with two keys to the model, so the
    tool gets that dict (not a Decimal); an unknown marker does not poison the message."""
    start_worker()
    marker = {"__type__": "decimal", "__value__": "1.5"}
    typed = _run(dex, "typed", {"order": 7, "amount": "2.50", "note": marker}, "typed")
    assert typed.status is CallStatus.SUCCEEDED, typed.error
    assert json.loads(typed.result) == {
        "order": "7",
        "amount": "Decimal('2.50')",
        "note": repr(marker),
    }
    unknown = {"a": {"__type__": "no-such-type", "__value__": [1]}, "__type__": "bytes"}
    echoed = _run(dex, "echo", unknown, "unknown")
    assert echoed.status is CallStatus.SUCCEEDED, echoed.error
    assert json.loads(echoed.result)["arguments"] == unknown
    assert json.loads(echoed.arguments) == unknown


def test_a_write_returning_a_value_that_is_not_json_succeeded(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Its effect took place (the tool's own log says so): the record must not say `failed`,
    or the model would call it again."""
    start_worker()
    done = _run(dex, "non_json_write", {})
    assert len(executions(done.key)) == 1
    assert done.status is CallStatus.SUCCEEDED
    assert "not JSON" in json.loads(done.result)["result_not_kept"]


def test_secrets_survive_a_retry_and_an_approval(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """SQL keeps the secret only sealed; a retry (arguments read back from SQL) and an approved
    call (started from its SQL record) still give the tool the real value, and the retryable
    error that quoted the token was scrubbed."""
    start_worker()
    client = dex.client()
    token = "tok-retry-0123456789"
    done = _run(dex, "flaky_secret", {"api_token": token}, "retry")
    assert done.status is CallStatus.SUCCEEDED, done.error
    assert json.loads(done.result) == {"attempt": 2, "token_length": len(token)}
    assert token not in (done.attempt_log or "") + done.arguments
    card = "4111111111111111"
    record = client.request_call("s1", "t1", "card", "guarded_secret", {"card": card})
    assert json.loads(record.arguments) == {"card": "***"}
    (pending,) = client.pending_approvals()
    assert card not in repr(pending)
    client.approve(record.key, "ops")
    (approved,) = client.wait([record.key], timeout=30)
    assert json.loads(approved.result) == {"card_length": 16, "echo": "charged ***"}
