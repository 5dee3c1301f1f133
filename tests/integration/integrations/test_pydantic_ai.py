"""A Pydantic AI `Agent` whose tools run on real Celery workers through dex-celery, driven by
Pydantic AI's own `FunctionModel` (no network): the model reads exactly the records' texts,
approvals go through Pydantic AI's deferred tools, a killed worker gives the `outcome_unknown`
text, and a run resumed from its message history gets the same record back."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai.messages import (
    ModelResponse,
)
from pydantic_ai.models.function import FunctionModel

from devtools.processes import Worker
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex
from dex_celery.integrations.frameworks.calls import CHANGED_ARGUMENTS_REASON
from dex_celery.integrations.frameworks.pydantic_ai import DexTools
from tests.support.faults.crash import lines, tool_messages, wait_started
from tests.support.frameworks.checks import (
    assert_one_approved_one_rejected,
    assert_read_and_write_succeeded,
)
from tests.support.frameworks.pydantic_scripted import Scripted, call


def agent_for(dex: Dex, script: Scripted, names: list[str], **options: Any) -> Agent[None, Any]:
    return Agent(
        FunctionModel(script),
        capabilities=[DexTools(dex, names, **options)],
        output_type=[str, DeferredToolRequests],
    )


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    script = Scripted(
        [
            [
                call("echo", {"query": "order A"}, "call_read"),
                call("slow_idempotent_write", {"seconds": 0, "value": "kept"}, "call_write"),
            ],
            "Both done.",
        ]
    )
    agent = agent_for(dex, script, ["echo", "slow_idempotent_write"])
    result = agent.run_sync("Look up order A and keep it.", conversation_id="conv-read")

    assert result.output == "Both done."
    outputs = script.tool_results()
    read_key, write_key = "conv-read/turn-1/call_read", "conv-read/turn-1/call_write"
    assert_read_and_write_succeeded(dex, outputs, read_key, write_key)


def test_approved_and_denied_writes_are_recorded_with_who_decided(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    script = Scripted(
        [
            [
                call("guarded_write", {"value": "yes"}, "call_ok"),
                call("guarded_write", {"value": "no"}, "call_no"),
            ],
            "One sent, one refused.",
        ]
    )
    agent = agent_for(dex, script, ["guarded_write"], approver="desk-bot")
    first = agent.run_sync("Send both.", conversation_id="conv-hitl")
    requests = first.output
    assert isinstance(requests, DeferredToolRequests)
    assert sorted(c.tool_call_id for c in requests.approvals) == ["call_no", "call_ok"]
    ok_key, no_key = "conv-hitl/turn-1/call_ok", "conv-hitl/turn-1/call_no"
    # Both are recorded in dex before anyone decides, waiting with their deadline.
    assert requests.metadata["call_ok"]["dex_key"] == ok_key
    assert dex.client().get_call(ok_key).status is CallStatus.AWAITING_APPROVAL
    assert dex.client().get_call(no_key).status is CallStatus.AWAITING_APPROVAL

    results = DeferredToolResults(
        approvals={"call_ok": ToolApproved(), "call_no": ToolDenied("not this one")},
        metadata={"call_ok": {"decided_by": "alice"}},
    )
    second = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)

    assert second.output == "One sent, one refused."
    outputs = script.tool_results()
    assert_one_approved_one_rejected(
        dex, outputs, ok_key, no_key, approved_by="alice", rejected_by="desk-bot"
    )


def test_an_approval_that_changes_the_arguments_is_refused(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    script = Scripted([[call("guarded_write", {"value": "asked"}, "call_edit")], "Noted."])
    agent = agent_for(dex, script, ["guarded_write"])
    first = agent.run_sync("Send it.", conversation_id="conv-edit")
    results = DeferredToolResults(
        approvals={"call_edit": ToolApproved(override_args={"value": "edited"})},
        metadata={"call_edit": {"decided_by": "carol"}},
    )
    agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)

    key = "conv-edit/turn-1/call_edit"
    record = dex.client().get_call(key)
    assert record.status is CallStatus.REJECTED
    assert json.loads(record.arguments) == {"value": "asked"}
    assert record.approval is not None and record.approval.decided_by == "carol"
    assert CHANGED_ARGUMENTS_REASON in (record.error or "")
    assert script.tool_results()["call_edit"] == tool_messages(dex, key)[0]
    assert lines(key, "start") == []


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    worker = start_worker()
    script = Scripted(
        [[call("slow_non_idempotent_write", {"seconds": 60}, "call_kill")], "I will check it."]
    )
    agent = agent_for(dex, script, ["slow_non_idempotent_write"])
    key = "conv-kill/turn-1/call_kill"

    async def run() -> Any:
        task = asyncio.create_task(agent.run("Send it.", conversation_id="conv-kill"))
        await asyncio.to_thread(wait_started, key)
        worker.kill_all()
        return await task

    result = asyncio.run(run())

    assert result.output == "I will check it."
    record = dex.client().get_call(key)
    assert record.status is CallStatus.OUTCOME_UNKNOWN
    seen = script.tool_results()["call_kill"]
    assert OUTCOME_UNKNOWN_TOOL_RESULT in seen
    assert tool_messages(dex, key) == [seen]


def test_a_run_resumed_from_its_message_history_gets_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """The history is cut right after the model response, as if the process died before the
    tool's result was kept: running on it asks for the same key and gets the same record."""
    start_worker()
    script = Scripted(
        [[call("slow_non_idempotent_write", {"seconds": 0, "value": "once"}, "call_w")], "Done."]
    )
    agent = agent_for(dex, script, ["slow_non_idempotent_write"])
    first = agent.run_sync("Send it.", conversation_id="conv-resume")
    key = "conv-resume/turn-1/call_w"
    assert dex.client().get_call(key).status is CallStatus.SUCCEEDED

    messages = first.all_messages()
    cut = next(i for i, m in enumerate(messages) if isinstance(m, ModelResponse)) + 1
    resumed = agent.run_sync(message_history=messages[:cut])

    assert resumed.output == "Done."
    assert script.tool_results()["call_w"] == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1  # the write ran once
    assert [r.key for r in dex.client().get_agent_snapshot("conv-resume").tool_calls] == [key]


def test_a_failed_call_is_error_text_for_the_model(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    script = Scripted([[call("failing", {}, "call_fail")], "It failed."])
    result = agent_for(dex, script, ["failing"]).run_sync("Try.", conversation_id="conv-fail")

    assert result.output == "It failed."
    key = "conv-fail/turn-1/call_fail"
    assert dex.client().get_call(key).status is CallStatus.FAILED
    seen = script.tool_results()["call_fail"]
    assert seen == "Error: the order does not exist" == tool_messages(dex, key)[0]
