"""The agent-loop helper on a scripted model turn, through a real worker (S2.3, S3, S4.4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from dex_celery import (
    AsyncDexClient,
    Dex,
    InvalidArguments,
    InvalidRequest,
    UnknownTool,
    run_tool_calls,
    run_tool_calls_async,
)
from tests.support.crash import count_calls
from tests.support.processes import Worker
from tests.support.toolapp import executions


def _tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# What a model answered for turn 1: a read, an idempotent write and a non-idempotent write.
MODEL_TURN = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        _tool_call("call_lookup", "echo", {"order": 1002}),
        _tool_call("call_reserve", "failing", {"message": "item 7 is out of stock"}),
        _tool_call("call_cancel", "slow_non_idempotent_write", {"seconds": 0.1, "value": "ok"}),
    ],
}


def test_helper_runs_a_turn_and_returns_messages_to_append(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """S4.4: each call of the turn becomes a tool message the model reads, in the model's
    order, a failure included; S2.3: running the same turn again runs nothing twice."""
    start_worker()
    client = dex.client()
    history: list[dict[str, Any]] = [{"role": "user", "content": "cancel order 1002"}]
    history.append(MODEL_TURN)
    results = run_tool_calls(client, "chat", "turn-1", MODEL_TURN["tool_calls"], timeout=60)
    history.extend(results)

    assert [m["role"] for m in results] == ["tool", "tool", "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_lookup", "call_reserve", "call_cancel"]
    assert json.loads(results[0]["content"]) == {
        "key": "chat/turn-1/call_lookup",
        "attempt": 1,
        "arguments": {"order": 1002},
    }
    assert results[1]["content"] == "Error: item 7 is out of stock"
    assert results[2]["content"] == '"ok"'
    # The helper's messages are exactly what the session history keeps for those calls.
    stored = {
        m.tool_call_id: m.tool_output
        for m in client.get_agent_snapshot("chat").messages
        if m.role == "tool"
    }
    assert stored == {m["tool_call_id"]: m["content"] for m in results}
    assert len(history) == 5

    # The same turn again (a retried loop step): same answers, no second execution.
    again = run_tool_calls(client, "chat", "turn-1", MODEL_TURN["tool_calls"], timeout=60)
    assert again == results
    assert len(executions("chat/turn-1/call_cancel")) == 2  # one start line, one end line

    async_results = asyncio.run(
        run_tool_calls_async(
            AsyncDexClient(dex), "chat", "turn-2", [_tool_call("call_x", "echo", {})], timeout=60
        )
    )
    assert [m["tool_call_id"] for m in async_results] == ["call_x"]
    assert run_tool_calls(client, "chat", "turn-3", []) == []


@pytest.mark.parametrize(
    ("tool_calls", "error"),
    [
        ([{"id": "a"}], InvalidRequest),
        ([{"function": {"name": "echo", "arguments": "{}"}}], InvalidRequest),
        ([_tool_call("a", "echo", {}), _tool_call("a", "echo", {})], InvalidRequest),
        (
            [
                _tool_call("a", "echo", {}),
                {"id": "b", "function": {"name": "echo", "arguments": "{"}},
            ],
            InvalidArguments,
        ),
        ([_tool_call("a", "echo", {}), _tool_call("b", "no_such_tool", {})], UnknownTool),
        ([{"id": "a/b", "function": {"name": "echo", "arguments": "{}"}}], InvalidRequest),
        ("not a list", InvalidRequest),
    ],
)
def test_bad_tool_calls_are_refused_before_anything_is_recorded(
    dex: Dex, tool_calls: Any, error: type[Exception]
) -> None:
    """S9.3: a bad tool call in the turn refuses the whole turn with a typed error and records
    none of its calls."""
    with pytest.raises(error):
        run_tool_calls(dex.client(), "chat", "turn-1", tool_calls, timeout=1)
    assert count_calls(dex) == 0
