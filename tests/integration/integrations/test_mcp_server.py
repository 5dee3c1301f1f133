"""`dex-celery mcp` driven by the `mcp` SDK's own client, over stdio and over streamable HTTP:
list the tools (annotations from effect classes), call a read, call a write that needs
approval (answered at once), approve it, call again (the record's text); a real worker runs the
tools and the tool's own log counts executions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from devtools.processes import ROOT, Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.mcp.outcome import OUTCOME_META_KEY
from dex_celery.integrations.mcp.server import EFFECT_META_KEY, STATUS_META_KEY
from dex_celery.integrations.mcp.wire import IDEMPOTENCY_META_KEY
from tests.support.apps.span_file import SPANS_ENV, read_spans
from tests.support.faults.crash import lines, tool_messages
from tests.support.mcp.server import APP, DEX_CELERY, _server, _text


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_dex_tools_served_over_mcp(
    transport: str, dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    client = dex.client()
    read_key, write_key = f"s-{transport}/t1/read", f"s-{transport}/t1/write"

    async def scenario(target: Any) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with Client(target) as mcp:
            listed = {t.name: t for t in (await mcp.list_tools()).tools}
            seen["tools"] = listed
            seen["read"] = await mcp.call_tool(
                "echo", {"x": 1}, meta={IDEMPOTENCY_META_KEY: read_key}
            )
            seen["pending"] = await mcp.call_tool(
                "guarded_write", {"value": "ok"}, meta={IDEMPOTENCY_META_KEY: write_key}
            )
            await anyio.to_thread.run_sync(client.approve, write_key, "ops@example.com")
            seen["written"] = await mcp.call_tool(
                "guarded_write", {"value": "ok"}, meta={IDEMPOTENCY_META_KEY: write_key}
            )
            seen["again"] = await mcp.call_tool(
                "guarded_write", {"value": "ok"}, meta={IDEMPOTENCY_META_KEY: write_key}
            )
            seen["unknown"] = await mcp.call_tool("no_such_tool", {})
            seen["no_ids"] = await mcp.call_tool("echo", {})
            # A client that sends no ids: asking the same again after approval gets the outcome.
            plain = await mcp.call_tool("guarded_write", {"value": "plain"})
            seen["plain_pending"] = plain
            await anyio.to_thread.run_sync(
                client.approve, plain.meta[IDEMPOTENCY_META_KEY], "ops@example.com"
            )
            seen["plain_written"] = await mcp.call_tool("guarded_write", {"value": "plain"})
            seen["plain_new"] = await mcp.call_tool("guarded_write", {"value": "plain"})
        return seen

    with _server(transport, env) as target:
        seen = anyio.run(scenario, target)

    tools = seen["tools"]
    echo, write = tools["echo"].annotations, tools["guarded_write"].annotations
    assert (echo.read_only_hint, echo.idempotent_hint, echo.destructive_hint) == (True, True, False)
    assert (write.read_only_hint, write.idempotent_hint, write.destructive_hint) == (
        False,
        False,
        True,
    )
    failing = tools["failing"].annotations  # idempotent_write
    assert (failing.read_only_hint, failing.idempotent_hint) == (False, True)
    assert tools["slow_unclassified"].annotations is None  # nothing known: MCP's defaults
    assert tools["guarded_write"].meta[EFFECT_META_KEY] == "non_idempotent_write"
    # Input schemas read from the tools' signatures (the tool's `input_schema`, built once at
    # registration: the one schema requests are checked against).
    seconds = tools["slow_read"].input_schema["properties"]["seconds"]
    assert (seconds["type"], seconds["default"]) == ("number", 30.0)
    assert tools["slow_read"].input_schema == dict(dex.get_tool("slow_read").input_schema or {})
    assert tools["echo"].input_schema["additionalProperties"] is True

    # The read: answered with the record's text, which is the session history's text too.
    read = client.get_call(read_key)
    assert read.status is CallStatus.SUCCEEDED
    assert not seen["read"].is_error
    assert tool_messages(dex, read_key) == [_text(seen["read"])]

    # The write waited for a person: answered at once with that fact and the key; not run.
    pending = seen["pending"]
    assert "waiting for a person's approval" in _text(pending)
    assert write_key in _text(pending)
    assert pending.meta[STATUS_META_KEY] == "awaiting_approval"
    assert pending.meta[IDEMPOTENCY_META_KEY] == write_key
    assert pending.meta[OUTCOME_META_KEY] == "pending"  # docs/mcp.md: no outcome yet

    # After approval, the same ids: the record's text; asking once more runs nothing again.
    assert _text(seen["written"]) == '"ok"'
    assert seen["written"].meta[STATUS_META_KEY] == "succeeded"
    assert seen["written"].meta[OUTCOME_META_KEY] == "executed"
    assert _text(seen["again"]) == '"ok"'
    assert tool_messages(dex, write_key) == ['"ok"']
    assert len(lines(write_key, "start")) == 1

    assert seen["unknown"].is_error
    assert _text(seen["unknown"]).startswith("error: no tool named 'no_such_tool'")
    assert seen["unknown"].meta[OUTCOME_META_KEY] == "not_executed"  # nothing was recorded
    anonymous = seen["no_ids"].meta[IDEMPOTENCY_META_KEY]
    assert client.get_call(anonymous).status is CallStatus.SUCCEEDED

    plain_key = seen["plain_pending"].meta[IDEMPOTENCY_META_KEY]
    assert seen["plain_pending"].meta[STATUS_META_KEY] == "awaiting_approval"
    assert seen["plain_written"].meta[IDEMPOTENCY_META_KEY] == plain_key
    assert _text(seen["plain_written"]) == '"plain"'
    # Once answered, the same request is a new call (which waits for a person again).
    assert seen["plain_new"].meta[IDEMPOTENCY_META_KEY] != plain_key
    assert seen["plain_new"].meta[STATUS_META_KEY] == "awaiting_approval"
    assert len(lines(plain_key, "start")) == 1


def test_stdio_clients_starting_a_server_per_request_make_one_call(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker]
) -> None:
    """A client that starts `dex-celery mcp --session X` per request (the Inspector CLI) and
    sends no ids: the same charge asked from two server processes is one call, waiting for
    approval (`isError`: not a final result; the `_meta` to send again is JSON); after the
    decision a third process answers with its outcome, and it ran once."""
    start_worker()
    client = dex.client()
    full_env = {**env, "PYTHONPATH": str(ROOT)}
    params = StdioServerParameters(
        command=DEX_CELERY,
        args=[*APP, "--session", "desk", "--wait-timeout", "60"],
        env=full_env,
        cwd=str(ROOT),
    )

    async def ask() -> Any:
        async with Client(params) as mcp:
            return await mcp.call_tool("guarded_write", {"value": "charge-42"})

    first, second = anyio.run(ask), anyio.run(ask)
    key = first.meta[IDEMPOTENCY_META_KEY]
    assert second.meta[IDEMPOTENCY_META_KEY] == key
    assert key.startswith("desk/")
    for answer in (first, second):
        assert answer.meta[STATUS_META_KEY] == "awaiting_approval"
        assert answer.is_error  # not a final result (README: isError unless it succeeded)
        assert f'{{"{IDEMPOTENCY_META_KEY}": "{key}"}}' in _text(answer)
    assert [c.key for c in client.pending_approvals("desk") if c.key.startswith("desk/")] == [key]

    client.approve(key, "ops@example.com")
    third = anyio.run(ask)
    assert third.meta[IDEMPOTENCY_META_KEY] == key
    assert _text(third) == '"charge-42"'
    assert not third.is_error
    assert len(lines(key, "start")) == 1


def test_a_request_without_ids_respelled_is_the_same_unanswered_call(
    dex: Dex, env: dict[str, str]
) -> None:
    """S12.2: a plain client asking again for `guarded_write` with its default written out
    (`{"value": "done"}` for `{}`) gets the call still waiting for a person, not a second one;
    another value is another call."""
    params = StdioServerParameters(
        command=DEX_CELERY,
        args=[*APP, "--session", "respelled", "--wait-timeout", "5"],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )

    async def ask(arguments: dict[str, Any]) -> Any:
        async with Client(params) as mcp:
            return await mcp.call_tool("guarded_write", arguments)

    first = anyio.run(ask, {})
    key = first.meta[IDEMPOTENCY_META_KEY]
    assert first.meta[STATUS_META_KEY] == "awaiting_approval"
    again = anyio.run(ask, {"value": "done"})
    assert again.meta[IDEMPOTENCY_META_KEY] == key
    other = anyio.run(ask, {"value": "other"})
    assert other.meta[IDEMPOTENCY_META_KEY] != key
    waiting = {c.key for c in dex.client().pending_approvals("respelled")}
    assert waiting == {key, other.meta[IDEMPOTENCY_META_KEY]}


def test_a_client_s_trace_context_in_meta_is_the_parent_of_the_call_s_request_span(
    dex: Dex, env: dict[str, str], start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """The newest revision carries W3C trace context in `_meta`: a `tools/call` that sends a
    `traceparent` gets its dex request span in that trace (the server traced with the SDK,
    its spans written to a file), so the client's trace goes on through dex."""
    start_worker()
    spans_file = tmp_path / "server-spans.jsonl"
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    key = "s-traced/t1/read"
    meta = {IDEMPOTENCY_META_KEY: key, "traceparent": f"00-{trace_id}-{parent_id}-01"}

    async def scenario(target: Any) -> Any:
        async with Client(target) as mcp:
            return await mcp.call_tool("echo", {"x": 1}, meta=meta)

    traced_app = ["--app", "tests.support.apps.traced_toolapp:dex"]
    with _server("http", {**env, SPANS_ENV: str(spans_file)}, app=traced_app) as target:
        answer = anyio.run(scenario, target)
    assert answer.meta[OUTCOME_META_KEY] == "executed"

    spans = read_spans(spans_file)
    (request,) = [s for s in spans if s["name"] == "dex.request" and s["trace_id"] == trace_id]
    by_id = {s["span_id"]: s for s in spans}
    # The request span's ancestors in the server lead to the client's span.
    ancestor = request
    while ancestor["parent_span_id"] in by_id:
        ancestor = by_id[ancestor["parent_span_id"]]
    assert ancestor["parent_span_id"] == parent_id
