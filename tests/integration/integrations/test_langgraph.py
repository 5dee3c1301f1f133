"""LangGraph agents (`create_agent`, and a graph of one's own with a `ToolNode`) whose tools run
on real Celery workers through dex-celery, driven by a scripted LangChain chat model (no
network): the model reads exactly the records' texts, approvals go through `interrupt()` /
`Command(resume=...)`, a killed worker gives the `outcome_unknown` text, and a graph resumed
from its checkpoint gets the same record back. The crash of the agent process itself is in
tests/crash/requester/test_langgraph_resume.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from devtools.processes import Worker
from dex_celery import OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex
from dex_celery.errors import InvalidDecision
from dex_celery.integrations.frameworks.calls import CHANGED_ARGUMENTS_REASON
from dex_celery.integrations.frameworks.langgraph import Decision, dex_tools
from dex_celery.testing.models.langchain import ScriptedChatModel, tool_call
from tests.support.faults.crash import lines, tool_messages, wait_started
from tests.support.frameworks.checks import (
    assert_one_approved_one_rejected,
    assert_read_and_write_succeeded,
)


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _agent(dex: Dex, model: ScriptedChatModel, names: list[str]) -> Any:
    return create_agent(model, dex_tools(dex, names), checkpointer=InMemorySaver())


def test_read_and_idempotent_write_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    both = AIMessage(
        "",
        tool_calls=[
            {"name": "echo", "args": {"query": "order A"}, "id": "call_read"},
            {
                "name": "slow_idempotent_write",
                "args": {"seconds": 0, "value": "kept"},
                "id": "call_write",
            },
        ],
    )
    model = ScriptedChatModel(turns=[both, AIMessage("Both done.")])
    agent = _agent(dex, model, ["echo", "slow_idempotent_write"])
    state = agent.invoke({"messages": [HumanMessage("Go.")]}, _config("lg-read"))

    assert state["messages"][-1].content == "Both done."
    outputs = model.tool_results()
    read_key, write_key = "lg-read/turn-1/call_read", "lg-read/turn-1/call_write"
    assert_read_and_write_succeeded(dex, outputs, read_key, write_key)


def test_approved_and_rejected_writes_go_through_interrupt_and_are_recorded(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Turn 1's write is approved, turn 2's rejected, each by `Command(resume=...)`."""
    start_worker()
    model = ScriptedChatModel(
        turns=[
            tool_call("guarded_write", {"value": "yes"}, "call_ok"),
            tool_call("guarded_write", {"value": "no"}, "call_no"),
            AIMessage("One sent, one refused."),
        ]
    )
    agent = _agent(dex, model, ["guarded_write"])
    config = _config("lg-hitl")
    ok_key, no_key = "lg-hitl/turn-1/call_ok", "lg-hitl/turn-2/call_no"

    state = agent.invoke({"messages": [HumanMessage("Send both.")]}, config)
    (asked,) = state["__interrupt__"]
    assert asked.value["dex_key"] == ok_key and asked.value["arguments"] == {"value": "yes"}
    assert dex.client().get_call(ok_key).status is CallStatus.AWAITING_APPROVAL

    state = agent.invoke(Command(resume={"approved": True, "decided_by": "alice"}), config)
    (asked,) = state["__interrupt__"]
    assert asked.value["dex_key"] == no_key
    state = agent.invoke(
        Command(resume={"type": "reject", "message": "not this one", "decided_by": "bob"}), config
    )

    assert state["messages"][-1].content == "One sent, one refused."
    outputs = model.tool_results()
    assert_one_approved_one_rejected(
        dex, outputs, ok_key, no_key, approved_by="alice", rejected_by="bob"
    )


