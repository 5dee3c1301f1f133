"""An OpenAI Agents SDK `Agent` whose tools run on real Celery workers through dex-celery, driven
by the SDK's own scripted test model (no network): the model reads exactly the records' texts,
approvals go through the SDK's human-in-the-loop interruption, and a killed worker gives the
`outcome_unknown` text."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from agents import (
    Agent,
    RunConfig,
    RunContextWrapper,
    Runner,
    gen_trace_id,
    set_trace_processors,
)
from agents.testing import ScriptedModel, assistant_message, function_call

from devtools.processes import Worker
from dex_celery import DID_NOT_RUN, OUTCOME_UNKNOWN_TOOL_RESULT, CallStatus, Dex
from dex_celery.integrations.frameworks.openai_agents import (
    DEFAULT_APPROVER,
    dex_function_tools,
    dex_rejections,
)
from tests.support.faults.crash import lines, tool_messages, wait_started


@pytest.fixture(autouse=True)
def no_trace_export() -> Iterator[None]:
    """Traces are still made (the run's trace id is its session id) but exported nowhere."""
    set_trace_processors([])
    yield


def _outputs(model: ScriptedModel, call: int = -1) -> dict[str, str]:
    """`call_id -> output` of the tool results the model was given in one of its calls."""
    items: Any = model.calls[call].input
    return {
        item["call_id"]: item["output"]
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def test_agent_tools_run_on_a_worker_and_the_model_reads_the_records(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    start_worker()
    model = ScriptedModel(
        [
            [
                function_call("echo", {"query": "order A"}, call_id="call_read"),
                function_call("guarded_write", {"value": "sent"}, call_id="call_write"),
            ],
            [assistant_message("Both done.")],
        ]
    )
    agent = Agent(
        name="desk", model=model, tools=dex_function_tools(dex, ["echo", "guarded_write"])
    )

    async def run() -> tuple[list[str], Any]:
        first = await Runner.run(agent, "Look up order A and send it.")
        waiting = [item.tool_name for item in first.interruptions]
        state = first.to_state()
        for item in first.interruptions:
            state.approve(item)  # the SDK's human-in-the-loop approval
        return waiting, await Runner.run(agent, state)

    waiting, result = asyncio.run(run())

    assert waiting == ["guarded_write"]  # a non-idempotent write asks a person (S1.3)
    assert result.final_output == "Both done."
    outputs = _outputs(model)
    read_key = json.loads(outputs["call_read"])["key"]
    session_id, turn_id, call_id = read_key.split("/")
    assert session_id.startswith("trace_")  # the SDK run's trace id
    assert (turn_id, call_id) == ("turn-1", "call_read")
    write_key = f"{session_id}/turn-1/call_write"

    read, write = dex.client().get_call(read_key), dex.client().get_call(write_key)
    assert read.status is CallStatus.SUCCEEDED and write.status is CallStatus.SUCCEEDED
    assert write.approval is not None and write.approval.decided_by == DEFAULT_APPROVER
    # The model read exactly the records' texts (the session history's TOOL messages).
    assert tool_messages(dex, read_key) == [outputs["call_read"]]
    assert tool_messages(dex, write_key) == [outputs["call_write"]] == ['"sent"']
    assert len(lines(write_key, "start")) == 1


def test_killed_worker_gives_the_model_the_outcome_unknown_text(
    dex: Dex, start_worker: Callable[..., Worker], sweeper: threading.Event
) -> None:
    """A write whose worker is SIGKILLed mid-call: the model reads `OUTCOME_UNKNOWN_TOOL_RESULT`;
    a write asked for while no worker is left never reaches one: the did-not-run text."""
    worker = start_worker()
    model = ScriptedModel(
        [
            [function_call("slow_non_idempotent_write", {"seconds": 60}, call_id="call_kill")],
            [function_call("slow_non_idempotent_write", {"seconds": 0}, call_id="call_queued")],
            [assistant_message("I will check the first write before retrying.")],
        ]
    )
    tools = dex_function_tools(dex, ["slow_non_idempotent_write"])
    agent = Agent(name="desk", model=model, tools=tools)
    trace_id = gen_trace_id()
    killed_key = f"{trace_id}/turn-1/call_kill"

    async def run() -> Any:
        task = asyncio.create_task(
            Runner.run(agent, "Send it twice.", run_config=RunConfig(trace_id=trace_id))
        )
        await asyncio.to_thread(wait_started, killed_key)
        worker.kill_all()
        return await task

    result = asyncio.run(run())

    assert result.final_output.startswith("I will check")
    killed = dex.client().get_call(killed_key)
    assert killed.status is CallStatus.OUTCOME_UNKNOWN
    turn2 = _outputs(model, 1)
    assert OUTCOME_UNKNOWN_TOOL_RESULT in turn2["call_kill"]
    assert tool_messages(dex, killed_key) == [turn2["call_kill"]]

    queued_key = f"{trace_id}/turn-2/call_queued"
    queued = dex.client().get_call(queued_key)
    assert queued.status is CallStatus.FAILED
    turn3 = _outputs(model, 2)
    assert turn3["call_queued"] == f"Error: {queued.error}"
    assert (queued.error or "").startswith(DID_NOT_RUN)
    assert tool_messages(dex, queued_key) == [turn3["call_queued"]]
    assert lines(queued_key, "start") == []


def test_without_tracing_the_run_gets_an_id_of_its_own(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """Tracing disabled: one made-up run id for the whole run, a turn id per model response."""
    start_worker()
    model = ScriptedModel(
        [
            [function_call("echo", {"n": 1}, call_id="call_1")],
            [function_call("echo", {"n": 2}, call_id="call_2")],
            [assistant_message("ok")],
        ]
    )
    agent = Agent(name="desk", model=model, tools=dex_function_tools(dex.client(), ["echo"]))
    asyncio.run(Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)))

    keys = [json.loads(out)["key"] for out in _outputs(model).values()]
    (first_session, first_turn, _), (second_session, second_turn, _) = (k.split("/") for k in keys)
    assert first_session == second_session and first_session.startswith("run_")
    assert (first_turn, second_turn) == ("turn-1", "turn-2")


def test_a_call_rejected_in_the_sdk_is_recorded_rejected(
    dex: Dex, start_worker: Callable[..., Worker]
) -> None:
    """The record exists while the person decides; `dex_rejections` ends it `rejected` by the
    approver, and the model reads the record's rejection text. Without the formatter the record
    is still there, waiting for its approval deadline."""
    start_worker()
    model = ScriptedModel(
        [
            [function_call("guarded_write", {"value": "no"}, call_id="call_no")],
            [function_call("guarded_write", {"value": "no"}, call_id="call_kept")],
            [assistant_message("Refused.")],
        ]
    )
    agent = Agent(name="desk", model=model, tools=dex_function_tools(dex, ["guarded_write"]))
    trace_id = gen_trace_id()
    config = RunConfig(trace_id=trace_id, tool_error_formatter=dex_rejections(dex, approver="al"))
    key = f"{trace_id}/turn-1/call_no"

    async def run() -> Any:
        first = await Runner.run(agent, "Send it.", run_config=config)
        assert dex.client().get_call(key).status is CallStatus.AWAITING_APPROVAL
        state = first.to_state()
        for item in first.interruptions:
            state.reject(item)
        second = await Runner.run(agent, state, run_config=config)
        return second

    second = asyncio.run(run())

    record = dex.client().get_call(key)
    assert record.status is CallStatus.REJECTED
    assert record.approval is not None and record.approval.decided_by == "al"
    outputs = _outputs(model, 1)
    assert outputs["call_no"] == tool_messages(dex, key)[0]
    assert outputs["call_no"].startswith("The call was rejected and did not run")
    assert lines(key, "start") == []
    # The second call waits for a person in the second run; it has its record already.
    assert [item.tool_name for item in second.interruptions] == ["guarded_write"]
    kept = dex.client().get_call(f"{trace_id}/turn-2/call_kept")
    assert kept.status is CallStatus.AWAITING_APPROVAL


def test_needs_approval_agrees_with_the_record_for_a_changed_tool(dex: Dex) -> None:
    """A tool whose definition changed since a person accepted it (an MCP tool's approval gate,
    S1.7) waits for approval in dex although its policy asks no one; the SDK's `needs_approval`
    answers from the record, so the run stops for a person too. The same tool without the gate
    is not held."""
    import dataclasses

    echo = dex.tools["echo"]
    gated = dataclasses.replace(echo, approval_gate=lambda: "the tool's definition changed")
    dex.runtime.tools["echo"] = gated
    model = ScriptedModel([[function_call("echo", {"query": "x"}, call_id="call_gated")]])
    agent = Agent(name="desk", model=model, tools=dex_function_tools(dex, ["echo"]))
    result = asyncio.run(
        Runner.run(agent, "Look it up.", run_config=RunConfig(trace_id="trace_gated"))
    )
    key = "trace_gated/turn-1/call_gated"
    assert [i.raw_item.call_id for i in result.interruptions] == ["call_gated"]  # type: ignore[union-attr]
    assert dex.client().get_call(key).status is CallStatus.AWAITING_APPROVAL

    dex.runtime.tools["echo"] = echo
    (tool,) = dex_function_tools(dex, ["echo"], session_id="plain")
    needs = tool.needs_approval
    assert callable(needs)
    assert (
        asyncio.run(needs(RunContextWrapper(context=None), {"query": "y"}, "call_plain")) is False
    )
    assert dex.client().get_call("plain/turn-1/call_plain").status is CallStatus.PENDING
