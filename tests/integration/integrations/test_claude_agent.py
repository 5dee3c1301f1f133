"""A Claude Agent SDK agent whose tools run on real Celery workers through dex-celery: the real
`claude` CLI (npm `@anthropic-ai/claude-code`) asks the scripted Messages API server
(`ScriptedMessages`, on loopback, no network) and runs the dex tools of the SDK MCP server
`DexClaude` gives it. The model reads exactly the records' texts (S4.4), a call a person must
approve is decided in the SDK's `can_use_tool` and recorded with who decided (S6.2), and the
key is `<SDK session id>/turn-<n>/<tool_use id>` (S2.1)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.processes import Worker
from dex_celery import CallStatus, Dex
from dex_celery.integrations.frameworks.calls import CHANGED_ARGUMENTS_REASON
from tests.support.faults.crash import lines, tool_messages
from tests.support.frameworks.checks import (
    READ_AND_WRITE,
    assert_killed_write_read_unknown,
    assert_one_approved_one_rejected,
    assert_read_and_write_succeeded,
    killed_mid_call,
)
from tests.support.frameworks.claude_agent import Desk, claude_cli, final_text

pytest.importorskip("claude_agent_sdk")
claude_cli()  # skips the module, saying why, without Node.js

from claude_agent_sdk import PermissionResultAllow, PermissionResultDeny  # noqa: E402

from dex_celery.integrations.frameworks.claude_agent import model_tool_name  # noqa: E402
from dex_celery.testing.models.claude_messages import ScriptedMessages, tool_use  # noqa: E402


def _use(tool: str, arguments: dict[str, Any], call_id: str) -> Any:
    return tool_use(model_tool_name(tool), arguments, call_id)


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """Without `session_id=`, the session is the SDK's own session id."""
    start_worker()
    with ScriptedMessages([[_use(*call) for call in READ_AND_WRITE], "Both done."]) as model:
        desk = Desk(dex, model, ["echo", "slow_idempotent_write"], tmp_path / "home")
        assert final_text(desk.ask("Look up order A and keep it.")) == "Both done."
    assert model.refused == []
    session = desk.sdk_session
    assert session
    read_key, write_key = f"{session}/turn-1/call_read", f"{session}/turn-1/call_write"
    assert_read_and_write_succeeded(dex, model.tool_results(), read_key, write_key)
    # What led to the call is in the session (the copy of the CLI's transcript).
    snapshot = dex.client().get_agent_snapshot(session)
    assert [m.text for m in snapshot.messages if m.mirrored][:1] == ["Look up order A and keep it."]


def test_allowed_and_denied_writes_are_recorded_with_who_decided(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """A dex policy that asks a person makes the SDK ask `can_use_tool` (the tools are allowed
    by no rule of the CLI's): the call is recorded and waiting while the person decides;
    allowed, it runs once, approved by who the answer names; denied, it is recorded `rejected`
    by the approver with the reason, and the model reads the record's rejection."""
    start_worker()
    asked: dict[str, dict[str, Any]] = {}
    desk: Desk

    async def ask(name: str, arguments: dict[str, Any], context: Any) -> Any:
        shown = await desk.bridge.approval_request(context.tool_use_id)
        assert shown is not None
        asked[context.tool_use_id] = shown
        assert dex.client().get_call(shown["dex_key"]).status is CallStatus.AWAITING_APPROVAL
        if arguments["value"] == "yes":
            return {"approved": True, "decided_by": "alice"}
        return PermissionResultDeny(message="not this one")

    with ScriptedMessages(
        [
            [
                _use("guarded_write", {"value": "yes"}, "call_ok"),
                _use("guarded_write", {"value": "no"}, "call_no"),
            ],
            "One sent, one refused.",
        ]
    ) as model:
        desk = Desk(
            dex,
            model,
            ["guarded_write"],
            tmp_path / "home",
            session_id="claude-hitl",
            ask=ask,
            approver="desk-bot",
        )
        assert final_text(desk.ask("Send both.")) == "One sent, one refused."

    ok_key, no_key = "claude-hitl/turn-1/call_ok", "claude-hitl/turn-1/call_no"
    assert asked["call_ok"]["dex_key"] == ok_key and asked["call_no"]["dex_key"] == no_key
    assert asked["call_ok"]["approval_deadline"] is not None
    assert_one_approved_one_rejected(
        dex, model.tool_results(), ok_key, no_key, approved_by="alice", rejected_by="desk-bot"
    )


def test_an_edited_approval_is_refused_and_without_ask_the_call_waits(
    dex: Dex, start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    """An allow with other arguments runs nothing (`CHANGED_ARGUMENTS_REASON`); a desk with no
    `ask` leaves the call waiting in dex, and the model reads that it has not run."""
    start_worker()

    async def edit(name: str, arguments: dict[str, Any], context: Any) -> Any:
        return PermissionResultAllow(updated_input={"value": "edited"})

    with ScriptedMessages(
        [[_use("guarded_write", {"value": "asked"}, "call_edit")], "Not sent."]
    ) as model:
        desk = Desk(
            dex, model, ["guarded_write"], tmp_path / "a", session_id="claude-edit", ask=edit
        )
        desk.ask("Send it.")
    edit_key = "claude-edit/turn-1/call_edit"
    record = dex.client().get_call(edit_key)
    assert record.status is CallStatus.REJECTED and CHANGED_ARGUMENTS_REASON in (record.error or "")
    assert json.loads(record.arguments) == {"value": "asked"}
    assert tool_messages(dex, edit_key) == [model.tool_results()["call_edit"]]
    assert lines(edit_key, "start") == []

    with ScriptedMessages(
        [[_use("guarded_write", {"value": "later"}, "call_wait")], "Waiting."]
    ) as model:
        Desk(dex, model, ["guarded_write"], tmp_path / "b", session_id="claude-wait").ask("Go.")
    wait_key = "claude-wait/turn-1/call_wait"
    assert dex.client().get_call(wait_key).status is CallStatus.AWAITING_APPROVAL
    assert model.tool_results()["call_wait"].startswith(f"The call {wait_key} is waiting")


def test_killed_worker_gives_the_model_the_outcome_unknown_text_and_a_resume_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event, tmp_path: Path
) -> None:
    """The resumed session (`resume=`, a new CLI process) counts its turns from the
    transcript: the model's second call, in its third response, is `turn-3`."""
    worker = start_worker()
    with ScriptedMessages(
        [
            [_use("slow_non_idempotent_write", {"seconds": 60}, "call_kill")],
            "I will check it.",
            [_use("echo", {"query": "status"}, "call_next")],
            "Checked.",
        ]
    ) as model:
        desk = Desk(
            dex, model, ["slow_non_idempotent_write", "echo"], tmp_path / "h", session_id="ck"
        )
        key = "ck/turn-1/call_kill"
        answer = killed_mid_call(worker, key, lambda: final_text(desk.ask("Send it.")))
        assert answer == "I will check it."
        assert_killed_write_read_unknown(dex, model.tool_results()["call_kill"], key)
        start_worker()
        assert final_text(desk.ask("And now?")) == "Checked."
    assert dex.client().get_call("ck/turn-3/call_next").status is CallStatus.SUCCEEDED
    assert len(lines(key, "start")) == 1