def test_an_edited_approval_is_refused_and_recorded_rejected(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    model = ScriptedChatModel(
        turns=[tool_call("guarded_write", {"value": "asked"}, "call_edit"), AIMessage("Noted.")]
    )
    agent = _agent(dex, model, ["guarded_write"])
    config = _config("lg-edit")
    agent.invoke({"messages": [HumanMessage("Send it.")]}, config)
    agent.invoke(
        Command(resume={"type": "edit", "args": {"value": "edited"}, "decided_by": "carol"}),
        config,
    )

    key = "lg-edit/turn-1/call_edit"
    record = dex.client().get_call(key)
    assert record.status is CallStatus.REJECTED
    assert record.approval is not None and record.approval.decided_by == "carol"
    assert CHANGED_ARGUMENTS_REASON in (record.error or "")
    assert model.tool_results()["call_edit"] == tool_messages(dex, key)[0]
    assert lines(key, "start") == []


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """An async graph (`ainvoke`): the tool's coroutine path."""
    worker = start_worker()
    model = ScriptedChatModel(
        turns=[
            tool_call("slow_non_idempotent_write", {"seconds": 60}, "call_kill"),
            AIMessage("I will check it."),
        ]
    )
    agent = _agent(dex, model, ["slow_non_idempotent_write"])
    key = "lg-kill/turn-1/call_kill"

    async def run() -> Any:
        task = asyncio.create_task(
            agent.ainvoke({"messages": [HumanMessage("Send it.")]}, _config("lg-kill"))
        )
        await asyncio.to_thread(wait_started, key)
        worker.kill_all()
        return await task

    state = asyncio.run(run())

    assert state["messages"][-1].content == "I will check it."
    assert dex.client().get_call(key).status is CallStatus.OUTCOME_UNKNOWN
    seen = model.tool_results()["call_kill"]
    assert OUTCOME_UNKNOWN_TOOL_RESULT in seen
    assert tool_messages(dex, key) == [seen]


def test_a_tool_node_graph_resumed_from_its_checkpoint_gets_the_same_record(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """A graph of one's own: a ToolNode run, then re-run from the checkpoint before it (what
    LangGraph does after a crash or an interrupt); the same key gives the same record."""
    start_worker()
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(dex_tools(dex, ["slow_non_idempotent_write"])))
    graph.add_edge(START, "tools")
    app = graph.compile(checkpointer=InMemorySaver())
    config = _config("lg-node")
    write = tool_call("slow_non_idempotent_write", {"seconds": 0, "value": "once"}, "call_w")
    app.invoke({"messages": [HumanMessage("Send it."), write]}, config)
    key = "lg-node/turn-1/call_w"

    before_tools = next(
        s for s in app.get_state_history(config) if s.next == ("tools",)
    )  # the checkpoint a crashed run would resume from
    state = app.invoke(None, before_tools.config)

    (message,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert message.content == '"once"' == tool_messages(dex, key)[0]
    assert len(lines(key, "start")) == 1
    assert [r.key for r in dex.client().get_agent_snapshot("lg-node").tool_calls] == [key]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, Decision(True, None, None)),
        (False, Decision(False, None, None)),
        ({"approved": True, "decided_by": "al"}, Decision(True, "al", None)),
        ({"type": "reject", "message": "no", "decided_by": "bo"}, Decision(False, "bo", "no")),
        ({"type": "approve"}, Decision(True, None, None)),
        ({"type": "edit", "args": {}}, Decision(False, None, None, edited=True)),
    ],
)
def test_resume_values_read_as_decisions(value: Any, expected: Decision) -> None:
    assert Decision.parse(value) == expected


@pytest.mark.parametrize("value", [None, "yes", {"type": "maybe"}, {"approved": 1}])
def test_other_resume_values_are_refused(value: Any) -> None:
    with pytest.raises(InvalidDecision):
        Decision.parse(value)


def test_a_failed_call_is_error_text_for_the_model(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    model = ScriptedChatModel(
        turns=[tool_call("failing", {}, "call_fail"), AIMessage("It failed.")]
    )
    state = _agent(dex, model, ["failing"]).invoke(
        {"messages": [HumanMessage("Try.")]}, _config("lg-fail")
    )

    assert state["messages"][-1].content == "It failed."
    key = "lg-fail/turn-1/call_fail"
    assert dex.client().get_call(key).status is CallStatus.FAILED
    seen = model.tool_results()["call_fail"]
    assert seen == "Error: the order does not exist" == tool_messages(dex, key)[0]
