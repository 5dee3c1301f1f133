"""Sessions: the snapshot and the history for every outcome, and bad input (S4, S7, S9.3)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from devtools.processes import Worker, wait_for
from devtools.toolapp import executions
from dex_celery import (
    DID_NOT_RUN,
    OUTCOME_UNKNOWN_TOOL_RESULT,
    AsyncDexClient,
    CallStatus,
    Dex,
    EffectClass,
    EventType,
    InvalidEventPosition,
    InvalidId,
    InvalidText,
    MessageRole,
    ToolContext,
    ToolPolicy,
    UnknownSession,
)


def _ended(dex: Dex, key: str) -> bool:
    record = dex.store.get_call(key)
    return record is not None and record.finished


def test_snapshot_and_history_for_each_outcome(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """S4.1, S4.2, S4.5, S6.2, S7.1, S7.2, S7.3, S7.4: every ended call has its record in
    `tool_calls` (status and error) and one TOOL message with the exact text the model reads,
    its turn id, tool-call id, tool name and JSON arguments; a user message lands in order."""

    # Registered only in the test process: it needs approval (S1.3) and is never dispatched.
    @dex.tool("refund", policy=ToolPolicy(effect=EffectClass.NON_IDEMPOTENT_WRITE))
    def refund(ctx: ToolContext, **arguments: Any) -> Any:
        raise AssertionError("a call waiting for approval must not run")

    client = dex.client()
    client.open_session("s")
    worker = start_worker()
    requested: dict[str, tuple[str, dict[str, Any]]] = {
        "c-ok": ("echo", {"q": 1}),
        "c-fail": ("failing", {"message": "no such order"}),
        "c-unknown": ("slow_non_idempotent_write", {"seconds": 60}),
        "c-rejected": ("refund", {"order": 7}),
    }
    for call_id, (tool, arguments) in requested.items():
        client.request_call("s", "t1", call_id, tool, arguments)
    client.wait(["s/t1/c-ok", "s/t1/c-fail"], timeout=60)
    wait_for(lambda: executions("s/t1/c-unknown"), timeout=60, what="the write to start")
    worker.kill_all()
    # With no worker left, this attempt can never be claimed: it expires unrun (S4.2).
    requested["c-never"] = ("slow_non_idempotent_write", {"seconds": 1})
    client.request_call("s", "t2", "c-never", *requested["c-never"])
    rejected = client.get_call("s/t1/c-rejected")
    assert rejected.status is CallStatus.AWAITING_APPROVAL
    assert dex.sweeper.expire_approval(rejected, time.time())
    client.send_user_message("s", "Where is my refund?")
    wait_for(
        lambda: _ended(dex, "s/t1/c-unknown") and _ended(dex, "s/t2/c-never"),
        timeout=60,
        what="the killed and the never-run calls to end",
    )

    snapshot = asyncio.run(AsyncDexClient(dex).get_agent_snapshot("s"))
    calls = {c.tool_call_id: c for c in snapshot.tool_calls}
    assert {k: c.status for k, c in calls.items()} == {
        "c-ok": CallStatus.SUCCEEDED,
        "c-fail": CallStatus.FAILED,
        "c-unknown": CallStatus.OUTCOME_UNKNOWN,
        "c-rejected": CallStatus.REJECTED,
        "c-never": CallStatus.FAILED,
    }
    assert calls["c-ok"].error is None
    assert calls["c-fail"].error == "no such order"
    unknown_error = calls["c-unknown"].error or ""
    assert "may or may not have taken effect" in unknown_error
    never_error = calls["c-never"].error or ""
    assert never_error.startswith(DID_NOT_RUN)
    rejected_error = calls["c-rejected"].error or ""
    assert rejected_error.startswith("the approval deadline passed before anyone approved")

    tool_messages = {m.tool_call_id: m for m in snapshot.messages if m.role == MessageRole.TOOL}
    assert set(tool_messages) == set(requested)
    outputs = {k: m.tool_output or "" for k, m in tool_messages.items()}
    assert json.loads(outputs["c-ok"]) == {
        "key": "s/t1/c-ok",
        "attempt": 1,
        "arguments": {"q": 1},
    }
    assert outputs["c-fail"] == "Error: no such order"
    assert outputs["c-unknown"] == f"{OUTCOME_UNKNOWN_TOOL_RESULT}\n{unknown_error}"
    assert outputs["c-never"] == f"Error: {never_error}"
    assert DID_NOT_RUN in outputs["c-never"]
    assert outputs["c-rejected"] == f"The call was rejected and did not run: {rejected_error}"
    for call_id, message in tool_messages.items():
        tool, arguments = requested[call_id]
        assert message.text is None
        assert message.turn_id == ("t2" if call_id == "c-never" else "t1")
        assert message.tool_name == tool
        assert json.loads(message.tool_arguments or "") == arguments

    users = [m for m in snapshot.messages if m.role == MessageRole.USER]
    assert [m.text for m in users] == ["Where is my refund?"]
    ids = [m.id for m in snapshot.messages]
    assert ids == sorted(ids)  # one ordered history
    assert tool_messages["c-ok"].id < users[0].id < tool_messages["c-never"].id

    # S7.3: one finished event per call, with the recorded status.
    finished = [e for e in client.events(session_id="s") if e.type is EventType.TOOL_CALL_FINISHED]
    assert sorted((e.tool_call_id, e.status) for e in finished) == sorted(
        (k, c.status) for k, c in calls.items()
    )


def test_bad_input_is_refused_with_typed_errors(dex: Dex) -> None:
    """S9.3, S7.4: unknown sessions, empty, oversized or non-text messages, malformed ids and
    positions get typed errors and leave the history as it was."""
    client = dex.client()
    aclient = AsyncDexClient(dex)
    with pytest.raises(UnknownSession):
        client.get_agent_snapshot("nobody")
    with pytest.raises(UnknownSession):
        client.send_user_message("nobody", "hello")
    with pytest.raises(UnknownSession):
        asyncio.run(aclient.get_agent_snapshot("nobody"))
    with pytest.raises(UnknownSession):
        asyncio.run(aclient.send_user_message("nobody", "hello"))
    with pytest.raises(UnknownSession):  # the failed send did not create the session
        client.get_agent_snapshot("nobody")

    client.open_session("s")
    limit = dex.settings.max_text_bytes
    for bad in ("", "   \n", "x" * (limit + 1), "é" * (limit // 2 + 1), None, 42):
        with pytest.raises(InvalidText):
            client.send_user_message("s", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidText):
        asyncio.run(aclient.send_user_message("s", ""))
    assert client.send_user_message("s", "x" * limit) is True  # the limit itself is allowed
    assert [m.text for m in client.get_agent_snapshot("s").messages] == ["x" * limit]

    for bad_id in ("", "a/b", "a#1", "\x00"):
        with pytest.raises(InvalidId):
            client.open_session(bad_id)
    for position in ("later", "-1", "1-2-3", ""):
        with pytest.raises(InvalidEventPosition):
            client.events(after=position)
