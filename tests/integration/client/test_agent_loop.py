"""The agent-loop helper on a scripted model turn, through a real worker (S2.3, S3, S4.4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from devtools.processes import Worker
from devtools.toolapp import executions
from dex_celery import (
    AsyncDexClient,
    Dex,
    InvalidRequest,
    run_tool_calls,
    run_tool_calls_async,
)
from tests.support.faults.crash import count_calls


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
    "tool_calls",
    [
        [{"function": {"name": "echo", "arguments": "{}"}}],
        [_tool_call("a", "echo", {}), _tool_call("a", "echo", {})],
        "not a list",
    ],
)
def test_a_turn_without_usable_ids_is_refused_before_anything_is_recorded(
    dex: Dex, tool_calls: Any
) -> None:
    """S9.3: a turn whose calls cannot be answered one by one (no id, one id twice, not a list)
    raises a typed error and records none of its calls."""
    with pytest.raises(InvalidRequest):
        run_tool_calls(dex.client(), "chat", "turn-1", tool_calls, timeout=1)
    assert count_calls(dex) == 0


BAD_CALLS = [
    ({"id": "no_function"}, "has no 'function' object"),
    ({"id": "bad_json", "function": {"name": "echo", "arguments": "{"}}, "not valid JSON"),
    (_tool_call("unknown", "no_such_tool", {}), "no tool named 'no_such_tool'"),
    (_tool_call("missing", "typed", {"order": 1}), "missing required argument 'amount'"),
    (_tool_call("extra", "async_echo", {"text": "x", "colour": 1}), "unexpected argument"),
    ({"id": "a/b", "function": {"name": "echo", "arguments": "{}"}}, "'/'"),
]


def test_each_bad_call_gets_its_own_error_message_and_the_others_run(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Issue 11: one bad call no longer fails the turn. Each bad call gets its own `Error:`
    message (nothing recorded for it); the valid calls around them are recorded and run."""
    start_worker()
    turn = [
        _tool_call("good_1", "echo", {"order": 1}),
        *[raw for raw, _ in BAD_CALLS],
        _tool_call("good_2", "async_echo", {"text": "hi"}),
    ]
    results = run_tool_calls(dex.client(), "chat", "turn-1", turn, timeout=30)
    assert [m["tool_call_id"] for m in results] == [
        "good_1",
        *[raw["id"] for raw, _ in BAD_CALLS],
        "good_2",
    ]
    assert json.loads(results[0]["content"])["arguments"] == {"order": 1}
    assert json.loads(results[-1]["content"]) == {"text": "hi", "attempt": 1}
    for message, (_, reason) in zip(results[1:-1], BAD_CALLS, strict=True):
        assert message["content"].startswith("Error: the call was refused and did not run")
        assert reason in message["content"], message
    assert count_calls(dex) == 2
    assert len(executions("chat/turn-1/good_1")) == 1


def test_ids_reused_for_other_arguments_refuse_only_that_call(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A call id of an earlier request reused with other arguments gets a conflict message; the
    rest of the turn runs."""
    start_worker()
    client = dex.client()
    first = run_tool_calls(client, "chat", "turn-1", [_tool_call("a", "echo", {"n": 1})])
    assert json.loads(first[0]["content"])["arguments"] == {"n": 1}
    again = run_tool_calls(
        client,
        "chat",
        "turn-1",
        [_tool_call("a", "echo", {"n": 2}), _tool_call("b", "echo", {"n": 3})],
        timeout=30,
    )
    assert "requested before with other arguments" in again[0]["content"]
    assert json.loads(again[1]["content"])["arguments"] == {"n": 3}
    assert len(executions("chat/turn-1/a")) == 1
